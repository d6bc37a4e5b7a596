"""The vpmaddubsw pairs tile in the quantized conv2d (weight_bits=7) on the x86 ISAs without VNNI:
exact against an int64 reference over layer shapes and zero points, with weights whose pairs sit
on the bound; the pairs bound proven on the weights (pairs_fit) and checked again when packing,
so a sum is never silently saturated; which tile the plan takes and why.

Coverage by host: x86-avx2 runs natively on every x86 host with AVX2; x86-avx512 (AVX-512BW's
vpmaddubsw on zmm) runs natively where the host has AVX-512, elsewhere on the Bochs CPU."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedules
from microkernels import X86_INT_ISAS
from microkernels.int_gemm import PAIR_BOUND
from schedules.conv.int8 import pairs_fit

from ... import conv_reference
from ...testers.int_gemm import requantize
from ...x86_exec import emulated
from .test_int8_x86 import layers

PAIR_TARGETS = ["x86-avx2", "x86-avx512"]


def _run(target):
    return {"emulate": emulated(X86_INT_ISAS[target.removeprefix("x86-")])}


def pair_weights(rng, shape, at_bound: float = 0.3) -> np.ndarray:
    """OIHW int8 weights whose input-channel pairs (2i, 2i + 1) keep |a| + |b| <= PAIR_BOUND, a
    share of them exactly on it (64 + 64, -128 + 0, 100 - 28, ...); an odd last channel free in
    [-128, 127] (it meets the padding's zero)."""
    o, c, kh, kw = shape
    w = np.zeros((o, c + c % 2, kh, kw), np.int64)
    first = rng.integers(-128, 128, (o, (c + 1) // 2, kh, kw))
    room = PAIR_BOUND - np.abs(first)
    second = rng.integers(-room, np.minimum(room, 127) + 1)
    edge = (rng.random(first.shape) < at_bound) & (room <= 127)
    second = np.where(edge, np.where(rng.random(first.shape) < 0.5, -room, room), second)
    w[:, 0::2], w[:, 1::2] = first, second
    if c % 2:
        w[:, c - 1] = rng.integers(-128, 128, (o, kh, kw))
    return w[:, :c].astype(np.int8)


@pytest.mark.parametrize("target", PAIR_TARGETS)
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_pairs_tile_is_the_exact_conv(target, dtype):
    run = _run(target)

    @settings(max_examples=8, deadline=None)
    @given(layers(), st.integers(0, 2**32 - 1), st.booleans())
    def check(layer, seed, zero_zp):
        rng = np.random.default_rng(seed)
        lo, hi = (-128, 127) if dtype == "int8" else (0, 255)
        zp_x = 0 if zero_zp else int(rng.integers(lo, hi + 1))
        zp_w = 0 if zero_zp or rng.random() < 0.5 else int(rng.integers(-20, 21))
        op = schedules.conv2d(layer["x"], layer["w"], layer["stride"], layer["padding"], layer["dilation"],
                              layer["groups"], dtype=dtype, target=target, input_zero_point=zp_x,
                              weight_zero_point=zp_w, weight_bits=7, **run)
        assert op.plan.kern.pairs == (not op.plan.depthwise and op.plan.form != "winograd"), op.plan.why
        x = rng.integers(lo, hi + 1, layer["x"]).astype(dtype)
        w = pair_weights(rng, layer["w"])
        want = conv_reference.qconv2d(x, w, zp_x, zp_w, layer["stride"], layer["padding"], layer["dilation"],
                                      layer["groups"])
        got = op(x, w)
        bad = got != want
        assert not bad.any(), f"{bad.sum()} of {got.size} differ ({op.plan.why}); first {np.argwhere(bad)[0]}"

    check()


@pytest.mark.parametrize("target", PAIR_TARGETS)
def test_requantized_channels_last_output_on_the_pairs_tile(target):
    """The path the QDQ networks take: NHWC uint8 in and out, per-channel scales, bias, a fused
    ReLU, each tile stored requantized: bit for bit ONNX's rule, on 1x1, strided 3x3 and a stem."""
    rng = np.random.default_rng(7)
    for (c, o, h, k, s, p) in [(40, 24, 9, 1, 1, 0), (24, 40, 11, 3, 2, 1), (3, 16, 20, 7, 2, 3)]:
        sw = rng.uniform(0.5, 1.5, o).astype(np.float32) * 1e-3
        op = schedules.conv2d((1, h, h, c), (o, c, k, k), stride=s, padding=p, dtype="uint8", target=target,
                              input_zero_point=120, output_dtype="uint8", input_scale=0.02, weight_scale=sw,
                              output_scale=0.05, output_zero_point=100, data_layout="NHWC", bias=True,
                              activation="relu", weight_bits=7, **_run(target))
        assert op.plan.kern.pairs and op.plan.tile_local, op.plan.why
        x = rng.integers(0, 256, (1, h, h, c)).astype(np.uint8)
        w, b = pair_weights(rng, (o, c, k, k)), rng.integers(-3000, 3000, o).astype(np.int32)
        acc = conv_reference.qconv2d(x.transpose(0, 3, 1, 2), w, 120, 0, s, p, 1, 1).transpose(0, 2, 3, 1)
        m = (np.float32(0.02) * sw / np.float32(0.05)).astype(np.float32)
        want = requantize(acc, b, m, 100, 100, 255, "uint8")
        np.testing.assert_array_equal(op(x, w, b), want)


def test_pairs_fit_is_the_bound_on_each_pair():
    w = np.zeros((2, 4, 1, 1), np.int8)
    w[0, :, 0, 0] = [64, -64, -128, 0]  # both pairs at 128
    w[1, :, 0, 0] = [100, 28, 5, 5]
    assert pairs_fit(w)
    w[1, 1, 0, 0] = 29  # 129
    assert not pairs_fit(w)
    w[1, 1, 0, 0], w[1, 2, 0, 0] = 28, 127  # 128 and 132: channels 2 and 3 are a pair
    assert not pairs_fit(w)
    odd = np.full((1, 3, 1, 1), -128, np.int8)
    odd[0, 1] = 0  # pairs (0, 1): 128; channel 2 alone meets the padding: 128
    assert pairs_fit(odd)
    assert pairs_fit(np.random.default_rng(0).integers(-64, 65, (8, 16, 3, 3)).astype(np.int8))  # reduce_range
    assert pairs_fit(np.full((1, 2, 1, 1), 192, np.uint8))  # uint8 weights are shifted: 64 + 64
    assert not pairs_fit(np.full((1, 2, 1, 1), 0, np.uint8))  # -128 + -128


def test_weights_past_the_bound_are_refused_when_packed():
    """Compiled for weight_bits=7, the layer refuses weights with one pair at 129 (they would
    saturate a 16-bit sum), naming the way out; at 128 it is exact."""
    op = schedules.conv2d((1, 8, 5, 5), (16, 8, 1, 1), dtype="uint8", target="x86-avx2", input_zero_point=3,
                          weight_bits=7, **_run("x86-avx2"))
    assert op.plan.kern.pairs
    x = np.full((1, 8, 5, 5), 255, np.uint8)
    w = np.zeros((16, 8, 1, 1), np.int8)
    w[:, 0::2], w[:, 1::2] = 64, 64
    np.testing.assert_array_equal(op(x, w), conv_reference.qconv2d(x, w, 3, 0, 1, 0, 1, 1))
    w[5, 3] = 65
    with pytest.raises(ValueError, match=r"1 pair\(s\) of these weights exceed it \(largest 129\).*weight_bits=8"):
        op(x, w)


@pytest.mark.parametrize("target, bits, tile", [
    ("x86-avx2", 7, "vpmaddubsw pairs"), ("x86-avx2", 8, "the int16 upcast"),
    ("x86-avx512", 7, "vpmaddubsw pairs"), ("x86-avx512vnni", 7, "vpdpbusd"), ("x86-avx512vnni", 8, "vpdpbusd")])
def test_plan_says_which_tile_and_why(target, bits, tile):
    """weight_bits=7 takes the pairs tile where the ISA lacks VNNI, and changes nothing on VNNI
    (vpdpbusd is exact on any weights); 3x3 stride-1 layers keep integer Winograd on the upcast."""
    op = schedules.conv2d((1, 32, 8, 8), (32, 32, 1, 1), dtype="uint8", target=target, weight_bits=bits,
                          **_run(target))
    assert tile in op.plan.why and op.plan.kern.pairs == (tile == "vpmaddubsw pairs"), op.plan.why
    if tile == "the int16 upcast":
        assert "weight_bits=8" in op.plan.why
    wino = schedules.conv2d((1, 64, 14, 14), (64, 64, 3, 3), padding=1, dtype="uint8", target="x86-avx2",
                            weight_bits=7, **_run("x86-avx2"))
    assert wino.plan.form == "winograd" and not wino.plan.kern.pairs
    assert "Winograd's transformed weights take the upcast" in wino.plan.why and "weight_bits=8" not in wino.plan.why


@pytest.mark.parametrize("bits, dtype, msg", [
    (9, "uint8", "weight_bits must be 7 .* or 8, got 9"), (True, "uint8", "weight_bits must be 7"),
    (7, "int16", "weight_bits=7 describes 8-bit weights")])
def test_weight_bits_refusals(bits, dtype, msg):
    with pytest.raises(ValueError, match=msg):
        schedules.conv2d((1, 8, 5, 5), (8, 8, 1, 1), dtype=dtype, target="x86-avx2", weight_bits=bits)
