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


ALIGN = 64  # bytes: what TVM's DLPack import demands, and its generated code assumes


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def aligned_empty(shape, dtype="float32") -> np.ndarray:
    """An uninitialized C-contiguous numpy array whose data is 64-byte aligned: ops read it
    and write it in place (numpy's own large arrays are usually only 16-byte aligned). The
    transforms below return such arrays, so their results go to an op without a copy."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def aligned(arr: np.ndarray) -> np.ndarray:
    """`arr` as a C-contiguous, 64-byte aligned array (itself if it already is one)."""
    if arr.flags.c_contiguous and arr.ctypes.data % ALIGN == 0:
        return arr
    out = aligned_empty(arr.shape, arr.dtype)
    out[...] = arr
    return out


def to_nchwc(x: np.ndarray, block: int, groups: int = 1) -> np.ndarray:
    """NCHW -> (N, groups*ceil(C/groups/block), H, W, block), each group zero-padded to blocks."""
    n, c, h, w = x.shape
    cg = c // groups
    cb = _ceil_div(cg, block)
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
    ob, ib = _ceil_div(og, out_block), _ceil_div(cg, in_block)
    full = np.zeros((groups, ob * out_block, ib * in_block, kh, kw), w.dtype)
    full[:, :og, :cg] = w.reshape(groups, og, cg, kh, kw)
    t = full.reshape(groups, ob, out_block, ib, in_block, kh, kw).transpose(0, 1, 3, 5, 6, 4, 2)
    return aligned(t.reshape(groups * ob, ib, kh, kw, in_block, out_block))


# Compiled twins of the transforms above, for ops called on NCHW arrays (Conv2dOp.__call__ and
# bind): numpy's strided copies cost more than some layers' convolution. Each is a TE definition
# whose outer axes are fused and parallel and whose innermost axis, the lanes of a block, is
# unrolled: scalar loads from 16 channel rows (each read in order) that LLVM's SLP vectorizer
# turns into shuffles and vector stores, or the reverse. Compiled for AVX2 whatever the op's ISA:
# measured on a Zen 5 host, 1 thread, that reached 53-57 GB/s both ways and 46 GB/s for the
# weight packing; the AVX-512 target reached 28-36 GB/s unrolled, and vectorizing the lanes
# (gathers) 55-60 GB/s into the blocked layout but 31-33 GB/s out of it.

def _compile(outs, ins, isa, name: str, parallel: int, split_last: int = 0):
    """parallel: how many outer axes to fuse into the parallel loop. split_last: split the last
    axis by this factor and move its inner part innermost (from_nchwc's channels -> lanes)."""
    import tvm
    from tvm import s_tir, te

    sch = s_tir.Schedule(te.create_prim_func([*ins, outs]))
    blk = sch.get_sblock(outs.op.name)
    loops = sch.get_loops(blk)
    if split_last:
        outer, lane = sch.split(loops[1], [None, split_last])
        sch.reorder(*([loops[0], outer] + list(loops[2:]) + [lane]))
        loops = sch.get_loops(blk)
    sch.parallel(sch.fuse(*loops[:parallel]))
    sch.unroll(loops[-1])
    if isa.arch == "x86":
        from microkernels import ISAS

        isa = ISAS["avx2"]
    lib = tvm.compile(tvm.IRModule({name: sch.mod["main"].with_attr("global_symbol", name)}), target=isa.target)
    return lib[name]  # the entry function (it keeps its module alive); calling it skips a lookup


def compile_to_nchwc(shape: tuple, block: int, groups: int, isa):
    """to_nchwc as a compiled function f(x NCHW, out (N, groups*CB, H, W, block)) on TVM tensors."""
    from tvm import te, tirx

    n, c, h, w = shape
    cg = c // groups
    cb = _ceil_div(cg, block)
    x = te.placeholder(shape, "float32", name="x")

    def elem(i, b, y, z, lane):
        ch = b % cb * block + lane
        return tirx.if_then_else(ch < cg, x[i, b // cb * cg + tirx.min(ch, cg - 1), y, z], tirx.const(0, "float32"))

    out = te.compute((n, groups * cb, h, w, block), elem, name="to_nchwc")
    return _compile(out, [x], isa, "to_nchwc", parallel=3)


def compile_from_nchwc(blocked_shape: tuple, channels: int, groups: int, isa):
    """from_nchwc as a compiled function f(y blocked, out NCHW) on TVM tensors."""
    from tvm import te

    n, blocks, h, w, block = blocked_shape
    og, per = channels // groups, blocks // groups
    y = te.placeholder(blocked_shape, "float32", name="y")
    out = te.compute((n, channels, h, w),
                     lambda i, ch, r, z: y[i, ch // og * per + ch % og // block, r, z, ch % og % block],
                     name="from_nchwc")
    return _compile(out, [y], isa, "from_nchwc", parallel=3, split_last=block)


def compile_pack_weights(shape: tuple, in_block: int, out_block: int, groups: int, isa):
    """pack_weights as a compiled function f(w OIHW, out (groups*OB, IB, KH, KW, in_block,
    out_block)) on TVM tensors."""
    from tvm import te, tirx

    o, cg, kh, kw = shape
    og = o // groups
    ob, ib = _ceil_div(og, out_block), _ceil_div(cg, in_block)
    w = te.placeholder(shape, "float32", name="w")

    def elem(b, q, r, s, i, j):
        oc, ic = b % ob * out_block + j, q * in_block + i
        ok = tirx.all(oc < og, ic < cg)
        return tirx.if_then_else(ok, w[b // ob * og + tirx.min(oc, og - 1), tirx.min(ic, cg - 1), r, s],
                                 tirx.const(0, "float32"))

    out = te.compute((groups * ob, ib, kh, kw, in_block, out_block), elem, name="pack_weights")
    return _compile(out, [w], isa, "pack_weights", parallel=2)
