"""TensorIntrins for the Winograd transform kernels: Y = M X M^T over a 16-channel block.

Description, for a transform matrix M (p x q) and one tile of 16-channel elements:
    dst[i, j, c] = sum over (k, l) of M[i, k] * M[j, l] * src[k, l, c]
src is q x q x 16 and dst p x p x 16, both with free row and column strides (the channels are
contiguous). The block iterates over the channel only; its body is p * p stores, one per tile
element, each a sum over the (k, l) whose coefficient M[i, k] M[j, l] is not zero, that
coefficient a constant (`emit` writes them; the Winograd schedule builds its transform blocks
with the same function, so the two match). Two spellings this replaced cost seconds per layer:
a block over (i, j, c) had to pick M[i, k] with a select over i, and tensorize simplified each
select under its condition (F(6): 1.7 s for one tensorize, against 0.04 s now); and the sums
as TVMScript text are 30-80 kB a transform to parse. `emit` builds them as TIR objects instead,
called from the text while it is parsed. Written as a reduction the description would carry an
init, which tensorize keeps as a zero fill of dst before every call: dead stores the size of
the tile, since the kernel overwrites all of dst.

Where the schedule keeps a tile's 16 channels between two larger dimensions (the tile index t
in V[xi, nu, t, c] and M[xi, nu, t, c], which the GEMM needs outside the channels), the operand carries that unit dimension too: tensorize matches a
region only if its extra dimensions lead. `UNIT_AXIS` says which operands have it, per kind.

Side effect the description does not show: the output transform (kind "out") keeps its first
pass in `src` and so overwrites it. The schedule hands it scratch it never reads again.
"""

from __future__ import annotations

import functools

import tvm
from tvm import s_tir, tirx
from tvm.script import tirx as T

from microkernels.f32_wino import BLOCK, WinoKernel

from . import registry
from .script import parse

# kind -> (src, dst) has a unit axis before the channels: (q, q, 1, 16) instead of (q, q, 16).
UNIT_AXIS = {"in": (False, True), "out": (True, False)}


def _region(unit: bool, n: int) -> str:
    return f"0:{n}, 0:{n}, 0:1, 0:{BLOCK}" if unit else f"0:{n}, 0:{n}, 0:{BLOCK}"


def emit(mat, dst, src) -> None:
    """Write dst = M src M^T into the TIR being parsed, one store per element: dst(i, j) gives
    (buffer, indices) of element (i, j), src(k, l) the load of element (k, l). Called from
    TVMScript text as a statement (the parser keeps the stores it makes). Shared by the
    description and the schedule: tensorize matches only identical expressions."""
    p, q = len(mat), len(mat[0])
    for i in range(p):
        for j in range(p):
            total = None
            for k in range(q):
                for l in range(q):
                    coef = mat[i][k] * mat[j][l]
                    if coef:
                        term = tirx.const(float(coef), "float32") * src(k, l)
                        total = term if total is None else total + term
            buf, indices = dst(i, j)
            T.buffer_store(buf, tirx.const(0.0, "float32") if total is None else total, indices)


def _index(unit: bool, at: tuple, i, j, c) -> list:
    """Indices of tile element (i, j), channel c, of an operand whose tile starts at `at`."""
    return [at[0] + i, at[1] + j, at[2], c] if unit else [at[0] + i, at[1] + j, c]


def _emitter(kern: WinoKernel, src_at: tuple = (0, 0, 0), dst_at: tuple = (0, 0, 0)):
    """The statement `transform(D, S, vc)` for a block over the channel: the kernel's whole
    transform of the tile at src_at in S into the tile at dst_at in D."""
    su, du = UNIT_AXIS[kern.kind]
    return lambda d, s, vc: emit(kern.program_matrix, lambda i, j: (d, _index(du, dst_at, i, j, vc)),
                                 lambda k, l: s[tuple(_index(su, src_at, k, l, vc))])


def _text(kern: WinoKernel) -> tuple[str, str]:
    (q, _), (p, _) = kern.shapes
    su, du = UNIT_AXIS[kern.kind]

    def buf(name, n, unit, strides):
        shape = f"({n}, {n}, 1, {BLOCK})" if unit else f"({n}, {n}, {BLOCK})"
        strides = f"{strides}, T.int32(), 1" if unit else f"{strides}, 1"
        return f"    {name} = T.match_buffer({name.lower()}, {shape}, 'float32', offset_factor=1, strides=[{strides}])"

    reads, writes = f"S[{_region(su, q)}]", f"D[{_region(du, p)}]"
    desc = [
        "@T.prim_func(s_tir=True)",
        "def desc(s: T.handle, d: T.handle):",
        buf("S", q, su, "T.int32(), T.int32()"),
        buf("D", p, du, "T.int32(), T.int32()"),
        "    with T.sblock('root'):",
        f"        T.reads({reads})",
        f"        T.writes({writes})",
        f"        for c in T.serial({BLOCK}):",
        "            with T.sblock('update'):",
        "                vc = T.axis.remap('S', [c])",
        "                transform(D, S, vc)",
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
    names = {"IR": kern.llvm_ir(), "transform": _emitter(kern)}
    return registry.register(kern.name, parse(desc, **names), parse(impl, **names))


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
    text = "\n".join([
        "@T.prim_func(s_tir=True)",
        f"def main(S: T.Buffer({src_shape}, 'float32'), D: T.Buffer({dst_shape}, 'float32')):",
        "    T.func_attr({'tirx.noalias': True})",
        f"    for c in T.serial({BLOCK}):",
        "        with T.sblock('wino'):",
        "            vc = T.axis.remap('S', [c])",
        "            transform(D, S, vc)",
    ]) + "\n"
    pad = lambda at: tuple(at) + (0,) * (3 - len(at))
    transform = _emitter(kern, pad(src_at), pad(dst_at))
    sch = s_tir.Schedule(parse(text, transform=transform))
    sch.tensorize(sch.get_loops(sch.get_sblock("wino"))[0], register(kern))
    return sch.mod


def compile_tile(kern: WinoKernel, src_shape, src_at, dst_shape, dst_at):
    return tvm.compile(tile_module(kern, src_shape, src_at, dst_shape, dst_at), target=kern.isa.target)
