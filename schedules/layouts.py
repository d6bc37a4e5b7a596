"""Blocked layouts for convolution, and the numpy transforms into and out of them.

NCHW[x]c data: (N, G*CB, H, W, x), channel c of group g at block g*CB + c//x, lane c%x, where
CB = ceil(C_per_group / x). With groups == 1 and C a multiple of x this is plain NCHWxc;
otherwise each group's channels are zero-padded to whole blocks, so a block never straddles
two groups.
OIHW[x]i[y]o weights: (G*OB, IB, KH, KW, x, y), the repacking of OIHW (O, C/groups, KH, KW).
Zero padding in either layout contributes exactly zero to every output.

Weights are packed once, ahead of time; a model keeps activations blocked from layer to layer
(the output block of one layer is the input block of the next) and never calls these on data.
"""

from __future__ import annotations

import numpy as np


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def to_nchwc(x: np.ndarray, block: int, groups: int = 1) -> np.ndarray:
    """NCHW -> (N, groups*ceil(C/groups/block), H, W, block), each group zero-padded to blocks."""
    n, c, h, w = x.shape
    cg = c // groups
    cb = _ceil_div(cg, block)
    out = np.zeros((n, groups, cb * block, h, w), x.dtype)
    out[:, :, :cg] = x.reshape(n, groups, cg, h, w)
    out = out.reshape(n, groups * cb, block, h, w).transpose(0, 1, 3, 4, 2)
    return np.ascontiguousarray(out)


def from_nchwc(y: np.ndarray, channels: int, groups: int = 1) -> np.ndarray:
    """(N, groups*CB, H, W, block) -> NCHW with `channels` real channels (padding dropped)."""
    n, blocks, h, w, block = y.shape
    cg = channels // groups
    t = y.transpose(0, 1, 4, 2, 3).reshape(n, groups, (blocks // groups) * block, h, w)
    return np.ascontiguousarray(t[:, :, :cg].reshape(n, channels, h, w))


def pack_weights(w: np.ndarray, in_block: int, out_block: int, groups: int = 1) -> np.ndarray:
    """OIHW (O, C/groups, KH, KW) -> (groups*OB, IB, KH, KW, in_block, out_block), zero-padded."""
    o, cg, kh, kw = w.shape
    og = o // groups
    ob, ib = _ceil_div(og, out_block), _ceil_div(cg, in_block)
    full = np.zeros((groups, ob * out_block, ib * in_block, kh, kw), w.dtype)
    full[:, :og, :cg] = w.reshape(groups, og, cg, kh, kw)
    t = full.reshape(groups, ob, out_block, ib, in_block, kh, kw).transpose(0, 1, 3, 5, 6, 4, 2)
    return np.ascontiguousarray(t.reshape(groups * ob, ib, kh, kw, in_block, out_block))
