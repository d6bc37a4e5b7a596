"""The GEMM path: tiles of MR pixels x NR output channels, each tile's whole reduction on the
kernel (tensorized onto the intrinsic of its IntConvTile), over parallel tasks of (image, group,
output block, row) on x86; the window sums of the expansion where the weights' zero point is
not 0; and the output, through an unpack of the int32 accumulators or, channels-last on x86,
straight from each tile (tile_store)."""

from __future__ import annotations

import dataclasses

from tvm import s_tir

from microkernels.int_gemm import IntGemmKernel

from intrinsics.beta0 import drop_dead_inits
from intrinsics.int_conv import IntConvTile, register_int_conv, thread_setup

from ...common.tir import parse
from . import forms
from .entry import entry
from .forms import WINOGRAD, winograd
from .output import bounds, output
from .stages import parallel_stages


def _task(plan) -> str:
    """The parallel task (image, group, output block, row) as loop text: f, or with tile-local
    accumulators the chunk c's fc-th task."""
    return f"(c * {plan.tasks // plan.chunks} + fc)" if plan.tile_local else "f"


def task_parts(plan) -> dict[str, str]:
    """The parallel task's image, group, output block and row (or row of tiles) as loop text.
    Consecutive tasks, which a thread runs in turn, walk the output blocks of a row where the
    weights are the smaller operand (Int8Plan.rows_outer: each thread then reads only its own
    rows of the input, which the layer before wrote on the same thread), else a block's rows."""
    g, f = plan.g, _task(plan)
    size = {"y": plan.task_rows, "ob": plan.op // plan.kern.nr}
    inner, outer = ("ob", "y") if plan.rows_outer else ("y", "ob")
    per_group = size["y"] * size["ob"]
    return {"n": f"{f} // {g.groups * per_group}", "g": f"{f} // {per_group} % {g.groups}",
            outer: f"{f} // {size[inner]} % {size[outer]}", inner: f"{f} % {size[inner]}"}


def _tile_iters(plan, columns: list[str]) -> list[str]:
    """A tile block's spatial iterators; `columns` bind its output columns (vm, and vx0). With
    `parallel` (x86) the rows of every image, group and output block are one parallel loop, f."""
    if plan.parallel:
        g, oh = plan.g, plan.task_rows
        ob = plan.op // plan.kern.nr
        t = task_parts(plan)
        rows = [f"vn = T.axis.spatial({g.n}, {t['n']})", f"vg = T.axis.spatial({g.groups}, {t['g']})",
                f"vob = T.axis.spatial({ob}, {t['ob']})", f"vy = T.axis.spatial({oh}, {t['y']})"]
        if plan.tile_local:
            rows.append(f"vc = T.axis.spatial({plan.chunks}, c)")
    else:
        rows = ["vn, vg, vob, vy = T.axis.remap('SSSS', [n, g, o, y])"]
    return [*rows, *columns, f"vj = T.axis.spatial({plan.kern.nr}, j)"]


def _acc(plan, x0: str) -> str:
    if plan.tile_local:
        return "Acc[vc, vm, vj]"
    return f"Acc[vn, vg, vob, vy, {x0} + vm, vj]"


def _conv_block(plan, tile: IntConvTile, columns: list[str], x0: str, init: list[str]) -> list[str]:
    """The tile's whole reduction, block 'conv', inside the loop over tiles (tt); `x0` is the
    tile's first column as the block sees it, `init` what the block zeroes Acc with."""
    sh, sw = plan.g.stride
    axes = tile.reduce_axes()
    v = {a: f"v{a}" for a, _ in axes} | {"m": "vm", "j": "vj"}
    if plan.pitch:  # task row vy is the vy-th tile of the flat run
        pixel, ch = tile.a_index(v)
        a = f"P[vn, vg, vy * {plan.kern.mr} + {pixel}, {ch}]"
    else:
        row, col, ch = tile.a_index(v)
        a = f"P[vn, vg, vy * {sh} + {row}, {x0} * {sw} + {col}, {ch}]"
    loops = ["m", "j"] + [a for a, _ in axes]
    extents = [plan.kern.mr, plan.kern.nr] + [e for _, e in axes]
    body = [*_tile_iters(plan, columns), *(f"v{a} = T.axis.reduce({e}, {a})" for a, e in axes), *init,
            f"{_acc(plan, x0)} = {_acc(plan, x0)} + T.Cast('int32', {a})"
            f" * T.Cast('int32', Wv[vg, vob, {', '.join(tile.b_index(v))}])"]
    return [f"        for {', '.join(loops)} in T.grid({', '.join(map(str, extents))}):",
            "            with T.sblock('conv'):", *(f"                {line}" for line in body)]


def tensorized_tile(plan, tile: IntConvTile) -> list[str]:
    """The tile as the intrinsic matches it. Its first column is an iterator of its own, so the
    inner bindings after blockize are exactly the description's m (not tt * MR + m). TIR's
    decompose_reduction refuses such a binding, so the zeroing is a block of its own, ahead."""
    mr, nr = plan.kern.mr, plan.kern.nr
    columns = [f"vx0 = T.axis.spatial({plan.ow_padded}, tt * {mr})", f"vm = T.axis.spatial({mr}, m)"]
    if not plan.kern.accumulate:
        # A beta=0 kernel (one call per tile, overwriting it): the init only marks the block a
        # reduction for TIR; `build` drops it after tensorizing (intrinsics.beta0).
        return _conv_block(plan, tile, columns, "vx0", ["with T.init():", f"    {_acc(plan, 'vx0')} = 0"])
    return [f"        for m, j in T.grid({mr}, {nr}):", "            with T.sblock('zero'):",
            *(f"                {line}" for line in _tile_iters(plan, columns)), f"                {_acc(plan, 'vx0')} = 0",
            *_conv_block(plan, tile, columns, "vx0", [])]


def vectorized_tile(plan, tile: IntConvTile) -> list[str]:
    """The same tile as one reduction block with its init, which `build` reorders and vectorizes:
    TIR vectorizes a reduction only in a block that has its init."""
    columns = [f"vm = T.axis.spatial({plan.ow_padded}, tt * {plan.kern.mr} + m)"]
    return _conv_block(plan, tile, columns, "0", ["with T.init():", f"    {_acc(plan, '0')} = 0"])


def render(plan, dtype: str, zp: int, tile_blocks, zw8: int = 0) -> tuple[list[str], IntConvTile]:
    """The GEMM path, with `tile_blocks(plan, tile)` (`tensorized_tile` or `vectorized_tile`)
    for the blocks of one tile of MR pixels x NR output channels.
    zw8: for sdot, the weights' zero point shifted to int8 (used in the expansion)."""
    g, kern = plan.g, plan.kern
    mr, nr, cp = kern.mr, kern.nr, plan.cp
    oh, ow = g.out_hw
    (sh, sw), (dh, dw) = g.stride, g.dilation
    owp, ob = plan.ow_padded, plan.op // nr
    tile = IntConvTile(kern, g.kh, g.kw, cp, sw, dh, dw, plan.pitch)
    L = entry(plan, dtype)
    if plan.dot and plan.windows:
        L.append(f"    WS = T.alloc_buffer(({g.n}, {g.groups}, {oh}, {ow}), 'int32')")
    if not plan.in_place(dtype):
        L += forms.pack(plan, dtype, zp)
    if plan.fused_store and tile_blocks is tensorized_tile:
        # One call per tile of the kernel's requantizing batch-reduce variant, straight into Out.
        L += [f"    for c in T.parallel({plan.chunks}):",
              f"      for fc, tt in T.grid({plan.tasks // plan.chunks}, {owp // mr}):"]
        return L + fused_tile(plan, tile), tile
    if plan.tile_local:
        # The tasks below, in chunks: a chunk's tasks run one after another on one thread, so
        # they can share its tile of accumulators (a tile per task would be no smaller than the
        # output). TIR allocates no buffer inside a parallel loop, hence the chunk index.
        if tile_blocks is not tensorized_tile:
            raise ValueError("tile-local accumulators need the tensorized tile (x86 builds always tensorize)")
        before, after, _ = thread_setup(kern, " " * 6)
        L += [f"    for c in T.parallel({plan.chunks}):", *before,
              f"      for fc, tt in T.grid({plan.tasks // plan.chunks}, {owp // mr}):"]
        return L + tile_blocks(plan, tile) + tile_store(plan) + after, tile
    if plan.parallel:
        # Tiles of one (image, group, output block, row) share nothing with another's: a task
        # each. Rendered here, as TIR's parallel() refuses a loop over the tensorized blocks.
        before, after, _ = thread_setup(kern, " " * 6)
        L += [f"    for f in T.parallel({plan.tasks}):", *before, f"      for tt in T.serial({owp // mr}):"]
        L += tile_blocks(plan, tile) + after
    else:
        L.append(f"    for n, g, o, y, tt in T.grid({g.n}, {g.groups}, {ob}, {oh}, {owp // mr}):")
        L += tile_blocks(plan, tile)
    if plan.form == WINOGRAD:
        return L + winograd.unpack(plan), tile
    out = f"Acc[vn, vo // {g.og}, vo % {g.og} // {nr}, vy, vx, vo % {g.og} % {nr}]"
    if plan.dot and plan.windows:
        # sum x over each output pixel's window, for the -zw * sum x term of the expansion
        L += [
            f"    for n, g, y, x, r, s, c in T.grid({g.n}, {g.groups}, {oh}, {ow}, {g.kh}, {g.kw}, {cp}):",
            "        with T.sblock('winsum'):",
            "            vn, vg, vy, vx, vr, vs, vc = T.axis.remap('SSSSRRR', [n, g, y, x, r, s, c])",
            "            with T.init():",
            "                WS[vn, vg, vy, vx] = 0",
            f"            WS[vn, vg, vy, vx] = WS[vn, vg, vy, vx] + T.Cast('int32', P[vn, vg, vy * {sh} + vr * {dh}, vx * {sw} + vs * {dw}, vc])",
        ]
        out += f" - T.int32({zw8}) * WS[vn, vo // {g.og}, vy, vx]"
    if plan.nhwc:
        L += [
            f"    for n, y, x, o in T.grid({g.n}, {oh}, {ow}, {g.o}):",
            "        with T.sblock('unpack'):",
            "            vn, vy, vx, vo = T.axis.remap('SSSS', [n, y, x, o])",
            f"            Out[vn, vy, vx, vo] = {output(plan, out, 'vo', 'vn, vy, vx, vo')}",
        ]
        return L, tile
    L += [
        f"    for n, o, y, x in T.grid({g.n}, {g.o}, {oh}, {ow}):",
        "        with T.sblock('unpack'):",
        "            vn, vo, vy, vx = T.axis.remap('SSSS', [n, o, y, x])",
        f"            Out[vn, vo, vy, vx] = {output(plan, out, 'vo', 'vn, vo, vy, vx')}",
    ]
    return L, tile


def fused_kernel(plan) -> IntGemmKernel:
    """The kernel of a fused-store layer (Int8Plan.fused_store): the plan's tile as a batch-reduce
    call over the kernel rows (and, dilated, the taps of a row) that stores requantized."""
    return dataclasses.replace(plan.kern, batch_reduce=True, requant=plan.output_dtype)


def fused_tile(plan, tile: IntConvTile) -> list[str]:
    """The block 'qtile': one call of `fused_kernel` per tile of MR pixels x NR channels, its A
    at the window's first packed pixel, B at the output block's weights, C at the tile's first
    output, the bias and multipliers of its NR channels; the batch walks the kernel rows (n1, a
    dilated row apart) and, with dilation along the width, a row's taps (n2), in the weights'
    packed order (KH, KW, C/G, NR, G), as the conv tile's implementation does."""
    g, kern = plan.g, fused_kernel(plan)
    mr, nr, cp = kern.mr, kern.nr, plan.cp
    (sh, sw), (dh, dw) = g.stride, g.dilation
    _, _, hp, wp, _ = plan.packed_shape
    t = task_parts(plan)
    o0 = f"vg * {g.og} + vob * {nr}"
    n2, sa2 = (1, 0) if dw == 1 else (g.kw, dw * cp)
    lo, hi = bounds(plan)
    rows, cols = (g.kh - 1) * dh + 1, (mr - 1) * sw + (g.kw - 1) * dw + 1
    w_rest = ", ".join(f"0:{e}" for e in plan.weight_shape[2:])
    body = [
        f"vn = T.axis.spatial({g.n}, {t['n']})", f"vg = T.axis.spatial({g.groups}, {t['g']})",
        f"vob = T.axis.spatial({plan.op // nr}, {t['ob']})", f"vy = T.axis.spatial({plan.task_rows}, {t['y']})",
        f"vx0 = T.axis.spatial({plan.ow_padded}, tt * {mr})",
        f"T.reads(P[vn, vg, vy * {sh}:vy * {sh} + {rows}, vx0 * {sw}:vx0 * {sw} + {cols}, 0:{cp}], "
        f"Wv[vg, vob, {w_rest}], Bias[vg, vob * {nr}:vob * {nr} + {nr}], M[{o0}:{o0} + {nr}])",
        f"T.writes(Out[vn, vy, vx0:vx0 + {mr}, {o0}:{o0} + {nr}])",
        "with T.attr(0, 'pragma_import_llvm', fused_ir):",
        f"    T.evaluate(T.call_extern('void', '{kern.name}', T.address_of(P[vn, vg, vy * {sh}, vx0 * {sw}, 0]), "
        f"{sw * cp}, T.address_of(Wv[vg, vob, {', '.join('0' for _ in plan.weight_shape[2:])}]), {tile.group * nr}, "
        f"T.address_of(Out[vn, vy, vx0, {o0}]), {g.o}, {tile.k_run}, {g.kh}, {dh * wp * cp}, {n2}, {sa2}, 1, 0, "
        f"T.address_of(Bias[vg, vob * {nr}]), T.address_of(M[{o0}]), {plan.zp_out}, {lo}, {hi}))",
    ]
    return ["        with T.sblock('qtile'):", *(f"            {line}" for line in body)]


def tile_store(plan) -> list[str]:
    """Channels-last output (x86): each tile's MR x NR accumulators leave right after its
    reduction, while they are in L1, requantized along the NR channels (contiguous on both
    sides) into the output; no separate unpack pass over the accumulators. The tile's columns
    past the row's end, and channels past the group's, are not stored."""
    g, mr, nr = plan.g, plan.kern.mr, plan.kern.nr
    oh, ow = g.out_hw
    cond, y, x = [], "vy", "vx0 + vm"
    if plan.pitch:
        # Position p of the flat run is output pixel (p // pitch, p % pitch) where that column
        # is one of the row's OW; the rest are the padding columns and the last tile's overhang.
        p = f"({task_parts(plan)['y']}) * {mr} + m"
        cond += [f"({p}) % {plan.pitch} < {ow}", f"{p} < {oh * plan.pitch}"]
        y, x = f"(vy * {mr} + vm) // {plan.pitch}", f"(vy * {mr} + vm) % {plan.pitch}"
    elif plan.ow_padded != ow:
        cond.append(f"tt * {mr} + m < {ow}")
    if plan.op != g.og:
        cond.append(f"({task_parts(plan)['ob']}) * {nr} + j < {g.og}")
    columns = [f"vx0 = T.axis.spatial({plan.ow_padded}, tt * {mr})", f"vm = T.axis.spatial({mr}, m)"]
    o = f"vg * {g.og} + vob * {nr} + vj"
    body = [*_tile_iters(plan, columns), *([f"T.where({' and '.join(cond)})"] if cond else []),
            f"Out[vn, {y}, {x}, {o}] = {output(plan, _acc(plan, 'vx0'), o, f'vn, {y}, {x}, {o}')}"]
    return [f"        for m, j in T.grid({mr}, {nr}):", "            with T.sblock('store'):",
            *(f"                {line}" for line in body)]


def schedule(plan, dtype: str, zp_x: int, tensorize: bool = True, zw8: int = 0):
    """The layer's scheduled IRModule: the tile tensorized onto its intrinsic, or with
    tensorize=False the same tiling with the reduction outside and the tile's MR x NR
    accumulators inside, NR vectorized (what a good TIR schedule gets from LLVM without a
    hand-written kernel: `bench arm`'s baseline); on x86 every stage on all threads."""
    text, tile = render(plan, dtype, zp_x, tensorized_tile if tensorize else vectorized_tile, zw8)
    if tensorize and plan.fused_store:
        sch = s_tir.Schedule(parse(text, fused_ir=fused_kernel(plan).llvm_ir()))
        if plan.parallel:
            parallel_stages(sch, plan)
        return sch.mod
    sch = s_tir.Schedule(parse(text, **thread_setup(plan.kern, "")[2]))
    blk = sch.get_sblock("conv")
    loops = sch.get_loops(blk)
    outer = len(loops) - 2 - len(tile.reduce_axes())  # the tile's m, j, then its reduction
    m, j, red = loops[outer], loops[outer + 1], loops[outer + 2:]
    if tensorize:
        if plan.kern.accumulate:
            sch.vectorize(sch.get_loops(sch.get_sblock("zero"))[-1])
        sch.tensorize(m, register_int_conv(tile))
    else:
        sch.reorder(*red, m, j)
        sch.unroll(m)
        sch.vectorize(j)
        init = sch.decompose_reduction(blk, red[0])
        sch.vectorize(sch.get_loops(init)[-1])
    if plan.parallel:
        parallel_stages(sch, plan)
    if tensorize and not plan.kern.accumulate:
        return drop_dead_inits(sch.mod, ["conv_o"])
    return sch.mod
