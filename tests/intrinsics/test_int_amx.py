"""The AMX tiles compiled and run: their assembly (tdpbusd and tileloadd per 64-deep step, one
ldtilecfg, outside the loop) on every host, their numerics against int64 numpy where they can run.

Coverage by host: the numerics run only on a host with amx_tile and amx_int8 whose kernel lends
the process the tile state; no emulator here implements AMX (the Bochs CPU models Tiger Lake), so
elsewhere they are skipped, saying so. What the AMX tile computes is then still covered by the
same schedules on the VNNI tile, which takes B in the same packed order."""

import numpy as np
import pytest
import tvm

from intrinsics.tile_module import int_kernel_function
from microkernels import AMX_INT8
from microkernels.int_amx import AmxGemmKernel

from ..testers.int_gemm import KernelCallTester

needs_amx = pytest.mark.skipif(not AMX_INT8.host_supports(),
                               reason=f"no AMX here ({', '.join(AMX_INT8.host_missing())}); no emulator implements it")


def _asm(kern: AmxGemmKernel, k: int) -> str:
    lay = KernelCallTester(kern, k, (2, 1, 1))
    mod = int_kernel_function(kern, lay.sizes, lay.offsets, (lay.lda, lay.ldb, lay.ldc), k, lay.batch_args())
    return tvm.compile(mod, target=kern.isa.target).mod.inspect_source("asm")


@pytest.mark.parametrize("rows, a, b", [(16, 2, 2), (14, 2, 2), (7, 1, 3)])
def test_assembly_per_k_step(rows, a, b):
    """The K loop (the block that holds tdpbusd) issues A*B tdpbusd and A+B tileloadd; the tiles
    are configured once, before it, and released once, after it."""
    kern = AmxGemmKernel(rows, a, b)
    text = _asm(kern, 192)
    lines = [ln.strip() for ln in text.splitlines()]
    dots = [i for i, ln in enumerate(lines) if ln.startswith("tdpbusd")]
    # The loop body: from the label before the first tdpbusd to the branch after it (LLVM may
    # peel the batch loop into copies of the K loop; the first is checked).
    start = max(i for i in range(dots[0]) if lines[i].endswith(":"))
    end = next(i for i in range(dots[0], len(lines)) if lines[i].startswith("j"))
    body = [ln.split()[0] for ln in lines[start + 1:end + 1] if ln and not ln.startswith((".", "#"))]
    assert body.count("tdpbusd") == a * b
    assert body.count("tileloadd") == a + b
    assert "ldtilecfg" not in body and "tilestored" not in body
    assert sum(ln.startswith("ldtilecfg") for ln in lines) == 1 and sum(ln.startswith("tilerelease") for ln in lines) == 1
    assert lines.index(next(ln for ln in lines if ln.startswith("ldtilecfg"))) < dots[0]


@needs_amx
@pytest.mark.parametrize("accumulate", [True, False])
@pytest.mark.parametrize("rows, a, b", [(16, 2, 2), (14, 2, 2), (7, 1, 3), (5, 2, 1), (16, 3, 1)])
@pytest.mark.parametrize("k, batch", [(64, (1, 1, 1)), (192, (3, 1, 1)), (128, (2, 2, 3))])
def test_exact_against_int64(rows, a, b, k, batch, accumulate):
    """C0 (beta=0: nothing of C's old values) + the sum over the batch of A block @ B panel, bit
    for bit, at offsets and free strides with overlapping A blocks (a conv's windows), nothing
    written around the tile."""
    KernelCallTester(AmxGemmKernel(rows, a, b, accumulate=accumulate), k, batch).test(seed=rows * 100 + k)


@needs_amx
def test_extreme_values_do_not_saturate():
    """255 x 127 and 255 x -128 products over a long K (3 * 4096 of them): the sums pass 2**28
    each way, which a saturating or 16-bit intermediate would not keep."""
    kern = AmxGemmKernel(16, 2, 2)
    t = KernelCallTester(kern, 4096, (3, 1, 1))
    a = np.full(t.sizes[0], 255, np.uint8)
    column = np.arange(t.sizes[1]) % t.ldb // 4  # B packed (K/4, ldb/4, 4): a column keeps its sign
    b = np.where(column % 2 == 0, np.int8(127), np.int8(-128)).astype(np.int8)
    _, acc = t.test(seed=1, a=a, b=b, c_bound=0)
    assert acc.max() > 2**28 and acc.min() < -2**28
