"""The assembly reader the asm tests rely on, on hand-written snippets."""

from microkernels import asm

SNIPPET = """\
foo_compute_:
.Lfunc_begin3:
\t.cfi_startproc
\tpushq\t%rbx   # save
\t.p2align\t4
.LBB3_2:
.Ltmp7:
\t.loc\t1 2 3
\tvbroadcastss\t-2560(%r14,%r13,4), %ymm15
\tvfmadd231ps\t%ymm13, %ymm15, %ymm4
\tvmovaps\t%ymm3, 64(%rsp)
\tincq\t%r13
\tjne\t.LBB3_2
\tjmp\t.LBB3_9
.LBB3_9:
\tvfmadd231ps\t%ymm1, %ymm2, %ymm3
\tjne\t.LBB3_2
\tretq
.Lfunc_end3:
other:
\tretq
"""


def test_normalize_keeps_instructions_and_renames_labels():
    out = asm.normalize(asm.compute_function(SNIPPET))
    assert ".loc" not in out and ".cfi" not in out and "Ltmp" not in out and "#" not in out
    assert out.splitlines()[:3] == ["foo_compute_:", " pushq %rbx", ".L0:"]
    assert " jne .L0" in out and ".L1:" in out and "other" not in out


def test_single_block_loop_found_with_its_stack_traffic():
    loops = asm.single_block_loops(asm.compute_function(SNIPPET))
    assert [lp.label for lp in loops] == [".L0"]  # .LBB3_9 jumps elsewhere: not a loop
    lp = loops[0]
    assert lp.count("vfmadd") == 1 and lp.count("vbroadcast") == 1
    assert lp.stack_accesses() == ["vmovaps %ymm3, 64(%rsp)"]


def test_rbp_is_stack_only_in_a_function_with_a_frame_pointer():
    body = "f:\n{}.LBB0_1:\n\tvmovups\t-64(%rbp), %zmm1\n\tjne\t.LBB0_1\n"
    no_fp = asm.single_block_loops(body.format(""))[0]
    with_fp = asm.single_block_loops(body.format("\tpushq\t%rbp\n\tmovq\t%rsp, %rbp\n"))[0]
    assert no_fp.stack_accesses() == []
    assert with_fp.stack_accesses() == ["vmovups -64(%rbp), %zmm1"]


def test_arm_stack_accesses_found_and_others_not():
    """The ARM detector on the forms a spill or a saved register takes (a broken `[sp` pattern
    used to pass the whole suite), and on look-alikes that are not stack traffic."""
    stack = ["ldr q0, [sp, #16]", "str q8, [sp]", "stp q0, q1, [sp, #-32]!", "ldp x29, x30, [sp], #16",
             "vpush {d8-d15}", "vpop {d8, d9}", "vst1.64 {d8, d9}, [sp:128]", "push {r4, lr}"]
    other = ["ldr q0, [x1, #16]", "vmlal.s16 q8, d0, d2[1]", "smlal v16.4s, v0.4h, v2.h[1]",
             "add x1, x1, #64", "vld1.16 {d0, d1}, [r0]!", "sdot v16.4s, v0.16b, v4.4b[0]"]
    for arch, branch in (("armv7", "bne"), ("aarch64", "b.ne")):
        body = "f:\n.LBB0_1:\n" + "".join(f"\t{ins}\n" for ins in stack + other) + f"\t{branch} .LBB0_1\n"
        (lp,) = asm.single_block_loops(body, arch)
        found = lp.stack_accesses()
        assert [asm.normalize(f"f:\n\t{i}\n", arch).splitlines()[1].strip() for i in stack] == \
            [f.strip() for f in found], found
