"""Channel counts padded to whole blocks before ConvertLayout: a float32 conv2d whose outputs are
not a whole number of blocks (MobileNetV3's 40, 72, 120, 184, 200; EfficientNet's 24, 40, 112;
a squeeze-and-excitation's 8 or 20) computes `block`-rounded outputs from zero filters and zero
bias, and the padded tensor flows on through every op that treats channels one by one, up to the
convs that read it, whose weights get zero input channels to match. ConvertLayout then blocks the
whole region (it blocks only whole blocks), so no layout transform is left between two of our
convs whatever their channel counts, and the ops between them (hardswish's chain, the
squeeze-and-excitation's pool, gate and scale) run on the blocked tensor.

The padding channels hold finite values that nothing reads: each consumer conv's weights are
zero there. Finite because only these ops carry them (their inputs finite, their outputs too):
  - conv2d (groups 1; grouped and depthwise convs where the padding is whole groups, which get
    zero filters: RegNetY's 8 channels a group on 104 padded to 112);
  - relu, clip, sigmoid, SiLU, GELU, tanh, leaky ReLU, negative, abs;
  - add, subtract, multiply, maximum, minimum with a scalar, a per-channel constant (padded with
    0), another padded tensor, or an unpadded one of the same channels (padded with zeros, one
    copy: the model's input as a residual); divide by a scalar or a per-channel constant or an
    unpadded tensor (padded with 1);
  - max and average pools, adaptive average pool, and a mean over the spatial axes.
Every other use (a reshape, a concat, a matmul, exp, the function's result) reads the real
channels through a strided_slice, once per padded value: at worst the slice the conv's own
layout transform would have made."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax import PyExprMutator, expr_functor

from . import exprs

_CONV2D = tvm.ir.Op.get("relax.nn.conv2d")
_UNARY = tuple(tvm.ir.Op.get(f"relax.{n}") for n in (
    "nn.relu", "clip", "sigmoid", "nn.silu", "nn.gelu", "nn.gelu_tanh", "tanh", "nn.leakyrelu", "negative", "abs"))
# Binary ops whose padding channels stay finite, and the value a per-channel constant is padded with.
_BINARY = {tvm.ir.Op.get(f"relax.{n}"): pad for n, pad in (
    ("add", 0.0), ("subtract", 0.0), ("multiply", 0.0), ("maximum", 0.0), ("minimum", 0.0), ("divide", 1.0))}
_DIVIDE = tvm.ir.Op.get("relax.divide")
_POOLS = tuple(tvm.ir.Op.get(f"relax.nn.{n}") for n in ("max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"))
_MEAN = tvm.ir.Op.get("relax.mean")
_RESHAPE = tvm.ir.Op.get("relax.reshape")


def pad_channels(mod: tvm.IRModule, block: int) -> tvm.IRModule:
    """The module doc's padding on every Relax function of `mod`."""
    mutator = _Pad(mod, block)
    return exprs.mutate(mod, mutator, mutator.prepare)


def _rounded(c: int, block: int) -> int:
    return -(-c // block) * block


def _nchw(expr) -> tuple | None:
    """A float32 4-d tensor's static shape, else None."""
    s = exprs.shape(expr)
    return s if s is not None and len(s) == 4 and exprs.dtype(expr) == "float32" else None


def _pad_axis(a: np.ndarray, axis: int, size: int, value: float = 0.0) -> np.ndarray:
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, size - a.shape[axis])
    return np.pad(a, widths, constant_values=np.asarray(value, a.dtype))


@expr_functor.mutator
class _Pad(PyExprMutator):
    def __init__(self, mod, block: int):
        super().__init__(mod)
        self.block = block
        self.results: list = []  # calls bound to a function's output vars: never padded
        self.slices: dict = {}  # padded value -> its real channels' slice

    def prepare(self, func: relax.Function) -> None:
        self.slices = {}
        # What leaves the function (or a dataflow block) keeps its shape: the calls bound to the
        # vars its result names, and to a dataflow block's outputs.
        returned = relax.analysis.free_vars(func.body.body)
        self.results = [b.value for blk in func.body.blocks for b in blk.bindings if isinstance(b.value, relax.Call) and (
            any(b.var.same_as(v) for v in returned)
            or (isinstance(blk, relax.DataflowBlock) and not isinstance(b.var, relax.DataflowVar)))]

    def _real(self, new, old) -> int | None:
        """The real channel count of `new`, the visited form of `old`, when it is padded."""
        s_old, s_new = _nchw(old), _nchw(new)
        return s_old[1] if s_old and s_new and s_new[1] != s_old[1] else None

    def _sliced(self, new, channels: int):
        for key, value in self.slices.items():
            if key.same_as(new):
                return value
        out = self.builder_.emit(relax.op.strided_slice(new, axes=[1], begin=[0], end=[channels]))
        self.slices[new] = out
        return out

    def visit_tuple_(self, tup):
        new = super().visit_tuple_(tup)
        fields = [self._sliced(n, c) if (c := self._real(n, o)) else n for n, o in zip(new.fields, tup.fields)]
        return relax.Tuple(fields) if any(not a.same_as(b) for a, b in zip(fields, new.fields)) else new

    def visit_call_(self, call):
        if not isinstance(call.op, tvm.ir.Op):
            return super().visit_call_(call)
        # Not the base visitor's: it infers the call's type with the new arguments, which a
        # per-channel constant beside a padded tensor fails before it can be padded.
        new = relax.Call(call.op, [self.visit_expr(a) for a in call.args], call.attrs, call.ty_args)
        real = [self._real(n, o) for n, o in zip(new.args, call.args)]
        out = None
        if exprs.is_call(new, _CONV2D):
            out = self._conv(new, real)
        elif any(real):
            out = self._carried(new, real)
        if out is None:  # every padded argument read through its slice
            args = [self._sliced(a, c) if c else a for a, c in zip(new.args, real)]
            out = relax.Call(new.op, args, new.attrs, new.ty_args) if any(real) else new
        if any(call.same_as(r) for r in self.results):
            s, out = _nchw(call), self.builder_.normalize(out)  # typed: a call made here is not yet
            if s and _nchw(out) and _nchw(out)[1] != s[1]:
                out = relax.op.strided_slice(self.builder_.emit(out), axes=[1], begin=[0], end=[s[1]])
        return out

    def _const(self, x) -> np.ndarray | None:
        """x's value when it is a constant or a var bound to a reshape of one (the importer's
        bias, before FoldConstant)."""
        v = exprs.const(x)
        if v is None and isinstance(x, relax.Var):
            bound = self.lookup_binding(x)
            if exprs.is_call(bound, _RESHAPE) and exprs.shape(bound) is not None:
                inner = exprs.const(bound.args[0])
                v = None if inner is None else inner.reshape(exprs.shape(bound))
        return v

    def _conv(self, new, real):
        """conv2d with its weights padded to what it reads and what it writes; None: not ours to pad."""
        data, weight = new.args
        w, a = exprs.const(weight), new.attrs
        shape = _nchw(data)
        if (w is None or shape is None or w.dtype != np.float32 or w.ndim != 4
                or (str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) != ("NCHW", "OIHW", "NCHW")):
            return None
        groups, c_in, o = int(a.groups), shape[1], w.shape[0]
        if groups == 1:
            if real[0]:
                w = _pad_axis(w, 1, c_in)
            if o % self.block == 0 and not real[0]:
                return new
            w = _pad_axis(w, 0, _rounded(o, self.block))
            return relax.op.nn.conv2d(data, relax.const(w), a.strides, a.padding, a.dilation, 1,
                                      "NCHW", "OIHW", "NCHW", a.out_dtype)
        if not real[0] or real[0] % groups or o % groups:
            return None
        # Grouped (depthwise too): the padding as whole groups of zero filters, where it is.
        cg, og = real[0] // groups, o // groups
        if (c_in - real[0]) % cg or (c_in // cg) * og != _rounded(o, self.block):
            return None
        w = _pad_axis(w, 0, (c_in // cg) * og)
        return relax.op.nn.conv2d(data, relax.const(w), a.strides, a.padding, a.dilation, c_in // cg,
                                  "NCHW", "OIHW", "NCHW", a.out_dtype)

    def _carried(self, new, real):
        """`new` on padded channels where the op keeps them finite (module doc); None: not so."""
        op = new.op
        if any(op.same_as(u) for u in _UNARY):
            return new if not any(real[1:]) and not any(isinstance(x.ty, relax.TensorType) for x in new.args[1:]) \
                else None
        if any(op.same_as(p) for p in _POOLS):
            return new if str(new.attrs.layout) == "NCHW" and str(new.attrs.out_layout) == "NCHW" else None
        if op.same_as(_MEAN):
            axes = [int(x) % 4 for x in new.attrs.axis] if new.attrs.axis is not None else []
            return new if axes and set(axes) <= {2, 3} else None
        pad = next((v for k, v in _BINARY.items() if op.same_as(k)), None)
        if pad is None:
            return None
        channels = next(c for c in real if c)
        padded = _nchw(new.args[real.index(channels)])[1]
        args = []
        for x, c in zip(new.args, real):
            if c is not None:
                args.append(x)
                continue
            v, s = self._const(x), exprs.shape(x)
            if s is None or len(s) < 3:  # a scalar, or a broadcast along the spatial axes
                args.append(x)
            elif v is not None and s[len(s) - 3] == channels:  # per channel (a bias of 1 channel too)
                args.append(relax.const(_pad_axis(v, len(s) - 3, padded, pad)))
            elif s[len(s) - 3] == 1 and channels > 1:  # the same value for every channel
                args.append(x)
            elif len(s) == 4 and s[1] == channels and v is None:
                # The same channels, unpadded (the model's input as a residual): padded here, one
                # copy, where the blocked layout needs one anyway.
                args.append(self.builder_.emit(relax.op.nn.pad(x, [0, 0, 0, padded - channels, 0, 0, 0, 0],
                                                               pad_value=pad)))
            else:  # the real channels of a tensor: the padded one is sliced
                return None
        if op.same_as(_DIVIDE) and real[1] is not None:  # 0 / 0 in the padding
            return None
        return relax.Call(op, args, new.attrs, new.ty_args)
