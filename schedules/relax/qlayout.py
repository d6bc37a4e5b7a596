"""QDQ graphs channels-last: our int8 convs run channels-last between a permute to NHWC and one
back, and `channels_last` moves each permute back through the ops that only move values within
channels or pixels until it meets the next conv's and both go (docs/design/relax.md, QDQ models).
Split from int8.py, which it serves."""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax import PyExprMutator, expr_functor

from . import exprs

_DEQUANTIZE = tvm.ir.Op.get("relax.dequantize")
_QUANTIZE = tvm.ir.Op.get("relax.quantize")
_ADD = tvm.ir.Op.get("relax.add")
_PERMUTE = tvm.ir.Op.get("relax.permute_dims")
TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]
_MAX_POOL = tvm.ir.Op.get("relax.nn.max_pool2d")
_AVG_POOL = tvm.ir.Op.get("relax.nn.avg_pool2d")
_MEAN = tvm.ir.Op.get("relax.mean")
_CONCAT = tvm.ir.Op.get("relax.concat")
_BATCH_NORM = tvm.ir.Op.get("relax.nn.batch_norm")
# Elementwise ops that move channels-last as they are: ReLU, and the activations QDQ models keep
# in float between a DequantizeLinear and a QuantizeLinear (EfficientNet's SiLU as sigmoid and
# multiply, its squeeze-and-excitation scale, MobileNetV3's hardswish and hardsigmoid in parts).
_ELEMENTWISE = {tvm.ir.Op.get(f"relax.{n}") for n in (
    "nn.relu", "sigmoid", "tanh", "exp", "nn.silu", "nn.gelu", "nn.gelu_tanh", "clip", "multiply", "subtract",
    "divide", "maximum", "minimum")}


def _axes(call) -> list[int] | None:
    return [int(a) for a in call.attrs.axes] if exprs.is_call(call, _PERMUTE) and call.attrs.axes is not None else None


@expr_functor.mutator
class _ChannelsLast(PyExprMutator):
    """One sweep: permute_dims(permute_dims(t, TO_NCHW), TO_NHWC) -> t, and an op that only moves
    values within a tensor's channels or pixels (quantize, dequantize, add, relu, max and average
    pools, mean over the pixels, concat along the channels, an inference batch norm) taking `permute_dims(t, TO_NCHW)` for each
    4-D input -> the same op on the channels-last `t`, then one permute back. Repeated, the permutes of our channels-last
    convs meet and cancel across the residual adds and pools between them."""

    def __init__(self, mod):
        super().__init__(mod)
        self.changed = 0

    def _source(self, expr):
        """t where `expr` is (a var bound to) permute_dims(t, TO_NCHW); else None."""
        value = self.lookup_binding(expr) if isinstance(expr, relax.Var) else expr
        return value.args[0] if _axes(value) == TO_NCHW else None

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if _axes(call) == TO_NHWC:
            t = self._source(call.args[0])
            if t is not None:
                self.changed += 1
                return t
            return call
        moved = self._channels_last(call)
        if moved is None:
            return call
        self.changed += 1
        return relax.op.permute_dims(self.builder_.emit(moved), TO_NCHW)

    def visit_tuple_getitem_(self, op):
        """batch_norm(permute_dims(t, TO_NCHW), ..., axis=1)[0] -> the same batch norm on the
        channels-last t (axis=3), then one permute back: DenseNet's BN + ReLU ahead of each conv,
        which no conv's store can take, stays between channels-last joins and convs."""
        op = super().visit_tuple_getitem_(op)
        value = op.tuple_value
        bn = self.lookup_binding(value) if isinstance(value, relax.Var) else value
        if op.index != 0 or not isinstance(bn, relax.Call) or not bn.op.same_as(_BATCH_NORM):
            return op
        a, shape = bn.attrs, exprs.shape(bn.args[0])
        if shape is None or len(shape) != 4 or int(a.axis) not in (1, -3) or bool(a.training):
            return op
        t = self._source(bn.args[0])
        if t is None:
            return op
        moved = relax.op.nn.batch_norm(t, *bn.args[1:], axis=3, epsilon=float(a.epsilon), center=bool(a.center),
                                       scale=bool(a.scale), momentum=float(a.momentum), training=False)
        self.changed += 1
        out = self.builder_.emit(relax.TupleGetItem(self.builder_.emit(moved), 0))
        return relax.op.permute_dims(out, TO_NCHW)

    def _channels_last(self, call):
        if not isinstance(call.op, tvm.ir.Op):
            return None
        if call.op.same_as(_CONCAT):
            return self._concat(call)
        four = [a for a in call.args if exprs.shape(a) is not None and len(exprs.shape(a)) == 4]
        if not four or any(self._source(a) is None for a in four):
            return None
        args = [self._source(a) if a in four else a for a in call.args]
        op, a = call.op, call.attrs
        if op.same_as(_QUANTIZE) or op.same_as(_DEQUANTIZE):
            if any(exprs.shape(x) not in ((), (1,)) for x in call.args[1:]):
                return None  # per-channel scales on activations: keep the axis where it is
            make = relax.op.quantize if op.same_as(_QUANTIZE) else relax.op.dequantize
            return make(args[0], args[1], args[2], axis=3, out_dtype=str(a.out_dtype))
        if op.same_as(_ADD):
            if any(exprs.shape(x) is not None and len(exprs.shape(x)) not in (0, 4) for x in call.args):
                return None
            return relax.op.add(*args)
        if op in _ELEMENTWISE:
            # every 4-D input channels-last (a source); the others single values, which broadcast
            tensors = [x for x in call.args if isinstance(getattr(x, "ty", None), relax.TensorType)]
            if any(exprs.shape(x) is None or (len(exprs.shape(x)) != 4 and math.prod(exprs.shape(x)) != 1)
                   for x in tensors):
                return None
            return relax.Call(op, args, a)
        if (op.same_as(_MAX_POOL) or op.same_as(_AVG_POOL)) and a.layout == "NCHW" and \
                (a.out_layout in (None, "", "NCHW")):
            pool = relax.op.nn.max_pool2d if op.same_as(_MAX_POOL) else relax.op.nn.avg_pool2d
            return pool(args[0], [int(v) for v in a.pool_size], [int(v) for v in a.strides],
                        [int(v) for v in a.padding], [int(v) for v in a.dilation], bool(a.ceil_mode),
                        bool(a.count_include_pad), layout="NHWC", out_layout="NHWC")
        if op.same_as(_MEAN) and a.axis is not None and sorted(int(v) for v in a.axis) == [2, 3]:
            if not a.keepdims:
                return None
            return relax.op.mean(args[0], axis=[1, 2], keepdims=True)
        return None


    def _concat(self, call):
        """concat((permute_dims(t_i, TO_NCHW), ...), axis=1) -> concat((t_i, ...), axis=3):
        Inception's and DenseNet's branches joined channels-last, without a transpose each."""
        parts = call.args[0]
        if isinstance(parts, relax.Var):
            parts = self.lookup_binding(parts)
        if not isinstance(parts, relax.Tuple) or call.attrs.axis is None:
            return None
        shapes = [exprs.shape(p) for p in parts.fields]
        if any(sh is None or len(sh) != 4 for sh in shapes) or int(call.attrs.axis) not in (1, -3):
            return None
        sources = [self._source(p) for p in parts.fields]
        if any(t is None for t in sources):
            return None
        return relax.op.concat(sources, axis=3)


def channels_last(mod: tvm.IRModule, sweeps: int = 64) -> tvm.IRModule:
    """Sweeps of _ChannelsLast until nothing moves, then the permutes nothing reads removed."""
    for _ in range(sweeps):
        mutator = _ChannelsLast(mod)
        mod = exprs.mutate(mod, mutator)
        if not mutator.changed:
            break
    return relax.transform.DeadCodeElimination()(mod)
