"""What several forms share (not a form itself): a padded source in the packed input's
allocation, and the pack of rows on all threads."""

from __future__ import annotations

import numpy as np

from ....common.tir import has_block, vectorize_whole


def source_buffers(plan, s_shape: tuple) -> list[str]:
    """P and the padded source S it is made from (space_to_depth's, winograd's) in one
    allocation: allocated on its own, S dies before the tiles run, and TVM's storage rewrite then
    lends its memory to the int32 accumulators, which the tiles' access pointers refuse."""
    p_elems = int(np.prod(plan.packed_shape))
    dt = plan.packed_dtype
    return [f"    PS = T.alloc_buffer(({p_elems + int(np.prod(s_shape))},), '{dt}')",
            f"    P = T.decl_buffer({plan.packed_shape}, '{dt}', data=PS.data)",
            f"    S = T.decl_buffer({s_shape}, '{dt}', data=PS.data, elem_offset={p_elems})"]


def parallel_rows(sch, plan) -> bool:
    """A pack block of rows ('pack', where the layer has one: an in-place layer has none) on all
    threads: rows of every image (and group) in parallel, a row's pixels in turn and their
    channels in the vector lanes (the innermost loop, contiguous on both sides). False: the
    output stage is the caller's."""
    if has_block(sch, "pack"):
        outer = sch.get_loops(sch.get_sblock("pack"))
        sch.parallel(sch.fuse(*outer[:-1 if plan.pitch else -2]))  # with a pitch, no rows: pixels in parallel
        vectorize_whole(sch, outer[-1], plan.packed_shape[-1])
    return False
