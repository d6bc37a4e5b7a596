"""Kernel level, no TVM: tile budgets, names and the IR each tile generates."""

import re

import pytest

from microkernels import AVX2, AVX512, DEFAULT_TILES, ISAS, GemmKernel, TileError, check_tile, default_kernel, max_tiles
from microkernels.f32_gemm import registers_needed


@pytest.mark.parametrize("isa", ISAS.values(), ids=lambda i: i.name)
def test_budget_is_enforced_exactly(isa):
    for nv in range(1, 12):
        for mr in range(1, 40):
            nr = nv * isa.lanes
            fits = mr * nv + nv + (0 if isa.embedded_broadcast and nv == 1 else 1) <= isa.vector_registers
            if fits:
                check_tile(isa, mr, nr)
            else:
                with pytest.raises(TileError, match=f"{isa.vector_registers}"):
                    check_tile(isa, mr, nr)


@pytest.mark.parametrize("isa", ISAS.values(), ids=lambda i: i.name)
def test_max_tiles_are_maximal(isa):
    tiles = max_tiles(isa)
    assert tiles
    for mr, nr in tiles:
        assert registers_needed(isa, mr, nr) <= isa.vector_registers
        assert registers_needed(isa, mr + 1, nr) > isa.vector_registers


def test_defaults_fit_and_are_named_by_scheme():
    for isa_name, (mr, nr) in DEFAULT_TILES.items():
        k = default_kernel(isa_name)
        assert (k.mr, k.nr) == (mr, nr)
        assert k.name == f"mk_f32_gemm_{mr}x{nr}_{isa_name}"
        assert default_kernel(isa_name, accumulate=False).name == k.name + "_beta0"


@pytest.mark.parametrize(
    "mr, nr, msg",
    [(0, 16, "MR must be a positive"), (4, 0, "NR must be a positive"), (4, 12, "multiple of the avx2"),
     (2.0, 16, "MR must be"), (True, 16, "MR must be"), (7, 16, "needs 17 vector registers .* has 16")],
)
def test_bad_tiles_name_the_constraint(mr, nr, msg):
    with pytest.raises(TileError, match=msg):
        GemmKernel(AVX2, mr, nr)


@pytest.mark.parametrize("accumulate", [True, False])
def test_ir_holds_one_fma_per_accumulator_and_reads_c_only_when_accumulating(accumulate):
    k = GemmKernel(AVX512, 14, 32, accumulate)
    ir = k.llvm_ir()
    assert f"define internal void @{k.name}(" in ir
    assert len(re.findall(r"call <16 x float> @llvm\.fma\.v16f32", ir)) == k.fmas_per_k == 28
    c_loads = re.findall(r"%c0_\d+_\d+ = load", ir)
    assert len(c_loads) == (28 if accumulate else 0)
    assert len(re.findall(r"store <16 x float>", ir)) == 28
    assert "llvm.loop.unroll.disable" in ir


@pytest.mark.parametrize("accumulate", [True, False])
def test_batch_reduce_variant_is_named_and_keeps_one_k_step(accumulate):
    k = GemmKernel(AVX2, 6, 16, accumulate, batch_reduce=True)
    assert k.name == "mk_f32_brgemm_6x16_avx2" + ("" if accumulate else "_beta0")
    ir = k.llvm_ir()
    assert "i32 %n1, i32 %sa1, i32 %n2, i32 %sa2, i32 %n3, i32 %sa3" in ir
    assert len(re.findall(r"call <8 x float> @llvm\.fma\.v8f32", ir)) == k.fmas_per_k == 12
    # C is read once before all batches only when accumulating, and written once after them.
    assert len(re.findall(r"%c0_\d+_\d+ = load", ir)) == (12 if accumulate else 0)
    assert len(re.findall(r"%res\d+_\d+ = load", ir)) == 12
    assert "llvm.loop.unroll.disable" in ir


@pytest.mark.parametrize("batch_reduce", [False, True])
def test_prefetch_variant_fetches_one_line_per_b_vector_a_whole_call_ahead(batch_reduce):
    """_pf: one prefetch into L2 (locality 2) per B vector and K step, at the element one call's
    B further on (k*ldb; a batch: n1*n2*n3*k*ldb), which is where the next call's panels begin."""
    plain = GemmKernel(AVX512, 7, 32, False, batch_reduce)
    k = GemmKernel(AVX512, 7, 32, False, batch_reduce, prefetch=True)
    assert k.name == plain.name.replace("_beta0", "_beta0_pf")
    ir = k.llvm_ir()
    calls = re.findall(r"call void @llvm\.prefetch\.p0\(ptr %pf\d+, i32 0, i32 2, i32 1\)", ir)
    assert len(calls) == k.vectors_per_row == 2
    distance = ("%pfn1 = mul i64 %bstep, %n164", "%pfn2 = mul i64 %pfn1, %n264", "%pfd = mul i64 %pfn2, %n364") \
        if batch_reduce else ("%pfd = mul i64 %k64, %ldb64",)
    assert all(d in ir for d in distance)
    assert "llvm.prefetch" not in plain.llvm_ir()
