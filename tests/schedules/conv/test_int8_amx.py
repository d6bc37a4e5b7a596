"""schedules.conv2d quantized on the AMX tiles (target "x86-amx", and "native" on an AMX host):
which layers take them and why, and their results bit-exact against the int64 reference and the
requantized rule, NCHW and channels-last, over strides, dilations, paddings, groups, batches,
zero points and output channel counts that leave a partial tile.

Coverage by host: the plan tests run everywhere (compiling needs no AMX). The numerics run only
on a host with amx_tile and amx_int8 whose kernel lends the tile state; no emulator here has
AMX, so elsewhere they are skipped, saying so (emulate=True runs an AMX target's layers on the
VNNI tile instead, which the plan test checks)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedules
from microkernels import AMX_INT8
from microkernels.int_amx import AmxGemmKernel
from microkernels.int_gemm import IntGemmKernel
from schedules.common.tir import ceil_to
from schedules.conv.int8 import AMX_MAX_PADDING, MAX_K_VNNI, amx_padded_channels

from ... import conv_reference
from ...testers.int_gemm import requantize

needs_amx = pytest.mark.skipif(not AMX_INT8.host_supports(),
                               reason=f"no AMX here ({', '.join(AMX_INT8.host_missing())}); no emulator implements it")


def test_layers_with_whole_64_deep_steps_take_amx_and_the_rest_vnni():
    """64 channels (a 1x1 and a 3x3 row: K in whole steps of 64) go to AMX; 3 channels (the
    stem: padding to 64 would multiply the work by 21) and 42 (64 > 1.5 * 42) to the VNNI tile of
    the same host; 43 (64 <= 1.5 * 43) to AMX. The plan says which, and why."""
    def plan(c, k, **kw):
        return schedules.conv2d((1, c, 14, 14), (64, c, k, k), padding=k // 2, dtype="uint8", target="x86-amx",
                                **kw).plan

    for c, k in ((64, 1), (64, 3), (43, 3), (128, 1)):
        p = plan(c, k)
        assert isinstance(p.kern, AmxGemmKernel), (c, k, p.why)
        assert "AMX tdpbusd" in p.why and p.cp == amx_padded_channels(p.g) and (p.cp * k) % 64 == 0
    for c, k in ((3, 7), (42, 3), (16, 1)):
        p = plan(c, k)
        assert isinstance(p.kern, IntGemmKernel) and p.kern.isa.name == "avx512vnni", (c, k, p.why)
        assert amx_padded_channels(p.g) > AMX_MAX_PADDING * c
    assert isinstance(plan(64, 3, emulate=True).kern, IntGemmKernel)  # the Bochs CPU has no AMX


def test_reduction_beyond_the_tdpbusd_bound_is_refused():
    """tdpbusd multiplies uint8 by int8 as vpdpbusd does, so its expansion's terms (up to
    255 * 128 * K each) bound the reduction as the VNNI tile's: a layer the AMX tiles take, with
    C*KH*KW just past MAX_K_VNNI (16448) and within sdot's looser 32767, is refused, naming the
    bound; one just within it plans on AMX."""
    from schedules.conv import int8

    def layer(c):
        return (1, c, 4, 4), (16, c, 3, 3)

    within, beyond = MAX_K_VNNI // 9 // 64 * 64, MAX_K_VNNI // 9 // 64 * 64 + 64  # whole 64-deep steps
    assert within * 9 <= MAX_K_VNNI < beyond * 9 < int8.MAX_K_DOT
    plan = schedules.conv2d(*layer(within), padding=1, dtype="uint8", target="x86-amx").plan
    assert isinstance(plan.kern, AmxGemmKernel), plan.why
    with pytest.raises(ValueError, match=f"exceeds {MAX_K_VNNI}, the longest the tdpbusd expansion"):
        schedules.conv2d(*layer(beyond), padding=1, dtype="uint8", target="x86-amx")


def test_tile_fits_the_output_row():
    """A 56- or 28-pixel row in tiles of 2 x 14 pixels (no padded columns), a 7-pixel row in one
    A tile of 7; the output channels in whole tiles of 16."""
    def kern(w, o):
        return schedules.conv2d((1, 64, w, w), (o, 64, 3, 3), padding=1, dtype="uint8", target="x86-amx").plan.kern

    assert (kern(56, 64).mr, kern(28, 128).mr) == (28, 28)
    k7 = kern(7, 512)
    assert k7.mr == 7 and k7.a_tiles == 1


@st.composite
def amx_layers(draw):
    """Layers that take the AMX tile: channels per group near whole 64-deep steps."""
    groups = draw(st.sampled_from([1, 1, 1, 2]))
    k = draw(st.sampled_from([1, 3]))
    dilation = draw(st.sampled_from([1, 1, 2])) if k > 1 else 1
    cg = draw(st.sampled_from([44, 60, 64, 100, 128]))
    og = draw(st.integers(1, 70))
    stride = draw(st.sampled_from([1, 2]))
    pad = draw(st.integers(0, k // 2 * dilation))
    span = (k - 1) * dilation + 1
    h, w = draw(st.integers(max(1, span - 2 * pad), 9)), draw(st.integers(max(1, span - 2 * pad), 33))
    n = draw(st.sampled_from([1, 1, 2]))
    return {"x": (n, cg * groups, h, w), "w": (og * groups, cg, k, k), "stride": stride, "padding": pad,
            "dilation": dilation, "groups": groups}


@needs_amx
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_int32_accumulators_match_numpy_exactly(layout):
    @settings(max_examples=10, deadline=None)
    @given(amx_layers(), st.integers(0, 2**32 - 1), st.booleans())
    def check(layer, seed, zero_zp):
        rng = np.random.default_rng(seed)
        zp_x = 0 if zero_zp else int(rng.integers(0, 256))
        zp_w = 0 if zero_zp or rng.random() < 0.5 else int(rng.integers(-128, 128))
        conv = (layer["stride"], layer["padding"], layer["dilation"], layer["groups"])
        n, c, h, w = layer["x"]
        shape = (n, h, w, c) if layout == "NHWC" else layer["x"]
        op = schedules.conv2d(shape, layer["w"], *conv, dtype="uint8", target="x86-amx", input_zero_point=zp_x,
                              weight_zero_point=zp_w, data_layout=layout)
        assert isinstance(op.plan.kern, AmxGemmKernel), op.plan.why
        x = rng.integers(0, 256, layer["x"]).astype(np.uint8)
        wt = rng.integers(-128, 128, layer["w"]).astype(np.int8)
        want = conv_reference.qconv2d(x, wt, zp_x, zp_w, *conv)
        got = op(np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if layout == "NHWC" else x, wt)
        if layout == "NHWC":
            got = got.transpose(0, 3, 1, 2)
        bad = got != want
        assert not bad.any(), f"{bad.sum()} of {got.size} differ ({op.plan.why}); first {np.argwhere(bad)[0]}"

    check()


@needs_amx
@pytest.mark.parametrize("o", [64, 56])
def test_requantized_channels_last_output_is_onnx_rounding_bit_for_bit(o):
    """The channels-last path the networks run (tile-local accumulators, each tile requantized as
    it leaves): per-channel scales, a bias, ReLU, saturation at both ends. 56 output channels take
    two blocks of 32, the second partial: its 8 extra channels must not be stored, or they land on
    the next pixel's first channels after the first block's tasks wrote them."""
    rng = np.random.default_rng(11)
    x_shape, w_shape = (2, 9, 30, 64), (o, 64, 3, 3)
    sx, sy, zp = 0.02, 0.05, 131
    sw = (10.0 ** rng.uniform(-3, -1.5, o)).astype(np.float32)
    x = rng.integers(0, 256, x_shape).astype(np.uint8)
    w = rng.integers(-128, 128, w_shape).astype(np.int8)
    bias = rng.integers(-3000, 3000, o).astype(np.int32)
    for relu in (False, True):
        op = schedules.conv2d(x_shape, w_shape, padding=1, dtype="uint8", target="x86-amx", input_zero_point=9,
                              output_dtype="uint8", input_scale=sx, weight_scale=sw, output_scale=sy,
                              output_zero_point=zp, bias=True, activation="relu" if relu else None, data_layout="NHWC")
        assert op.plan.tile_local and isinstance(op.plan.kern, AmxGemmKernel) and op.plan.op == ceil_to(o, 32)
        acc = conv_reference.qconv2d(x.transpose(0, 3, 1, 2), w, 9, 0, 1, 1, 1, 1) + bias[None, :, None, None]
        m = np.float32(sx) * sw / np.float32(sy)
        want = requantize(acc, np.int32(0), m[None, :, None, None], zp, zp if relu else 0, 255, "uint8")
        got = op.bind(w, bias)(x)
        np.testing.assert_array_equal(got.transpose(0, 3, 1, 2), want)
        assert got.min() == (zp if relu else 0) and got.max() == 255, "the data did not saturate"


def test_channels_last_1x1_layers_run_as_one_long_row():
    """A channels-last 1x1 stride-1 layer is planned on one row of H*W pixels (the same memory),
    so its tiles are the long ones; the op keeps the user's shapes. Anything else keeps its rows."""
    op = schedules.conv2d((1, 14, 14, 256), (64, 256, 1, 1), dtype="uint8", target="x86-amx", data_layout="NHWC")
    assert op.plan.data_shape == (1, 1, 196, 256) and op.data_shape == (1, 14, 14, 256)
    assert op.plan.out_shape == (1, 1, 196, 64) and op.out_shape == (1, 14, 14, 64)
    assert op.plan.kern.mr > 14  # longer than the image's rows
    for kwargs in (dict(padding=1), dict(stride=2)):
        kept = schedules.conv2d((1, 14, 14, 256), (64, 256, 1, 1), dtype="uint8", target="x86-amx",
                                data_layout="NHWC", **kwargs)
        assert kept.plan.data_shape == kept.data_shape
    nchw = schedules.conv2d((1, 256, 14, 14), (64, 256, 1, 1), dtype="uint8", target="x86-amx")
    assert nchw.plan.data_shape == nchw.data_shape


@needs_amx
def test_flattened_layer_with_residual_is_exact():
    """The flattened 1x1 layer (7x7 pixels, a partial last tile) with the fused residual add,
    through op() and bind(), against the unflattened VNNI layer of the same quantization."""
    rng = np.random.default_rng(4)
    x = rng.integers(0, 256, (2, 7, 7, 128)).astype(np.uint8)
    w = rng.integers(-128, 128, (96, 128, 1, 1)).astype(np.int8)
    b = rng.integers(-2000, 2000, 96).astype(np.int32)
    r = rng.integers(0, 256, (2, 7, 7, 96)).astype(np.uint8)
    q = dict(dtype="uint8", input_zero_point=7, output_dtype="uint8", input_scale=0.02, weight_scale=0.001,
             output_scale=0.05, output_zero_point=100, bias=True, residual=True, residual_scale=0.04,
             residual_zero_point=90, sum_scale=0.06, sum_zero_point=5, data_layout="NHWC")
    amx = schedules.conv2d(x.shape, w.shape, target="x86-amx", **q)
    assert amx.plan.data_shape == (2, 1, 49, 128) and isinstance(amx.plan.kern, AmxGemmKernel)
    want = schedules.conv2d((2, 128, 7, 7), w.shape, target="x86-avx512vnni", **{**q, "data_layout": "NCHW"})(
        np.ascontiguousarray(x.transpose(0, 3, 1, 2)), w, b, residual=np.ascontiguousarray(r.transpose(0, 3, 1, 2)))
    got = amx(x, w, b, residual=r)
    assert got.shape == (2, 7, 7, 96)
    np.testing.assert_array_equal(got.transpose(0, 3, 1, 2), want)
    np.testing.assert_array_equal(amx.bind(w, b)(x, residual=r), got)


# Requantized with a fused residual add: the store the networks run, checked on each path below.
RESIDUAL_QUANT = {"output_dtype": "uint8", "input_scale": 0.02, "weight_scale": 0.002, "output_scale": 0.05,
                  "output_zero_point": 100, "bias": True, "residual": True, "residual_scale": 0.04,
                  "residual_zero_point": 90, "sum_scale": 0.06, "sum_zero_point": 5}

@st.composite
def pitched_layers(draw):
    """Channels-last stride-1 layers with kernels of several rows: what runs as one flat run of
    padded rows (Int8Plan.pitch). Asymmetric and no padding, non-square kernels, groups, batches,
    widths that leave the last tile part empty and output channels that leave a partial block."""
    groups = draw(st.sampled_from([1, 1, 2]))
    kh, kw = draw(st.sampled_from([(3, 3), (3, 3), (5, 5), (3, 1), (2, 3)]))
    pad = tuple(draw(st.integers(0, k // 2 + (k == 2))) for k in (kh, kw, kh, kw))
    cg = draw(st.sampled_from([60, 64, 128]))
    h = draw(st.integers(max(1, kh - pad[0] - pad[2]), 9))
    w = draw(st.integers(max(1, kw - pad[1] - pad[3]), 20))
    return {"x": (draw(st.sampled_from([1, 2])), cg * groups, h, w), "w": (draw(st.integers(1, 50)) * groups, cg, kh, kw),
            "padding": pad, "groups": groups}


@needs_amx
def test_pitched_layers_match_numpy_exactly():
    """Tiles that span output rows over the padded rows laid back to back: int32 accumulators and
    requantized outputs with a fused residual add, bit for bit (the residual through the VNNI
    tile's NCHW op of the same quantization, which does not run pitched); a non-zero weight zero
    point keeps the layer off the pitched path (window sums need the whole-output accumulators)."""
    @settings(max_examples=12, deadline=None)
    @given(pitched_layers(), st.integers(0, 2**32 - 1))
    def check(layer, seed):
        rng = np.random.default_rng(seed)
        w_shape, w = layer["w"], layer["x"][3]
        conv = dict(padding=layer["padding"], groups=layer["groups"])
        zp_x, zp_w = int(rng.integers(0, 256)), int(rng.integers(-128, 128)) if rng.random() < 0.3 else 0
        x = rng.integers(0, 256, layer["x"]).astype(np.uint8)
        wt = rng.integers(-128, 128, w_shape).astype(np.int8)
        xl = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        op = schedules.conv2d(xl.shape, w_shape, **conv, dtype="uint8", target="x86-amx", input_zero_point=zp_x,
                              weight_zero_point=zp_w, data_layout="NHWC")
        assert isinstance(op.plan.kern, AmxGemmKernel), op.plan.why
        assert (op.plan.pitch > 0) == (zp_w == 0), (op.plan.pitch, zp_w)
        if op.plan.pitch:
            assert op.plan.pitch == w + layer["padding"][1] + layer["padding"][3]
        want = conv_reference.qconv2d(x, wt, zp_x, zp_w, 1, layer["padding"], 1, layer["groups"])
        got = op(xl, wt).transpose(0, 3, 1, 2)
        bad = got != want
        assert not bad.any(), f"{bad.sum()} of {got.size} differ ({op.plan.why}); first {np.argwhere(bad)[0]}"
        if zp_w:
            return
        bias = rng.integers(-3000, 3000, w_shape[0]).astype(np.int32)
        r = rng.integers(0, 256, want.shape).astype(np.uint8)
        quant = dict(**conv, dtype="uint8", input_zero_point=zp_x, **RESIDUAL_QUANT)
        ref = schedules.conv2d(x.shape, w_shape, target="x86-avx512vnni", **quant)(x, wt, bias, residual=r)
        fused = schedules.conv2d(xl.shape, w_shape, target="x86-amx", data_layout="NHWC", **quant)
        assert fused.plan.pitch > 0
        got = fused.bind(wt, bias)(xl, residual=np.ascontiguousarray(r.transpose(0, 2, 3, 1)))
        np.testing.assert_array_equal(got.transpose(0, 3, 1, 2), ref)

    check()


def test_stem_runs_on_amx_as_space_to_depth():
    """ResNet's stem (3 channels, 7x7, stride 2), channels-last: its 2 x 2 blocks of pixels as 12
    channels of a 4x4 stride-1 conv, which pads to 16 channels (K 256) on AMX where the layer
    itself would pad 3 to 64; NCHW, the Bochs CPU, a weight zero point or a layer AMX takes as it
    is keep their own form."""
    kw = dict(stride=2, padding=3, dtype="uint8", target="x86-amx")
    op = schedules.conv2d((1, 224, 224, 3), (64, 3, 7, 7), data_layout="NHWC", **kw)
    p = op.plan
    assert isinstance(p.kern, AmxGemmKernel) and p.source is not None and "space-to-depth" in p.why
    assert (p.g.c, p.g.kh, p.g.kw, p.g.stride, p.g.out_hw, p.cp) == (12, 4, 4, (1, 1), (112, 112), 16)
    assert p.data_shape == op.data_shape == (1, 224, 224, 3) and op.out_shape == (1, 112, 112, 64)
    for other in (schedules.conv2d((1, 3, 224, 224), (64, 3, 7, 7), **kw),
                  schedules.conv2d((1, 224, 224, 3), (64, 3, 7, 7), data_layout="NHWC", weight_zero_point=3, **kw),
                  schedules.conv2d((1, 224, 224, 3), (64, 3, 7, 7), data_layout="NHWC", emulate=True, **kw),
                  schedules.conv2d((1, 56, 56, 64), (64, 64, 3, 3), data_layout="NHWC", **kw)):
        assert other.plan.source is None


@st.composite
def space_to_depth_layers(draw):
    """Stride-2 channels-last layers narrow enough that only their space-to-depth form takes AMX:
    3 to 16 channels with 7x7 kernels, or 3 with 8x8 (an 8x8 kernel row of 8 channels is a whole
    64-deep step already); asymmetric padding, odd and even sizes, batches."""
    k, c = draw(st.sampled_from([(7, 3), (7, 4), (7, 8), (7, 16), (8, 3)]))
    pad = tuple(draw(st.integers(0, k // 2)) for _ in range(4))
    h = draw(st.integers(max(1, k - pad[0] - pad[2]), 24))
    w = draw(st.integers(max(1, k - pad[1] - pad[3]), 40))
    return {"x": (draw(st.sampled_from([1, 2])), c, h, w), "w": (draw(st.integers(1, 40)), c, k, k), "padding": pad}


@needs_amx
def test_space_to_depth_layers_match_numpy_exactly():
    """The space-to-depth form on AMX, int32 accumulators against the int64 reference and
    requantized with a fused residual add against the VNNI tile's op of the same quantization
    (which runs the layer as it is)."""
    @settings(max_examples=10, deadline=None)
    @given(space_to_depth_layers(), st.integers(0, 2**32 - 1))
    def check(layer, seed):
        rng = np.random.default_rng(seed)
        zp_x = int(rng.integers(0, 256))
        x = rng.integers(0, 256, layer["x"]).astype(np.uint8)
        wt = rng.integers(-128, 128, layer["w"]).astype(np.int8)
        xl = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        conv = dict(stride=2, padding=layer["padding"], dtype="uint8", input_zero_point=zp_x)
        op = schedules.conv2d(xl.shape, layer["w"], target="x86-amx", data_layout="NHWC", **conv)
        assert op.plan.source is not None and isinstance(op.plan.kern, AmxGemmKernel), op.plan.why
        want = conv_reference.qconv2d(x, wt, zp_x, 0, 2, layer["padding"])
        got = op(xl, wt).transpose(0, 3, 1, 2)
        bad = got != want
        assert not bad.any(), f"{bad.sum()} of {got.size} differ ({op.plan.why}); first {np.argwhere(bad)[0]}"
        bias = rng.integers(-3000, 3000, layer["w"][0]).astype(np.int32)
        r = rng.integers(0, 256, want.shape).astype(np.uint8)
        quant = {**conv, **RESIDUAL_QUANT}
        ref = schedules.conv2d(x.shape, layer["w"], target="x86-avx512vnni", **quant)(x, wt, bias, residual=r)
        fused = schedules.conv2d(xl.shape, layer["w"], target="x86-amx", data_layout="NHWC", **quant)
        got = fused.bind(wt, bias)(xl, residual=np.ascontiguousarray(r.transpose(0, 2, 3, 1)))
        np.testing.assert_array_equal(got.transpose(0, 3, 1, 2), ref)

    check()


@needs_amx
@pytest.mark.parametrize("c, o, hw, n", [(256, 96, 14, 1), (128, 40, 9, 2)])
def test_strided_1x1_layer_on_subsampled_pixels_is_exact(c, o, hw, n):
    """ResNet's downsampling 1x1 stride-2 layers, channels-last: the strided pixels packed into
    one row, long AMX tiles over it (not 7 rows for a 7-pixel output row), against the VNNI
    tile's NCHW op of the same quantization with the fused residual add."""
    rng = np.random.default_rng(c + o)
    x = rng.integers(0, 256, (n, c, hw, hw)).astype(np.uint8)
    wt = rng.integers(-128, 128, (o, c, 1, 1)).astype(np.int8)
    bias = rng.integers(-3000, 3000, o).astype(np.int32)
    quant = {"stride": 2, "dtype": "uint8", "input_zero_point": 33, **RESIDUAL_QUANT}
    ref = schedules.conv2d(x.shape, wt.shape, target="x86-avx512vnni", **quant)
    r = rng.integers(0, 256, (n, o, *ref.geometry.out_hw)).astype(np.uint8)
    op = schedules.conv2d((n, hw, hw, c), wt.shape, target="x86-amx", data_layout="NHWC", **quant)
    assert op.plan.form == "subsampled" and isinstance(op.plan.kern, AmxGemmKernel) and op.plan.kern.mr > 8
    got = op.bind(wt, bias)(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), residual=np.ascontiguousarray(r.transpose(0, 2, 3, 1)))
    np.testing.assert_array_equal(got.transpose(0, 3, 1, 2), ref(x, wt, bias, residual=r))
