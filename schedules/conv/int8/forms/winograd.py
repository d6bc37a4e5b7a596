"""3x3 stride-1 layers as Winograd F(2x2, 3x3) in integers, on the int16 upcast: B^T (x - zp_x) B
of each 4x4 input tile and (2G) (w - zp_w) (2G)^T, G doubled so it has no halves, are integers
that fit int16, so the 16 GEMMs of the transformed values run on the same vpmaddwd tile (as one
1x1 layer of 16 groups), and the output transform A^T M A, 4x the conv, is divided by 4 exactly:
2.25x fewer products than the direct conv, exact while the channels stay within max_channels.
(vpdpbusd multiplies 8-bit values, which the transformed ones are not: the VNNI ISAs stay direct.)"""

from __future__ import annotations

import dataclasses

import numpy as np

from microkernels import Isa
from microkernels.int_gemm import IntGemmKernel

from ....common.tir import padded_pack, vectorize_whole
from ...geometry import Geometry, Quantization
from ..output import output
from ..tiles import conv_kernel, flat_row
from ..values import ZERO_POINT_RANGE, widened
from .common import source_buffers

NAME = "winograd"
# B^T d B sums four data values and (2G) w (2G)^T nine weights, so both fit int16; every partial
# sum of the 16 GEMMs and of the output transform, evaluated as written, is at most
# GROWTH * C * max|x - zp_x| * max|w - zp_w| in magnitude (the GEMM's 36 per channel:
# |B^T d B| <= 4 max|d|, |(2G) w (2G)^T| <= 9 max|w|; the output transform's first stage at most
# the sum of three such, 4 * 3 * (2 + 3 + 3) = 96).
GROWTH = 96
MIN_CHANNELS = 16  # below, the transforms cost more than the 2.25x fewer products save
# Each row of B^T (over a 4x4 input tile's rows or columns) as its two terms; A^T's two rows are
# written out in unpack. G scaled by 2 (weights) keeps the weights' transform integral, and the
# output transform's result is 4x the conv.
BT = ((0, 2, -1), (1, 2, 1), (2, 1, -1), (1, 3, -1))  # (p, q, sign): row = d[p] + sign * d[q]
G2 = np.array([[2, 0, 0], [1, 1, 1], [1, -1, 1], [0, 0, 2]], np.int64)


def max_channels(quant: Quantization, zp_x: int, zp_w: int) -> int:
    """The most input channels for which Winograd's integer sums stay exact in int32 (GROWTH):
    685 for uint8 data of zero point 0 with int8 weights of zero point 0."""
    lo, hi = ZERO_POINT_RANGE[quant.dtype]
    wlo, whi = ZERO_POINT_RANGE[quant.weight_dtype]
    d, w = max(zp_x - lo, hi - zp_x), max(zp_w - wlo, whi - zp_w)
    return (2**31 - 1) // (GROWTH * d * w)


def applies(g: Geometry, isa: Isa, layer) -> tuple[Geometry | None, str]:
    """(the 16 GEMMs as one grouped 1x1 layer, "") for a layer that takes it, or (None, why not):
    3x3 stride-1 undilated single-group 8-bit layers of at least MIN_CHANNELS channels each way,
    on the int16 upcast tile (x86 without VNNI, where a product costs what a direct conv's does),
    up to max_channels. Its pixels are the layer's 2x2 output tiles, in rows of flat_row's
    length; its 16 groups the GEMMs."""
    quant = layer.quant
    if isa.arch != "x86":
        return None, "it is an x86 option"
    if quant.dtype == "int16" or quant.weight_dtype == "int16":
        return None, "it transforms 8-bit data and weights, not the legalized int16 form"
    kern = conv_kernel(isa, quant.dtype, False, g)
    if not (isinstance(kern, IntGemmKernel) and kern.op == "s16"):
        return None, f"{kern.name} multiplies 8-bit values as they are; Winograd runs on the int16 upcast tile"
    if not (g.kh == g.kw == 3 and g.stride == (1, 1) and g.dilation == (1, 1) and g.groups == 1):
        return None, "it takes 3x3 kernels of stride 1, without dilation, in one group"
    if min(g.c, g.o) < MIN_CHANNELS:
        return None, f"it needs at least {MIN_CHANNELS} input and output channels"
    most = max_channels(quant, layer.zp_x, layer.zp_w)
    if g.c > most:
        return None, (f"{g.c} input channels exceed {most}, the most whose transformed sums stay exact in int32 "
                      "with these zero points")
    th, tw = output_tiles(g)
    row = flat_row(th * tw)
    return dataclasses.replace(g, c=16 * g.c, o=16 * g.o, h=th * tw // row, w=row, kh=1, kw=1, stride=(1, 1),
                               pad=(0, 0, 0, 0), dilation=(1, 1), groups=16), ""


def weights(weight: np.ndarray, zp_w: int) -> np.ndarray:
    """OIHW 3x3 weights -> the 16 GEMMs' weights as one grouped 1x1 layer's, (16 * O, C, 1, 1)
    int16: GEMM 4a + b holds ((2G) (w - zp_w) (2G)^T)[a, b], 4x the textbook transform, exact."""
    w = weight.astype(np.int64) - zp_w
    u = np.einsum("ar,ocrs,bs->abco", G2, w, G2)  # (4, 4, C, O)
    o, c = weight.shape[:2]
    return np.ascontiguousarray(u.transpose(0, 1, 3, 2).reshape(16 * o, c, 1, 1)).astype(np.int16)


def note(plan) -> str:
    g = plan.g
    return (f"; Winograd F(2x2, 3x3) in integers: the data's 4x4 tiles and the weights "
            f"transformed exactly into int16, 16 GEMMs of {g.h * g.w} tiles x "
            f"{g.cg} -> {g.og} channels, the output transform in int32 and / 4 exact "
            f"(2.25x fewer products than the direct conv)")


def output_tiles(g: Geometry) -> tuple[int, int]:
    """Rows and columns of 2x2 output tiles covering the layer's output."""
    oh, ow = g.out_hw
    return -(-oh // 2), -(-ow // 2)


def source_shape(plan) -> tuple:
    """The padded source of the pack (x - zp_x as int16): every pixel the 4x4 input tiles read,
    tiles 2 pixels apart, the padding and what the last tiles read past it 0."""
    src, (th, tw) = plan.source, output_tiles(plan.source)
    return (src.n, 2 * th + 2, 2 * tw + 2, src.c)


def buffers(plan, dtype: str) -> list[str]:
    return source_buffers(plan, source_shape(plan))


def _combine(terms, index: str) -> str:
    """TVMScript choosing, by the value of `index` (0-3, an unrolled loop's), the row of B^T that
    combines the four `terms`: after unrolling each tile's choice folds to one add or subtract."""
    rows = [f"({terms[p]} {'+' if sign > 0 else '-'} {terms[q]})" for p, q, sign in BT]
    return f"T.Select({index} == 0, {rows[0]}, T.Select({index} == 1, {rows[1]}, T.Select({index} == 2, {rows[2]}, {rows[3]})))"


def pack(plan, dtype: str, zp: int) -> list[str]:
    """In two passes: the source padded and widened (S: x - zp_x as int16, 0 around it), then
    each 4x4 tile's B^T d B (16 values per channel, one per GEMM, channels innermost) into
    packed pixel t = tile row * tiles per row + tile column of GEMM vg = 4a + b; tiles past the
    last and padded channels hold 0."""
    src, (_, tw) = plan.source, output_tiles(plan.source)
    top, left = src.pad[0], src.pad[1]
    inside = f"{top} <= vy and vy < {top + src.h} and {left} <= vx and vx < {left + src.w}"
    x = f"D[vn, vy - {top}, vx - {left}, vc]" if plan.nhwc else f"D[vn, vc, vy - {top}, vx - {left}]"
    value = widened(x, zp)
    L = padded_pack(4, "S", list(zip("nyxc", source_shape(plan))), inside, value, "T.int16(0)",
                    block="pad")
    t = f"(vy * {plan.g.w} + vx)"
    y0, x0 = f"{t} // {tw} * 2", f"{t} % {tw} * 2"
    cols = [_combine([f"S[vn, {y0} + {r}, {x0} + {c}, vc]" for c in range(4)], "vg % 4") for r in range(4)]
    conds = [f"vx < {plan.g.w}"] + ([f"vc < {src.c}"] if plan.cp != src.c else [])
    return L + padded_pack(4, "P", list(zip("ngyxc", plan.packed_shape)), " and ".join(conds),
                           _combine(cols, "vg // 4"), "T.int16(0)")


def unpack(plan) -> list[str]:
    """The output transform: each 2x2 output tile A^T M A from the 16 GEMMs' int32 sums M of its
    tile, / 4 (exact: the sum is 4x the conv), then the output as `output` makes it; the tile's
    pixels past the output's edge are not stored."""
    src, g, nr = plan.source, plan.g, plan.kern.nr
    (th, tw), (oh, ow) = output_tiles(src), src.out_hw
    t = f"(vty * {tw} + vtx)"

    def m(a: int, b: int) -> str:
        return f"Acc[vn, {4 * a + b}, vo // {nr}, {t} // {g.w}, {t} % {g.w}, vo % {nr}]"

    def at(terms, index):  # A^T's rows: d0 + d1 + d2, d1 - d2 - d3
        return f"T.Select({index} == 0, {terms[0]} + {terms[1]} + {terms[2]}, {terms[1]} - {terms[2]} - {terms[3]})"

    y = at([f"({at([m(a, b) for b in range(4)], 'vj')})" for a in range(4)], "vi")
    yy, xx = "vty * 2 + vi", "vtx * 2 + vj"
    # the predicate is in the loop variables, as TIR takes it
    cond = [c for c, edge in ((f"ty * 2 + i < {oh}", oh % 2), (f"tx * 2 + j < {ow}", ow % 2)) if edge]
    idx = f"vn, {yy}, {xx}, vo" if plan.nhwc else f"vn, vo, {yy}, {xx}"
    return [f"    for n, ty, tx, i, j, o in T.grid({src.n}, {th}, {tw}, 2, 2, {src.o}):",
            "        with T.sblock('unpack'):",
            "            vn, vty, vtx, vi, vj, vo = T.axis.remap('SSSSSS', [n, ty, tx, i, j, o])",
            *([f"            T.where({' and '.join(cond)})"] if cond else []),
            f"            Out[{idx}] = {output(plan, f'T.shift_right({y}, T.int32(2))', 'vo', idx)}"]


def parallel(sch, plan) -> bool:
    """All of Winograd's passes on all threads: the padding by rows, the input transform by tiles
    (the 16 GEMMs' values of a tile unrolled, so each one's row of B^T folds to constants,
    channels in the lanes), the output transform by rows of tiles (a tile's 2x2 pixels
    unrolled, output channels in the lanes). True: the output stage is done."""
    src = plan.source
    pad = sch.get_loops(sch.get_sblock("pad"))
    sch.parallel(sch.fuse(*pad[:2]))
    vectorize_whole(sch, pad[-1], src.c)
    n, gv, y, x, c = sch.get_loops(sch.get_sblock("pack"))
    sch.reorder(n, y, x, gv, c)
    sch.parallel(sch.fuse(n, y, x))
    sch.unroll(gv)
    vectorize_whole(sch, c, plan.cp)
    n, ty, _, i, j, o = sch.get_loops(sch.get_sblock("unpack"))
    sch.parallel(sch.fuse(n, ty))
    sch.unroll(i)
    sch.unroll(j)
    vectorize_whole(sch, o, src.o)
    return True
