"""The forms a quantized layer can run in, and the one place that picks among them.

A form is the layer rewritten as another conv that the same tiles run better, with a pack of its
own that makes the rewritten conv's input from the layer's data (Int8Plan.form names it,
Int8Plan.source keeps the layer as given). Each form is a module with the same functions:
    applies(g, isa, layer) -> (the Geometry the tiles run, "") or (None, why not)
    note(plan)             -> what Int8Plan.why adds for it
    buffers(plan, dtype)   -> the packed input's declaration, or None for the default one
    pack(plan, dtype, zp)  -> the TVMScript of its pack stage
    parallel(sch, plan)    -> its stages on all threads (x86); True where that includes the output
and, where its weights differ from the layer's, a weights() of its own (weights.py calls it).
In the order `choose` tries them: winograd (3x3 stride-1 layers as integer Winograd F(2x2, 3x3)
on the int16 upcast), paired (odd channel counts at an even stride as pairs of values),
space_to_depth (AMX's stride-2 stem), subsampled (strided 1x1 layers on their subsampled
pixels), and direct: the layer itself (channels-last 1x1 layers as long rows, flat_geometry).
Forms never import each other; what two of them share is in `common`.
"""

from __future__ import annotations

from dataclasses import dataclass

from microkernels import Isa

from ...geometry import Geometry, Quantization
from . import direct, paired, space_to_depth, subsampled, winograd

PAIRED, SPACE_TO_DEPTH, SUBSAMPLED, WINOGRAD = paired.NAME, space_to_depth.NAME, subsampled.NAME, winograd.NAME
ORDER = (winograd, paired, space_to_depth, subsampled)  # the first that applies; else direct
MODULES = {m.NAME: m for m in (direct, *ORDER)}


@dataclass(frozen=True)
class Layer:
    """What the forms' applies() read beside the geometry and the ISA: the layer's quantization,
    its own tile (tiles.conv_kernel), its zero points, and the weights' zero point as a
    raw-8-bit tile sees it (zw8)."""

    quant: Quantization
    kern: object
    zp_x: int
    zp_w: int
    zw8: int


def choose(g: Geometry, isa: Isa, layer: Layer, algorithm: str = "auto") -> tuple[Geometry, str | None]:
    """(the Geometry the tiles run, the form's name, or None for the layer itself). algorithm:
    "auto" (Winograd where it applies), "direct" (never Winograd), "winograd" (refused with the
    reason where it does not apply)."""
    for form in ORDER:
        if form is winograd and algorithm == "direct":
            continue
        geometry, why_not = form.applies(g, isa, layer)
        if form is winograd and algorithm == "winograd" and geometry is None:
            raise ValueError(f"algorithm='winograd' does not apply to this quantized layer: {why_not}")
        if geometry is not None:
            return geometry, form.NAME
    return direct.applies(g, isa, layer)[0], None


def note(plan) -> str:
    return MODULES[plan.form].note(plan)


def buffers(plan, dtype: str) -> list[str] | None:
    return MODULES[plan.form].buffers(plan, dtype)


def pack(plan, dtype: str, zp: int) -> list[str]:
    return MODULES[plan.form].pack(plan, dtype, zp)


def parallel(sch, plan) -> bool:
    return MODULES[plan.form].parallel(sch, plan)
