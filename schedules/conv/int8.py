"""Quantized conv2d, spatial pack, tensorized on an integer tile: the NEON MAC tiles on ARM, the
x86 tiles (vpdpbusd with VNNI, the int16 vpmaddwd upcast without) on x86.

Computes out[n, o, y, x] = sum (x_in - zp_x) * (w - zp_w) in int32, from int8/uint8 data and
weights. Three stages, as in TVM's ARM spatial-pack schedule:
    pack (data_vec):   x - zp_x widened to int16, zero-padded (a padded pixel is the zero point,
                       so it contributes 0), channels last: (N, G, Hp, Wp, Cp)
    conv (conv_vec):   MR pixels x NR output channels per tile, the tile's whole reduction
                       (KH calls of K = KW*Cp, the row's columns back to back) on the kernel;
                       the output row is padded up to a multiple of MR, so no tail tiles
    unpack:            the int32 tiles back to NCHW
The weights are widened and packed once, outside, by `pack_weights` (kernel_vec): w - zp_w as
int16, (G, O/NR, KH, KW, Cp, NR). Upcasting to int16 here, at the schedule, keeps the weights int8
in the model; `relax_int8.legalize_int8_conv2d` is the other design point (upcast in the graph).

On aarch64-dotprod the tile is `sdot`, which multiplies int8 by int8 as they are: the zero
points cannot be subtracted while packing (x - zp_x need not fit int8). It uses the expansion
    sum (x - zx)(w - zw) = sum x*w - zw * sum x - zx * sum w + K * zx * zw
with uint8 shifted to int8 first (x - 128, zx - 128): sdot computes sum x*w, a small pass sums each
window's inputs (sum x, 1/O of the conv's work), and sum w comes with the packed weights as a
per-channel bias. Padding holds the zero point, so it cancels in the expansion as it should.

Depthwise layers (groups = in = out channels) skip the GEMM: channels sit in vector lanes and
each tap is one `vmlal.s16` over 8 channels, so nothing is padded to a tile.

x86 VNNI (vpdpbusd) multiplies uint8 by int8 as they are, so it takes the sdot expansion too,
shifting int8 data to uint8 instead (x + 128); its weights are int8 (uint8 weights shift by -128).
The int16 upcast tile (vpmaddwd) packs x - zp_x and w - zp_w as int16, as the NEON MAC does; its
B goes in pairs of k. On x86 the int32 accumulators then leave through the unpack, where the
output is requantized (Quantization: round half to even, + zero point, saturate; or dequantized
to float32) on its way back to NCHW, and the tiles, the pack and the unpack run on all threads.

On the int16 upcast (x86 without VNNI), 3x3 stride-1 layers run as Winograd
F(2x2, 3x3) in integers (`winograd`): B^T (x - zp_x) B of each 4x4 input tile and
(2G) (w - zp_w) (2G)^T, G doubled so it has no halves, are integers that fit int16, so the 16
GEMMs of the transformed values run on the same vpmaddwd tile (as one 1x1 layer of 16 groups),
and the output transform A^T M A, 4x the conv, is divided by 4 exactly. 2.25x fewer products
than the direct conv, exact while the channels stay within winograd_max_channels. (vpdpbusd
multiplies 8-bit values, which the transformed ones are not: the VNNI ISAs stay direct.) Layers
of an odd channel count whose stride starts every window on an even value of the padded row
(the 3-channel stem at stride 2) read those rows as pairs of values (`paired`), so the upcast's
K pairs take no padded channel.

ARM code is compiled here and, since this host is x86, run under qemu-user (`emulate`); x86
code runs natively, or on the Bochs CPU with emulate=True.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import s_tir

from intrinsics.beta0 import drop_dead_inits
from intrinsics.int_conv import IntConvTile, register_int_conv, thread_setup
from microkernels import AMX_INT8, AVX2, AVX512, AVX512_VNNI, Isa
from microkernels.int_amx import K_DEPTH, TILE_ROWS, AmxGemmKernel, amx_tiles
from microkernels.int_gemm import DEFAULT_TILES, IntGemmKernel
from microkernels.int_gemm import max_tiles as x86_int_tiles
from microkernels.int_mac import MacKernel, default_mac_kernel

from ..common.targets import (
    check_array,
    check_elements,
    int_target,
    require_host,
    set_threads,
)
from ..common.tir import buffer, ceil_to, header, padded_pack, parse
from ..emulation import bochs, qemu
from .geometry import NO_POST_OPS, Geometry, PostOps, Quantization

# |x - zp_x| and |w - zp_w| are at most 255 for 8-bit data, so each product is at most 65025 in
# magnitude, and a sum of K of them is exact in int32 while K * 65025 <= 2**31 - 1.
MAX_PRODUCT = 255 * 255
MAX_K = (2**31 - 1) // MAX_PRODUCT  # 33025
# The sdot expansion adds four terms, each at most 128 * 128 * K in magnitude (the bias two of them):
# every partial sum is exact while 4 * 16384 * K <= 2**31 - 1.
MAX_K_DOT = (2**31 - 1) // (4 * 128 * 128)  # 32767
# vpdpbusd's uint8 x int8 terms are at most 255 * 128 each; four such sums (data x weights, the
# window sums times zp_w, the bias's two) stay exact while 4 * 32640 * K <= 2**31 - 1.
MAX_K_VNNI = (2**31 - 1) // (4 * 255 * 128)  # 16448
ZERO_POINT_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (0, 0)}
DEPTHWISE_LANES = 8  # int16 channels per q register (ARM); x86: Int8Plan.lanes
MAX_CHUNKS = 64  # parallel chunks of a tile-local layer (Int8Plan.chunks)
MAX_FLOAT_TAPS = 2**24 // MAX_PRODUCT  # 258: float32 sums of integer products exact (Int8Plan.float_taps)
SPACE_TO_DEPTH, SUBSAMPLED, WINOGRAD, PAIRED = "space-to-depth", "subsampled", "winograd", "paired"  # Int8Plan.form
# Winograd F(2x2, 3x3) in integers (winograd): B^T d B sums four data values and (2G) w (2G)^T
# nine weights, so both fit int16; every partial sum of the 16 GEMMs and of the output
# transform, evaluated as written, is at most WINOGRAD_GROWTH * C * max|x - zp_x| * max|w - zp_w|
# in magnitude (the GEMM's 36 per channel: |B^T d B| <= 4 max|d|, |(2G) w (2G)^T| <= 9 max|w|;
# the output transform's first stage at most the sum of three such, 4 * 3 * (2 + 3 + 3) = 96).
WINOGRAD_GROWTH = 96
WINOGRAD_MIN_CHANNELS = 16  # below, the transforms cost more than the 2.25x fewer products save


def zero_point(name: str, zp, dtype: str) -> int:
    if isinstance(zp, (bool, np.bool_)) or not isinstance(zp, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(zp).__name__}")
    lo, hi = ZERO_POINT_RANGE[dtype]
    if not lo <= zp <= hi:
        what = "int16 data is already zero-point free (the legalized form)" if dtype == "int16" else f"{dtype} values"
        raise ValueError(f"{name}={zp} is out of range for {dtype}: must lie in [{lo}, {hi}] ({what})")
    return int(zp)


@dataclass(frozen=True)
class Int8Plan:
    """Sizes of the packed buffers for one layer (g: the validated conv2d Geometry)."""

    g: object
    kern: MacKernel | IntGemmKernel | AmxGemmKernel
    depthwise: bool
    output_dtype: str = "int32"
    bias: bool = False  # a per-channel int32 Bias input: the expansion's terms and the user's bias
    activation: str | None = None  # None or "relu" (8-bit: the lower bound raised to the zero point)
    zp_out: int = 0
    windows: bool = True  # the -zw * sum x term: only where the tile's weights' zero point is not 0
    parallel: bool = False  # all threads (x86); ARM runs single-threaded under qemu
    nhwc: bool = False  # data and output channels-last (x86 GEMM path): no transposes in pack and unpack
    # A fused quantized residual add, (ratio of y, ratio of r, r's zero point, the sum's zero
    # point) as Quantization.residual_ratios and its zero points give them; R takes Out's shape.
    residual: tuple | None = None
    # The layer as given where `g` is another form of it (`form`: space_to_depth's, a 1x1
    # stride-s layer's subsampled one, Winograd's GEMMs, paired's rows of pairs): the pack reads
    # the data in this one's shape.
    source: object = None
    form: str | None = None

    @property
    def dot(self) -> bool:
        """The tile multiplies 8-bit values as they are (sdot, vpdpbusd): zero points go through
        the expansion, not the pack."""
        return not self.depthwise and self.kern.group == 4

    @property
    def group(self) -> int:
        return 1 if self.depthwise else self.kern.group

    def in_place(self, dtype: str) -> bool:
        """Whether the packed input is the data itself: a channels-last 1x1 stride-1 layer without
        padding or groups whose rows are whole tiles, on a raw 8-bit tile that takes the data's
        dtype (nothing to widen, shift or pad). ResNet's and MobileNet's 1x1 layers are."""
        g = self.g
        return (self.source is None and self.nhwc and self.parallel and self.dot and dtype == self.packed_dtype
                and g.kh == g.kw == 1
                and g.stride == (1, 1) and not any(g.pad) and g.groups == 1 and self.cp == g.c
                and self.ow_padded == g.w)

    @property
    def tile_local(self) -> bool:
        """Whether the tiles' accumulators live in one scratch tile per chunk of parallel tasks
        (MR x NR int32, reused by every tile of the chunk, so it stays in L1) and leave
        requantized right after each tile's reduction (`_tile_store`), instead of in an int32
        copy of the whole output: channels-last x86 GEMM layers without window sums (weights'
        zero point 0, as quantizers write them)."""
        return (self.nhwc and self.parallel and not self.depthwise and not (self.dot and self.windows)
                and self.form != WINOGRAD)

    @property
    def pitch(self) -> int:
        """Padded input pixels per row where the tiles run over the packed rows laid back to back
        (IntConvTile.pitch), else 0: tile-local layers of stride 1 without dilation whose kernel
        has more than one row, on a batch-reduce tile (AMX). A tile of MR pixels then spans output
        rows, so a 7- or 14-pixel row no longer caps it at 7 or 14 rows (an AMX tile of 7 runs at
        half the rate of one of 16, and the weights it streams serve half the pixels); the
        columns of the padding it computes on the way are not stored. Not for a space-to-depth
        form (Int8Plan.source), whose pack is its own."""
        g = self.g
        if self.tile_local and self.kern.batch_reduce and flat_rows(g) and self.source is None:
            return g.w + g.pad[1] + g.pad[3]
        return 0

    @property
    def rows_outer(self) -> bool:
        """Whether a thread's tasks run over rows outermost (_task_parts): tile-local layers whose
        packed weights take fewer bytes than their packed input."""
        if not self.tile_local:
            return False
        return int(np.prod(self.weight_shape)) <= int(np.prod(self.packed_shape))

    @property
    def task_rows(self) -> int:
        """Rows of tiles per image, group and output block: output rows, or with a pitch, tiles of
        the flat run of OH x pitch output positions."""
        if self.pitch:
            return -(-self.g.out_hw[0] * self.pitch // self.kern.mr)
        return self.g.out_hw[0]

    @property
    def rows(self) -> bool:
        """Depthwise on x86: NCHW as it is, a row of pixels in the vector lanes (`_render_depthwise_rows`)."""
        return self.depthwise and self.parallel and not self.nhwc

    @property
    def lanes(self) -> int:
        """Lanes of the depthwise path: 8 int16 channels (a q register) on ARM; on x86 the int32
        accumulators of one register, pixels of a row."""
        isa = self.kern.isa
        return DEPTHWISE_LANES if isa.arch != "x86" else isa.lanes

    @property
    def why(self) -> str:
        """Which tile runs the layer, and why that one."""
        kern = self.kern
        if self.rows:
            return f"depthwise: a row's pixels in vector lanes, int16 taps ({kern.isa.name}), no GEMM tile"
        if self.float_taps:
            return (f"depthwise: channels in vector lanes, float32 FMA taps on the 8-bit data (exact: at most "
                    f"{MAX_FLOAT_TAPS} taps), no GEMM tile")
        if self.depthwise:
            return f"depthwise: channels in vector lanes, int16 taps ({kern.isa.name}), no GEMM tile"
        form = {SPACE_TO_DEPTH: f"; stride 2 as space-to-depth: a {self.g.kh}x{self.g.kw} stride-1 conv on "
                                f"{self.g.c} channels (2 x 2 pixels of {self.source.c})" if self.source else "",
                SUBSAMPLED: "; the strided pixels packed into one row of a 1x1 stride-1 layer",
                PAIRED: (f"; {self.source.c} channels at stride {self.source.stride[1]} as a conv over the padded rows "
                         f"read as pairs of values: a kernel row's {self.source.kw * self.source.c} values one K of "
                         f"{self.g.kw * 2} (channels padded to {self.source.c + 1} would take "
                         f"{self.source.kw * (self.source.c + 1)})") if self.source else "",
                WINOGRAD: f"; Winograd F(2x2, 3x3) in integers: the data's 4x4 tiles and the weights "
                          f"transformed exactly into int16, 16 GEMMs of {self.g.h * self.g.w} tiles x "
                          f"{self.g.cg} -> {self.g.og} channels, the output transform in int32 and / 4 exact "
                          f"(2.25x fewer products than the direct conv)",
                None: ""}[self.form]
        if isinstance(kern, AmxGemmKernel):
            return (f"{kern.name}: AMX tdpbusd, {kern.a_tiles} x {kern.b_tiles} tiles of {kern.rows} pixels x 16 "
                    f"channels, uint8 x int8 as they are, zero points through the expansion, channels padded "
                    f"{self.g.cg} -> {self.cp} (K in steps of {K_DEPTH}){form}")
        if isinstance(kern, IntGemmKernel) and kern.op == "u8s8":
            return (f"{kern.name}: vpdpbusd ({kern.isa.name}), uint8 x int8 as they are, zero points through "
                    f"the expansion{form}")
        if isinstance(kern, IntGemmKernel):
            return (f"{kern.name}: the int16 upcast, vpmaddwd on x - zp_x and w - zp_w packed once "
                    f"({kern.isa.name}: no VNNI asked for or available, or int16 data){form}")
        return f"{kern.name}: NEON integer tile"

    @property
    def float_taps(self) -> bool:
        """Depthwise channels-last on x86: the taps multiply in float32, the data as it is (8-bit,
        padded with its zero point, widened and converted as it is read) by w - zp_w packed as
        float32, summed by FMA exactly (each product is an integer of at most 255 * 255 in
        magnitude, so up to MAX_FLOAT_TAPS of them sum below 2**24); -zp_x * sum(w - zp_w) joins
        the bias, as the expansion of the dot tiles. x86 has no 16-lane int32 multiply-add: the
        int16 taps took two widenings and a vpmulld (two µops, ten cycles' latency) each, 0.29 ms
        for MobileNetV2's 96-channel 112x112 stride-2 layer. Packing float32 instead cost more
        than it saved: four bytes per input value, 4.9 MB for that layer, past the L2."""
        g = self.g
        return self.depthwise and self.parallel and self.nhwc and g.kh * g.kw <= MAX_FLOAT_TAPS

    @property
    def packed_dtype(self) -> str:
        """The packed input's (A's) element type (with float taps, the data's own: None here,
        `pack_dtype(dtype)`)."""
        return self.kern.a_dtype

    def pack_dtype(self, dtype: str) -> str:
        """The packed input's element type for data of `dtype`."""
        return dtype if self.float_taps else self.packed_dtype

    @property
    def weight_dtype(self) -> str:
        return "float32" if self.float_taps else self.kern.b_dtype

    @property
    def expands(self) -> bool:
        """Whether pack_weights returns per-channel terms of the zero points' expansion, which
        join the bias (the raw-8-bit tiles, float taps)."""
        return self.dot or self.float_taps

    @property
    def acc_dtype(self) -> str:
        return "float32" if self.float_taps else "int32"

    @property
    def cp(self) -> int:
        """Packed channels per group: the fewest >= C/groups that make one kernel call's K (a
        whole kernel row when dw = 1, one column otherwise) a multiple of the kernel's K step
        (and whole groups of 4 for sdot)."""
        if self.depthwise:
            return 1
        span = self.g.kw if self.g.dilation[1] == 1 else 1
        cp = self.g.cg
        while (span * cp) % self.kern.k_step or cp % self.group:
            cp += 1
        return cp

    @property
    def op(self) -> int:  # packed output channels per group
        return ceil_to(self.g.og, self.kern.nr)

    @property
    def ow_padded(self) -> int:
        if self.pitch:
            return self.kern.mr  # one tile per row of tiles (task_rows)
        if self.rows:
            return ceil_to(self.g.out_hw[1], self.lanes)
        return self.g.out_hw[1] if self.depthwise else ceil_to(self.g.out_hw[1], self.kern.mr)

    @property
    def data_shape(self) -> tuple:
        g = self.source or self.g
        return (g.n, g.h, g.w, g.c) if self.nhwc else (g.n, g.c, g.h, g.w)

    @property
    def layer(self):
        """The Geometry whose output channels and pixels the module writes: the layer as given
        for Winograd (whose `g` is its 16 GEMMs), else `g`."""
        return self.source if self.form == WINOGRAD else self.g

    @property
    def out_shape(self) -> tuple:
        g = self.layer
        return (g.n, *g.out_hw, g.o) if self.nhwc else (g.n, g.o, *g.out_hw)

    @property
    def packed_shape(self) -> tuple:
        """The packed input: (N, Hp, Wp, C in whole vectors) for depthwise, (N, G, Hp, Wp, Cp) otherwise."""
        g, (hp, wp) = self.g, self.packed_hw
        if self.pitch:  # the padded rows back to back, and what the last tile's window reads past them
            k = self.task_rows * self.kern.mr + (g.kh - 1) * self.pitch + g.kw - 1
            return (g.n, g.groups, k, self.cp)
        if self.rows:  # columns by their phase modulo the stride: a strided row becomes a contiguous one
            sw = g.stride[1]
            return (g.n, g.c, sw, hp, -(-wp // sw))
        if self.depthwise:
            return (g.n, hp, wp, ceil_to(g.c, self.lanes))
        return (g.n, g.groups, hp, wp, self.cp)

    @property
    def packed_hw(self) -> tuple[int, int]:
        g, (oh, _) = self.g, self.g.out_hw
        (sh, sw), (dh, dw) = g.stride, g.dilation
        return (oh - 1) * sh + (g.kh - 1) * dh + 1, (self.ow_padded - 1) * sw + (g.kw - 1) * dw + 1

    @property
    def tasks(self) -> int:
        """Parallel tasks of the GEMM path: one per image, group, output block and output row (with
        a pitch, tile)."""
        g = self.g
        return g.n * g.groups * (self.op // self.kern.nr) * self.task_rows

    @property
    def chunks(self) -> int:
        """With tile_local, the parallel loop's extent: the tasks in this many equal chunks, each
        run in turn by one thread with its own tile of accumulators. The largest divisor of the
        task count up to MAX_CHUNKS: enough to balance the threads, few enough to keep the
        accumulator tiles small."""
        return max(d for d in range(1, min(self.tasks, MAX_CHUNKS) + 1) if self.tasks % d == 0)

    @property
    def acc_shape(self) -> tuple:
        """The int32 accumulators: (N, Ho, Wo, C in whole vectors) for depthwise; with tile_local
        one MR x NR tile per chunk of tasks (chunks, MR, NR); else per group and output block,
        each row padded to whole tiles (N, G, OB, Ho, Wo padded, NR)."""
        if self.tile_local:
            return (self.chunks, self.kern.mr, self.kern.nr)
        g, (oh, ow) = self.g, self.g.out_hw
        if self.rows:
            return (g.n, g.c, oh, self.ow_padded)
        if self.depthwise:
            return (g.n, oh, ow, self.packed_shape[-1])
        return (g.n, g.groups, self.op // self.kern.nr, oh, self.ow_padded, self.kern.nr)

    @property
    def weight_shape(self) -> tuple:
        g = self.g
        if self.rows:
            return (g.c, g.kh, g.kw)
        if self.depthwise:
            return (g.kh, g.kw, ceil_to(g.c, self.lanes))
        if self.group > 1:
            gk = self.group
            return (g.groups, self.op // self.kern.nr, g.kh, g.kw, self.cp // gk, self.kern.nr, gk)
        return (g.groups, self.op // self.kern.nr, g.kh, g.kw, self.cp, self.kern.nr)

    @property
    def bias_shape(self) -> tuple:
        return (self.layer.groups, self.layer.og)


def data_shift(plan: Int8Plan, dtype: str) -> int:
    """What the pack adds to `dtype` data so a raw-8-bit tile can take it: uint8 - 128 for sdot's
    int8, int8 + 128 for vpdpbusd's uint8; 0 where the dtype already fits (or the pack widens)."""
    if not plan.dot or dtype == plan.packed_dtype:
        return 0
    return -128 if dtype == "uint8" else 128


def weight_shift(dtype: str) -> int:
    """What turns weights of `dtype` into the int8 a raw-8-bit tile takes: uint8 - 128."""
    return 128 if dtype == "uint8" else 0


def pack_weights(plan: Int8Plan, weight: np.ndarray, zp_w: int, zp_x8: int = 0) -> tuple:
    """OIHW int8/uint8 (or int16, zero point already out) -> the packed weight arrays:
    (kernel_vec,) with int16 w - zp_w; for the raw-8-bit tiles (int8 kernel_vec, int32 bias),
    where weights and zp_w are shifted to int8 and bias = -zp_x8 * sum w + K * zp_x8 * zp_w
    (zp_x8: the data's zero point as the tile sees it, after data_shift)."""
    if plan.form == SPACE_TO_DEPTH:
        weight = space_to_depth_weights(weight)
    if plan.form == WINOGRAD:
        return (_pack_gemm_weights(plan, winograd_weights(weight, zp_w), np.int16),)
    g = plan.g
    if plan.dot:
        shift = weight_shift(str(weight.dtype))
        w8 = (weight.astype(np.int16) - shift).astype(np.int8)
        zw8 = zp_w - shift
        k = g.cg * g.kh * g.kw
        sums = w8.astype(np.int64).reshape(g.o, -1).sum(axis=1)
        bias = (-zp_x8 * sums + k * zp_x8 * zw8).astype(np.int32).reshape(plan.bias_shape)
        return _pack_gemm_weights(plan, w8, np.int8), bias
    w = weight.astype(np.int16) - np.int16(zp_w)
    if plan.form == PAIRED:
        w = paired_weights(w, plan.g.kw)
    if plan.rows:
        return (np.ascontiguousarray(w[:, 0]),)
    if plan.depthwise:
        out = np.zeros(plan.weight_shape, plan.weight_dtype)
        out[:, :, : g.c] = w[:, 0].transpose(1, 2, 0)
        if plan.float_taps:  # the zero point of the data, which the pack leaves in, out through the bias
            bias = (-zp_x8 * w.astype(np.int64).reshape(g.o, -1).sum(axis=1)).astype(np.int32)
            return out, bias.reshape(plan.bias_shape)
        return (out,)
    return (_pack_gemm_weights(plan, w, np.int16),)


def _pack_gemm_weights(plan: Int8Plan, w: np.ndarray, dtype) -> np.ndarray:
    g, nr = plan.g, plan.kern.nr
    # (G, og, cg, KH, KW) -> (G, og_padded, KH, KW, cg) -> blocks of NR output channels
    wg = w.reshape(g.groups, g.og, g.cg, g.kh, g.kw).transpose(0, 1, 3, 4, 2)
    full = np.zeros((g.groups, plan.op, g.kh, g.kw, plan.cp), dtype)
    full[:, : g.og, :, :, : g.cg] = wg
    blocks = full.reshape(g.groups, plan.op // nr, nr, g.kh, g.kw, plan.cp)
    if plan.group > 1:  # channels in groups of G innermost, as sdot / vpdpbusd / vpmaddwd multiply them
        gk = plan.group
        blocks = blocks.reshape(*blocks.shape[:5], plan.cp // gk, gk).transpose(0, 1, 3, 4, 5, 2, 6)
    else:
        blocks = blocks.transpose(0, 1, 3, 4, 5, 2)
    return np.ascontiguousarray(blocks)


def _header(plan: Int8Plan, dtype: str) -> list[str]:
    """The entry function of either path, with the packed input P and the int32 accumulators.
    Arguments: data, packed weights, [Bias (G, O/G) int32], [M (O,) float32 multipliers],
    [R, the residual, Out's shape and dtype], Out."""
    requant = plan.output_dtype != "int32"
    L = header([buffer("D", plan.data_shape, dtype), buffer("Wv", plan.weight_shape, plan.weight_dtype),
                *([buffer("Bias", plan.bias_shape, "int32")] if plan.bias else []),
                *([buffer("M", (plan.layer.o,), "float32")] if requant else []),
                *([buffer("R", plan.out_shape, plan.output_dtype)] if plan.residual else []),
                buffer("Out", plan.out_shape, plan.output_dtype)])
    if plan.in_place(dtype):  # the data is the packed input already: a view, no pack
        packed = f"    P = T.decl_buffer({plan.packed_shape}, '{plan.packed_dtype}', data=D.data)"
    elif plan.form in (SPACE_TO_DEPTH, WINOGRAD):
        # The padded source (S, _render_space_to_depth_pack, _render_winograd_pack) shares P's
        # allocation: allocated on its own it dies before the tiles run, and TVM's storage
        # rewrite then lends its memory to the int32 accumulators, which the tiles' access
        # pointers refuse.
        p_elems = int(np.prod(plan.packed_shape))
        s_shape = space_to_depth_source_shape(plan) if plan.form == SPACE_TO_DEPTH else winograd_source_shape(plan)
        dt = plan.packed_dtype
        packed = "\n".join([f"    PS = T.alloc_buffer(({p_elems + int(np.prod(s_shape))},), '{dt}')",
                             f"    P = T.decl_buffer({plan.packed_shape}, '{dt}', data=PS.data)",
                             f"    S = T.decl_buffer({s_shape}, '{dt}', data=PS.data, elem_offset={p_elems})"])
    elif plan.form == PAIRED:
        # Flat views of P's rows and, channels-last, of the data's: the pack is a copy of rows.
        n, _, hp, wp, cp = plan.packed_shape
        src = plan.source
        packed = "\n".join([f"    P = T.alloc_buffer({plan.packed_shape}, '{plan.packed_dtype}')",
                             f"    PF = T.decl_buffer(({n}, {hp}, {wp * cp}), '{plan.packed_dtype}', data=P.data)",
                             *([f"    DF = T.decl_buffer(({src.n}, {src.h}, {src.w * src.c}), '{dtype}', data=D.data)"]
                               if plan.nhwc else [])])
    else:
        packed = f"    P = T.alloc_buffer({plan.packed_shape}, '{plan.pack_dtype(dtype)}')"
    return L + [packed, f"    Acc = T.alloc_buffer({plan.acc_shape}, '{plan.acc_dtype}')"]


def _widened(x: str, zp: int) -> str:
    """TVMScript of the 8-bit value `x` as the upcast packs it: int16, less the zero point."""
    return f"T.Cast('int16', {x})" + (f" - T.int16({zp})" if zp else "")


def _render_pack(plan: Int8Plan, dtype: str, zp: int) -> list[str]:
    """The pack stage into `plan.packed_shape`."""
    if plan.form == SPACE_TO_DEPTH:
        return _render_space_to_depth_pack(plan, dtype, zp)
    if plan.form == SUBSAMPLED:
        return _render_subsampled_pack(plan, dtype, zp)
    if plan.form == WINOGRAD:
        return _render_winograd_pack(plan, dtype, zp)
    if plan.form == PAIRED:
        return _render_paired_pack(plan, dtype, zp)
    g = plan.g
    top, left = g.pad[0], g.pad[1]
    conds = [f"{top} <= vy", f"vy < {top + g.h}", f"{left} <= vx", f"vx < {left + g.w}"]
    if plan.packed_shape[-1] != (g.c if plan.depthwise else g.cg):
        conds.insert(0, f"vc < {g.c if plan.depthwise else g.cg}")
    chan = "vc" if plan.depthwise else f"vg * {g.cg} + vc"
    x = f"D[vn, vy - {top}, vx - {left}, {chan}]" if plan.nhwc else f"D[vn, {chan}, vy - {top}, vx - {left}]"
    names = "nyxc" if plan.depthwise else "ngyxc"
    if plan.pitch:  # flat position p of the padded rows laid back to back (past the last: padding)
        flat = {"vy": f"vp // {plan.pitch}", "vx": f"vp % {plan.pitch}"}
        conds = [" ".join(flat.get(w, w) for w in c.split()) for c in conds]
        x = x.replace("vy -", f"{flat['vy']} -").replace("vx -", f"{flat['vx']} -")
        names = "ngpc"
    if plan.dot:
        # 8-bit as the tile takes it (data_shift); a padded pixel holds the zero point, a padded
        # channel 0 (it must add nothing to the window sums either).
        shift, dt = data_shift(plan, dtype), plan.packed_dtype
        value = f"T.Cast('{dt}', T.Cast('int16', {x}) + T.int16({shift}))" if shift else x
        pixel = [c for c in conds if not c.startswith("vc")]
        value = f"T.if_then_else({' and '.join(pixel)}, {value}, T.{dt}({zp + shift}))"
        conds, zero = conds[:1] if conds[0].startswith("vc") else ["True"], f"T.{dt}(0)"
    else:
        value = _widened(x, zp)
        zero = "T.int16(0)"
        if plan.float_taps:  # the data as it is, its zero point in the padding
            value, zero = x, f"T.{dtype}({zp})"
    return padded_pack(4, "P", list(zip(names, plan.packed_shape)), " and ".join(conds), value, zero)


def _render_space_to_depth_pack(plan: Int8Plan, dtype: str, zp: int) -> list[str]:
    """The pack of a space-to-depth plan (space_to_depth), in two copies: the source padded (S:
    the zero point around it, and past it where only zero taps look), then packed pixel (Y, X),
    channel k = (2 * py + px) * C + c from padded pixel (2Y + py, 2X + px), channel c (0 in the
    padded channels). One pass doing both spent 0.25 ms on the stem in per-byte bounds checks."""
    src, dt, shift = plan.source, plan.packed_dtype, data_shift(plan, dtype)
    top, left = src.pad[0], src.pad[1]
    inside = f"{top} <= vy and vy < {top + src.h} and {left} <= vx and vx < {left + src.w}"
    value = f"D[vn, vy - {top}, vx - {left}, vc]"
    if shift:
        value = f"T.Cast('{dt}', T.Cast('int16', {value}) + T.int16({shift}))"
    c = src.c
    L = padded_pack(4, "S", list(zip("nyxc", space_to_depth_source_shape(plan))), inside, value,
                    f"T.{dt}({zp + shift})", block="pad")
    return L + padded_pack(4, "P", list(zip("ngyxc", plan.packed_shape)), f"vc < {4 * c}",
                           f"S[vn, vy * 2 + vc // {2 * c}, vx * 2 + vc // {c} % 2, vc % {c}]", f"T.{dt}(0)")


def _render_subsampled_pack(plan: Int8Plan, dtype: str, zp: int) -> list[str]:
    """The pack of a subsampled 1x1 layer (subsampled): the source's pixels at the stride, the
    OH * OW of them in rows of flat_row's length, as `_render_pack` makes them (8-bit as the tile
    takes it, or widened less the zero point for the upcast); padded channels and each row's
    tail past its pixels hold 0."""
    src, dt = plan.source, plan.packed_dtype
    (sh, sw), ow = src.stride, src.out_hw[1]
    p = f"(vy * {plan.g.w} + vx)"
    value = f"D[vn, {p} // {ow} * {sh}, {p} % {ow} * {sw}, vg * {src.cg} + vc]"
    if plan.dot:
        shift = data_shift(plan, dtype)
        if shift:
            value = f"T.Cast('{dt}', T.Cast('int16', {value}) + T.int16({shift}))"
    else:
        value = _widened(value, zp)
    return padded_pack(4, "P", list(zip("ngyxc", plan.packed_shape)), f"vc < {src.cg} and vx < {plan.g.w}",
                       value, f"T.{dt}(0)")


def _render_paired_pack(plan: Int8Plan, dtype: str, zp: int) -> list[str]:
    """The pack of a paired plan (paired): P's rows, as flat runs of values (PF), zeroed, then the
    data's rows copied in at the padding's offset, widened less the zero point, as far as the
    windows read (paired_copy). Channels-last, a row of the data is one run too (DF), so the copy
    is a contiguous one. Two passes rather than one with a bounds check per value, which does not
    vectorize (the space-to-depth pack measured that: 0.25 ms on the stem)."""
    src = plan.source
    n, _, hp, wp, cp = plan.packed_shape
    top, left, c = src.pad[0], src.pad[1], src.c
    rows, values = paired_copy(plan)
    x = "DF[vn, vy, vi]" if plan.nhwc else f"D[vn, vi % {c}, vy, vi // {c}]"
    value = _widened(x, zp)
    return [f"    for n, y, f in T.grid({n}, {hp}, {wp * cp}):",
            "        with T.sblock('pad'):",
            "            vn, vy, vf = T.axis.remap('SSS', [n, y, f])",
            "            PF[vn, vy, vf] = T.int16(0)",
            f"    for n, y, i in T.grid({src.n}, {rows}, {values}):",
            "        with T.sblock('pack'):",
            "            vn, vy, vi = T.axis.remap('SSS', [n, y, i])",
            f"            PF[vn, vy + {top}, vi + {left * c}] = {value}"]


def paired_copy(plan: Int8Plan) -> tuple[int, int]:
    """Rows of the data, and values of each, that a paired plan's pack copies: those its packed
    rows hold (a stride can leave the last rows or columns unread)."""
    src, (_, _, hp, wp, cp) = plan.source, plan.packed_shape
    return min(src.h, hp - src.pad[0]), min(src.w * src.c, wp * cp - src.pad[1] * src.c)


def space_to_depth_source_shape(plan: Int8Plan) -> tuple:
    """The padded source of a space-to-depth pack: every pixel the packed one's 2 x 2 blocks read."""
    n, _, hs, ws, _ = plan.packed_shape
    return (n, 2 * hs, 2 * ws, plan.source.c)


# Winograd F(2x2, 3x3): each row of B^T (over a 4x4 input tile's rows or columns) as its two
# terms; A^T's two rows are written out in _render_winograd_unpack. G scaled by 2
# (winograd_weights) keeps the weights' transform integral, and the output transform's result
# is 4x the conv.
WINO_BT = ((0, 2, -1), (1, 2, 1), (2, 1, -1), (1, 3, -1))  # (p, q, sign): row = d[p] + sign * d[q]
WINO_G2 = np.array([[2, 0, 0], [1, 1, 1], [1, -1, 1], [0, 0, 2]], np.int64)


def winograd_source_shape(plan: Int8Plan) -> tuple:
    """The padded source of a Winograd pack (x - zp_x as int16): every pixel the 4x4 input tiles
    read, tiles 2 pixels apart, the padding and what the last tiles read past it 0."""
    src, (th, tw) = plan.source, winograd_tiles(plan.source)
    return (src.n, 2 * th + 2, 2 * tw + 2, src.c)


def winograd_tiles(g: Geometry) -> tuple[int, int]:
    """Rows and columns of 2x2 output tiles covering the layer's output."""
    oh, ow = g.out_hw
    return -(-oh // 2), -(-ow // 2)


def _wino_combine(terms, index: str) -> str:
    """TVMScript choosing, by the value of `index` (0-3, an unrolled loop's), the row of B^T that
    combines the four `terms`: after unrolling each tile's choice folds to one add or subtract."""
    rows = [f"({terms[p]} {'+' if sign > 0 else '-'} {terms[q]})" for p, q, sign in WINO_BT]
    return f"T.Select({index} == 0, {rows[0]}, T.Select({index} == 1, {rows[1]}, T.Select({index} == 2, {rows[2]}, {rows[3]})))"


def _render_winograd_pack(plan: Int8Plan, dtype: str, zp: int) -> list[str]:
    """The pack of a Winograd plan, in two passes: the source padded and widened (S: x - zp_x as
    int16, 0 around it), then each 4x4 tile's B^T d B (16 values per channel, one per GEMM,
    channels innermost) into packed pixel t = tile row * tiles per row + tile column of GEMM
    vg = 4a + b; tiles past the last and padded channels hold 0."""
    src, (_, tw) = plan.source, winograd_tiles(plan.source)
    top, left = src.pad[0], src.pad[1]
    inside = f"{top} <= vy and vy < {top + src.h} and {left} <= vx and vx < {left + src.w}"
    x = f"D[vn, vy - {top}, vx - {left}, vc]" if plan.nhwc else f"D[vn, vc, vy - {top}, vx - {left}]"
    value = _widened(x, zp)
    L = padded_pack(4, "S", list(zip("nyxc", winograd_source_shape(plan))), inside, value, "T.int16(0)",
                    block="pad")
    t = f"(vy * {plan.g.w} + vx)"
    y0, x0 = f"{t} // {tw} * 2", f"{t} % {tw} * 2"
    cols = [_wino_combine([f"S[vn, {y0} + {r}, {x0} + {c}, vc]" for c in range(4)], "vg % 4") for r in range(4)]
    conds = [f"vx < {plan.g.w}"] + ([f"vc < {src.c}"] if plan.cp != src.c else [])
    return L + padded_pack(4, "P", list(zip("ngyxc", plan.packed_shape)), " and ".join(conds),
                           _wino_combine(cols, "vg // 4"), "T.int16(0)")


def _render_winograd_unpack(plan: Int8Plan) -> list[str]:
    """The output transform: each 2x2 output tile A^T M A from the 16 GEMMs' int32 sums M of its
    tile, / 4 (exact: the sum is 4x the conv), then the output as `_output` makes it; the tile's
    pixels past the output's edge are not stored."""
    src, g, nr = plan.source, plan.g, plan.kern.nr
    (th, tw), (oh, ow) = winograd_tiles(src), src.out_hw
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
            f"            Out[{idx}] = {_output(plan, f'T.shift_right({y}, T.int32(2))', 'vo', idx)}"]


def winograd_weights(weight: np.ndarray, zp_w: int) -> np.ndarray:
    """OIHW 3x3 weights -> the 16 GEMMs' weights as one grouped 1x1 layer's, (16 * O, C, 1, 1)
    int16: GEMM 4a + b holds ((2G) (w - zp_w) (2G)^T)[a, b], 4x the textbook transform, exact."""
    w = weight.astype(np.int64) - zp_w
    u = np.einsum("ar,ocrs,bs->abco", WINO_G2, w, WINO_G2)  # (4, 4, C, O)
    o, c = weight.shape[:2]
    return np.ascontiguousarray(u.transpose(0, 1, 3, 2).reshape(16 * o, c, 1, 1)).astype(np.int16)


def _task(plan: Int8Plan) -> str:
    """The parallel task (image, group, output block, row) as loop text: f, or with tile-local
    accumulators the chunk c's fc-th task."""
    return f"(c * {plan.tasks // plan.chunks} + fc)" if plan.tile_local else "f"


def _task_parts(plan: Int8Plan) -> dict[str, str]:
    """The parallel task's image, group, output block and row (or row of tiles) as loop text.
    Consecutive tasks, which a thread runs in turn, walk the output blocks of a row where the
    weights are the smaller operand (Int8Plan.rows_outer: each thread then reads only its own
    rows of the input, which the layer before wrote on the same thread), else a block's rows."""
    g, f = plan.g, _task(plan)
    size = {"y": plan.task_rows, "ob": plan.op // plan.kern.nr}
    inner, outer = ("ob", "y") if plan.rows_outer else ("y", "ob")
    per_group = size["y"] * size["ob"]
    return {"n": f"{f} // {g.groups * per_group}", "g": f"{f} // {per_group} % {g.groups}",
            outer: f"{f} // {size[inner]} % {size[outer]}", inner: f"{f} % {size[inner]}"}


def _tile_iters(plan: Int8Plan, columns: list[str]) -> list[str]:
    """A tile block's spatial iterators; `columns` bind its output columns (vm, and vx0). With
    `parallel` (x86) the rows of every image, group and output block are one parallel loop, f."""
    if plan.parallel:
        g, oh = plan.g, plan.task_rows
        ob = plan.op // plan.kern.nr
        t = _task_parts(plan)
        rows = [f"vn = T.axis.spatial({g.n}, {t['n']})", f"vg = T.axis.spatial({g.groups}, {t['g']})",
                f"vob = T.axis.spatial({ob}, {t['ob']})", f"vy = T.axis.spatial({oh}, {t['y']})"]
        if plan.tile_local:
            rows.append(f"vc = T.axis.spatial({plan.chunks}, c)")
    else:
        rows = ["vn, vg, vob, vy = T.axis.remap('SSSS', [n, g, o, y])"]
    return [*rows, *columns, f"vj = T.axis.spatial({plan.kern.nr}, j)"]


def _acc(plan: Int8Plan, x0: str) -> str:
    if plan.tile_local:
        return "Acc[vc, vm, vj]"
    return f"Acc[vn, vg, vob, vy, {x0} + vm, vj]"


def _conv_block(plan: Int8Plan, tile: IntConvTile, columns: list[str], x0: str, init: list[str]) -> list[str]:
    """The tile's whole reduction, block 'conv', inside the loop over tiles (tt); `x0` is the
    tile's first column as the block sees it, `init` what the block zeroes Acc with."""
    sh, sw = plan.g.stride
    axes = tile.reduce_axes()
    v = {a: f"v{a}" for a, _ in axes} | {"m": "vm", "j": "vj"}
    if plan.pitch:  # task row vy is the vy-th tile of the flat run
        pixel, ch = tile.a_index(v)
        a = f"P[vn, vg, vy * {plan.kern.mr} + {pixel}, {ch}]"
    else:
        row, col, ch = tile.a_index(v)
        a = f"P[vn, vg, vy * {sh} + {row}, {x0} * {sw} + {col}, {ch}]"
    loops = ["m", "j"] + [a for a, _ in axes]
    extents = [plan.kern.mr, plan.kern.nr] + [e for _, e in axes]
    body = [*_tile_iters(plan, columns), *(f"v{a} = T.axis.reduce({e}, {a})" for a, e in axes), *init,
            f"{_acc(plan, x0)} = {_acc(plan, x0)} + T.Cast('int32', {a})"
            f" * T.Cast('int32', Wv[vg, vob, {', '.join(tile.b_index(v))}])"]
    return [f"        for {', '.join(loops)} in T.grid({', '.join(map(str, extents))}):",
            "            with T.sblock('conv'):", *(f"                {line}" for line in body)]


def _tensorized_tile(plan: Int8Plan, tile: IntConvTile) -> list[str]:
    """The tile as the intrinsic matches it. Its first column is an iterator of its own, so the
    inner bindings after blockize are exactly the description's m (not tt * MR + m). TIR's
    decompose_reduction refuses such a binding, so the zeroing is a block of its own, ahead."""
    mr, nr = plan.kern.mr, plan.kern.nr
    columns = [f"vx0 = T.axis.spatial({plan.ow_padded}, tt * {mr})", f"vm = T.axis.spatial({mr}, m)"]
    if not plan.kern.accumulate:
        # A beta=0 kernel (one call per tile, overwriting it): the init only marks the block a
        # reduction for TIR; `build` drops it after tensorizing (intrinsics.beta0).
        return _conv_block(plan, tile, columns, "vx0", ["with T.init():", f"    {_acc(plan, 'vx0')} = 0"])
    return [f"        for m, j in T.grid({mr}, {nr}):", "            with T.sblock('zero'):",
            *(f"                {line}" for line in _tile_iters(plan, columns)), f"                {_acc(plan, 'vx0')} = 0",
            *_conv_block(plan, tile, columns, "vx0", [])]


def _vectorized_tile(plan: Int8Plan, tile: IntConvTile) -> list[str]:
    """The same tile as one reduction block with its init, which `build` reorders and vectorizes:
    TIR vectorizes a reduction only in a block that has its init."""
    columns = [f"vm = T.axis.spatial({plan.ow_padded}, tt * {plan.kern.mr} + m)"]
    return _conv_block(plan, tile, columns, "0", ["with T.init():", f"    {_acc(plan, '0')} = 0"])


def _render_gemm(plan: Int8Plan, dtype: str, zp: int, tile_blocks, zw8: int = 0) -> tuple[list[str], IntConvTile]:
    """The GEMM path, with `tile_blocks(plan, tile)` (`_tensorized_tile` or `_vectorized_tile`)
    for the blocks of one tile of MR pixels x NR output channels.
    zw8: for sdot, the weights' zero point shifted to int8 (used in the expansion)."""
    g, kern = plan.g, plan.kern
    mr, nr, cp = kern.mr, kern.nr, plan.cp
    oh, ow = g.out_hw
    (sh, sw), (dh, dw) = g.stride, g.dilation
    owp, ob = plan.ow_padded, plan.op // nr
    tile = IntConvTile(kern, g.kh, g.kw, cp, sw, dh, dw, plan.pitch)
    L = _header(plan, dtype)
    if plan.dot and plan.windows:
        L.append(f"    WS = T.alloc_buffer(({g.n}, {g.groups}, {oh}, {ow}), 'int32')")
    if not plan.in_place(dtype):
        L += _render_pack(plan, dtype, zp)
    if plan.tile_local:
        # The tasks below, in chunks: a chunk's tasks run one after another on one thread, so
        # they can share its tile of accumulators (a tile per task would be no smaller than the
        # output). TIR allocates no buffer inside a parallel loop, hence the chunk index.
        if tile_blocks is not _tensorized_tile:
            raise ValueError("tile-local accumulators need the tensorized tile (x86 builds always tensorize)")
        before, after, _ = thread_setup(kern, " " * 6)
        L += [f"    for c in T.parallel({plan.chunks}):", *before,
              f"      for fc, tt in T.grid({plan.tasks // plan.chunks}, {owp // mr}):"]
        return L + tile_blocks(plan, tile) + _tile_store(plan) + after, tile
    if plan.parallel:
        # Tiles of one (image, group, output block, row) share nothing with another's: a task
        # each. Rendered here, as TIR's parallel() refuses a loop over the tensorized blocks.
        before, after, _ = thread_setup(kern, " " * 6)
        L += [f"    for f in T.parallel({plan.tasks}):", *before, f"      for tt in T.serial({owp // mr}):"]
        L += tile_blocks(plan, tile) + after
    else:
        L.append(f"    for n, g, o, y, tt in T.grid({g.n}, {g.groups}, {ob}, {oh}, {owp // mr}):")
        L += tile_blocks(plan, tile)
    if plan.form == WINOGRAD:
        return L + _render_winograd_unpack(plan), tile
    out = f"Acc[vn, vo // {g.og}, vo % {g.og} // {nr}, vy, vx, vo % {g.og} % {nr}]"
    if plan.dot and plan.windows:
        # sum x over each output pixel's window, for the -zw * sum x term of the expansion
        L += [
            f"    for n, g, y, x, r, s, c in T.grid({g.n}, {g.groups}, {oh}, {ow}, {g.kh}, {g.kw}, {cp}):",
            "        with T.sblock('winsum'):",
            "            vn, vg, vy, vx, vr, vs, vc = T.axis.remap('SSSSRRR', [n, g, y, x, r, s, c])",
            "            with T.init():",
            "                WS[vn, vg, vy, vx] = 0",
            f"            WS[vn, vg, vy, vx] = WS[vn, vg, vy, vx] + T.Cast('int32', P[vn, vg, vy * {sh} + vr * {dh}, vx * {sw} + vs * {dw}, vc])",
        ]
        out += f" - T.int32({zw8}) * WS[vn, vo // {g.og}, vy, vx]"
    if plan.nhwc:
        L += [
            f"    for n, y, x, o in T.grid({g.n}, {oh}, {ow}, {g.o}):",
            "        with T.sblock('unpack'):",
            "            vn, vy, vx, vo = T.axis.remap('SSSS', [n, y, x, o])",
            f"            Out[vn, vy, vx, vo] = {_output(plan, out, 'vo', 'vn, vy, vx, vo')}",
        ]
        return L, tile
    L += [
        f"    for n, o, y, x in T.grid({g.n}, {g.o}, {oh}, {ow}):",
        "        with T.sblock('unpack'):",
        "            vn, vo, vy, vx = T.axis.remap('SSSS', [n, o, y, x])",
        f"            Out[vn, vo, vy, vx] = {_output(plan, out, 'vo', 'vn, vo, vy, vx')}",
    ]
    return L, tile


def _tile_store(plan: Int8Plan) -> list[str]:
    """Channels-last output (x86): each tile's MR x NR accumulators leave right after its
    reduction, while they are in L1, requantized along the NR channels (contiguous on both
    sides) into the output; no separate unpack pass over the accumulators. The tile's columns
    past the row's end, and channels past the group's, are not stored."""
    g, mr, nr = plan.g, plan.kern.mr, plan.kern.nr
    oh, ow = g.out_hw
    cond, y, x = [], "vy", "vx0 + vm"
    if plan.pitch:
        # Position p of the flat run is output pixel (p // pitch, p % pitch) where that column
        # is one of the row's OW; the rest are the padding columns and the last tile's overhang.
        p = f"({_task_parts(plan)['y']}) * {mr} + m"
        cond += [f"({p}) % {plan.pitch} < {ow}", f"{p} < {oh * plan.pitch}"]
        y, x = f"(vy * {mr} + vm) // {plan.pitch}", f"(vy * {mr} + vm) % {plan.pitch}"
    elif plan.ow_padded != ow:
        cond.append(f"tt * {mr} + m < {ow}")
    if plan.op != g.og:
        cond.append(f"({_task_parts(plan)['ob']}) * {nr} + j < {g.og}")
    columns = [f"vx0 = T.axis.spatial({plan.ow_padded}, tt * {mr})", f"vm = T.axis.spatial({mr}, m)"]
    o = f"vg * {g.og} + vob * {nr} + vj"
    body = [*_tile_iters(plan, columns), *([f"T.where({' and '.join(cond)})"] if cond else []),
            f"Out[vn, {y}, {x}, {o}] = {_output(plan, _acc(plan, 'vx0'), o, f'vn, {y}, {x}, {o}')}"]
    return [f"        for m, j in T.grid({mr}, {nr}):", "            with T.sblock('store'):",
            *(f"                {line}" for line in body)]


def _output(plan: Int8Plan, acc: str, o: str, idx: str) -> str:
    """TVMScript of the output element Out[idx] from its accumulator `acc` (output channel `o`):
    + Bias, then as Quantization says (int32 as is; 8-bit requantized: round half to even, + zero
    point, saturate, clamped before the conversion so it stays in range; float32 dequantized),
    then the fused residual add of R[idx] (Quantization's rule) where the plan has one."""
    og = plan.layer.og
    o = f"({o})"
    if plan.bias:
        acc = f"{acc} + Bias[{o} // {og}, {o} % {og}]"
    out = plan.output_dtype
    if out == "int32":
        return f"T.max({acc}, T.int32(0))" if plan.activation == "relu" else acc
    real = f"T.Cast('float32', {acc}) * M[{o}]"
    if out == "float32":
        return f"T.max({real}, T.float32(0))" if plan.activation == "relu" else real
    lo, hi = {"uint8": (0, 255), "int8": (-128, 127)}[out]
    zp = plan.zp_out
    if plan.activation == "relu":
        lo = max(lo, zp)
    clamped = f"T.max(T.min(T.round({real}), T.float32({hi - zp})), T.float32({lo - zp}))"
    if plan.residual is not None:
        # y - zp is the clamped value itself; the sum is clamped to the dtype's range around its
        # own zero point, then converted, as above.
        ra, rb, zr, zz = plan.residual
        lo, hi = {"uint8": (0, 255), "int8": (-128, 127)}[out]
        total = (f"T.float32({ra!r}) * {clamped} + T.float32({rb!r}) * "
                 f"T.Cast('float32', T.Cast('int32', R[{idx}]) - T.int32({zr}))")
        clamped = f"T.max(T.min(T.round({total}), T.float32({hi - zz})), T.float32({lo - zz}))"
        zp = zz
    return f"T.Cast('{out}', T.Cast('int32', {clamped}) + T.int32({zp}))"


def _render_depthwise(plan: Int8Plan, dtype: str, zp: int) -> list[str]:
    g = plan.g
    oh, ow = g.out_hw
    (sh, sw), (dh, dw) = g.stride, g.dilation
    cp = plan.packed_shape[-1]
    L = _header(plan, dtype) + _render_pack(plan, dtype, zp)
    a, b = f"P[vn, vy * {sh} + vr * {dh}, vx * {sw} + vs * {dw}, vc]", "Wv[vr, vs, vc]"
    product = f"T.Cast('float32', {a}) * {b}" if plan.float_taps else f"T.Cast('int32', {a}) * T.Cast('int32', {b})"
    L += [
        f"    for n, y, x, c, r, s in T.grid({g.n}, {oh}, {ow}, {cp}, {g.kh}, {g.kw}):",
        "        with T.sblock('conv'):",
        "            vn, vy, vx, vc, vr, vs = T.axis.remap('SSSSRR', [n, y, x, c, r, s])",
        "            with T.init():",
        f"                Acc[vn, vy, vx, vc] = T.{plan.acc_dtype}(0)",
        f"            Acc[vn, vy, vx, vc] = Acc[vn, vy, vx, vc] + {product}",
    ]
    if plan.nhwc:
        # float taps: the exact integer sum back to int32, so the store is the integer path's
        acc = "T.Cast('int32', Acc[vn, vy, vx, vc])" if plan.float_taps else "Acc[vn, vy, vx, vc]"
        L += [f"    for n, y, x, c in T.grid({g.n}, {oh}, {ow}, {g.c}):",
              "        with T.sblock('unpack'):",
              "            vn, vy, vx, vc = T.axis.remap('SSSS', [n, y, x, c])",
              f"            Out[vn, vy, vx, vc] = {_output(plan, acc, 'vc', 'vn, vy, vx, vc')}"]
        return L
    L += [
        f"    for n, c, y, x in T.grid({g.n}, {g.c}, {oh}, {ow}):",
        "        with T.sblock('unpack'):",
        "            vn, vc, vy, vx = T.axis.remap('SSSS', [n, c, y, x])",
        f"            Out[vn, vc, vy, vx] = {_output(plan, 'Acc[vn, vy, vx, vc]', 'vc', 'vn, vc, vy, vx')}",
    ]
    return L


def _render_depthwise_rows(plan: Int8Plan, dtype: str, zp: int) -> list[str]:
    """Depthwise on x86, NCHW as the user has it: each channel's plane widened (x - zp, int16) and
    padded, then each output row LANES pixels at a time, one int32 vector per tap and LANES
    pixels, the requantized output written straight back to NCHW. No transposes: the channel's
    taps are scalars broadcast over a row, where the ARM path puts channels in lanes."""
    g = plan.g
    oh, ow = g.out_hw
    (sh, sw), (dh, dw) = g.stride, g.dilation
    top, left = g.pad[0], g.pad[1]
    n, c = plan.packed_shape[:2]
    # Packed column q of phase p is padded input column q * sw + p.
    col = f"vq * {sw} + vp"
    inside = f"{top} <= vy and vy < {top + g.h} and {left} <= {col} and {col} < {left + g.w}"
    x = f"D[vn, vc, vy - {top}, {col} - {left}]"
    value = _widened(x, zp)
    L = _header(plan, dtype) + padded_pack(4, "P", list(zip("ncpyq", plan.packed_shape)), inside, value, "T.int16(0)")
    tap = f"vs * {dw}"
    L += [
        f"    for n, c, y, x, r, s in T.grid({n}, {c}, {oh}, {plan.ow_padded}, {g.kh}, {g.kw}):",
        "        with T.sblock('conv'):",
        "            vn, vc, vy, vx, vr, vs = T.axis.remap('SSSSRR', [n, c, y, x, r, s])",
        "            with T.init():",
        "                Acc[vn, vc, vy, vx] = 0",
        "            Acc[vn, vc, vy, vx] = Acc[vn, vc, vy, vx] + "
        f"T.Cast('int32', P[vn, vc, ({tap}) % {sw}, vy * {sh} + vr * {dh}, vx + ({tap}) // {sw}])"
        " * T.Cast('int32', Wv[vc, vr, vs])",
        f"    for n, c, y, x in T.grid({g.n}, {g.c}, {oh}, {ow}):",
        "        with T.sblock('unpack'):",
        "            vn, vc, vy, vx = T.axis.remap('SSSS', [n, c, y, x])",
        f"            Out[vn, vc, vy, vx] = {_output(plan, 'Acc[vn, vc, vy, vx]', 'vc', 'vn, vc, vy, vx')}",
    ]
    return L


def _schedule_depthwise_rows(sch, plan: Int8Plan) -> None:
    """Planes on all threads; per row, LANES pixels in vector lanes over the KH x KW taps, the
    accumulators kept in registers for them, and the row's output written right after it (its
    block computed at the row loop, so the row of accumulators never leaves L1)."""
    blk = sch.get_sblock("conv")
    n, c, y, x, r, s = sch.get_loops(blk)
    xo, xi = sch.split(x, [None, plan.lanes])
    sch.reorder(xo, r, s, xi)
    sch.vectorize(xi)
    plane = sch.fuse(n, c)
    sch.parallel(plane)
    pack = sch.get_loops(sch.get_sblock("pack"))
    sch.parallel(sch.fuse(*pack[:2]))
    unpack = sch.get_sblock("unpack")
    sch.reverse_compute_at(unpack, y)
    _vectorize_whole(sch, sch.get_loops(unpack)[-1], plan.g.out_hw[1])  # the whole row
    init = sch.decompose_reduction(blk, r)
    sch.vectorize(sch.get_loops(init)[-1])


def is_depthwise(g: Geometry) -> bool:
    """Depthwise with one output channel per input channel: what the lane-wise kernel computes
    (a channel multiplier goes through the GEMM path)."""
    return g.depthwise and g.o == g.c


def conv_kernel(isa: Isa, dtype: str = "int8", depthwise: bool = False, g: Geometry | None = None,
                pitched: bool = False):
    """The tile a conv runs on. ARM: the ISA's default, except on the dotprod core for int16
    (legalized) data, which sdot cannot take, and for depthwise layers, whose channels-in-lanes
    path is an s16 MAC: both use AArch64's int16 tile. x86: the ISA's tile (vpdpbusd on the VNNI
    ISAs, vpmaddwd on AVX-512 / AVX2), int16 data and depthwise layers on the vpmaddwd tile of the
    same width, shaped for the layer `g` (x86_tile). AMX: its tiles where the layer's channels pad
    to whole 64-deep K steps cheaply (amx_tile; `pitched`: for tiles over the flat run of
    rows, Int8Plan.pitch), else the AVX-512 VNNI tile."""
    if isa.arch != "x86":
        if isa.name == "aarch64dot" and (dtype == "int16" or depthwise):
            return default_mac_kernel("aarch64")
        return default_mac_kernel(isa.name)
    if (dtype == "int16" or depthwise) and isa.name not in (AVX512.name, AVX2.name):
        isa = AVX512 if isa.vector_bits == 512 else AVX2
    if isa.name == AMX_INT8.name:
        amx = amx_tile(g, pitched)
        if amx is not None:
            return AmxGemmKernel(*amx, accumulate=False)
        isa = AVX512_VNNI
    mr, nr = x86_tile(isa, g)
    return IntGemmKernel(isa, mr, nr)


# Channels padded to whole 64-deep K steps for the AMX tiles: beyond this factor of the layer's
# own, the padded MACs cost more than AMX's advantage over the VNNI tile (5.4x at the tiles' L1 rates) gives back
# once the pack's extra bytes are counted; MobileNet's 16- to 32-channel layers stay on VNNI.
AMX_MAX_PADDING = 1.5


def amx_padded_channels(g: Geometry) -> int:
    """Channels per group padded so one kernel call's K (a kernel row's KW * C, or a tap's C with
    dilation) is a whole number of 64-deep tdpbusd steps."""
    span = g.kw if g.dilation[1] == 1 else 1
    cp = ceil_to(g.cg, 4)
    while (span * cp) % K_DEPTH:
        cp += 4
    return cp


def flat_rows(g: Geometry) -> bool:
    """Whether a layer's output rows are tiled as one flat run over its padded input rows
    (Int8Plan.pitch): stride 1, no dilation, a kernel of more than one row, and output rows
    narrower than two full A tiles (32 pixels), which no tile of its own rows fills. Wider rows
    fill 2 x 2 tiles of 14 or more rows already, and there the flat run measured 5% slower (56
    and 28 pixels, Xeon with AMX): it computes the padding columns too, and its store divides."""
    return g.stride == (1, 1) and g.dilation == (1, 1) and g.kh > 1 and g.out_hw[1] < 2 * TILE_ROWS


def amx_tile(g: Geometry | None, pitched: bool = False) -> tuple[int, int, int] | None:
    """(rows, A tiles, B tiles) of the AMX tile for a layer, or None where the VNNI tile suits it
    better (channel padding beyond AMX_MAX_PADDING, or no layer given). Of the shapes the eight tile
    registers allow, the fewest cycles per useful output: a K step issues A*B tdpbusd, each about
    6 + 0.625 * rows cycles (16 at 16 rows, 11 at 8: measured on a Xeon with AMX), against A+B tile
    loads of about 8 cycles each; times the padding of the row (to whole MR) and of the group's
    output channels (to whole NR). Ties: the most C tiles. `pitched`: the row is the flat run of
    OH x pitch positions (Int8Plan.pitch)."""
    if g is None or amx_padded_channels(g) > AMX_MAX_PADDING * g.cg:
        return None
    ow, og = g.out_hw[1], g.og
    if pitched:
        ow = g.out_hw[0] * (g.w + g.pad[1] + g.pad[3])

    def cost(t):
        rows, a, b = t
        cycles = max(a * b * (6 + 0.625 * rows), 8 * (a + b))
        waste = ceil_to(ow, a * rows) / ow * ceil_to(og, 16 * b) / og
        return round(cycles / (a * rows * b) * waste, 3), -a * b, -rows

    return min((t for t in amx_tiles() if 16 * t[2] <= ceil_to(og, 16)), key=cost)


def x86_tile(isa: Isa, g: Geometry | None) -> tuple[int, int]:
    """(MR, NR) for a layer: of the tiles the register budget allows (MR <= 16), the one with the
    fewest cycles per useful output: a K step issues MR * NR/lanes multiplies and MR broadcasts
    of A plus NR/lanes rows of B, two multiplies and two loads per cycle on the cores we know, a
    row of B counting as two loads (the tile's B panel, K x NR, is past the L1 on most layers and
    comes from L2 on every tile of pixels, about a vector per cycle), so it takes
    max(multiplies, loads) / 2; times the padding of the output row (to whole MR) and of the
    group's output channels (to whole NR). Ties: the most accumulators. With B's rows counted
    once, 16-register tiles (AVX2, AVX-VNNI) took 2 x 32, four rows of B per two pixels, which
    left ResNet-50's 3x3 layers L2-bound on a Zen 3 (64x56x56 3x3: 2.88 ms on 2 x 32, 1.77 on
    4 x 16); the 32-register tiles (14 x 32, 7 x 32) are multiply-bound either way."""
    if g is None:
        return DEFAULT_TILES[isa.name]
    ow, og = g.out_hw[1], g.og
    cands = [(mr, nr) for mr, nr in x86_int_tiles(isa, 4 * isa.lanes)
             if mr <= 16 and nr <= ceil_to(og, isa.lanes)]

    def cost(t):
        mr, nr = t
        nv = nr // isa.lanes
        step = max(mr * nv, mr + 2 * nv) / (mr * nv)
        waste = ceil_to(ow, mr) / ow * ceil_to(og, nr) / og
        return round(step * waste, 3), -mr * nr, -nr

    return min(cands, key=cost)


def build(g, isa: Isa, dtype: str, zp_x: int, tensorize: bool = True, zp_w: int = 0, weight_dtype: str = "int8",
          output: dict | None = None, source: tuple | None = None):
    """(IRModule after scheduling, plan). tensorize=False vectorizes the same tiling instead: the
    'LLVM chooses the instructions' baseline of `bench arm`. output: Int8Plan's output fields
    (output_dtype, bias, activation, zp_out). On x86 every stage runs on all threads. source: the
    layer as given and the form `g` is of it, (Geometry, form) (Int8Plan.source, Int8Plan.form)."""
    depthwise = is_depthwise(g)
    zw8 = zp_w - weight_shift(weight_dtype)
    parallel = isa.arch == "x86"
    plan = Int8Plan(g, conv_kernel(isa, dtype, depthwise, g), depthwise, **(output or {}), windows=zw8 != 0,
                    parallel=parallel, **dict(zip(("source", "form"), source or ())))
    if plan.pitch:  # the tile for the flat run of rows (amx_tile), where the row's width no longer counts
        plan = dataclasses.replace(plan, kern=conv_kernel(isa, dtype, depthwise, g, pitched=True))
    if plan.dot or plan.float_taps:
        plan = dataclasses.replace(plan, bias=True)  # the expansion's per-channel terms
    # The buffers the plan sizes, refused before any TIR is made (TVM indexes in int32).
    check_elements(packed_input=plan.packed_shape, packed_weight=plan.weight_shape, accumulators=plan.acc_shape)
    if plan.rows:
        sch = s_tir.Schedule(parse(_render_depthwise_rows(plan, dtype, zp_x)))
        _schedule_depthwise_rows(sch, plan)
        return sch.mod, plan
    if depthwise:
        sch = s_tir.Schedule(parse(_render_depthwise(plan, dtype, zp_x)))
        blk = sch.get_sblock("conv")
        n, y, x, c, r, s = sch.get_loops(blk)
        co, ci = sch.split(c, [None, plan.lanes])
        # Taps outside the lanes: the 8 accumulators of a pixel stay in one register pair
        # across all KH*KW taps, and each tap is one widening MAC over 8 channels.
        sch.reorder(co, r, s, ci)
        if plan.float_taps:
            # Float adds keep their order, so one pixel's taps are one chain of dependent FMAs
            # (four cycles each): XB pixels' chains side by side, unrolled, keep the FMA units busy.
            xb = next(b for b in (8, 7, 6, 5, 4, 3, 2, 1) if g.out_hw[1] % b == 0)
            x, xi = sch.split(x, [None, xb])
            sch.reorder(x, co, r, s, xi, ci)
            # All taps unrolled too: neighbouring pixels' taps read the same input vector, which
            # LLVM then loads and converts once for all of them.
            for loop in (r, s, xi):
                sch.unroll(loop)
        sch.vectorize(ci)
        if parallel:  # before the init block is split off: parallel() takes a whole reduction block
            sch.parallel(sch.fuse(n, y))
            if plan.nhwc:
                # Each pixel's accumulators leave requantized right after its taps, while they
                # are in L1, instead of in a second pass over an int32 copy of the output.
                unpack = sch.get_sblock("unpack")
                sch.reverse_compute_at(unpack, x)
                _vectorize_whole(sch, sch.get_loops(unpack)[-1], plan.g.c)
            _parallel_stages(sch, plan)
        init = sch.decompose_reduction(blk, r)
        sch.vectorize(sch.get_loops(init)[-1])
        return sch.mod, plan
    text, tile = _render_gemm(plan, dtype, zp_x, _tensorized_tile if tensorize else _vectorized_tile, zw8)
    sch = s_tir.Schedule(parse(text, **thread_setup(plan.kern, "")[2]))
    blk = sch.get_sblock("conv")
    loops = sch.get_loops(blk)
    outer = len(loops) - 2 - len(tile.reduce_axes())  # the tile's m, j, then its reduction
    m, j, red = loops[outer], loops[outer + 1], loops[outer + 2:]
    if tensorize:
        if plan.kern.accumulate:
            sch.vectorize(sch.get_loops(sch.get_sblock("zero"))[-1])
        sch.tensorize(m, register_int_conv(tile))
    else:
        # Same tiling with the reduction outside and the tile's MR x NR accumulators inside,
        # NR vectorized: what a good TIR schedule gets from LLVM without a hand-written kernel.
        sch.reorder(*red, m, j)
        sch.unroll(m)
        sch.vectorize(j)
        init = sch.decompose_reduction(blk, red[0])
        sch.vectorize(sch.get_loops(init)[-1])
    if parallel:
        _parallel_stages(sch, plan)
    if tensorize and not plan.kern.accumulate:
        return drop_dead_inits(sch.mod, ["conv_o"]), plan
    return sch.mod, plan


def _has_block(sch, name: str) -> bool:
    try:
        sch.get_sblock(name)
    except Exception:  # noqa: BLE001 (TVM raises its own error type for a missing block)
        return False
    return True


def _parallel_stages(sch, plan: Int8Plan) -> None:
    """The pack and the unpack on all threads. The unpack transposes: it walks NR output channels
    of a row at a time, so the tile of accumulators it reads (OW x NR int32) stays in L1 while
    NR output rows are written, and vectorizes along the row (strided loads, one vector store)."""
    if plan.form == WINOGRAD:
        _parallel_winograd(sch, plan)
        return
    if plan.form == SPACE_TO_DEPTH:  # the padding pass by rows; the pack's channels unrolled,
        # as each comes from a fixed place (a gather across vector lanes costs more than the bytes)
        pad = sch.get_loops(sch.get_sblock("pad"))
        sch.parallel(sch.fuse(*pad[:2]))
        pack = sch.get_loops(sch.get_sblock("pack"))
        sch.parallel(sch.fuse(*pack[:3]))
        sch.unroll(pack[-1])
    elif plan.form == PAIRED:  # rows in parallel, a row's values in the lanes (channels-last: both sides)
        n, y, f = sch.get_loops(sch.get_sblock("pad"))
        sch.parallel(sch.fuse(n, y))
        _vectorize_whole(sch, f, plan.packed_shape[-2] * plan.packed_shape[-1])
        n, y, i = sch.get_loops(sch.get_sblock("pack"))
        sch.parallel(sch.fuse(n, y))
        if plan.nhwc:
            _vectorize_whole(sch, i, paired_copy(plan)[1])
    elif _has_block(sch, "pack"):
        # Rows of every image (and group) in parallel, a row's pixels in turn and their
        # channels in the vector lanes (the innermost loop, contiguous on both sides).
        outer = sch.get_loops(sch.get_sblock("pack"))
        sch.parallel(sch.fuse(*outer[:-1 if plan.pitch else -2]))  # with a pitch, no rows: pixels in parallel
        _vectorize_whole(sch, outer[-1], plan.packed_shape[-1])
    if _has_block(sch, "store"):  # the tiles store their own output (_tile_store)
        # Vectorized along the channels unless the tile overhangs the group's: TIR would then
        # vectorize the store past the predicate that crops it.
        if plan.op == plan.g.og:
            _vectorize_whole(sch, sch.get_loops(sch.get_sblock("store"))[-1], plan.kern.nr)
        return
    if plan.nhwc and plan.depthwise:
        return  # computed per pixel inside the conv's rows (build)
    if plan.nhwc:
        # Channels-last on both sides: rows in parallel, the channels of a pixel in the lanes.
        n, y, x, o = sch.get_loops(sch.get_sblock("unpack"))
        sch.parallel(sch.fuse(n, y))
        _vectorize_whole(sch, o, plan.g.o)
        return
    n, o, y, x = sch.get_loops(sch.get_sblock("unpack"))
    oo, oi = sch.split(o, [None, plan.kern.nr])
    sch.reorder(n, oo, y, oi, x)
    sch.parallel(sch.fuse(n, oo))
    _vectorize_whole(sch, x, plan.g.out_hw[1])


def _parallel_winograd(sch, plan: Int8Plan) -> None:
    """Winograd's passes on all threads: the padding by rows, the input transform by tiles (the
    16 GEMMs' values of a tile unrolled, so each one's row of B^T folds to constants, channels
    in the lanes), the output transform by rows of tiles (a tile's 2x2 pixels unrolled, output
    channels in the lanes)."""
    src = plan.source
    pad = sch.get_loops(sch.get_sblock("pad"))
    sch.parallel(sch.fuse(*pad[:2]))
    _vectorize_whole(sch, pad[-1], src.c)
    n, gv, y, x, c = sch.get_loops(sch.get_sblock("pack"))
    sch.reorder(n, y, x, gv, c)
    sch.parallel(sch.fuse(n, y, x))
    sch.unroll(gv)
    _vectorize_whole(sch, c, plan.cp)
    n, ty, _, i, j, o = sch.get_loops(sch.get_sblock("unpack"))
    sch.parallel(sch.fuse(n, ty))
    sch.unroll(i)
    sch.unroll(j)
    _vectorize_whole(sch, o, src.o)


def _vectorize_whole(sch, loop, extent: int) -> None:
    """Vectorize `loop` (of `extent`) by the widest of 16, 8, 4 lanes that divides it, or leave it:
    TIR leaves a vector loop with a predicated tail scalar, and vectorizes a store past the
    predicate that crops it."""
    lanes = next((v for v in (16, 8, 4) if extent % v == 0), None)
    if lanes:
        sch.vectorize(sch.split(loop, [None, lanes])[1])


class Int8Conv2dOp:
    """A compiled quantized conv2d. op(data, weight, bias=None) -> NCHW output (int32
    accumulators, or requantized / dequantized as the Quantization says), run under qemu-user
    on ARM and natively (or on the Bochs CPU, emulate=True) on x86. `op.pack_weights(weight)`
    packs the weights once (a tuple: kernel_vec, plus the per-channel terms on the raw-8-bit
    tiles); `op.run_packed(data, packed, bias=None)` then skips that. `op.asm` is the assembly,
    `op.plan` the Int8Plan (`op.plan.why`: which tile runs and why). `lib` is None for an op
    that only packs (the Relax pass compiles the module with the model)."""

    def __init__(self, g, isa: Isa, lib, plan: Int8Plan, quant: Quantization, zp_x: int, zp_w: int,
                 threads: int | None = None, emulate: bool = False):
        self.geometry, self.isa, self.lib, self.plan, self.quant = g, isa, lib, plan, quant
        self.dtype, self.weight_dtype, self.zp_x, self.zp_w = quant.dtype, quant.weight_dtype, zp_x, zp_w
        self.threads, self.emulate = threads, emulate
        self.multipliers = quant.multipliers(g.o) if quant.requantizes else None

    @property
    def asm(self) -> str:
        return self.lib.mod.inspect_source("asm")

    def build(self) -> "Int8Conv2dOp":  # dispatch.schedule's interface: already compiled
        return self

    @property
    def data_shape(self) -> tuple:
        """The data's shape as the user gives it (NCHW, or NHWC with data_layout="NHWC"); the module's
        may be its flattened form (flat_geometry), the same memory."""
        g = self.geometry
        return (g.n, g.h, g.w, g.c) if self.plan.nhwc else (g.n, g.c, g.h, g.w)

    @property
    def out_shape(self) -> tuple:
        g, (oh, ow) = self.geometry, self.geometry.out_hw
        return (g.n, oh, ow, g.o) if self.plan.nhwc else (g.n, g.o, oh, ow)

    @property
    def kernel(self):
        return self.plan.kern

    def _check_legalized(self, name: str, arr: np.ndarray) -> None:
        # int16 inputs come from the legalize pass, already x - zp: the exactness bound (and the
        # meaning of the result) holds only while they stay within what 8-bit data can produce.
        if arr.dtype == np.int16 and arr.size and np.abs(arr.astype(np.int32)).max() > 255:
            raise ValueError(f"int16 {name} must lie in [-255, 255] (8-bit values minus a zero point), "
                             f"got magnitude {np.abs(arr.astype(np.int32)).max()}")

    def pack_weights(self, weight: np.ndarray) -> tuple:
        g = self.geometry
        check_array("weight", weight, (g.o, g.cg, g.kh, g.kw), self.weight_dtype)
        self._check_legalized("weight", weight)
        return pack_weights(self.plan, weight, self.zp_w, self.zp_x + data_shift(self.plan, self.dtype))

    def run_packed(self, data: np.ndarray, packed: tuple, bias: np.ndarray | None = None,
                   residual: np.ndarray | None = None) -> np.ndarray:
        plan = self.plan
        check_array("data", data, self.data_shape, self.dtype)
        specs = [(plan.weight_shape, plan.weight_dtype)] + ([(plan.bias_shape, "int32")] if plan.expands else [])
        if not isinstance(packed, tuple) or len(packed) != len(specs):
            raise TypeError(f"packed must be the tuple of {len(specs)} array(s) that op.pack_weights returns")
        for i, (arr, (shape, dt)) in enumerate(zip(packed, specs)):
            check_array(f"packed[{i}]", arr, shape, dt)
        self._check_legalized("data", data)
        args = [data.reshape(plan.data_shape), *self.arguments(packed, bias, residual)]
        if self.isa.arch != "x86":
            return qemu.run(self.lib, self.isa.arch, args, [len(args) - 1])[0].reshape(self.out_shape)
        if self.emulate:
            out = bochs.run(self.lib, [np.ascontiguousarray(a) for a in args], [len(args) - 1])[0]
            return out.reshape(self.out_shape)
        require_host(plan.kern.isa)  # a tile instruction the CPU lacks (or AMX without the OS's leave) kills the process
        set_threads(self.threads)
        tensors = [tvm.runtime.tensor(a) for a in args]
        self.lib(*tensors)
        return tensors[-1].numpy().reshape(self.out_shape)

    def arguments(self, packed: tuple, bias: np.ndarray | None, residual: np.ndarray | None = None) -> list[np.ndarray]:
        """The compiled function's arguments after the data: `constants`, the residual (with a
        fused residual add), a new output array; in the module's shapes (flat_geometry)."""
        return [*self.constants(packed, bias), *self._residual(residual),
                np.zeros(self.plan.out_shape, self.plan.output_dtype)]

    def _residual(self, residual: np.ndarray | None) -> list[np.ndarray]:
        """[residual] checked and in the module's shape, or [] for an op without a residual add."""
        plan = self.plan
        if (residual is None) != (plan.residual is None):
            raise TypeError("this op adds a residual: pass residual= (the output's shape and dtype)" if residual is None
                            else "this op was compiled without a residual add (conv2d(..., residual=True, ...))")
        if residual is None:
            return []
        check_array("residual", residual, self.out_shape, plan.output_dtype)
        return [residual.reshape(plan.out_shape)]

    def constants(self, packed: tuple, bias: np.ndarray | None) -> list[np.ndarray]:
        """The arguments that stay fixed from call to call: packed weights, the per-channel int32
        terms (the expansion's plus the user's bias), the multipliers."""
        plan, g = self.plan, self.geometry
        args = [packed[0]]
        if plan.bias:
            total = packed[1].astype(np.int64) if plan.expands else np.zeros(plan.bias_shape, np.int64)
            if bias is not None:
                check_array("bias", bias, (g.o,), "int32")
                total = total + bias.astype(np.int64).reshape(plan.bias_shape)
            if np.abs(total).max(initial=0) > 2**31 - 1:
                raise ValueError("bias plus the zero-point terms overflows int32")
            args.append(total.astype(np.int32))
        elif bias is not None:
            raise TypeError("this op was compiled without bias (conv2d(..., bias=True) takes one)")
        if self.multipliers is not None:
            args.append(self.multipliers)
        return args

    def __call__(self, data: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
                 residual: np.ndarray | None = None) -> np.ndarray:
        return self.run_packed(data, self.pack_weights(weight), bias, residual)

    def bind(self, weight: np.ndarray, bias: np.ndarray | None = None):
        """Pack `weight` (and fold `bias` with the zero-point terms) once, into TVM tensors; the
        result is f(data) -> output, which only checks and wraps the data. x86, not emulated."""
        if self.isa.arch != "x86" or self.emulate:
            raise ValueError("bind() runs the layer natively on x86; use op(data, weight) here")
        require_host(self.plan.kern.isa)
        plan = self.plan
        fixed = [tvm.runtime.tensor(a) for a in self.constants(self.pack_weights(weight), bias)]
        out = tvm.runtime.tensor(np.zeros(plan.out_shape, plan.output_dtype))

        def run(data: np.ndarray, residual: np.ndarray | None = None) -> np.ndarray:
            check_array("data", data, self.data_shape, self.dtype)
            self._check_legalized("data", data)
            extra = [tvm.runtime.tensor(r) for r in self._residual(residual)]
            set_threads(self.threads)
            self.lib(tvm.runtime.tensor(data.reshape(plan.data_shape)), *fixed, *extra, out)
            return out.numpy().reshape(self.out_shape)

        return run


def schedule(g: Geometry, isa: Isa, quant: Quantization, post_ops: PostOps = NO_POST_OPS,
             threads: int | None = None, emulate: bool = False, algorithm: str = "auto") -> Int8Conv2dOp:
    """The layer compiled (what conv2d returns for a quantized layer; compiling is cheap). ARM
    ops run under qemu, x86 ones natively or, with emulate, on the Bochs CPU (quant.data_layout:
    NCHW, or NHWC on x86); algorithm as `prepare` takes it."""
    mod, op = prepare(g, isa, quant, post_ops, threads, emulate, algorithm)
    op.lib = tvm.compile(mod, target=int_target(op.plan.kern.isa) if isa.arch == "x86" else isa.target)
    return op


def prepare(g: Geometry, isa: Isa, quant: Quantization, post_ops: PostOps = NO_POST_OPS,
            threads: int | None = None, emulate: bool = False,
            algorithm: str = "auto") -> tuple[tvm.IRModule, Int8Conv2dOp]:
    """The layer checked and scheduled, not compiled: (its IRModule, an op without a library,
    which packs weights and makes the arguments). `schedule` compiles it; the Relax pass adds the
    module's function to the model instead. algorithm: "auto" (Winograd where `winograd` takes
    the layer, else direct), "direct", or "winograd" (refused, saying why, where it does not apply)."""
    data_layout = quant.data_layout
    if data_layout == "NHWC" and isa.arch != "x86":
        raise ValueError("data_layout='NHWC' is an x86 option of the quantized conv2d; the ARM targets take NCHW")
    if isa.name == AMX_INT8.name and emulate:
        isa = AVX512_VNNI  # the Bochs CPU has no AMX; its VNNI runs the same arithmetic
    dtype, weight_dtype = quant.dtype, quant.weight_dtype
    for name, dt in (("dtype", dtype), ("weight_dtype", weight_dtype)):
        if dt not in ZERO_POINT_RANGE:
            raise ValueError(f"{name} {dt!r} is not supported on {isa.name} targets; "
                             f"use 'int8' or 'uint8' (or 'int16' for legalized, zero-point-free data)")
    if (dtype == "int16") != (weight_dtype == "int16"):
        raise ValueError(f"dtype {dtype!r} with weight_dtype {weight_dtype!r}: int16 is the legalized, "
                         "zero-point-free form, for data and weights together")
    zp_x = zero_point("input_zero_point", quant.input_zero_point, dtype)
    zp_w = zero_point("weight_zero_point", quant.weight_zero_point, weight_dtype)
    if post_ops.residual != quant.adds_residual:
        raise ValueError("a fused residual on the quantized conv2d is the quantized add: residual=True with "
                         "residual_scale, residual_zero_point, sum_scale and sum_zero_point, together")
    if post_ops.residual and isa.arch != "x86":
        raise ValueError("the fused quantized residual add is an x86 option; the ARM targets add it after the layer")
    if post_ops.activation == "clip":
        raise ValueError("activation 'clip' is not available on the quantized conv2d; a requantized output "
                         "saturates to its dtype, and 'relu' raises the lower bound to the output zero point")
    if quant.requantizes:
        quant.multipliers(g.o)  # the per-channel count and float32 range, before compiling
    k = g.cg * g.kh * g.kw
    kern = conv_kernel(isa, dtype, is_depthwise(g), g)
    if k > MAX_K:
        raise ValueError(f"reduction length C/groups*KH*KW = {k} exceeds {MAX_K}, the longest sum of "
                         f"8-bit products (each up to {MAX_PRODUCT}) that int32 holds exactly")
    if kern.group == 4 and not is_depthwise(g):
        bound, what = ((MAX_K_VNNI, "vpdpbusd expansion (four terms, each up to 255*128*K)")
                       if isinstance(kern, IntGemmKernel) else (MAX_K_DOT, "sdot expansion (four terms, each up to 128*128*K)"))
        if k > bound:
            raise ValueError(f"reduction length C/groups*KH*KW = {k} exceeds {bound}, the longest the {what} keeps "
                             "exact in int32")
    residual = (*quant.residual_ratios(), quant.residual_zero_point, quant.sum_zero_point) if post_ops.residual else None
    output = {"output_dtype": quant.output_dtype, "bias": post_ops.bias, "activation": post_ops.activation,
              "zp_out": quant.output_zero_point, "nhwc": data_layout == "NHWC", "residual": residual}
    zw8 = zp_w - weight_shift(weight_dtype)
    wino = None
    if algorithm != "direct":
        wino, why_not = winograd(g, isa, quant, zp_x, zp_w)
        if algorithm == "winograd" and wino is None:
            raise ValueError(f"algorithm='winograd' does not apply to this quantized layer: {why_not}")
    pair, s2d, sub = paired(g, kern), space_to_depth(g, data_layout, isa, zw8), subsampled(g, data_layout, isa)
    form = WINOGRAD if wino else PAIRED if pair else SPACE_TO_DEPTH if s2d else SUBSAMPLED if sub else None
    mod, plan = build(wino or pair or s2d or sub or flat_geometry(g, data_layout, isa), isa, dtype, zp_x, zp_w=zp_w,
                      weight_dtype=weight_dtype, output=output, source=(g, form) if form else None)
    return mod, Int8Conv2dOp(g, isa, None, plan, quant, zp_x, zp_w, threads, emulate)


def flat_geometry(g: Geometry, data_layout: str, isa: Isa) -> Geometry:
    """A channels-last 1x1, stride-1, unpadded x86 layer as the same conv on long rows: its H*W
    pixels, consecutive in memory either way, in rows of flat_row's length (one row up to 256),
    which take whole tiles where a 14- or 7-pixel row pads them or takes short ones (an AMX tile
    of 7 rows runs at a third of its peak). The op keeps the user's shapes
    (Int8Conv2dOp.data_shape); the module reads and writes the same memory as
    (N, H*W / row, row, C). Other layers come back as they are."""
    if not (data_layout == "NHWC" and isa.arch == "x86" and g.kh == g.kw == 1 and g.stride == (1, 1)
            and not any(g.pad) and g.h > 1 and not is_depthwise(g)):
        return g
    row = flat_row(g.h * g.w)
    return dataclasses.replace(g, h=g.h * g.w // row, w=row)


def winograd_max_channels(quant: Quantization, zp_x: int, zp_w: int) -> int:
    """The most input channels for which Winograd's integer sums stay exact in int32
    (WINOGRAD_GROWTH): 685 for uint8 data of zero point 0 with int8 weights of zero point 0."""
    lo, hi = ZERO_POINT_RANGE[quant.dtype]
    wlo, whi = ZERO_POINT_RANGE[quant.weight_dtype]
    d, w = max(zp_x - lo, hi - zp_x), max(zp_w - wlo, whi - zp_w)
    return (2**31 - 1) // (WINOGRAD_GROWTH * d * w)


def winograd(g: Geometry, isa: Isa, quant: Quantization, zp_x: int, zp_w: int) -> tuple[Geometry | None, str]:
    """(the 16 GEMMs of Winograd F(2x2, 3x3) as one grouped 1x1 layer, "") for a layer that takes
    it, or (None, why not): 3x3 stride-1 undilated single-group 8-bit layers of at
    least WINOGRAD_MIN_CHANNELS channels each way, on the int16 upcast tile (x86 without VNNI,
    where a product costs what a direct conv's does; vpdpbusd multiplies 8-bit values, which
    the transformed ones are not), up to winograd_max_channels. Its pixels are the layer's 2x2
    output tiles, in rows of flat_row's length; its 16 groups the GEMMs."""
    if isa.arch != "x86":
        return None, "it is an x86 option"
    if quant.dtype == "int16" or quant.weight_dtype == "int16":
        return None, "it transforms 8-bit data and weights, not the legalized int16 form"
    kern = conv_kernel(isa, quant.dtype, False, g)
    if not (isinstance(kern, IntGemmKernel) and kern.op == "s16"):
        return None, f"{kern.name} multiplies 8-bit values as they are; Winograd runs on the int16 upcast tile"
    if not (g.kh == g.kw == 3 and g.stride == (1, 1) and g.dilation == (1, 1) and g.groups == 1):
        return None, "it takes 3x3 kernels of stride 1, without dilation, in one group"
    if min(g.c, g.o) < WINOGRAD_MIN_CHANNELS:
        return None, f"it needs at least {WINOGRAD_MIN_CHANNELS} input and output channels"
    most = winograd_max_channels(quant, zp_x, zp_w)
    if g.c > most:
        return None, (f"{g.c} input channels exceed {most}, the most whose transformed sums stay exact in int32 "
                      "with these zero points")
    th, tw = winograd_tiles(g)
    row = flat_row(th * tw)
    return dataclasses.replace(g, c=16 * g.c, o=16 * g.o, h=th * tw // row, w=row, kh=1, kw=1, stride=(1, 1),
                               pad=(0, 0, 0, 0), dilation=(1, 1), groups=16), ""


def paired(g: Geometry, kern) -> Geometry | None:
    """A layer of an odd number of channels on the int16 upcast (`kern`: vpmaddwd multiplies K in
    pairs), whose stride starts every window on an even value of the padded row (SW * C even:
    ResNet's stem, 3 channels at stride 2), as the conv over its padded rows read as pairs of
    values: 2 channels, ceil(KW * C / 2) columns at stride SW * C / 2, the padding of the rows
    packed in. A kernel row's KW * C values then take one K of that rounded up to even, where
    channels padded to C + 1 take KW * (C + 1) (the stem: 7 rows of 22 against 28, 154 products
    per output against 196); the odd value out, past the window, meets a zero weight
    (paired_weights). Single-group, undilated layers of more than one column; None for the rest."""
    if not (isinstance(kern, IntGemmKernel) and kern.group == 2 and g.groups == 1 and g.c % 2 == 1
            and (g.stride[1] * g.c) % 2 == 0 and g.kw > 1 and g.dilation == (1, 1)):
        return None
    kw, sw = -(-g.kw * g.c // 2), g.stride[1] * g.c // 2
    return dataclasses.replace(g, c=2, w=(g.out_hw[1] - 1) * sw + kw, kw=kw, stride=(g.stride[0], sw),
                               pad=(g.pad[0], 0, g.pad[2], 0))


def paired_weights(w: np.ndarray, kw: int) -> np.ndarray:
    """OIHW weights (zero point out) -> those of the paired form (paired) with `kw` columns of
    two channels: a kernel row's values in the data's order, (column, channel), then zeros."""
    o, c, kh, kw0 = w.shape
    rows = np.zeros((o, kh, 2 * kw), w.dtype)
    rows[:, :, : kw0 * c] = w.transpose(0, 2, 3, 1).reshape(o, kh, kw0 * c)
    return np.ascontiguousarray(rows.reshape(o, kh, kw, 2).transpose(0, 3, 1, 2))


def space_to_depth(g: Geometry, data_layout: str, isa: Isa, zw8: int) -> Geometry | None:
    """A stride-2 layer too narrow for the AMX tiles (ResNet's stem: 3 channels, which pad to 64
    for a kernel row's K) as the stride-1 conv it equals on 2 x 2 blocks of pixels: 4 * C
    channels, a ceil(KH/2) x ceil(KW/2) kernel whose taps past the original's are zero, so its
    kernel rows take whole 64-deep steps for less padding (the stem: K 147 -> 192 where VNNI pads
    it to 196 at a quarter of AMX's rate per step). Channels-last AMX layers of one group whose
    weights' zero point is 0 (zero taps must add nothing), where the form takes AMX and the layer
    itself would not; None for the rest."""
    if not (data_layout == "NHWC" and isa.name == AMX_INT8.name and g.stride == (2, 2) and g.dilation == (1, 1)
            and g.groups == 1 and zw8 == 0 and amx_tile(g) is None):
        return None
    (oh, ow), kh, kw = g.out_hw, -(-g.kh // 2), -(-g.kw // 2)
    s2d = dataclasses.replace(g, c=4 * g.c, h=oh + kh - 1, w=ow + kw - 1, kh=kh, kw=kw, stride=(1, 1), pad=(0, 0, 0, 0))
    return s2d if s2d.out_hw == g.out_hw and amx_tile(s2d) is not None else None


def space_to_depth_weights(weight: np.ndarray) -> np.ndarray:
    """OIHW weights of a stride-2 layer -> those of its space-to-depth form (space_to_depth):
    w'[o, (2 * py + px) * C + c, R, S] = w[o, c, 2R + py, 2S + px], 0 past the kernel's edge."""
    o, c, kh, kw = weight.shape
    full = np.zeros((o, c, 2 * -(-kh // 2), 2 * -(-kw // 2)), weight.dtype)
    full[:, :, :kh, :kw] = weight
    # (o, c, R, py, S, px) -> (o, py, px, c, R, S)
    blocks = full.reshape(o, c, kh // 2 + kh % 2, 2, kw // 2 + kw % 2, 2).transpose(0, 3, 5, 1, 2, 4)
    return np.ascontiguousarray(blocks.reshape(o, 4 * c, -(-kh // 2), -(-kw // 2)))


def subsampled(g: Geometry, data_layout: str, isa: Isa) -> Geometry | None:
    """A channels-last 1x1 strided unpadded x86 layer as the 1x1 stride-1 layer on its strided
    pixels, the OH * OW of them packed into rows of flat_row's length (flat_geometry's long
    tiles, where a 7- or 14-pixel output row gave 7-row AMX tiles: ResNet's downsampling
    layers); None for the rest. The module's output is those rows, the user's (N, OH, OW, O) as
    it lies in memory."""
    if not (data_layout == "NHWC" and isa.arch == "x86" and g.kh == g.kw == 1 and g.stride != (1, 1)
            and not any(g.pad) and not is_depthwise(g)):
        return None
    oh, ow = g.out_hw
    row = flat_row(oh * ow)
    return dataclasses.replace(g, h=oh * ow // row, w=row, stride=(1, 1), dilation=(1, 1))


FLAT_ROW_MAX = 256  # pixels per row of a flattened layer (flat_row)


def flat_row(pixels: int) -> int:
    """Pixels per row when `pixels` consecutive ones are tiled as rows (flat_geometry,
    subsampled): all of them up to FLAT_ROW_MAX, else the longest row up to that which divides
    them and takes whole 16- or 28-pixel tiles (56 x 56: 14 rows of 224). Rows rather than one
    long row give the threads rows of their own (Int8Plan.rows_outer)."""
    if pixels <= FLAT_ROW_MAX:
        return pixels
    rows = [d for d in range(16, FLAT_ROW_MAX + 1) if pixels % d == 0 and (d % 16 == 0 or d % 28 == 0)]
    return max(rows) if rows else pixels
