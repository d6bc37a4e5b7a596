"""Grouped conv2d whose groups are narrower than a block and which the depthwise family's
grouped kernel does not take (og a multiple of cg other than cg, or a fused residual; groups of
2, 4 or 8 with as many outputs go there): run as groups of whole 16-channel blocks with
block-diagonal weights, on the direct conv's schedule (the dispatcher schedules `widen(g)` with
conv.direct and builds GroupedConv2dOp)."""

from __future__ import annotations

import numpy as np

from ..common import layouts
from ..common.targets import check_array
from .geometry import NO_POST_OPS, Geometry, block_diagonal
from .op import Conv2dOp


def applies(g: Geometry) -> bool:
    return widen(g) is not None


def widen(g: Geometry) -> Geometry | None:
    """A grouped layer whose groups are narrower than a block (ResNeXt's 4 or 8 channels per
    group), as groups of whole 16-channel blocks: each spans 16 / cg of the layer's groups, and
    its weight panel is block-diagonal (zeros between groups). The tiles then do 16 / cg times
    the layer's multiply-adds, where padding each group's input and output channels to a block
    did (16 / cg) * (16 / og) times. None when the layer is not of that kind."""
    b = g.block
    if not block_diagonal(g.c, g.o, g.groups, b):
        return None
    span = b // g.cg  # layer groups per block
    return Geometry(g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.stride, g.pad, g.dilation, g.groups // span, b)


class GroupedConv2dOp(Conv2dOp):
    """A grouped conv2d run as wider groups with block-diagonal weights (widen): takes
    the layer's own OIHW weights (O, C/groups, KH, KW); `user_geometry` is the layer as given."""

    def __init__(self, geometry, isa, lib, threads, plan, post=NO_POST_OPS, emulate=False, *, user_geometry):
        super().__init__(geometry, isa, lib, threads, plan, post, emulate)
        self.user_geometry = user_geometry

    @property
    def layer(self) -> Geometry:
        return self.user_geometry

    def pack_weights(self, weight: np.ndarray) -> np.ndarray:
        u, g = self.user_geometry, self.geometry
        check_array("weight", weight, (u.o, u.cg, u.kh, u.kw), "float32")
        wide = np.zeros((g.o, g.cg, g.kh, g.kw), np.float32)
        o = np.arange(u.o)
        group = o // u.og  # the layer's group of each output channel
        first = group * u.cg % g.cg  # where that group's channels start inside its block
        for j in range(u.cg):
            wide[o, first + j] = weight[:, j]
        return layouts.pack_weights(wide, g.bi, g.block, g.groups)
