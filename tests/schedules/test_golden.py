"""Assembly of the tensorized convolution (compiled only, so AVX-512 is checked on any host):
every K loop is one register tile and nothing else, then the golden dump per layer. The 7-wide
layer on AVX-512 runs tiles of two output blocks (7x32): its K loop holds 14 FMAs. Where the plan
cuts the reduction into chunks (the 7x7 layer), every K loop prefetches the next chunk's weights;
a whole reduction's prefetches the next output block's where the ISA's entry says so (AVX-512,
not AVX2: microkernels.PREFETCH_WHOLE_REDUCTIONS): one prefetcht1 per B vector, else none."""

import pytest

from microkernels import ARM_ISAS, ISAS, PREFETCH_WHOLE_REDUCTIONS, asm
from schedules import golden

from .. import golden_dumps


@pytest.fixture(scope="module", params=golden.cases(), ids=lambda c: f"{c[0]}-{c[1]}")
def compiled(request):
    layer, isa = request.param
    return layer, isa, golden.compile_case(layer, isa)


def test_k_loops_hold_only_the_tile(compiled):
    layer, isa_name, op = compiled
    if isa_name in ARM_ISAS:
        # ARM: every MAC loop is the tile's K step exactly (by-lane MACs, no widening or stores).
        loops = golden.hot_loops(isa_name, op)
        assert loops, "no MAC loop: the tiles were not tensorized"
        for lp in loops:
            problems = asm.mac_loop_problems(lp, isa_name, op.plan.kern.instructions_per_step)
            assert not problems, f"{lp.label}: {problems}\n" + "\n".join(lp.body)
        return
    isa = ISAS[isa_name]
    nv = op.plan["output_blocks"] * op.geometry.block // isa.lanes  # a tile may span two output blocks
    tile_rows = {mr for _, _, mr in op.plan["segments"]}
    prefetches = nv if op.plan.get("chunk") or PREFETCH_WHOLE_REDUCTIONS[isa_name] else 0
    loops = asm.fma_loops(op.asm)
    assert loops, "no FMA loop: the tiles were not tensorized"
    seen = set()
    for lp in loops:
        mr = lp.count("vfmadd") // nv
        assert mr in tile_rows, f"{lp.label}: {lp.count('vfmadd')} FMAs fit no tile of {sorted(tile_rows)}"
        problems = asm.tile_loop_problems(lp, isa, mr, nv, prefetches=prefetches)
        assert not problems, f"{lp.label} ({mr}x{op.geometry.block} tile): {problems}\n" + "\n".join(lp.body)
        seen.add(mr)
    assert seen == tile_rows, f"tiles {sorted(tile_rows - seen)} have no K loop of their own"


def test_golden_dump_matches(compiled):
    layer, isa, op = compiled
    golden_dumps.check(golden.dump_path(layer, isa), golden.render(layer, isa, op), f"hot loops of {layer} ({isa})")


def test_every_dump_has_a_case():
    expected = {golden.dump_path(*c).name for c in golden.cases()}
    present = {p.name for p in golden.DUMP_DIR.glob("*.s")}
    assert present == expected, f"stale dumps: {present - expected}, missing: {expected - present}"


@pytest.mark.parametrize("direction, isa", golden.transpose_cases(), ids=lambda v: v)
def test_transpose_dump_matches(direction, isa):
    golden_dumps.check(golden.transpose_path(direction, isa), golden.render_transpose(direction, isa),
                       f"the {direction} transpose ({isa})")


def test_every_transpose_dump_has_a_case():
    expected = {golden.transpose_path(*c).name for c in golden.transpose_cases()}
    assert {p.name for p in golden.LAYOUT_DIR.glob("*.s")} == expected
