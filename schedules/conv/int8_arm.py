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

from ..common.targets import check_array
from ..common.tir import ceil_to, parse
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
    def packed_hw(self) -> tuple[int, int]:
        g, (oh, _) = self.g, self.g.out_hw
        (sh, sw), (dh, dw) = g.stride, g.dilation
        return (oh - 1) * sh + (g.kh - 1) * dh + 1, (self.ow_padded - 1) * sw + (g.kw - 1) * dw + 1

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


def _render_pack(plan: Int8Plan, dtype: str, zp: int) -> list[str]:
    """The pack stage: (N, G, Hp, Wp, Cp) for the GEMM path, (N, Hp, Wp, C) for depthwise."""
    g = plan.g
    hp, wp = plan.packed_hw
    top, left = g.pad[0], g.pad[1]
    cp = ceil_to(g.c, DEPTHWISE_LANES) if plan.depthwise else plan.cp
    conds = [f"{top} <= vy", f"vy < {top + g.h}", f"{left} <= vx", f"vx < {left + g.w}"]
    if cp != (g.c if plan.depthwise else g.cg):
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
    gi = "" if plan.depthwise else "vg, "
    loops = ("n, gg, y, x, c", f"{g.n}, {g.groups}, {hp}, {wp}, {cp}", "vn, vg, vy, vx, vc", "SSSSS") if not plan.depthwise \
        else ("n, y, x, c", f"{g.n}, {hp}, {wp}, {cp}", "vn, vy, vx, vc", "SSSS")
    return [
        f"    for {loops[0]} in T.grid({loops[1]}):",
        "        with T.sblock('pack'):",
        f"            {loops[2]} = T.axis.remap('{loops[3]}', [{loops[0]}])",
        f"            P[vn, {gi}vy, vx, vc] = T.if_then_else({' and '.join(conds)}, {value}, {zero})",
    ]


def _render_gemm(plan: Int8Plan, dtype: str, zp: int, for_tensorize: bool, zw8: int = 0) -> tuple[list[str], IntConvTile]:
    """zw8: for sdot, the weights' zero point shifted to int8 (used in the expansion)."""
    g, kern = plan.g, plan.kern
    mr, nr, cp = kern.mr, kern.nr, plan.cp
    oh, ow = g.out_hw
    (sh, sw), (dh, dw) = g.stride, g.dilation
    hp, wp = plan.packed_hw
    owp, ob = plan.ow_padded, plan.op // nr
    tile = IntConvTile(kern, g.kh, g.kw, cp, sw, dh, dw)
    axes = tile.reduce_axes()
    red = [a for a, _ in axes]
    v = {a: f"v{a}" for a in red} | {"m": "vm", "j": "vj"}
    pdt = plan.packed_dtype
    bias = f", Bias: T.Buffer({plan.bias_shape}, 'int32')" if plan.dot else ""
    row, col, ch = tile.a_index(v)
    x0 = "vx0" if for_tensorize else "0"
    acc = f"Acc[vn, vg, vob, vy, {x0} + vm, vj]"
    L = [
        "@T.prim_func(s_tir=True)",
        f"def main(D: T.Buffer(({g.n}, {g.c}, {g.h}, {g.w}), '{dtype}'),"
        f" Wv: T.Buffer({plan.weight_shape}, '{pdt}'){bias}, Out: T.Buffer(({g.n}, {g.o}, {oh}, {ow}), 'int32')):",
        "    T.func_attr({'tirx.noalias': True})",
        f"    P = T.alloc_buffer(({g.n}, {g.groups}, {hp}, {wp}, {cp}), '{pdt}')",
        f"    Acc = T.alloc_buffer(({g.n}, {g.groups}, {ob}, {oh}, {owp}, {nr}), 'int32')",
    ]
    if plan.dot:
        L.append(f"    WS = T.alloc_buffer(({g.n}, {g.groups}, {oh}, {ow}), 'int32')")
    L += _render_pack(plan, dtype, zp)
    L += [
        f"    for n, gg, o, y, tt in T.grid({g.n}, {g.groups}, {ob}, {oh}, {owp // mr}):",
    ]
    red_loops = f"for {', '.join(['m', 'j'] + red)} in T.grid({', '.join(str(e) for e in [mr, nr] + [e for _, e in axes])}):"
    head = ["vn, vg, vob, vy = T.axis.remap('SSSS', [n, gg, o, y])"]
    if for_tensorize:
        # The tile's first column is its own iterator, so the inner bindings after blockize are
        # exactly the description's m (not tt * MR + m). TIR's decompose_reduction refuses such a
        # binding, so the zeroing is a block of its own, ahead of the tile.
        head += [f"vx0 = T.axis.spatial({owp}, tt * {mr})", f"vm = T.axis.spatial({mr}, m)"]
        L += [f"        for m, j in T.grid({mr}, {nr}):", "            with T.sblock('zero'):"]
        L += [f"                {h}" for h in head] + ["                vj = T.axis.spatial(%d, j)" % nr, f"                {acc} = 0"]
    else:
        head += [f"vm = T.axis.spatial({owp}, tt * {mr} + m)"]
    L += [f"        {red_loops}", "            with T.sblock('conv'):"]
    L += [f"                {h}" for h in head] + [f"                vj = T.axis.spatial({nr}, j)"]
    L += [f"                v{a} = T.axis.reduce({e}, {a})" for a, e in axes]
    a_ref = f"P[vn, vg, vy * {sh} + {row}, {x0} * {sw} + {col}, {ch}]"
    w_ref = f"Wv[vg, vob, {', '.join(tile.b_index(v))}]"
    if not for_tensorize:
        L += ["                with T.init():", f"                    {acc} = 0"]
    L += [
        f"                {acc} = {acc} + T.Cast('int32', {a_ref}) * T.Cast('int32', {w_ref})",
    ]
    out = f"Acc[vn, vo // {g.og}, vo % {g.og} // {nr}, vy, vx, vo % {g.og} % {nr}]"
    if plan.dot:
        # sum x over each output pixel's window, for the -zw * sum x term of the expansion
        L += [
            f"    for n, gg, y, x, r, s, c in T.grid({g.n}, {g.groups}, {oh}, {ow}, {g.kh}, {g.kw}, {cp}):",
            "        with T.sblock('winsum'):",
            "            vn, vg, vy, vx, vr, vs, vc = T.axis.remap('SSSSRRR', [n, gg, y, x, r, s, c])",
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
    hp, wp = plan.packed_hw
    cp = ceil_to(g.c, DEPTHWISE_LANES)
    L = [
        "@T.prim_func(s_tir=True)",
        f"def main(D: T.Buffer(({g.n}, {g.c}, {g.h}, {g.w}), '{dtype}'),"
        f" Wv: T.Buffer({plan.weight_shape}, 'int16'), Out: T.Buffer(({g.n}, {g.o}, {oh}, {ow}), 'int32')):",
        "    T.func_attr({'tirx.noalias': True})",
        f"    P = T.alloc_buffer(({g.n}, {hp}, {wp}, {cp}), 'int16')",
        f"    Acc = T.alloc_buffer(({g.n}, {oh}, {ow}, {cp}), 'int32')",
    ]
    L += _render_pack(plan, dtype, zp)
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
    text, tile = _render_gemm(plan, dtype, zp_x, tensorize, zp_w - _s8_shift(weight_dtype))
    sch = s_tir.Schedule(parse(text))
    blk = sch.get_sblock("conv")
    m = sch.get_loops(blk)[5]
    if tensorize:
        sch.vectorize(sch.get_loops(sch.get_sblock("zero"))[-1])
        sch.tensorize(m, register_int_conv(tile))
    else:
        # Same tiling with the reduction outside and the tile's MR x NR accumulators inside,
        # NR vectorized: what a good TIR schedule gets from LLVM without a hand-written kernel.
        loops = sch.get_loops(blk)
        sch.reorder(*loops[7:], loops[5], loops[6])
        sch.unroll(loops[5])
        sch.vectorize(loops[6])
        init = sch.decompose_reduction(blk, loops[7])
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
        g = self.geometry
        return (g.n, g.o, *g.out_hw)

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
        g, plan = self.geometry, self.plan
        check_array("data", data, (g.n, g.c, g.h, g.w), self.dtype)
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
    mod, plan = build(g, isa, dtype, zp_x, zp_w=zp_w, weight_dtype=weight_dtype)
    lib = tvm.compile(mod, target=isa.target)
    return Int8Conv2dOp(g, isa, lib, plan, dtype, weight_dtype, zp_x, zp_w)
