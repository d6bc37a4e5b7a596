"""Quantized channel concats (Inception's and DenseNet's joins) as one function of ours.

A QDQ graph joins branches as QuantizeLinear(Concat(DequantizeLinear(x_i, s_i, z_i), ...)):
each branch back to float32, concatenated, quantized again at the join's own scale. After the
conv pass moves it channels-last (qlayout.channels_last), TVM's lowering of that chain reads, per
output value, every branch under a select (`if_then_else` on the channel), which does not
vectorize: 2.7 ns a value on GoogLeNet's first join, a third of a 1x1 conv's time. Here each
branch is its own loop nest writing its slice of the output's channels, vectorized along them and
parallel over the pixels, with ONNX's arithmetic per value:

    q = saturate(round_half_even(float32(x - z_i) * s_i / s_o) + z_o)

(float32, as DequantizeLinear then QuantizeLinear compute it). Branches already at the join's
scale and zero point are copied.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax import PyExprMutator, expr_functor

from microkernels.int_gemm import out_range
from microkernels.int_requant import OUT_RANGE

from ..common.tir import parse
from . import exprs

_QUANTIZE = tvm.ir.Op.get("relax.quantize")
_DEQUANTIZE = tvm.ir.Op.get("relax.dequantize")
_CONCAT = tvm.ir.Op.get("relax.concat")


def _bound(mutator, expr):
    return mutator.lookup_binding(expr) if isinstance(expr, relax.Var) else expr


def concat_func(shapes: list[tuple], dtype: str, quant: list[tuple], out_q: tuple):
    """The PrimFunc of one join: inputs of `shapes` (NHWC, `dtype`), each with its (scale, zero
    point), concatenated along the channels into one output at `out_q`."""
    n, h, w = shapes[0][:3]
    p, total = n * h * w, sum(s[3] for s in shapes)
    lo, hi = out_range(dtype)
    so, zo = out_q
    params = [f"X{i}: T.Buffer({tuple(s)}, '{dtype}')" for i, s in enumerate(shapes)]
    lines = ["@T.prim_func(s_tir=True)", f"def main({', '.join(params)}, Out: T.Buffer(({n}, {h}, {w}, {total}), '{dtype}')):",
             "    T.func_attr({'tirx.noalias': True})",
             f"    O = T.decl_buffer(({p}, {total}), '{dtype}', data=Out.data)"]
    lines += [f"    F{i} = T.decl_buffer(({p}, {s[3]}), '{dtype}', data=X{i}.data)" for i, s in enumerate(shapes)]
    lines.append(f"    for p in T.parallel({p}):")
    offset = 0
    for i, (s, (si, zi)) in enumerate(zip(shapes, quant)):
        x = f"F{i}[vp, vc]"
        if (np.float32(si), int(zi)) == (np.float32(so), int(zo)):
            value = x
        else:
            real = f"T.Cast('float32', T.Cast('int32', {x}) - T.int32({int(zi)})) * T.float32({float(np.float32(si))!r})"
            q = f"T.round({real} / T.float32({float(np.float32(so))!r})) + T.float32({int(zo)})"
            value = f"T.Cast('{dtype}', T.Cast('int32', T.max(T.min({q}, T.float32({hi})), T.float32({lo}))))"
        lines += [f"        for c in T.vectorized({s[3]}):", f"            with T.sblock('branch{i}'):",
                  "                vp, vc = T.axis.remap('SS', [p, c])", f"                O[vp, {offset} + vc] = {value}"]
        offset += s[3]
    return parse(lines).with_attr("tir.is_scheduled", True)


@expr_functor.mutator
class _QuantizedConcats(PyExprMutator):
    """quantize(concat((dequantize(x_i, s_i, z_i), ...), axis=3), s_o, z_o) on 4-D 8-bit x_i of
    the output's dtype, per-tensor constants -> one call of `concat_func`."""

    def __init__(self, mod, report: list):
        super().__init__(mod)
        self.report, self.count = report, 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not exprs.is_call(call, _QUANTIZE):
            return call
        cat = _bound(self, call.args[0])
        if not exprs.is_call(cat, _CONCAT) or cat.attrs.axis is None or int(cat.attrs.axis) not in (3, -1):
            return call
        parts = _bound(self, cat.args[0])
        if not isinstance(parts, relax.Tuple):
            return call
        dtype = str(call.attrs.out_dtype)
        out_q = (exprs.scalar_const(call.args[1]), exprs.scalar_const(call.args[2]))
        xs, quant = [], []
        for part in parts.fields:
            dq = _bound(self, part)
            if not exprs.is_call(dq, _DEQUANTIZE):
                return call
            x, q = dq.args[0], (exprs.scalar_const(dq.args[1]), exprs.scalar_const(dq.args[2]))
            shape = exprs.shape(x)
            if shape is None or len(shape) != 4 or exprs.dtype(x) != dtype or None in q:
                return call
            xs.append(x)
            quant.append(q)
        if dtype not in OUT_RANGE or None in out_q or len({exprs.shape(x)[:3] for x in xs}) != 1:
            return call
        shapes = [exprs.shape(x) for x in xs]
        name = f"mk_qconcat_{self.count}"
        self.count += 1
        func = concat_func(shapes, dtype, quant, out_q).with_attr("global_symbol", name).with_attr("op_pattern", 8)
        gv = self.builder_.add_func(func, name)
        self.report.append({"op": "concat", "runs_on": "ours", "reason": f"{len(xs)} 8-bit branches joined "
                            "channels-last, each requantized into its slice (qconcat)"})
        out = relax.TensorType((*shapes[0][:3], sum(s[3] for s in shapes)), dtype)
        return relax.call_tir(gv, xs, out)


def quantized_concats(mod: tvm.IRModule, report: list) -> tvm.IRModule:
    """Every channels-last quantized concat of `mod` as one function of ours (module doc)."""
    mutator = _QuantizedConcats(mod, report)
    mod = exprs.mutate(mod, mutator)
    return relax.transform.DeadCodeElimination()(mod) if mutator.count else mod
