"""Tester of the FP32 GEMM tiles: every ISA, MR x NR and beta=0 variant goes through GemmTester."""

from __future__ import annotations

import numpy as np

from ..conftest import assert_close_f32
from .common import TileTester


class GemmTester(TileTester):
    """GemmTester(kern, k=37).at(lda=42, c_row=1).test(seed): standard normal operands, the
    tile within (K + 1) roundings of the float64 product (conftest.f32_tolerance), nothing
    written around it."""

    def operands(self, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        return tuple(rng.standard_normal(shape, dtype=np.float32) for shape in self.shapes())

    def test(self, seed: int) -> np.ndarray:
        return self.check(*self.operands(seed))

    def assert_tile(self, got, a_t, b_t, c0) -> None:
        # A beta=0 tile must come out as A @ B whatever C held.
        assert_close_f32(got, a_t, b_t, c0.astype(np.float64) if self.kern.accumulate else None)
