"""Linear layers on our GEMM tiles: every float32 `matmul` of a tensor by a constant matrix,
with the constant bias added after it fused into the tiles' store.

The frontends write a Linear as matmul(x, W^T) + b (the transpose folds into the constant), x
of any rank: ConvNeXt's token MLPs as (1, 56, 56, 96) x (96, 384), a classifier's batch-1
GEMV as (1, 768) x (768, 1000). Left to TVM, the legalized matmul got rest.py's generic
reduction schedule: a few GFLOP/s, 423 of ConvNeXt-Tiny's 437 ms on a Zen 3.

Here x's leading axes are flattened into the M rows (a reshape, which costs nothing), the
weights are packed at compile time into the tiles' NR-wide panels (schedules.matmul.pack_b),
and the call is one module of schedules.matmul's tiles over every row (`packed_matmul`): each
output tile is computed into a scratch tile and stored with the bias added while it is in L1.
A matmul qualifies when x and W are float32 with static shapes, W is a 2-D constant and x is
not; the bias qualifies when it is a constant of N values (or 1 x ... x N), the matmul's
result has no other use, and `optimize`'s fuse is on (as for the convs' post-ops). Every other
matmul stays on TVM's lowering (rest.py), and the report says why.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..common import parallel
from ..common.targets import float_isa, resolve
from ..matmul import pack_b, packed_matmul
from . import exprs

_MATMUL = tvm.ir.Op.get("relax.matmul")
_ADD = tvm.ir.Op.get("relax.add")


def _why_not(call) -> str | None:
    """Why a matmul call is not ours, or None when it is."""
    x, w = call.args
    if exprs.dtype(x) != "float32" or exprs.dtype(w) != "float32":
        return "not float32"
    out = call.attrs.out_dtype
    if out is not None and str(out) not in ("", "float32", "void"):
        return f"out_dtype {out}"
    xs, ws = exprs.shape(x), exprs.shape(w)
    if xs is None or ws is None:
        return "a symbolic shape"
    if exprs.const(w) is None or len(ws) != 2:
        return "the right operand is not a constant matrix"
    if exprs.const(x) is not None:
        return "both operands are constants"
    if len(xs) < 1 or xs[-1] != ws[0]:
        return f"shapes {xs} x {ws}"
    return None


def _bias(add, mm_var, n: int) -> np.ndarray | None:
    """The N-vector `add` adds to the matmul result `mm_var`, or None."""
    a, b = add.args
    other = b if a.same_as(mm_var) else a if b.same_as(mm_var) else None
    c = exprs.const(other) if other is not None else None
    if c is None or c.dtype != np.float32 or c.size != n or (c.ndim and c.shape[-1] != n):
        return None
    if exprs.shape(add) != exprs.shape(mm_var):  # the bias must not broadcast the result
        return None
    return c.reshape(n)


def _key(mm, bias: bool) -> tuple:
    """(M, N, K, bias): what a matmul call's module depends on."""
    (K, N), xs = exprs.shape(mm.args[1]), exprs.shape(mm.args[0])
    return math.prod(xs[:-1]), N, K, bias


@mutator
class _Linear(PyExprMutator):
    def __init__(self, mod, isa, report: list, fuse: bool = True):
        super().__init__(mod)
        self.isa, self.report, self.fuse = isa, report, fuse
        self.funcs: dict = {}  # (M, N, K, bias) -> (plan, GlobalVar)
        self.fused: dict = {}  # add var -> (matmul call, bias)
        self.skip: set = set()  # matmul vars whose add takes them
        self.ready: dict = {}  # (M, N, K, bias) -> packed_matmul's result, made up front

    def plan(self, func: relax.Function) -> None:
        self._find_biases(func)
        # The distinct modules, scheduled in one process per core as the convs are (parallel.py).
        keys = []
        for blk in func.body.blocks:
            for b in blk.bindings:
                mm = self.fused[b.var][0] if b.var in self.fused else b.value
                if b.var not in self.skip and exprs.is_call(mm, _MATMUL) and not _why_not(mm):
                    keys.append(_key(mm, b.var in self.fused))
        keys = [k for k in dict.fromkeys(keys) if k not in self.ready]
        made = parallel.run([functools.partial(packed_matmul, *k[:3], self.isa, k[3]) for k in keys])
        self.ready.update((k, m) for k, m in zip(keys, made) if m is not None)

    def _find_biases(self, func: relax.Function) -> None:
        if not self.fuse:
            return
        uses = exprs.uses(func)
        for blk in func.body.blocks:
            calls = {b.var: b.value for b in blk.bindings if exprs.is_call(b.value, _MATMUL)}
            for b in blk.bindings:
                if not exprs.is_call(b.value, _ADD):
                    continue
                for arg in b.value.args:
                    mm = calls.get(arg) if isinstance(arg, relax.Var) else None
                    if mm is None or uses.get(arg, 0) != 1 or arg in self.skip or _why_not(mm):
                        continue
                    bias = _bias(b.value, arg, exprs.shape(mm.args[1])[1])
                    if bias is not None:
                        self.fused[b.var] = (mm, bias)
                        self.skip.add(arg)
                        break

    def visit_var_binding_(self, binding):
        if binding.var in self.skip:
            return
        if binding.var in self.fused:
            mm, bias = self.fused[binding.var]
        elif exprs.is_call(binding.value, _MATMUL):
            mm, bias = binding.value, None
            why = _why_not(mm)
            if why:
                self._log(mm, "tvm", why)
                return super().visit_var_binding_(binding)
        else:
            return super().visit_var_binding_(binding)
        value = self._lower(mm, bias)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))

    def _lower(self, mm, bias):
        x = self.visit_expr(mm.args[0])
        w = exprs.const(mm.args[1])
        xs = exprs.shape(mm.args[0])
        K, N = w.shape
        M = math.prod(xs[:-1])
        key = _key(mm, bias is not None)
        made = self.funcs.get(key)
        if made is None:
            p, mod = self.ready.get(key) or packed_matmul(M, N, K, self.isa, bias is not None)
            name = f"mk_matmul_m{M}n{N}k{K}{'_bias' if bias is not None else ''}"
            made = (p, self.builder_.add_func(mod["main"].with_attr("global_symbol", name), name))
            self.funcs[key] = made
        p, gv = made
        rows = x if len(xs) == 2 else self.builder_.emit(relax.op.reshape(x, (M, K)))
        args = [rows, relax.const(pack_b(p, w.astype(np.float32)))]
        if bias is not None:
            args.append(relax.const(np.ascontiguousarray(bias, np.float32)))
        kernel = p.kernel
        self._log(mm, "ours", f"{kernel.mr}x{kernel.nr} tiles{', A packed' if p.pack_a else ''}"
                              f"{', bias fused' if bias is not None else ''}")
        out = relax.call_tir(gv, args, relax.TensorType((M, N), "float32"))
        if len(xs) == 2:
            return out
        return relax.op.reshape(self.builder_.emit(out), (*xs[:-1], N))

    def _log(self, call, where: str, why: str) -> None:
        self.report.append({"op": "matmul", "data": exprs.shape(call.args[0]), "weight": exprs.shape(call.args[1]),
                            "runs_on": where, "reason": why})


def swap_matmuls(mod: tvm.IRModule, target, report: list, fuse: bool = True) -> tvm.IRModule:
    """Each qualifying matmul (and, with fuse, the bias add after it) as a call of our packed matmul."""
    isa = float_isa(resolve(target))
    m = _Linear(mod, isa, report, fuse)
    return exprs.mutate(mod, m, m.plan)
