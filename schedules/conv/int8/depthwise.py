"""Depthwise layers (one output channel per input channel): no GEMM tile. Channels in vector lanes
(ARM: int16 taps, one vmlal.s16 over 8 channels; x86 channels-last: float32 FMA taps on the 8-bit
data, Int8Plan.float_taps), or on x86 NCHW as the user has it, a row's pixels in the lanes
(Int8Plan.rows)."""

from __future__ import annotations

from tvm import s_tir

from ...common.tir import padded_pack, parse, vectorize_whole
from . import forms
from .entry import entry
from .output import output
from .stages import parallel_stages
from .values import widened


def schedule_lanes(plan, dtype: str, zp_x: int):
    """The channels-in-lanes layer scheduled: taps outside the lanes, on x86 pixels' rows on all
    threads and each pixel's output right after its taps (channels-last)."""
    g = plan.g
    sch = s_tir.Schedule(parse(_render_lanes(plan, dtype, zp_x)))
    blk = sch.get_sblock("conv")
    n, y, x, c, r, s = sch.get_loops(blk)
    co, ci = sch.split(c, [None, plan.lanes])
    # Taps outside the lanes: the 8 accumulators of a pixel stay in one register pair
    # across all KH*KW taps, and each tap is one widening MAC over 8 channels.
    sch.reorder(co, r, s, ci)
    if plan.float_taps:
        # Float adds keep their order, so one pixel's taps are one chain of dependent FMAs
        # (four cycles each): XB pixels' chains side by side, unrolled, keep the FMA units busy.
        xb = next(b for b in (8, 7, 6, 5, 4, 3, 2, 1) if g.out_hw[1] % b == 0)
        x, xi = sch.split(x, [None, xb])
        sch.reorder(x, co, r, s, xi, ci)
        # All taps unrolled too: neighbouring pixels' taps read the same input vector, which
        # LLVM then loads and converts once for all of them.
        for loop in (r, s, xi):
            sch.unroll(loop)
    sch.vectorize(ci)
    if plan.parallel:  # before the init block is split off: parallel() takes a whole reduction block
        sch.parallel(sch.fuse(n, y))
        if plan.nhwc:
            # Each pixel's accumulators leave requantized right after its taps, while they
            # are in L1, instead of in a second pass over an int32 copy of the output.
            unpack = sch.get_sblock("unpack")
            sch.reverse_compute_at(unpack, x)
            vectorize_whole(sch, sch.get_loops(unpack)[-1], plan.g.c)
        parallel_stages(sch, plan)
    init = sch.decompose_reduction(blk, r)
    sch.vectorize(sch.get_loops(init)[-1])
    return sch.mod


def schedule_rows(plan, dtype: str, zp_x: int):
    """The x86 NCHW layer (Int8Plan.rows) scheduled (_schedule_rows)."""
    sch = s_tir.Schedule(parse(_render_rows(plan, dtype, zp_x)))
    _schedule_rows(sch, plan)
    return sch.mod


def _render_lanes(plan, dtype: str, zp: int) -> list[str]:
    g = plan.g
    oh, ow = g.out_hw
    (sh, sw), (dh, dw) = g.stride, g.dilation
    cp = plan.packed_shape[-1]
    L = entry(plan, dtype) + forms.pack(plan, dtype, zp)
    a, b = f"P[vn, vy * {sh} + vr * {dh}, vx * {sw} + vs * {dw}, vc]", "Wv[vr, vs, vc]"
    product = f"T.Cast('float32', {a}) * {b}" if plan.float_taps else f"T.Cast('int32', {a}) * T.Cast('int32', {b})"
    L += [
        f"    for n, y, x, c, r, s in T.grid({g.n}, {oh}, {ow}, {cp}, {g.kh}, {g.kw}):",
        "        with T.sblock('conv'):",
        "            vn, vy, vx, vc, vr, vs = T.axis.remap('SSSSRR', [n, y, x, c, r, s])",
        "            with T.init():",
        f"                Acc[vn, vy, vx, vc] = T.{plan.acc_dtype}(0)",
        f"            Acc[vn, vy, vx, vc] = Acc[vn, vy, vx, vc] + {product}",
    ]
    if plan.nhwc:
        # float taps: the exact integer sum back to int32, so the store is the integer path's
        acc = "T.Cast('int32', Acc[vn, vy, vx, vc])" if plan.float_taps else "Acc[vn, vy, vx, vc]"
        L += [f"    for n, y, x, c in T.grid({g.n}, {oh}, {ow}, {g.c}):",
              "        with T.sblock('unpack'):",
              "            vn, vy, vx, vc = T.axis.remap('SSSS', [n, y, x, c])",
              f"            Out[vn, vy, vx, vc] = {output(plan, acc, 'vc', 'vn, vy, vx, vc')}"]
        return L
    L += [
        f"    for n, c, y, x in T.grid({g.n}, {g.c}, {oh}, {ow}):",
        "        with T.sblock('unpack'):",
        "            vn, vc, vy, vx = T.axis.remap('SSSS', [n, c, y, x])",
        f"            Out[vn, vc, vy, vx] = {output(plan, 'Acc[vn, vy, vx, vc]', 'vc', 'vn, vc, vy, vx')}",
    ]
    return L


def _render_rows(plan, dtype: str, zp: int) -> list[str]:
    """Depthwise on x86, NCHW as the user has it: each channel's plane widened (x - zp, int16) and
    padded, then each output row LANES pixels at a time, one int32 vector per tap and LANES
    pixels, the requantized output written straight back to NCHW. No transposes: the channel's
    taps are scalars broadcast over a row, where the ARM path puts channels in lanes."""
    g = plan.g
    oh, ow = g.out_hw
    (sh, sw), (dh, dw) = g.stride, g.dilation
    top, left = g.pad[0], g.pad[1]
    n, c = plan.packed_shape[:2]
    # Packed column q of phase p is padded input column q * sw + p.
    col = f"vq * {sw} + vp"
    inside = f"{top} <= vy and vy < {top + g.h} and {left} <= {col} and {col} < {left + g.w}"
    x = f"D[vn, vc, vy - {top}, {col} - {left}]"
    value = widened(x, zp)
    L = entry(plan, dtype) + padded_pack(4, "P", list(zip("ncpyq", plan.packed_shape)), inside, value, "T.int16(0)")
    tap = f"vs * {dw}"
    L += [
        f"    for n, c, y, x, r, s in T.grid({n}, {c}, {oh}, {plan.ow_padded}, {g.kh}, {g.kw}):",
        "        with T.sblock('conv'):",
        "            vn, vc, vy, vx, vr, vs = T.axis.remap('SSSSRR', [n, c, y, x, r, s])",
        "            with T.init():",
        "                Acc[vn, vc, vy, vx] = 0",
        "            Acc[vn, vc, vy, vx] = Acc[vn, vc, vy, vx] + "
        f"T.Cast('int32', P[vn, vc, ({tap}) % {sw}, vy * {sh} + vr * {dh}, vx + ({tap}) // {sw}])"
        " * T.Cast('int32', Wv[vc, vr, vs])",
        f"    for n, c, y, x in T.grid({g.n}, {g.c}, {oh}, {ow}):",
        "        with T.sblock('unpack'):",
        "            vn, vc, vy, vx = T.axis.remap('SSSS', [n, c, y, x])",
        f"            Out[vn, vc, vy, vx] = {output(plan, 'Acc[vn, vc, vy, vx]', 'vc', 'vn, vc, vy, vx')}",
    ]
    return L


def _schedule_rows(sch, plan) -> None:
    """Planes on all threads; per row, LANES pixels in vector lanes over the KH x KW taps, the
    accumulators kept in registers for them, and the row's output written right after it (its
    block computed at the row loop, so the row of accumulators never leaves L1)."""
    blk = sch.get_sblock("conv")
    n, c, y, x, r, s = sch.get_loops(blk)
    xo, xi = sch.split(x, [None, plan.lanes])
    sch.reorder(xo, r, s, xi)
    sch.vectorize(xi)
    plane = sch.fuse(n, c)
    sch.parallel(plane)
    pack = sch.get_loops(sch.get_sblock("pack"))
    sch.parallel(sch.fuse(*pack[:2]))
    unpack = sch.get_sblock("unpack")
    sch.reverse_compute_at(unpack, y)
    vectorize_whole(sch, sch.get_loops(unpack)[-1], plan.g.out_hw[1])  # the whole row
    init = sch.decompose_reduction(blk, r)
    sch.vectorize(sch.get_loops(init)[-1])
