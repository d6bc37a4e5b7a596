"""Tester of the x86 integer GEMM tiles (microkernels.int_gemm): every ISA, tile and variant goes
through IntGemmTester (the tile through its intrinsic) or KernelCallTester (one direct call, for
the batch-reduce and requantizing variants), natively or on the Bochs CPU, and must match an
int64 numpy reference exactly; requantized outputs must equal ONNX's rounding rule bit for bit."""

from __future__ import annotations

import numpy as np
import tvm

from intrinsics.tile_module import int_kernel_function
from microkernels.int_gemm import PAIR_BOUND, IntGemmKernel, out_range

from ..x86_exec import compile_target, execute
from .common import TileTester, assert_written_only

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
# What the schedules feed each operand: 8-bit data as is for vpdpbusd, and for vpmaddwd 8-bit
# values less a zero point, so within +-255.
RANGES = {"uint8": (0, 255), "int8": (-128, 127), "int16": (-255, 255)}


def draw(rng, dtype: str, shape, pairs: bool = False) -> np.ndarray:
    """Random operand values over the whole range the schedules feed; with `pairs` (B of the
    vpmaddubsw tile), int8 values whose adjacent pairs (the flat array's (2i, 2i + 1)) have
    |a| + |b| <= PAIR_BOUND, the weights the schedules give that tile, bound included."""
    lo, hi = RANGES[dtype]
    if not pairs:
        return rng.integers(lo, hi, shape, endpoint=True).astype(dtype)
    n = int(np.prod(shape))
    half = -(-n // 2)  # an odd flat buffer's last value pairs with nothing the kernel reads
    first = rng.integers(-128, 127, half, endpoint=True)
    room = PAIR_BOUND - np.abs(first)
    second = rng.integers(-room, np.minimum(room, 127), endpoint=True)
    at_bound = rng.random(half) < 0.25  # a quarter exactly on the bound: |a| + |b| = 128
    second = np.where(at_bound & (room <= 127), np.where(rng.random(half) < 0.5, -room, room), second)
    return np.stack([first, second], axis=1).reshape(-1)[:n].reshape(shape).astype(dtype)


def b_pairs(kern) -> bool:
    return bool(getattr(kern, "pairs", False))


def assert_exact(got: np.ndarray, want: np.ndarray) -> None:
    bad = got != want
    assert not bad.any(), (f"{bad.sum()} of {got.size} elements differ, first at "
                           f"{np.argwhere(bad)[0].tolist()}: got {got[bad][0]}, expected {want[bad][0]}")


def requantize(acc: np.ndarray, bias: np.ndarray, scale: np.ndarray, zp: int, lo: int, hi: int, dtype: str) -> np.ndarray:
    """The reference of the requantizing store, written plainly: float32(acc + bias) * scale in
    float32, round half to even (ONNX QuantizeLinear), + zp, saturate to [lo, hi]."""
    v = (acc.astype(np.int64) + bias).astype(np.int32).astype(np.float32) * scale.astype(np.float32)
    if dtype == "float32":
        return v
    return np.clip(np.rint(v).astype(np.int64) + zp, lo, hi).astype(dtype)


class IntGemmTester(TileTester):
    """IntGemmTester(kern, k=64).at(a_col=3).test(seed): C0 + A @ B bit for bit, nothing written
    around the tile."""

    def operands(self, seed: int, c_bound: int = 1000):
        rng = np.random.default_rng(seed)
        a_shape, b_shape, c_shape = self.shapes()
        return (draw(rng, self.kern.a_dtype, a_shape), draw(rng, self.kern.b_dtype, b_shape, b_pairs(self.kern)),
                rng.integers(-c_bound, c_bound, c_shape, endpoint=True).astype(np.int32))

    def test(self, seed: int) -> np.ndarray:
        return self.check(*self.operands(seed))

    def assert_tile(self, got, a_t, b_t, c0) -> None:
        want = c0.astype(np.int64) + a_t.astype(np.int64) @ b_t.astype(np.int64)
        assert INT32_MIN <= want.min() and want.max() <= INT32_MAX, "test data would overflow int32"
        assert_exact(got, want)


class KernelCallTester:
    """One call of any variant on flat buffers: the tile at offsets, free strides, a batch of
    A blocks and B panels, and the requantizing store.

    KernelCallTester(kern, k=32, batch=(2, 3, 1)).test(seed) draws the batch's A strides so
    the blocks overlap (as a convolution's windows do) and runs the kernel once."""

    def __init__(self, kern: IntGemmKernel, k: int, batch: tuple[int, int, int] = (1, 1, 1),
                 pad: int = 3, c0: np.ndarray | None = None):
        self.kern, self.k, self.n, self.pad = kern, k, batch, pad
        g = kern.group
        self.lda = k + pad
        self.ldb = g * (kern.nr + pad)
        self.ldc = kern.nr + pad
        # Batch strides of A: a row apart, then a whole block, then a column (overlapping windows).
        self.sa = (self.lda, self.lda * kern.mr, 1)
        self.panel = k // g * self.ldb
        self.offsets = (pad, g * pad, pad)
        n1, n2, n3 = batch
        a_size = self.offsets[0] + (n1 - 1) * self.sa[0] + (n2 - 1) * self.sa[1] + (n3 - 1) * self.sa[2] + kern.mr * self.lda
        self.sizes = (a_size + pad, self.offsets[1] + n1 * n2 * n3 * self.panel + pad, self.offsets[2] + (kern.mr + 1) * self.ldc)

    def batch_args(self):
        if not self.kern.batch_reduce:
            return None
        (n1, n2, n3), (s1, s2, s3) = self.n, self.sa
        return (n1, s1, n2, s2, n3, s3)

    def compile(self, requant=None):
        mod = int_kernel_function(self.kern, self.sizes, self.offsets, (self.lda, self.ldb, self.ldc), self.k,
                                  self.batch_args(), requant)
        return tvm.compile(mod, target=compile_target(self.kern.isa))

    def reference(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """int64 sum over the batch of A block @ B panel."""
        kern, k, g = self.kern, self.k, self.kern.group
        acc = np.zeros((kern.mr, kern.nr), np.int64)
        n1, n2, n3 = self.n
        p = 0
        for i1 in range(n1):
            for i2 in range(n2):
                for i3 in range(n3):
                    at = self.offsets[0] + i1 * self.sa[0] + i2 * self.sa[1] + i3 * self.sa[2]
                    a_t = np.stack([a[at + i * self.lda: at + i * self.lda + k] for i in range(kern.mr)])
                    bt = self.offsets[1] + p * self.panel
                    panel = b[bt: bt + k // g * self.ldb].reshape(k // g, self.ldb // g, g)[:, :kern.nr, :]
                    b_t = panel.transpose(0, 2, 1).reshape(k, kern.nr)
                    acc += a_t.astype(np.int64) @ b_t.astype(np.int64)
                    p += 1
        return acc

    def c_region(self):
        return np.s_[self.offsets[2]: self.offsets[2] + self.kern.mr * self.ldc]

    def test(self, seed: int, requant=None, a=None, b=None, c_bound: int = 1000, bias=None, scale=None):
        """Run once; return (C tile as (MR, NR), the int64 accumulators). With `requant`
        ((zp, lo, hi), or "draw" to draw them), also random bias and scales, and the tile is
        checked against `requantize`."""
        kern = self.kern
        rng = np.random.default_rng(seed)
        a = draw(rng, kern.a_dtype, self.sizes[0]) if a is None else a
        b = draw(rng, kern.b_dtype, self.sizes[1], b_pairs(kern)) if b is None else b
        c_dt = kern.c_dtype
        c = (rng.integers(-c_bound, c_bound, self.sizes[2], endpoint=True).astype(np.int32) if c_dt == "int32"
             else rng.integers(0, 100, self.sizes[2]).astype(c_dt))
        acc = self.reference(a, b)
        args = [a, b, c]
        if kern.requant:
            if requant == "draw" or requant is None:
                lo, hi = out_range(c_dt) if c_dt != "float32" else (0, 0)
                zp = int(rng.integers(lo, hi + 1)) if c_dt != "float32" else 0
                requant = (zp, lo, hi)
            if bias is None:
                bias = rng.integers(-2**16, 2**16, kern.nr).astype(np.int32)
            if scale is None:
                # Scales as a real layer's (input scale * weight scale / output scale), spread
                # over four decades so some outputs saturate and some land on halves.
                scale = (10.0 ** rng.uniform(-5, -1, kern.nr)).astype(np.float32)
            args += [bias, scale]
        lib = self.compile(requant if kern.requant else None)
        got, = execute(lib, kern.isa, args, [2])
        region = self.c_region()
        assert_written_only(got, c, region, "tile's rows")
        rows = got[region].reshape(kern.mr, self.ldc)
        assert (rows[:, kern.nr:] == c[region].reshape(kern.mr, self.ldc)[:, kern.nr:]).all(), \
            "the kernel wrote past NR in a row"
        tile = rows[:, :kern.nr]
        if kern.requant:
            assert_exact(tile, requantize(acc, bias, scale, *requant, c_dt))
        else:
            c0 = c[region].reshape(kern.mr, self.ldc)[:, :kern.nr].astype(np.int64) if kern.accumulate else 0
            want = c0 + acc
            assert INT32_MIN <= want.min() and want.max() <= INT32_MAX, "test data would overflow int32"
            assert_exact(tile, want)
        return tile, acc
