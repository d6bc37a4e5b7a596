"""TensorIntrins for the NEON integer tiles: the TIR of the tile beside the call to its kernel.

s16 mac (ARMv7 vmlal.s16, AArch64 smlal/smlal2), int16 in, int32 accumulated:
    C[i, j] = C[i, j] + int32(A[i, k]) * int32(B[k, j])          i < MR, j < NR, k < K
s8 dot (AArch64 sdot), int8 in, B packed in groups of four k (see microkernels.int_mac):
    C[i, j] = C[i, j] + int32(A[i, 4g + t]) * int32(B[g, j, t])  g < K/4, t < 4
Every operand has a free leading stride and unit inner strides, so the same intrinsic serves a
packed GEMM panel and the rows of a spatially packed convolution.
"""

from __future__ import annotations

import functools

from tvm.script import tirx as T

from microkernels import AARCH64, AARCH64_DOT, NEON, TileError
from microkernels.int_mac import MacKernel
from microkernels.isa import positive_int

from . import registry
from .int_gemm import grouped_pair


def intrin_name(kern: MacKernel, k: int) -> str:
    return f"{kern.name}_k{k}"


def _mac_pair(kern: MacKernel, kk: int):
    mr, nr, dt, sym, ir = kern.mr, kern.nr, kern.dtype, kern.name, kern.llvm_ir()

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle):
        A = T.match_buffer(a, (mr, kk), dt, offset_factor=1, strides=[T.int32(), 1])
        B = T.match_buffer(b, (kk, nr), dt, offset_factor=1, strides=[T.int32(), 1])
        C = T.match_buffer(c, (mr, nr), "int32", offset_factor=1, strides=[T.int32(), 1])
        with T.sblock("root"):
            T.reads(C[0:mr, 0:nr], A[0:mr, 0:kk], B[0:kk, 0:nr])
            T.writes(C[0:mr, 0:nr])
            for i, j, k in T.grid(mr, nr, kk):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + T.Cast("int32", A[vi, vk]) * T.Cast("int32", B[vk, vj])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle):
        sa = T.int32()
        sb = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (mr, kk), dt, offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (kk, nr), dt, offset_factor=1, strides=[sb, 1])
        C = T.match_buffer(c, (mr, nr), "int32", offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            T.reads(C[0:mr, 0:nr], A[0:mr, 0:kk], B[0:kk, 0:nr])
            T.writes(C[0:mr, 0:nr])
            # The attribute carries the kernel's IR into the module, where LLVM inlines it.
            with T.attr(0, "pragma_import_llvm", ir):
                T.evaluate(T.call_extern("void", sym, A.access_ptr("r"), sa, B.access_ptr("r"), sb,
                                         C.access_ptr("w"), sc, kk))

    return desc, impl


def _dot_pair(kern: MacKernel, kk: int):
    return grouped_pair(kern.mr, kern.nr, kern.group, kern.a_dtype, kern.b_dtype, kern.name, kern.llvm_ir(), kk)


@functools.lru_cache(maxsize=None)
def register_mac(kern: MacKernel, k: int) -> str:
    """Register (once) the intrinsic of `kern` with reduction length `k`; return its name."""
    try:
        k_int = positive_int("K", k, TileError, minimum=kern.k_step)
    except TileError:
        k_int = None
    if k_int is None or k_int % kern.k_step:
        raise TileError(f"K must be a positive multiple of {kern.k_step} for {kern.name} (one K step "
                        f"is {kern.k_step} values of A), got {k!r}; pad K with zeros")
    k = k_int
    if kern.mr < 2:
        raise TileError(f"MR must be >= 2 for an intrinsic, got {kern.mr} (TIR drops unit-extent "
                        "loops, so an MR = 1 block can never match the description)")
    pair = _dot_pair(kern, k) if kern.op == "dot" else _mac_pair(kern, k)
    return registry.register(intrin_name(kern, k), *pair)


def neon_int16_mac(mr: int, nr: int, k: int) -> str:
    """TensorIntrin name for C[mr, nr] += A[mr, k] @ B[k, nr], int16 -> int32, ARMv7 vmlal.s16."""
    return register_mac(MacKernel(NEON, mr, nr), k)


def aarch64_int16_mac(mr: int, nr: int, k: int) -> str:
    """TensorIntrin name for C[mr, nr] += A[mr, k] @ B[k, nr], int16 -> int32, AArch64 smlal/smlal2."""
    return register_mac(MacKernel(AARCH64, mr, nr), k)


def aarch64_int8_dot(mr: int, nr: int, k: int) -> str:
    """TensorIntrin name for the sdot tile, int8 -> int32, B packed as (k/4, nr, 4)."""
    return register_mac(MacKernel(AARCH64_DOT, mr, nr), k)
