"""Assembly of every kernel variant, compiled through its intrinsic (no execution needed, so the
AVX-512 kernels are checked on any host): the property the kernel promises, then the golden dump."""

import pytest

from intrinsics import golden
from microkernels import asm
from intrinsics.f32_dwconv import DwRow
from microkernels.f32_layernorm import LayerNormKernel
from microkernels.f32_vmap import VmapKernel
from microkernels.f32_wino import WinoKernel
from microkernels.int_amx import AmxGemmKernel
from microkernels.int_gemm import IntGemmKernel
from microkernels.int_mac import MacKernel

from .. import golden_dumps

CASES = golden.cases()
# The Winograd transforms are straight-line code with no K loop (test_f32_wino_asm.py states
# theirs); the depthwise rows have a pixel loop of their own (test_f32_dwconv.py), the vector
# math rows a loop over values (test_f32_vmath.py), the LayerNorm rows three (test_f32_layernorm.py).
TILES = [k for k in CASES if not isinstance(k, (WinoKernel, DwRow, VmapKernel, LayerNormKernel))]


@pytest.fixture(scope="module", params=CASES, ids=lambda k: k.name)
def compiled(request):
    kern = request.param
    return kern, golden.compiled_function(kern)


@pytest.fixture(scope="module", params=TILES, ids=lambda k: k.name)
def compiled_tile(request):
    kern = request.param
    return kern, golden.compiled_function(kern)


def test_k_loop_is_the_tile_and_nothing_else(compiled_tile):
    """One K loop: MR*NR/lanes FMAs on the ISA's registers, one load per B vector, the A
    broadcasts (one vbroadcastss per row, or all folded as {1to16} on AVX-512 with NR = 16: several
    FMAs sharing a row's broadcast beat re-loading it in each), one prefetcht1 per B vector in a
    prefetching kernel, no store, no stack traffic."""
    kern, fn = compiled_tile
    if isinstance(kern, MacKernel):
        # NEON: one K loop of by-lane MACs (vmlal.s16 d[lane] / smlal(2) v.h[lane] / sdot
        # v.4b[lane]), loads and bookkeeping; no widening, store or stack access.
        loops = asm.mac_loops(fn, kern.isa.arch)
        assert len(loops) == 1, f"expected one K loop, found {len(loops)}"
        problems = asm.mac_loop_problems(loops[0], kern.isa.name, kern.instructions_per_step)
        assert not problems, f"{kern.name}: {problems}\n" + "\n".join(loops[0].body)
        return
    if isinstance(kern, AmxGemmKernel):
        # AMX: per 64-deep step A*B tdpbusd and A+B tileloadd (the operand tiles), nothing else
        # that touches memory, and the configuration outside.
        loops = [lp for lp in asm.single_block_loops(fn) if any("tdpbusd" in i for i in lp.body)]
        assert len(loops) == 1, f"expected one K loop, found {len(loops)}"
        ops = [i.split()[0] for i in loops[0].body]
        assert ops.count("tdpbusd") == kern.instructions_per_step, loops[0].body
        assert ops.count("tileloadd") == kern.a_tiles + kern.b_tiles, loops[0].body
        assert not any(o.startswith(("tilestore", "ldtilecfg", "vmov", "mov")) and "(%rsp" in i
                       for o, i in zip(ops, loops[0].body)), loops[0].body
        assert "ldtilecfg" not in ops and "tilestored" not in ops, loops[0].body
        return
    if isinstance(kern, IntGemmKernel):
        # x86 integer: MR*NR/lanes vpdpbusd (or vpmaddwd + vpaddd), B loads, A vpbroadcastd.
        loops = [lp for lp in asm.single_block_loops(fn) if any(m in i for i in lp.body for m in ("vpdpbusd", "vpmaddwd"))]
        assert len(loops) == 1, f"expected one K loop, found {len(loops)}"
        problems = asm.int_tile_loop_problems(loops[0], kern.isa, kern.op, kern.mr, kern.vectors_per_row)
        assert not problems, f"{kern.name}: {problems}\n" + "\n".join(loops[0].body)
        return
    loops = asm.fma_loops(fn)
    assert len(loops) == 1, f"expected one K loop, found {len(loops)}"
    problems = asm.tile_loop_problems(loops[0], kern.isa, kern.mr, kern.vectors_per_row,
                                      prefetches=kern.vectors_per_row if kern.prefetch else 0)
    assert not problems, f"{kern.name}: {problems}\n" + "\n".join(loops[0].body)


def test_golden_dump_matches(compiled):
    kern, fn = compiled
    golden_dumps.check(golden.dump_path(kern), golden.render(kern, fn), f"assembly of {kern.name}")


def test_every_dump_has_a_case():
    expected = {golden.dump_path(k).name for k in CASES}
    present = {p.name for p in golden.DUMP_DIR.glob("*.s")}
    assert present == expected, f"stale dumps: {present - expected}, missing: {expected - present}"
