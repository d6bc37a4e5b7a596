"""conv2d's fused post-ops (bias, residual, ReLU / clip) on both algorithms, against the float64
reference with the post-ops applied after it; and what conv2d refuses about them."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedules
from schedules.conv import PostOps

from ...conv_reference import EPS, ref_conv2d, with_post_ops
from ...x86_exec import HOST, X86, X86_IDS, on

POSTS = st.builds(PostOps, bias=st.booleans(), residual=st.booleans(),
                  activation=st.sampled_from([None, "relu", "clip"]),
                  clip=st.sampled_from([(0.0, 6.0), (-1.5, 2.0)]))


@st.composite
def layers(draw):
    algorithm = draw(st.sampled_from(["direct", "winograd"]))
    if algorithm == "winograd":
        k, stride, dilation, groups = 3, 1, 1, 1
    else:
        k, stride, dilation = draw(st.sampled_from([1, 3, 5])), draw(st.integers(1, 3)), draw(st.integers(1, 2))
        groups = draw(st.sampled_from([1, 2]))
    cg = draw(st.sampled_from([3, 16, 20]))
    og = draw(st.sampled_from([16, 24]))
    eh = (k - 1) * dilation + 1
    h, w = draw(st.integers(eh, eh + 9)), draw(st.integers(eh, eh + 20))
    pad = draw(st.integers(0, k // 2))
    return dict(data_shape=(draw(st.integers(1, 2)), cg * groups, h, w), weight_shape=(og * groups, cg, k, k),
                stride=stride, padding=pad, dilation=dilation, groups=groups, algorithm=algorithm)


@settings(max_examples=max(10, settings.default.max_examples // 2))
@given(layer=layers(), post=POSTS, seed=st.integers(0, 2**32 - 1))
def test_post_ops_match_the_reference(layer, post, seed):
    rng = np.random.default_rng(seed)
    algorithm = layer.pop("algorithm")
    ds, ws = layer.pop("data_shape"), layer.pop("weight_shape")
    op = schedules.conv2d(ds, ws, target=HOST, algorithm=algorithm, tile=4 if algorithm == "winograd" else None,
                          bias=post.bias, residual=post.residual, activation=post.activation, clip=post.clip, **layer)
    x = rng.standard_normal(ds, dtype=np.float32)
    w = rng.standard_normal(ws, dtype=np.float32)
    out_shape = (ds[0], ws[0], *op.geometry.out_hw)
    b = rng.standard_normal(ws[0], dtype=np.float32) * 3
    r = rng.standard_normal(out_shape, dtype=np.float32) * 3
    got = op(x, w, bias=b if post.bias else None, residual=r if post.residual else None)
    want = with_post_ops(x, w, b, r, post, **layer)
    # The conv's own bound (test_conv2d.assert_conv_close), widened for Winograd's transforms
    # (README: accuracy), plus one rounding of each post-op addition; activations only clamp.
    k = ws[1] * ws[2] * ws[3]
    scale = ref_conv2d(np.abs(x), np.abs(w), **layer) + 3 * np.abs(want) + 10
    tol = (k + 3) * EPS * scale * (8 if algorithm == "winograd" else 1)
    err = np.abs(got - want)
    assert (err <= tol).all(), f"worst error {err.max():.3g} vs bound {tol.flat[np.argmax(err - tol)]:.3g}"


def test_blocked_run_takes_packed_bias_and_blocked_residual():
    rng = np.random.default_rng(0)
    ds, ws = (1, 32, 9, 11), (40, 32, 3, 3)
    op = schedules.conv2d(ds, ws, padding=1, target=HOST, algorithm="direct", bias=True, residual=True,
                          activation="relu")
    x, w = rng.standard_normal(ds, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    b, r = rng.standard_normal(40, dtype=np.float32), rng.standard_normal((1, 40, 9, 11), dtype=np.float32)
    assert op.pack_bias(b).shape == (3, 16) and not op.pack_bias(b)[2, 8:].any()  # 40 channels: 3 blocks
    blocked = op.run_blocked(op.to_blocked(x), op.pack_weights(w), op.pack_bias(b), schedules.layouts.to_nchwc(r, 16))
    np.testing.assert_array_equal(op.from_blocked(blocked), op(x, w, bias=b, residual=r))


@pytest.mark.parametrize("kwargs, msg", [
    ({"activation": "softplus"}, "activation must be one of"),
    ({"activation": "clip", "clip": (1, 1)}, "lo < hi"),
    ({"activation": "clip", "clip": "ab"}, "clip must be two numbers"),
    ({"bias": 1}, "bias must be True or False"),
])
def test_bad_post_ops_are_refused(kwargs, msg):
    with pytest.raises((ValueError, TypeError), match=msg):
        schedules.conv2d((1, 16, 8, 8), (16, 16, 3, 3), target=HOST, **kwargs)


def test_calls_must_pass_exactly_the_compiled_inputs():
    op = schedules.conv2d((1, 16, 6, 6), (16, 16, 1, 1), target=HOST, bias=True)
    x, w = np.ones((1, 16, 6, 6), np.float32), np.ones((16, 16, 1, 1), np.float32)
    with pytest.raises(ValueError, match="compiled with a bias: pass bias="):
        op(x, w)
    with pytest.raises(ValueError, match="compiled without a residual: do not pass residual="):
        op(x, w, bias=np.ones(16, np.float32), residual=np.ones((1, 16, 6, 6), np.float32))
    with pytest.raises(ValueError, match="bias"):
        op(x, w, bias=np.ones(15, np.float32))


def test_post_ops_are_x86_float32_only():
    with pytest.raises(ValueError, match="fused on the x86 float32 conv2d only"):
        schedules.conv2d((1, 16, 8, 8), (16, 16, 3, 3), dtype="int8", target="armv7-neon", activation="relu")


@pytest.mark.parametrize("algorithm", ["direct", "winograd"])
def test_bias_is_added_before_the_residual_bit_for_bit(algorithm):
    """out = (conv + bias) + residual, in that order, as PostOps says and the unfused graph
    computes it. With conv = 1, bias = 2**24 and residual = -2**24, float32 gives exactly 0 in
    that order (1 + 2**24 rounds to 2**24) and 1 in the other ((1 - 2**24) + 2**24): a bound that
    allows rounding cannot see the order, this can."""
    x = np.zeros((1, 16, 6, 6), np.float32)
    x[:, 0] = 1
    w = np.zeros((16, 16, 3, 3), np.float32)
    w[:, 0, 1, 1] = 1  # the centre tap of channel 0: every output of the conv is 1
    b = np.full(16, 2.0**24, np.float32)
    r = np.full((1, 16, 4, 4), -(2.0**24), np.float32)
    op = schedules.conv2d(x.shape, w.shape, target=HOST, algorithm=algorithm, tile=4 if algorithm == "winograd" else None,
                          bias=True, residual=True)
    np.testing.assert_array_equal(op(x, w, bias=b, residual=r), np.zeros((1, 16, 4, 4), np.float32))


NAN_LAYERS = {  # (data, weight, conv kwargs): each path that applies an activation
    "direct": ((1, 16, 7, 9), (32, 16, 3, 3), dict(padding=1, algorithm="direct")),
    "direct-one-pixel-rows": ((1, 16, 5, 1), (16, 16, 3, 1), dict(padding=(1, 0), algorithm="direct")),
    "winograd": ((1, 16, 10, 10), (16, 16, 3, 3), dict(padding=1, algorithm="winograd", tile=4)),
    "depthwise": ((1, 32, 9, 9), (32, 1, 3, 3), dict(padding=1, groups=32)),
    "depthwise-1x1": ((1, 32, 5, 5), (32, 1, 1, 1), dict(groups=32)),
}


@pytest.mark.parametrize("isa", X86, ids=X86_IDS)
@pytest.mark.parametrize("layer", list(NAN_LAYERS))
@pytest.mark.parametrize("activation, clip", [("relu", None), ("clip", (0.0, 6.0)), ("clip", (-1.0, 2.0))])
def test_a_nan_stays_nan_through_the_activation(isa, layer, activation, clip):
    """A fused ReLU or clip gives what the unfused np.maximum / np.clip (and torch.relu /
    torch.clamp) give: NaN where the convolution is NaN, not the bound."""
    ds, ws, kw = NAN_LAYERS[layer]
    kw = dict(kw)
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal(ds, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    x[0, 0, 2, 0] = np.nan  # reaches some outputs of every output channel (depthwise: channel 0's)
    post = PostOps(activation=activation, clip=clip or (0.0, 6.0))
    got = schedules.conv2d(ds, ws, **on(isa), activation=activation, clip=post.clip, **kw)(x, w)
    unfused = schedules.conv2d(ds, ws, **on(isa), **kw)(x, w)
    conv = {k: v for k, v in kw.items() if k not in ("algorithm", "tile")}
    want = with_post_ops(x, w, None, None, post, **conv)
    assert np.isnan(want).any() and not np.isnan(want).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(unfused))  # what the op then np.clip gives
    if kw.get("algorithm") == "winograd":
        # A transform mixes a whole tile (a NaN times a zero coefficient is NaN), so NaN reaches
        # every output of the tiles it touches; those include every output the conv makes NaN.
        assert np.isnan(got)[np.isnan(want)].all()
    else:
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


@pytest.mark.parametrize("isa", X86, ids=X86_IDS)
@pytest.mark.parametrize("algorithm", ["direct", "winograd", "depthwise"])
def test_infinite_clip_bounds_clamp_nothing_on_their_side(isa, algorithm):
    """clip=(-inf, hi) is min(x, hi), (lo, inf) is max(x, lo), (-inf, inf) is the identity."""
    ds, ws, kw = {"direct": NAN_LAYERS["direct"], "winograd": NAN_LAYERS["winograd"],
                  "depthwise": NAN_LAYERS["depthwise"]}[algorithm]
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal(ds, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    plain = schedules.conv2d(ds, ws, **on(isa), **kw)(x, w)
    for lo, hi in ((-np.inf, 0.5), (-0.5, np.inf), (-np.inf, np.inf)):
        got = schedules.conv2d(ds, ws, **on(isa), activation="clip", clip=(lo, hi), **kw)(x, w)
        np.testing.assert_array_equal(got, np.clip(plain, lo, hi))


VECTOR_LAYERS = {  # (data, weight, conv kwargs): the kernels whose epilogue applies the vector math
    "direct-1x1": ((1, 24, 7, 9), (40, 24, 1, 1), dict(algorithm="direct")),
    "direct-3x3": ((1, 16, 10, 10), (32, 16, 3, 3), dict(padding=1)),  # auto: Winograd refuses it
    "depthwise": ((1, 32, 9, 9), (32, 1, 5, 5), dict(padding=2, groups=32)),
}


@pytest.mark.parametrize("layer", list(VECTOR_LAYERS))
@pytest.mark.parametrize("activation", ["silu", "sigmoid", "gelu", "hardswish"])
def test_a_vector_math_activation_fused_equals_the_row_kernel_after_the_conv(layer, activation):
    """conv + bias + SiLU (sigmoid, GELU, hardswish) in one store equals the unfused conv + bias
    followed by the standalone row kernel, bit for bit (the same instructions on the same
    values), on the host's ISA (the AVX-512 tile's epilogue: tests/intrinsics/test_f32_conv.py,
    under Bochs on an AVX2 host). A 3x3 stride-1 layer that auto would give Winograd runs
    direct: Winograd's output transform applies ReLU and clips only."""
    from tests.intrinsics.test_f32_vmath import evaluate

    ds, ws, kw = VECTOR_LAYERS[layer]
    rng = np.random.default_rng(9)
    x, w = rng.standard_normal(ds, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    b = rng.standard_normal(ws[0], dtype=np.float32)
    fused = schedules.conv2d(ds, ws, target=HOST, bias=True, activation=activation, **kw)
    plain = schedules.conv2d(ds, ws, target=HOST, bias=True, **{k: v for k, v in kw.items() if k != "algorithm"},
                             algorithm=fused.plan.algorithm if fused.plan.algorithm != "depthwise" else "auto")
    assert fused.plan.algorithm in ("direct", "depthwise"), fused.plan
    got, unfused = fused(x, w, bias=b), plain(x, w, bias=b)
    np.testing.assert_array_equal(got.view(np.uint32), evaluate(activation, unfused).view(np.uint32))


def test_winograd_refuses_a_vector_math_activation():
    with pytest.raises(ValueError, match="activation its output transform applies"):
        schedules.conv2d((1, 16, 10, 10), (16, 16, 3, 3), padding=1, target=HOST, algorithm="winograd", tile=4,
                         activation="silu")
