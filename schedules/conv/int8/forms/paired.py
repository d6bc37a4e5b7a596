"""Odd channel counts at an even stride as pairs of values: on the int16 upcast, whose vpmaddwd
multiplies K in pairs, a layer whose stride starts every window on an even value of the padded
row (ResNet's 3-channel stem at stride 2) as the conv over its padded rows read as pairs."""

from __future__ import annotations

import dataclasses

import numpy as np

from microkernels import Isa
from microkernels.int_gemm import IntGemmKernel

from ....common.tir import vectorize_whole
from ...geometry import Geometry
from ..values import widened

NAME = "paired"


def applies(g: Geometry, isa: Isa, layer) -> tuple[Geometry | None, str]:
    """A layer of an odd number of channels on the upcast (SW * C even) as 2 channels,
    ceil(KW * C / 2) columns at stride SW * C / 2, the padding of the rows packed in. A kernel
    row's KW * C values then take one K of that rounded up to even, where channels padded to
    C + 1 take KW * (C + 1) (the stem: 7 rows of 22 against 28, 154 products per output against
    196); the odd value out, past the window, meets a zero weight (weights). Single-group,
    undilated layers of more than one column; (None, why not) for the rest."""
    kern = layer.kern
    if not (isinstance(kern, IntGemmKernel) and kern.group == 2 and g.groups == 1 and g.c % 2 == 1
            and (g.stride[1] * g.c) % 2 == 0 and g.kw > 1 and g.dilation == (1, 1)):
        return None, ("it takes single-group undilated layers of an odd channel count C at a stride SW with SW * C "
                      "even and more than one kernel column, on the int16 upcast")
    kw, sw = -(-g.kw * g.c // 2), g.stride[1] * g.c // 2
    return dataclasses.replace(g, c=2, w=(g.out_hw[1] - 1) * sw + kw, kw=kw, stride=(g.stride[0], sw),
                               pad=(g.pad[0], 0, g.pad[2], 0)), ""


def weights(w: np.ndarray, kw: int) -> np.ndarray:
    """OIHW weights (zero point out) -> those of the paired form with `kw` columns of two
    channels: a kernel row's values in the data's order, (column, channel), then zeros."""
    o, c, kh, kw0 = w.shape
    rows = np.zeros((o, kh, 2 * kw), w.dtype)
    rows[:, :, : kw0 * c] = w.transpose(0, 2, 3, 1).reshape(o, kh, kw0 * c)
    return np.ascontiguousarray(rows.reshape(o, kh, kw, 2).transpose(0, 3, 1, 2))


def note(plan) -> str:
    src = plan.source
    return (f"; {src.c} channels at stride {src.stride[1]} as a conv over the padded rows "
            f"read as pairs of values: a kernel row's {src.kw * src.c} values one K of "
            f"{plan.g.kw * 2} (channels padded to {src.c + 1} would take "
            f"{src.kw * (src.c + 1)})") if src else ""


def buffers(plan, dtype: str) -> list[str]:
    """P, and flat views of its rows (PF) and, channels-last, of the data's (DF): the pack is a
    copy of rows."""
    n, _, hp, wp, cp = plan.packed_shape
    src = plan.source
    return [f"    P = T.alloc_buffer({plan.packed_shape}, '{plan.packed_dtype}')",
            f"    PF = T.decl_buffer(({n}, {hp}, {wp * cp}), '{plan.packed_dtype}', data=P.data)",
            *([f"    DF = T.decl_buffer(({src.n}, {src.h}, {src.w * src.c}), '{dtype}', data=D.data)"]
              if plan.nhwc else [])]


def copied(plan) -> tuple[int, int]:
    """Rows of the data, and values of each, that the pack copies: those its packed rows hold (a
    stride can leave the last rows or columns unread)."""
    src, (_, _, hp, wp, cp) = plan.source, plan.packed_shape
    return min(src.h, hp - src.pad[0]), min(src.w * src.c, wp * cp - src.pad[1] * src.c)


def pack(plan, dtype: str, zp: int) -> list[str]:
    """P's rows, as flat runs of values (PF), zeroed, then the data's rows copied in at the
    padding's offset, widened less the zero point, as far as the windows read (copied).
    Channels-last, a row of the data is one run too (DF), so the copy is a contiguous one. Two
    passes rather than one with a bounds check per value, which does not vectorize (the
    space-to-depth pack measured that: 0.25 ms on the stem)."""
    src = plan.source
    n, _, hp, wp, cp = plan.packed_shape
    top, left, c = src.pad[0], src.pad[1], src.c
    rows, values = copied(plan)
    x = "DF[vn, vy, vi]" if plan.nhwc else f"D[vn, vi % {c}, vy, vi // {c}]"
    value = widened(x, zp)
    return [f"    for n, y, f in T.grid({n}, {hp}, {wp * cp}):",
            "        with T.sblock('pad'):",
            "            vn, vy, vf = T.axis.remap('SSS', [n, y, f])",
            "            PF[vn, vy, vf] = T.int16(0)",
            f"    for n, y, i in T.grid({src.n}, {rows}, {values}):",
            "        with T.sblock('pack'):",
            "            vn, vy, vi = T.axis.remap('SSS', [n, y, i])",
            f"            PF[vn, vy + {top}, vi + {left * c}] = {value}"]


def parallel(sch, plan) -> bool:
    """Rows in parallel, a row's values in the lanes (channels-last: both sides)."""
    n, y, f = sch.get_loops(sch.get_sblock("pad"))
    sch.parallel(sch.fuse(n, y))
    vectorize_whole(sch, f, plan.packed_shape[-2] * plan.packed_shape[-1])
    n, y, i = sch.get_loops(sch.get_sblock("pack"))
    sch.parallel(sch.fuse(n, y))
    if plan.nhwc:
        vectorize_whole(sch, i, copied(plan)[1])
    return False
