"""Whole models: every float32 conv2d of a Relax module on our kernels (the pipeline around this
pass, steps 1-5: pipeline.py).

Which ops run where (one log line each on the "tvm_microkernels.relax" logger, and one dict
each in the `report` list when one is passed: "op" is "conv2d" for a conv, else the lowered
function's name; "runs_on" is "ours", "tvm" or "view", a reshape that copies nothing):
  - blocked by ConvertLayout (channels per group multiples of 16, after channels.py padded the
    graph's channel counts to whole blocks): ours, direct or Winograd; depthwise convs and groups
    of 2-8 channels on whole blocks too (filters as OIHW16o, repacked here), a depthwise conv
    alone or fused with its 1x1 expand;
  - left in NCHW with groups = 1 (a 3-channel first layer), depthwise on channels the padding
    did not reach (groups = channels) or groups narrower than a block (ResNeXt's 4 or 8 channels per group: in the vector lanes
    when each group has as many outputs as inputs, else with block-diagonal weights where they
    tile a block), none of which ConvertLayout blocks: ours, between layout transforms of
    its own, weights packed here; a last step cancels each transform pair that undoes itself,
    so such a layer between blocked neighbours runs blocked with no transform at all, and a
    layer whose channels are not whole blocks (MobileNetV2's 24) hands its padded blocked
    output to the next of ours directly when the padding lanes hold zeros;
  - any other grouped conv (RegNetX's 24 channels per group, 12, 20, 16 in and 8 out, ...):
    ours, direct, each group's inputs and outputs padded with zero channels to whole blocks
    (of the narrow tile's 8 on AVX2 where those pad less); from and to the graph's blocked
    tensors in one scheduled copy each way (groups.py) where ConvertLayout blocked it (groups
    wider than a block on whole-block maps: RegNetY-1.6GF's 24 on 336) or a conv of ours made
    its input, else between transforms of its own (reshape, pad, block; and back);
  - anything else (non-float32, symbolic shapes, weights that are not constants on the NCHW
    path): TVM's default lowering, in NCHW, so the model still builds.
"""

from __future__ import annotations

import functools
import logging
import numpy as np
import tvm
from tvm import relax
from tvm.relax import PyExprMutator, expr_functor

from microkernels import DEFAULT_TILES

from ..common import parallel
from ..common.targets import resolve
from ..conv import (
    ConvParams,
    Geometry,
    PostOps,
    inverted_pays,
    measure,
    schedule,
    schedule_inverted,
)
from ..conv.op import Conv2dOp
from . import exprs
from .fusion import Conv, classify, fuse_chain
from .groups import copy_func, regroup, ungroup

LOG = logging.getLogger("tvm_microkernels.relax")

_CONV2D = tvm.ir.Op.get("relax.nn.conv2d")
_LAYOUT_TRANSFORM = tvm.ir.Op.get("relax.layout_transform")
_STRIDED_SLICE = tvm.ir.Op.get("relax.strided_slice")


@expr_functor.mutator
class _Swap(PyExprMutator):
    def __init__(self, mod, target: str, algorithm: str, threads, fuse: bool, report: list, autotune: bool = False):
        super().__init__(mod)
        self.target, self.algorithm, self.threads, self.fuse, self.report = target, algorithm, threads, fuse, report
        self.autotune = autotune
        self.block = DEFAULT_TILES[resolve(target).name][1]
        self.funcs: dict = {}  # (schedule key) -> GlobalVar
        self.ends: dict = {}  # chain-end var -> Conv
        self.kept: dict = {}  # var of a conv left to TVM -> why
        self.skip: set = set()
        # NCHW var -> (our blocked output it was unblocked from, block, channels), where that
        # output's padding lanes are zeros: blocking the var again is that output itself.
        self.blocked: dict = {}
        self.expands: dict = {}  # a depthwise conv's chain-end var -> the expand Conv fused into it
        self.ready: dict = {}  # schedule request -> its result, made up front (_prefetch)

    def plan(self, func: relax.Function) -> None:
        uses = exprs.uses(func)
        for blk in func.body.blocks:
            users = {}
            for b in blk.bindings:
                for v in relax.analysis.free_vars(b.value):
                    users.setdefault(v, (b.var, b.value))
            for b in blk.bindings:
                if not exprs.is_call(b.value, _CONV2D) or b.var in self.skip:
                    continue
                conv, why = classify(b.value, self.block)
                if conv is None:
                    self.kept[b.var] = why  # logged when visited, so the report follows the model
                    continue
                claimed = self.skip.union(self.ends)
                end = fuse_chain(conv, b.var, users, uses, self.block, claimed, self.algorithm) if self.fuse else b.var
                self.skip.update(conv.skipped)
                self.ends[end] = conv
            if self.fuse:
                self._pair_expands(blk, uses)
        self._prefetch()

    def _prefetch(self) -> None:
        """Schedule the distinct layers of every planned conv at once, one process per core
        (common/parallel.py): ResNet-50's 53 convs are 27 distinct layers (shape and
        post-ops), and scheduling them is most of a cold build. The visit finds them in
        `ready`; one that failed here is scheduled again where it is lowered, which raises in
        context. With autotune, the layers not yet timed on this host are timed first, one
        after the other (conv.measure; timing two at once would time the neighbour too)."""
        todo: dict = {}
        for end, conv in self.ends.items():
            ex = self.expands.get(end)
            if ex is not None:
                req = self._inverted_request(ex, conv)
                todo.setdefault(req, functools.partial(schedule_inverted, *req))
            else:
                req = self._request(conv, self._algorithm(exprs.const(conv.call.args[1])))
                params, post, algorithm = req
                if self.autotune and algorithm == "auto" and req not in todo:
                    measure(params, post, self.target, self.threads)
                todo.setdefault(req, functools.partial(self._make, req))
        made = parallel.run(list(todo.values()))
        self.ready = {req: s for req, s in zip(todo, made) if s is not None}

    def _pair_expands(self, blk, uses: dict) -> None:
        """MobileNet's 1x1 expand conv (+ bias, activation) and the depthwise conv that alone
        reads its output (directly, or through ConvertLayout's unblock of it) run as one fused
        operator (conv.inverted): the expanded map never goes to memory."""
        values = {b.var: b.value for b in blk.bindings}
        for end, dw in list(self.ends.items()):
            if not _fusable_depthwise(dw):
                continue
            src, mid = dw.call.args[0], None
            if src not in self.ends and exprs.is_call(values.get(src), _LAYOUT_TRANSFORM) and uses.get(src, 0) == 1:
                src, mid = values[src].args[0], src
            ex = self.ends.get(src)
            if ex is None or uses.get(src, 0) != 1 or not _fusable_expand(ex, dw) or \
                    not inverted_pays(ex.data_shape, ex.weight_shape[0]):
                continue
            del self.ends[src]
            self.skip.update({src} | ({mid} if mid is not None else set()))
            self.expands[end] = ex

    def _log(self, call, where: str, why: str, algorithm: str | None = None, post: PostOps | None = None) -> None:
        a = call.attrs
        entry = {"op": "conv2d", "data": exprs.shape(call.args[0]), "weight": exprs.shape(call.args[1]),
                 "stride": [int(s) for s in a.strides], "groups": int(a.groups), "runs_on": where, "reason": why}
        if algorithm:
            entry["algorithm"], entry["post_ops"] = algorithm, post.label
        self.report.append(entry)
        LOG.info("conv2d data %s weight %s stride %s groups %s: %s (%s)", entry["data"], entry["weight"],
                 entry["stride"], entry["groups"], where, why)

    def visit_var_binding_(self, binding):
        if binding.var in self.skip:
            return
        if binding.var in self.kept:
            self._log(binding.value, "tvm", self.kept[binding.var])
        conv = self.ends.get(binding.var)
        if conv is None:
            return super().visit_var_binding_(binding)
        ex = self.expands.get(binding.var)
        value = self._lower_inverted(ex, conv, binding.var) if ex is not None else self._lower(conv, binding.var)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))

    def _algorithm(self, weight) -> str:
        """The pass's algorithm for a conv whose weight is `weight` (a numpy constant or None):
        Winograd needs constant weights, which it transforms at compile time."""
        return self.algorithm if weight is not None else "direct"

    def _request(self, conv: Conv, algorithm: str) -> tuple:
        a = conv.call.attrs
        params = ConvParams(conv.data_shape, conv.weight_shape, [int(s) for s in a.strides],
                            [int(p) for p in a.padding], [int(d) for d in a.dilation], int(a.groups))
        return params, PostOps(conv.bias is not None, conv.residual is not None, conv.activation, conv.clip), algorithm

    def _make(self, req: tuple):
        params, post, algorithm = req
        return schedule(params, post_ops=post, target=self.target, algorithm=algorithm, threads=self.threads)

    def _schedule(self, conv: Conv, algorithm: str):
        req = self._request(conv, algorithm)
        s = self.ready.get(req)
        return s if s is not None else self._make(req)

    def _inverted_request(self, ex: Conv, dw: Conv) -> tuple:
        post_e = PostOps(ex.bias is not None, False, ex.activation, ex.clip)
        post_d = PostOps(dw.bias is not None, False, dw.activation, dw.clip)
        return (ex.data_shape, ex.weight_shape, dw.weight_shape, int(dw.call.attrs.strides[0]), post_e, post_d,
                self.target)

    def _lower(self, conv: Conv, var) -> relax.Expr:
        """conv's chain as a call of our PrimFunc, held in `var` (NCHW convs: _unblocked)."""
        data, weight = (self.visit_expr(x) for x in conv.call.args)
        w_const = exprs.const(weight)
        s = self._schedule(conv, self._algorithm(w_const))
        g: Geometry = s.geometry
        op = s.cls(g, s.isa, None, None, s.plan, s.post)
        # Weights: ConvertLayout + FoldConstant already packed a blocked conv's into our layout,
        # but for Winograd's and the OIHW16o filters of depthwise and narrow groups.
        repack = s.plan.algorithm == "winograd" or not conv.blocked or (w_const is not None and w_const.ndim == 5)
        # Groups wider than a block, not whole blocks, that ConvertLayout blocked (pipeline): run
        # in their own group layout, one scheduled copy each way from and to the graph's blocks.
        own = _group_padded(s.cls, g, self.block)  # the group layout is not the graph's blocks
        regrouped, padded = conv.blocked and own, not conv.blocked and own
        if conv.blocked and not regrouped and (tuple(op.blocked_data_shape) != exprs.shape(data)
                             or (s.plan.algorithm == "direct" and not repack and tuple(g.weight_shape) != exprs.shape(weight))):
            raise AssertionError(f"ConvertLayout's blocked shapes {exprs.shape(data)}, {exprs.shape(weight)} are not ours "
                                 f"{op.blocked_data_shape}, {g.weight_shape}")
        if repack:
            oihw = w_const if not conv.blocked else _unblock_weights(w_const, g)
            weight = relax.const(op.pack_weights(oihw))
        if regrouped:
            args = [self._copy(regroup, data, g.groups, g.cg, g.nb, g.bi)]
        elif conv.blocked:
            args = [data]
        elif padded:
            args = [self._to_group_blocked(data, g.groups, g.cg, g.nb, g.bi, g.c)]
        else:
            args = [self._to_blocked(data, op.blocked_data_shape[-1], g.c)]
        args.append(weight)
        if conv.bias is not None:
            args.append(relax.const(op.pack_bias(conv.bias.astype(np.float32))))
        if conv.residual is not None:
            res = self.visit_expr(conv.residual)
            if regrouped:
                res = self._copy(regroup, res, g.groups, g.og, g.ob, g.block)
            elif not conv.blocked:
                res = self._to_group_blocked(res, g.groups, g.og, g.ob, g.block, g.o) if padded \
                    else self._to_blocked(res, g.block, g.o)
            args.append(res)
        key = (g, s.post, s.plan.algorithm, s.plan.get("tile"))
        gv = self.funcs.get(key)
        if gv is None:
            name = _func_name(g, s.plan, s.post)
            gv = self.builder_.add_func(s.mod["main"].with_attr("global_symbol", name), name)
            self.funcs[key] = gv
        post = s.post.label
        why = f"{s.plan.algorithm}{' F' + str(s.plan.tile) if s.plan.get('tile') else ''}" \
              f"{', fused ' + post if post else ''}{'' if conv.blocked else ', between layout transforms of its own'}" \
              f"{'' if s.plan.source == 'defaults' else ', plan ' + s.plan.source}"
        self._log(conv.call, "ours", why, s.plan.algorithm, s.post)
        out = relax.call_tir(gv, args, relax.TensorType(op.blocked_out_shape, "float32"))
        if regrouped:
            return self._copy(ungroup, self.builder_.emit(out), g.groups, g.og, g.ob, g.o, self.block)
        if padded:
            return self._from_group_blocked(out, g.groups, g.og, g.ob, g.o, var)
        return out if conv.blocked else self._unblocked(out, g.o, s.post, var)

    def _unblocked(self, out: relax.Call, channels: int, post: PostOps, var) -> relax.Expr:
        """Our blocked output `out` as the NCHW tensor the graph holds in `var`. Padded output
        channels have zero weights and bias (and a zero-padded residual): they hold act(0),
        zero unless a clip's range excludes 0; where they are zeros, `var` is remembered as
        `out`, which is what blocking it again for the next conv of ours would give."""
        y = self.builder_.emit(out)
        block = exprs.shape(y)[-1]
        lo, hi = post.clip if post.activation == "clip" else (0.0, 0.0)
        if channels % block == 0 or lo <= 0.0 <= hi:
            self.blocked[var] = (y, block, channels)
        return self._nchw(y, block, channels)

    def _nchw(self, y, block: int, channels: int) -> relax.Expr:
        """Blocked y as NCHW: its first `channels` channels."""
        y = relax.op.layout_transform(y, index_map=lambda n_, c, h, w, i: (n_, c * block + i, h, w))
        if channels % block:
            y = relax.op.strided_slice(self.builder_.emit(y), axes=[1], begin=[0], end=[channels])
        return y

    def _lower_inverted(self, ex: Conv, dw: Conv, var) -> relax.Expr:
        """The expand conv `ex` and the depthwise conv `dw` as one call of the fused block."""
        data, we = (self.visit_expr(x) for x in ex.call.args)
        wd = exprs.const(self.visit_expr(dw.call.args[1]))
        req = self._inverted_request(ex, dw)
        post_e, post_d = req[4:6]
        made = self.ready.get(req)
        lay, _, mod, plan = made if made is not None else schedule_inverted(*req)
        w_exp = exprs.const(we)
        packed = lay.pack_weights(_unblock_weights(w_exp, lay.expand) if ex.blocked else w_exp,
                                  _unblock_weights(wd, lay.dw) if dw.blocked else wd)
        shapes = lay.shapes()
        args = [data if ex.blocked else self._to_blocked(data, shapes["data"][-1], lay.expand.c)]
        args += [relax.const(w) for w in packed]
        args += [relax.const(b) for b in lay.pack_bias(ex.bias, dw.bias) if b is not None]
        key = ("inverted", lay)
        gv = self.funcs.get(key)
        if gv is None:
            g, d = lay.expand, lay.dw
            name = (f"mk_conv2d_inverted_n{g.n}c{g.c}h{g.h}w{g.w}_e{g.o}k{d.kh}x{d.kw}s{d.stride[0]}"
                    f"{'_' + post_e.label.replace('+', '_') if post_e.label else ''}"
                    f"_dw{'_' + post_d.label.replace('+', '_') if post_d.label else ''}")
            gv = self.builder_.add_func(mod["main"].with_attr("global_symbol", name), name)
            self.funcs[key] = gv
        why = f"inverted: fused with the {{}} ({plan.band_rows}-row bands, the expanded map stays in L1)"
        self._log(ex.call, "ours", why.format("depthwise conv after it"), "inverted", post_e)
        self._log(dw.call, "ours", why.format("1x1 expand conv before it"), "inverted", post_d)
        out = relax.call_tir(gv, args, relax.TensorType(shapes["out"], "float32"))
        if dw.blocked:
            if tuple(shapes["out"]) != exprs.shape(dw.call):
                raise AssertionError(f"ConvertLayout's blocked depthwise output {exprs.shape(dw.call)} is not the fused "
                                     f"block's {shapes['out']}")
            return out
        return self._unblocked(out, lay.expand.o, post_d, var)

    def _to_blocked(self, x, block: int, channels: int):
        if self.blocked.get(x, (None,))[1:] == (block, channels):
            return self.blocked[x][0]  # the 24-channel maps of MobileNetV2 stay blocked, padded
        pad = None if channels % block == 0 else 0.0
        return self.builder_.emit(relax.op.layout_transform(
            x, index_map=lambda n, c, h, w: (n, c // block, h, w, c % block), pad_value=pad))

    def _to_group_blocked(self, x, groups: int, per: int, blocks: int, block: int, channels: int):
        """NCHW x, `groups` groups of `per` channels, as blocks: each group padded with zero channels
        to `blocks` whole blocks of `block` (the layout a grouped conv's blocked data and output take
        when its groups are not whole blocks: Geometry.data_shape / out_shape; `block` may be the
        narrow tile's, dispatch.tile_for). One pass from the plain blocked tensor when a conv of
        ours made x (its padded lanes are never read)."""
        made = self.blocked.get(x)
        if made is not None and made[2] == channels:
            return self._copy(regroup, made[0], groups, per, blocks, block)
        source = self._sliced_blocked(x, self.block, channels)
        if source is not None:
            return self._copy(regroup, source, groups, per, blocks, block)
        n, _, h, w = exprs.shape(x)
        y = self.builder_.emit(relax.op.reshape(x, (n, groups, per, h, w)))
        y = self.builder_.emit(relax.op.nn.pad(y, [0, 0, 0, 0, 0, blocks * block - per, 0, 0, 0, 0]))
        y = self.builder_.emit(relax.op.reshape(y, (n, groups * blocks * block, h, w)))
        return self._to_blocked(y, block, groups * blocks * block)

    def _sliced_blocked(self, x, block: int, channels: int):
        """The blocked tensor z when x = strided_slice(unblock(z), channels 0..channels): a tensor
        channels.py padded to whole blocks, unblocked by ConvertLayout for a consumer that reads
        its real channels only (RegNetX's groups of 24 on 72 channels padded to 80); z's padding
        lanes are never read by regroup. None otherwise."""
        sliced = self.lookup_binding(x) if isinstance(x, relax.Var) else None
        if not exprs.is_call(sliced, _STRIDED_SLICE) or exprs.shape(sliced) is None:
            return None
        try:  # (data, axes, begin, end[, strides]): axis 1 from 0, unit strides
            axes, begin = ([int(v.value) for v in t.fields] for t in sliced.args[1:3])
            strides = [int(v.value) for v in sliced.args[4].fields] if len(sliced.args) > 4 else [1]
        except (AttributeError, TypeError):
            return None
        if axes != [1] or begin != [0] or strides != [1] or exprs.shape(sliced)[1] != channels:
            return None
        src = sliced.args[0]
        unblock = self.lookup_binding(src) if isinstance(src, relax.Var) else src
        if not exprs.is_call(unblock, _LAYOUT_TRANSFORM):
            return None
        z, nchw = unblock.args[0], exprs.shape(unblock)
        zs = exprs.shape(z)
        if zs is None or nchw is None or len(zs) != 5 or zs[4] != block or nchw[1] != zs[1] * block \
                or zs[1] != -(-channels // block) or (zs[0], zs[2], zs[3]) != (nchw[0], nchw[2], nchw[3]):
            return None
        return z

    def _copy(self, compute, x, *params):
        """compute(x, *params) (regroup or ungroup) as a call of a PrimFunc of our own,
        one per shape; returns the 5-d blocked tensor."""
        key = (compute.__name__, tuple(exprs.shape(x)), params)
        if key not in self.funcs:
            name, func, shape = copy_func(compute, exprs.shape(x), params)
            self.funcs[key] = (self.builder_.add_func(func, name), shape)
        gv, shape = self.funcs[key]
        y = self.builder_.emit(relax.call_tir(gv, [x], relax.TensorType(shape, "float32")))
        return y if len(shape) == 5 else self.builder_.emit(relax.op.reshape(y, (*shape[:4], shape[4] * shape[5])))

    def _from_group_blocked(self, y, groups: int, per: int, blocks: int, channels: int, var):
        """_to_group_blocked's layout back: one pass to the plain blocked layout of the graph's
        block (padding lanes zero), which the next conv of ours takes as it is, and the NCHW tensor
        `var` holds."""
        plain = self._copy(ungroup, self.builder_.emit(y), groups, per, blocks, channels, self.block)
        self.blocked[var] = (plain, self.block, channels)
        return self._nchw(plain, self.block, channels)


def _group_padded(cls, g: Geometry, block: int) -> bool:
    """A grouped conv on the direct family whose blocked layouts (Geometry's data and output
    shapes) are not the graph's plain layout of `block`-channel blocks: each group padded to
    whole blocks, or blocks of the narrow tile's width. The depthwise family and the
    block-diagonal form (grouped.py) take the plain blocked layout of all the channels, as do
    groups of whole blocks (ResNeXt-50's 32 channels: the same layout, nothing to copy)."""
    return g.groups > 1 and cls is Conv2dOp and bool(g.block != block or g.cg % block or g.og % block)


def _fusable_depthwise(dw: Conv) -> bool:
    """A depthwise conv the fused block takes: NCHW (ConvertLayout leaves these so), multiplier
    1, K = 3 or 5 square, padding K // 2, the same stride 1 or 2 both ways, no dilation."""
    a = dw.call.attrs
    o, one, kh, kw = dw.weight_shape
    strides = [int(v) for v in a.strides]
    return (dw.depthwise and one == 1 and o == dw.data_shape[1] and kh == kw and kh in (3, 5)
            and [int(p) for p in a.padding] == [kh // 2] * 4 and [int(d) for d in a.dilation] == [1, 1]
            and strides[0] == strides[1] and strides[0] in (1, 2) and dw.residual is None)


def _fusable_expand(ex: Conv, dw: Conv) -> bool:
    """A 1x1, stride-1, unpadded, ungrouped conv with constant weights whose output is the
    depthwise conv's input, with a bias and an activation at most."""
    a = ex.call.attrs
    return (ex.weight_shape[2:] == (1, 1) and int(a.groups) == 1 and [int(v) for v in a.strides] == [1, 1]
            and [int(p) for p in a.padding] == [0, 0, 0, 0] and [int(d) for d in a.dilation] == [1, 1]
            and ex.residual is None and ex.weight_shape[0] == dw.data_shape[1]
            and exprs.const(ex.call.args[1]) is not None)


def _unblock_weights(w: np.ndarray, g: Geometry) -> np.ndarray:
    """OIHW{bi}i{bo}o (groups = 1) back to OIHW, for the Winograd weight transform; a blocked
    depthwise or narrow-group conv's OIHW{bo}o back to (O, C/groups, kh, kw), for its packing."""
    if w.ndim == 5:
        ob, cg, kh, kw, bo = w.shape
        return np.ascontiguousarray(w.transpose(0, 4, 1, 2, 3).reshape(ob * bo, cg, kh, kw)[:g.o])
    ob, ib, kh, kw, bi, bo = w.shape
    return np.ascontiguousarray(w.transpose(0, 5, 1, 4, 2, 3).reshape(ob * bo, ib * bi, kh, kw)[:g.o, :g.c])


def _func_name(g: Geometry, plan, post: PostOps) -> str:
    alg = f"wino{plan.tile}" if plan.algorithm == "winograd" else plan.algorithm
    fused = "".join(f"_{p}" for p, on in (("bias", post.bias), ("res", post.residual),
                                           (post.activation, post.activation)) if on)
    return (f"mk_conv2d_{alg}_n{g.n}c{g.c}h{g.h}w{g.w}_o{g.o}k{g.kh}x{g.kw}s{g.stride[0]}x{g.stride[1]}"
            f"p{'x'.join(map(str, g.pad))}d{g.dilation[0]}x{g.dilation[1]}g{g.groups}{fused}")


def swap(mod: tvm.IRModule, target, algorithm, threads, fuse, report, autotune=False) -> tvm.IRModule:
    """Each conv2d we cover replaced by a call of our scheduled PrimFunc, with what it fuses
    (the module doc)."""
    mutator = _Swap(mod, target, algorithm, threads, fuse, report, autotune)
    return exprs.mutate(mod, mutator, mutator.plan)
