"""Layout transforms that undo each other, cancelled: our NCHW convs come wrapped in transforms to
and from the blocked layout, ConvertLayout's blocked neighbours add the opposite ones, and each
such pair (and a pool, or a chain of elementwise maps, between them) collapses so the blocked
layout runs through."""

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


def cancel_transforms(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every pair of layout transforms that undo each other (and the pools between
    such pairs) cancelled, and what that leaves unused removed."""
    cancel = _CancelTransforms(mod)
    return relax.transform.DeadCodeElimination()(exprs.mutate(mod, cancel, cancel.prepare))
