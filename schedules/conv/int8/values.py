"""How 8-bit values reach the integer tiles: the zero points' ranges, the shifts a raw-8-bit tile
(sdot, vpdpbusd, tdpbusd) needs, and the int16 upcast's widening (x - zp as int16)."""

from __future__ import annotations

import numpy as np

from ..geometry import Geometry

ZERO_POINT_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (0, 0)}


def zero_point(name: str, zp, dtype: str) -> int:
    if isinstance(zp, (bool, np.bool_)) or not isinstance(zp, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(zp).__name__}")
    lo, hi = ZERO_POINT_RANGE[dtype]
    if not lo <= zp <= hi:
        what = "int16 data is already zero-point free (the legalized form)" if dtype == "int16" else f"{dtype} values"
        raise ValueError(f"{name}={zp} is out of range for {dtype}: must lie in [{lo}, {hi}] ({what})")
    return int(zp)


def data_shift(plan, dtype: str) -> int:
    """What the pack adds to `dtype` data so a raw-8-bit tile can take it (plan: an Int8Plan):
    uint8 - 128 for sdot's int8, int8 + 128 for vpdpbusd's uint8; 0 where the dtype already fits
    (or the pack widens)."""
    if not plan.dot or dtype == plan.packed_dtype:
        return 0
    return -128 if dtype == "uint8" else 128


def weight_shift(dtype: str) -> int:
    """What turns weights of `dtype` into the int8 a raw-8-bit tile takes: uint8 - 128."""
    return 128 if dtype == "uint8" else 0


def widened(x: str, zp: int) -> str:
    """TVMScript of the 8-bit value `x` as the upcast packs it: int16, less the zero point."""
    return f"T.Cast('int16', {x})" + (f" - T.int16({zp})" if zp else "")


def is_depthwise(g: Geometry) -> bool:
    """Depthwise with one output channel per input channel: what the lane-wise kernel computes
    (a channel multiplier goes through the GEMM path)."""
    return g.depthwise and g.o == g.c


def shifted(x: str, shift: int, dt: str) -> str:
    """TVMScript of the 8-bit value `x` plus `shift` (data_shift) in the tile's dtype `dt`."""
    return f"T.Cast('{dt}', T.Cast('int16', {x}) + T.int16({shift}))" if shift else x
