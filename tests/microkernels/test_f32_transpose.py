"""The register transpose (microkernels/f32_transpose.py): its shuffle stages transpose any
tile (checked on index matrices, no compiler involved), and its assembly on both ISAs, compiled
on any host: whole tiles per loop iteration, L stores each and a bounded number of shuffles on
the ISA's register width, nothing spilled. Its numerics run in tests/schedules/common/test_layouts.py,
through the layout transforms that call it (AVX-512 on the Bochs CPU where the host lacks it)."""

import numpy as np
import pytest
import tvm

from microkernels import ISAS, asm
from microkernels.f32_transpose import TransposeKernel, stage_masks
from schedules.common import layouts


@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_the_stages_transpose_a_tile(lanes):
    rows = [list(range(r * lanes, (r + 1) * lanes)) for r in range(lanes)]  # element (r, c) = r*L + c
    d = lanes // 2
    while d:
        low, high = stage_masks(lanes, d)
        new = list(rows)
        for i in range(lanes):
            if not i & d:
                both = rows[i] + rows[i + d]
                new[i], new[i + d] = [both[m] for m in low], [both[m] for m in high]
        rows, d = new, d // 2
    assert np.array_equal(np.array(rows), np.arange(lanes * lanes).reshape(lanes, lanes).T)


# Shuffle instructions per tile as TVM's LLVM lowers the IR's L log2(L) two-input shuffles: one
# each on AVX-512 (vpermt2ps/pd, vunpck*, vshuff64x2, vinsertf64x4); on AVX2 the last stage's
# within-lane pairs take two vshufps each, 32 instead of 24. More than this is a regression.
SHUFFLES = {"avx512": 64, "avx2": 32}


@pytest.mark.parametrize("isa_name", sorted(ISAS))
def test_whole_tiles_in_registers(isa_name):
    """The block loop (in TVM's parallel lambda) stores whole tiles, L vectors each, with at
    most SHUFFLES shuffles per tile (LLVM folds some loads into them, or loads half rows and
    inserts them), register copies aside; no other arithmetic, no stack traffic, and vectors of
    the ISA's width."""
    isa = ISAS[isa_name]
    kern = TransposeKernel(isa)
    lib = tvm.compile(layouts.transpose_module((1, 32, 8, 8), isa, into_blocks=True), target=isa.target)
    fn = asm.compute_function(lib.mod.inspect_source("asm"), "__tvm_parallel_lambda")  # the block loop runs there
    reg = "zmm" if isa_name == "avx512" else "ymm"
    loops = [lp for lp in asm.single_block_loops(fn) if any(f"%{reg}" in i for i in lp.body)]
    assert loops, fn
    for lp in loops:
        vector = [i for i in lp.body if "mm" in i]
        moves = [i for i in vector if i.split()[0].startswith("vmov")]
        stores = [i for i in moves if "(" in i.split(",")[-1]]
        shuffles = [i for i in vector if i not in moves]
        tiles, rest = divmod(len(stores), kern.lanes)
        assert tiles >= 1 and rest == 0 and all(f"%{reg}" in i for i in stores), lp.body
        assert len(shuffles) <= tiles * SHUFFLES[isa_name], shuffles
        assert all(i.split()[0].startswith(("vunpck", "vshuf", "vperm", "vinsert", "vblend", "vpunpck", "vpshuf",
                                            "valign", "vmovlhps", "vmovhlps", "vextract")) for i in shuffles), shuffles
    assert not asm.stack_accesses(fn), asm.stack_accesses(fn)
