"""Quantized matmul on x86: C[M, N] = sum_k (A[m, k] - a_zero_point) * B[k, n] in int32, A uint8 or
int8 (row-major), B int8 (row-major, zero point 0: symmetric weights), on the x86 integer tiles.

VNNI (vpdpbusd) multiplies uint8 by int8 as they are: int8 A is shifted to uint8 (+128, and its
zero point with it) as it is packed, and the zero point comes out through a per-column term,
-zp * sum_k B[k, n], packed with B. The int16 upcast (vpmaddwd) packs A - zp as int16 and B as
int16 pairs. A is packed into zero-padded rows of whole K groups, B once (`op.pack_b`, or per
call) into NR-wide panels in the tile's group order; the MR x NR tiles run on all threads.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import s_tir, te

from intrinsics.int_gemm import register_int_gemm
from microkernels.int_gemm import IntGemmKernel, default_int_kernel, max_tiles
from microkernels.isa import AMX_INT8, AVX512_VNNI

from .common.targets import check_array, check_elements, int_target, set_threads
from .common.tir import ceil_to
from .emulation import bochs

DTYPES = ("uint8", "int8")
# The longest K whose sums stay exact in int32: A - zp and B within 255 and 128 in magnitude, and
# on VNNI two terms (the products and the zero-point term) of at most 255 * 128 * K each.
MAX_K = (2**31 - 1) // (2 * 255 * 128)  # 32896


class Int8MatmulOp:
    """op(a, b) -> int32 C; op.pack_b(b) packs B once and op.run_packed(a, packed) skips that.
    op.kernel is the tile, op.why says why that one."""

    def __init__(self, M, N, K, kern: IntGemmKernel, lib, dtype: str, zp: int, threads, emulate: bool):
        self.M, self.N, self.K, self.kernel, self.lib = M, N, K, kern, lib
        self.dtype, self.zp, self.threads, self.emulate = dtype, zp, threads, emulate
        g = kern.group
        self.kp, self.np_ = padded_k(K, g), ceil_to(N, kern.nr)

    @property
    def raw(self) -> bool:
        return self.kernel.op == "u8s8"

    @property
    def why(self) -> str:
        if self.raw:
            return f"{self.kernel.name}: vpdpbusd ({self.kernel.isa.name}), uint8 x int8 as they are"
        return f"{self.kernel.name}: the int16 upcast, vpmaddwd ({self.kernel.isa.name}: no VNNI asked for or available)"

    @property
    def asm(self) -> str:
        return self.lib.mod.inspect_source("asm")

    def pack_b(self, b: np.ndarray) -> tuple:
        """(packed B (N/NR, K/G, NR, G), per-column int32 term)."""
        check_array("b", b, (self.K, self.N), "int8")
        kern, g = self.kernel, self.kernel.group
        full = np.zeros((self.kp, self.np_), kern.b_dtype)
        full[: self.K, : self.N] = b
        packed = np.ascontiguousarray(full.reshape(self.kp // g, g, self.np_ // kern.nr, kern.nr).transpose(2, 0, 3, 1))
        zp = self.zp + (128 if self.raw and self.dtype == "int8" else 0)
        term = -zp * full.astype(np.int64).sum(axis=0) if self.raw else np.zeros(self.np_, np.int64)
        return packed, term.astype(np.int32)

    def run_packed(self, a: np.ndarray, packed: tuple) -> np.ndarray:
        check_array("a", a, (self.M, self.K), self.dtype)
        if not isinstance(packed, tuple) or len(packed) != 2:
            raise TypeError("packed must be the tuple op.pack_b returns")
        args = [a, *packed, np.zeros((self.M, self.N), np.int32)]
        if self.emulate:
            return bochs.run(self.lib, [np.ascontiguousarray(x) for x in args], [3])[0]
        set_threads(self.threads)
        tensors = [tvm.runtime.tensor(x) for x in args]
        self.lib(*tensors)
        return tensors[3].numpy()

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.run_packed(a, self.pack_b(b))


def padded_k(K: int, group: int) -> int:
    """K in whole groups, and at least two: the intrinsic cannot match a single group (TIR drops
    the unit loop), so K = 1..4 is padded with zeros to 8 on VNNI."""
    return max(ceil_to(K, group), 2 * group)


def _module(M, N, K, kern: IntGemmKernel, dtype: str, zp: int):
    g, mr, nr = kern.group, kern.mr, kern.nr
    kp, mp, np_ = padded_k(K, g), ceil_to(M, mr), ceil_to(N, nr)
    A = te.placeholder((M, K), dtype, name="A")
    B = te.placeholder((np_ // nr, kp // g, nr, g), kern.b_dtype, name="Bp")
    term = te.placeholder((np_,), "int32", name="Term")
    raw = kern.op == "u8s8"
    shift = 128 if raw and dtype == "int8" else 0

    def a_elem(m, k):
        inside = tvm.tirx.all(m < M, k < K)
        x = A[tvm.tirx.min(m, M - 1), tvm.tirx.min(k, K - 1)]
        if raw:  # uint8 as the tile takes it; padded K columns 0, so they add nothing
            v = (x.astype("int16") + shift).astype(kern.a_dtype) if shift else x
            return tvm.tirx.if_then_else(inside, v, tvm.tirx.const(0, kern.a_dtype))
        return tvm.tirx.if_then_else(inside, x.astype("int16") - tvm.tirx.const(zp, "int16"), tvm.tirx.const(0, "int16"))

    Ap = te.compute((mp, kp), a_elem, name="Apack")
    q = te.reduce_axis((0, kp // g), name="q")
    t = te.reduce_axis((0, g), name="t")
    C = te.compute((mp, np_), lambda m, n: te.sum(
        Ap[m, q * g + t].astype("int32") * B[n // nr, q, n % nr, t].astype("int32"), axis=[q, t]), name="C")
    out = te.compute((M, N), lambda m, n: C[m, n] + term[n], name="Out")
    sch = s_tir.Schedule(te.create_prim_func([A, B, term, out]))
    blk = sch.get_sblock("C")
    m, n, qq, tt = sch.get_loops(blk)
    mo, mi = sch.split(m, [None, mr])
    no, ni = sch.split(n, [None, nr])
    sch.reorder(mo, no, mi, ni, qq, tt)
    sch.parallel(sch.fuse(mo, no))  # before the init is split off: parallel() takes a whole reduction
    sch.decompose_reduction(blk, mi)
    sch.tensorize(mi, register_int_gemm(kern, kp))
    for name in ("Apack", "Out"):
        loops = sch.get_loops(sch.get_sblock(name))
        sch.parallel(loops[0])
    return sch.mod


def matmul_int8(M, N, K, dtype: str, isa, threads=None, a_zero_point: int = 0, emulate: bool = False) -> Int8MatmulOp:
    """The quantized matmul (module doc) on the x86 integer ISA `isa` (vpdpbusd on the VNNI ISAs,
    vpmaddwd on AVX-512 / AVX2)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: the quantized matmul takes {DTYPES} A (B is int8)")
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    if isinstance(a_zero_point, (bool, np.bool_)) or not isinstance(a_zero_point, (int, np.integer)):
        raise TypeError(f"a_zero_point must be an int, got {type(a_zero_point).__name__}")
    if not lo <= a_zero_point <= hi:
        raise ValueError(f"a_zero_point={a_zero_point} is out of range for {dtype}: must lie in [{lo}, {hi}]")
    if K > MAX_K:
        raise ValueError(f"K={K} exceeds {MAX_K}, the longest reduction of 8-bit products int32 holds exactly")
    if emulate and isa.name == "avxvnni":
        raise ValueError("emulate=True: the Bochs CPU has no AVX-VNNI; use target 'x86-avx512vnni'")
    if isa.name == AMX_INT8.name:
        isa = AVX512_VNNI  # no AMX matmul yet: the AMX host's VNNI tile (the conv2d has the AMX tiles)
    # Narrow products get a narrower tile: NR no wider than N needs, MR as the budget then allows.
    nr = min(default_int_kernel(isa.name).nr, ceil_to(N, isa.lanes))
    mr = min(16, max(m for m, n in max_tiles(isa, nr) if n == nr))
    kern = IntGemmKernel(isa, mr, nr)
    check_elements(A_packed=(ceil_to(M, mr), padded_k(K, kern.group)), C=(ceil_to(M, mr), ceil_to(N, nr)))
    lib = tvm.compile(_module(M, N, K, kern, dtype, int(a_zero_point)), target=int_target(isa))
    return Int8MatmulOp(M, N, K, kern, lib, dtype, int(a_zero_point), threads, emulate)
