"""The layout of a grouped conv whose groups are not whole blocks (conv2d.py): each group's
channels padded with zeros to whole blocks, and the copies between it and the plain blocked
layout, scheduled here (parallel over blocks and rows, each run of 8 lanes one vector copy: left
to TVM's fusion and rest.py's rules, each lane was a gather, 9 ms of RegNetX-1.6GF's 59)."""

from __future__ import annotations

from tvm import s_tir, te, tirx

_HALF = 8  # lanes copied as one run when groups are whole runs of them (AVX2's vector)


def regroup(t, groups: int, per: int, blocks: int, block: int):
    """Plain blocked (N, ceil(C / b), H, W, b) -> each group of `per` channels in `blocks` blocks
    of `block` (b or another: the narrow tile's 8 from the graph's 16), zeros after its channels.
    Computed as runs of 8 lanes when a group is whole runs (RegNetX's 24), each run one contiguous
    load (the 6-d result is a view of the 5-d one)."""
    n, _, h, w, b = (int(d) for d in t.shape)
    zero = tirx.const(0.0, "float32")
    if per % _HALF or b % _HALF or block % _HALF:
        def at(n_, gb, h_, w_, i):
            r = gb % blocks * block + i  # the channel within its group
            c = gb // blocks * per + r
            return tirx.if_then_else(r < per, t[n_, c // b, h_, w_, c % b], zero)

        return te.compute((n, groups * blocks, h, w, block), at, name="regroup")

    def run(n_, gb, h_, w_, j, k):
        r = gb % blocks * block + j * _HALF  # the run's first channel within its group
        c = gb // blocks * per + r  # a multiple of 8: the run lies in one block
        return tirx.if_then_else(r < per, t[n_, c // b, h_, w_, c % b + k], zero)

    return te.compute((n, groups * blocks, h, w, block // _HALF, _HALF), run, name="regroup")


def ungroup(t, groups: int, per: int, blocks: int, channels: int, block: int):
    """regroup's inverse: (N, groups * blocks, H, W, b) -> plain blocked of `block`, zeros past
    `channels`."""
    n, _, h, w, b = (int(d) for d in t.shape)
    zero = tirx.const(0.0, "float32")
    out = -(-channels // block)
    if per % _HALF or b % _HALF or block % _HALF:
        def at(n_, cb, h_, w_, i):
            c = cb * block + i
            g, r = c // per, c % per
            return tirx.if_then_else(c < channels, t[n_, g * blocks + r // b, h_, w_, r % b], zero)

        return te.compute((n, out, h, w, block), at, name="ungroup")

    def run(n_, cb, h_, w_, j, k):
        c = cb * block + j * _HALF
        g, r = c // per, c % per  # r a multiple of 8: the run lies in one block of its group
        return tirx.if_then_else(c < channels, t[n_, g * blocks + r // b, h_, w_, r % b + k], zero)

    return te.compute((n, out, h, w, block // _HALF, _HALF), run, name="ungroup")


def copy_func(compute, shape, params) -> tuple[str, tirx.PrimFunc, list[int]]:
    """(name, scheduled PrimFunc, output shape) of compute(src of `shape`, *params); opaque to FuseOps, which
    would fuse the 6-d runs back into one gather with the reshape after them."""
    src = te.placeholder(shape, "float32", name="src")
    out = compute(src, *params)
    sch = s_tir.Schedule(te.create_prim_func([src, out]))
    loops = sch.get_loops(sch.get_sblock(out.op.name))
    sch.parallel(sch.fuse(*loops[:3]))
    sch.vectorize(loops[-1])
    name = f"mk_{compute.__name__}_{'x'.join(map(str, shape))}_{'_'.join(map(str, params))}"
    func = sch.mod["main"].with_attr("tir.is_scheduled", True).with_attr("global_symbol", name)
    return name, func.with_attr("op_pattern", 8), [int(d) for d in out.shape]  # 8: relax's kOpaque
