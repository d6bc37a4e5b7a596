"""Grouped conv2d on every path it can take, both x86 targets: depthwise (one channel per group),
groups narrower than a block run as 16-channel blocks with block-diagonal weights, and the rest
with each group padded to whole blocks; against the float64 reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedules

from ...conv_reference import assert_conv_close
from ...x86_exec import X86, X86_IDS, on


@st.composite
def grouped(draw):
    cg = draw(st.sampled_from([1, 2, 3, 4, 8, 12, 16, 24, 48]))
    groups = draw(st.sampled_from([2, 3, 4, 8, 16, 32, 64]))
    if cg * groups > 256:
        groups = max(2, 256 // cg)
    og = draw(st.sampled_from([cg, 2 * cg, 1, 5]))
    k = draw(st.sampled_from([1, 3]))
    stride, pad = draw(st.integers(1, 2)), draw(st.integers(0, k // 2))
    h, w = draw(st.integers(k, 9)), draw(st.integers(k, 12))
    return dict(data_shape=(1, cg * groups, h, w), weight_shape=(og * groups, cg, k, k), groups=groups,
                stride=stride, padding=pad)


def path(op) -> str:
    if op.plan["algorithm"] == "depthwise":
        return "depthwise"
    return "block-diagonal" if "block_diagonal" in op.plan else "padded groups"


@pytest.mark.parametrize("isa", X86, ids=X86_IDS)
def test_grouped_layers_match_the_reference(isa):
    seen = set()

    @settings(max_examples=max(12, settings.default.max_examples // 2))
    @given(grouped(), st.integers(0, 2**32 - 1))
    def check(layer, seed):
        ds, ws = layer.pop("data_shape"), layer.pop("weight_shape")
        op = schedules.conv2d(ds, ws, **on(isa), algorithm="direct", **layer)
        seen.add(path(op))
        rng = np.random.default_rng(seed)
        x, w = rng.standard_normal(ds, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
        assert_conv_close(op(x, w), x, w, **layer)

    check()
    assert len(seen) >= 2, f"the examples took only {seen}"  # the parametrized test pins each path


@pytest.mark.parametrize("ds, ws, groups, want", [
    ((1, 64, 8, 8), (64, 4, 3, 3), 16, "block-diagonal"),  # ResNeXt-like: 4 channels per group
    ((1, 32, 8, 8), (64, 8, 3, 3), 4, "block-diagonal"),  # 8 in, 16 out per group
    ((1, 64, 8, 8), (32, 8, 3, 3), 8, "padded groups"),  # 4 outputs per 8-channel group: no block fits
    ((1, 24, 8, 8), (24, 4, 3, 3), 6, "padded groups"),  # 24 channels are not whole blocks
    ((1, 32, 8, 8), (64, 1, 3, 3), 32, "depthwise"),
])
def test_each_grouped_layout_takes_its_path(ds, ws, groups, want):
    op = schedules.conv2d(ds, ws, groups=groups, padding=1, target="native")
    assert path(op) == want, op.plan
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal(ds, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    assert_conv_close(op(x, w), x, w, groups=groups, padding=1)
    if want == "block-diagonal":  # the blocked input is plain NCHW16c: no group padded
        assert op.blocked_data_shape == (1, ds[1] // 16, 8, 8, 16)
        assert op.flops == 2 * ws[0] * 8 * 8 * ws[1] * 9  # the layer's, not the block-diagonal zeros
        assert op.layer.groups == groups and op.geometry.groups < groups
