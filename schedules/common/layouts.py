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

import math

import numpy as np

from .tir import ceil_div, header, parse

ALIGN = 64  # bytes: what TVM's DLPack import demands, and its generated code assumes



def aligned_empty(shape, dtype="float32") -> np.ndarray:
    """An uninitialized C-contiguous numpy array whose data is 64-byte aligned: ops read it
    and write it in place (numpy's own large arrays are usually only 16-byte aligned). The
    transforms below return such arrays, so their results go to an op without a copy."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    # Ops allocate their output with this on every call: without np.prod and slicing it takes
    # 2 us instead of 4.6 (on the Zen 5 host).
    return np.ndarray(shape, dtype, buffer=raw, offset=-raw.ctypes.data % ALIGN)


def is_aligned(arr: np.ndarray) -> bool:
    return arr.__array_interface__["data"][0] % ALIGN == 0


def aligned(arr: np.ndarray) -> np.ndarray:
    """`arr` as a C-contiguous, 64-byte aligned array (itself if it already is one)."""
    if arr.flags.c_contiguous and is_aligned(arr):
        return arr
    out = aligned_empty(arr.shape, arr.dtype)
    out[...] = arr
    return out


def to_nchwc(x: np.ndarray, block: int, groups: int = 1) -> np.ndarray:
    """NCHW -> (N, groups*ceil(C/groups/block), H, W, block), each group zero-padded to blocks."""
    n, c, h, w = x.shape
    cg = c // groups
    cb = ceil_div(cg, block)
    out = np.zeros((n, groups, cb * block, h, w), x.dtype)
    out[:, :, :cg] = x.reshape(n, groups, cg, h, w)
    out = out.reshape(n, groups * cb, block, h, w).transpose(0, 1, 3, 4, 2)
    return aligned(out)


def from_nchwc(y: np.ndarray, channels: int, groups: int = 1) -> np.ndarray:
    """(N, groups*CB, H, W, block) -> NCHW with `channels` real channels (padding dropped)."""
    n, blocks, h, w, block = y.shape
    cg = channels // groups
    t = y.transpose(0, 1, 4, 2, 3).reshape(n, groups, (blocks // groups) * block, h, w)
    return aligned(t[:, :, :cg].reshape(n, channels, h, w))


def pack_weights(w: np.ndarray, in_block: int, out_block: int, groups: int = 1) -> np.ndarray:
    """OIHW (O, C/groups, KH, KW) -> (groups*OB, IB, KH, KW, in_block, out_block), zero-padded."""
    o, cg, kh, kw = w.shape
    og = o // groups
    ob, ib = ceil_div(og, out_block), ceil_div(cg, in_block)
    full = np.zeros((groups, ob * out_block, ib * in_block, kh, kw), w.dtype)
    full[:, :og, :cg] = w.reshape(groups, og, cg, kh, kw)
    t = full.reshape(groups, ob, out_block, ib, in_block, kh, kw).transpose(0, 1, 3, 5, 6, 4, 2)
    return aligned(t.reshape(groups * ob, ib, kh, kw, in_block, out_block))


def pack_depthwise_weights(w: np.ndarray, block: int) -> np.ndarray:
    """OIHW (O, 1, KH, KW) -> (OB, KH, KW, block): the channels in the lanes, zero-padded.
    With G > 1 input channels per group, (O, G, KH, KW) -> (OB, KH, KW, G, block): for each tap,
    the G vectors of weight j of every output channel."""
    o, cg, kh, kw = w.shape
    ob = ceil_div(o, block)
    full = np.zeros((ob * block, cg, kh, kw), w.dtype)
    full[:o] = w
    packed = full.reshape(ob, block, cg, kh, kw).transpose(0, 3, 4, 2, 1)
    return aligned(packed[:, :, :, 0] if cg == 1 else packed)


def pack_channels(v: np.ndarray, block: int) -> np.ndarray:
    """(C,) -> (CB, block), zero-padded: a per-channel vector (a bias) in blocks of lanes."""
    full = np.zeros(ceil_div(v.shape[0], block) * block, v.dtype)
    full[:v.shape[0]] = v
    return aligned(full.reshape(-1, block))


# Compiled twins of the transforms above, for ops called on NCHW arrays (Conv2dOp.__call__ and
# bind): numpy's strided copies cost more than some layers' convolution. Each is TIR whose outer
# axes are fused and parallel and whose innermost axis, the lanes of a block, is unrolled:
# scalar loads from 16 channel rows (each read in order) that LLVM's SLP vectorizer turns into
# shuffles and vector stores, or the reverse. Compiled for AVX2 whatever the op's ISA: measured
# on a Zen 5 host, 1 thread, that reached 53-57 GB/s both ways and 46 GB/s for the weight
# packing; the AVX-512 target reached 28-36 GB/s unrolled, and vectorizing the lanes (gathers)
# 55-60 GB/s into the blocked layout but 31-33 GB/s out of it.
# Where the channels per group fill whole 16-channel blocks (no padding lanes to write), data
# goes both ways through microkernels.f32_transpose instead: L x L tiles transposed in registers,
# 89-121 GB/s on AVX-512 and 70-113 on AVX2 against the TIR's 46-52 into blocks and 28-54 out of
# them, one thread, warm (176-205, 129-206 and 53-101 at two), from 64x112x112 to 2048x7x7.
# A 1x1 layer's weights (O and C in whole blocks) are such tiles too: 26-27 GB/s in TIR against
# 91 through the transpose on 2048x1024 and 512x2048, one thread (52-53 against 187-194 at two).
# The user's side of each (NCHW data, OIHW weights, NCHW output) is declared 4-byte aligned, so
# TVM's code assumes no more and a numpy array goes in as it is (`user_operand`), however
# numpy aligned it; the blocked side is TVM's own 64-byte aligned memory.

def _compile(text: list[str], name: str, isa, parallel: int, split: int = 0):
    """Parse, schedule and compile one transform; return its entry function. parallel: how many
    outer loops to fuse into the parallel loop. split: split loop 1 by this factor and move its
    inner part innermost (from_nchwc's channels -> lanes)."""
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(parse(text))
    blk = sch.get_sblock(name)
    loops = sch.get_loops(blk)
    if split:
        outer, lane = sch.split(loops[1], [None, split])
        sch.reorder(*([loops[0], outer] + list(loops[2:]) + [lane]))
        loops = sch.get_loops(blk)
    sch.parallel(sch.fuse(*loops[:parallel]))
    sch.unroll(loops[-1])
    if isa.arch == "x86":
        from microkernels import ISAS

        isa = ISAS["avx2"]
    lib = tvm.compile(tvm.IRModule({name: sch.mod["main"].with_attr("global_symbol", name)}), target=isa.target)
    return lib[name]  # the entry function (it keeps its module alive); calling it skips a lookup


def _func(params: str, loops: list[tuple[str, int]], name: str, store: str) -> list[str]:
    names = [v for v, _ in loops]
    return header([params]) + [
        f"    for {', '.join(names)} in T.grid({', '.join(str(e) for _, e in loops)}):",
        f"        with T.sblock('{name}'):",
        f"            {', '.join('v' + v for v in names)} = T.axis.remap('{'S' * len(names)}', [{', '.join(names)}])",
        f"            {store}",
    ]


def compile_to_nchwc(shape: tuple, block: int, groups: int, isa, step: tuple[int, int] = (1, 1)):
    """to_nchwc as a compiled function f(x NCHW, out (N, groups*CB, H, W, block)) on TVM tensors.
    step (sh, sw): convert only rows and columns that are multiples of it, the pixels a 1x1
    strided convolution without padding reads; the others of `out` are left as they were."""
    n, c, h, w = shape
    if _transposes(isa, block, c // groups) and tuple(step) == (1, 1):
        return _compiled(transpose_module(shape, isa, into_blocks=True), isa)
    cg = c // groups
    cb = ceil_div(cg, block)
    sh, sw = step
    ch = f"vb % {cb} * {block} + vl"
    params = (f"x: T.Buffer({shape}, 'float32', align=4), "
              f"out: T.Buffer({(n, groups * cb, h, w, block)}, 'float32')")
    loops = [("i", n), ("b", groups * cb), ("y", ceil_div(h, sh)), ("z", ceil_div(w, sw)), ("l", block)]
    store = (f"out[vi, vb, vy * {sh}, vz * {sw}, vl] = T.if_then_else({ch} < {cg}, "
             f"x[vi, vb // {cb} * {cg} + T.min({ch}, {cg - 1}), vy * {sh}, vz * {sw}], T.float32(0))")
    return _compile(_func(params, loops, "to_nchwc", store), "to_nchwc", isa, parallel=3)


def compile_from_nchwc(blocked_shape: tuple, channels: int, groups: int, isa):
    """from_nchwc as a compiled function f(y blocked, out NCHW) on TVM tensors."""
    n, blocks, h, w, block = blocked_shape
    if _transposes(isa, block, channels // groups) and blocks * block == channels:
        return _compiled(transpose_module((n, channels, h, w), isa, into_blocks=False), isa)
    og, per = channels // groups, blocks // groups
    params = (f"y: T.Buffer({blocked_shape}, 'float32'), "
              f"out: T.Buffer({(n, channels, h, w)}, 'float32', align=4)")
    loops = [("i", n), ("c", channels), ("r", h), ("z", w)]
    store = f"out[vi, vc, vr, vz] = y[vi, vc // {og} * {per} + vc % {og} // {block}, vr, vz, vc % {og} % {block}]"
    return _compile(_func(params, loops, "from_nchwc", store), "from_nchwc", isa, parallel=3, split=block)


def _transposes(isa, block: int, channels_per_group: int) -> bool:
    """Whether the transpose kernel converts this layout: 16-channel blocks that never straddle
    a group (no padding lanes to fill), on x86."""
    return isa.arch == "x86" and block == 16 and channels_per_group % 16 == 0


def _compiled(mod, isa):
    import tvm

    return tvm.compile(mod, target=isa.target)["main"]


def transpose_module(shape: tuple, isa, into_blocks: bool):
    """NCHW <-> NCHW16c with microkernels.f32_transpose, as an IRModule whose main(src, dst)
    converts an NCHW `shape` into blocks (into_blocks) or back: for each 16-channel block, the
    pixels in tiles of L (the ISA's lanes; two tiles of 8 channels each on AVX2), the last
    P % L pixels of each block plainly. Channels a multiple of 16 (_transposes)."""
    from microkernels.f32_transpose import TransposeKernel

    n, c, h, w = shape
    kern = TransposeKernel(isa)
    lanes, pixels, blocks = kern.lanes, h * w, n * c // 16
    nchw = f"T.Buffer({shape}, 'float32', align=4)"
    blocked = f"T.Buffer({(n, c // 16, h, w, 16)}, 'float32')"
    # Element offsets of block b's lane group k in each layout, and each side's (row, step).
    flat = f"(b * 16 + k * {lanes}) * {pixels}"
    packed = f"b * {pixels * 16} + k * {lanes}"
    if into_blocks:
        params = f"x: {nchw}, y: {blocked}"
        src, dst = f"x.access_ptr('r', offset={flat}), {pixels}, {lanes}", f"y.access_ptr('w', offset={packed}), 16, {16 * lanes}"
        tail = "y[vb // {cb}, vb % {cb}, vp // {w}, vp % {w}, vl] = x[vb // {cb}, vb % {cb} * 16 + vl, vp // {w}, vp % {w}]"
    else:
        params = f"y: {blocked}, x: {nchw}"
        src, dst = f"y.access_ptr('r', offset={packed}), 16, {16 * lanes}", f"x.access_ptr('w', offset={flat}), {pixels}, {lanes}"
        tail = "x[vb // {cb}, vb % {cb} * 16 + vl, vp // {w}, vp % {w}] = y[vb // {cb}, vb % {cb}, vp // {w}, vp % {w}, vl]"
    full = pixels - pixels % lanes
    lines = _transpose_calls(kern, params, blocks, [("k", 16 // lanes)], f"{src}, {dst}, {pixels // lanes}")
    if full < pixels:
        lines += [
            f"        for p, l in T.grid({pixels - full}, 16):",
            "            with T.sblock('tail'):",
            "                vb = T.axis.spatial(%d, b)" % blocks,
            f"                vp = T.axis.spatial({pixels}, {full} + p)",
            "                vl = T.axis.spatial(16, l)",
            "                " + tail.format(cb=c // 16, w=w),
        ]
    return _transpose_module(kern, lines)


def transpose_weights_module(shape: tuple, isa):
    """pack_weights of a 1x1 layer, (O, C, 1, 1) -> (O/16, C/16, 1, 1, 16, 16), O and C multiples
    of 16, groups 1, with microkernels.f32_transpose: each 16 x 16 block of the (O, C) matrix is
    transposed (a row of output channels' weights becomes a column), so the packing reads the
    weights once at the transpose's rate instead of the TIR's (the large 1x1 layers' 4-8 MB of
    weights dominated op(x, w) on two threads). main(w, out)."""
    from microkernels.f32_transpose import TransposeKernel

    o, c = shape[:2]
    kern = TransposeKernel(isa)
    lanes, ib = kern.lanes, c // 16
    halves = 16 // lanes  # AVX2: each 16 x 16 block as four 8 x 8 quadrants
    params = f"w: T.Buffer({shape}, 'float32', align=4), out: T.Buffer({(o // 16, ib, 1, 1, 16, 16)}, 'float32')"
    args = (f"w.access_ptr('r', offset=(b * 16 + i * {lanes}) * {c} + j * {lanes}), {c}, 16, "
            f"out.access_ptr('w', offset=b * {ib * 256} + j * {lanes * 16} + i * {lanes}), 16, 256, {ib}")
    return _transpose_module(kern, _transpose_calls(kern, params, o // 16, [("i", halves), ("j", halves)], args))


def _transpose_calls(kern, params: str, blocks: int, loops: list[tuple[str, int]], args: str) -> list[str]:
    """The entry function of a transpose module: for each of `blocks` blocks in parallel, a call
    of the kernel with `args` per iteration of `loops` ((var, extent), the lane groups), which
    name the block `b`."""
    names, extents = ", ".join(v for v, _ in loops), ", ".join(str(e) for _, e in loops)
    return header([params]) + [
        f"    for b in T.parallel({blocks}):",
        "        with T.attr(0, 'pragma_import_llvm', IR):",
        f"            for {names} in T.grid({extents}):",
        f"                T.evaluate(T.call_extern('void', '{kern.name}', {args}))",
    ]


def _transpose_module(kern, lines: list[str]):
    import tvm

    return tvm.IRModule({"main": parse(lines, IR=kern.llvm_ir())})


def compile_pack_weights(shape: tuple, in_block: int, out_block: int, groups: int, isa):
    """pack_weights as a compiled function f(w OIHW, out (groups*OB, IB, KH, KW, in_block,
    out_block)) on TVM tensors."""
    o, cg, kh, kw = shape
    if _transposes(isa, in_block, cg) and (groups, kh, kw, out_block) == (1, 1, 1, 16) and o % 16 == 0:
        return _compiled(transpose_weights_module(shape, isa), isa)
    og = o // groups
    ob, ib = ceil_div(og, out_block), ceil_div(cg, in_block)
    packed = (groups * ob, ib, kh, kw, in_block, out_block)
    params = f"w: T.Buffer({shape}, 'float32', align=4), out: T.Buffer({packed}, 'float32')"
    loops = [("b", packed[0]), ("q", ib), ("r", kh), ("s", kw), ("i", in_block), ("j", out_block)]
    oc, ic = f"vb % {ob} * {out_block} + vj", f"vq * {in_block} + vi"
    store = (f"out[vb, vq, vr, vs, vi, vj] = T.if_then_else({oc} < {og} and {ic} < {cg}, "
             f"w[vb // {ob} * {og} + T.min({oc}, {og - 1}), T.min({ic}, {cg - 1}), vr, vs], T.float32(0))")
    return _compile(_func(params, loops, "pack_weights", store), "pack_weights", isa, parallel=2)
