"""The TensorIntrin of the register transpose (microkernels/f32_transpose.py): one L x L tile.

Description: D[j, i] = S[i, j] over an L x L tile, both operands with a free row stride (the
columns contiguous), L the ISA's lanes. Implementation: the kernel for one tile (n = 1, steps
0). The layout transforms call the kernel directly for a run of tiles (schedules/common/
layouts.py), which saves a loop of calls; this is the same kernel for schedules of one's own.
"""

from __future__ import annotations

import functools

import tvm
from tvm import s_tir

from microkernels.f32_transpose import TransposeKernel

from . import registry
from .script import parse


def _text(kern: TransposeKernel) -> tuple[str, str]:
    n = kern.lanes

    def buf(name, stride):
        return (f"    {name} = T.match_buffer({name.lower()}, ({n}, {n}), 'float32', offset_factor=1, "
                f"strides=[{stride}, 1])")

    frame = ["    with T.sblock('root'):", f"        T.reads(S[0:{n}, 0:{n}])", f"        T.writes(D[0:{n}, 0:{n}])"]
    desc = ["@T.prim_func(s_tir=True)", "def desc(s: T.handle, d: T.handle):", buf("S", "T.int32()"),
            buf("D", "T.int32()"), *frame,
            f"        for i, j in T.grid({n}, {n}):",
            "            with T.sblock('transpose'):",
            "                vi, vj = T.axis.remap('SS', [i, j])",
            "                D[vj, vi] = S[vi, vj]"]
    impl = ["@T.prim_func(s_tir=True)", "def impl(s: T.handle, d: T.handle):", "    rs = T.int32()", "    rd = T.int32()",
            buf("S", "rs"), buf("D", "rd"), *frame,
            # The attribute carries the kernel's IR into the module that uses the intrinsic.
            "        with T.attr(0, 'pragma_import_llvm', IR):",
            (f"            T.evaluate(T.call_extern('void', '{kern.name}', S.access_ptr('r'), rs, 0, "
             "D.access_ptr('w'), rd, 0, 1))")]
    return "\n".join(desc) + "\n", "\n".join(impl) + "\n"


@functools.lru_cache(maxsize=None)
def register(kern: TransposeKernel) -> str:
    """Register (once) the intrinsic of the kernel; its name is the kernel's."""
    desc, impl = _text(kern)
    return registry.register(kern.name, parse(desc, IR=kern.llvm_ir()), parse(impl, IR=kern.llvm_ir()))


def tile_module(kern: TransposeKernel, src_shape: tuple, src_at: tuple, dst_shape: tuple, dst_at: tuple):
    """One tile transposed from S[src_at + (i, j)] to D[dst_at + (j, i)] inside larger 2-D
    buffers (real row strides, unaligned starts), tensorized: for the kernel's tests."""
    n = kern.lanes
    (si, sj), (di, dj) = src_at, dst_at
    text = "\n".join([
        "@T.prim_func(s_tir=True)",
        f"def main(S: T.Buffer({src_shape}, 'float32'), D: T.Buffer({dst_shape}, 'float32')):",
        "    T.func_attr({'tirx.noalias': True})",
        f"    for i, j in T.grid({n}, {n}):",
        "        with T.sblock('transpose'):",
        "            vi, vj = T.axis.remap('SS', [i, j])",
        f"            D[{di} + vj, {dj} + vi] = S[{si} + vi, {sj} + vj]",
    ]) + "\n"
    sch = s_tir.Schedule(parse(text))
    sch.tensorize(sch.get_loops(sch.get_sblock("transpose"))[0], register(kern))
    return sch.mod


def compile_tile(kern: TransposeKernel, *placement):
    return tvm.compile(tile_module(kern, *placement), target=kern.isa.target)
