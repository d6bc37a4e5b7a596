"""Depthwise conv2d (groups = input channels) on the depthwise kernel, both x86 targets (native,
or AVX-512 on the Bochs CPU): random layers against the float64 reference, the blocked path,
the plan, refusals."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedules
from schedules import PostOps

from ... import conv_reference
from ...conv_reference import EPS, ref_conv2d, with_post_ops
from ...x86_exec import X86, X86_IDS, on


@st.composite
def layers(draw):
    c = draw(st.one_of(st.sampled_from([1, 16, 17, 32]), st.integers(1, 40)))
    mult = draw(st.sampled_from([1, 1, 2, 3]))
    kh, kw = draw(st.sampled_from([(3, 3), (5, 5), (7, 7), (1, 3), (3, 1), (1, 1)]))
    stride = draw(st.one_of(st.integers(1, 3), st.tuples(st.integers(1, 2), st.integers(1, 3))))
    dilation = draw(st.one_of(st.integers(1, 2), st.tuples(st.integers(1, 2), st.integers(1, 2))))
    padding = draw(st.one_of(st.integers(0, 3), st.tuples(*[st.integers(0, 3)] * 4)))
    top, left, bottom, right = conv_reference.pads(padding)
    dh, dw = conv_reference.pair(dilation)
    h = draw(st.integers(max(1, (kh - 1) * dh + 1 - top - bottom), 14))
    w = draw(st.integers(max(1, (kw - 1) * dw + 1 - left - right), 30))
    post = draw(st.builds(PostOps, bias=st.booleans(), activation=st.sampled_from([None, "relu", "clip"])))
    return dict(data_shape=(draw(st.integers(1, 2)), c, h, w), weight_shape=(mult * c, 1, kh, kw), stride=stride,
                padding=padding, dilation=dilation, groups=c), post


@pytest.mark.parametrize("isa", X86, ids=X86_IDS)
def test_depthwise_matches_the_reference(isa):
    @settings(max_examples=max(10, settings.default.max_examples // 2))
    @given(layers(), st.integers(0, 2**32 - 1))
    def check(layer_post, seed):
        layer, post = layer_post
        ds, ws = layer.pop("data_shape"), layer.pop("weight_shape")
        if ds[1] == 1:  # groups = 1: an ordinary conv, not this path
            return
        op = schedules.conv2d(ds, ws, **on(isa), bias=post.bias, activation=post.activation, **layer)
        assert op.plan["algorithm"] == "depthwise" and op.plan["multiplier"] == ws[0] // ds[1]
        rng = np.random.default_rng(seed)
        x, w = rng.standard_normal(ds, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
        b = rng.standard_normal(ws[0], dtype=np.float32)
        got = op(x, w, bias=b if post.bias else None)
        want = with_post_ops(x, w, b, None, post, **layer)
        # Each output: KH*KW products, the bias, one rounding each (test_conv2d's bound).
        mag = ref_conv2d(np.abs(x), np.abs(w), **layer) + (np.abs(b)[None, :, None, None] if post.bias else 0)
        tol = (ws[2] * ws[3] + 2) * EPS * mag + np.finfo(np.float32).tiny
        err = np.abs(got - want)
        assert (err <= tol).all(), f"worst error {err.max():.3g}"

    check()


@pytest.mark.parametrize("isa", X86, ids=X86_IDS)
@pytest.mark.parametrize("stride, dilation, padding", [(2, 1, 1), (3, 1, (2, 0, 1, 2)), (1, 2, 2), (2, 2, 3)])
def test_several_bands_start_where_their_rows_do(isa, stride, dilation, padding):
    """A budget small enough for one or two output rows per band whatever the host's L2: band
    b's input starts b * rows * stride rows down (padding, stride and dilation included)."""
    ds, ws = (1, 24, 29, 13), (48, 1, 3, 3)
    op = schedules.conv2d(ds, ws, stride=stride, dilation=dilation, padding=padding, groups=24, **on(isa),
                          blocking=schedules.ConvBlocking(l2_bytes=8 * 1024))
    assert op.plan.band_rows < op.geometry.out_hw[0], op.plan
    rng = np.random.default_rng(stride * 10 + dilation)
    x, w = rng.standard_normal(ds, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    layer = dict(stride=stride, dilation=dilation, padding=padding, groups=24)
    tol = 11 * EPS * ref_conv2d(np.abs(x), np.abs(w), **layer) + np.finfo(np.float32).tiny  # 9 taps + 2
    assert (np.abs(op(x, w) - ref_conv2d(x, w, **layer)) <= tol).all()


def test_blocked_layouts_pad_channels_as_a_whole():
    """40 channels -> 3 blocks (not 40 one-channel groups each padded to 16), weights
    (OB, KH, KW, 16), and run_blocked agrees with the NCHW call."""
    op = schedules.conv2d((1, 40, 9, 9), (40, 1, 3, 3), padding=1, groups=40, target="native")
    assert op.blocked_data_shape == (1, 3, 9, 9, 16) and op.blocked_weight_shape == (3, 3, 3, 16)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 40, 9, 9), dtype=np.float32), rng.standard_normal((40, 1, 3, 3), dtype=np.float32)
    assert not op.pack_weights(w)[2, :, :, 8:].any()
    np.testing.assert_array_equal(op.from_blocked(op.run_blocked(op.to_blocked(x), op.pack_weights(w))), op(x, w))
    assert op.plan["kernel"].startswith("mk_f32_dwconv_3x3_")


def test_residual_is_refused():
    with pytest.raises(ValueError, match="not a residual"):
        schedules.conv2d((1, 16, 8, 8), (16, 1, 3, 3), groups=16, residual=True, target="native")
