"""Assembly of every kernel variant, compiled through its intrinsic (no execution needed, so the
AVX-512 kernels are checked on any host): the property the kernel promises, then the golden dump."""

import difflib

import pytest

from intrinsics import golden
from microkernels import asm

CASES = golden.cases()


@pytest.fixture(scope="module", params=CASES, ids=lambda k: k.name)
def compiled(request):
    kern = request.param
    return kern, golden.compiled_function(kern)


def test_k_loop_is_the_tile_and_nothing_else(compiled):
    kern, fn = compiled
    loops = asm.fma_loops(fn)
    assert len(loops) == 1, f"expected one K loop, found {len(loops)}"
    lp = loops[0]
    nv = kern.vectors_per_row
    assert lp.count("vfmadd231ps") == len([i for i in lp.body if "vfmadd" in i]) == kern.mr * nv
    reg = "%zmm" if kern.isa.name == "avx512" else "%ymm"
    assert all(reg in i for i in lp.body if i.startswith("vfmadd")), "FMAs on the wrong register width"
    assert lp.stack_accesses() == [], f"spills or reloads in the K loop: {lp.stack_accesses()}"
    b_loads = [i for i in lp.body if i.split()[0] in ("vmovaps", "vmovups") and i.split()[1].endswith(",")
               and "(" in i.split()[1]]
    assert len(b_loads) == nv, f"expected {nv} B-row loads per K step, got {b_loads}"


def test_a_is_broadcast_once_per_row_and_folded_where_possible(compiled):
    kern, fn = compiled
    lp = asm.fma_loops(fn)[0]
    folded = sum("{1to16}" in i for i in lp.body)
    if kern.isa.embedded_broadcast and kern.vectors_per_row == 1:
        assert folded == kern.mr and lp.count("vbroadcastss") == 0
    else:
        # Several FMAs share a row's broadcast: one vbroadcastss into a register beats
        # re-loading it inside each FMA.
        assert lp.count("vbroadcastss") == kern.mr and folded == 0


def test_golden_dump_matches(compiled):
    kern, fn = compiled
    path = golden.dump_path(kern)
    assert path.exists(), f"{path.name} missing: run `python -m microkernels regen-asm`"
    want, got = path.read_text(), golden.render(kern, fn)
    if want != got:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), f"golden/{path.name}", "emitted"))
        pytest.fail(f"assembly of {kern.name} changed (regenerate with `python -m microkernels regen-asm` "
                    f"if intended):\n{diff}")


def test_every_dump_has_a_case():
    expected = {golden.dump_path(k).name for k in CASES}
    present = {p.name for p in golden.DUMP_DIR.glob("*.s")}
    assert present == expected, f"stale dumps: {present - expected}, missing: {expected - present}"
