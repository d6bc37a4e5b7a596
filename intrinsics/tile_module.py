"""A module that runs exactly one GEMM tile through its intrinsic, FP32 (`GemmKernel`) or integer
(`MacKernel`): for kernel tests, golden dumps and the ARM bench.

The workload is the intrinsic's own description placed at offsets inside larger buffers, so
the kernel sees real row strides and misaligned starts, then tensorized with the intrinsic.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir
from tvm.script import tirx as T

from microkernels import GemmKernel

from .f32_gemm import register
from .int_mac import register_mac


@dataclass(frozen=True)
class TileLayout:
    """Buffer shapes around the tile: row strides, and where the tile starts in each operand.

    A is (a_row + MR, lda), the tile at (a_row, a_col). B is (b_row + K, ldb), the tile at
    (b_row, b_col); for an sdot kernel, whose B is packed in groups of four k, it is
    (b_row + K/4, ldb/4, 4), the tile at group b_row, column b_col (ldb, the group stride, a
    multiple of 4). C is (c_row + MR + c_guard, ldc), the tile at (c_row, c_col).
    """

    k: int
    lda: int  # >= a_col + K
    ldb: int  # >= b_col + NR (sdot: 4 * (b_col + NR))
    ldc: int  # >= c_col + NR
    a_row: int = 0
    a_col: int = 0
    b_row: int = 0
    b_col: int = 0
    c_row: int = 0
    c_col: int = 0
    # Rows of C below the tile: a kernel that writes past its last row hits these, where a test
    # sees it, instead of the heap, where it aborts the process.
    c_guard: int = 2

    def shapes(self, kern) -> tuple[tuple, tuple, tuple]:
        """(A, B, C) buffer shapes for `kern`."""
        if packs_b(kern):
            b = (self.b_row + self.k // 4, self.ldb // 4, 4)
        else:
            b = (self.b_row + self.k, self.ldb)
        return (self.a_row + kern.mr, self.lda), b, (self.c_row + kern.mr + self.c_guard, self.ldc)

    def tile(self, kern) -> tuple[slice, slice]:
        """(rows, columns) of the tile in C."""
        return slice(self.c_row, self.c_row + kern.mr), slice(self.c_col, self.c_col + kern.nr)

    @staticmethod
    def dense(kern, k: int) -> "TileLayout":
        return TileLayout(k, k, kern.nr * (4 if packs_b(kern) else 1), kern.nr)


def packs_b(kern) -> bool:
    """Whether `kern` takes B in groups of four k (sdot) rather than row by row."""
    return getattr(kern, "op", None) == "dot"


def tile_function(kern, lay: TileLayout, zero_c: bool = False) -> tvm.IRModule:
    """C[tile] += A[tile] @ B[tile] tensorized onto `kern`'s intrinsic; C[tile] = A @ B instead
    for a beta=0 kernel, which zeroes C itself, or with `zero_c`, where an init block ahead of
    the call does."""
    f32 = isinstance(kern, GemmKernel)
    mr, nr, kk = kern.mr, kern.nr, lay.k
    ar, ac, br, bc, cr, cc = lay.a_row, lay.a_col, lay.b_row, lay.b_col, lay.c_row, lay.c_col
    a_shape, b_shape, c_shape = lay.shapes(kern)
    dt, acc = ("float32", "float32") if f32 else (kern.dtype, "int32")
    in_kernel = f32 and not kern.accumulate
    init = zero_c or in_kernel
    # The description's product: the integer kernels widen both operands to int32 first.
    widen = (lambda x: x) if f32 else (lambda x: T.Cast("int32", x))  # noqa: E731

    if packs_b(kern):

        @T.prim_func(s_tir=True)
        def tile(A: T.Buffer(a_shape, dt), B: T.Buffer(b_shape, dt), C: T.Buffer(c_shape, acc)):
            T.func_attr({"tirx.noalias": True})
            for i, j, g, t in T.grid(mr, nr, kk // 4, 4):
                with T.sblock("tile"):
                    vi, vj, vg, vt = T.axis.remap("SSRR", [i, j, g, t])
                    if init:
                        with T.init():
                            C[vi + cr, vj + cc] = T.int32(0)
                    C[vi + cr, vj + cc] = C[vi + cr, vj + cc] + widen(A[vi + ar, vg * 4 + vt + ac]) * widen(
                        B[vg + br, vj + bc, vt])

    else:

        @T.prim_func(s_tir=True)
        def tile(A: T.Buffer(a_shape, dt), B: T.Buffer(b_shape, dt), C: T.Buffer(c_shape, acc)):
            T.func_attr({"tirx.noalias": True})
            for i, j, k in T.grid(mr, nr, kk):
                with T.sblock("tile"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    if init:
                        with T.init():
                            C[vi + cr, vj + cc] = T.cast(0, acc)
                    C[vi + cr, vj + cc] = C[vi + cr, vj + cc] + widen(A[vi + ar, vk + ac]) * widen(B[vk + br, vj + bc])

    sch = s_tir.Schedule(tile)
    block = sch.get_sblock("tile")
    outer = sch.get_loops(block)[0]
    if init and not in_kernel:
        sch.decompose_reduction(block, outer)
    sch.tensorize(outer, register(kern, kk) if f32 else register_mac(kern, kk))
    return sch.mod


def compile_tile(kern, lay: TileLayout):
    return tvm.compile(tile_function(kern, lay), target=kern.isa.target)


def tile_asm(kern: GemmKernel, k: int = 64) -> str:
    return compile_tile(kern, TileLayout.dense(kern, k)).mod.inspect_source("asm")


def mac_tile_module(kern, k: int):
    """One tile, C[MR, NR] = A[MR, k] @ B, dense and tensorized with the kernel's intrinsic: the
    smallest module whose assembly is the kernel in context (golden dumps, the ARM bench)."""
    mod = tile_function(kern, TileLayout.dense(kern, k), zero_c=True)
    # The symbol the golden dumps name.
    return tvm.IRModule({"main": mod["main"].with_attr("global_symbol", "main")})
