"""Tester of the integer NEON tiles (s16 mac, s8 dot), run under qemu: every variant goes
through MacTester, and must match int64 numpy exactly."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from .common import TileTester

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


@st.composite
def bounds(draw, kern, k):
    """(max |a|, max |b|, max |c0|) with K * |a| * |b| + |c0| inside int32: one operand may use its
    whole range (int16 A of 32767 against small B, or the reverse), so sign and high bits of both
    operands are exercised without overflowing the accumulator."""
    c0 = draw(st.sampled_from([0, 1000, 2**20]))
    if kern.op == "dot":
        return 128, 128, c0
    big = draw(st.sampled_from([255, 4095, 32767]))
    small = min(32767, (INT32_MAX - c0) // (k * big))
    return (big, small, c0) if draw(st.booleans()) else (small, big, c0)


class MacTester(TileTester):
    """MacTester(kern, k=32).at(a_row=1, b_col=2).test(seed, bounds): C0 + A @ B bit for bit."""

    def operands(self, seed: int, bound: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        ma, mb, mc = bound
        dt = np.dtype(self.kern.dtype)
        a_shape, b_shape, c_shape = self.shapes()
        lo = lambda m: max(-m, np.iinfo(dt).min)  # noqa: E731 (int8: -128 is legal, +128 is not)
        hi = lambda m: min(m, np.iinfo(dt).max)  # noqa: E731
        a = rng.integers(lo(ma), hi(ma), a_shape, dtype=dt, endpoint=True)
        b = rng.integers(lo(mb), hi(mb), b_shape, dtype=dt, endpoint=True)
        c = rng.integers(-mc, mc, c_shape, dtype=np.int32, endpoint=True)
        return a, b, c

    def test(self, seed: int, bound: tuple[int, int, int]) -> np.ndarray:
        return self.check(*self.operands(seed, bound))

    def assert_tile(self, got, a_t, b_t, c0) -> None:
        want = c0.astype(np.int64) + a_t.astype(np.int64) @ b_t.astype(np.int64)
        # Integer sums have no rounding: exact, once the data cannot overflow the accumulator.
        assert INT32_MIN <= want.min() and want.max() <= INT32_MAX, "test data would overflow int32"
        bad = got != want
        assert not bad.any(), (f"{bad.sum()} of {got.size} elements differ, first at "
                               f"{np.argwhere(bad)[0].tolist()}: got {got[bad][0]}, expected {want[bad][0]}")
