"""Strided 1x1 layers on their subsampled pixels: a channels-last 1x1 strided unpadded x86 layer
as the 1x1 stride-1 layer on the pixels its stride reads (ResNet's downsampling layers)."""

from __future__ import annotations

import dataclasses

from microkernels import Isa

from ....common.tir import padded_pack
from ...geometry import Geometry
from ..tiles import flat_row
from ..values import data_shift, is_depthwise, shifted, widened
from .common import parallel_rows

NAME = "subsampled"


def applies(g: Geometry, isa: Isa, layer) -> tuple[Geometry | None, str]:
    """The layer as the 1x1 stride-1 layer on its strided pixels, the OH * OW of them packed into
    rows of flat_row's length (flat_geometry's long tiles, where a 7- or 14-pixel output row
    gave 7-row AMX tiles); (None, why not) for the rest. The module's output is those rows, the
    user's (N, OH, OW, O) as it lies in memory."""
    if not (layer.quant.data_layout == "NHWC" and isa.arch == "x86" and g.kh == g.kw == 1 and g.stride != (1, 1)
            and not any(g.pad) and not is_depthwise(g)):
        return None, "it takes channels-last strided 1x1 layers without padding on x86"
    oh, ow = g.out_hw
    row = flat_row(oh * ow)
    return dataclasses.replace(g, h=oh * ow // row, w=row, stride=(1, 1), dilation=(1, 1)), ""


def note(plan) -> str:
    return "; the strided pixels packed into one row of a 1x1 stride-1 layer"


def buffers(plan, dtype: str) -> None:
    return None


def pack(plan, dtype: str, zp: int) -> list[str]:
    """The source's pixels at the stride, the OH * OW of them in rows of flat_row's length, as
    the direct pack makes them (8-bit as the tile takes it, or widened less the zero point for
    the upcast); padded channels and each row's tail past its pixels hold 0."""
    src, dt = plan.source, plan.packed_dtype
    (sh, sw), ow = src.stride, src.out_hw[1]
    p = f"(vy * {plan.g.w} + vx)"
    value = f"D[vn, {p} // {ow} * {sh}, {p} % {ow} * {sw}, vg * {src.cg} + vc]"
    value = shifted(value, data_shift(plan, dtype), dt) if plan.dot else widened(value, zp)
    return padded_pack(4, "P", list(zip("ngyxc", plan.packed_shape)), f"vc < {src.cg} and vx < {plan.g.w}",
                       value, f"T.{dt}(0)")


def parallel(sch, plan) -> bool:
    return parallel_rows(sch, plan)
