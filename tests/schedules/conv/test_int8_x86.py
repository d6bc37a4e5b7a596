"""schedules.conv2d quantized on x86 (dtype uint8/int8): the VNNI tile (vpdpbusd) and the int16
upcast (vpmaddwd) bit-exact against an int64 reference, natively or on the Bochs CPU, over
strides, dilations, paddings, groups, depthwise, odd channel counts and batches; the requantized
outputs bit-exact against ONNX's rule written in numpy; and every refusal.

Coverage by host: x86-avx512vnni, x86-avx512 and x86-avx2 run on every host (natively or on
Bochs). x86-avxvnni runs only where the host has avx_vnni (Bochs lacks it): elsewhere those
cases are skipped, saying so, and its tile's numerics are covered at the kernel level
(tests/intrinsics/test_int_gemm.py, through its AVX-512 stand-in)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedules
from microkernels import X86_INT_ISAS
from schedules.conv import ConvParams, Geometry, Quantization
from schedules.conv.int8 import (
    MAX_FLOAT_TAPS,
    MAX_K_VNNI,
    WINOGRAD_MIN_CHANNELS,
    flat_row,
    winograd_max_channels,
    x86_tile,
)

from ... import conv_reference
from ...testers.int_gemm import requantize
from ...x86_exec import emulated

TARGETS = ["x86-avx512vnni", "x86-avxvnni", "x86-avx512", "x86-avx2"]
RANGE = {"int8": (-128, 127), "uint8": (0, 255)}


def _run_args(target):
    """conv2d's emulate= for `target`, or a skip where nothing here can run it."""
    isa = X86_INT_ISAS[target.removeprefix("x86-")]
    if not emulated(isa):
        return {"emulate": False}
    if isa.name == "avxvnni":
        pytest.skip("this host has no avx_vnni and the Bochs CPU lacks it: the AVX-VNNI conv2d cannot run here")
    return {"emulate": True}


def _values(rng, dtype, shape):
    lo, hi = RANGE[dtype]
    return rng.integers(lo, hi + 1, shape).astype(dtype)


@st.composite
def layers(draw):
    groups = draw(st.sampled_from([1, 1, 1, 2, 3, "dw"]))
    cg = draw(st.integers(1, 12))
    c = cg if groups == "dw" else cg * groups
    og = 1 if groups == "dw" else draw(st.integers(1, 20))
    g = c if groups == "dw" else groups
    if groups == "dw":
        cg = 1
    k = draw(st.sampled_from([1, 3, 5]))
    stride, dilation = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 1, 2]))
    pad = draw(st.integers(0, k // 2 * dilation))
    span = (k - 1) * dilation + 1
    h, w = draw(st.integers(max(1, span - 2 * pad), 12)), draw(st.integers(max(1, span - 2 * pad), 17))
    n = draw(st.sampled_from([1, 1, 2]))
    return dict(x=(n, c, h, w), w=(og * g, cg, k, k), stride=stride, padding=pad, dilation=dilation, groups=g)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_int32_accumulators_match_numpy_exactly(target, dtype):
    run = _run_args(target)

    @settings(max_examples=8, deadline=None)
    @given(layers(), st.integers(0, 2**32 - 1), st.booleans())
    def check(layer, seed, zero_zp):
        rng = np.random.default_rng(seed)
        lo, hi = RANGE[dtype]
        zp_x = 0 if zero_zp else int(rng.integers(lo, hi + 1))
        zp_w = 0 if zero_zp or rng.random() < 0.5 else int(rng.integers(-128, 128))
        op = schedules.conv2d(layer["x"], layer["w"], layer["stride"], layer["padding"], layer["dilation"],
                              layer["groups"], dtype=dtype, target=target, input_zero_point=zp_x,
                              weight_zero_point=zp_w, **run)
        x, w = _values(rng, dtype, layer["x"]), _values(rng, "int8", layer["w"])
        want = conv_reference.qconv2d(x, w, zp_x, zp_w, layer["stride"], layer["padding"], layer["dilation"],
                                      layer["groups"])
        got = op(x, w)
        assert got.dtype == np.int32 and got.shape == want.shape
        bad = got != want
        assert not bad.any(), f"{bad.sum()} of {got.size} differ ({op.plan.why}); first {np.argwhere(bad)[0]}"

    check()


@pytest.mark.parametrize("target", ["x86-avx512vnni", "x86-avx2"])
def test_extreme_values_at_the_vnni_exactness_bound(target):
    """All-255 data against all +127 / -128 weights (uint8 x int8's largest products), the
    reduction as long as the VNNI expansion keeps exact (C*KH*KW = MAX_K_VNNI - a little), zero
    points at the ends of their ranges: every term at its largest, no overflow, no saturation."""
    run = _run_args(target)
    c = MAX_K_VNNI // 9 - 1
    op = schedules.conv2d((1, c, 3, 3), (16, c, 3, 3), padding=1, dtype="uint8", target=target,
                          input_zero_point=0, weight_zero_point=0, **run)
    x = np.full((1, c, 3, 3), 255, np.uint8)
    w = np.where(np.arange(16)[:, None, None, None] % 2 == 0, np.int8(127), np.int8(-128)) * np.ones((1, c, 3, 3), np.int8)
    want = conv_reference.qconv2d(x, w, 0, 0, 1, 1, 1, 1)
    assert want.max() > 2**28 and want.min() < -2**28
    np.testing.assert_array_equal(op(x, w), want)


def test_reduction_beyond_the_vnni_bound_is_refused():
    c = MAX_K_VNNI // 9 + 1
    with pytest.raises(ValueError, match=f"exceeds {MAX_K_VNNI}, the longest the vpdpbusd expansion"):
        schedules.conv2d((1, c, 3, 3), (16, c, 3, 3), dtype="uint8", target="x86-avx512vnni")


@pytest.mark.parametrize("target", ["x86-avx512vnni", "x86-avx512", "x86-avx2", "x86-avxvnni"])
@pytest.mark.parametrize("out", ["uint8", "int8", "float32"])
def test_requantized_output_is_onnx_rounding_bit_for_bit(target, out):
    """Per-channel weight scales, a bias, an output zero point: saturate(round_half_even(
    float32(acc + bias) * m[o]) + zp) with m[o] = sx * sw[o] / sy in float32 (float32: no
    rounding, m = sx * sw[o]); outputs reach both bounds; ReLU raises the lower bound to zp."""
    run = _run_args(target)
    rng = np.random.default_rng(5)
    x_shape, w_shape = (2, 19, 9, 10), (37, 19, 3, 3)
    sx, sy = 0.02, 0.05
    sw = (10.0 ** rng.uniform(-3, -1.5, 37)).astype(np.float32)
    x, w = _values(rng, "uint8", x_shape), _values(rng, "int8", w_shape)
    bias = rng.integers(-3000, 3000, 37).astype(np.int32)
    for relu in (False, True):
        q = dict(input_scale=sx, weight_scale=sw, output_zero_point=0) if out == "float32" else \
            dict(input_scale=sx, weight_scale=sw, output_scale=sy, output_zero_point=-3 if out == "int8" else 131)
        op = schedules.conv2d(x_shape, w_shape, padding=1, dtype="uint8", target=target, input_zero_point=9,
                              output_dtype=out, bias=True, activation="relu" if relu else None, **q, **run)
        acc = conv_reference.qconv2d(x, w, 9, 0, 1, 1, 1, 1) + bias[None, :, None, None]
        m = np.float32(sx) * sw
        if out != "float32":
            m = m / np.float32(sy)
        zp = q["output_zero_point"]
        lo, hi = {"uint8": (0, 255), "int8": (-128, 127), "float32": (0, 0)}[out]
        want = requantize(acc, np.int32(0), m[None, :, None, None], zp, max(lo, zp) if relu else lo, hi, out)
        if out == "float32" and relu:
            want = np.maximum(want, np.float32(0))
        got = op(x, w, bias)
        assert got.dtype == np.dtype(out)
        np.testing.assert_array_equal(got, want)
        if out != "float32":
            assert got.min() == (max(lo, zp) if relu else lo) and got.max() == hi, "the data did not saturate"


@pytest.mark.parametrize("target", ["x86-avx512vnni", "x86-avx2"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_fused_residual_add_is_the_qlinearadd_rule_bit_for_bit(target, layout):
    """The quantized residual add in the store: the requantized conv output y and the residual r,
    z = saturate(round((y - zy) * float32(sy / sz) + (r - zr) * float32(sr / sz)) + zz) (float32,
    ONNX Runtime's QLinearAdd), written plainly in numpy; z reaches both ends of uint8 and lies
    within one step of ONNX's own rule (dequantize, add, divide by the sum's scale). Channels-last
    (the tile-local store) and NCHW (the unpack)."""
    run = _run_args(target)
    rng = np.random.default_rng(7)
    n, c, h, w, o = 2, 19, 9, 10, 37
    sx, sy, sr, sz, zx, zy, zr, zz = 0.02, 0.05, 0.07, 0.03, 9, 131, 120, 3
    sw = (10.0 ** rng.uniform(-3, -1.5, o)).astype(np.float32)
    x, w8 = _values(rng, "uint8", (n, c, h, w)), _values(rng, "int8", (o, c, 3, 3))
    bias = rng.integers(-3000, 3000, o).astype(np.int32)
    r = _values(rng, "uint8", (n, o, h, w))
    op = schedules.conv2d((n, h, w, c) if layout == "NHWC" else (n, c, h, w), (o, c, 3, 3), padding=1, dtype="uint8",
                          target=target, input_zero_point=zx, output_dtype="uint8", input_scale=sx, weight_scale=sw,
                          output_scale=sy, output_zero_point=zy, bias=True, residual=True, residual_scale=sr,
                          residual_zero_point=zr, sum_scale=sz, sum_zero_point=zz, data_layout=layout, **run)
    nhwc = (lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1))) if layout == "NHWC" else (lambda a: a)
    got = op(nhwc(x), w8, bias, residual=nhwc(r))
    acc = conv_reference.qconv2d(x, w8, zx, 0, 1, 1, 1, 1) + bias[None, :, None, None]
    y = requantize(acc, np.int32(0), (np.float32(sx) * sw / np.float32(sy))[None, :, None, None], zy, 0, 255, "uint8")
    a, b = (y.astype(np.int32) - zy).astype(np.float32), (r.astype(np.int32) - zr).astype(np.float32)
    ra, rb = np.float32(sy) / np.float32(sz), np.float32(sr) / np.float32(sz)
    want = np.clip(np.rint(a * ra + b * rb).astype(np.int64) + zz, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(got, nhwc(want))
    assert want.min() == 0 and want.max() == 255, "the sums did not saturate"
    onnx_rule = np.clip(np.rint((a * np.float32(sy) + b * np.float32(sr)) / np.float32(sz)).astype(np.int64) + zz, 0, 255)
    assert np.abs(onnx_rule - want.astype(np.int64)).max() <= 1
    with pytest.raises(TypeError, match="pass residual="):
        op(nhwc(x), w8, bias)


def test_ties_round_to_even_in_the_requantized_output():
    """m = 0.5 and a bias making acc odd: every output lies on a .5 and must go to the even side."""
    op = schedules.conv2d((1, 4, 1, 1), (8, 4, 1, 1), dtype="uint8", target="x86-avx512vnni", output_dtype="int8",
                          input_scale=1.0, weight_scale=0.5, output_scale=1.0, bias=True,
                          **_run_args("x86-avx512vnni"))
    x = np.zeros((1, 4, 1, 1), np.uint8)
    w = np.zeros((8, 4, 1, 1), np.int8)
    bias = np.array([1, 3, 5, 7, -1, -3, -5, -7], np.int32)
    assert op(x, w, bias).reshape(-1).tolist() == [0, 2, 2, 4, 0, -2, -2, -4]


def test_plan_says_which_tile_and_why():
    vnni = schedules.conv2d((1, 64, 14, 14), (64, 64, 3, 3), padding=1, dtype="uint8", target="x86-avx512vnni",
                            **_run_args("x86-avx512vnni"))
    assert "vpdpbusd" in vnni.plan.why and vnni.plan.kern.op == "u8s8"
    up = schedules.conv2d((1, 64, 14, 14), (64, 64, 3, 3), padding=1, dtype="uint8", target="x86-avx2",
                          **_run_args("x86-avx2"))
    assert "vpmaddwd" in up.plan.why and up.plan.kern.op == "s16"
    dw = schedules.conv2d((1, 32, 14, 14), (32, 1, 3, 3), padding=1, groups=32, dtype="uint8",
                          target="x86-avx512vnni", **_run_args("x86-avx512vnni"))
    assert dw.plan.depthwise and "depthwise" in dw.plan.why
    native = schedules.conv2d((1, 8, 5, 5), (8, 8, 3, 3), dtype="uint8")
    best = next(i for i in X86_INT_ISAS.values() if i.host_supports())
    assert native.plan.kern.isa.name in (best.name, "avx512" if best.vector_bits == 512 else "avx2")


@pytest.mark.parametrize("hw, k, want", [(56, 3, {"avx2": (4, 16), "avxvnni": (4, 16), "avx512vnni": (14, 32)}),
                                         (14, 3, {"avx2": (5, 16), "avx512": (14, 32)}),
                                         (7, 1, {"avx2": (4, 16), "avx512vnni": (7, 32)})])
def test_tile_shape_counts_rows_of_b_twice(hw, k, want):
    """x86_tile: a row of B costs two loads (its panel streams from L2 on every tile), so the
    16-register ISAs take 4- or 5-row tiles of 16 channels over 2 x 32 (four rows of B per two
    pixels, L2-bound: measured 1.6x slower on a 3x3 layer), shaped to the row; the 32-register
    ones keep their multiply-bound 14 x 32 and 7 x 32."""
    g = Geometry.of(ConvParams((1, 256, hw, hw), (256, 256, k, k), 1, k // 2, 1, 1), block=16)
    assert {name: x86_tile(X86_INT_ISAS[name], g) for name in want} == want


@pytest.mark.parametrize("kwargs, err, msg", [
    (dict(output_dtype="uint8", input_scale=0.1, weight_scale=0.1), ValueError, "output_scale is missing"),
    (dict(output_dtype="uint8", input_scale=0.1, weight_scale=float("nan"), output_scale=0.1), ValueError,
     "weight_scale must be finite, positive"),
    (dict(output_dtype="uint8", input_scale=-1.0, weight_scale=0.1, output_scale=0.1), ValueError,
     "input_scale must be finite, positive"),
    (dict(output_dtype="int32", input_scale=0.1), ValueError, "input_scale does not apply to output_dtype 'int32'"),
    (dict(output_dtype="float16"), ValueError, "output_dtype must be one of"),
    (dict(output_dtype="uint8", input_scale=0.1, weight_scale=[0.1, 0.2], output_scale=0.1), ValueError,
     "weight_scale has 2 values; give one, or one per output channel"),
    (dict(output_dtype="uint8", input_scale=0.1, weight_scale=0.1, output_scale=0.1, output_zero_point=300),
     ValueError, r"output_zero_point=300 is out of range: must be \[0, 255\]"),
    (dict(input_zero_point=300), ValueError, "input_zero_point=300 is out of range for uint8"),
    (dict(residual=True), ValueError, "a fused residual on the quantized conv2d is the quantized add"),
    (dict(output_dtype="uint8", input_scale=0.1, weight_scale=0.1, output_scale=0.1, residual_scale=0.1,
          sum_scale=0.1), ValueError, "a fused residual on the quantized conv2d is the quantized add"),
    (dict(output_dtype="uint8", input_scale=0.1, weight_scale=0.1, output_scale=0.1, residual=True,
          residual_scale=0.1), ValueError, "needs both residual_scale and sum_scale"),
    (dict(residual_scale=0.1, sum_scale=0.1), ValueError, "needs an 8-bit output_dtype"),
    (dict(output_dtype="uint8", input_scale=0.1, weight_scale=0.1, output_scale=0.1, residual=True,
          residual_scale=0.1, sum_scale=0.1, sum_zero_point=256), ValueError, r"sum_zero_point=256 is out of range"),
    (dict(residual_zero_point=3), ValueError, "apply to a fused residual add"),
    (dict(activation="clip"), ValueError, "activation 'clip' is not available on the quantized conv2d"),
    (dict(algorithm="winograd"), ValueError,
     "algorithm='winograd' does not apply to this quantized layer: mk_u8s8_gemm_.* multiplies 8-bit values as they are"),
    (dict(algorithm="winograd", tile=4), ValueError, "the quantized Winograd is F\\(2x2, 3x3\\) only"),
])
def test_refusals_name_the_constraint(kwargs, err, msg):
    with pytest.raises(err, match=msg):
        schedules.conv2d((1, 8, 5, 5), (8, 8, 3, 3), dtype="uint8", target="x86-avx512vnni", **kwargs)


def test_call_time_refusals():
    op = schedules.conv2d((1, 8, 5, 5), (8, 8, 3, 3), dtype="uint8", target="x86-avx2", **_run_args("x86-avx2"))
    x, w = np.zeros((1, 8, 5, 5), np.uint8), np.zeros((8, 8, 3, 3), np.int8)
    with pytest.raises(TypeError, match="data must have dtype uint8, got int8"):
        op(x.astype(np.int8), w)
    with pytest.raises(TypeError, match="compiled without bias"):
        op(x, w, np.zeros(8, np.int32))
    if X86_INT_ISAS["avxvnni"].host_supports():
        return
    with pytest.raises(ValueError, match="the Bochs CPU has no AVX-VNNI"):
        schedules.conv2d((1, 8, 5, 5), (8, 8, 3, 3), dtype="uint8", target="x86-avxvnni", emulate=True)


@pytest.mark.parametrize("target", ["x86-avx512vnni", "x86-avx2"])
def test_nhwc_layout_is_the_same_conv_channels_last(target):
    """data_layout="NHWC": (N, H, W, C) in, (N, OH, OW, O) out, the same values as NCHW's (the
    GEMM path and the depthwise one, which then keeps channels in the lanes)."""
    run = _run_args(target)

    @settings(max_examples=8, deadline=None)
    @given(layers(), st.integers(0, 2**32 - 1))
    def check(layer, seed):
        rng = np.random.default_rng(seed)
        x, w = _values(rng, "uint8", layer["x"]), _values(rng, "int8", layer["w"])
        q = dict(dtype="uint8", target=target, input_zero_point=int(rng.integers(0, 256)), output_dtype="uint8",
                 input_scale=0.05, weight_scale=0.01, output_scale=0.1, output_zero_point=5, **run)
        conv = [layer["stride"], layer["padding"], layer["dilation"], layer["groups"]]
        nchw = schedules.conv2d(layer["x"], layer["w"], *conv, **q)(x, w)
        n, c, h, wd = layer["x"]
        op = schedules.conv2d((n, h, wd, c), layer["w"], *conv, data_layout="NHWC", **q)
        got = op(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), w)
        assert got.shape == (n, *nchw.shape[2:], nchw.shape[1])
        np.testing.assert_array_equal(got.transpose(0, 3, 1, 2), nchw)

    check()


@pytest.mark.parametrize("kwargs, msg", [
    (dict(data_layout="NHWC"), "data_layout='NHWC' is an option of the quantized conv2d; float32 takes NCHW"),
    (dict(data_layout="NCWH", dtype="uint8"), "data_layout must be 'NCHW' or 'NHWC'"),
    (dict(data_layout="NHWC", dtype="uint8", target="aarch64-neon"), "data_layout='NHWC' is an x86 option"),
])
def test_data_layout_refusals(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        schedules.conv2d((1, 5, 5, 8), (8, 8, 3, 3), **kwargs)


def test_channels_last_1x1_reads_the_data_in_place():
    """A channels-last 1x1 stride-1 layer whose rows are whole tiles has no pack at all: the
    tiles read the user's array. Same values as NCHW; a padded or 3x3 layer still packs."""
    run = _run_args("x86-avx512vnni")
    rng = np.random.default_rng(4)
    q = dict(dtype="uint8", target="x86-avx512vnni", input_zero_point=77, output_dtype="uint8", input_scale=0.05,
             weight_scale=0.01, output_scale=0.1, output_zero_point=5, **run)
    x, w = _values(rng, "uint8", (2, 32, 7, 14)), _values(rng, "int8", (48, 32, 1, 1))
    op = schedules.conv2d((2, 7, 14, 32), (48, 32, 1, 1), data_layout="NHWC", **q)
    assert op.plan.in_place("uint8")
    got = op(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), w).transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(got, schedules.conv2d((2, 32, 7, 14), (48, 32, 1, 1), **q)(x, w))
    assert not schedules.conv2d((2, 7, 14, 32), (48, 32, 1, 1), padding=1, data_layout="NHWC", **q).plan.in_place("uint8")
    assert not schedules.conv2d((2, 7, 14, 32), (48, 32, 3, 3), data_layout="NHWC", **q).plan.in_place("uint8")


@pytest.mark.parametrize("target", ["x86-avx512vnni", "x86-avx2"])
@pytest.mark.parametrize("stride, groups, n", [(2, 1, 1), (3, 2, 2), ((2, 1), 1, 2)])
def test_strided_1x1_layer_runs_on_its_subsampled_pixels(target, stride, groups, n):
    """A channels-last strided 1x1 layer is the stride-1 layer on its strided pixels, packed into
    one row (conv.int8.forms.subsampled): the same values as NCHW's, with a fused residual add, the
    user's shapes kept; a padded one keeps its rows."""
    run = _run_args(target)
    rng = np.random.default_rng(8)
    c, o, h, w = 24 * groups, 20 * groups, 9, 13
    x, wt = _values(rng, "uint8", (n, c, h, w)), _values(rng, "int8", (o, c // groups, 1, 1))
    q = dict(stride=stride, groups=groups, dtype="uint8", target=target, input_zero_point=77, output_dtype="uint8",
             input_scale=0.05, weight_scale=0.01, output_scale=0.1, output_zero_point=5, bias=True, residual=True,
             residual_scale=0.07, residual_zero_point=30, sum_scale=0.12, sum_zero_point=9, **run)
    ref = schedules.conv2d(x.shape, wt.shape, **q)
    bias = rng.integers(-500, 500, o).astype(np.int32)
    r = _values(rng, "uint8", (n, o, *ref.geometry.out_hw))
    want = ref(x, wt, bias, residual=r)
    op = schedules.conv2d((n, h, w, c), wt.shape, data_layout="NHWC", **q)
    (oh, ow) = ref.geometry.out_hw
    assert op.plan.form == "subsampled" and "strided pixels" in op.plan.why
    assert op.plan.out_shape == (n, 1, oh * ow, o) and op.out_shape == (n, oh, ow, o)
    got = op(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), wt, bias, residual=np.ascontiguousarray(r.transpose(0, 2, 3, 1)))
    np.testing.assert_array_equal(got.transpose(0, 3, 1, 2), want)
    padded = schedules.conv2d((n, h, w, c), wt.shape, padding=1, data_layout="NHWC", **q)
    assert padded.plan.form is None


def test_flat_row_splits_long_runs_into_whole_tiles():
    assert [flat_row(p) for p in (35, 256, 3136, 784, 480, 257)] == [35, 256, 224, 196, 240, 257]


@pytest.mark.parametrize("target", ["x86-avx512vnni", "x86-avx2"])
@pytest.mark.parametrize("stride", [1, 2])
def test_long_flat_layers_run_as_rows_each_thread_owns(target, stride):
    """A channels-last 1x1 layer of more than FLAT_ROW_MAX pixels is flattened into rows of
    flat_row's length, and where its weights are the smaller operand a thread's tasks walk the
    output blocks of its own rows (Int8Plan.rows_outer): on two threads, with the store's partial
    output block and a fused residual, the same values as NCHW's."""
    run = _run_args(target)
    rng = np.random.default_rng(11)
    n, c, o, h, w = 2, 16, 40, 20 * stride, 24 * stride
    x, wt = _values(rng, "uint8", (n, c, h, w)), _values(rng, "int8", (o, c, 1, 1))
    q = dict(stride=stride, dtype="uint8", target=target, input_zero_point=77, output_dtype="uint8", input_scale=0.05,
             weight_scale=0.01, output_scale=0.1, output_zero_point=5, bias=True, residual=True, residual_scale=0.07,
             residual_zero_point=30, sum_scale=0.12, sum_zero_point=9, threads=2, **run)
    ref = schedules.conv2d(x.shape, wt.shape, **q)
    bias = rng.integers(-500, 500, o).astype(np.int32)
    r = _values(rng, "uint8", (n, o, 20, 24))
    op = schedules.conv2d((n, h, w, c), wt.shape, data_layout="NHWC", **q)
    assert op.plan.g.h == 2 and op.plan.g.w == 240 and op.plan.rows_outer
    got = op(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), wt, bias, residual=np.ascontiguousarray(r.transpose(0, 2, 3, 1)))
    np.testing.assert_array_equal(got.transpose(0, 3, 1, 2), ref(x, wt, bias, residual=r))


@pytest.mark.parametrize("dtype, weight_dtype", [("uint8", "int8"), ("int8", "int8"), ("uint8", "uint8")])
def test_channels_last_depthwise_float_taps_are_exact(dtype, weight_dtype):
    """Channels-last depthwise on x86 multiplies in float32 (Int8Plan.float_taps): the int32
    accumulators equal the int64 reference over kernel sizes, strides, dilations and both zero
    points, and at the exactness bound: MAX_FLOAT_TAPS taps of the largest product (255 * 255)
    sum to just under 2**24. One more tap and the layer takes the int16 taps."""
    run = _run_args("x86-avx512")
    rng = np.random.default_rng(5)
    for (k, stride, dilation, pad), c in zip([(3, 1, 1, 1), (3, 2, 1, 1), (5, 1, 2, 4), (7, 2, 1, 3)], (19, 32, 8, 40)):
        x, w = _values(rng, dtype, (2, c, 11, 13)), _values(rng, weight_dtype, (c, 1, k, k))
        zp_x, zp_w = (int(_values(rng, t, ())) for t in (dtype, weight_dtype))
        op = schedules.conv2d((2, 11, 13, c), w.shape, stride, pad, dilation, c, dtype=dtype, weight_dtype=weight_dtype,
                              target="x86-avx512", input_zero_point=zp_x, weight_zero_point=zp_w, data_layout="NHWC", **run)
        assert op.plan.float_taps and "float32 FMA taps" in op.plan.why
        got = op(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), w).transpose(0, 3, 1, 2)
        np.testing.assert_array_equal(got, conv_reference.qconv2d(x, w, zp_x, zp_w, stride, pad, dilation, c))
    if dtype != "uint8" or weight_dtype != "uint8":
        return
    for kw, float_taps in ((MAX_FLOAT_TAPS // 2, True), (MAX_FLOAT_TAPS // 2 + 1, False)):
        x, w = np.full((1, 4, 2, kw), 255, np.uint8), np.full((4, 1, 2, kw), 255, np.uint8)
        op = schedules.conv2d((1, 2, kw, 4), w.shape, groups=4, dtype="uint8", weight_dtype="uint8", target="x86-avx512",
                              data_layout="NHWC", **run)
        assert op.plan.float_taps == float_taps
        got = op(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), w)
        assert (got == 2 * kw * 255 * 255).all() and (not float_taps or 2 * kw * 255 * 255 < 2**24)


@pytest.mark.parametrize("target", ["x86-avx2", "x86-avx512"])
def test_winograd_is_the_exact_conv(target):
    """3x3 stride-1 layers on the int16 upcast run as Winograd F(2x2, 3x3) in
    integers (conv.int8.forms.winograd): int32 outputs equal the int64 reference bit for bit over odd
    and even sizes (partial 2x2 tiles at the edges), asymmetric padding, both zero points,
    batches, channel counts that pad to the tile and both layouts; requantized with bias, ReLU
    and a fused residual add, equal to the direct conv's output. On two threads."""
    run = _run_args(target)

    @settings(max_examples=8, deadline=None)
    @given(st.integers(WINOGRAD_MIN_CHANNELS, 40), st.integers(WINOGRAD_MIN_CHANNELS, 40), st.integers(1, 9),
           st.integers(1, 11), st.sampled_from([0, 1, (0, 1, 2, 0), (2, 0, 1, 1)]), st.sampled_from([1, 2]),
           st.booleans(), st.integers(0, 2**32 - 1))
    def check(c, o, h, w, pad, n, nhwc, seed):
        rng = np.random.default_rng(seed)
        zp_x, zp_w = int(rng.integers(0, 256)), int(rng.integers(-128, 128)) * int(rng.random() < 0.5)
        x, wt = _values(rng, "uint8", (n, c, h + 2, w + 2)), _values(rng, "int8", (o, c, 3, 3))
        shape = (n, h + 2, w + 2, c) if nhwc else x.shape
        op = schedules.conv2d(shape, wt.shape, padding=pad, dtype="uint8", target=target, input_zero_point=zp_x,
                              weight_zero_point=zp_w, data_layout="NHWC" if nhwc else "NCHW", threads=2, **run)
        assert op.plan.form == "winograd" and "Winograd F(2x2, 3x3)" in op.plan.why
        got = op(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), wt).transpose(0, 3, 1, 2) if nhwc else op(x, wt)
        want = conv_reference.qconv2d(x, wt, zp_x, zp_w, 1, pad, 1, 1)
        bad = got != want
        assert not bad.any(), f"{bad.sum()} of {got.size} differ; first {np.argwhere(bad)[0]}"

    check()
    rng = np.random.default_rng(3)
    x, wt = _values(rng, "uint8", (2, 24, 9, 8)), _values(rng, "int8", (20, 24, 3, 3))
    q = dict(padding=1, dtype="uint8", target=target, input_zero_point=77, output_dtype="uint8", input_scale=0.05,
             weight_scale=0.01, output_scale=0.1, output_zero_point=5, bias=True, residual=True, activation="relu",
             residual_scale=0.07, residual_zero_point=30, sum_scale=0.12, sum_zero_point=9, data_layout="NHWC",
             threads=2, **run)
    bias, r = rng.integers(-500, 500, 20).astype(np.int32), _values(rng, "uint8", (2, 9, 8, 20))
    xt = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    ops = {alg: schedules.conv2d(xt.shape, wt.shape, algorithm=alg, **q) for alg in ("winograd", "direct")}
    assert ops["direct"].plan.form is None
    np.testing.assert_array_equal(ops["winograd"](xt, wt, bias, residual=r), ops["direct"](xt, wt, bias, residual=r))


def test_winograd_exact_at_its_channel_bound():
    """The largest products (data 255 with zero point 0; weights -128 and +127, by output channel
    and, for the output channels past the first two, by sign pattern over the taps and the channels) over
    as many channels as winograd_max_channels allows: every output equals the int64 reference. One
    channel more and "auto" takes the direct conv, and algorithm="winograd" is refused."""
    run = _run_args("x86-avx2")
    q = Quantization("uint8", "int8", 0, 0)
    c = winograd_max_channels(q, 0, 0)
    assert c == (2**31 - 1) // (96 * 255 * 128)
    rng = np.random.default_rng(9)
    x = np.full((1, c, 4, 5), 255, np.uint8)
    x[:, :, 1::2, ::2] = 0
    w = np.where(rng.random((16, c, 3, 3)) < 0.5, np.int8(-128), np.int8(127))
    w[0], w[1] = -128, 127
    kw = dict(padding=1, dtype="uint8", target="x86-avx2", input_zero_point=0, data_layout="NHWC", **run)
    op = schedules.conv2d((1, 4, 5, c), w.shape, **kw)
    assert op.plan.form == "winograd"
    got = op(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), w).transpose(0, 3, 1, 2)
    want = conv_reference.qconv2d(x, w, 0, 0, 1, 1, 1, 1)
    assert abs(want).max() > 2**27
    np.testing.assert_array_equal(got, want)
    assert schedules.conv2d((1, 4, 5, c + 1), (16, c + 1, 3, 3), **kw).plan.form is None
    with pytest.raises(ValueError, match=f"{c + 1} input channels exceed {c}, the most whose transformed sums"):
        schedules.conv2d((1, 4, 5, c + 1), (16, c + 1, 3, 3), algorithm="winograd", **kw)


@pytest.mark.parametrize("shape, kw, why", [
    ((1, 8, 8, 32), dict(target="x86-avx512vnni"), "multiplies 8-bit values as they are"),
    ((1, 8, 8, 32), dict(stride=2), "3x3 kernels of stride 1"),
    ((1, 8, 8, 8), dict(), f"at least {WINOGRAD_MIN_CHANNELS} input and output channels"),
])
def test_winograd_goes_only_where_it_applies(shape, kw, why):
    """Where Winograd does not apply, "auto" takes the direct conv and algorithm="winograd" says why."""
    args = dict(padding=1, dtype="uint8", data_layout="NHWC") | {"target": "x86-avx2"} | kw
    wshape = (shape[-1], shape[-1], 3, 3)
    assert schedules.conv2d(shape, wshape, **args).plan.form is None
    with pytest.raises(ValueError, match=why):
        schedules.conv2d(shape, wshape, algorithm="winograd", **args)


@pytest.mark.parametrize("target", ["x86-avx2", "x86-avx512"])
def test_odd_channels_at_an_even_stride_run_as_pairs_of_values(target):
    """Odd channel counts whose stride starts each window on an even value of the padded row
    (conv.int8.forms.paired: ResNet's 3-channel stem at stride 2) run on the upcast as the conv over the
    rows read as pairs of values: int32 outputs equal the int64 reference bit for bit over 1 to 7
    channels, kernels of 2 to 7 columns, strides and paddings (rows and columns left unread by the
    stride included), both zero points, batches and both layouts; requantized with bias, ReLU and a
    fused residual add, equal to ONNX's rule in numpy. On two threads."""
    run = _run_args(target)

    @settings(max_examples=8, deadline=None)
    @given(st.sampled_from([1, 3, 5, 7]), st.integers(1, 20), st.integers(1, 4), st.integers(2, 7),
           st.sampled_from([(2, 2), (1, 2), (3, 4), (2, 6)]), st.sampled_from([0, 1, (0, 2, 1, 0), (3, 1, 0, 2)]),
           st.sampled_from([1, 2]), st.booleans(), st.integers(0, 2**32 - 1), st.data())
    def check(c, o, kh, kw, stride, pad, n, nhwc, seed, data):
        p = (pad,) * 4 if isinstance(pad, int) else pad
        h = data.draw(st.integers(max(1, kh - p[0] - p[2]), 11))
        w = data.draw(st.integers(max(1, kw - p[1] - p[3]), 13))
        rng = np.random.default_rng(seed)
        zp_x, zp_w = int(rng.integers(0, 256)), int(rng.integers(-128, 128)) * int(rng.random() < 0.5)
        x, wt = _values(rng, "uint8", (n, c, h, w)), _values(rng, "int8", (o, c, kh, kw))
        shape = (n, h, w, c) if nhwc else x.shape
        op = schedules.conv2d(shape, wt.shape, stride=stride, padding=pad, dtype="uint8", target=target,
                              input_zero_point=zp_x, weight_zero_point=zp_w, data_layout="NHWC" if nhwc else "NCHW",
                              threads=2, **run)
        assert op.plan.form == "paired" and "read as pairs of values" in op.plan.why
        got = op(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), wt).transpose(0, 3, 1, 2) if nhwc else op(x, wt)
        want = conv_reference.qconv2d(x, wt, zp_x, zp_w, stride, pad, 1, 1)
        bad = got != want
        assert not bad.any(), f"{bad.sum()} of {got.size} differ; first {np.argwhere(bad)[0]}"

    check()
    rng = np.random.default_rng(4)
    sx, sw, sy, sr, ss = 0.02, np.float32(0.004), 0.05, 0.07, 0.09
    x, wt = _values(rng, "uint8", (2, 3, 15, 14)), _values(rng, "int8", (24, 3, 7, 7))
    bias, r = rng.integers(-5000, 5000, 24).astype(np.int32), _values(rng, "uint8", (2, 8, 7, 24))
    op = schedules.conv2d((2, 15, 14, 3), wt.shape, stride=2, padding=3, dtype="uint8", target=target,
                          input_zero_point=120, output_dtype="uint8", input_scale=sx, weight_scale=sw, output_scale=sy,
                          output_zero_point=7, bias=True, activation="relu", residual=True, residual_scale=sr,
                          residual_zero_point=30, sum_scale=ss, sum_zero_point=11, data_layout="NHWC", **run)
    assert op.plan.form == "paired"
    got = op(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), wt, bias, residual=r)
    acc = conv_reference.qconv2d(x, wt, 120, 0, 2, 3, 1, 1) + bias[None, :, None, None]
    y = requantize(acc, np.int32(0), np.float32(sx) * sw / np.float32(sy), 7, 7, 255, "uint8").transpose(0, 2, 3, 1)
    a, b = (y.astype(np.int32) - 7).astype(np.float32), (r.astype(np.int32) - 30).astype(np.float32)
    ra, rb = np.float32(sy) / np.float32(ss), np.float32(sr) / np.float32(ss)  # QLinearAdd's rule, as above
    want = np.clip(np.rint(a * ra + b * rb).astype(np.int64) + 11, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape, wshape, kw", [
    ((1, 16, 16, 4), (8, 4, 7, 7), dict(stride=2)),  # even channels: nothing padded
    ((1, 16, 16, 3), (8, 3, 7, 7), dict(stride=1)),  # windows one value apart, not pairs
    ((1, 16, 16, 3), (8, 3, 1, 1), dict(stride=2)),  # one column: the pair is the channels' own padding
    ((1, 16, 16, 3), (8, 3, 3, 3), dict(stride=2, dilation=2)),
    ((1, 16, 16, 6), (8, 3, 3, 3), dict(stride=2, groups=2)),
    ((1, 16, 16, 3), (8, 3, 7, 7), dict(stride=2, target="x86-avx512vnni")),  # vpdpbusd: K in fours
])
def test_paired_rows_go_only_where_they_apply(shape, wshape, kw):
    """The paired form only where it saves products on the upcast; elsewhere the layer's own."""
    args = dict(padding=1, dtype="uint8", data_layout="NHWC", target="x86-avx2") | kw
    assert schedules.conv2d(shape, wshape, **args).plan.form != "paired"


@pytest.mark.parametrize("target", ["x86-avx2", "x86-avx512", "x86-avx512vnni"])
def test_fused_store_is_the_tir_store_bit_for_bit(target, monkeypatch):
    """Channels-last 8-bit layers of whole tiles store from the kernel's registers
    (Int8Plan.fused_store: the packed vcvtps2dq / vpackssdw store on ymm, the generic one on
    zmm): the same bytes as the TIR store of the int32 scratch tile, uint8 and int8, with and
    without ReLU, scales reaching both saturation bounds; a residual add or a partial tile keeps
    the TIR store."""
    from schedules.conv.int8.plan import Int8Plan

    run = _run_args(target)
    rng = np.random.default_rng(11)
    fused = Int8Plan.fused_store
    cases = [((1, 14, 14, 16), (96, 16, 1, 1), 1, 0, "uint8", "relu"), ((1, 9, 12, 24), (32, 24, 3, 3), 2, 1, "int8", None),
             ((1, 8, 8, 64), (48, 64, 1, 1), 1, 0, "int8", "relu")]
    for shape, wshape, stride, pad, out, act in cases:
        lo, hi = RANGE[out]
        zp = int(rng.integers(lo, hi + 1))
        kw = dict(stride=stride, padding=pad, dtype="uint8", target=target, input_zero_point=100, output_dtype=out,
                  input_scale=0.02, weight_scale=rng.uniform(0.2, 5, wshape[0]).astype(np.float32) * 1e-2,
                  output_scale=0.05, output_zero_point=zp, data_layout="NHWC", bias=True, activation=act, **run)
        x = rng.integers(0, 256, shape).astype(np.uint8)
        w = rng.integers(-128, 128, wshape).astype(np.int8)
        b = rng.integers(-5000, 5000, wshape[0]).astype(np.int32)
        ours = schedules.conv2d(shape, wshape, **kw)
        assert ours.plan.fused_store, ours.plan
        monkeypatch.setattr(Int8Plan, "fused_store", property(lambda self: False))
        tir = schedules.conv2d(shape, wshape, **kw)
        monkeypatch.setattr(Int8Plan, "fused_store", fused)
        got, want = ours(x, w, b), tir(x, w, b)
        np.testing.assert_array_equal(got, want)
        assert lo in got or (act == "relu" and zp in got), "no output reached the lower bound"
    residual = schedules.conv2d((1, 8, 8, 16), (16, 16, 1, 1), dtype="uint8", target=target, input_zero_point=1,
                                output_dtype="uint8", input_scale=0.1, weight_scale=0.1, output_scale=1.0,
                                data_layout="NHWC", bias=True, residual=True, residual_scale=0.5, sum_scale=1.0, **run)
    assert residual.plan.tile_local and not residual.plan.fused_store
