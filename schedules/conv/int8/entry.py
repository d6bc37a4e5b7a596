"""The entry function both paths (GEMM tiles, depthwise lanes) start with: its arguments and the
packed input P and accumulators Acc it allocates."""

from __future__ import annotations

from ...common.tir import buffer, header
from . import forms


def entry(plan, dtype: str) -> list[str]:
    """The entry function of either path, with the packed input P and the int32 accumulators.
    Arguments: data, packed weights, [Bias (G, O/G) int32], [M (O,) float32 multipliers],
    [R, the residual, Out's shape and dtype], Out. P: a view of the data where it is the packed
    input already (Int8Plan.in_place), else as the form declares it (a padded source in P's
    allocation, views of rows), else an allocation of its own."""
    requant = plan.output_dtype != "int32"
    L = header([buffer("D", plan.data_shape, dtype), buffer("Wv", plan.weight_shape, plan.weight_dtype),
                *([buffer("Bias", plan.bias_shape, "int32")] if plan.bias else []),
                *([buffer("M", (plan.layer.o,), "float32")] if requant else []),
                *([buffer("R", plan.out_shape, plan.output_dtype)] if plan.residual else []),
                buffer("Out", plan.out_shape, plan.output_dtype)])
    if plan.in_place(dtype):  # the data is the packed input already: a view, no pack
        packed = [f"    P = T.decl_buffer({plan.packed_shape}, '{plan.packed_dtype}', data=D.data)"]
    else:
        packed = forms.buffers(plan, dtype) or [f"    P = T.alloc_buffer({plan.packed_shape}, '{plan.pack_dtype(dtype)}')"]
    return L + packed + [f"    Acc = T.alloc_buffer({plan.acc_shape}, '{plan.acc_dtype}')"]
