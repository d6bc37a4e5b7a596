"""TVMScript pieces the NCHWc conv families (direct, Winograd) write alike: the post-ops'
parameters and reads, and the band's padded input pack."""

from __future__ import annotations

from ..common.tir import buffer, padded_pack
from .geometry import Geometry, PostOps


def post_params(post: PostOps, g: Geometry, residual: str = "Res") -> list[str]:
    """The post-ops' extra inputs, in the order a call passes them: bias, then residual (named
    `residual`: a parameter the function then views in another shape takes another name)."""
    return ([buffer("Bias", g.bias_shape)] if post.bias else []) + ([buffer(residual, g.out_shape)] if post.residual else [])


def post_reads(post: PostOps, g: Geometry, rows: int | None = None) -> str:
    """Extra T.reads of a block covering output rows [vyb*rows, +rows) (all rows: None)."""
    out = ""
    if post.bias:
        out += f", Bias[0:{g.bias_shape[0]}, 0:{g.block}]"
    if post.residual:
        span = f"vyb * {rows}:vyb * {rows} + {rows}" if rows else f"0:{g.out_hw[0]}"
        out += f", Res[vn, 0:{g.out_shape[1]}, {span}, 0:{g.out_hw[1]}, 0:{g.block}]"
    return out


def band_pack(g: Geometry, band: str, row_step: int, size: tuple[int, int, int, int], lanes_used: int | None = None,
              indent: int = 12) -> list[str]:
    """Fill P[q, r, x, i] (allocated by the caller) with the input rows of band `band` (the band's first input row, before
    padding, is band * row_step - top), zero padding included, for `size` = (channel blocks,
    rows, columns, lanes). lanes_used: lanes past it are zero too (a first layer's 3 channels
    in a 16-lane block)."""
    top, left = g.pad[0], g.pad[1]
    row = f"{band} * {row_step} + vr - {top}"
    inside = f"0 <= {row} and {row} < {g.h} and 0 <= vx - {left} and vx - {left} < {g.w}"
    if lanes_used is not None:
        inside += f" and vi < {lanes_used}"
    return padded_pack(indent, "P", list(zip("qrxi", size)), inside, f"D[vn, vq, {row}, vx - {left}, vi]")
