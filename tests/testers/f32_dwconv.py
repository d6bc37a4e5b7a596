"""Tester of the depthwise rows: every kernel (taps, MR, epilogue) and row geometry goes
through DwTester."""

from __future__ import annotations

import numpy as np

from intrinsics.f32_dwconv import ROW_A_AT, ROW_BLOCK, ROW_C_AT, DwRow, compile_row, row_shapes
from microkernels.f32_dwconv import BLOCK

from .common import assert_written_only, execute

EPS = np.finfo(np.float32).eps


class DwTester:
    """DwTester(row).test(seed): one row through its intrinsic where row_function places it,
    against a float64 numpy depthwise convolution with the kernel's epilogue; nothing written
    around the row."""

    def __init__(self, row: DwRow):
        self.row = row

    def test(self, seed: int) -> None:
        t = self.row
        k, ep = t.kern, t.kern.epilogue
        rng = np.random.default_rng(seed)
        a_shape, b_shape, bias_shape, c_shape = row_shapes(t)
        a = rng.standard_normal(a_shape, dtype=np.float32)
        b = rng.standard_normal(b_shape, dtype=np.float32)
        bias = rng.standard_normal(bias_shape, dtype=np.float32)
        c = np.full(c_shape, 7.0, np.float32)
        args = [a, b] + ([bias] if ep.bias else []) + [c]
        got, = execute(compile_row(t), k.isa, args, [len(args) - 1])
        (ay, ax), blk, (cy, cx) = ROW_A_AT, ROW_BLOCK, ROW_C_AT
        ah, aw = t.window
        win = a[ay:ay + ah, ax:ax + aw].astype(np.float64)
        want = np.zeros((t.ow, BLOCK))
        mag = np.zeros_like(want)
        g = k.group
        w = b[blk].reshape(k.kh, k.kw, g, BLOCK)
        lanes = np.arange(BLOCK)
        for r in range(k.kh):
            for s in range(k.kw):
                cols = win[r * t.dh, s * t.dw: s * t.dw + (t.ow - 1) * t.sw + 1: t.sw]
                for j in range(g):  # output lane c reads input lane c // g * g + j
                    term = cols[:, lanes // g * g + j] * w[r, s, j]
                    want += term
                    mag += np.abs(term)
        if ep.bias:
            want += bias[blk]
            mag += np.abs(bias[blk])
        if ep.act == "relu":
            want = np.maximum(want, 0)
        elif ep.act == "clip":
            want = np.clip(want, *t.clip)
        # A chain of one FMA per tap (and group channel), then the bias: that many + 2 roundings
        # at most, each within u of the running magnitude (the activation only clamps).
        tol = (k.weight_vectors + 2) * EPS * mag + np.finfo(np.float32).tiny
        err = np.abs(got[cy, cx:] - want)
        assert (err <= tol).all(), f"{k.name}: worst error {err.max():.3g}"
        assert_written_only(got, c, (cy, slice(cx, None)), "row")
