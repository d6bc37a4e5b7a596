"""TensorIntrins for the FP32 GEMM tile: the TIR of the tile beside the call to its kernel.

Description (accumulate): C[i, j] = C[i, j] + A[i, kk] * B[kk, j] for i < MR, j < NR, kk < K,
float32, every operand with a free row stride and unit column stride.
A and C are declared 4-byte aligned (TVM's default is 64): schedules.matmul reads the caller's
A and writes the caller's C in place, wherever numpy put them; the kernel's loads and stores
assume no more.
The beta=0 variant describes the same reduction with an init block (C[i, j] = 0 first).
"""

from __future__ import annotations

import functools

import tvm
from tvm.script import tirx as T

from microkernels import AVX2, AVX512, GemmKernel, Isa, TileError
from microkernels.isa import MAX_ELEMENTS, positive_int

from . import registry


def intrin_name(kern: GemmKernel, k: int) -> str:
    return f"{kern.name}_k{k}"


# Parsed once per tile, K bound per call (_with_k): `@T.prim_func` walks the call stack and
# parses the function's source each time (about 180 ms for the pair), and a model asks for a
# tile at every K its layers have (ConvNeXt-Tiny: 8). K appears in the text only by itself
# (shapes, regions, the grid, the kernel's argument), so the specialized function is,
# structurally, the one written with K in the text (tests/intrinsics/test_f32_gemm.py).
@functools.lru_cache(maxsize=None)
def _descriptions(mr: int, nr: int, accumulate: bool):
    """The description with K as its last parameter, `kk` (specialized by `register`)."""
    if accumulate:

        @T.prim_func(s_tir=True)
        def desc(a: T.handle, b: T.handle, c: T.handle, kk: T.int32):
            A = T.match_buffer(a, (mr, kk), "float32", offset_factor=1, strides=[T.int32(), 1], align=4)
            B = T.match_buffer(b, (kk, nr), "float32", offset_factor=1, strides=[T.int32(), 1])
            C = T.match_buffer(c, (mr, nr), "float32", offset_factor=1, strides=[T.int32(), 1], align=4)
            with T.sblock("root"):
                T.reads(C[0:mr, 0:nr], A[0:mr, 0:kk], B[0:kk, 0:nr])
                T.writes(C[0:mr, 0:nr])
                for i, j, k in T.grid(mr, nr, kk):
                    with T.sblock("update"):
                        vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                        C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]

    else:

        @T.prim_func(s_tir=True)
        def desc(a: T.handle, b: T.handle, c: T.handle, kk: T.int32):
            A = T.match_buffer(a, (mr, kk), "float32", offset_factor=1, strides=[T.int32(), 1], align=4)
            B = T.match_buffer(b, (kk, nr), "float32", offset_factor=1, strides=[T.int32(), 1])
            C = T.match_buffer(c, (mr, nr), "float32", offset_factor=1, strides=[T.int32(), 1], align=4)
            with T.sblock("root"):
                T.reads(A[0:mr, 0:kk], B[0:kk, 0:nr])
                T.writes(C[0:mr, 0:nr])
                for i, j, k in T.grid(mr, nr, kk):
                    with T.sblock("update"):
                        vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                        # Spelled out: the reduction block of a TE sum lists C among its reads.
                        T.reads(C[vi, vj], A[vi, vk], B[vk, vj])
                        T.writes(C[vi, vj])
                        with T.init():
                            C[vi, vj] = T.float32(0)
                        C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]

    return desc


@functools.lru_cache(maxsize=None)
def _implementation(kern: GemmKernel):
    """The implementation with K as its last parameter, `kk` (specialized by `register`)."""
    mr, nr, sym, ir = kern.mr, kern.nr, kern.name, kern.llvm_ir()
    # A beta=0 tile reads no C; the reads must match the description's for tensorize.
    reads_c = kern.accumulate

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle, kk: T.int32):
        sa = T.int32()
        sb = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (mr, kk), "float32", offset_factor=1, strides=[sa, 1], align=4)
        B = T.match_buffer(b, (kk, nr), "float32", offset_factor=1, strides=[sb, 1])
        C = T.match_buffer(c, (mr, nr), "float32", offset_factor=1, strides=[sc, 1], align=4)
        with T.sblock("root"):
            if reads_c:
                T.reads(C[0:mr, 0:nr], A[0:mr, 0:kk], B[0:kk, 0:nr])
            else:
                T.reads(A[0:mr, 0:kk], B[0:kk, 0:nr])
            T.writes(C[0:mr, 0:nr])
            # The attribute carries the kernel's IR into whatever module uses the intrinsic,
            # where LLVM links and inlines it: no annotation needed at the call site.
            with T.attr(0, "pragma_import_llvm", ir):
                T.evaluate(
                    T.call_extern(
                        "void", sym, A.access_ptr("r"), sa, B.access_ptr("r"), sb, C.access_ptr("w"), sc, kk
                    )
                )

    return impl


def check_kernel(kern: GemmKernel) -> None:
    """Raise TileError where no intrinsic of `kern` can be tensorized, whatever K (the kernel's
    own construction has checked that its ISA holds the tile)."""
    if kern.mr < 2:
        raise TileError(f"MR must be >= 2 for an intrinsic, got {kern.mr} (TIR drops unit-extent "
                        "loops, so an MR = 1 block can never match the description)")


@functools.lru_cache(maxsize=None)
def register(kern: GemmKernel, k: int) -> str:
    """Register (once) the intrinsic of `kern` with reduction length `k`; return its name."""
    k = positive_int("K", k, TileError, minimum=2)  # TIR drops unit loops: a K = 1 block never matches
    if k * max(kern.mr, kern.nr) > MAX_ELEMENTS:
        raise TileError(f"K={k} makes a {kern.mr}x{k} or {k}x{kern.nr} operand too large for TIR's int32 "
                        f"index arithmetic (at most {MAX_ELEMENTS} elements)")
    check_kernel(kern)
    return registry.register(intrin_name(kern, k), _with_k(_descriptions(kern.mr, kern.nr, kern.accumulate), k),
                             _with_k(_implementation(kern), k))



def _with_k(func, k: int):
    return func.specialize({func.params[-1]: tvm.tirx.IntImm("int32", k)})


def _fma_gemm(isa: Isa, mr: int, nr: int, k: int, accumulate: bool) -> str:
    return register(GemmKernel(isa, mr, nr, accumulate), k)


def avx512_fma_gemm(mr: int, nr: int, k: int, accumulate: bool = True) -> str:
    """TensorIntrin name for C[mr, nr] (+)= A[mr, k] @ B[k, nr] on AVX-512 zmm FMAs."""
    return _fma_gemm(AVX512, mr, nr, k, accumulate)


def avx2_fma_gemm(mr: int, nr: int, k: int, accumulate: bool = True) -> str:
    """TensorIntrin name for C[mr, nr] (+)= A[mr, k] @ B[k, nr] on AVX2 ymm FMAs."""
    return _fma_gemm(AVX2, mr, nr, k, accumulate)
