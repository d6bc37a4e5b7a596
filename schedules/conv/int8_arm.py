"""Quantized conv2d for ARM NEON, spatial pack, tensorized on the int16 MAC tile.

Computes out[n, o, y, x] = sum (x_in - zp_x) * (w - zp_w) in int32, from int8/uint8 data and
weights. Three stages, as in TVM's ARM spatial-pack schedule:
    pack (data_vec):   x - zp_x widened to int16, zero-padded (a padded pixel is the zero point,
                       so it contributes 0), channels last: (N, G, Hp, Wp, Cp)
    conv (conv_vec):   MR pixels x NR output channels per tile, the tile's whole reduction
                       (KH calls of K = KW*Cp, the row's columns back to back) on the kernel;
                       the output row is padded up to a multiple of MR, so no tail tiles
    unpack:            the int32 tiles back to NCHW
The weights are widened and packed once, outside, by `pack_weights` (kernel_vec): w - zp_w as
int16, (G, O/NR, KH, KW, Cp, NR). Upcasting to int16 here, at the schedule, keeps the weights int8
in the model; `relax_int8.legalize_int8_conv2d` is the other design point (upcast in the graph).

On aarch64-dotprod the tile is `sdot`, which multiplies int8 by int8 as they are: the zero
points cannot be subtracted while packing (x - zp_x need not fit int8). It uses the expansion
    sum (x - zx)(w - zw) = sum x*w - zw * sum x - zx * sum w + K * zx * zw
with uint8 shifted to int8 first (x - 128, zx - 128): sdot computes sum x*w, a small pass sums each
window's inputs (sum x, 1/O of the conv's work), and sum w comes with the packed weights as a
per-channel bias. Padding holds the zero point, so it cancels in the expansion as it should.

Depthwise layers (groups = in = out channels) skip the GEMM: channels sit in vector lanes and
each tap is one `vmlal.s16` over 8 channels, so nothing is padded to a tile.

ARM code is compiled here and, since this host is x86, run under qemu-user (`emulate`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import s_tir

from intrinsics.int_conv import IntConvTile, register_int_conv
from microkernels import Isa
from microkernels.int_mac import MacKernel, default_mac_kernel

from ..common.targets import check_array, check_elements
from ..common.tir import buffer, ceil_to, header, padded_pack, parse
from ..emulation import qemu
from .geometry import Geometry, Quantization

# |x - zp_x| and |w - zp_w| are at most 255 for 8-bit data, so each product is at most 65025 in
# magnitude, and a sum of K of them is exact in int32 while K * 65025 <= 2**31 - 1.
MAX_PRODUCT = 255 * 255
MAX_K = (2**31 - 1) // MAX_PRODUCT  # 33025
# The sdot expansion adds four terms, each at most 128 * 128 * K in magnitude (the bias two of them):
# every partial sum is exact while 4 * 16384 * K <= 2**31 - 1.
MAX_K_DOT = (2**31 - 1) // (4 * 128 * 128)  # 32767
ZERO_POINT_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (0, 0)}
DEPTHWISE_LANES = 8  # int16 channels per q register


def zero_point(name: str, zp, dtype: str) -> int:
    if isinstance(zp, (bool, np.bool_)) or not isinstance(zp, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(zp).__name__}")
    lo, hi = ZERO_POINT_RANGE[dtype]
    if not lo <= zp <= hi:
        what = "int16 data is already zero-point free (the legalized form)" if dtype == "int16" else f"{dtype} values"
        raise ValueError(f"{name}={zp} is out of range for {dtype}: must lie in [{lo}, {hi}] ({what})")
    return int(zp)


@dataclass(frozen=True)
class Int8Plan:
    """Sizes of the packed buffers for one layer (g: the validated conv2d Geometry)."""

    g: object
    kern: MacKernel
    depthwise: bool

    @property
    def dot(self) -> bool:
        return self.kern.op == "dot"

    @property
    def packed_dtype(self) -> str:
        return self.kern.dtype

    @property
    def cp(self) -> int:
        """Packed channels per group: the fewest >= C/groups that make one kernel call's K (a
        whole kernel row when dw = 1, one column otherwise) a multiple of the kernel's K step
        (and whole groups of 4 for sdot)."""
        if self.depthwise:
            return 1
        span = self.g.kw if self.g.dilation[1] == 1 else 1
        cp = self.g.cg
        while (span * cp) % self.kern.k_step or (self.dot and cp % 4):
            cp += 1
        return cp

    @property
    def op(self) -> int:  # packed output channels per group
        return ceil_to(self.g.og, self.kern.nr)

    @property
    def ow_padded(self) -> int:
        return self.g.out_hw[1] if self.depthwise else ceil_to(self.g.out_hw[1], self.kern.mr)

    @property
    def data_shape(self) -> tuple:
        g = self.g
        return (g.n, g.c, g.h, g.w)

    @property
    def out_shape(self) -> tuple:
        g = self.g
        return (g.n, g.o, *g.out_hw)

    @property
    def packed_shape(self) -> tuple:
        """The packed input: (N, Hp, Wp, C in whole vectors) for depthwise, (N, G, Hp, Wp, Cp) otherwise."""
        g, (hp, wp) = self.g, self.packed_hw
        if self.depthwise:
            return (g.n, hp, wp, ceil_to(g.c, DEPTHWISE_LANES))
        return (g.n, g.groups, hp, wp, self.cp)

    @property
    def packed_hw(self) -> tuple[int, int]:
        g, (oh, _) = self.g, self.g.out_hw
        (sh, sw), (dh, dw) = g.stride, g.dilation
        return (oh - 1) * sh + (g.kh - 1) * dh + 1, (self.ow_padded - 1) * sw + (g.kw - 1) * dw + 1

    @property
    def acc_shape(self) -> tuple:
        """The int32 accumulators: (N, Ho, Wo, C in whole vectors) for depthwise, else per
        group and output block, each row padded to whole tiles (N, G, OB, Ho, Wo padded, NR)."""
        g, (oh, ow) = self.g, self.g.out_hw
        if self.depthwise:
            return (g.n, oh, ow, self.packed_shape[-1])
        return (g.n, g.groups, self.op // self.kern.nr, oh, self.ow_padded, self.kern.nr)

    @property
    def weight_shape(self) -> tuple:
        g = self.g
        if self.depthwise:
            return (g.kh, g.kw, ceil_to(g.c, DEPTHWISE_LANES))
        if self.dot:
            return (g.groups, self.op // self.kern.nr, g.kh, g.kw, self.cp // 4, self.kern.nr, 4)
        return (g.groups, self.op // self.kern.nr, g.kh, g.kw, self.cp, self.kern.nr)

    @property
    def bias_shape(self) -> tuple:
        return (self.g.groups, self.g.og)


def _s8_shift(dtype: str) -> int:
    """What turns this dtype's values into int8 for sdot: uint8 - 128."""
    return 128 if dtype == "uint8" else 0


def pack_weights(plan: Int8Plan, weight: np.ndarray, zp_w: int, zp_x8: int = 0) -> tuple:
    """OIHW int8/uint8 (or int16, zero point already out) -> the packed weight arrays:
    (kernel_vec,) with int16 w - zp_w; for sdot (int8 kernel_vec, int32 bias), where weights and
    zp_w are shifted to int8 and bias = -zp_x8 * sum w + K * zp_x8 * zp_w (zp_x8: the data's
    zero point as int8)."""
    g = plan.g
    if plan.dot:
        shift = _s8_shift(str(weight.dtype))
        w8 = (weight.astype(np.int16) - shift).astype(np.int8)
        zw8 = zp_w - shift
        k = g.cg * g.kh * g.kw
        sums = w8.astype(np.int64).reshape(g.o, -1).sum(axis=1)
        bias = (-zp_x8 * sums + k * zp_x8 * zw8).astype(np.int32).reshape(plan.bias_shape)
        return _pack_gemm_weights(plan, w8, np.int8), bias
    w = weight.astype(np.int16) - np.int16(zp_w)
    if plan.depthwise:
        out = np.zeros(plan.weight_shape, np.int16)
        out[:, :, : g.c] = w[:, 0].transpose(1, 2, 0)
        return (out,)
    return (_pack_gemm_weights(plan, w, np.int16),)


def _pack_gemm_weights(plan: Int8Plan, w: np.ndarray, dtype) -> np.ndarray:
    g, nr = plan.g, plan.kern.nr
    # (G, og, cg, KH, KW) -> (G, og_padded, KH, KW, cg) -> blocks of NR output channels
    wg = w.reshape(g.groups, g.og, g.cg, g.kh, g.kw).transpose(0, 1, 3, 4, 2)
    full = np.zeros((g.groups, plan.op, g.kh, g.kw, plan.cp), dtype)
    full[:, : g.og, :, :, : g.cg] = wg
    blocks = full.reshape(g.groups, plan.op // nr, nr, g.kh, g.kw, plan.cp)
    if plan.dot:  # channels in groups of 4 innermost, as sdot multiplies them
        blocks = blocks.reshape(*blocks.shape[:5], plan.cp // 4, 4).transpose(0, 1, 3, 4, 5, 2, 6)
    else:
        blocks = blocks.transpose(0, 1, 3, 4, 5, 2)
    return np.ascontiguousarray(blocks)


def _header(plan: Int8Plan, dtype: str) -> list[str]:
    """The entry function of either path, with the packed input P and the int32 accumulators."""
    L = header([buffer("D", plan.data_shape, dtype), buffer("Wv", plan.weight_shape, plan.packed_dtype),
                *([buffer("Bias", plan.bias_shape, "int32")] if plan.dot else []), buffer("Out", plan.out_shape, "int32")])
    return L + [f"    P = T.alloc_buffer({plan.packed_shape}, '{plan.packed_dtype}')",
                f"    Acc = T.alloc_buffer({plan.acc_shape}, 'int32')"]


def _render_pack(plan: Int8Plan, dtype: str, zp: int) -> list[str]:
    """The pack stage into `plan.packed_shape`."""
    g = plan.g
    top, left = g.pad[0], g.pad[1]
    conds = [f"{top} <= vy", f"vy < {top + g.h}", f"{left} <= vx", f"vx < {left + g.w}"]
    if plan.packed_shape[-1] != (g.c if plan.depthwise else g.cg):
        conds.insert(0, f"vc < {g.c if plan.depthwise else g.cg}")
    chan = "vc" if plan.depthwise else f"vg * {g.cg} + vc"
    x = f"D[vn, {chan}, vy - {top}, vx - {left}]"
    if plan.dot:
        # int8 as is (uint8 shifted by -128); a padded pixel holds the zero point, a padded
        # channel 0 (it must add nothing to the window sums either).
        shift = _s8_shift(dtype)
        value = f"T.Cast('int8', T.Cast('int16', {x}) - T.int16({shift}))" if shift else x
        pixel = [c for c in conds if not c.startswith("vc")]
        value = f"T.if_then_else({' and '.join(pixel)}, {value}, T.int8({zp - shift}))"
        conds, zero = conds[:1] if conds[0].startswith("vc") else ["True"], "T.int8(0)"
    else:
        value = f"T.Cast('int16', {x})" + (f" - T.int16({zp})" if zp else "")
        zero = "T.int16(0)"
    names = "nyxc" if plan.depthwise else "ngyxc"
    return padded_pack(4, "P", list(zip(names, plan.packed_shape)), " and ".join(conds), value, zero)


def _tile_iters(plan: Int8Plan, columns: list[str]) -> list[str]:
    """A tile block's spatial iterators; `columns` bind its output columns (vm, and vx0)."""
    return ["vn, vg, vob, vy = T.axis.remap('SSSS', [n, g, o, y])", *columns, f"vj = T.axis.spatial({plan.kern.nr}, j)"]


def _acc(x0: str) -> str:
    return f"Acc[vn, vg, vob, vy, {x0} + vm, vj]"


def _conv_block(plan: Int8Plan, tile: IntConvTile, columns: list[str], x0: str, init: list[str]) -> list[str]:
    """The tile's whole reduction, block 'conv', inside the loop over tiles (tt); `x0` is the
    tile's first column as the block sees it, `init` what the block zeroes Acc with."""
    sh, sw = plan.g.stride
    axes = tile.reduce_axes()
    v = {a: f"v{a}" for a, _ in axes} | {"m": "vm", "j": "vj"}
    row, col, ch = tile.a_index(v)
    loops = ["m", "j"] + [a for a, _ in axes]
    extents = [plan.kern.mr, plan.kern.nr] + [e for _, e in axes]
    body = [*_tile_iters(plan, columns), *(f"v{a} = T.axis.reduce({e}, {a})" for a, e in axes), *init,
            f"{_acc(x0)} = {_acc(x0)} + T.Cast('int32', P[vn, vg, vy * {sh} + {row}, {x0} * {sw} + {col}, {ch}])"
            f" * T.Cast('int32', Wv[vg, vob, {', '.join(tile.b_index(v))}])"]
    return [f"        for {', '.join(loops)} in T.grid({', '.join(map(str, extents))}):",
            "            with T.sblock('conv'):", *(f"                {line}" for line in body)]


def _tensorized_tile(plan: Int8Plan, tile: IntConvTile) -> list[str]:
    """The tile as the intrinsic matches it. Its first column is an iterator of its own, so the
    inner bindings after blockize are exactly the description's m (not tt * MR + m). TIR's
    decompose_reduction refuses such a binding, so the zeroing is a block of its own, ahead."""
    mr, nr = plan.kern.mr, plan.kern.nr
    columns = [f"vx0 = T.axis.spatial({plan.ow_padded}, tt * {mr})", f"vm = T.axis.spatial({mr}, m)"]
    return [f"        for m, j in T.grid({mr}, {nr}):", "            with T.sblock('zero'):",
            *(f"                {line}" for line in _tile_iters(plan, columns)), f"                {_acc('vx0')} = 0",
            *_conv_block(plan, tile, columns, "vx0", [])]


def _vectorized_tile(plan: Int8Plan, tile: IntConvTile) -> list[str]:
    """The same tile as one reduction block with its init, which `build` reorders and vectorizes:
    TIR vectorizes a reduction only in a block that has its init."""
    columns = [f"vm = T.axis.spatial({plan.ow_padded}, tt * {plan.kern.mr} + m)"]
    return _conv_block(plan, tile, columns, "0", ["with T.init():", f"    {_acc('0')} = 0"])


def _render_gemm(plan: Int8Plan, dtype: str, zp: int, tile_blocks, zw8: int = 0) -> tuple[list[str], IntConvTile]:
    """The GEMM path, with `tile_blocks(plan, tile)` (`_tensorized_tile` or `_vectorized_tile`)
    for the blocks of one tile of MR pixels x NR output channels.
    zw8: for sdot, the weights' zero point shifted to int8 (used in the expansion)."""
    g, kern = plan.g, plan.kern
    mr, nr, cp = kern.mr, kern.nr, plan.cp
    oh, ow = g.out_hw
    (sh, sw), (dh, dw) = g.stride, g.dilation
    owp, ob = plan.ow_padded, plan.op // nr
    tile = IntConvTile(kern, g.kh, g.kw, cp, sw, dh, dw)
    L = _header(plan, dtype)
    if plan.dot:
        L.append(f"    WS = T.alloc_buffer(({g.n}, {g.groups}, {oh}, {ow}), 'int32')")
    L += _render_pack(plan, dtype, zp)
    L.append(f"    for n, g, o, y, tt in T.grid({g.n}, {g.groups}, {ob}, {oh}, {owp // mr}):")
    L += tile_blocks(plan, tile)
    out = f"Acc[vn, vo // {g.og}, vo % {g.og} // {nr}, vy, vx, vo % {g.og} % {nr}]"
    if plan.dot:
        # sum x over each output pixel's window, for the -zw * sum x term of the expansion
        L += [
            f"    for n, g, y, x, r, s, c in T.grid({g.n}, {g.groups}, {oh}, {ow}, {g.kh}, {g.kw}, {cp}):",
            "        with T.sblock('winsum'):",
            "            vn, vg, vy, vx, vr, vs, vc = T.axis.remap('SSSSRRR', [n, g, y, x, r, s, c])",
            "            with T.init():",
            "                WS[vn, vg, vy, vx] = 0",
            f"            WS[vn, vg, vy, vx] = WS[vn, vg, vy, vx] + T.Cast('int32', P[vn, vg, vy * {sh} + vr * {dh}, vx * {sw} + vs * {dw}, vc])",
        ]
        out += f" - T.int32({zw8}) * WS[vn, vo // {g.og}, vy, vx] + Bias[vo // {g.og}, vo % {g.og}]"
    L += [
        f"    for n, o, y, x in T.grid({g.n}, {g.o}, {oh}, {ow}):",
        "        with T.sblock('unpack'):",
        "            vn, vo, vy, vx = T.axis.remap('SSSS', [n, o, y, x])",
        f"            Out[vn, vo, vy, vx] = {out}",
    ]
    return L, tile


def _render_depthwise(plan: Int8Plan, dtype: str, zp: int) -> list[str]:
    g = plan.g
    oh, ow = g.out_hw
    (sh, sw), (dh, dw) = g.stride, g.dilation
    cp = plan.packed_shape[-1]
    L = _header(plan, dtype) + _render_pack(plan, dtype, zp)
    L += [
        f"    for n, y, x, c, r, s in T.grid({g.n}, {oh}, {ow}, {cp}, {g.kh}, {g.kw}):",
        "        with T.sblock('conv'):",
        "            vn, vy, vx, vc, vr, vs = T.axis.remap('SSSSRR', [n, y, x, c, r, s])",
        "            with T.init():",
        "                Acc[vn, vy, vx, vc] = 0",
        "            Acc[vn, vy, vx, vc] = Acc[vn, vy, vx, vc] + "
        f"T.Cast('int32', P[vn, vy * {sh} + vr * {dh}, vx * {sw} + vs * {dw}, vc]) * T.Cast('int32', Wv[vr, vs, vc])",
        f"    for n, c, y, x in T.grid({g.n}, {g.c}, {oh}, {ow}):",
        "        with T.sblock('unpack'):",
        "            vn, vc, vy, vx = T.axis.remap('SSSS', [n, c, y, x])",
        "            Out[vn, vc, vy, vx] = Acc[vn, vy, vx, vc]",
    ]
    return L


def is_depthwise(g: Geometry) -> bool:
    """Depthwise with one output channel per input channel: what the lane-wise kernel computes
    (a channel multiplier goes through the GEMM path)."""
    return g.depthwise and g.o == g.c


def conv_kernel(isa: Isa, dtype: str = "int8", depthwise: bool = False) -> MacKernel:
    """The tile a conv runs on: the ISA's default, except on the dotprod core for int16
    (legalized) data, which sdot cannot take, and for depthwise layers, whose channels-in-lanes
    path is an s16 MAC: both use AArch64's int16 tile."""
    if isa.name == "aarch64dot" and (dtype == "int16" or depthwise):
        return default_mac_kernel("aarch64")
    return default_mac_kernel(isa.name)


def build(g, isa: Isa, dtype: str, zp_x: int, tensorize: bool = True, zp_w: int = 0, weight_dtype: str = "int8"):
    """(IRModule after scheduling, plan). tensorize=False vectorizes the same tiling instead: the
    'LLVM chooses the instructions' baseline of `bench arm`."""
    depthwise = is_depthwise(g)
    plan = Int8Plan(g, conv_kernel(isa, dtype, depthwise), depthwise)
    if depthwise:
        sch = s_tir.Schedule(parse(_render_depthwise(plan, dtype, zp_x)))
        blk = sch.get_sblock("conv")
        n, y, x, c, r, s = sch.get_loops(blk)
        co, ci = sch.split(c, [None, DEPTHWISE_LANES])
        # Taps outside the lanes: the 8 accumulators of a pixel stay in one register pair
        # across all KH*KW taps, and each tap is one widening MAC over 8 channels.
        sch.reorder(co, r, s, ci)
        sch.vectorize(ci)
        init = sch.decompose_reduction(blk, r)
        sch.vectorize(sch.get_loops(init)[-1])
        return sch.mod, plan
    text, tile = _render_gemm(plan, dtype, zp_x, _tensorized_tile if tensorize else _vectorized_tile,
                              zp_w - _s8_shift(weight_dtype))
    sch = s_tir.Schedule(parse(text))
    blk = sch.get_sblock("conv")
    loops = sch.get_loops(blk)
    m, j, red = loops[5], loops[6], loops[7:]
    if tensorize:
        sch.vectorize(sch.get_loops(sch.get_sblock("zero"))[-1])
        sch.tensorize(m, register_int_conv(tile))
    else:
        # Same tiling with the reduction outside and the tile's MR x NR accumulators inside,
        # NR vectorized: what a good TIR schedule gets from LLVM without a hand-written kernel.
        sch.reorder(*red, m, j)
        sch.unroll(m)
        sch.vectorize(j)
        init = sch.decompose_reduction(blk, red[0])
        sch.vectorize(sch.get_loops(init)[-1])
    return sch.mod, plan


class Int8Conv2dOp:
    """A compiled quantized conv2d for one ARM target. op(data, weight) -> int32 NCHW output,
    run under qemu-user. `op.pack_weights(weight)` packs the weights once (a tuple: kernel_vec,
    plus the per-channel bias on the sdot path); `op.run_packed(data, packed)` then skips that.
    `op.asm` is the ARM assembly."""

    def __init__(self, g, isa: Isa, lib, plan: Int8Plan, dtype: str, weight_dtype: str, zp_x: int, zp_w: int):
        self.geometry, self.isa, self.lib, self.plan = g, isa, lib, plan
        self.dtype, self.weight_dtype, self.zp_x, self.zp_w = dtype, weight_dtype, zp_x, zp_w

    @property
    def asm(self) -> str:
        return self.lib.mod.inspect_source("asm")

    def build(self) -> "Int8Conv2dOp":  # dispatch.schedule's interface: already compiled
        return self

    @property
    def out_shape(self) -> tuple:
        return self.plan.out_shape

    def _check_legalized(self, name: str, arr: np.ndarray) -> None:
        # int16 inputs come from the legalize pass, already x - zp: the exactness bound (and the
        # meaning of the result) holds only while they stay within what 8-bit data can produce.
        if arr.dtype == np.int16 and arr.size and np.abs(arr.astype(np.int32)).max() > 255:
            raise ValueError(f"int16 {name} must lie in [-255, 255] (8-bit values minus a zero point), "
                             f"got magnitude {np.abs(arr.astype(np.int32)).max()}")

    def pack_weights(self, weight: np.ndarray) -> tuple:
        g = self.geometry
        check_array("weight", weight, (g.o, g.cg, g.kh, g.kw), self.weight_dtype)
        self._check_legalized("weight", weight)
        return pack_weights(self.plan, weight, self.zp_w, self.zp_x - _s8_shift(self.dtype))

    def run_packed(self, data: np.ndarray, packed: tuple) -> np.ndarray:
        plan = self.plan
        check_array("data", data, plan.data_shape, self.dtype)
        specs = [(plan.weight_shape, plan.packed_dtype)] + ([(plan.bias_shape, "int32")] if plan.dot else [])
        if not isinstance(packed, tuple) or len(packed) != len(specs):
            raise TypeError(f"packed must be the tuple of {len(specs)} array(s) that op.pack_weights returns")
        for i, (arr, (shape, dt)) in enumerate(zip(packed, specs)):
            check_array(f"packed[{i}]", arr, shape, dt)
        self._check_legalized("data", data)
        out = np.zeros(self.out_shape, np.int32)
        return qemu.run(self.lib, self.isa.arch, [data, *packed, out], [len(specs) + 1])[0]

    def __call__(self, data: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return self.run_packed(data, self.pack_weights(weight))


def schedule(g: Geometry, isa: Isa, quant: Quantization) -> Int8Conv2dOp:
    """The layer compiled for an ARM target (what conv2d returns there; compiling is cheap and
    the op is run under qemu)."""
    dtype, weight_dtype = quant.dtype, quant.weight_dtype
    for name, dt in (("dtype", dtype), ("weight_dtype", weight_dtype)):
        if dt not in ZERO_POINT_RANGE:
            raise ValueError(f"{name} {dt!r} is not supported on {isa.name} targets; "
                             f"use 'int8' or 'uint8' (or 'int16' for legalized, zero-point-free data)")
    if (dtype == "int16") != (weight_dtype == "int16"):
        raise ValueError(f"dtype {dtype!r} with weight_dtype {weight_dtype!r}: int16 is the legalized, "
                         "zero-point-free form, for data and weights together")
    zp_x = zero_point("input_zero_point", quant.input_zero_point, dtype)
    zp_w = zero_point("weight_zero_point", quant.weight_zero_point, weight_dtype)
    k = g.cg * g.kh * g.kw
    if k > MAX_K:
        raise ValueError(f"reduction length C/groups*KH*KW = {k} exceeds {MAX_K}, the longest sum of "
                         f"8-bit products (each up to {MAX_PRODUCT}) that int32 holds exactly")
    if conv_kernel(isa, dtype, is_depthwise(g)).op == "dot" and k > MAX_K_DOT:
        raise ValueError(f"reduction length C/groups*KH*KW = {k} exceeds {MAX_K_DOT}, the longest the "
                         f"sdot expansion (four terms, each up to 128*128*K) keeps exact in int32")
    sizes = Int8Plan(g, conv_kernel(isa, dtype, is_depthwise(g)), is_depthwise(g))
    check_elements(packed_input=sizes.packed_shape, packed_weight=sizes.weight_shape, accumulators=sizes.acc_shape)
    mod, plan = build(g, isa, dtype, zp_x, zp_w=zp_w, weight_dtype=weight_dtype)
    lib = tvm.compile(mod, target=isa.target)
    return Int8Conv2dOp(g, isa, lib, plan, dtype, weight_dtype, zp_x, zp_w)
