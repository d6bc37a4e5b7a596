"""TensorIntrins for the x86 integer GEMM tiles (microkernels.int_gemm), int32 accumulators.

With G the kernel's group (4 for vpdpbusd, 2 for vpmaddwd), B packed as (K/G, NR, G):
    C[i, j] = C[i, j] + int32(A[i, G*g + t]) * int32(B[g, j, t])     i < MR, j < NR, g < K/G, t < G
A uint8 and B int8 on the VNNI ISAs, both int16 on the others. Leading strides are free, so the
intrinsic serves a packed GEMM panel and the pixel rows of a packed convolution alike. The
implementation is the accumulating kernel; a schedule zeroes C in an init block ahead of it
(decompose_reduction), as for the NEON integer tiles.
"""

from __future__ import annotations

import functools

from tvm.script import tirx as T

from microkernels import TileError
from microkernels.int_gemm import IntGemmKernel
from microkernels.isa import positive_int

from . import registry


def intrin_name(kern: IntGemmKernel, k: int) -> str:
    return f"{kern.name}_k{k}"


def grouped_pair(mr: int, nr: int, g: int, at: str, bt: str, sym: str, ir: str, kk: int):
    """(desc, impl) of C[MR, NR] += A[MR, kk] @ B packed in groups of g k, calling `sym`
    (signature a, lda, b, ldb, c, ldc, k) from `ir`: every grouped integer tile's intrinsic, these
    and the AArch64 sdot one (intrinsics.int_mac)."""
    kg = kk // g

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle):
        A = T.match_buffer(a, (mr, kk), at, offset_factor=1, strides=[T.int32(), 1])
        B = T.match_buffer(b, (kg, nr, g), bt, offset_factor=1, strides=[T.int32(), g, 1])
        C = T.match_buffer(c, (mr, nr), "int32", offset_factor=1, strides=[T.int32(), 1])
        with T.sblock("root"):
            T.reads(C[0:mr, 0:nr], A[0:mr, 0:kk], B[0:kg, 0:nr, 0:g])
            T.writes(C[0:mr, 0:nr])
            for i, j, q, t in T.grid(mr, nr, kg, g):
                with T.sblock("update"):
                    vi, vj, vq, vt = T.axis.remap("SSRR", [i, j, q, t])
                    C[vi, vj] = C[vi, vj] + T.Cast("int32", A[vi, vq * g + vt]) * T.Cast("int32", B[vq, vj, vt])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle):
        sa = T.int32()
        sb = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (mr, kk), at, offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (kg, nr, g), bt, offset_factor=1, strides=[sb, g, 1])
        C = T.match_buffer(c, (mr, nr), "int32", offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            T.reads(C[0:mr, 0:nr], A[0:mr, 0:kk], B[0:kg, 0:nr, 0:g])
            T.writes(C[0:mr, 0:nr])
            # The attribute carries the kernel's IR into the module, where LLVM inlines it.
            with T.attr(0, "pragma_import_llvm", ir):
                T.evaluate(T.call_extern("void", sym, A.access_ptr("r"), sa, B.access_ptr("r"), sb,
                                         C.access_ptr("w"), sc, kk))

    return desc, impl


@functools.lru_cache(maxsize=None)
def register_int_gemm(kern: IntGemmKernel, k: int) -> str:
    """Register (once) the intrinsic of the accumulating tile `kern` with reduction length `k`;
    return its name."""
    try:
        k_int = positive_int("K", k, TileError, minimum=kern.group)
    except TileError:
        k_int = None
    if k_int is None or k_int % kern.group:
        raise TileError(f"K must be a positive multiple of {kern.group} for {kern.name} (B is packed in groups "
                        f"of {kern.group} k), got {k!r}; pad K with zeros")
    if k_int == kern.group:
        raise TileError(f"K={k_int} is one group of {kern.group} for {kern.name}: TIR drops the unit-extent group "
                        f"loop, so the description could never match; use K >= {2 * kern.group} (pad with zeros)")
    if kern.mr < 2:
        raise TileError(f"MR must be >= 2 for an intrinsic, got {kern.mr} (TIR drops unit-extent "
                        "loops, so an MR = 1 block can never match the description)")
    if not kern.accumulate or kern.batch_reduce:
        raise TileError(f"{kern.name}: the GEMM intrinsic is the plain accumulating tile (C += A @ B); "
                        "zero C in an init block ahead of it")
    pair = grouped_pair(kern.mr, kern.nr, kern.group, kern.a_dtype, kern.b_dtype, kern.name, kern.llvm_ir(), k_int)
    return registry.register(intrin_name(kern, k_int), *pair)
