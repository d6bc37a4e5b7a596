"""AMX's stride-2 stem as space-to-depth: a stride-2 layer too narrow for the AMX tiles as the
stride-1 conv it equals on 2 x 2 blocks of pixels."""

from __future__ import annotations

import dataclasses

import numpy as np

from microkernels import AMX_INT8, Isa

from ....common.tir import padded_pack
from ...geometry import Geometry
from ..tiles import amx_tile
from ..values import data_shift, shifted
from .common import source_buffers

NAME = "space-to-depth"


def applies(g: Geometry, isa: Isa, layer) -> tuple[Geometry | None, str]:
    """ResNet's stem (3 channels, which pad to 64 for a kernel row's K) as 4 * C channels of
    2 x 2 pixels, a ceil(KH/2) x ceil(KW/2) kernel whose taps past the original's are zero, so its
    kernel rows take whole 64-deep steps for less padding (the stem: K 147 -> 192 where VNNI pads
    it to 196 at a quarter of AMX's rate per step). Channels-last AMX layers of one group whose
    weights' zero point is 0 (zero taps must add nothing), where the form takes AMX and the layer
    itself would not; (None, why not) for the rest."""
    why_not = "it takes channels-last stride-2 single-group AMX layers too narrow for AMX, weights' zero point 0"
    if not (layer.quant.data_layout == "NHWC" and isa.name == AMX_INT8.name and g.stride == (2, 2)
            and g.dilation == (1, 1) and g.groups == 1 and layer.zw8 == 0 and amx_tile(g) is None):
        return None, why_not
    (oh, ow), kh, kw = g.out_hw, -(-g.kh // 2), -(-g.kw // 2)
    s2d = dataclasses.replace(g, c=4 * g.c, h=oh + kh - 1, w=ow + kw - 1, kh=kh, kw=kw, stride=(1, 1), pad=(0, 0, 0, 0))
    if s2d.out_hw == g.out_hw and amx_tile(s2d) is not None:
        return s2d, ""
    return None, "its space-to-depth form does not take the AMX tiles either"


def weights(weight: np.ndarray) -> np.ndarray:
    """OIHW weights of a stride-2 layer -> those of its space-to-depth form:
    w'[o, (2 * py + px) * C + c, R, S] = w[o, c, 2R + py, 2S + px], 0 past the kernel's edge."""
    o, c, kh, kw = weight.shape
    full = np.zeros((o, c, 2 * -(-kh // 2), 2 * -(-kw // 2)), weight.dtype)
    full[:, :, :kh, :kw] = weight
    # (o, c, R, py, S, px) -> (o, py, px, c, R, S)
    blocks = full.reshape(o, c, kh // 2 + kh % 2, 2, kw // 2 + kw % 2, 2).transpose(0, 3, 5, 1, 2, 4)
    return np.ascontiguousarray(blocks.reshape(o, 4 * c, -(-kh // 2), -(-kw // 2)))


def note(plan) -> str:
    return (f"; stride 2 as space-to-depth: a {plan.g.kh}x{plan.g.kw} stride-1 conv on "
            f"{plan.g.c} channels (2 x 2 pixels of {plan.source.c})" if plan.source else "")


def source_shape(plan) -> tuple:
    """The padded source of the pack: every pixel the packed one's 2 x 2 blocks read."""
    n, _, hs, ws, _ = plan.packed_shape
    return (n, 2 * hs, 2 * ws, plan.source.c)


def buffers(plan, dtype: str) -> list[str]:
    return source_buffers(plan, source_shape(plan))


def pack(plan, dtype: str, zp: int) -> list[str]:
    """In two copies: the source padded (S: the zero point around it, and past it where only zero
    taps look), then packed pixel (Y, X), channel k = (2 * py + px) * C + c from padded pixel
    (2Y + py, 2X + px), channel c (0 in the padded channels). One pass doing both spent 0.25 ms
    on the stem in per-byte bounds checks."""
    src, dt, shift = plan.source, plan.packed_dtype, data_shift(plan, dtype)
    top, left = src.pad[0], src.pad[1]
    inside = f"{top} <= vy and vy < {top + src.h} and {left} <= vx and vx < {left + src.w}"
    value = shifted(f"D[vn, vy - {top}, vx - {left}, vc]", shift, dt)
    c = src.c
    L = padded_pack(4, "S", list(zip("nyxc", source_shape(plan))), inside, value,
                    f"T.{dt}({zp + shift})", block="pad")
    return L + padded_pack(4, "P", list(zip("ngyxc", plan.packed_shape)), f"vc < {4 * c}",
                           f"S[vn, vy * 2 + vc // {2 * c}, vx * 2 + vc // {c} % 2, vc % {c}]", f"T.{dt}(0)")


def parallel(sch, plan) -> bool:
    """The padding pass by rows; the pack's channels unrolled, as each comes from a fixed place
    (a gather across vector lanes costs more than the bytes)."""
    pad = sch.get_loops(sch.get_sblock("pad"))
    sch.parallel(sch.fuse(*pad[:2]))
    pack = sch.get_loops(sch.get_sblock("pack"))
    sch.parallel(sch.fuse(*pack[:3]))
    sch.unroll(pack[-1])
    return False
