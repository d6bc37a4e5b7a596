"""What each conv2d family decided for a layer (op.plan), as typed values, and the band
arithmetic the families' planners share.

A plan also reads as a mapping (plan["algorithm"], plan.get("tile")), the form plans had
before they were typed; `as_dict()` gives the fields for JSON.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending, in O(sqrt n) steps (a map may be millions of rows tall)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def largest_divisor(n: int, fits: Callable[[int], bool]) -> int | None:
    """The largest divisor d of n with fits(d), or None when none fits. Bands are whole
    divisors of the rows (or tile rows) so that every band is alike: one loop, no tail band."""
    return next((d for d in reversed(divisors(n)) if fits(d)), None)


@dataclass(frozen=True)
class Plan:
    algorithm: str  # "direct", "winograd" or "depthwise"
    reason: str  # why this algorithm: algorithm="auto"'s rule, or what the caller forced
    # What the choice rests on: "defaults" (the shipped rules) or this host's measurements
    # ("tuned (FILE)", common/tuned.py). Keyword-only, so the families' fields keep their order.
    source: str = field(default="defaults", kw_only=True)

    def __getitem__(self, key: str):
        if key not in self.as_dict():
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default=None):
        return self.as_dict().get(key, default)

    def __contains__(self, key: str) -> bool:
        return key in self.as_dict()

    def as_dict(self) -> dict:
        """The plan's fields; optional ones that do not apply (None) are left out."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class DirectPlan(Plan):
    mr: int  # pixels per tile
    output_blocks: int  # output blocks per tile (2 on short rows: conv.direct.output_blocks)
    band_rows: int  # output rows per band
    band_parallel: bool  # threads split the bands (else each band's output blocks)
    segments: list  # (first column, tiles, MR) runs covering one output row
    block_diagonal: str | None = None  # grouped layers run as wider groups: what became what
    chunk: int | None = None  # input-channel blocks per reduction chunk (direct.chunk_blocks); None: all
    flat_rows: int | None = None  # a 1x1 stride-1 layer's band as one row of this many pixels (segments cover it)


@dataclass(frozen=True)
class WinogradPlan(Plan):
    tile: int  # m of F(m x m, 3 x 3)
    band_tile_rows: int
    band_parallel: bool
    block_parallel: bool  # threads split the output blocks (fewer bands than threads)
    tiles_per_band: int
    bands: int
    mr: int  # the GEMM tile's rows
    weight_bytes: int  # of the transformed weights U


@dataclass(frozen=True)
class DepthwisePlan(Plan):
    band_rows: int
    multiplier: int  # output channels per input channel
    kernel: str | None  # the row kernel's name; None where the layer stays plain TIR
    group: int = 1  # input (= output) channels per group: 1 depthwise, 2-8 ResNeXt-like ("grouped")
    step: int | None = None  # the row kernel's pixels per step; None where the layer stays plain TIR
