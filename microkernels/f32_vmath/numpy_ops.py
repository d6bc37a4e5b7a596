"""`NumpyOps`: the vector math on float32 numpy arrays, for developing and explaining it."""

from __future__ import annotations

import numpy as np

from .core import Ops


class NumpyOps(Ops):
    """float32 numpy arrays, each operation rounded as the vector instruction rounds it (the
    FMA through float64, whose product is exact: double rounding of the sum is possible but
    rare enough for development; the tests measure the compiled code)."""

    def c(self, v):
        return np.float32(v)

    def add(self, a, b):
        return np.add(a, b, dtype=np.float32)

    def sub(self, a, b):
        return np.subtract(a, b, dtype=np.float32)

    def mul(self, a, b):
        return np.multiply(a, b, dtype=np.float32)

    def div(self, a, b):
        with np.errstate(all="ignore"):
            return np.divide(a, b, dtype=np.float32)

    def fma(self, a, b, c):
        with np.errstate(all="ignore"):
            return (np.float64(a) * np.float64(b) + np.float64(c)).astype(np.float32)

    def neg(self, a):
        return np.negative(a)

    def abs(self, a):
        return np.abs(a)

    def lt(self, a, b):
        return np.less(a, b)

    def gt(self, a, b):
        return np.greater(a, b)

    def ugt(self, a, b):
        return ~np.less_equal(a, b)

    def isnan(self, a):
        return np.isnan(a)

    def select(self, m, a, b):
        return np.where(m, a, b).astype(np.float32)

    def round(self, a):
        return np.rint(a).astype(np.float32)

    def pow2(self, n):
        return ((n.astype(np.int32) + 127) << 23).view(np.float32)

    def half_int(self, n):
        return (n.astype(np.int32) >> 1).astype(np.float32)

    def binade(self, a, first, top):
        k = (np.asarray(a, np.float32).view(np.int32) >> 23) - (np.float32(first).view(np.int32) >> 23)
        return np.minimum(k, top)

    def copysign(self, a, b):
        return np.copysign(a, b).astype(np.float32)

    def lookup(self, k, values):
        return np.asarray(values, np.float32)[k & 3]  # as vpermilps: the index's low two bits
