"""Kernel level, no TVM: the integer NEON tiles' budgets, names, K steps and the IR they generate."""

import dataclasses
import re

import pytest

from microkernels import AARCH64, AARCH64_DOT, ARM_ISAS, AVX2, NEON, TileError
from microkernels.int_mac import DEFAULT_TILES, MacKernel, check_tile, default_mac_kernel, registers_needed

# What each ISA promises, stated independently of the generator's tables:
# (dtype, op, k_step, name infix, products per instruction)
SPEC = {
    "neon": ("int16", "mac", 4, "s16_mac", 4),  # vmlal.s16 q, d, d[lane]: a d register of A = 4 k
    "aarch64": ("int16", "mac", 8, "s16_mac", 4),  # smlal(2) v.4s, v.(4|8)h, v.h[lane]: a q of A = 8 k
    "aarch64dot": ("int8", "dot", 16, "s8_dot", 16),  # sdot v.4s, v.16b, v.4b[lane]: a q of A = 16 k
}
# The intrinsic each ISA's IR must call, and the ones it must not.
IR_CALLS = {
    "neon": "@llvm.arm.neon.vmulls.v4i32",
    "aarch64": "@llvm.aarch64.neon.smull.v4i32",
    "aarch64dot": "@llvm.aarch64.neon.sdot.v4i32.v16i8",
}


def _fits(isa, mr, nr):
    """The register budget, restated: MR*NR/4 int32 accumulators, A rows (d registers on ARMv7,
    two to a q), two B rows in flight (NR/8 q registers of int16 each, NR/4 of sdot quads), and
    one register spare; A must sit in by-lane addressable registers."""
    a_q = (mr + 1) // 2 if isa.name == "neon" else mr
    b_row = nr // 4 if isa.name == "aarch64dot" else nr // 8
    return mr * nr // 4 + a_q + 2 * b_row < isa.vector_registers and a_q <= isa.lane_registers


def test_default_tiles_are_the_qnnpack_shapes_and_fit():
    assert DEFAULT_TILES == {"neon": (4, 8), "aarch64": (8, 8), "aarch64dot": (8, 8)}
    for isa_name, (mr, nr) in DEFAULT_TILES.items():
        k = default_mac_kernel(isa_name)
        assert k.isa is ARM_ISAS[isa_name] and (k.mr, k.nr) == (mr, nr)
        need, _ = registers_needed(k.isa, mr, nr)
        assert need < k.isa.vector_registers


@pytest.mark.parametrize("isa", ARM_ISAS.values(), ids=lambda i: i.name)
def test_budget_is_enforced_exactly(isa):
    for nr in range(8, 65, 8):
        for mr in range(1, 40):
            if _fits(isa, mr, nr):
                check_tile(isa, mr, nr)
                MacKernel(isa, mr, nr)
            else:
                with pytest.raises(TileError, match=rf"needs \d+ q registers .* {isa.name} has {isa.vector_registers}"):
                    MacKernel(isa, mr, nr)


@pytest.mark.parametrize(
    "isa, mr, nr, need",
    [(NEON, 6, 8, 17), (NEON, 4, 16, 22), (NEON, 8, 8, 22), (AARCH64, 10, 8, 32), (AARCH64, 12, 8, 38),
     (AARCH64, 6, 16, 34), (AARCH64, 7, 16, 39), (AARCH64_DOT, 12, 8, 40), (AARCH64_DOT, 4, 32, 52)],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_tiles_over_budget_are_refused_with_the_count(isa, mr, nr, need):
    # AArch64 10x8 fills the file exactly (20 + 10 + 2 = 32), and its K loop spills: refused too.
    assert registers_needed(isa, mr, nr)[0] == need
    with pytest.raises(TileError, match=f"{mr}x{nr} tile needs {need} q registers .* has {isa.vector_registers}"):
        MacKernel(isa, mr, nr)


@pytest.mark.parametrize(
    "isa, mr, nr", [(NEON, 5, 8), (NEON, 2, 16), (AARCH64, 9, 8), (AARCH64, 5, 16), (AARCH64, 2, 32),
                    (AARCH64_DOT, 9, 8), (AARCH64_DOT, 4, 16), (AARCH64_DOT, 2, 24)],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_largest_legal_shapes_are_accepted(isa, mr, nr):
    MacKernel(isa, mr, nr)
    assert registers_needed(isa, mr, nr)[0] < isa.vector_registers
    assert not _fits(isa, mr + 1, nr)  # and one more row would not fit


def test_a_rows_beyond_the_lane_addressable_registers_are_refused():
    """smlal by lane takes its scalar from v0-v15 only. With the shipped register files the total
    budget always bites first, so widen the file to reach the lane limit on its own."""
    wide = dataclasses.replace(AARCH64, vector_registers=64)
    check_tile(wide, 16, 8)  # 32 + 16 + 2 = 50 < 64, A in v0-v15
    with pytest.raises(TileError, match="MR=17 A rows need 17 q registers that a by-lane multiply can address.*has 16"):
        check_tile(wide, 17, 8)


@pytest.mark.parametrize(
    "mr, nr, msg",
    [(0, 8, "MR must be a positive int, got 0"), (-2, 8, "MR must be a positive int, got -2"),
     (4, 0, "NR must be a positive int, got 0"), (2.0, 8, r"MR must be a positive int, got 2\.0"),
     (True, 8, "MR must be a positive int, got True"), (4, 8.0, r"NR must be a positive int, got 8\.0"),
     (4, "8", "NR must be a positive int, got '8'"),
     (4, 4, "NR=4 must be a multiple of 8 on neon"), (2, 12, "NR=12 must be a multiple of 8 on neon"),
     (6, 8, "6x8 tile needs 17 q registers .* neon has 16")],
)
def test_bad_tiles_name_the_constraint(mr, nr, msg):
    with pytest.raises(TileError, match=msg):
        MacKernel(NEON, mr, nr)


@pytest.mark.parametrize("isa", [AARCH64, AARCH64_DOT], ids=lambda i: i.name)
def test_nr_must_be_a_multiple_of_8_on_aarch64_too(isa):
    for nr in (4, 12, 20):
        with pytest.raises(TileError, match=f"NR={nr} must be a multiple of 8 on {isa.name}"):
            MacKernel(isa, 2, nr)


def test_non_arm_isa_is_refused():
    with pytest.raises(TileError, match=r"no integer MAC kernel for avx2; expected one of \['aarch64', 'aarch64dot', 'neon'\]"):
        MacKernel(AVX2, 4, 8)


@pytest.mark.parametrize("isa_name", sorted(SPEC))
@pytest.mark.parametrize("shape", ["default", (2, 8), (2, 16)])
def test_name_dtype_op_and_k_step(isa_name, shape):
    isa = ARM_ISAS[isa_name]
    mr, nr = DEFAULT_TILES[isa_name] if shape == "default" else shape
    k = MacKernel(isa, mr, nr)
    dtype, op, k_step, infix, per_ins = SPEC[isa_name]
    assert (k.dtype, k.op, k.k_step) == (dtype, op, k_step)
    assert k.name == f"mk_{infix}_{mr}x{nr}_{isa_name}"
    assert k.instructions_per_step == mr * nr * k_step // per_ins


def test_instructions_per_step_of_the_defaults():
    # 4x8 ARMv7: 4 k x 4 rows x 2 q of C = 32 vmlal; 8x8 AArch64: 8 k x 8 x 2 = 128 smlal(2);
    # 8x8 sdot: 4 groups x 8 x 2 = 64 sdot.
    got = {n: (default_mac_kernel(n).name, default_mac_kernel(n).instructions_per_step) for n in SPEC}
    assert got == {"neon": ("mk_s16_mac_4x8_neon", 32), "aarch64": ("mk_s16_mac_8x8_aarch64", 128),
                   "aarch64dot": ("mk_s8_dot_8x8_aarch64dot", 64)}


def test_kernels_are_hashable_values():
    # register_mac caches on the kernel: equal tiles must be one key.
    assert MacKernel(NEON, 4, 8) == default_mac_kernel("neon")
    assert len({MacKernel(NEON, 4, 8), default_mac_kernel("neon"), MacKernel(AARCH64, 4, 8)}) == 2


@pytest.mark.parametrize("isa_name", sorted(SPEC))
@pytest.mark.parametrize("shape", ["default", (2, 16)])
def test_ir_calls_the_isa_intrinsic_once_per_instruction(isa_name, shape):
    isa = ARM_ISAS[isa_name]
    mr, nr = DEFAULT_TILES[isa_name] if shape == "default" else shape
    k = MacKernel(isa, mr, nr)
    ir = k.llvm_ir()
    elem = "i8" if k.op == "dot" else "i16"
    assert f"define internal void @{k.name}(ptr noalias %a, i32 %lda, ptr noalias %b, i32 %ldb, ptr noalias %c, i32 %ldc, i32 %k)" in ir
    calls = re.findall(r"= call <4 x i32> (@[\w.]+)\(", ir)
    assert set(calls) == {IR_CALLS[isa_name]}
    assert len(calls) == k.instructions_per_step
    assert f"declare <4 x i32> {IR_CALLS[isa_name]}(" in ir
    for other in set(IR_CALLS.values()) - {IR_CALLS[isa_name]}:
        assert other not in ir
    # A is read in vectors of k_step elements, one per row per step; C once before the loop and once after.
    a_vec = "<16 x i8>" if k.op == "dot" else f"<{k.k_step} x i16>"
    assert len(re.findall(rf"%av\d+ = load {re.escape(a_vec)}, ptr", ir)) == mr
    assert len(re.findall(r"%c0_\d+_\d+ = load <4 x i32>", ir)) == mr * nr // 4
    assert len(re.findall(r"store <4 x i32>", ir)) == mr * nr // 4
    assert f"getelementptr inbounds {elem}, ptr %a" in ir
    assert "llvm.loop.unroll.disable" in ir
    assert "icmp sle i32 %k, 0" in ir  # K = 0 skips the loop: C stays as it was
    assert f"add nuw nsw i32 %kk, {k.k_step}" in ir


def test_mac_ir_has_no_sdot_and_dot_ir_no_widening():
    assert "sdot" not in default_mac_kernel("neon").llvm_ir() + default_mac_kernel("aarch64").llvm_ir()
    dot = default_mac_kernel("aarch64dot").llvm_ir()
    assert "smull" not in dot and "vmulls" not in dot and "sext" not in dot
