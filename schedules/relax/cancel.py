"""Layout transforms that undo each other, cancelled: our NCHW convs come wrapped in transforms to
and from the blocked layout, ConvertLayout's blocked neighbours add the opposite ones, and each
such pair (and a pool between them) collapses so the blocked layout runs through."""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax import PyExprMutator, expr_functor
from tvm.sym import Analyzer

from . import exprs

_LAYOUT_TRANSFORM = tvm.ir.Op.get("relax.layout_transform")
_POOLS = (tvm.ir.Op.get("relax.nn.max_pool2d"), tvm.ir.Op.get("relax.nn.avg_pool2d"))


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
    saw in NCHW) runs in the blocked layout instead: back(pool(there(x))) -> pool(x), NCHW{b}c."""

    def __init__(self, mod):
        super().__init__(mod)
        self.transforms: dict = {}  # var -> its layout_transform call (after remapping)
        self.pools: dict = {}  # var -> its NCHW pool call (after remapping)
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
            if pooled is not None:
                self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(pooled)))
                return
            self.transforms[binding.var] = value
        elif any(exprs.is_call(value, op) for op in _POOLS) and str(value.attrs.layout) == "NCHW" and \
                str(value.attrs.out_layout) == "NCHW":
            self.pools[binding.var] = value
        self.builder_.emit_normalized(relax.VarBinding(binding.var, value))

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
