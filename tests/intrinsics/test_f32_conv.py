"""The conv-tile intrinsic: what it refuses, and that its description omits unit loops."""

import pytest

from intrinsics import ConvTile
from intrinsics.f32_conv import render_description
from microkernels import AVX2, GemmKernel, TileError

BR0 = GemmKernel(AVX2, 6, 16, accumulate=False, batch_reduce=True)


@pytest.mark.parametrize(
    "kern, kwargs, msg",
    [(GemmKernel(AVX2, 6, 16), {}, "beta=0 batch-reduce"),
     (GemmKernel(AVX2, 6, 16, accumulate=True, batch_reduce=True), {}, "beta=0 batch-reduce"),
     (GemmKernel(AVX2, 1, 16, accumulate=False, batch_reduce=True), {}, "MR must be >= 2"),
     (BR0, {"kh": 0}, "kh must be a positive int"),
     (BR0, {"sw": 1.5}, "sw must be a positive int"),
     (BR0, {"nb": 1, "kh": 1, "kw": 1, "bi": 1}, "more than one element")],
)
def test_bad_tiles_are_refused(kern, kwargs, msg):
    args = {"nb": 2, "kh": 3, "kw": 3, "bi": 16} | kwargs
    with pytest.raises(TileError, match=msg):
        ConvTile(kern, **args)


def test_unit_loops_are_left_out_and_window_is_exact():
    tile = ConvTile(BR0, nb=1, kh=1, kw=3, bi=16, sw=2, dh=1, dw=2)
    assert tile.reduce_axes() == [("s", 3), ("i", 16)]
    text = render_description(tile)
    assert "T.grid(6, 16, 3, 16)" in text
    # A 6-wide output row at stride 2 under a 3-tap kernel dilated by 2 reads (6-1)*2 + (3-1)*2 + 1
    # columns, not 6*2 + 3 - 1.
    assert tile.window == (1, 15)
    assert tile.name == "mk_f32_brgemm_6x16_avx2_beta0_conv_q1_k1x3_c16_s2_d1x2"
