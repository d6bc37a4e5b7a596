"""FP32 fused expand 1x1 conv + depthwise KxK conv (MobileNetV2's inverted residual block, up
to the 1x1 projection, which stays a conv of its own): the expanded activation (E = t*C
channels) never goes to memory.

Layouts: data NCHW16c with C padded to whole blocks (N, CB, H, W, 16); expand weights
OIHW16i16o (EB, CB, 1, 1, 16, 16), the direct conv's; depthwise weights (EB, K, K, 16), the
depthwise family's; biases (EB, 16); output NCHW16c (N, EB, OH, OW, 16), E padded to blocks.

Loop nest: (image, expanded-channel block) in parallel; per job, the bands of VH output rows in
order. A band's depthwise input is P (rows, columns, 16 lanes), the depthwise family's padded
band buffer, small enough to stay in L1 (band_budget): instead of packing P from an expanded tensor in
memory, the expand conv writes its rows straight into P's interior, one batch-reduce tile
(intrinsics.f32_conv, MR pixels x 16 channels, reduced over the input-channel blocks) at a
time: P's pixels are 16 floats apart, the tile's output row layout. Bias and activation of the
expand are that tile's epilogue. P's border holds zeros, not act(bias): the depthwise pads its
input (the expand's output) with zeros. Then one depthwise row kernel call (intrinsics.f32_dwconv,
+ bias, + activation) per output row reads P and writes the output.

Consecutive bands overlap by K - S input rows (the halo). Recomputing them would cost the
expand (K - S) / (S * VH) of its work again, so a band after the first copies the halo rows
from the bottom of P to its top (a row copy per 16 channels is a load and a store, the expand
C FMAs) and computes only its S * VH new rows. That is why the bands of one (image, block) run
in order in one job rather than in parallel.

Every output is the same sequence of float operations as the unfused pair (conv2d 1x1 +
bias + act, then the depthwise conv2d + bias + act, on the blocked path): the same tile
kernels, each output's reduction in the same order; the tests compare them bit for bit.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import s_tir

from intrinsics.f32_conv import ConvTile, reduce_axes, register_conv
from intrinsics.f32_dwconv import DwRow, register_dw
from intrinsics.templates import element_body
from microkernels import DEFAULT_TILES, GemmKernel, Isa
from microkernels.f32_dwconv import BLOCK, DwKernel, row_mr

from ..common import layouts
from ..common.compiled import CompiledOp, check_operand, check_out, store, user_operand
from ..common.targets import (
    check_array,
    check_elements,
    check_emulate,
    resolve,
    thread_count,
)
from ..common.tir import buffer, ceil_div, header, parse, region
from .geometry import NO_POST_OPS, ConvBlocking, ConvParams, Geometry, PostOps, segments
from .plans import Plan, largest_divisor

DEFAULT_BLOCKING = ConvBlocking()  # the host's L2
KERNEL_SIZES = (3, 5)  # depthwise kernels whose taps stay in registers on AVX-512 (f32_dwconv)


@dataclass(frozen=True)
class InvertedPlan(Plan):
    band_rows: int  # output rows per band (a divisor of OH)
    band_shape: tuple  # P: (input rows, input columns incl. padding, 16)
    halo_rows: int  # P rows a band takes over from the previous one instead of recomputing
    mr: int  # the expand tile's pixels
    segments: list  # (first column, tiles, MR) runs of expand tiles covering one input row
    expand_kernel: str | None  # the tile kernel's name (MR 1 on a one-pixel input row: a GEMV)
    dw_kernel: str | None  # the row kernel's name (None: a one-pixel output row, plain TIR, as the depthwise
    # family leaves it: a block with taps to reduce is not one vectorize takes)


@dataclass(frozen=True)
class Layer:
    """The fused block as values: the expand conv's and the depthwise conv's Geometry (both
    checked by Geometry.of) and each stage's post-ops."""

    expand: Geometry  # N, C, H, W -> E, 1x1
    dw: Geometry  # N, E, H, W -> E, KxK, stride S, padding K // 2, groups E
    expand_post: PostOps
    dw_post: PostOps

    @property
    def cb(self) -> int:  # input-channel blocks: C padded to 16 (never a narrower block)
        return ceil_div(self.expand.c, BLOCK)

    @property
    def eb(self) -> int:  # expanded-channel blocks
        return ceil_div(self.expand.o, BLOCK)

    def shapes(self) -> dict[str, tuple]:
        g, d = self.expand, self.dw
        return {"data": (g.n, self.cb, g.h, g.w, BLOCK), "expand_weight": (self.eb, self.cb, 1, 1, BLOCK, BLOCK),
                "dw_weight": (self.eb, d.kh, d.kw, BLOCK), "bias": (self.eb, BLOCK),
                "out": (g.n, self.eb, *d.out_hw, BLOCK)}

    def band_shape(self, vh: int) -> tuple:
        d = self.dw
        return (d.input_rows(vh), d.input_cols(d.out_hw[1]), BLOCK)

    def interior_cols(self) -> int:
        """Input columns P holds (the rest is padding): the image's, less any the depthwise
        never reads (none with padding K // 2, but the arithmetic says so rather than assumes)."""
        d = self.dw
        return min(d.w, d.input_cols(d.out_hw[1]) - d.pad[1])

    @property
    def flops(self) -> int:
        return self.expand.flops + self.dw.flops

    def pack_weights(self, expand_weight: np.ndarray, dw_weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """OIHW (E, C, 1, 1) -> (EB, CB, 1, 1, 16, 16), and OIHW (E, 1, K, K) -> (EB, K, K, 16);
        channels zero-padded to blocks."""
        g, d = self.expand, self.dw
        check_array("expand_weight", expand_weight, (g.o, g.c, 1, 1), "float32")
        check_array("dw_weight", dw_weight, (d.o, 1, d.kh, d.kw), "float32")
        return layouts.pack_weights(expand_weight, BLOCK, BLOCK), layouts.pack_depthwise_weights(dw_weight, BLOCK)

    def pack_bias(self, expand_bias=None, dw_bias=None) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(E,) each -> (EB, 16), zero-padded; None where the stage was built without a bias."""
        out = []
        for label, b, post in (("expand_bias", expand_bias, self.expand_post), ("dw_bias", dw_bias, self.dw_post)):
            _check_bias(label, b is not None, post.bias)
            if b is None:
                out.append(None)
                continue
            check_array(label, b, (self.expand.o,), "float32")
            out.append(layouts.pack_channels(b, BLOCK))
        return out[0], out[1]


def _check_bias(label: str, given: bool, on: bool) -> None:
    if given != on:
        raise ValueError(f"this block was built {'with' if on else 'without'} {label}: "
                         f"{'pass' if on else 'do not pass'} it")


def layer(data_shape, expand_weight_shape, dw_weight_shape, stride=1, expand_post: PostOps = NO_POST_OPS,
          dw_post: PostOps = NO_POST_OPS) -> Layer:
    """Check the shapes and post-ops and make the Layer (ValueError/TypeError otherwise)."""
    for label, post in (("expand_post", expand_post), ("dw_post", dw_post)):
        if not isinstance(post, PostOps):
            raise TypeError(f"{label} must be a schedules.PostOps, got {type(post).__name__}")
        if post.residual:
            raise ValueError(f"{label}: the fused block fuses a bias and an activation per stage, not a residual")
    expand = ConvParams(data_shape, expand_weight_shape)
    n, c, h, w = expand.data_shape
    e, ce, kh0, kw0 = expand.weight_shape
    if (kh0, kw0) != (1, 1) or ce != c:
        raise ValueError(f"expand_weight_shape must be (E, {c}, 1, 1), got {expand.weight_shape}")
    dw = ConvParams((n, e, h, w), dw_weight_shape, stride, 0, 1, e)
    o, one, k, kw = dw.weight_shape
    if o != e or one != 1 or k != kw or k not in KERNEL_SIZES:
        raise ValueError(f"dw_weight_shape must be ({e}, 1, K, K) with K in {KERNEL_SIZES}, got {dw.weight_shape}")
    if dw.stride[0] != dw.stride[1] or dw.stride[0] not in (1, 2):
        raise ValueError(f"stride must be 1 or 2, got {stride!r}")
    dw = ConvParams(dw.data_shape, dw.weight_shape, dw.stride, k // 2, 1, e)
    return Layer(Geometry.of(expand), Geometry.of(dw), expand_post, dw_post)


def pays(data_shape, expanded_channels: int, blocking: ConvBlocking = DEFAULT_BLOCKING) -> bool:
    """Whether fusing beats the two convs: when the expanded map would not stay in L2 between
    them (more than half of it). Below that the unfused pair keeps the map in L2 anyway and its
    expand runs on the direct conv's two-block tiles, which short rows need. Measured on the
    Zen 5 host (1 MiB L2), one thread, MobileNetV2's pairs, fused over unfused: 96x112x112 0.75,
    144x56x56 0.83 and 0.77, 192x28x28 (588 KiB) 0.79 to 0.87; 384x14x14 (294 KiB) 1.07,
    576x14x14 1.05 and 1.08, 960x7x7 1.18."""
    n, _, h, w = data_shape
    return n * expanded_channels * h * w * 4 > blocking.l2 // 2


def band_budget(blocking: ConvBlocking) -> int:
    """Bytes P may take: half of L1d (so the expand's stores and the depthwise's loads of P stay
    in L1, the input rows streaming beside it), and no more than a sixteenth of L2 (what a
    ConvBlocking override shrinks: the tests force many bands that way). Measured on the Zen 5
    host, one thread, MobileNetV2's 112x112 s2 layer: 223 us with 3-row P (22 KB) against 250-260
    with 9 to 113 rows; the 56x56 and 28x28 layers within 3% from 18 KB to 1 MB of P (the halo
    copies of small bands cost about what L1 saves)."""
    return min(blocking.l1 // 2, blocking.l2 // 16)


def band_rows(lay: Layer, blocking: ConvBlocking) -> int:
    """Output rows per band: the most (a divisor of OH, so every band is alike) whose P fits in
    band_budget; at least 1."""
    d = lay.dw
    row_bytes = d.input_cols(d.out_hw[1]) * BLOCK * 4
    return largest_divisor(d.out_hw[0], lambda v: d.input_rows(v) * row_bytes <= band_budget(blocking)) or 1


def render(lay: Layer, isa: Isa, mr: int, vh: int) -> tuple[list[str], list[tuple[str, object]]]:
    """TVMScript lines of the whole block, and the (block name, ConvTile or DwRow) pairs to
    tensorize."""
    s = lay.shapes()
    g, d = lay.expand, lay.dw
    oh, ow = d.out_hw
    sh, sw = d.stride
    top, left = d.pad[0], d.pad[1]
    ph, pw, _ = lay.band_shape(vh)
    nb, step = oh // vh, vh * sh  # bands; input rows from one band's first to the next's
    halo = ph - step if nb > 1 else 0
    cols = lay.interior_cols()
    ep_e, ep_d = lay.expand_post.epilogue, lay.dw_post.epilogue
    eb = lay.eb
    params = [buffer("D", s["data"]), buffer("We", s["expand_weight"]), buffer("Wd", s["dw_weight"])]
    params += [buffer("Be", s["bias"])] if ep_e.bias else []
    params += [buffer("Bd", s["bias"])] if ep_d.bias else []
    L = header(params + [buffer("Out", s["out"])])
    reads = f"D[vn, {region(s['data'][1:])}], We[vo, {region(s['expand_weight'][1:])}], Wd[vo, {region(s['dw_weight'][1:])}]"
    reads += f", Be[vo, 0:{BLOCK}]" if ep_e.bias else ""
    reads += f", Bd[vo, 0:{BLOCK}]" if ep_d.bias else ""
    L += [
        # Blocks innermost: a thread's consecutive jobs read the same image rows.
        f"    for job in T.parallel({g.n * eb}):",
        "        with T.sblock('image'):",
        f"            vn = T.axis.spatial({g.n}, job // {eb})",
        f"            vo = T.axis.spatial({eb}, job % {eb})",
        # Spelled out: inferred, the block's reads would name its own scratch buffer P.
        f"            T.reads({reads})",
        f"            T.writes(Out[vn, vo, 0:{oh}, 0:{ow}, 0:{BLOCK}])",
        f"            P = T.alloc_buffer({(ph, pw, BLOCK)}, 'float32')",
        f"            for yb in T.serial({nb}):",
    ]
    ind = " " * 16
    if halo > 0:
        # The previous band's last rows are this band's first: moved up, not recomputed (the
        # rows only move up, so copying in ascending order never reads a row already overwritten).
        L += [
            f"{ind}if yb > 0:",
            f"{ind}    for r, x, l in T.grid({halo}, {pw}, {BLOCK}):",
            f"{ind}        with T.sblock('halo'):",
            f"{ind}            vr, vx, vl = T.axis.remap('SSS', [r, x, l])",
            f"{ind}            P[vr, vx, vl] = P[vr + {step}, vx, vl]",
        ]
    L.append(f"{ind}for r in T.serial({ph}):")
    ind += "    "
    if halo > 0:
        L.append(f"{ind}if yb == 0 or {halo} <= r:")
        ind += "    "
    row = f"yb * {step} + r - {top}"
    L.append(f"{ind}if 0 <= {row} and {row} < {g.h}:")
    tensorized: list[tuple[str, object]] = []
    # The expand tiles of input row `row`, into P's interior columns.
    axes = reduce_axes(lay.cb, 1, 1, BLOCK)
    v = {a: a for a, _ in axes}
    q, i = v.get("q", "0"), v.get("i", "0")
    body = ind + "    "
    for si, (start, count, t) in enumerate(segments(cols, mr)):
        name = f"expand_{si}"
        loops, exts = (["tt", "m", "j"], [count, t, BLOCK]) if t >= 2 else (["tt", "j"], [count, BLOCK])
        L += [
            f"{body}for {', '.join(loops)} in T.grid({', '.join(map(str, exts))}):",
            f"{body}    with T.sblock('{name}'):",
            f"{body}        vyb = T.axis.spatial({nb}, yb)",
            f"{body}        vr = T.axis.spatial({ph}, r)",
            # As in the direct conv: the tile's first column is an iterator of its own, so the
            # inner bindings are exactly the tile description's (m, not start + m).
            f"{body}        vx0 = T.axis.spatial({g.w}, {start} + tt * {t})",
        ]
        if t >= 2:
            L.append(f"{body}        vm = T.axis.spatial({t}, m)")
        L.append(f"{body}        vj = T.axis.spatial({BLOCK}, j)")
        vx = "vx0 + vm" if t >= 2 else "vx0"
        # The direct conv's spelling of a 1x1, stride-1 tile's input (a 0 kernel row and column).
        a_ref = f"D[vn, {q}, vyb * {step} + vr - {top} + 0 * 1, ({vx}) * 1 + 0 * 1, {i}]"
        L += element_body(f"P[vr, {left} + {vx}, vj]", a_ref, f"We[vo, {q}, 0, 0, {i}, vj]", axes, body + "        ",
                          "Be[vo, vj]" if ep_e.bias else None, None, ep_e.act, lay.expand_post.clip)
        # A one-pixel row (t = 1: a 1-wide map) runs as the direct conv's does, a GEMV on the 1-row tile.
        kern = GemmKernel(isa, t, BLOCK, accumulate=False, batch_reduce=True, epilogue=ep_e)
        tensorized.append((name, ConvTile(kern, lay.cb, 1, 1, BLOCK, 1, 1, 1, lay.expand_post.clip)))
    # Zero padding left and right of the interior, and whole rows above and below the image.
    for name, lo, n in (("zero_left", 0, left), ("zero_right", left + cols, pw - left - cols)):
        if n:
            L += _zero(body, name, ph, "r", lo, n)
    L.append(f"{ind}else:")
    L += _zero(ind + "    ", "zero_row", ph, "r", 0, pw)
    # The depthwise rows: one kernel call each.
    L += [
        f"                for yi, x, l in T.grid({vh}, {ow}, {BLOCK}):",
        "                    with T.sblock('dw'):",
        f"                        vyb = T.axis.spatial({nb}, yb)",
        "                        vyi, vx, vl = T.axis.remap('SSS', [yi, x, l])",
    ]
    k = d.kh
    L += element_body(f"Out[vn, vo, vyb * {vh} + vyi, vx, vl]", f"P[vyi * {sh} + r * 1, vx * {sw} + s * 1, vl]",
                      "Wd[vo, r, s, vl]", [("r", k), ("s", k)], " " * 24, "Bd[vo, vl]" if ep_d.bias else None, None,
                      ep_d.act, lay.dw_post.clip)
    if ow >= 2:
        kern = DwKernel(isa, k, k, row_mr(isa, k, k, ow, ep_d), ep_d)
        tensorized.append(("dw", DwRow(kern, ow, sw, 1, 1, lay.dw_post.clip)))
    return L, tensorized


def _zero(indent: str, name: str, ph: int, r: str, lo: int, n: int) -> list[str]:
    """A block zeroing P[r, lo:lo + n, :] (row r of the enclosing loop)."""
    return [
        f"{indent}for x, l in T.grid({n}, {BLOCK}):",
        f"{indent}    with T.sblock('{name}'):",
        f"{indent}        vr = T.axis.spatial({ph}, {r})",
        f"{indent}        vx, vl = T.axis.remap('SS', [x, l])",
        f"{indent}        P[vr, {lo} + vx, vl] = T.float32(0)",
    ]


def schedule(lay: Layer, isa: Isa, blocking: ConvBlocking = DEFAULT_BLOCKING) -> tuple[tvm.IRModule, InvertedPlan]:
    """The block's tensorized module (not compiled) and its plan."""
    mr = DEFAULT_TILES[isa.name][0]  # the direct conv's tile: its 1x1 layers run on the same one
    vh = band_rows(lay, blocking)
    s = lay.shapes()
    check_elements(data=s["data"], expand_weight=s["expand_weight"], dw_weight=s["dw_weight"], output=s["out"],
                   band=lay.band_shape(vh))
    lines, tiles = render(lay, isa, mr, vh)
    sch = s_tir.Schedule(parse(lines))
    for name, tile in tiles:
        loops = sch.get_loops(sch.get_sblock(name))
        if isinstance(tile, ConvTile):  # the tile's ([m,] j) loops: no m on a one-pixel row
            sch.tensorize(loops[-len(tile.free_loops())], register_conv(tile))
        else:  # the depthwise row's (x, l)
            sch.tensorize(loops[-2], register_dw(tile))
    # Not "halo": a block that reads the buffer it writes is not one vectorize accepts; LLVM
    # vectorizes that copy of whole contiguous rows by itself.
    names = {"zero_left", "zero_right", "zero_row"}
    for blk in sch.get_child_blocks(sch.get_sblock("image")):
        if sch.get(blk).name_hint in names:
            sch.vectorize(sch.get_loops(blk)[-1])
    ph = lay.band_shape(vh)[0]
    halo = ph - vh * lay.dw.stride[0] if lay.dw.out_hw[0] > vh else 0
    conv_tiles = [t for _, t in tiles if isinstance(t, ConvTile)]
    dw_rows = [t for _, t in tiles if isinstance(t, DwRow)]
    plan = InvertedPlan(
        "inverted", f"expand 1x1 into P, {halo} halo rows carried per band, P {math.prod(lay.band_shape(vh)) * 4} "
        f"bytes (budget {band_budget(blocking)})", band_rows=vh, band_shape=lay.band_shape(vh), halo_rows=halo, mr=mr,
        segments=segments(lay.interior_cols(), mr), expand_kernel=conv_tiles[0].kern.name if conv_tiles else None,
        dw_kernel=dw_rows[0].kern.name if dw_rows else None)
    return sch.mod, plan


class InvertedResidualOp(CompiledOp):
    """A compiled expand 1x1 + depthwise block for fixed shapes (module doc).

    Blocked fast path: `we, wd = op.pack_weights(w_expand, w_dw)`, `be, bd = op.pack_bias(b_expand, b_dw)`,
    then `op.run_blocked(x_nchw16c, we, wd, be, bd)` (a bias the op was built without is None).
    NCHW arrays: `f = op.bind(w_expand, w_dw, b_expand, b_dw)` packs once, then `f(x)` per call
    (compiled layout transforms around the block); `op(x, w_expand, w_dw, b_expand, b_dw)` packs
    on every call.
    """

    def __init__(self, lay: Layer, isa: Isa, mod: tvm.IRModule, plan: InvertedPlan, threads: int | None,
                 emulate: bool = False):
        super().__init__(isa, tvm.compile(mod, target=isa.target), threads, emulate)
        self.layer, self.mod, self.plan = lay, mod, plan

    @property
    def flops(self) -> int:
        return self.layer.flops

    @property
    def blocked_data_shape(self) -> tuple:
        return self.layer.shapes()["data"]

    @property
    def blocked_out_shape(self) -> tuple:
        return self.layer.shapes()["out"]

    def to_blocked(self, data: np.ndarray) -> np.ndarray:
        g = self.layer.expand
        check_array("data", data, (g.n, g.c, g.h, g.w), "float32")
        return layouts.to_nchwc(data, BLOCK)

    def from_blocked(self, out: np.ndarray) -> np.ndarray:
        check_array("out", out, self.blocked_out_shape, "float32")
        return layouts.from_nchwc(out, self.layer.expand.o)

    def pack_weights(self, expand_weight: np.ndarray, dw_weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.layer.pack_weights(expand_weight, dw_weight)

    def pack_bias(self, expand_bias=None, dw_bias=None) -> tuple[np.ndarray | None, np.ndarray | None]:
        return self.layer.pack_bias(expand_bias, dw_bias)

    def _args(self, data_b, expand_w, dw_w, expand_bias, dw_bias, out):
        s = self.layer.shapes()
        check_operand("data", data_b, s["data"], "float32")
        check_operand("expand_weight", expand_w, s["expand_weight"], "float32")
        check_operand("dw_weight", dw_w, s["dw_weight"], "float32")
        inputs = [data_b, expand_w, dw_w]
        for label, b, post in (("expand_bias", expand_bias, self.layer.expand_post),
                               ("dw_bias", dw_bias, self.layer.dw_post)):
            _check_bias(label, b is not None, post.bias)
            if b is not None:
                inputs.append(check_operand(label, b, s["bias"], "float32"))
        if out is not None:
            check_operand("out", out, s["out"], "float32")
            check_out(out, data=data_b, expand_weight=expand_w, dw_weight=dw_w, expand_bias=expand_bias,
                      dw_bias=dw_bias)
        return self._tensors(inputs, s["out"], out)

    def run_blocked(self, data_b, expand_weight, dw_weight, expand_bias=None, dw_bias=None, out=None):
        """NCHW16c in, NCHW16c out; weights and biases as pack_weights/pack_bias return them."""
        return self._run(self._args(data_b, expand_weight, dw_weight, expand_bias, dw_bias, out))

    def __call__(self, data, expand_weight, dw_weight, expand_bias=None, dw_bias=None, out=None):
        """NCHW data, OIHW weights, biases (E,); returns NCHW. Packs the weights on every call:
        `bind` packs them once."""
        return self.bind(expand_weight, dw_weight, expand_bias, dw_bias)(data, out)

    def bind(self, expand_weight, dw_weight, expand_bias=None, dw_bias=None) -> "BoundInvertedResidual":
        """Pack the weights (and biases) once; the result is f(x NCHW, out=None)."""
        return BoundInvertedResidual(self, expand_weight, dw_weight, expand_bias, dw_bias)

    @functools.cached_property
    def transforms(self) -> dict:
        """The NCHW path's layout transforms, compiled (on first use): NCHW -> NCHW16c of the
        input, and the expanded output back to NCHW."""
        g = self.layer.expand
        return {"to_blocked": layouts.compile_to_nchwc((g.n, g.c, g.h, g.w), BLOCK, 1, self.isa),
                "from_blocked": layouts.compile_from_nchwc(self.blocked_out_shape, g.o, 1, self.isa)}

    def scratch(self, name: str):
        """The blocked input or output buffer ("data", "out") of the NCHW path, one per Python
        thread, made on first use."""
        return self.per_thread_buffer(name, {"data": self.blocked_data_shape, "out": self.blocked_out_shape}[name])

    def time(self, data_b, expand_weight, dw_weight, expand_bias=None, dw_bias=None, number=10, repeat=5,
             cold=False) -> list[float]:
        """Seconds per call on blocked arrays, one entry per repeat (cold: caches flushed before
        each repeat, so use number=1)."""
        return self._time(self._args(data_b, expand_weight, dw_weight, expand_bias, dw_bias, None), number, repeat,
                          cold)


class BoundInvertedResidual:
    """The fused block with its weights and biases packed once, as TVM tensors: call it on NCHW
    arrays. Per call: the compiled input transform, the block, the compiled output transform,
    through blocked buffers the op keeps per Python thread (a fresh output unless `out`)."""

    def __init__(self, op: InvertedResidualOp, expand_weight, dw_weight, expand_bias=None, dw_bias=None):
        host = lambda a: a.numpy() if isinstance(a, tvm.runtime.Tensor) else a  # noqa: E731
        # pack_bias refuses a bias the op was not built for, and a missing one it was.
        packed = op.pack_weights(host(expand_weight), host(dw_weight)) + op.pack_bias(
            None if expand_bias is None else host(expand_bias), None if dw_bias is None else host(dw_bias))
        self.op, self.packed = op, packed
        self.tensors = [tvm.runtime.tensor(a) for a in packed if a is not None]
        g = op.layer.expand
        self._in_shape = (g.n, g.c, g.h, g.w)
        self._out_shape = (g.n, g.o, *op.blocked_out_shape[2:4])

    def __call__(self, data, out=None):
        op = self.op
        check_operand("data", data, self._in_shape, "float32")
        if op.emulate:  # the emulator runs the block; the transforms are numpy's
            y = op.from_blocked(np.asarray(op.run_blocked(op.to_blocked(data), *self.packed)))
            return y if out is None else store(out, y)
        if out is None:
            out = np.empty(self._out_shape, np.float32)
        else:
            check_operand("out", out, self._out_shape, "float32")
            check_out(out)  # overlap is fine: the input is read into a blocked buffer first
        op.prepare()
        xb, yb = op.scratch("data"), op.scratch("out")
        op.transforms["to_blocked"](user_operand(data), xb)
        op.entry()(xb, *self.tensors, yb)
        op.transforms["from_blocked"](yb, user_operand(out))
        return out


def inverted_residual(data_shape, expand_weight_shape, dw_weight_shape, stride=1, expand_post: PostOps = NO_POST_OPS,
                      dw_post: PostOps = NO_POST_OPS, target="native", threads=None,
                      blocking: ConvBlocking = DEFAULT_BLOCKING, emulate=False) -> InvertedResidualOp:
    """Compile the fused expand 1x1 + depthwise KxK block (module doc) for NCHW data of
    `data_shape` (N, C, H, W), expand weights (E, C, 1, 1) and depthwise weights (E, 1, K, K),
    K = 3 or 5, padding K // 2, stride 1 or 2. expand_post / dw_post: each stage's bias and
    activation (PostOps, no residual). target: "x86-avx512", "x86-avx2" or "native"; threads:
    TVM's pool size while it runs (None: one per core); blocking: the cache budget the bands
    are sized from; emulate: run on the Bochs CPU (AVX-512 numerics on a host without it)."""
    if not isinstance(blocking, ConvBlocking):
        raise TypeError(f"blocking must be a schedules.ConvBlocking, got {type(blocking).__name__}")
    lay = layer(data_shape, expand_weight_shape, dw_weight_shape, stride, expand_post, dw_post)
    threads = thread_count(threads)
    isa = resolve(target)
    if isa.arch != "x86":
        raise ValueError(f"the fused inverted residual block is an x86 float32 op, not {isa.name}")
    emulate = check_emulate(emulate, isa)
    mod, plan = schedule(lay, isa, blocking)
    return InvertedResidualOp(lay, isa, mod, plan, threads, emulate)
