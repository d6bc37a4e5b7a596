"""schedules.conv.templates: the TVMScript the NCHWc families (direct, Winograd) share."""

from schedules.common.tir import buffer
from schedules.conv import ConvParams, Geometry, PostOps
from schedules.conv.templates import band_pack, post_params, post_reads

G = Geometry.of(ConvParams((2, 3, 10, 12), (20, 3, 3, 3), padding=(1, 2, 1, 0)))


def test_post_op_inputs_come_in_call_order():
    assert post_params(PostOps(), G) == []
    assert post_params(PostOps(bias=True, residual=True), G) == [buffer("Bias", G.bias_shape), buffer("Res", G.out_shape)]
    assert post_reads(PostOps(residual=True), G, 4) == f", Res[vn, 0:{G.out_shape[1]}, vyb * 4:vyb * 4 + 4, 0:{G.out_hw[1]}, 0:16]"
    assert post_reads(PostOps(bias=True), G) == f", Bias[0:{G.bias_shape[0]}, 0:16]"


def test_band_pack_reads_the_bands_rows_and_zeroes_the_padding():
    lines = band_pack(G, "vb", 6, (1, 8, 14, 3), lanes_used=2)
    text = "\n".join(lines)
    assert "T.grid(1, 8, 14, 3)" in text and "sblock('pack')" in text
    assert "0 <= vb * 6 + vr - 1 and vb * 6 + vr - 1 < 10 and 0 <= vx - 2 and vx - 2 < 12 and vi < 2" in text
    assert "D[vn, vq, vb * 6 + vr - 1, vx - 2, vi], T.float32(0))" in text
