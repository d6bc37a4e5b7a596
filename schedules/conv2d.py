"""FP32 conv2d, NCHWc direct, tensorized on the batch-reduce GEMM tile.

One output tile is MR pixels of an output row x NR output channels (one output block). Its
whole reduction (input-channel blocks x KH x KW x channels of a block) runs inside one call of
the batch-reduce kernel, so each output tile is stored once and never reloaded.

Loop nest, outer to inner:
    n, band     : VH output rows; the band's input rows (halo and zero padding included) are
                  packed into a small buffer first when the layer pads, so what the tiles read
                  stays in L2 (per-segment spatial packing). The window a band needs is
                  KH + SH*(VH-1) rows tall (dilated: (KH-1)*DH + 1 + SH*(VH-1)).
    o           : output-channel block (the weights of one block stay in L2 across rows)
    row, tile   : the tiles of one output row; a row that MR does not divide ends in one or two
                  narrower tiles (never MR = 1 unless the row is one pixel wide)
Threads split the bands when the input is larger than L2 (each thread packs its own bands),
and the output-channel blocks otherwise.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import s_tir
from tvm.script import parser
from tvm.script import tirx as T

from intrinsics.f32_conv import DEFAULT_CLIP, ConvTile, element_body, reduce_axes, register_conv
from microkernels import DEFAULT_TILES, NO_EPILOGUE, Epilogue, GemmKernel, Isa
from microkernels.f32_gemm import ACTIVATIONS, registers_needed

from . import layouts
from .compiled import CompiledOp, check_operand, user_operand
from .conv2d_int8 import conv2d_int8, conv_kernel
from .targets import (check_array, check_elements, check_emulate, dtype_name, host_cache_bytes, positive_int,
                      resolve, thread_count)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _pair(name: str, v, allow_zero: bool = False) -> tuple[int, int]:
    vals = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    if len(vals) != 2:
        raise ValueError(f"{name} must be an int or a pair, got {v!r}")
    lo = 0 if allow_zero else 1
    for x in vals:
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
            raise TypeError(f"{name} must hold ints, got {v!r}")
        if x < lo:
            raise ValueError(f"{name} must be >= {lo}, got {v!r}")
    return int(vals[0]), int(vals[1])


def _padding(p) -> tuple[int, int, int, int]:
    """int, (h, w) or (top, left, bottom, right) -> (top, left, bottom, right)."""
    if isinstance(p, (tuple, list)) and len(p) not in (2, 4):
        raise ValueError(f"padding must be an int, a pair or (top, left, bottom, right), got {p!r}")
    if isinstance(p, (tuple, list)) and len(p) == 4:
        vals = tuple(p)
    else:
        h, w = _pair("padding", p, allow_zero=True)
        vals = (h, w, h, w)
    for x in vals:
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
            raise TypeError(f"padding must hold ints, got {p!r}")
        if x < 0:
            raise ValueError(f"padding must be >= 0, got {p!r}")
    return tuple(int(x) for x in vals)


def _shape(name: str, s, rank: int) -> tuple[int, ...]:
    if not isinstance(s, (tuple, list)) or len(s) != rank:
        raise ValueError(f"{name} must be a tuple of {rank} ints, got {s!r}")
    return tuple(positive_int(f"{name}[{i}]", v) for i, v in enumerate(s))


@dataclass(frozen=True)
class ConvBlocking:
    """Cache budgets in bytes. l2_bytes None: the host's L2 as sysfs gives it (512 KiB where it
    does not say); the golden assembly pins 512 KiB so it does not depend on the host."""

    l2_bytes: int | None = None

    @property
    def l2(self) -> int:
        return self.l2_bytes if self.l2_bytes is not None else host_cache_bytes(2, 512 * 1024)

    @property
    def image_budget(self) -> int:  # a layer's input this small is packed whole, once
        return self.l2 // 2

    @property
    def band_budget(self) -> int:  # otherwise a band's input must fit here
        return self.l2 // 4


@dataclass(frozen=True)
class Geometry:
    """Every size of one conv2d layer, in the blocked layouts."""

    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    stride: tuple[int, int]
    pad: tuple[int, int, int, int]  # top, left, bottom, right
    dilation: tuple[int, int]
    groups: int
    block: int  # output block (= the tile's NR)

    @property
    def cg(self) -> int:
        return self.c // self.groups

    @property
    def og(self) -> int:
        return self.o // self.groups

    @property
    def bi(self) -> int:
        """Input block: the full block, or the whole group when it has fewer channels (first layer)."""
        return min(self.block, self.cg)

    @property
    def nb(self) -> int:  # input blocks per group
        return _ceil_div(self.cg, self.bi)

    @property
    def ob(self) -> int:  # output blocks per group
        return _ceil_div(self.og, self.block)

    @functools.cached_property  # every call checks its arrays against these
    def out_hw(self) -> tuple[int, int]:
        (sh, sw), (dh, dw) = self.stride, self.dilation
        t, l, b, r = self.pad
        return ((self.h + t + b - (self.kh - 1) * dh - 1) // sh + 1,
                (self.w + l + r - (self.kw - 1) * dw - 1) // sw + 1)

    @functools.cached_property  # every call checks its arrays against these
    def data_shape(self) -> tuple:
        return (self.n, self.groups * self.nb, self.h, self.w, self.bi)

    @functools.cached_property  # every call checks its arrays against these
    def weight_shape(self) -> tuple:
        return (self.groups * self.ob, self.nb, self.kh, self.kw, self.bi, self.block)

    @functools.cached_property  # every call checks its arrays against these
    def out_shape(self) -> tuple:
        return (self.n, self.groups * self.ob, *self.out_hw, self.block)

    def input_rows(self, out_rows: int) -> int:
        """Input rows (padding included) that `out_rows` consecutive output rows read."""
        return (out_rows - 1) * self.stride[0] + (self.kh - 1) * self.dilation[0] + 1

    def input_cols(self, out_cols: int) -> int:
        """Input columns (padding included) that `out_cols` consecutive output pixels read."""
        return (out_cols - 1) * self.stride[1] + (self.kw - 1) * self.dilation[1] + 1

    @functools.cached_property  # every call checks its arrays against these
    def bias_shape(self) -> tuple:  # per output block: NCHWc's channel order
        return (self.groups * self.ob, self.block)

    @property
    def flops(self) -> int:
        oh, ow = self.out_hw
        return 2 * self.n * self.o * oh * ow * self.cg * self.kh * self.kw

    @property
    def padded(self) -> bool:
        return any(self.pad)


@dataclass(frozen=True)
class PostOps:
    """What a conv2d applies to its output tiles before their one store (oneDNN's post-ops):
    out = act(conv + bias[o] + residual), each part optional, act None, "relu" or "clip" (to
    the `clip` bounds; (0, 6) is ReLU6). The layer takes the extra inputs in this order:
    data, weight, bias (op.pack_bias), residual (blocked output shape)."""

    bias: bool = False
    residual: bool = False
    activation: str | None = None
    clip: tuple[float, float] = DEFAULT_CLIP

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        for label, v in (("bias", self.bias), ("residual", self.residual)):
            if not isinstance(v, bool):
                raise TypeError(f"{label} must be True or False, got {v!r}")
        try:
            lo, hi = (float(b) for b in self.clip)
        except (TypeError, ValueError):
            raise ValueError(f"clip must be two numbers (lo, hi), got {self.clip!r}") from None
        if not lo < hi:
            raise ValueError(f"clip bounds must satisfy lo < hi, got {self.clip!r}")
        object.__setattr__(self, "clip", (lo, hi))

    @property
    def epilogue(self) -> Epilogue:
        return Epilogue(self.bias, self.residual, self.activation) if self else NO_EPILOGUE

    def __bool__(self) -> bool:
        return self.bias or self.residual or self.activation is not None

    def params(self, g: "Geometry") -> str:
        return ((f" Bias: T.Buffer({g.bias_shape}, 'float32')," if self.bias else "")
                + (f" Res: T.Buffer({g.out_shape}, 'float32')," if self.residual else ""))

    def band_reads(self, g: "Geometry", rows: int | None = None) -> str:
        """Extra T.reads of a block covering output rows [vyb*rows, +rows) (all rows: None)."""
        out = ""
        if self.bias:
            out += f", Bias[0:{g.bias_shape[0]}, 0:{g.block}]"
        if self.residual:
            span = f"vyb * {rows}:vyb * {rows} + {rows}" if rows else f"0:{g.out_hw[0]}"
            out += f", Res[vn, 0:{g.out_shape[1]}, {span}, 0:{g.out_hw[1]}, 0:{g.block}]"
        return out


NO_POST_OPS = PostOps()


def _segments(ow: int, mr: int) -> list[tuple[int, int, int]]:
    """(first column, tiles, MR) runs covering one output row; no tile has MR = 1 unless ow = 1."""
    if ow == 1:
        return [(0, 1, 1)]
    full, rem = divmod(ow, mr)
    if rem == 1:
        # The last full tile and the lone column become two tiles of at least 2 each
        # (ow >= 2 and rem == 1 imply full >= 1).
        full -= 1
        a = (mr + 2) // 2
        tails = [a, mr + 1 - a]
    else:
        tails = [rem] if rem else []
    segs, col = [], 0
    if full:
        segs.append((0, full, mr))
        col = full * mr
    for t in tails:
        segs.append((col, 1, t))
        col += t
    return segs


def _bands(g: Geometry, blocking: ConvBlocking, threads: int) -> tuple[int, bool]:
    """(rows per band VH, whether threads split bands rather than output blocks).

    An input that fits in half of L2 is packed whole and every output block sweeps it there.
    A larger one is cut into bands of output rows whose input fits in a quarter of L2; all
    output blocks are computed per band, so the weights are re-read per band, which costs less
    than it seems: they are one contiguous run the prefetchers follow, while an input re-read
    per output block jumps between channel blocks. (Measured on ResNet-50, one thread: on all
    six layers where a bytes-moved model picked blocks-outer instead, bands were faster.)
    """
    oh, _ = g.out_hw
    row_bytes = g.groups * g.nb * g.bi * (g.w + g.pad[1] + g.pad[3]) * 4
    if g.input_rows(oh) * row_bytes <= blocking.image_budget and g.groups * g.ob >= threads:
        return oh, False
    divisors = [d for d in range(1, oh + 1) if oh % d == 0 and g.input_rows(d) * row_bytes <= blocking.band_budget]
    vh = max(divisors) if divisors else 1
    # Enough bands that every thread gets the same number, where a divisor allows it.
    balanced = [d for d in divisors if (g.n * oh // d) % threads == 0]
    if balanced and g.n * oh // max(balanced) >= 2 * threads:
        vh = max(balanced)
    elif threads > 1 and (g.n * oh // vh) % threads and g.groups * g.ob >= 4 * threads:
        # Bands that do not split evenly leave a thread idle at the end (7 one-row bands on
        # 2 threads: 4 and 3); the threads split each band's output blocks instead. Measured
        # on 1024x14x14->2048 1x1 s2, 2 threads: 12% faster. Where bands do split evenly,
        # splitting them was 2-8% faster (one parallel region instead of one per band).
        return vh, False
    return vh, True


def output_blocks(g: Geometry, isa: Isa, mr: int) -> int:
    """Output blocks per tile: 2 where every tile of a row is short (4 to 14 pixels, as on the
    7- and 14-wide layers) and two blocks' accumulators fit in the registers, else 1. A short
    one-block tile has too few independent FMA chains to cover the FMA latency (7x16: 80% of
    peak in L1 on Zen 5, 7x32: 99%). Only groups = 1 layers with an even number of blocks."""
    if g.groups != 1 or g.ob % 2:
        return 1
    two = 2 * g.block
    ok = all(4 <= t and registers_needed(isa, t, two) <= isa.vector_registers for _, _, t in _segments(g.out_hw[1], mr))
    return 2 if ok else 1


def _render(g: Geometry, isa: Isa, mr: int, vh: int, band_parallel: bool,
            post: "PostOps", blocks: int = 1) -> tuple[str, list[tuple[str, ConvTile]]]:
    """TVMScript of the whole layer, and the (block name, tile) pairs to tensorize. blocks:
    output blocks per tile (output_blocks)."""
    oh, ow = g.out_hw
    (sh, sw), (dh, dw) = g.stride, g.dilation
    top, left = g.pad[0], g.pad[1]
    nbands = oh // vh
    bi, bo = g.bi, g.block
    ph, pw = g.input_rows(vh), g.input_cols(ow)
    icb = g.groups * g.nb
    L = [
        "@T.prim_func(s_tir=True)",
        f"def main(D: T.Buffer({g.data_shape}, 'float32'), Wt: T.Buffer({g.weight_shape}, 'float32'),"
        f"{post.params(g)} Out: T.Buffer({g.out_shape}, 'float32')):",
        "    T.func_attr({'tirx.noalias': True})",
        f"    for n, yb in T.grid({g.n}, {nbands}):" if not band_parallel
        else f"    for nyb in T.parallel({g.n * nbands}):",
        "        with T.sblock('band'):",
    ]
    if band_parallel:
        L.append(f"            vn = T.axis.spatial({g.n}, nyb // {nbands})")
        L.append(f"            vyb = T.axis.spatial({nbands}, nyb % {nbands})")
    else:
        L.append("            vn, vyb = T.axis.remap('SS', [n, yb])")
    full = lambda shape: ", ".join(f"0:{e}" for e in shape)  # noqa: E731
    # Spelled out: inferred, the band's reads would name its own scratch buffer P.
    L.append(f"            T.reads(D[vn, {full(g.data_shape[1:])}], Wt[{full(g.weight_shape)}]{post.band_reads(g, vh)})")
    L.append(f"            T.writes(Out[vn, 0:{g.out_shape[1]}, vyb * {vh}:vyb * {vh} + {vh}, {full(g.out_shape[3:])}])")
    if g.padded:
        L += [
            f"            P = T.alloc_buffer(({icb}, {ph}, {pw}, {bi}), 'float32')",
            f"            for q, r, x, i in T.grid({icb}, {ph}, {pw}, {bi}):",
            "                with T.sblock('pack'):",
            "                    vq, vr, vx, vi = T.axis.remap('SSSS', [q, r, x, i])",
            "                    P[vq, vr, vx, vi] = T.if_then_else(",
            f"                        0 <= vyb * {vh * sh} + vr - {top} and vyb * {vh * sh} + vr - {top} < {g.h}"
            f" and 0 <= vx - {left} and vx - {left} < {g.w},",
            f"                        D[vn, vq, vyb * {vh * sh} + vr - {top}, vx - {left}, vi], T.float32(0))",
        ]
    jobs = g.groups * g.ob // blocks
    o_loop = f"T.parallel({jobs})" if not band_parallel else f"T.serial({jobs})"
    L.append(f"            for o in {o_loop}:")
    L.append(f"                for yi in T.serial({vh}):")
    tensorized = []
    axes = reduce_axes(g.nb, g.kh, g.kw, bi)
    ep = post.epilogue
    for si, (start, count, t) in enumerate(_segments(ow, mr)):
        name = f"conv_{si}"
        # A one-pixel row or a one-element reduction (a 1x1 depthwise layer) has no tile to
        # run; that block stays plain TIR.
        tile = None
        if t >= 2 and axes:
            kern = GemmKernel(isa, t, bo * blocks, accumulate=False, batch_reduce=True, epilogue=ep,
                              col_block=bo if blocks > 1 else 0)
            tile = ConvTile(kern, g.nb, g.kh, g.kw, bi, sw, dh, dw, post.clip)
        loops, exts = (["tt", "m", "j"], [count, t, bo]) if t >= 2 else (["tt", "j"], [count, bo])
        if blocks > 1:
            loops.insert(1, "g")
            exts.insert(1, blocks)
        L.append(f"                    for {', '.join(loops)} in T.grid({', '.join(map(str, exts))}):")
        L.append(f"                        with T.sblock('{name}'):")
        if blocks > 1:
            # As for the columns below: the first block is an iterator of its own, so the
            # tile's inner bindings are exactly the description's (g, not o * 2 + g).
            L.append(f"                            vo0 = T.axis.spatial({g.groups * g.ob}, o * {blocks})")
            L.append(f"                            vg = T.axis.spatial({blocks}, g)")
            L.append(f"                            vyi = T.axis.spatial({vh}, yi)")
            vo = "vo0 + vg"
        else:
            L.append("                            vo, vyi = T.axis.remap('SS', [o, yi])")
            vo = "vo"
        # The tile's first column is an iterator of its own, so that splitting the block at
        # `m` leaves the inner bindings exactly the description's (m, not start + m).
        L.append(f"                            vx0 = T.axis.spatial({ow}, {start} + tt * {t})")
        if t >= 2:
            L.append(f"                            vm = T.axis.spatial({t}, m)")
        L.append(f"                            vj = T.axis.spatial({bo}, j)")
        # The reduction runs as plain loops inside the block, then the epilogue: the form of
        # the tile's description (intrinsics.f32_conv.element_body).
        v = {a: a for a, _ in axes}
        qg = f"vo // {g.ob} * {g.nb} + " if g.groups > 1 else ""  # groups > 1: one block per tile
        q = f"{qg}{v.get('q', '0')}"
        vx = "vx0 + vm" if t >= 2 else "vx0"
        col = f"({vx}) * {sw} + {v.get('s', '0')} * {dw}"
        if g.padded:  # P holds the band's rows only
            row = f"vyi * {sh} + {v.get('r', '0')} * {dh}"
            a_ref = f"P[{q}, {row}, {col}, {v.get('i', '0')}]"
        else:
            row = f"(vyb * {vh} + vyi) * {sh} + {v.get('r', '0')} * {dh}"
            a_ref = f"D[vn, {q}, {row}, {col}, {v.get('i', '0')}]"
        w_ref = f"Wt[{vo}, {v.get('q', '0')}, {v.get('r', '0')}, {v.get('s', '0')}, {v.get('i', '0')}, vj]"
        out_ref = f"Out[vn, {vo}, vyb * {vh} + vyi, {vx}, vj]"
        res_ref = f"Res[vn, {vo}, vyb * {vh} + vyi, {vx}, vj]" if ep.residual else None
        L += element_body(out_ref, a_ref, w_ref, axes, " " * 28, f"Bias[{vo}, vj]" if ep.bias else None,
                          res_ref, ep.act, post.clip)
        if tile:
            tensorized.append((name, tile))
    return "\n".join(L) + "\n", tensorized



class Conv2dOp(CompiledOp):
    """A compiled conv2d for fixed shapes. op(data, weight) on NCHW / OIHW numpy arrays.

    The fast path a model uses keeps everything blocked: pack the weights once with
    `op.pack_weights(weight)`, keep activations in `op.blocked_data_shape` (NCHW[x]c), and call
    `op.run_blocked(data_nchwc, packed_weight)`, which returns the NCHW[y]c output.
    """

    def __init__(self, geometry: Geometry, isa: Isa, lib, threads, plan: dict, post: PostOps = NO_POST_OPS,
                 emulate: bool = False):
        super().__init__(isa, lib, threads, emulate)
        self.geometry, self.plan, self.post = geometry, plan, post

    @property
    def flops(self) -> int:
        return self.geometry.flops

    @property
    def blocked_data_shape(self) -> tuple:
        return self.geometry.data_shape

    @property
    def blocked_weight_shape(self) -> tuple:
        return self.geometry.weight_shape

    @property
    def blocked_out_shape(self) -> tuple:
        return self.geometry.out_shape

    @property
    def bias_shape(self) -> tuple:  # what pack_bias returns
        return self.geometry.bias_shape

    def to_blocked(self, data: np.ndarray) -> np.ndarray:
        g = self.geometry
        check_array("data", data, (g.n, g.c, g.h, g.w), "float32")
        return layouts.to_nchwc(data, *self.data_layout)

    def from_blocked(self, out: np.ndarray) -> np.ndarray:
        check_array("out", out, self.blocked_out_shape, "float32")
        return layouts.from_nchwc(out, self.geometry.o, self.out_groups)

    def pack_weights(self, weight: np.ndarray) -> np.ndarray:
        g = self.geometry
        check_array("weight", weight, (g.o, g.cg, g.kh, g.kw), "float32")
        return layouts.pack_weights(weight, g.bi, g.block, g.groups)

    def pack_bias(self, bias: np.ndarray) -> np.ndarray:
        """(O,) -> (groups*OB, block), each group's channels zero-padded like the output."""
        g = self.geometry
        check_array("bias", bias, (g.o,), "float32")
        full = np.zeros((g.groups, g.ob * g.block), np.float32)
        full[:, :g.og] = bias.reshape(g.groups, g.og)
        return layouts.aligned(full.reshape(g.bias_shape))

    def _args(self, data_b, weight_b, bias_b=None, residual_b=None, out=None):
        check_operand("data", data_b, self.blocked_data_shape, "float32")
        check_operand("weight", weight_b, self.blocked_weight_shape, "float32")
        self._check_post(bias_b is not None, residual_b is not None)
        extra = []
        for label, arr, shape in (("bias", bias_b, self.bias_shape), ("residual", residual_b, self.blocked_out_shape)):
            if arr is not None:
                check_operand(label, arr, shape, "float32")
                extra.append(arr)
        if out is not None:
            check_operand("out", out, self.blocked_out_shape, "float32")
        return self._tensors((data_b, weight_b, *extra), self.blocked_out_shape, out)

    def _check_post(self, bias: bool, residual: bool) -> None:
        """A call passes exactly the post-op inputs the op was compiled for."""
        for label, given, on in (("bias", bias, self.post.bias), ("residual", residual, self.post.residual)):
            if on != given:
                raise ValueError(f"this conv2d was compiled {'with' if on else 'without'} a {label}: "
                                 f"{'pass' if on else 'do not pass'} {label}= ({self._post_hint()})")

    def _post_hint(self) -> str:
        p = self.post
        return f"bias={p.bias}, residual={p.residual}, activation={p.activation!r}"

    def run_blocked(self, data_b, weight_b, bias=None, residual=None, out=None):
        """Blocked in, blocked out. bias: op.pack_bias(b); residual: blocked output shape.
        Operands are numpy arrays or TVM tensors; aligned numpy memory (aligned_empty) is used
        in place, and the result is written into `out` when given (and returned)."""
        return self._run(self._args(data_b, weight_b, bias, residual, out))

    def __call__(self, data, weight, bias=None, residual=None, out=None):
        """NCHW data, OIHW weights, bias (O,), residual NCHW of the output's shape; returns NCHW
        (written into `out` when given). The layout transforms and the weight packing are
        compiled code; with weights reused across calls, `bind` packs them once."""
        return BoundConv2d(self, weight, bias, scratch=True)(data, residual, out)

    def bind(self, weight, bias=None) -> "BoundConv2d":
        """Pack OIHW `weight` (and `bias`) once; the result is f(x NCHW, residual=None, out=None)."""
        return BoundConv2d(self, weight, bias)

    def time(self, data_b, weight_b, number=10, repeat=5, cold=False, bias=None, residual=None) -> list[float]:
        """Seconds per call on blocked arrays, one entry per repeat (cold: caches flushed
        before each repeat, so use number=1)."""
        return self._time(self._args(data_b, weight_b, bias, residual), number, repeat, cold)

    # Layouts of the NCHW paths: (block, groups) of the blocked input, groups of the output.
    @property
    def data_layout(self) -> tuple[int, int]:
        return self.geometry.bi, self.geometry.groups

    @property
    def out_groups(self) -> int:
        return self.geometry.groups

    def packs_weights_compiled(self) -> bool:
        """pack_weights is the plain OIHW[x]i[y]o repacking, so layouts.compile_pack_weights
        can do it (not Winograd's transform, depthwise or block-diagonal weights)."""
        return type(self).pack_weights is Conv2dOp.pack_weights

    def _buffer(self, name: str):
        """A blocked buffer of the NCHW paths ("data", "out", "residual", "weight"), one per
        Python thread (ops may be called from several at once), made on first use."""
        local = self.__dict__.setdefault("_local", threading.local())
        buffers = local.__dict__.setdefault("buffers", {})
        if name not in buffers:
            shape = {"data": self.blocked_data_shape, "out": self.blocked_out_shape,
                     "residual": self.blocked_out_shape, "weight": self.blocked_weight_shape}[name]
            buffers[name] = tvm.runtime.empty(shape, "float32")
        return buffers[name]

    @functools.cached_property
    def transforms(self) -> dict:
        """Compiled layout transforms of this op's NCHW paths (built on first use), by name."""
        g = self.geometry
        block, groups = self.data_layout
        # A 1x1 strided layer without padding reads only every stride-th row and column of its
        # input: the others need no converting (a quarter of the pixels at stride 2).
        direct_1x1 = self.plan.get("algorithm") == "direct" and (g.kh, g.kw) == (1, 1) and not g.padded
        step = g.stride if direct_1x1 else (1, 1)
        out = {"to_blocked": layouts.compile_to_nchwc((g.n, g.c, g.h, g.w), block, groups, self.isa, step),
               "from_blocked": layouts.compile_from_nchwc(self.blocked_out_shape, g.o, self.out_groups, self.isa)}
        if self.post.residual:
            out["residual"] = layouts.compile_to_nchwc((g.n, g.o, *g.out_hw), g.block, self.out_groups, self.isa)
        if self.packs_weights_compiled():
            out["pack_weights"] = layouts.compile_pack_weights((g.o, g.cg, g.kh, g.kw), g.bi, g.block, g.groups,
                                                               self.isa)
        return out


class BoundConv2d:
    """A conv2d with its weights (and bias) packed once, kept as TVM tensors: call it on NCHW
    arrays. Per call: the input transform, the convolution and the output transform, all
    compiled code, through blocked buffers the op keeps per Python thread (the result is a
    fresh array unless `out` is given)."""

    def __init__(self, op: Conv2dOp, weight, bias=None, scratch: bool = False):
        """scratch: pack into the op's per-thread weight buffer instead of a new one (op(x, w),
        which packs on every call: a fresh 10 MB buffer cost more in page faults than the
        packing itself)."""
        g = getattr(op, "user_geometry", op.geometry)  # a grouped op's own layer, not its wider groups
        self.op = op
        self._in_shape, self._out_shape = (g.n, g.c, g.h, g.w), (g.n, g.o, *g.out_hw)
        if op.emulate:
            self.weight = op.pack_weights(weight)
            self.bias = None if bias is None else op.pack_bias(bias)
            return
        check_operand("weight", weight, (g.o, g.cg, g.kh, g.kw), "float32")
        op._check_post(bias is not None, op.post.residual)
        if op.packs_weights_compiled():
            self.weight = op._buffer("weight") if scratch else tvm.runtime.empty(op.blocked_weight_shape, "float32")
            src = user_operand(weight if isinstance(weight, tvm.runtime.Tensor) else np.ascontiguousarray(weight))
            op._prepare()
            op.transforms["pack_weights"](src, self.weight)
        else:  # Winograd's transform, depthwise and block-diagonal panels: numpy, once
            w = weight.numpy() if isinstance(weight, tvm.runtime.Tensor) else weight
            self.weight = tvm.runtime.tensor(op.pack_weights(w))
        self.bias = None if bias is None else tvm.runtime.tensor(op.pack_bias(bias))

    def __call__(self, data, residual=None, out=None):
        op = self.op
        check_operand("data", data, self._in_shape, "float32")
        op._check_post(self.bias is not None, residual is not None)
        if residual is not None:
            check_operand("residual", residual, self._out_shape, "float32")
        if op.emulate:  # the emulator runs the conv; the transforms are numpy's
            g = op.geometry
            res = None if residual is None else layouts.to_nchwc(residual, g.block, op.out_groups)
            y = op.from_blocked(op.run_blocked(op.to_blocked(data), self.weight, self.bias, res))
            return y if out is None else _store(out, y)
        if out is None:
            out = np.empty(self._out_shape, np.float32)
        else:
            check_operand("out", out, self._out_shape, "float32")
        op._prepare()
        t, xb, yb = op.transforms, op._buffer("data"), op._buffer("out")
        t["to_blocked"](user_operand(data), xb)
        args = [xb, self.weight] + ([self.bias] if self.bias is not None else [])
        if residual is not None:
            t["residual"](user_operand(residual), op._buffer("residual"))
            args.append(op._buffer("residual"))
        op._main()(*args, yb)
        t["from_blocked"](yb, user_operand(out))
        return out


def _store(out, y):
    check_operand("out", out, y.shape, "float32")
    if isinstance(out, tvm.runtime.Tensor):
        out.copyfrom(y)
    else:
        out[...] = y
    return out


def geometry(data_shape, weight_shape, stride=1, padding=0, dilation=1, groups=1, block=16) -> Geometry:
    """Validate a conv2d's arguments and return its sizes (raises ValueError/TypeError)."""
    n, c, h, w = _shape("data_shape", data_shape, 4)
    o, cg, kh, kw = _shape("weight_shape", weight_shape, 4)
    stride = _pair("stride", stride)
    dilation = _pair("dilation", dilation)
    pad = _padding(padding)
    groups = positive_int("groups", groups)
    if c % groups or o % groups:
        raise ValueError(f"groups={groups} must divide both the input channels ({c}) and the output channels ({o})")
    if cg != c // groups:
        raise ValueError(f"weight_shape[1] must be in_channels/groups = {c}/{groups} = {c // groups}, got {cg}")
    eh, ew = (kh - 1) * dilation[0] + 1, (kw - 1) * dilation[1] + 1
    if eh > h + pad[0] + pad[2] or ew > w + pad[1] + pad[3]:
        raise ValueError(f"the (dilated) kernel {eh}x{ew} is larger than the padded input "
                         f"{h + pad[0] + pad[2]}x{w + pad[1] + pad[3]}")
    g = Geometry(n, c, h, w, o, kh, kw, stride, pad, dilation, groups, block)
    # Before any planning: a padding of 10**9 must be refused here, not iterated over.
    check_elements(data=g.data_shape, weight=g.weight_shape, output=g.out_shape,
                   padded_input=(n, g.groups * g.nb, h + pad[0] + pad[2], w + pad[1] + pad[3], g.bi))
    return g


def conv2d(data_shape, weight_shape, stride=1, padding=0, dilation=1, groups=1, dtype="float32",
           target="native", algorithm="auto", threads=None,
           blocking: ConvBlocking = ConvBlocking(), input_zero_point=None, weight_zero_point=None,
           weight_dtype=None, tile=None, bias=False, residual=False, activation=None, clip=DEFAULT_CLIP,
           emulate=False):
    """Compile a conv2d for NCHW data of `data_shape` and OIHW weights of `weight_shape`.

    stride, dilation: int or (h, w). padding: int, (h, w) or (top, left, bottom, right).
    target: "x86-avx512", "x86-avx2" or "native" (float32), or "armv7-neon", "aarch64-neon",
    "aarch64-dotprod" (quantized: dtype "int8"/"uint8", int32 output of
    sum (x - input_zero_point) * (w - weight_zero_point); weight_dtype defaults to "int8";
    dtype "int16" takes data the legalize pass already widened). threads: TVM's pool size
    while it runs (None: one per core; the ARM targets run single-threaded).
    algorithm (float32, x86): "auto" (Winograd where it applies and measured faster, else
    direct; op.plan says which and why), "direct", or "winograd" with tile = 2, 4 or 6
    (F(tile x tile, 3 x 3); 3x3 kernels, stride 1, dilation 1, groups 1 only).
    bias, residual, activation, clip (float32, x86): post-ops fused into the output tiles'
    store (PostOps): out = activation(conv + bias + residual), activation None, "relu" or
    "clip" (to `clip`, ReLU6 by default); the op then takes op(data, weight, bias=, residual=).
    emulate (x86): calls run on the Bochs CPU, one thread: AVX-512 numerics on a host without it.
    Returns a Conv2dOp (x86; a WinogradConv2dOp for Winograd) or an Int8Conv2dOp (ARM):
    op(data, weight) -> NCHW output.
    """
    return schedule(data_shape, weight_shape, stride, padding, dilation, groups, dtype, target, algorithm, threads,
                    blocking, input_zero_point, weight_zero_point, weight_dtype, tile, bias, residual, activation,
                    clip, emulate).build()


@dataclass
class Scheduled:
    """A float32 conv2d scheduled and tensorized but not compiled: what the Relax integration
    puts into a model (`mod["main"]`), and what `build` compiles into an operator."""

    cls: type
    geometry: Geometry
    isa: Isa
    mod: tvm.IRModule
    plan: dict
    post: PostOps
    threads: int | None
    emulate: bool = False

    def build(self) -> Conv2dOp:
        return self.cls(self.geometry, self.isa, tvm.compile(self.mod, target=self.isa.target), self.threads,
                        self.plan, self.post, self.emulate)


def schedule(data_shape, weight_shape, stride=1, padding=0, dilation=1, groups=1, dtype="float32",
             target="native", algorithm="auto", threads=None, blocking: ConvBlocking = ConvBlocking(),
             input_zero_point=None, weight_zero_point=None, weight_dtype=None, tile=None, bias=False,
             residual=False, activation=None, clip=DEFAULT_CLIP, emulate=False):
    """conv2d's checks and planning without the compile (same arguments): a Scheduled on the
    x86 float32 targets; on ARM the compiled Int8Conv2dOp, whose build() returns itself."""
    if algorithm not in ("auto", "direct", "winograd"):
        raise ValueError(f"algorithm {algorithm!r} is not available; use 'auto', 'direct' or 'winograd'")
    if tile is not None and algorithm != "winograd":
        raise ValueError(f"tile={tile!r} applies to algorithm='winograd' only")
    dtype = dtype_name("dtype", dtype)
    weight_dtype = dtype_name("weight_dtype", weight_dtype)
    threads = thread_count(threads)
    isa = resolve(target)
    emulate = check_emulate(emulate, isa)
    if isa.arch != "x86":
        if algorithm == "winograd":
            raise ValueError("algorithm='winograd' is an x86 float32 path; the ARM targets run the quantized spatial pack")
        if weight_dtype is None:
            weight_dtype = "int16" if dtype == "int16" else "int8"
        if bias or residual or activation is not None:
            raise ValueError("bias, residual and activation are fused on the x86 float32 conv2d only")
        zps = (0 if input_zero_point is None else input_zero_point, 0 if weight_zero_point is None else weight_zero_point)
        g = geometry(data_shape, weight_shape, stride, padding, dilation, groups, block=conv_kernel(isa).nr)
        return conv2d_int8(g, isa, dtype, weight_dtype, *zps)
    if dtype != "float32":
        hint = " (quantized conv2d runs on the ARM targets: armv7-neon, aarch64-neon, aarch64-dotprod)" \
            if dtype in ("int8", "uint8") else ""
        raise ValueError(f"dtype {dtype!r} is not supported on x86 targets; use 'float32'{hint}")
    if input_zero_point is not None or weight_zero_point is not None or weight_dtype is not None:
        raise ValueError("zero points and weight_dtype apply to quantized (ARM) conv2d only")
    post = PostOps(bias, residual, activation, clip)
    mr, nr = DEFAULT_TILES[isa.name]
    g = geometry(data_shape, weight_shape, stride, padding, dilation, groups, block=nr)
    pool = threads or os.cpu_count() or 1  # the threads the plan divides work among
    reason = None
    if algorithm != "direct":
        from . import winograd  # it builds on this module

        if algorithm == "auto":
            tile, reason = winograd.choose(g)
        elif tile is None:
            tile = 4
        if tile is not None:
            mod, plan = winograd.schedule_winograd(g, isa, tile, pool, blocking, post)
            plan["reason"] = reason or "algorithm='winograd'"
            return Scheduled(winograd.WinogradConv2dOp, g, isa, mod, plan, post, threads, emulate)
    from . import depthwise  # it builds on this module

    if depthwise.applies(g):
        mod, plan = depthwise.schedule_depthwise(g, isa, pool, blocking, post)
        plan["reason"] = "groups = input channels: the depthwise kernel"
        return Scheduled(depthwise.DepthwiseConv2dOp, g, isa, mod, plan, post, threads, emulate)
    cls, user = Conv2dOp, g
    if _super_groups(g) is not None:  # small groups: blocks of 16 channels with block-diagonal weights
        g = _super_groups(g)
        cls = functools.partial(GroupedConv2dOp, user_geometry=user)
    vh, band_parallel = _bands(g, blocking, pool)
    blocks = output_blocks(g, isa, mr)
    text, tiles = _render(g, isa, mr, vh, band_parallel, post, blocks)
    func = parser.parse(text, extra_vars={"T": T})
    sch = s_tir.Schedule(func)
    for name, tile in tiles:
        blk = sch.get_sblock(name)
        loops = sch.get_loops(blk)
        sch.tensorize(loops[-3 if blocks > 1 else -2], register_conv(tile))  # the tile's ([g,] m, j) loops
    if g.padded:
        sch.vectorize(sch.get_loops(sch.get_sblock("pack"))[-1])
    plan = {"algorithm": "direct", "reason": reason or "algorithm='direct'", "mr": mr, "output_blocks": blocks,
            "band_rows": vh, "band_parallel": band_parallel,
            "segments": _segments(g.out_hw[1], mr)}
    if user is not g:
        plan["block_diagonal"] = f"{user.groups} groups of {user.cg} channels as {g.groups} of {g.cg}"
    return Scheduled(cls, g, isa, sch.mod, plan, post, threads, emulate)


def _super_groups(g: Geometry) -> Geometry | None:
    """A grouped layer whose groups are narrower than a block (ResNeXt's 4 or 8 channels per
    group), as groups of whole 16-channel blocks: each spans 16 / cg of the layer's groups, and
    its weight panel is block-diagonal (zeros between groups). The tiles then do 16 / cg times
    the layer's multiply-adds, where padding each group's input and output channels to a block
    did (16 / cg) * (16 / og) times. None when the layer is not of that kind."""
    b = g.block
    if not (1 < g.cg < b and b % g.cg == 0 and g.og % g.cg == 0 and g.c % b == 0):
        return None
    span = b // g.cg  # layer groups per block
    return Geometry(g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.stride, g.pad, g.dilation, g.groups // span, b)


class GroupedConv2dOp(Conv2dOp):
    """A grouped conv2d run as wider groups with block-diagonal weights (_super_groups): takes
    the layer's own OIHW weights (O, C/groups, KH, KW); `user_geometry` is the layer as given."""

    def __init__(self, geometry, isa, lib, threads, plan, post=NO_POST_OPS, emulate=False, *, user_geometry):
        super().__init__(geometry, isa, lib, threads, plan, post, emulate)
        self.user_geometry = user_geometry

    @property
    def flops(self) -> int:  # the layer's, not the zeros of the block-diagonal panels
        return self.user_geometry.flops

    def pack_weights(self, weight: np.ndarray) -> np.ndarray:
        u, g = self.user_geometry, self.geometry
        check_array("weight", weight, (u.o, u.cg, u.kh, u.kw), "float32")
        wide = np.zeros((g.o, g.cg, g.kh, g.kw), np.float32)
        o = np.arange(u.o)
        group = o // u.og  # the layer's group of each output channel
        first = group * u.cg % g.cg  # where that group's channels start inside its block
        for j in range(u.cg):
            wide[o, first + j] = weight[:, j]
        return layouts.pack_weights(wide, g.bi, g.block, g.groups)
