"""The plan of one quantized layer (Int8Plan): the tile it runs on, its form (forms/), the
shapes of the packed input, weights and accumulators, the parallel tasks, and `why`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from microkernels.int_amx import K_DEPTH, AmxGemmKernel
from microkernels.int_gemm import IntGemmKernel
from microkernels.int_mac import MacKernel

from ...common.tir import ceil_to
from . import forms
from .forms import WINOGRAD
from .tiles import MAX_PRODUCT, flat_rows

DEPTHWISE_LANES = 8  # int16 channels per q register (ARM); x86: Int8Plan.lanes
MAX_CHUNKS = 64  # parallel chunks of a tile-local layer (Int8Plan.chunks)
MAX_FLOAT_TAPS = 2**24 // MAX_PRODUCT  # 258: float32 sums of integer products exact (Int8Plan.float_taps)


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
        requantized right after each tile's reduction (`gemm.tile_store`), instead of in an int32
        copy of the whole output: channels-last x86 GEMM layers without window sums (weights'
        zero point 0, as quantizers write them)."""
        return (self.nhwc and self.parallel and not self.depthwise and not (self.dot and self.windows)
                and self.form != WINOGRAD)

    @property
    def fused_store(self) -> bool:
        """Whether each tile leaves requantized from the kernel's registers (the x86 GEMM kernel's
        requantizing batch-reduce variant, IntGemmKernel(requant=...), one call per tile) instead
        of through an MR x NR int32 scratch tile and the TIR store (gemm.tile_store): tile-local
        layers of an 8-bit output with the per-channel bias, no residual add, and only whole tiles
        (rows of whole tiles, groups of whole NR blocks, no pitch), which the kernel can write
        without a predicate. It saves the scratch round trip and the store's loop: MobileNetV2's
        16 -> 96 1x1 layer at 112 x 112 (K = 16) spent more time storing than multiplying."""
        g = self.g
        return (self.tile_local and isinstance(self.kern, IntGemmKernel) and self.output_dtype in ("uint8", "int8")
                and self.bias and self.residual is None and not self.pitch and self.ow_padded == g.out_hw[1]
                and self.op == g.og and self.activation in (None, "relu"))

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
        """Depthwise on x86: NCHW as it is, a row of pixels in the vector lanes (`depthwise.schedule_rows`)."""
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
        form = forms.note(self)
        if isinstance(kern, AmxGemmKernel):
            return (f"{kern.name}: AMX tdpbusd, {kern.a_tiles} x {kern.b_tiles} tiles of {kern.rows} pixels x 16 "
                    f"channels, uint8 x int8 as they are, zero points through the expansion, channels padded "
                    f"{self.g.cg} -> {self.cp} (K in steps of {K_DEPTH}){form}")
        if isinstance(kern, IntGemmKernel) and kern.pairs:
            return (f"{kern.name}: vpmaddubsw pairs ({kern.isa.name}, no VNNI), uint8 x int8 as they are, zero "
                    f"points through the expansion; exact: every pair of weights it sums in 16 bits has "
                    f"|w_a| + |w_b| <= 128 (7-bit weights, checked on the packed weights){form}")
        if isinstance(kern, IntGemmKernel) and kern.op == "u8s8":
            return (f"{kern.name}: vpdpbusd ({kern.isa.name}), uint8 x int8 as they are, zero points through "
                    f"the expansion{form}")
        if isinstance(kern, IntGemmKernel):
            why = ("Winograd's transformed weights take the upcast whatever weight_bits says" if self.form == WINOGRAD
                   else "weights not within the pair bound of the vpmaddubsw tile (weight_bits=8); or int16 data")
            return (f"{kern.name}: the int16 upcast, vpmaddwd on x - zp_x and w - zp_w packed once "
                    f"({kern.isa.name}: no VNNI asked for or available; {why}){form}")
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
