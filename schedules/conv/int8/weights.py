"""The weights packed once, outside the layer's function (kernel_vec): OIHW as the tiles read them,
in the layer's form, and the per-channel terms of the zero points' expansion where the tile
multiplies 8-bit values as they are."""

from __future__ import annotations

import numpy as np

from microkernels.int_gemm import PAIR_BOUND

from .forms import PAIRED, SPACE_TO_DEPTH, WINOGRAD, paired, space_to_depth, winograd
from .values import weight_shift


def pack_weights(plan, weight: np.ndarray, zp_w: int, zp_x8: int = 0) -> tuple:
    """OIHW int8/uint8 (or int16, zero point already out) -> the packed weight arrays:
    (kernel_vec,) with int16 w - zp_w; for the raw-8-bit tiles (int8 kernel_vec, int32 bias),
    where weights and zp_w are shifted to int8 and bias = -zp_x8 * sum w + K * zp_x8 * zp_w
    (zp_x8: the data's zero point as the tile sees it, after data_shift)."""
    if plan.form == SPACE_TO_DEPTH:
        weight = space_to_depth.weights(weight)
    if plan.form == WINOGRAD:
        return (_gemm_weights(plan, winograd.weights(weight, zp_w), np.int16),)
    g = plan.g
    if plan.dot:
        shift = weight_shift(str(weight.dtype))
        w8 = (weight.astype(np.int16) - shift).astype(np.int8)
        zw8 = zp_w - shift
        k = g.cg * g.kh * g.kw
        sums = w8.astype(np.int64).reshape(g.o, -1).sum(axis=1)
        bias = (-zp_x8 * sums + k * zp_x8 * zw8).astype(np.int32).reshape(plan.bias_shape)
        packed = _gemm_weights(plan, w8, np.int8)
        if getattr(plan.kern, "pairs", False):
            _check_pairs(packed, plan.kern.name)
        return packed, bias
    w = weight.astype(np.int16) - np.int16(zp_w)
    if plan.form == PAIRED:
        w = paired.weights(w, plan.g.kw)
    if plan.rows:
        return (np.ascontiguousarray(w[:, 0]),)
    if plan.depthwise:
        out = np.zeros(plan.weight_shape, plan.weight_dtype)
        out[:, :, : g.c] = w[:, 0].transpose(1, 2, 0)
        if plan.float_taps:  # the zero point of the data, which the pack leaves in, out through the bias
            bias = (-zp_x8 * w.astype(np.int64).reshape(g.o, -1).sum(axis=1)).astype(np.int32)
            return out, bias.reshape(plan.bias_shape)
        return (out,)
    return (_gemm_weights(plan, w, np.int16),)


def _gemm_weights(plan, w: np.ndarray, dtype) -> np.ndarray:
    g, nr = plan.g, plan.kern.nr
    # (G, og, cg, KH, KW) -> (G, og_padded, KH, KW, cg) -> blocks of NR output channels
    wg = w.reshape(g.groups, g.og, g.cg, g.kh, g.kw).transpose(0, 1, 3, 4, 2)
    full = np.zeros((g.groups, plan.op, g.kh, g.kw, plan.cp), dtype)
    full[:, : g.og, :, :, : g.cg] = wg
    blocks = full.reshape(g.groups, plan.op // nr, nr, g.kh, g.kw, plan.cp)
    if plan.group > 1:  # channels in groups of G innermost, as sdot / vpdpbusd / vpmaddwd multiply them
        gk = plan.group
        blocks = blocks.reshape(*blocks.shape[:5], plan.cp // gk, gk).transpose(0, 1, 3, 4, 5, 2, 6)
    else:
        blocks = blocks.transpose(0, 1, 3, 4, 5, 2)
    return np.ascontiguousarray(blocks)


def pair_sums(w8: np.ndarray) -> np.ndarray:
    """|w_a| + |w_b| of the weight pairs the vpmaddubsw tile multiplies together in one 16-bit
    sum, from OIHW int8 weights as the raw-8-bit tiles take them (after weight_shift): input
    channels (2i, 2i + 1) of a group at each output channel and tap (the packing's groups of 4
    channels hold two such pairs; an odd last channel meets a zero of the padding)."""
    w = np.abs(w8.astype(np.int32))
    if w.shape[1] % 2:
        w = np.concatenate([w, np.zeros((w.shape[0], 1, *w.shape[2:]), np.int32)], axis=1)
    return w[:, 0::2] + w[:, 1::2]


def pairs_fit(weight: np.ndarray, weight_dtype: str | None = None) -> bool:
    """Whether a layer's OIHW int8/uint8 weights keep every pair the vpmaddubsw tile multiplies
    within PAIR_BOUND (|w_a| + |w_b| <= 128: then 255 * 128 = 32640 fits its saturating int16
    sum and the tile is exact): true for all weights quantized to 7 bits ([-64, 64], ONNX
    Runtime's reduce_range), rarely for full-range ones. What Quantization(weight_bits=7)
    promises; pack_weights checks it again on the packed weights."""
    dtype = weight_dtype or str(weight.dtype)
    if dtype not in ("int8", "uint8"):
        return False
    w8 = weight.astype(np.int16) - weight_shift(dtype)
    return weight.size == 0 or int(pair_sums(w8).max()) <= PAIR_BOUND


def _check_pairs(packed: np.ndarray, name: str) -> None:
    """The bound on the packed weights themselves, in the pairs the tile multiplies (each group
    of 4 along the last axis: (0, 1) and (2, 3)): never a silently saturated sum."""
    p = np.abs(packed.astype(np.int32)).reshape(-1, 2).sum(axis=1)
    if p.size and p.max() > PAIR_BOUND:
        bad = int((p > PAIR_BOUND).sum())
        raise ValueError(f"{name} multiplies weights in pairs whose 16-bit sums saturate unless |w_a| + |w_b| <= "
                         f"{PAIR_BOUND}; {bad} pair(s) of these weights exceed it (largest {int(p.max())}). The layer "
                         "was compiled for 7-bit weights (weight_bits=7): quantize them to [-64, 64] (reduce_range), "
                         "or compile it with weight_bits=8 (the exact int16 upcast)")
