"""FP32 depthwise conv2d (groups = input channels, out = multiplier x in) on the depthwise kernel.

Channels stay in the vector lanes end to end: data NCHW16c with the channels padded to whole
blocks (not each one-channel group padded to a block of 16, which is what the grouped direct
conv does and why it ran depthwise layers 16x too slow), weights (OB, KH, KW, 16), output
NCHW16c. Loop nest: (image, output block, band of rows) in parallel; per band, the rows the
band needs are packed with their zero padding into P (ph x pw x 16, in L2) — lane l of output
block o reads input channel (16*o + l) / multiplier, so a channel multiplier > 1 is the same
loop; then one kernel call per output row computes every pixel of it.

Groups of G = 2, 4 or 8 input channels with as many outputs (ResNeXt's and RegNet's 3x3 layers)
run the same way (`lane_groups`): a group's channels sit in adjacent lanes of one block, so
output block o reads input block o alone, and the kernel's grouped variant permutes each input
vector G times instead of multiplying a block-diagonal panel's zeros. Weights (OB, KH, KW, G, 16).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import tvm
from tvm import s_tir

from intrinsics.templates import element_body
from intrinsics.f32_dwconv import DwRow, lane, reduce_axes, register_dw, weight_index, weight_taps
from microkernels import Isa
from microkernels.f32_dwconv import BLOCK, DwKernel, default_mr, row_mr

from ..common import layouts
from ..common.targets import check_array, check_elements
from ..common.tir import buffer, ceil_div, header, padded_pack, parse, region
from . import geometry
from .geometry import ConvBlocking, Geometry, PostOps
from .op import Conv2dOp
from .plans import DepthwisePlan, largest_divisor


def lane_groups(g: Geometry) -> bool:
    """Groups of 2, 4 or 8 channels, each with as many outputs: in the lanes (module doc)."""
    return geometry.lane_groups(g.c, g.o, g.groups)


def group_width(g: Geometry) -> int:
    """Input channels per group as the kernel sees them: 1 for depthwise (any multiplier)."""
    return g.cg if lane_groups(g) else 1


def shapes(g: Geometry) -> dict[str, tuple]:
    oh, ow = g.out_hw
    cb, ob = ceil_div(g.c, BLOCK), ceil_div(g.o, BLOCK)
    taps = weight_taps(g.kh, g.kw, group_width(g))
    return {"data": (g.n, cb, g.h, g.w, BLOCK), "weight": (ob, *taps, BLOCK), "bias": (ob, BLOCK),
            "out": (g.n, ob, oh, ow, BLOCK)}


def band_shape(g: Geometry, vh: int) -> tuple:
    """P: one band's input, VH output rows' worth with its zero padding (rows, columns, lanes)."""
    return (g.input_rows(vh), g.input_cols(g.out_hw[1]), BLOCK)


def _band_rows(g: Geometry, blocking: ConvBlocking, threads: int) -> int:
    """Output rows per band: the whole map when its packed input fits in half of L2 and there
    are enough (image, block) jobs for the threads; else the most rows whose input fits in a
    quarter of L2."""
    oh, ow = g.out_hw
    row_bytes = g.input_cols(ow) * BLOCK * 4
    jobs = g.n * ceil_div(g.o, BLOCK)
    if g.input_rows(oh) * row_bytes <= blocking.image_budget and jobs >= threads:
        return oh
    return largest_divisor(oh, lambda d: g.input_rows(d) * row_bytes <= blocking.band_budget) or 1


@dataclass(frozen=True)
class Variant:
    """The depthwise plan's free choices: the row kernel's pixel step (row_mr's cost model picks
    one) and the output rows per band (_band_rows). Autotune times a few others (variants)."""

    step: int
    band_rows: int

    @property
    def label(self) -> str:
        return f"depthwise {self.step}px bands of {self.band_rows}"

    def check(self, g: Geometry, isa: Isa, post: PostOps) -> None:
        """Refuse a variant this layer cannot run (a hand-edited measurement file)."""
        widest = default_mr(isa, g.kh, g.kw, post.epilogue, group_width(g))
        if not (isinstance(self.step, int) and 1 <= self.step <= widest and isinstance(self.band_rows, int)
                and self.band_rows >= 1 and g.out_hw[0] % self.band_rows == 0):
            raise ValueError(f"{self} does not fit the layer ({g.out_hw[0]} output rows, steps up to {widest})")


def planned(g: Geometry, isa: Isa, post: PostOps, blocking: ConvBlocking, threads: int) -> Variant:
    step = row_mr(isa, g.kh, g.kw, g.out_hw[1], post.epilogue, group_width(g))
    return Variant(step, _band_rows(g, blocking, threads))


def variants(g: Geometry, isa: Isa, post: PostOps, blocking: ConvBlocking, threads: int) -> list[Variant]:
    """The planned variant first, then: the widest step (row_mr trades it for a shorter tail
    on rows it does not divide), half the step, bands of half the rows or of the whole map.
    Only where a row kernel runs (rows of 2 pixels or more, more than one tap)."""
    base = planned(g, isa, post, blocking, threads)
    oh, ow = g.out_hw
    if ow < 2 or not reduce_axes(g.kh, g.kw, group_width(g)):
        return [base]
    widest = default_mr(isa, g.kh, g.kw, post.epilogue, group_width(g))
    out = [base, replace(base, step=widest), replace(base, step=max(2, base.step // 2))]
    half = largest_divisor(oh, lambda d: d <= base.band_rows // 2)
    out += [replace(base, band_rows=half)] if half else []
    out += [replace(base, band_rows=oh)]
    unique = []
    for v in out:
        if v not in unique:
            unique.append(v)
    return unique


def render(g: Geometry, isa: Isa, vh: int, post: PostOps, step: int | None = None) -> tuple[list[str], DwRow | None]:
    """TVMScript lines of the whole layer, and the row kernel to tensorize (None: plain TIR);
    step: the row kernel's pixel step (None: row_mr's)."""
    s = shapes(g)
    oh, ow = g.out_hw
    (sh, sw), (dh, dw) = g.stride, g.dilation
    top, left = g.pad[0], g.pad[1]
    ob, nb = s["out"][1], oh // vh
    mult = g.o // g.c
    ph, pw, _ = band_shape(g, vh)
    ep = post.epilogue
    ch = f"((vo * {BLOCK} + vl) // {mult})" if mult > 1 else f"(vo * {BLOCK} + vl)"
    row = f"vyb * {vh * sh} + vr - {top}"
    col = f"vx - {left}"
    L = header([buffer("D", s["data"]), buffer("Wt", s["weight"]), *([buffer("Bias", s["bias"])] if ep.bias else []),
                buffer("Out", s["out"])])
    L += [
        f"    for job in T.parallel({g.n * ob * nb}):",
        "        with T.sblock('band'):",
        f"            vn = T.axis.spatial({g.n}, job // {ob * nb})",
        f"            vo = T.axis.spatial({ob}, job // {nb} % {ob})",
        f"            vyb = T.axis.spatial({nb}, job % {nb})",
        f"            T.reads(D[vn, {region(s['data'][1:])}], Wt[vo, {region(s['weight'][1:])}]"
        + (f", Bias[vo, 0:{BLOCK}])" if ep.bias else ")"),
        f"            T.writes(Out[vn, vo, vyb * {vh}:vyb * {vh} + {vh}, 0:{ow}, 0:{BLOCK}])",
        f"            P = T.alloc_buffer({band_shape(g, vh)}, 'float32')",
    ]
    L += padded_pack(12, "P", [("r", ph), ("x", pw), ("l", BLOCK)],
                     f"0 <= {row} and {row} < {g.h} and 0 <= {col} and {col} < {g.w} and vo * {BLOCK} + vl < {g.o}",
                     f"D[vn, {ch} // {BLOCK}, {row}, {col}, {ch} % {BLOCK}]")
    L += [
        f"            for yi, x, l in T.grid({vh}, {ow}, {BLOCK}):",
        "                with T.sblock('dw'):",
        "                    vyi, vx, vl = T.axis.remap('SSS', [yi, x, l])",
    ]
    cg = group_width(g)
    red = reduce_axes(g.kh, g.kw, cg)
    r = "r" if g.kh > 1 else "0"
    c = "s" if g.kw > 1 else "0"
    # The row intrinsic's own spelling of the indices, which tensorize must match.
    L += element_body(f"Out[vn, vo, vyb * {vh} + vyi, vx, vl]",
                      f"P[vyi * {sh} + {r} * {dh}, vx * {sw} + {c} * {dw}, {lane('vl', cg)}]",
                      f"Wt[vo, {weight_index(r, c, 'vl', cg)}]", red, " " * 20, "Bias[vo, vl]" if ep.bias else None,
                      None, ep.act, post.clip)
    tile = None
    if ow >= 2 and red:
        kern = DwKernel(isa, g.kh, g.kw, step or row_mr(isa, g.kh, g.kw, ow, ep, cg), ep, cg)
        tile = DwRow(kern, ow, sw, dh, dw, post.clip)
    return L, tile


class DepthwiseConv2dOp(Conv2dOp):
    """A compiled depthwise conv2d: Conv2dOp's calls on its own blocked shapes (module doc)."""

    @property
    def blocked_data_shape(self) -> tuple:
        return shapes(self.geometry)["data"]

    @property
    def blocked_weight_shape(self) -> tuple:
        return shapes(self.geometry)["weight"]

    @property
    def blocked_out_shape(self) -> tuple:
        return shapes(self.geometry)["out"]

    @property
    def bias_shape(self) -> tuple:
        return shapes(self.geometry)["bias"]

    @property
    def data_layout(self) -> tuple[int, int]:  # channels in lanes, no per-group padding
        return BLOCK, 1

    @property
    def out_groups(self) -> int:
        return 1

    def pack_weights(self, weight: np.ndarray) -> np.ndarray:
        """OIHW (O, G, KH, KW) -> (OB, KH, KW, 16), or (OB, KH, KW, G, 16) for groups of G > 1
        channels; output channels zero-padded to blocks."""
        g = self.geometry
        check_array("weight", weight, (g.o, g.cg, g.kh, g.kw), "float32")
        return layouts.pack_depthwise_weights(weight, BLOCK)

    def pack_bias(self, bias: np.ndarray) -> np.ndarray:
        check_array("bias", bias, (self.geometry.o,), "float32")
        return layouts.pack_channels(bias, BLOCK)


def schedule(g: Geometry, isa: Isa, post: PostOps, blocking: ConvBlocking, threads: int,
             reason: str, variant: Variant | None = None) -> tuple[tvm.IRModule, DepthwisePlan]:
    """The layer's tensorized module (not compiled) and its plan; threads: the pool it divides;
    variant: the choices to take instead of the planned ones."""
    if post.residual:
        raise ValueError("a depthwise conv2d fuses bias and an activation, not a residual")
    variant = variant or planned(g, isa, post, blocking, threads)
    variant.check(g, isa, post)
    vh = variant.band_rows
    s = shapes(g)
    check_elements(data=s["data"], weight=s["weight"], output=s["out"],
                   band=band_shape(g, vh))
    lines, tile = render(g, isa, vh, post, variant.step)
    sch = s_tir.Schedule(parse(lines))
    if tile is not None:
        sch.tensorize(sch.get_loops(sch.get_sblock("dw"))[-2], register_dw(tile))
    elif g.kh * g.kw == 1:
        # A 1x1 layer stays plain TIR, one statement per element: its 16 lanes are one vector
        # (left to itself, LLVM vectorized along the pixels with gathers and scatters).
        sch.vectorize(sch.get_loops(sch.get_sblock("dw"))[-1])
    sch.vectorize(sch.get_loops(sch.get_sblock("pack"))[-1])
    cg = group_width(g)
    plan = DepthwisePlan("depthwise" if cg == 1 else "grouped", reason, band_rows=vh, multiplier=g.o // g.c,
                         kernel=tile.kern.name if tile else None, group=cg, step=tile.kern.mr if tile else None)
    return sch.mod, plan
