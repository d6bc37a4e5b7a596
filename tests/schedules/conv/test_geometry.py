"""schedules.conv.geometry: the layer as values (ConvParams, Geometry, PostOps, Quantization),
the host's cache budgets (ConvBlocking) and how an output row is cut into tiles (segments)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedules.conv import ConvBlocking, ConvParams, Geometry, PostOps, Quantization
from schedules.conv import geometry as geometry_module
from schedules.conv.geometry import block_diagonal, depthwise, segments


def test_conv_params_normalize_what_users_write():
    p = ConvParams([1, 8, 9, 9], (np.int64(4), 8, 3, 3), stride=np.int32(2), padding=(1, 2), dilation=(1, 2),
                   groups=np.int64(1))
    assert p.data_shape == (1, 8, 9, 9) and p.weight_shape == (4, 8, 3, 3)
    assert p.stride == (2, 2) and p.padding == (1, 2, 1, 2) and p.dilation == (1, 2) and p.groups == 1
    assert all(type(v) is int for v in (*p.weight_shape, *p.stride, p.groups))
    assert ConvParams((1, 1, 4, 4), (1, 1, 1, 1), padding=(0, 1, 2, 3)).padding == (0, 1, 2, 3)


@pytest.mark.parametrize("kwargs, exc, msg", [
    (dict(stride=0), ValueError, "stride must be >= 1"),
    (dict(dilation=(1, 2, 3)), ValueError, "dilation must be an int or a tuple of one or two ints"),
    (dict(padding=-1), ValueError, "padding must be >= 0"),
    (dict(padding=(1, 2, 3)), ValueError, r"padding must be an int, \(h, w\), \(top, left, bottom, right\)"),
    (dict(groups=True), TypeError, "groups must be an int"),
    (dict(data_shape=(1, 4, 8)), ValueError, "data_shape must be a tuple of 4 ints"),
    (dict(weight_shape=(4, 4, 3, 0)), ValueError, r"weight_shape\[3\] must be >= 1"),
])
def test_conv_params_refuse_bad_values(kwargs, exc, msg):
    args = {"data_shape": (1, 4, 8, 8), "weight_shape": (4, 4, 3, 3), **kwargs}
    with pytest.raises(exc, match=msg):
        ConvParams(**args)


def test_geometry_of_validates_without_compiling():
    g = Geometry.of(ConvParams((1, 4, 8, 8), (8, 4, 3, 3), stride=2, padding=(1, 0, 2, 1)))
    assert g.out_hw == (5, 4)
    with pytest.raises(ValueError, match="larger than the padded input"):
        Geometry.of(ConvParams((1, 4, 2, 8), (8, 4, 3, 3)))
    with pytest.raises(ValueError, match="groups=3 must divide"):
        Geometry.of(ConvParams((1, 4, 8, 8), (6, 2, 3, 3), groups=3))
    with pytest.raises(ValueError, match=r"weight_shape\[1\] must be in_channels/groups = 4/2 = 2"):
        Geometry.of(ConvParams((1, 4, 8, 8), (6, 4, 3, 3), groups=2))


def test_geometry_blocks_groups_and_narrow_first_layers():
    g = Geometry.of(ConvParams((2, 3, 10, 10), (20, 3, 3, 3), padding=1), block=16)
    assert g.bi == 3 and g.data_shape == (2, 1, 10, 10, 3)  # 3 channels: no 16/3 padding
    assert g.weight_shape == (2, 1, 3, 3, 3, 16) and g.out_shape == (2, 2, 10, 10, 16)
    grouped = Geometry.of(ConvParams((1, 40, 6, 6), (60, 20, 1, 1), groups=2), block=16)
    assert (grouped.nb, grouped.ob, grouped.data_shape[1], grouped.out_shape[1]) == (2, 2, 4, 4)
    assert grouped.flops == 2 * 60 * 36 * 20


def test_depthwise_is_one_input_channel_per_group():
    assert depthwise(32, 32) and not depthwise(1, 1) and not depthwise(32, 16) and not depthwise(32, 1)
    assert Geometry.of(ConvParams((1, 8, 6, 6), (16, 1, 3, 3), groups=8)).depthwise  # multiplier 2
    assert not Geometry.of(ConvParams((1, 8, 6, 6), (8, 4, 3, 3), groups=2)).depthwise


def test_blocking_follows_the_hosts_l2(monkeypatch):
    """ConvBlocking() sizes its budgets from sysfs, 512 KiB where it is silent; a given size wins."""
    for l2 in (1 << 20, 512 * 1024):
        monkeypatch.setattr(geometry_module, "host_cache_bytes", lambda level, default, l2=l2: l2)
        assert (ConvBlocking().l2, ConvBlocking().image_budget, ConvBlocking().band_budget) == (l2, l2 // 2, l2 // 4)
    monkeypatch.setattr(geometry_module, "host_cache_bytes", lambda level, default: default)
    assert ConvBlocking().l2 == 512 * 1024
    assert ConvBlocking(l2_bytes=64 * 1024).band_budget == 16 * 1024


@given(st.integers(1, 300), st.integers(3, 31))  # MR >= 3: every tile the planners pick
def test_segments_cover_a_row_without_one_pixel_tiles(ow, mr):
    col = 0
    for start, count, t in segments(ow, mr):
        assert start == col and count >= 1 and t <= max(mr, 2)
        assert t >= 2 or ow == 1
        col += count * t
    assert col == ow


def test_post_ops_are_a_checked_value():
    assert not PostOps() and PostOps(bias=True) and PostOps(activation="relu")
    assert PostOps(True, True, "clip", (0, 6)).label == "bias+residual+clip" and PostOps().label == ""
    assert PostOps(activation="clip", clip=(np.float32(-1), 2)).clip == (-1.0, 2.0)
    with pytest.raises(ValueError, match="activation must be one of"):
        PostOps(activation="softplus")
    with pytest.raises(ValueError, match="lo < hi"):
        PostOps(activation="clip", clip=(1, 1))
    with pytest.raises(TypeError, match="bias must be True or False"):
        PostOps(bias=1)


def test_quantization_names_dtypes_and_defaults_the_weights():
    q = Quantization(np.uint8, input_zero_point=128)
    assert (q.dtype, q.weight_dtype, q.input_zero_point, q.weight_zero_point) == ("uint8", "int8", 128, 0)
    assert Quantization("int16").weight_dtype == "int16"
    assert Quantization(np.dtype("int8"), weight_dtype=np.int8).weight_dtype == "int8"
    with pytest.raises(TypeError, match="weight_dtype must be a dtype name"):
        Quantization("int8", weight_dtype=object())


def test_geometry_checks_the_users_arrays_and_leaves_blocked_ones_to_the_families():
    """A depthwise layer's blocked output is (N, C/16, H, W, 16), not one 16-lane block per
    group: Geometry.of checks the NCHW arrays, and each family its own blocked buffers."""
    g = Geometry.of(ConvParams((1, 1024, 512, 512), (1024, 1, 3, 3), groups=1024, padding=1))
    assert g.out_shape[1] * g.out_shape[-1] * 512 * 512 > 2**31  # a generic block per group: too large
    with pytest.raises(ValueError, match=r"output would hold 10000200001 elements \(1, 1, 100001, 100001\)"):
        Geometry.of(ConvParams((1, 1, 1, 1), (1, 1, 1, 1), padding=50000))  # refused before any planning
    with pytest.raises(ValueError, match=r"output would hold 4194304000 elements \(1, 1000, 2048, 2048\)"):
        Geometry.of(ConvParams((1, 1, 2048, 2048), (1000, 1, 1, 1)))


def test_blocking_budgets_are_checked():
    with pytest.raises(TypeError, match="l2_bytes must be an int, got str"):
        ConvBlocking(l2_bytes="1M")
    with pytest.raises(ValueError, match="l2_bytes must be >= 1"):
        ConvBlocking(l2_bytes=0)
    assert ConvBlocking(l2_bytes=np.int64(1 << 20)).l2 == 1 << 20


@pytest.mark.parametrize("c, o, groups, want", [
    (128, 128, 32, True),  # ResNeXt 32x4d's first stage: 4 channels per group
    (256, 256, 32, True),  # 8 per group
    (64, 128, 16, True),  # 4 in, 8 out per group: og a multiple of cg
    (512, 512, 32, False),  # 16 per group: whole blocks, ConvertLayout blocks it
    (32, 32, 32, False),  # 1 per group: depthwise, its own kernel
    (48, 48, 8, False),  # 6 per group does not divide 16
    (32, 16, 4, False),  # 8 in, 4 out per group: og not a multiple of cg
    (24, 24, 6, False),  # 4 per group, but 24 channels are not whole blocks
    (30, 30, 4, False),  # groups do not divide the channels
])
def test_block_diagonal_takes_narrow_groups_that_tile_a_block(c, o, groups, want):
    assert block_diagonal(c, o, groups, 16) is want
