"""One quantized layer planned and scheduled: its Int8Plan made (the tile from tiles.py, the form
the caller chose), its buffers checked, and its TIR rendered and scheduled by the path it takes
(depthwise lanes or rows, or the GEMM tiles)."""

from __future__ import annotations

import dataclasses

from microkernels import Isa

from ...common.targets import check_elements
from . import depthwise, gemm
from .plan import Int8Plan
from .tiles import conv_kernel
from .values import is_depthwise, weight_shift


def build(g, isa: Isa, dtype: str, zp_x: int, tensorize: bool = True, zp_w: int = 0, weight_dtype: str = "int8",
          output: dict | None = None, source: tuple | None = None, pairs: bool = False):
    """(IRModule after scheduling, plan). tensorize=False vectorizes the same tiling instead: the
    'LLVM chooses the instructions' baseline of `bench arm`. output: Int8Plan's output fields
    (output_dtype, bias, activation, zp_out). On x86 every stage runs on all threads. source: the
    layer as given and the form `g` is of it, (Geometry, form) (Int8Plan.source, Int8Plan.form).
    pairs: the weights fit the vpmaddubsw tile's pair bound (tiles.conv_kernel)."""
    dw = is_depthwise(g)
    zw8 = zp_w - weight_shift(weight_dtype)
    plan = Int8Plan(g, conv_kernel(isa, dtype, dw, g, pairs=pairs), dw, **(output or {}), windows=zw8 != 0,
                    parallel=isa.arch == "x86", **dict(zip(("source", "form"), source or ())))
    if plan.pitch:  # the tile for the flat run of rows (amx_tile), where the row's width no longer counts
        plan = dataclasses.replace(plan, kern=conv_kernel(isa, dtype, dw, g, pitched=True, pairs=pairs))
    if plan.dot or plan.float_taps:
        plan = dataclasses.replace(plan, bias=True)  # the expansion's per-channel terms
    # The buffers the plan sizes, refused before any TIR is made (TVM indexes in int32).
    check_elements(packed_input=plan.packed_shape, packed_weight=plan.weight_shape, accumulators=plan.acc_shape)
    if plan.rows:
        return depthwise.schedule_rows(plan, dtype, zp_x), plan
    if dw:
        return depthwise.schedule_lanes(plan, dtype, zp_x), plan
    return gemm.schedule(plan, dtype, zp_x, tensorize, zw8), plan
