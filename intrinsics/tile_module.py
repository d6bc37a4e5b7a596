"""A module that runs exactly one GEMM tile through its intrinsic, FP32 (`GemmKernel`) or integer
(`MacKernel` on ARM, `IntGemmKernel` on x86): for kernel tests, golden dumps and the benches.

The workload is the intrinsic's own description placed at offsets inside larger buffers, so
the kernel sees real row strides and misaligned starts, then tensorized with the intrinsic.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir
from tvm.script import tirx as T

from microkernels import GemmKernel
from microkernels.int_amx import AmxGemmKernel
from microkernels.int_gemm import IntGemmKernel

from .f32_gemm import register
from .int_gemm import register_int_gemm
from .int_mac import register_mac


@dataclass(frozen=True)
class TileLayout:
    """Buffer shapes around the tile: row strides, and where the tile starts in each operand.

    A is (a_row + MR, lda), the tile at (a_row, a_col). B is (b_row + K, ldb), the tile at
    (b_row, b_col); for a kernel whose B is packed in groups of G k (sdot and vpdpbusd: 4,
    vpmaddwd: 2) it is (b_row + K/G, ldb/G, G), the tile at group b_row, column b_col (ldb, the
    group stride, a multiple of G). C is (c_row + MR + c_guard, ldc), the tile at (c_row, c_col).
    """

    k: int
    lda: int  # >= a_col + K
    ldb: int  # >= b_col + NR (packed in groups of G: G * (b_col + NR))
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
        g = b_group(kern)
        if g > 1:
            b = (self.b_row + self.k // g, self.ldb // g, g)
        else:
            b = (self.b_row + self.k, self.ldb)
        return (self.a_row + kern.mr, self.lda), b, (self.c_row + kern.mr + self.c_guard, self.ldc)

    def tile(self, kern) -> tuple[slice, slice]:
        """(rows, columns) of the tile in C."""
        return slice(self.c_row, self.c_row + kern.mr), slice(self.c_col, self.c_col + kern.nr)

    @staticmethod
    def dense(kern, k: int) -> "TileLayout":
        return TileLayout(k, k, kern.nr * b_group(kern), kern.nr)


def b_group(kern) -> int:
    """How many k `kern` takes B in groups of (B packed as (K/G, N, G)); 1: row by row."""
    return 1 if isinstance(kern, GemmKernel) else kern.group


def operand_dtypes(kern) -> tuple[str, str, str]:
    """(A, B, C) element types of `kern`'s tile."""
    if isinstance(kern, GemmKernel):
        return "float32", "float32", "float32"
    return kern.a_dtype, kern.b_dtype, "int32"


def tile_function(kern, lay: TileLayout, zero_c: bool = False) -> tvm.IRModule:
    """C[tile] += A[tile] @ B[tile] tensorized onto `kern`'s intrinsic; C[tile] = A @ B instead
    for a beta=0 kernel, which zeroes C itself, or with `zero_c`, where an init block ahead of
    the call does."""
    f32 = isinstance(kern, GemmKernel)
    mr, nr, kk = kern.mr, kern.nr, lay.k
    ar, ac, br, bc, cr, cc = lay.a_row, lay.a_col, lay.b_row, lay.b_col, lay.c_row, lay.c_col
    a_shape, b_shape, c_shape = lay.shapes(kern)
    dt, bt, acc = operand_dtypes(kern)
    grp = b_group(kern)
    in_kernel = f32 and not kern.accumulate
    init = zero_c or in_kernel
    # The description's product: the integer kernels widen both operands to int32 first.
    widen = (lambda x: x) if f32 else (lambda x: T.Cast("int32", x))  # noqa: E731

    if grp > 1:

        @T.prim_func(s_tir=True)
        def tile(A: T.Buffer(a_shape, dt), B: T.Buffer(b_shape, bt), C: T.Buffer(c_shape, acc)):
            T.func_attr({"tirx.noalias": True})
            for i, j, g, t in T.grid(mr, nr, kk // grp, grp):
                with T.sblock("tile"):
                    vi, vj, vg, vt = T.axis.remap("SSRR", [i, j, g, t])
                    if init:
                        with T.init():
                            C[vi + cr, vj + cc] = T.int32(0)
                    C[vi + cr, vj + cc] = C[vi + cr, vj + cc] + widen(A[vi + ar, vg * grp + vt + ac]) * widen(
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
    sch.tensorize(outer, _register(kern, kk))
    return sch.mod


def _register(kern, k: int) -> str:
    if isinstance(kern, GemmKernel):
        return register(kern, k)
    return register_int_gemm(kern, k) if isinstance(kern, IntGemmKernel) else register_mac(kern, k)


def compile_tile(kern, lay: TileLayout, target: dict | None = None):
    """The tile compiled for its ISA, or for `target` (an emulator's stand-in ISA)."""
    return tvm.compile(tile_function(kern, lay), target=target or kern.isa.target)


def tile_asm(kern: GemmKernel, k: int = 64) -> str:
    return compile_tile(kern, TileLayout.dense(kern, k)).mod.inspect_source("asm")


def mac_tile_module(kern, k: int):
    """One tile, C[MR, NR] = A[MR, k] @ B, dense and tensorized with the kernel's intrinsic: the
    smallest module whose assembly is the kernel in context (golden dumps, the ARM bench)."""
    mod = tile_function(kern, TileLayout.dense(kern, k), zero_c=True)
    # The symbol the golden dumps name.
    return tvm.IRModule({"main": mod["main"].with_attr("global_symbol", "main")})


def int_kernel_function(kern: IntGemmKernel | AmxGemmKernel, sizes: tuple, offsets: tuple, strides: tuple, k: int,
                        batch: tuple | None = None, requant: tuple | None = None) -> tvm.IRModule:
    """main(A, B, C[, Bias, Scale]) calling the x86 integer kernel `kern` once (an AMX one between
    its tile configuration and release), without an intrinsic: the only way to run the batch-reduce and requantizing variants alone (kernel tests,
    dumps). A, B, C are flat buffers of `sizes` elements and the call's pointers start at
    `offsets` into them; strides = (lda, ldb, ldc); batch = (n1, sa1, n2, sa2, n3, sa3) for a
    batch-reduce kernel; requant = (zp, lo, hi) for a requantizing one (Bias and Scale: NR each)."""
    if kern.batch_reduce != (batch is not None) or bool(kern.requant) != (requant is not None):
        raise ValueError(f"{kern.name}: batch and requant arguments must match the kernel's variant")
    ir, sym = kern.llvm_ir(), kern.name
    (sa, sb, sc), (oa, ob, oc), nr = sizes, offsets, kern.nr
    head = [*strides[:2], strides[2], k]
    tail = list(batch or ())
    at, bt, ct = kern.a_dtype, kern.b_dtype, kern.c_dtype
    if isinstance(kern, AmxGemmKernel):  # the tiles configured around the call, as a schedule does

        @T.prim_func(s_tir=True)
        def call(A: T.Buffer((sa,), at), B: T.Buffer((sb,), bt), C: T.Buffer((sc,), ct)):
            with T.attr(0, "pragma_import_llvm", ir):
                T.evaluate(T.call_extern("void", kern.config_symbol))
                T.evaluate(T.call_extern("void", sym, A.access_ptr("r", offset=oa), head[0], B.access_ptr("r", offset=ob),
                                         head[1], C.access_ptr("rw", offset=oc), head[2], head[3], *tail))
                T.evaluate(T.call_extern("void", kern.release_symbol))
    elif requant is None:

        @T.prim_func(s_tir=True)
        def call(A: T.Buffer((sa,), at), B: T.Buffer((sb,), bt), C: T.Buffer((sc,), ct)):
            with T.attr(0, "pragma_import_llvm", ir):
                T.evaluate(T.call_extern("void", sym, A.access_ptr("r", offset=oa), head[0], B.access_ptr("r", offset=ob),
                                         head[1], C.access_ptr("rw", offset=oc), head[2], head[3], *tail))
    else:
        zp, lo, hi = requant

        @T.prim_func(s_tir=True)
        def call(A: T.Buffer((sa,), at), B: T.Buffer((sb,), bt), C: T.Buffer((sc,), ct), Bias: T.Buffer((nr,), "int32"),
                 Scale: T.Buffer((nr,), "float32")):
            with T.attr(0, "pragma_import_llvm", ir):
                T.evaluate(T.call_extern("void", sym, A.access_ptr("r", offset=oa), head[0], B.access_ptr("r", offset=ob),
                                         head[1], C.access_ptr("w", offset=oc), head[2], head[3], *tail,
                                         Bias.access_ptr("r"), Scale.access_ptr("r"), zp, lo, hi))

    return tvm.IRModule({"main": call.with_attr("global_symbol", "main")})
