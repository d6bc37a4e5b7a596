"""Quantized conv2d, spatial pack, tensorized on an integer tile: the NEON MAC tiles on ARM, the
x86 tiles (vpdpbusd with VNNI, tdpbusd with AMX, the int16 vpmaddwd upcast without) on x86.

Computes out[n, o, y, x] = sum (x_in - zp_x) * (w - zp_w) in int32, from int8/uint8 data and
weights. Three stages, as in TVM's ARM spatial-pack schedule:
    pack (data_vec):   x - zp_x widened to int16, zero-padded (a padded pixel is the zero point,
                       so it contributes 0), channels last: (N, G, Hp, Wp, Cp)
    conv (conv_vec):   MR pixels x NR output channels per tile, the tile's whole reduction
                       (KH calls of K = KW*Cp, the row's columns back to back) on the kernel;
                       the output row is padded up to a multiple of MR, so no tail tiles
    unpack:            the int32 tiles back to NCHW (or, channels-last on x86, each tile's
                       outputs stored requantized right after its reduction)
The weights are widened and packed once, outside, by `pack_weights` (kernel_vec): w - zp_w as
int16, (G, O/NR, KH, KW, Cp, NR). Upcasting to int16 here, at the schedule, keeps the weights int8
in the model; `relax_int8.legalize_int8_conv2d` is the other design point (upcast in the graph).

The raw-8-bit tiles (aarch64 sdot, x86 vpdpbusd and tdpbusd) multiply 8-bit values as they are,
so the zero points cannot be subtracted while packing (x - zp_x need not fit 8 bits). They use
the expansion
    sum (x - zx)(w - zw) = sum x*w - zw * sum x - zx * sum w + K * zx * zw
with the data shifted to the tile's signedness first (values.data_shift): the tile computes
sum x*w, a small pass sums each window's inputs (sum x, 1/O of the conv's work; only where
zw != 0), and sum w comes with the packed weights as a per-channel bias. Padding holds the zero
point, so it cancels in the expansion as it should. Depthwise layers skip the GEMM (depthwise).

The package, from the bottom:
    values       zero points, the raw tiles' shifts, the upcast's widening
    tiles        the per-ISA tile table (ARM_TILES, X86_TILES): tile, K step, dtypes, exactness
    forms/       the forms a layer runs in (winograd, paired, space_to_depth, subsampled,
                 direct), each with applies() and its pack; forms/__init__ alone chooses
    output       each output element: bias, requantize / dequantize, the fused residual add
    plan         Int8Plan: the buffers' shapes, the parallel tasks, `why`
    entry        the layer function's arguments and buffers
    stages       the x86 path's stages on all threads
    gemm         the GEMM tiles; depthwise: channels (or a row's pixels) in lanes
    weights      pack_weights; pairs_fit, the vpmaddubsw tile's bound on a layer's weights
    build        one layer's plan and scheduled TIR
    op           prepare, schedule and Int8Conv2dOp, what conv2d returns for a quantized layer
ARM code is compiled here and, since this host is x86, run under qemu-user (`emulate`); x86
code runs natively, or on the Bochs CPU with emulate=True.
"""

from .build import build
from .forms import PAIRED, SPACE_TO_DEPTH, SUBSAMPLED, WINOGRAD, Layer, choose
from .forms.direct import flat_geometry
from .forms.winograd import MIN_CHANNELS as WINOGRAD_MIN_CHANNELS
from .forms.winograd import max_channels as winograd_max_channels
from .op import Int8Conv2dOp, prepare, schedule
from .plan import DEPTHWISE_LANES, MAX_CHUNKS, MAX_FLOAT_TAPS, Int8Plan
from .tiles import (
    AMX_MAX_PADDING,
    ARM_TILES,
    MAX_K,
    MAX_K_DOT,
    MAX_K_VNNI,
    MAX_PRODUCT,
    X86_TILES,
    amx_padded_channels,
    amx_tile,
    conv_kernel,
    flat_row,
    x86_tile,
)
from .values import ZERO_POINT_RANGE, data_shift, is_depthwise, weight_shift, zero_point
from .weights import pack_weights, pairs_fit

__all__ = ["AMX_MAX_PADDING", "ARM_TILES", "DEPTHWISE_LANES", "Int8Conv2dOp", "Int8Plan", "Layer", "MAX_CHUNKS",
           "MAX_FLOAT_TAPS", "MAX_K", "MAX_K_DOT", "MAX_K_VNNI", "MAX_PRODUCT", "PAIRED", "SPACE_TO_DEPTH",
           "SUBSAMPLED", "WINOGRAD", "WINOGRAD_MIN_CHANNELS", "X86_TILES", "ZERO_POINT_RANGE", "amx_padded_channels",
           "amx_tile", "build", "choose", "conv_kernel", "data_shift", "flat_geometry", "flat_row", "is_depthwise",
           "pack_weights", "pairs_fit", "prepare", "schedule", "weight_shift", "winograd_max_channels", "x86_tile", "zero_point"]
