"""Kernel level, no TVM: the x86 integer tiles' budgets, names, groups, variants and the IR they
generate (which instruction, which operand is the broadcast, what the requantizing store calls)."""

import re

import pytest

from microkernels import AARCH64, AVX2, AVX512, TileError
from microkernels.int_gemm import (
    DEFAULT_TILES,
    IntGemmKernel,
    check_tile,
    default_int_kernel,
    max_tiles,
    registers_needed,
)
from microkernels.isa import AVX512_VNNI, AVX_VNNI, X86_INT_ISAS

# What each ISA promises, stated independently of the generator's tables:
# (name infix, A dtype, B dtype, k per group, MACs per instruction, the LLVM intrinsic)
SPEC = {
    "avx512vnni": ("u8s8", "uint8", "int8", 4, 64, "@llvm.x86.avx512.vpdpbusd.512"),
    "avxvnni": ("u8s8", "uint8", "int8", 4, 32, "@llvm.x86.avx512.vpdpbusd.256"),
    "avx512": ("s16", "int16", "int16", 2, 32, "@llvm.x86.avx512.pmaddw.d.512"),
    "avx2": ("s16", "int16", "int16", 2, 16, "@llvm.x86.avx2.pmadd.wd"),
}


def _fits(isa, mr, nr):
    """The budget restated: MR*NR/lanes accumulators, NR/lanes B vectors, one broadcast, and for
    vpmaddwd one more register for the product before its vpaddd."""
    nv = nr // isa.lanes
    return mr * nv + nv + 1 + (SPEC[isa.name][0] == "s16") <= isa.vector_registers


def test_the_family_covers_every_x86_integer_isa():
    assert set(X86_INT_ISAS) == set(SPEC)
    assert X86_INT_ISAS["avx512vnni"].target["mattr"] == ["+avx512vnni"]
    assert X86_INT_ISAS["avxvnni"].target["mattr"] == ["+avxvnni"]
    assert "avx512_vnni" in AVX512_VNNI.host_flags and "avx_vnni" in AVX_VNNI.host_flags


@pytest.mark.parametrize("isa", X86_INT_ISAS.values(), ids=lambda i: i.name)
def test_budget_is_enforced_exactly(isa):
    for nr in range(isa.lanes, 4 * isa.lanes + 1, isa.lanes):
        for mr in range(1, 34):
            if _fits(isa, mr, nr):
                check_tile(isa, mr, nr)
                IntGemmKernel(isa, mr, nr)
            else:
                with pytest.raises(TileError, match=rf"needs \d+ vector registers .* {isa.name} has {isa.vector_registers}"):
                    IntGemmKernel(isa, mr, nr)
    tiles = max_tiles(isa)
    assert tiles and all(_fits(isa, mr, nr) for mr, nr in tiles)
    assert {nr for _, nr in tiles} == {nr for nr in range(isa.lanes, 65, isa.lanes) if _fits(isa, 2, nr)}


@pytest.mark.parametrize("isa_name", sorted(SPEC))
def test_defaults_fit_and_use_most_of_the_file(isa_name):
    kern = default_int_kernel(isa_name)
    assert (kern.mr, kern.nr) == DEFAULT_TILES[isa_name]
    need = registers_needed(kern.isa, kern.mr, kern.nr)
    assert need <= kern.isa.vector_registers and kern.mr * kern.vectors_per_row >= kern.isa.vector_registers * 3 // 4 - 1


@pytest.mark.parametrize(
    "isa, mr, nr, msg",
    [(AVX512_VNNI, 0, 64, "MR must be a positive int, got 0"), (AVX512_VNNI, 6, 32.0, r"NR must be a positive int"),
     (AVX512_VNNI, 6, 40, "NR=40 must be a multiple of 16"), (AVX2, 6, 12, "NR=12 must be a multiple of 8"),
     (AVX512_VNNI, 7, 64, "7x64 tile needs 33 vector registers"), (AVX512, 6, 80, "needs"),
     (AVX2, 7, 16, "7x16 tile needs 18 vector registers"), (AVX_VNNI, 5, 24, "5x24 tile needs 19")],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_bad_tiles_name_the_constraint(isa, mr, nr, msg):
    with pytest.raises(TileError, match=msg):
        IntGemmKernel(isa, mr, nr)


def test_non_x86_isa_and_bad_variants_are_refused():
    with pytest.raises(TileError, match=r"no x86 integer GEMM kernel for aarch64; expected one of \['avx2', 'avx512', 'avx512vnni', 'avxvnni'\]"):
        IntGemmKernel(AARCH64, 4, 8)
    with pytest.raises(TileError, match=r"requant must be None or one of \('uint8', 'int8', 'float32'\), got 'int16'"):
        IntGemmKernel(AVX512_VNNI, 6, 64, requant="int16")


@pytest.mark.parametrize("isa_name", sorted(SPEC))
def test_names_dtypes_groups_and_variants(isa_name):
    infix, a_dt, b_dt, group, macs, _ = SPEC[isa_name]
    isa = X86_INT_ISAS[isa_name]
    mr, nr = DEFAULT_TILES[isa_name]
    k = IntGemmKernel(isa, mr, nr)
    assert k.name == f"mk_{infix}_gemm_{mr}x{nr}_{isa_name}"
    assert (k.a_dtype, k.b_dtype, k.group, k.c_dtype) == (a_dt, b_dt, group, "int32")
    assert k.macs_per_instruction == macs and k.instructions_per_step == mr * nr // isa.lanes
    assert IntGemmKernel(isa, mr, nr, accumulate=False).name == f"mk_{infix}_gemm_{mr}x{nr}_{isa_name}_beta0"
    assert IntGemmKernel(isa, mr, nr, batch_reduce=True).name == f"mk_{infix}_brgemm_{mr}x{nr}_{isa_name}"
    q = IntGemmKernel(isa, mr, nr, batch_reduce=True, requant="uint8")
    # The requantized store discards the int32 tile: nothing to accumulate into.
    assert q.name == f"mk_{infix}_brgemm_{mr}x{nr}_{isa_name}_qu8" and not q.accumulate and q.c_dtype == "uint8"
    assert IntGemmKernel(isa, mr, nr, requant="int8").name.endswith("_qs8")
    assert IntGemmKernel(isa, mr, nr, requant="float32").name.endswith("_qf32")
    pf = IntGemmKernel(isa, mr, nr, batch_reduce=True, requant="uint8", prefetch=True)
    assert pf.name == f"mk_{infix}_brgemm_{mr}x{nr}_{isa_name}_pf_qu8"
    assert "@llvm.prefetch.p0" in pf.llvm_ir() and "@llvm.prefetch" not in q.llvm_ir()


@pytest.mark.parametrize("isa_name", sorted(SPEC))
def test_ir_calls_the_instruction_with_a_as_the_broadcast(isa_name):
    infix, _, _, group, _, intrinsic = SPEC[isa_name]
    kern = default_int_kernel(isa_name)
    ir = kern.llvm_ir()
    calls = re.findall(r"call <\d+ x i32> (@[\w.]+)\(", ir)
    assert set(calls) == {intrinsic} and len(calls) == kern.instructions_per_step
    # A's group (4 bytes or 2 words) is loaded as one i32 and splat: the broadcast operand. For
    # vpdpbusd it must be the first source, the one the instruction reads as unsigned.
    assert ir.count("load i32, ptr %aq") == kern.mr
    if infix == "u8s8":
        assert re.search(r"vpdpbusd\.\d+\(<\d+ x i32> %acc0_0, <\d+ x i8> %ab0, <\d+ x i8> %bv0\)", ir)
    else:
        assert ir.count(f"add <{kern.isa.lanes} x i32> %acc") == kern.instructions_per_step
    assert f"%ka = mul i64 %kk, {group}" in ir
    assert "llvm.loop.unroll.disable" in ir


def test_requantizing_store_rounds_half_to_even_and_saturates():
    ir = IntGemmKernel(AVX512_VNNI, 6, 64, requant="uint8").llvm_ir()
    assert ir.count("@llvm.roundeven.v16f32(") == 1 + 24  # the declaration and one per vector
    assert ir.count("call <16 x float> @llvm.maxnum") == 24 and ir.count("call <16 x float> @llvm.minnum") == 24
    assert ir.count("trunc <16 x i32>") == 24 and "store <16 x i8>" in ir
    assert "ptr noalias %bias, ptr noalias %scale, i32 %zp, i32 %lo, i32 %hi" in ir
    f = IntGemmKernel(AVX512_VNNI, 6, 64, requant="float32").llvm_ir()
    assert "roundeven" not in f and f.count("store <16 x float> %qs") == 24
    plain = IntGemmKernel(AVX2, 6, 16).llvm_ir()
    assert "sitofp" not in plain and plain.count("store <8 x i32> %res") == 12


# The vpmaddubsw pairs tile, stated independently: (name infix, A, B, k per group, its two
# intrinsics: uint8 x int8 pairs into int16, then int16 pairs into int32 by ones)
PAIRS_SPEC = {
    "avx512": ("u8s7", "uint8", "int8", 4, "@llvm.x86.avx512.pmaddubs.w.512", "@llvm.x86.avx512.pmaddw.d.512"),
    "avx2": ("u8s7", "uint8", "int8", 4, "@llvm.x86.avx2.pmadd.ub.sw", "@llvm.x86.avx2.pmadd.wd"),
}


@pytest.mark.parametrize("isa_name", sorted(PAIRS_SPEC))
def test_pairs_tile_names_budget_and_ir(isa_name):
    infix, a_dt, b_dt, group, ubsw, wd = PAIRS_SPEC[isa_name]
    isa = X86_INT_ISAS[isa_name]
    nv_max = isa.vector_registers
    for nr in range(isa.lanes, 4 * isa.lanes + 1, isa.lanes):
        nv = nr // isa.lanes
        for mr in range(1, 34):
            fits = mr * nv + nv + 1 + 2 <= nv_max  # + the vpmaddubsw product and the ones
            if fits:
                IntGemmKernel(isa, mr, nr, pairs=True)
            else:
                with pytest.raises(TileError, match="a vpmaddubsw product and a vector of ones"):
                    IntGemmKernel(isa, mr, nr, pairs=True)
    mr, nr = (5, 16) if isa_name == "avx2" else (6, 64)
    k = IntGemmKernel(isa, mr, nr, pairs=True)
    assert k.name == f"mk_{infix}_gemm_{mr}x{nr}_{isa_name}" and k.op == infix
    assert (k.a_dtype, k.b_dtype, k.group) == (a_dt, b_dt, group)
    assert k.instructions_per_step == 2 * mr * nr // isa.lanes
    ir = k.llvm_ir()
    assert len(re.findall(rf"call <\d+ x i16> {re.escape(ubsw)}\(", ir)) == mr * nr // isa.lanes
    ones = "<" + ", ".join(["i16 1"] * 2 * isa.lanes) + ">"
    assert len(re.findall(rf"call <\d+ x i32> {re.escape(wd)}\(<\d+ x i16> %pw\d+_\d+, <\d+ x i16> {ones}\)", ir)) \
        == mr * nr // isa.lanes


@pytest.mark.parametrize("isa", [AVX512_VNNI, AVX_VNNI], ids=lambda i: i.name)
def test_pairs_tile_is_refused_where_vnni_is_exact(isa):
    with pytest.raises(TileError, match=f"vpmaddubsw pairs tile is for ISAs without VNNI .* {isa.name} multiplies"):
        IntGemmKernel(isa, 2, isa.lanes, pairs=True)
