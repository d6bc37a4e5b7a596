"""TensorIntrins for the Winograd transform kernels: Y = M X M^T over a 16-channel block.

Description, for a transform matrix M (p x q) and one tile of 16-channel elements:
    dst[i, j, c] = sum over (k, l) of M[i, k] * src[k, l, c] * M[j, l]
src is q x q x 16 and dst p x p x 16, both with free row and column strides (the channels are
contiguous). The sum over (k, l) is written out term by term in a spatial block, with M[i, k]
a select over i for each constant k (`value` renders it; the Winograd schedule builds its
transform blocks from the same function, so the two match). Written as a reduction it would
carry an init, which tensorize keeps as a zero fill of dst before every call: dead stores the
size of the tile, since the kernel overwrites all of dst.

Where the schedule keeps a tile's 16 channels between two larger dimensions (the tile index t
in V[xi, nu, t, c] and M[xi, nu, t, c], which the GEMM needs outside the channels), the operand carries that unit dimension too: tensorize matches a
region only if its extra dimensions lead. `UNIT_AXIS` says which operands have it, per kind.

Side effect the description does not show: the output transform (kind "out") keeps its first
pass in `src` and so overwrites it. The schedule hands it scratch it never reads again.
"""

from __future__ import annotations

import functools

import tvm
from tvm import s_tir
from tvm.script import parser
from tvm.script import tirx as T

from microkernels.f32_wino import BLOCK, WinoKernel

from . import registry

# kind -> (src, dst) has a unit axis before the channels: (q, q, 1, 16) instead of (q, q, 16).
UNIT_AXIS = {"in": (False, True), "out": (True, False)}


def _index(unit: bool, i: str, j: str, c: str) -> str:
    return f"{i}, {j}, 0, {c}" if unit else f"{i}, {j}, {c}"


def _region(unit: bool, n: int) -> str:
    return f"0:{n}, 0:{n}, 0:1, 0:{BLOCK}" if unit else f"0:{n}, 0:{n}, 0:{BLOCK}"


def _column(mat, k: int, var: str) -> str:
    """TVMScript of M[var, k] for a loop variable `var`: a select over column k's non-zeros."""
    expr = "T.float32(0)"
    for i, row in enumerate(mat):
        if row[k] != 0:
            expr = f"T.Select({var} == {i}, T.float32({float(row[k])!r}), {expr})"
    return expr


def value(mat, src) -> str:
    """sum over (k, l) of M[vi, k] * src(k, l) * M[vj, l], one term per pair of non-zero
    columns; `src(k, l)` renders the source element. Shared by the description and the schedule."""
    q = len(mat[0])
    live = [k for k in range(q) if any(row[k] != 0 for row in mat)]
    return " + ".join(f"{_column(mat, k, 'vi')} * {src(k, l)} * {_column(mat, l, 'vj')}" for k in live for l in live)


def _text(kern: WinoKernel) -> str:
    (q, _), (p, _) = kern.shapes
    mat = kern.program_matrix
    su, du = UNIT_AXIS[kern.kind]

    def buf(name, n, unit, strides):
        shape = f"({n}, {n}, 1, {BLOCK})" if unit else f"({n}, {n}, {BLOCK})"
        strides = f"{strides}, T.int32(), 1" if unit else f"{strides}, 1"
        return f"    {name} = T.match_buffer({name.lower()}, {shape}, 'float32', offset_factor=1, strides=[{strides}])"

    d_at = f"D[{_index(du, 'vi', 'vj', 'vc')}]"
    s_at = lambda k, l: f"S[{_index(su, k, l, 'vc')}]"  # noqa: E731
    reads, writes = f"S[{_region(su, q)}]", f"D[{_region(du, p)}]"
    desc = [
        "@T.prim_func(s_tir=True)",
        "def desc(s: T.handle, d: T.handle):",
        buf("S", q, su, "T.int32(), T.int32()"),
        buf("D", p, du, "T.int32(), T.int32()"),
        "    with T.sblock('root'):",
        f"        T.reads({reads})",
        f"        T.writes({writes})",
        f"        for i, j, c in T.grid({p}, {p}, {BLOCK}):",
        "            with T.sblock('update'):",
        "                vi, vj, vc = T.axis.remap('SSS', [i, j, c])",
        f"                {d_at} = {value(mat, s_at)}",
    ]
    impl = [
        "@T.prim_func(s_tir=True)",
        "def impl(s: T.handle, d: T.handle):",
        "    rs = T.int32()", "    cs = T.int32()", "    rd = T.int32()", "    cd = T.int32()",
        buf("S", q, su, "rs, cs"),
        buf("D", p, du, "rd, cd"),
        "    with T.sblock('root'):",
        f"        T.reads({reads})",
        f"        T.writes({writes})",
        # The attribute carries the kernel's IR into the module that uses the intrinsic.
        "        with T.attr(0, 'pragma_import_llvm', IR):",
        f"            T.evaluate(T.call_extern('void', '{kern.name}', S.access_ptr('r'), rs, cs,"
        " D.access_ptr('w'), rd, cd))",
    ]
    return "\n".join(desc) + "\n", "\n".join(impl) + "\n"


@functools.lru_cache(maxsize=None)
def register(kern: WinoKernel) -> str:
    """Register (once) the intrinsic of a transform kernel; its name is the kernel's."""
    desc, impl = _text(kern)
    env = {"T": T, "IR": kern.llvm_ir()}
    return registry.register(kern.name, parser.parse(desc, extra_vars=env), parser.parse(impl, extra_vars=env))


def placement(kern: WinoKernel, src_at: tuple, src_after: tuple, dst_at: tuple, dst_after: tuple) -> tuple:
    """(src_shape, src_at, dst_shape, dst_at) for tile_module: each tile at `*_at` (row, column,
    index along the unit axis) with `*_after` elements more past it on each axis. An operand
    without a unit axis (UNIT_AXIS) ignores the third entries."""
    (q, _), (p, _) = kern.shapes
    su, du = UNIT_AXIS[kern.kind]
    return (*_place(q, su, src_at, src_after), *_place(p, du, dst_at, dst_after))


def _place(n: int, unit: bool, at: tuple, after: tuple) -> tuple[tuple, tuple]:
    axes = 3 if unit else 2
    shape = tuple(a + e + b for a, e, b in zip(at, (n, n, 1), after))[:axes]
    return shape + (BLOCK,), tuple(at[:axes])


def tile_module(kern: WinoKernel, src_shape: tuple, src_at: tuple, dst_shape: tuple, dst_at: tuple):
    """One transform placed inside larger buffers (at offsets, with real strides) and
    tensorized: for kernel tests and golden dumps. A buffer is (rows, cols, 16), or
    (rows, cols, n, 16) for an operand with a unit axis, whose `*_at` then has a third entry:
    the index along n (`placement` derives all four). Returns the scheduled IRModule."""
    (q, _), (p, _) = kern.shapes
    su, du = UNIT_AXIS[kern.kind]
    ref = lambda name, at, unit, i, j: (  # noqa: E731
        f"{name}[{at[0]} + {i}, {at[1]} + {j}, {at[2]}, vc]" if unit else f"{name}[{at[0]} + {i}, {at[1]} + {j}, vc]")
    d_ref = ref("D", dst_at, du, "vi", "vj")
    text = "\n".join([
        "@T.prim_func(s_tir=True)",
        f"def main(S: T.Buffer({src_shape}, 'float32'), D: T.Buffer({dst_shape}, 'float32')):",
        "    T.func_attr({'tirx.noalias': True})",
        f"    for i, j, c in T.grid({p}, {p}, {BLOCK}):",
        "        with T.sblock('wino'):",
        "            vi, vj, vc = T.axis.remap('SSS', [i, j, c])",
        f"            {d_ref} = {value(kern.program_matrix, lambda k, l: ref('S', src_at, su, k, l))}",
    ]) + "\n"
    sch = s_tir.Schedule(parser.parse(text, extra_vars={"T": T}))
    sch.tensorize(sch.get_loops(sch.get_sblock("wino"))[0], register(kern))
    return sch.mod


def compile_tile(kern: WinoKernel, src_shape, src_at, dst_shape, dst_at):
    return tvm.compile(tile_module(kern, src_shape, src_at, dst_shape, dst_at), target=kern.isa.target)
