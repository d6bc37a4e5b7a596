"""The layer itself, packed as it is: padded, channels last, 8-bit as a raw tile takes it or
widened less the zero point for the upcast (depthwise layers too, and AMX's flat run of rows);
channels-last 1x1 layers as the same conv on long rows (flat_geometry)."""

from __future__ import annotations

import dataclasses

from microkernels import Isa

from ....common.tir import padded_pack
from ...geometry import Geometry
from ..tiles import flat_row
from ..values import data_shift, is_depthwise, shifted, widened
from .common import parallel_rows

NAME = None


def applies(g: Geometry, isa: Isa, layer) -> tuple[Geometry, str]:
    """Every layer: (flat_geometry's form of it, "")."""
    return flat_geometry(g, layer.quant.data_layout, isa), ""


def flat_geometry(g: Geometry, data_layout: str, isa: Isa) -> Geometry:
    """A channels-last 1x1, stride-1, unpadded x86 layer as the same conv on long rows: its H*W
    pixels, consecutive in memory either way, in rows of flat_row's length (one row up to 256),
    which take whole tiles where a 14- or 7-pixel row pads them or takes short ones (an AMX tile
    of 7 rows runs at a third of its peak). The op keeps the user's shapes
    (Int8Conv2dOp.data_shape); the module reads and writes the same memory as
    (N, H*W / row, row, C). Other layers come back as they are."""
    if not (data_layout == "NHWC" and isa.arch == "x86" and g.kh == g.kw == 1 and g.stride == (1, 1)
            and not any(g.pad) and g.h > 1 and not is_depthwise(g)):
        return g
    row = flat_row(g.h * g.w)
    return dataclasses.replace(g, h=g.h * g.w // row, w=row)


def note(plan) -> str:
    return ""


def buffers(plan, dtype: str) -> None:
    return None


def pack(plan, dtype: str, zp: int) -> list[str]:
    """The pack stage into `plan.packed_shape`."""
    g = plan.g
    top, left = g.pad[0], g.pad[1]
    conds = [f"{top} <= vy", f"vy < {top + g.h}", f"{left} <= vx", f"vx < {left + g.w}"]
    if plan.packed_shape[-1] != (g.c if plan.depthwise else g.cg):
        conds.insert(0, f"vc < {g.c if plan.depthwise else g.cg}")
    chan = "vc" if plan.depthwise else f"vg * {g.cg} + vc"
    x = f"D[vn, vy - {top}, vx - {left}, {chan}]" if plan.nhwc else f"D[vn, {chan}, vy - {top}, vx - {left}]"
    names = "nyxc" if plan.depthwise else "ngyxc"
    if plan.pitch:  # flat position p of the padded rows laid back to back (past the last: padding)
        flat = {"vy": f"vp // {plan.pitch}", "vx": f"vp % {plan.pitch}"}
        conds = [" ".join(flat.get(w, w) for w in c.split()) for c in conds]
        x = x.replace("vy -", f"{flat['vy']} -").replace("vx -", f"{flat['vx']} -")
        names = "ngpc"
    if plan.dot:
        # 8-bit as the tile takes it (data_shift); a padded pixel holds the zero point, a padded
        # channel 0 (it must add nothing to the window sums either).
        shift, dt = data_shift(plan, dtype), plan.packed_dtype
        value = shifted(x, shift, dt)
        pixel = [c for c in conds if not c.startswith("vc")]
        value = f"T.if_then_else({' and '.join(pixel)}, {value}, T.{dt}({zp + shift}))"
        conds, zero = conds[:1] if conds[0].startswith("vc") else ["True"], f"T.{dt}(0)"
    else:
        value = widened(x, zp)
        zero = "T.int16(0)"
        if plan.float_taps:  # the data as it is, its zero point in the padding
            value, zero = x, f"T.{dtype}({zp})"
    return padded_pack(4, "P", list(zip(names, plan.packed_shape)), " and ".join(conds), value, zero)


def parallel(sch, plan) -> bool:
    return parallel_rows(sch, plan)
