"""Folds the pass does itself: constant layout transforms evaluated with numpy, before TVM's
FoldConstant; and items of tuples built in the graph read through.

ConvertLayout wraps every blocked conv's constant weights (and a bias added after it) in a
`layout_transform`; FoldConstant then compiles and runs one TVM function per such call, about
100 LLVM builds and 2.5 s of ResNet-50's compile. The index map of a layout transform is a
tuple of integer expressions of the source indices (n, c // 16, h, w, c % 16); evaluated on
numpy index grids it gives each source element's destination, so the whole transform is one
scatter. Expressions other than + - * // % of indices and integers, or a pad value that is not a
number, leave the call to FoldConstant.

TVM's torch frontend imports max_pool2d (torch.export's max_pool2d_with_indices) as a tuple of
the pool and a constant, then takes item 0. That detour hid the pool from the pass that cancels
the layout transforms around it (cancel.py), which left ResNet's stem pool unblocked in a
model as a user exports it: 4.4 ms of transforms at batch 8. `t = (a, b); y = t[0]` becomes `y = a`.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax import PyExprMutator, expr_functor

from . import exprs

_LAYOUT_TRANSFORM = tvm.ir.Op.get("relax.layout_transform")
_BINARY = {tirx.Add: np.add, tirx.Sub: np.subtract, tirx.Mul: np.multiply,
           tirx.FloorDiv: np.floor_divide, tirx.FloorMod: np.mod}


class Unsupported(Exception):
    pass


def _eval(expr, env: dict) -> np.ndarray:
    if isinstance(expr, tirx.Var):
        return env[expr.name]
    if isinstance(expr, tirx.IntImm):
        return np.int64(expr.value)
    for cls, fn in _BINARY.items():
        if isinstance(expr, cls):
            return fn(_eval(expr.a, env), _eval(expr.b, env))
    raise Unsupported(type(expr).__name__)


def transform(value: np.ndarray, index_map, out_shape: tuple, pad_value=None) -> np.ndarray:
    """`value` laid out by `index_map` into an array of `out_shape` (elements no source index
    reaches, the padding, hold pad_value or zero)."""
    names = [v.name for v in index_map.initial_indices]
    if len(names) != value.ndim:
        raise Unsupported("rank")
    grids = np.indices(value.shape, dtype=np.int64, sparse=True)
    env = dict(zip(names, grids))
    dest = tuple(np.broadcast_to(_eval(e, env), value.shape) for e in index_map.final_indices)
    out = np.full(out_shape, 0 if pad_value is None else pad_value, value.dtype)
    out[dest] = value
    return out


@expr_functor.mutator
class _FoldLayoutTransforms(PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.folded = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not exprs.is_call(call, _LAYOUT_TRANSFORM):
            return call
        value, out_shape = exprs.const(call.args[0]), exprs.shape(call)
        pad = call.attrs.pad_value
        if value is None or out_shape is None or (pad is not None and not isinstance(pad.value, (int, float))):
            return call
        try:
            folded = transform(value, call.attrs.index_map, out_shape, None if pad is None else pad.value)
        except Unsupported:
            return call
        self.folded += 1
        return relax.const(folded, str(value.dtype))


def fold_layout_transforms(mod: tvm.IRModule) -> tvm.IRModule:
    return exprs.mutate(mod, _FoldLayoutTransforms(mod))


@expr_functor.mutator
class _ReadTupleItems(PyExprMutator):
    def visit_tuple_getitem_(self, op):
        op = super().visit_tuple_getitem_(op)
        tup = op.tuple_value
        bound = self.lookup_binding(tup) if isinstance(tup, relax.Var) else tup
        if isinstance(bound, relax.Tuple) and op.index < len(bound.fields):
            return bound.fields[op.index]
        return op


def read_tuple_items(mod: tvm.IRModule) -> tvm.IRModule:
    """Items of tuples built in the graph replaced by the items themselves; the `y = a` aliases
    that leaves are substituted away, then dead tuples go."""
    mod = exprs.mutate(mod, _ReadTupleItems(mod))
    return relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(mod))
