"""Layout transforms that undo each other, cancelled: our NCHW convs come wrapped in transforms to
and from the blocked layout, ConvertLayout's blocked neighbours add the opposite ones, and each
such pair (and a pool, or a chain of elementwise maps, between them) collapses so the blocked
layout runs through; a blocked tensor's NCHW copy that feeds maps, a spatial mean and a
per-channel scale before going back to blocks (squeeze-and-excitation) runs blocked instead."""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax import PyExprMutator, expr_functor
from tvm.sym import Analyzer

from . import exprs

_LAYOUT_TRANSFORM = tvm.ir.Op.get("relax.layout_transform")
_POOLS = (tvm.ir.Op.get("relax.nn.max_pool2d"), tvm.ir.Op.get("relax.nn.avg_pool2d"))
# Maps of one tensor, value by value, whatever its layout (the other arguments, if any, are
# scalars): a pair of transforms that undo each other around a chain of them cancels, the maps
# running on the blocked tensor instead (EfficientNet's SiLU after a conv on 24 input channels).
_ELEMENTWISE = tuple(tvm.ir.Op.get(f"relax.{n}") for n in (
    "nn.silu", "sigmoid", "exp", "nn.gelu", "nn.gelu_tanh", "nn.relu", "tanh", "clip", "nn.leakyrelu",
    "negative", "abs"))
# Binary ops whose second operand, a scalar constant, makes them such maps too (the maximum and
# minimum a clip is split into, hardswish's + 3 and / 6).
_WITH_SCALAR = tuple(tvm.ir.Op.get(f"relax.{n}") for n in ("maximum", "minimum", "add", "subtract", "multiply", "divide"))


def _is_map(call) -> bool:
    """Whether `call` maps its first argument value by value, whatever the layout (module doc)."""
    if any(exprs.is_call(call, op) for op in _ELEMENTWISE):
        return not any(isinstance(a.ty, relax.TensorType) for a in call.args[1:])
    if any(exprs.is_call(call, op) for op in _WITH_SCALAR):
        c = exprs.const(call.args[1])
        return c is not None and c.ndim == 0
    return False


def _undoes(outer, inner) -> bool:
    """Whether layout_transform `outer` exactly undoes `inner`: neither pads, and the analyzer
    proves that their composed index maps give back every index of the original shape."""
    shape = exprs.shape(inner.args[0])
    return shape is not None and shape == exprs.shape(outer) and _inverse(inner, outer, shape)


def _inverse(inner, outer, shape: tuple) -> bool:
    """Whether `outer`'s index map undoes `inner`'s over every index of `shape` (the shape of
    whatever `inner` applies to: it may differ from what `inner` was given, in a dimension
    neither map mixes with another), and neither transform pads."""
    if inner.attrs.pad_value is not None or outer.attrs.pad_value is not None:
        return False
    given, between = exprs.shape(inner.args[0]), exprs.shape(inner)
    # More elements in between means implicit padding (values left unspecified), which the
    # outer map would write over the round trip's.
    if given is None or between is None or math.prod(between) != math.prod(given):
        return False
    there, back = inner.attrs.index_map, outer.attrs.index_map
    if len(there.initial_indices) != len(shape) or len(back.initial_indices) != len(there.final_indices):
        return False
    # Sample indices cannot tell the identity from a permutation that fixes them (a transpose
    # of a square map fixes its diagonal), so the composition is proved over the whole range.
    analyzer = Analyzer()
    for v, extent in zip(there.initial_indices, shape):
        dtype = str(v.ty)
        analyzer.bind(v, tvm.ir.Range.from_min_extent(tvm.tirx.const(0, dtype), tvm.tirx.const(extent, dtype)))
    composed = back.map_indices(list(there.final_indices), analyzer)
    return len(composed) == len(shape) and \
        all(analyzer.can_prove_equal(e, v) for e, v in zip(composed, there.initial_indices))


@expr_functor.mutator
class _CancelTransforms(PyExprMutator):
    """y = layout_transform(layout_transform(x, there), back) -> y = x. Our NCHW convs (the stem,
    depthwise layers) come wrapped in transforms to and from NCHW16c, and ConvertLayout's blocked
    neighbours add the opposite ones: these pairs cancel, and the blocked layout runs through.
    A pool between such a pair (ResNet's max pool after its 3-channel stem, which ConvertLayout
    saw in NCHW) runs in the blocked layout instead: back(pool(there(x))) -> pool(x), NCHW{b}c;
    so does a chain of elementwise maps (_is_map), each used once: back(f(g(there(x)))) ->
    f(g(x))."""

    def __init__(self, mod):
        super().__init__(mod)
        self.transforms: dict = {}  # var -> its layout_transform call (after remapping)
        self.pools: dict = {}  # var -> its NCHW pool call (after remapping)
        self.maps: dict = {}  # var -> its elementwise call of a transform's output or another map's
        self.uses: dict = {}

    def prepare(self, func: relax.Function) -> None:
        self.uses = exprs.uses(func)

    def visit_var_binding_(self, binding):
        value = self.visit_expr(binding.value)
        if exprs.is_call(value, _LAYOUT_TRANSFORM):
            src = value.args[0]
            inner = self.transforms.get(src)
            if inner is not None and _undoes(value, inner):
                self.builder_.emit_normalized(relax.VarBinding(binding.var, inner.args[0]))
                return
            pooled = self._blocked_pool(src, value)
            if pooled is None:
                pooled = self._blocked_maps(src, value)
            if pooled is not None:
                self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(pooled)))
                return
            self.transforms[binding.var] = value
        elif _is_map(value) and (value.args[0] in self.transforms or value.args[0] in self.maps):
            self.maps[binding.var] = value
        elif any(exprs.is_call(value, op) for op in _POOLS) and str(value.attrs.layout) == "NCHW" and \
                str(value.attrs.out_layout) == "NCHW":
            self.pools[binding.var] = value
        self.builder_.emit_normalized(relax.VarBinding(binding.var, value))

    def _blocked_maps(self, src, back):
        """The chain of elementwise maps ending at `src` applied to x instead, when `back`
        undoes the transform `there` the chain starts from (there(x)) and each map's output has
        no other user."""
        chain = []
        while src in self.maps and self.uses.get(src, 0) == 1:
            chain.append(self.maps[src])
            src = chain[-1].args[0]
        there = self.transforms.get(src)
        if not chain or there is None or not _undoes(back, there):
            return None
        out = there.args[0]
        for i, call in enumerate(reversed(chain)):
            if i:
                out = self.builder_.emit(out)  # each map bound to a var of its own, as before
            out = relax.Call(call.op, [out, *call.args[1:]], call.attrs)
        return out

    def _blocked_pool(self, src, back):
        """pool(x) in x's blocked layout, when `back` re-blocks the output of an NCHW pool
        (whose only user it is) of `there(x)`, and `back` undoes `there`."""
        pool = self.pools.get(src)
        if pool is None or self.uses.get(src, 0) != 1:
            return None
        there = self.transforms.get(pool.args[0])
        x = there.args[0] if there is not None else None
        shape = exprs.shape(x) if x is not None else None
        if shape is None or len(shape) != 5 or exprs.shape(back) is None or \
                exprs.shape(back)[-1] != shape[-1] or not _inverse(there, back, shape):
            return None
        a = pool.attrs
        layout = f"NCHW{shape[-1]}c"
        op = relax.op.nn.max_pool2d if exprs.is_call(pool, _POOLS[0]) else relax.op.nn.avg_pool2d
        return op(x, pool_size=a.pool_size, strides=a.strides, padding=a.padding, dilation=a.dilation,
                  ceil_mode=bool(a.ceil_mode), count_include_pad=bool(a.count_include_pad), layout=layout,
                  out_layout=layout)


_MEAN = tvm.ir.Op.get("relax.mean")
_PER_CHANNEL = tuple(tvm.ir.Op.get(f"relax.{n}") for n in ("multiply", "add"))


def _to_blocks(b: int):
    return lambda n, c, h, w: (n, c // b, h, w, c % b)


def _to_nchw(b: int):
    return lambda n, c, h, w, i: (n, c * b + i, h, w)


@expr_functor.mutator
class _SinkTransforms(PyExprMutator):
    """v = to_nchw(xb), a blocked tensor's NCHW copy, and what is computed from it by elementwise
    maps, means over H and W and products (or sums) with a per-channel (1, C, 1, 1) tensor, each
    computed again on the blocked tensor (its twin; the per-channel operand blocked, a copy of C
    values); a transform of such a value back to blocks becomes its twin. This is the
    squeeze-and-excitation block around our NCHW convs on 1x1 maps: the map's NCHW copy, its
    activation, the pool and the scale all run blocked. The NCHW ops are left to dead code
    elimination, and sink_transforms keeps the result only where none of them survives."""

    def __init__(self, mod):
        super().__init__(mod)
        self.blocked: dict = {}  # NCHW var -> (its blocked twin, the block)

    def visit_var_binding_(self, binding):
        value = self.visit_expr(binding.value)
        if exprs.is_call(value, _LAYOUT_TRANSFORM) and value.args[0] in self.blocked:
            xb, b = self.blocked[value.args[0]]
            back = self.builder_.normalize(relax.op.layout_transform(xb, _to_nchw(b)))
            if exprs.shape(value) == exprs.shape(xb) and _inverse(back, value, exprs.shape(xb)):
                self.builder_.emit_normalized(relax.VarBinding(binding.var, xb))
                return
        self.builder_.emit_normalized(relax.VarBinding(binding.var, value))
        twin = self._twin(value)
        if twin is not None:
            expr, b = twin
            self.blocked[binding.var] = (expr if isinstance(expr, relax.Var) else self.builder_.emit(expr), b)

    def _twin(self, value):
        """(the blocked twin of `value`, the block), or None."""
        if not isinstance(value, relax.Call):
            return None
        args = value.args
        if exprs.is_call(value, _LAYOUT_TRANSFORM):
            shape, out = exprs.shape(args[0]), exprs.shape(value)
            if not isinstance(args[0], relax.Var) or shape is None or out is None or len(shape) != 5 or len(out) != 4:
                return None
            b = shape[-1]
            there = self.builder_.normalize(relax.op.layout_transform(value, _to_blocks(b)))
            return (args[0], b) if _inverse(value, there, shape) else None
        if not args or args[0] not in self.blocked and not any(a in self.blocked for a in args[1:2]):
            return None
        if _is_map(value) and args[0] in self.blocked:
            xb, b = self.blocked[args[0]]
            return relax.Call(value.op, [xb, *args[1:]], value.attrs), b
        if exprs.is_call(value, _MEAN) and args[0] in self.blocked and value.attrs.keepdims and \
                value.attrs.axis is not None and [int(a) for a in value.attrs.axis] == [2, 3]:
            xb, b = self.blocked[args[0]]
            return relax.op.mean(xb, axis=[2, 3], keepdims=True), b
        if any(exprs.is_call(value, op) for op in _PER_CHANNEL) and len(args) == 2:
            out = exprs.shape(value)
            shapes = [exprs.shape(a) for a in args]
            big = 0 if shapes[0] == out else 1
            small = 1 - big
            if args[big] not in self.blocked or shapes[big] != out or out is None or len(out) != 4:
                return None
            xb, b = self.blocked[args[big]]
            if shapes[small] != out and shapes[small] != (1, out[1], 1, 1):
                return None
            if args[small] in self.blocked:
                small_b, b2 = self.blocked[args[small]]
                if b2 != b:
                    return None
            elif out[1] % b == 0:
                small_b = self.builder_.emit(relax.op.layout_transform(args[small], _to_blocks(b)))
            else:
                return None
            return relax.Call(value.op, [xb, small_b] if big == 0 else [small_b, xb], value.attrs), b
        return None


def _op_counts(mod: tvm.IRModule) -> dict:
    """Calls per op (per callee for call_tir) in `mod`'s Relax functions."""
    counts: dict = {}

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            key = expr.op.name
            if key == "relax.call_tir":
                key += ":" + expr.args[0].name_hint
            counts[key] = counts.get(key, 0) + 1

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return counts


def sink_transforms(mod: tvm.IRModule) -> tvm.IRModule:
    """_SinkTransforms on `mod`, kept where it removed layout transforms and computes no op
    more often than before (an NCHW value still needed elsewhere would be computed twice)."""
    new = relax.transform.DeadCodeElimination()(exprs.mutate(mod, _SinkTransforms(mod)))
    before, after = _op_counts(mod), _op_counts(new)
    lt = _LAYOUT_TRANSFORM.name
    if after.get(lt, 0) >= before.get(lt, 0) or any(n > before.get(k, 0) for k, n in after.items() if k != lt):
        return mod
    return new


def cancel_transforms(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every pair of layout transforms that undo each other (and the pools or chains
    of elementwise maps between such pairs) cancelled, what that leaves unused removed, and then
    the transforms sunk through squeeze-and-excitation blocks (sink_transforms)."""
    cancel = _CancelTransforms(mod)
    return sink_transforms(relax.transform.DeadCodeElimination()(exprs.mutate(mod, cancel, cancel.prepare)))
