"""Inference batch norm folded away at compile time, so that a model exported from PyTorch with
nn.BatchNorm2d reaches `optimize` as the same graph as one whose batch norms were folded by hand.

`fold_batch_norm(mod)` rewrites each `R.nn.batch_norm` with training=False whose gamma, beta,
mean and variance are constants (bind params first; or dequantized constants, as a QDQ model's
are), and whose tuple is only read through
[0], with s = gamma / sqrt(var + eps) and shift = beta - mean * s (center=False: no beta,
scale=False: gamma = 1), computed in float64 and rounded once to float32:
  - conv2d(x, W) -> [add(per-output-channel constant b)] -> batch_norm -> [0], where the conv is
    NCHW/OIHW/NCHW float32 with constant weights (any groups, depthwise included) and each
    intermediate value has no other user, becomes conv2d(x, W * s[:, None, None, None]) +
    (shift + b * s) as a (1, O, 1, 1) constant: the bias add `optimize` fuses into the conv;
  - any other such batch_norm (at the input, after an add, after a conv whose output something
    else reads too) becomes x * s + shift with s and shift shaped to broadcast along the axis:
    two elementwise ops with constants, which ConvertLayout carries through blocked layouts.
Left as they are, with the reason logged on the "tvm_microkernels.relax" logger: training=True
(batch statistics), statistics that are not constants, data that is not float32, a tuple whose
[1]/[2] (the running statistics) or whole is read, or [0] read in another binding block.
TVM 0.27's own FoldBatchnormToConv2D segfaults, and DecomposeOpsForInference + FoldConstant
leaves four elementwise ops behind each conv, which is why this pass exists.
"""

from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax
from tvm.relax import PyExprMutator, expr_functor

from . import exprs

__all__ = ["fold_batch_norm"]

LOG = logging.getLogger("tvm_microkernels.relax")

_BATCH_NORM = tvm.ir.Op.get("relax.nn.batch_norm")
_CONV2D = tvm.ir.Op.get("relax.nn.conv2d")
_ADD = tvm.ir.Op.get("relax.add")
_RESHAPE = tvm.ir.Op.get("relax.reshape")
_DEQUANTIZE = tvm.ir.Op.get("relax.dequantize")


class _Function:
    """What the plan needs to know about one function: where each var is bound, who reads it."""

    def __init__(self, func: relax.Function):
        self.uses = exprs.uses(func)
        self.values: dict = {}  # var -> bound value
        self.block: dict = {}  # var -> index of its binding block
        self.readers: dict = {}  # var -> [binding that reads it]
        for i, blk in enumerate(func.body.blocks):
            for b in blk.bindings:
                self.values[b.var], self.block[b.var] = b.value, i
                for v in relax.analysis.free_vars(b.value):
                    self.readers.setdefault(v, []).append(b)
        self.result_vars = set(relax.analysis.free_vars(func.body.body))

    def const(self, expr) -> np.ndarray | None:
        """The value of a constant, or of a var bound to a reshape of one (PyTorch's imported
        conv biases are `reshape(constant, (1, O, 1, 1))`, and FoldConstant has not run yet), or
        to a dequantize of constants (a QDQ model's batch norm: quantize_static quantizes its
        gamma and beta too), (q - zero point) * scale along the dequantize's axis, in float32
        as DequantizeLinear computes it."""
        v = exprs.const(expr)
        if v is not None:
            return v
        value = self.values.get(expr) if isinstance(expr, relax.Var) else None
        if exprs.is_call(value, _RESHAPE) and exprs.shape(value) is not None:
            inner = self.const(value.args[0])
            return None if inner is None else inner.reshape(exprs.shape(value))
        if exprs.is_call(value, _DEQUANTIZE) and str(value.attrs.out_dtype) == "float32":
            q, scale, zp = (self.const(a) for a in value.args)
            if q is None or scale is None or zp is None or q.ndim != 1 or scale.size not in (1, q.size) \
                    or zp.size not in (1, q.size):
                return None
            diff = (q.astype(np.int64) - zp.astype(np.int64).reshape(-1)).astype(np.float32)
            return diff * scale.astype(np.float32).reshape(-1)
        return None

    def sole_reader(self, var):
        """The one binding that reads `var`, when that is its only use (the result counts)."""
        readers = self.readers.get(var, [])
        return readers[0] if self.uses.get(var, 0) == 1 and len(readers) == 1 else None


class _Fold:
    """One batch_norm that is rewritten, and into what."""

    def __init__(self, data, scale: np.ndarray, shift: np.ndarray, axis: int, rank: int):
        self.data, self.scale, self.shift, self.axis, self.rank = data, scale, shift, axis, rank
        self.conv: relax.Call | None = None  # folded into this conv2d's weights, when set
        self.weight: np.ndarray | None = None  # its weights (OIHW)
        self.bias: np.ndarray | None = None  # (O,): the conv's bias add, folded too
        self.replaced = None  # the var holding the result once emitted


def _statistics(call, fn: _Function) -> tuple[tuple[np.ndarray, np.ndarray] | None, str]:
    """(s, shift) in float64, or None and why the batch_norm cannot be folded."""
    a = call.attrs
    if bool(getattr(a, "training", False)):
        return None, "training=True (normalizes with the batch's own statistics)"
    if exprs.dtype(call.args[0]) != "float32":
        return None, f"dtype {exprs.dtype(call.args[0])} (float32 only)"
    names = ("gamma", "beta", "mean", "variance")
    values = [fn.const(e) for e in call.args[1:]]
    missing = [n for n, v in zip(names, values) if v is None]
    if missing:
        return None, f"{'/'.join(missing)} not constants (bind params first)"
    if any(v.ndim != 1 or v.shape != values[0].shape or v.dtype.kind != "f" for v in values):
        return None, f"statistics of shapes {[v.shape for v in values]} (want one float vector per channel)"
    gamma, beta, mean, var = (v.astype(np.float64) for v in values)
    s = 1.0 / np.sqrt(var + float(a.epsilon))
    if bool(getattr(a, "scale", True)):
        s = s * gamma
    shift = -mean * s
    if bool(getattr(a, "center", True)):
        shift = shift + beta
    return (s, shift), ""


def _bias(expr, o: int, fn: _Function) -> np.ndarray | None:
    """(O,) when `expr` adds one float32 value per output channel of an NCHW tensor: (1, O, 1, 1)
    or (O, 1, 1), not (O,), which broadcasts along the width."""
    v = fn.const(expr)
    if v is None or v.dtype != np.float32 or v.ndim > 4:
        return None
    try:
        if np.broadcast_shapes(v.shape, (1, o, 1, 1)) != (1, o, 1, 1):
            return None
    except ValueError:
        return None
    return np.broadcast_to(v, (1, o, 1, 1)).reshape(o)


def _conv_refusal(conv, o: int, fn: _Function) -> str:
    """Why this conv2d cannot take the batch norm into its weights ("" when it can)."""
    a = conv.attrs
    if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) != ("NCHW", "OIHW", "NCHW"):
        return f"the conv2d is {a.data_layout}/{a.kernel_layout}/{a.out_layout} (folds NCHW/OIHW/NCHW)"
    if exprs.dtype(conv.args[0]) != "float32" or exprs.dtype(conv) != "float32":
        return f"the conv2d is {exprs.dtype(conv.args[0])} -> {exprs.dtype(conv)} (folds float32)"
    w = fn.const(conv.args[1])
    if w is None:
        return "the conv2d's weights are not constants"
    if w.dtype != np.float32 or w.ndim != 4 or w.shape[0] != o:
        return f"the conv2d's weights are {w.dtype} {w.shape} for {o} channels"
    return ""


def _conv_chain(fold: _Fold, block: int, fn: _Function) -> tuple[list, str]:
    """Sets fold.conv, .weight (and .bias) when the batch norm's input is conv2d -> [bias add]
    with no other user; returns the vars whose bindings go with it, or why not."""
    var = fold.data
    if not isinstance(var, relax.Var) or var not in fn.values:
        return [], "its input is not a conv2d output"
    if fold.axis != 1 or fold.rank != 4:
        return [], f"axis {fold.axis} of a rank-{fold.rank} tensor (folds axis 1 of NCHW into a conv2d)"
    o = fold.scale.shape[0]
    chain, value, bias = [var], fn.values[var], None
    if not (exprs.is_call(value, _CONV2D) or exprs.is_call(value, _ADD)):
        return [], "its input is not a conv2d output"
    if fn.sole_reader(var) is None or fn.block[var] != block:
        return [], f"its input (the {value.op.name[6:]}'s output) has other users"
    if exprs.is_call(value, _ADD):
        for conv_var, bias_expr in (value.args, value.args[::-1]):
            if isinstance(conv_var, relax.Var) and exprs.is_call(fn.values.get(conv_var), _CONV2D):
                bias = _bias(bias_expr, o, fn)
                if bias is not None:
                    break
        if bias is None:
            return [], "its input is an add, not of a conv2d and a per-channel constant"
        if fn.sole_reader(conv_var) is None or fn.block[conv_var] != block:
            return [], "its conv2d's output has other users"
        chain.append(conv_var)
        # The bias's own reshape goes with the add when nothing else reads it.
        if isinstance(bias_expr, relax.Var) and fn.sole_reader(bias_expr) is not None:
            chain.append(bias_expr)
        value = fn.values[conv_var]
    if not exprs.is_call(value, _CONV2D):
        return [], "its input is not a conv2d output"
    why = _conv_refusal(value, o, fn)
    if why:
        return [], why
    fold.conv, fold.weight, fold.bias = value, fn.const(value.args[1]), bias
    return chain, ""


def _plan_one(binding, block: int, fn: _Function) -> tuple[_Fold | None, list, str]:
    """Whether and how one batch_norm binding folds: (fold, vars it takes along, reason)."""
    call, var = binding.value, binding.var
    stats, why = _statistics(call, fn)
    if stats is None:
        return None, [], why
    readers = fn.readers.get(var, [])
    if var in fn.result_vars or any(not isinstance(r.value, relax.TupleGetItem) for r in readers):
        return None, [], "its output tuple is used as a whole"
    if any(int(r.value.index) != 0 for r in readers):
        return None, [], "its running mean/variance outputs ([1]/[2]) are used"
    if not readers:
        return None, [], "its result is unused"
    if any(fn.block[r.var] != block for r in readers):
        return None, [], "its [0] is read in another binding block"
    data = call.args[0]
    ty = data.ty
    rank = int(ty.ndim) if isinstance(ty, relax.TensorType) else -1
    if rank < 2:
        return None, [], f"rank {rank} input (want a known rank of at least 2)"
    axis = int(call.attrs.axis) % rank
    s, shift = stats
    channels = exprs.shape(data)[axis] if exprs.shape(data) is not None else None
    if channels is not None and channels != s.shape[0]:
        return None, [], f"{s.shape[0]} statistics for {channels} channels"
    fold = _Fold(data, s, shift, axis, rank)
    taken, why = _conv_chain(fold, block, fn)
    return fold, taken, why


@expr_functor.mutator
class _FoldBatchNorm(PyExprMutator):
    def __init__(self, mod, report: list):
        super().__init__(mod)
        self.report = report
        self.folds: dict = {}  # batch_norm var -> _Fold
        self.skip: set = set()  # vars whose bindings are dropped (the batch_norm, its conv chain)

    def plan(self, func: relax.Function) -> None:
        fn = _Function(func)
        for i, blk in enumerate(func.body.blocks):
            for b in blk.bindings:
                if not exprs.is_call(b.value, _BATCH_NORM):
                    continue
                fold, taken, why = _plan_one(b, i, fn)
                where = None if fold is None else "conv2d" if fold.conv is not None else "scale_shift"
                if fold is not None:
                    self.folds[b.var] = fold
                    self.skip.update([b.var, *taken])
                if fold is not None and fold.conv is not None:
                    why = f"conv2d groups={int(fold.conv.attrs.groups)}{'' if fold.bias is None else ' with its bias'}"
                entry = {"folded_into": where, "reason": why, "shape": exprs.shape(b.value.args[0])}
                self.report.append(entry)
                LOG.info("batch_norm %s: %s (%s)", entry["shape"], where or "left as it is", why)

    def visit_var_binding_(self, binding):
        if binding.var in self.skip:
            return
        value = binding.value
        fold = self.folds.get(value.tuple_value) if isinstance(value, relax.TupleGetItem) else None
        if fold is None:
            return super().visit_var_binding_(binding)
        if fold.replaced is None:
            # The first [0] carries the result under its own name; any other [0] aliases it.
            self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(self._lower(fold))))
            fold.replaced = binding.var
        else:
            self.builder_.emit_normalized(relax.VarBinding(binding.var, fold.replaced))

    def _lower(self, fold: _Fold) -> relax.Expr:
        if fold.conv is not None:
            conv = fold.conv
            weight = (fold.weight.astype(np.float64) * fold.scale[:, None, None, None]).astype(np.float32)
            shift = fold.shift if fold.bias is None else fold.shift + fold.bias.astype(np.float64) * fold.scale
            o = weight.shape[0]
            x = self.visit_expr(conv.args[0])
            y = self.builder_.emit(relax.Call(conv.op, [x, relax.const(weight)], conv.attrs))
            return relax.op.add(y, relax.const(shift.astype(np.float32).reshape(1, o, 1, 1)))
        shape = [1] * fold.rank
        shape[fold.axis] = fold.scale.shape[0]
        x = self.visit_expr(fold.data)
        y = self.builder_.emit(relax.op.multiply(x, relax.const(fold.scale.astype(np.float32).reshape(shape))))
        return relax.op.add(y, relax.const(fold.shift.astype(np.float32).reshape(shape)))


def fold_batch_norm(mod: tvm.IRModule, report: list | None = None) -> tvm.IRModule:
    """The module doc's rewrite on every Relax function of `mod` (bind params before it).
    `report`, when given a list, receives one dict per batch_norm: "folded_into" ("conv2d",
    "scale_shift" or None when left as it is), "reason" and the input's "shape"."""
    mutator = _FoldBatchNorm(mod, [] if report is None else report)
    return exprs.mutate(mod, mutator, mutator.plan)
