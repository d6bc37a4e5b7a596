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
