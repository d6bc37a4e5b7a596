"""What the Relax passes read off expressions: static shapes and dtypes, constants, operator
calls, how often each var is used; and one loop that runs a mutator over a module."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir import GenericConst


def shape(expr) -> tuple[int, ...] | None:
    """The static shape of a tensor expression, or None (not a tensor, or a symbolic dim)."""
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = getattr(ty.shape, "values", ty.shape)
    if not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return tuple(int(d) for d in dims)


def dtype(expr) -> str | None:
    ty = getattr(expr, "ty", None)
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else None


def is_call(expr, op) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.same_as(op)


def const(expr) -> np.ndarray | None:
    return expr.value.numpy() if isinstance(expr, GenericConst) else None


def scalar_const(expr):
    """A constant holding one value (any shape of one element), as a Python number; else None."""
    if isinstance(expr, GenericConst):
        v = expr.value.numpy()
        if v.size == 1:
            return v.reshape(-1)[0].item()
    return None


def uses(func: relax.Function) -> dict:
    """Var -> number of bindings (and the function's result) that use it."""
    count: dict = {}

    def note(expr):
        for v in relax.analysis.free_vars(expr):
            count[v] = count.get(v, 0) + 1

    for block in func.body.blocks:
        for b in block.bindings:
            note(b.value)
    note(func.body.body)
    return count


def mutate(mod: tvm.IRModule, mutator, prepare=None) -> tvm.IRModule:
    """`mutator` over every Relax function of `mod` (`prepare(func)` first, when given)."""
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            if prepare:
                prepare(func)
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()
