"""Tester of the Winograd transform kernels: every kind, tile and ISA goes through WinoTester."""

from __future__ import annotations

import numpy as np

from intrinsics import f32_wino as iwino
from microkernels import f32_wino as wino

from .common import assert_written_only, execute

EPS = np.finfo(np.float32).eps


def _tile(at: tuple, n: int) -> tuple:
    """Index of an n x n tile at `at`; a third entry picks the index along the unit axis."""
    return (slice(at[0], at[0] + n), slice(at[1], at[1] + n)) + tuple(at[2:])


class WinoTester:
    """WinoTester(kern, extra_rows, extra_cols, depth).test(seed): src `extra_rows` rows and
    `extra_cols` columns into its buffer and dst the other way round, each at the last index of
    a unit axis `depth` long where the operand has one (UNIT_AXIS); dst = M src M^T against
    float64 numpy, nothing written around dst, and src untouched except by the output
    transform, which keeps its first pass there (documented)."""

    def __init__(self, kern, extra_rows: int = 0, extra_cols: int = 0, depth: int = 1):
        self.kern = kern
        self.placement = iwino.placement(kern, (extra_rows, extra_cols, depth - 1), (0, 0, 0),
                                         (extra_cols, extra_rows, depth - 1), (0, 0, 0))

    def test(self, seed: int) -> None:
        kern = self.kern
        src_shape, src_at, dst_shape, dst_at = self.placement
        (q, _), (p, _) = kern.shapes
        rng = np.random.default_rng(seed)
        src = rng.standard_normal(src_shape, dtype=np.float32)
        dst = np.full(dst_shape, 7.0, np.float32)
        src_after, got = execute(iwino.compile_tile(kern, *self.placement), kern.isa, [src, dst], [0, 1])
        mat = wino.as_array(kern.program_matrix)
        x = src[_tile(src_at, q)].astype(np.float64)
        ref = np.einsum("ik,klc,jl->ijc", mat, x, mat)
        mag = np.einsum("ik,klc,jl->ijc", np.abs(mat), np.abs(x), np.abs(mat))
        # Each output is two chained sums of q products by constants float32 holds exactly (B^T,
        # A^T): 2q + 2 roundings at most, each within u of the running |M| |src| |M^T| magnitude.
        tol = (2 * q + 2) * EPS * mag + np.finfo(np.float32).tiny
        err = np.abs(got[_tile(dst_at, p)] - ref)
        assert (err <= tol).all(), f"worst error {err.max():.3g} vs bound {tol.flat[np.argmax(err)]:.3g}"
        assert_written_only(got, dst, _tile(dst_at, p))
        if kern.kind != "out":
            np.testing.assert_array_equal(src_after, src)
