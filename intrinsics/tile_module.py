"""A module that runs exactly one tile through an intrinsic: for kernel tests and golden dumps.

The workload is the intrinsic's own description placed at an offset inside larger buffers, so
the kernel sees real row strides and misaligned starts, then tensorized with the intrinsic.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir
from tvm.script import tirx as T

from microkernels import GemmKernel

from .f32_gemm import register


@dataclass(frozen=True)
class TileLayout:
    """Buffer shapes around the tile: rows x row stride, and where the tile starts."""

    k: int
    lda: int  # >= k + a_col
    ldb: int  # >= nr + b_col
    ldc: int  # >= nr + c_col
    a_col: int = 0
    b_col: int = 0
    c_col: int = 0
    c_row: int = 0
    # Rows of C below the tile: a kernel that writes past its last row hits these, where a test
    # sees it, instead of the heap, where it aborts the process.
    c_guard: int = 2

    def c_shape(self, mr: int) -> tuple[int, int]:
        return (self.c_row + mr + self.c_guard, self.ldc)

    @staticmethod
    def dense(kern: GemmKernel, k: int) -> "TileLayout":
        return TileLayout(k, k, kern.nr, kern.nr)


def tile_function(kern: GemmKernel, lay: TileLayout):
    mr, nr, kk = kern.mr, kern.nr, lay.k
    ac, bc, cc, cr = lay.a_col, lay.b_col, lay.c_col, lay.c_row
    a_shape, b_shape, c_shape = (mr, lay.lda), (kk, lay.ldb), lay.c_shape(mr)
    if kern.accumulate:

        @T.prim_func(s_tir=True)
        def tile(A: T.Buffer(a_shape, "float32"), B: T.Buffer(b_shape, "float32"), C: T.Buffer(c_shape, "float32")):
            T.func_attr({"tirx.noalias": True})
            for i, j, k in T.grid(mr, nr, kk):
                with T.sblock("tile"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi + cr, vj + cc] = C[vi + cr, vj + cc] + A[vi, vk + ac] * B[vk, vj + bc]

    else:

        @T.prim_func(s_tir=True)
        def tile(A: T.Buffer(a_shape, "float32"), B: T.Buffer(b_shape, "float32"), C: T.Buffer(c_shape, "float32")):
            T.func_attr({"tirx.noalias": True})
            for i, j, k in T.grid(mr, nr, kk):
                with T.sblock("tile"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    with T.init():
                        C[vi + cr, vj + cc] = T.float32(0)
                    C[vi + cr, vj + cc] = C[vi + cr, vj + cc] + A[vi, vk + ac] * B[vk, vj + bc]

    sch = s_tir.Schedule(tile)
    sch.tensorize(sch.get_loops(sch.get_sblock("tile"))[0], register(kern, kk))
    return sch.mod


def compile_tile(kern: GemmKernel, lay: TileLayout):
    return tvm.compile(tile_function(kern, lay), target=kern.isa.target)


def tile_asm(kern: GemmKernel, k: int = 64) -> str:
    return compile_tile(kern, TileLayout.dense(kern, k)).mod.inspect_source("asm")
