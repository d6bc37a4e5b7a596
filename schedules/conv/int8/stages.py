"""The x86 path's stages on all threads: the form's pack (forms.parallel), then the output: the
tiles' own store (channels-last), or the unpack of the int32 accumulators."""

from __future__ import annotations

from ...common.tir import has_block, vectorize_whole
from . import forms


def parallel_stages(sch, plan) -> None:
    """The pack and the unpack on all threads. The unpack transposes: it walks NR output channels
    of a row at a time, so the tile of accumulators it reads (OW x NR int32) stays in L1 while
    NR output rows are written, and vectorizes along the row (strided loads, one vector store)."""
    if forms.parallel(sch, plan) or plan.fused_store:
        return  # the form's stages include the output (Winograd's output transform), or the tiles store it
    if has_block(sch, "store"):  # the tiles store their own output (gemm.tile_store)
        # Vectorized along the channels unless the tile overhangs the group's: TIR would then
        # vectorize the store past the predicate that crops it.
        if plan.op == plan.g.og:
            vectorize_whole(sch, sch.get_loops(sch.get_sblock("store"))[-1], plan.kern.nr)
        return
    if plan.nhwc and plan.depthwise:
        return  # computed per pixel inside the conv's rows (depthwise.schedule_lanes)
    if plan.nhwc:
        # Channels-last on both sides: rows in parallel, the channels of a pixel in the lanes.
        n, y, x, o = sch.get_loops(sch.get_sblock("unpack"))
        sch.parallel(sch.fuse(n, y))
        vectorize_whole(sch, o, plan.g.o)
        return
    n, o, y, x = sch.get_loops(sch.get_sblock("unpack"))
    oo, oi = sch.split(o, [None, plan.kern.nr])
    sch.reorder(n, oo, y, oi, x)
    sch.parallel(sch.fuse(n, oo))
    vectorize_whole(sch, x, plan.g.out_hw[1])
