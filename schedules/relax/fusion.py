"""Which conv2d we run (classify) and the post-ops that fuse into it (fuse_chain): a bias, a
residual add, ReLU, a clip, hardswish as the torch frontend writes it, and, when
FUSE_VECTOR_ACTIVATIONS is on, the vector math's activations; SplitClips readies clips for
ConvertLayout. conv2d.py swaps what this finds for our kernels."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax
from tvm.ir import GenericConst
from tvm.relax import PyExprMutator, expr_functor

from ..conv.geometry import depthwise
from . import exprs

_ADD = tvm.ir.Op.get("relax.add")
_RELU = tvm.ir.Op.get("relax.nn.relu")
# The vector math's activations a kernel's epilogue applies (microkernels.VECTOR_ACTIVATIONS).
# Not fused by default: measured on the Zen 3 (AVX2), 1 thread, EfficientNet-B0's SiLUs in the
# convs' epilogues made the model slower (15.67 -> 16.13 ms with the fused inverted blocks it
# then pairs, 17.1 ms without them; its 112x112 1x1 conv + SiLU 1.21 ms fused, 1.10 ms as the
# conv and the row kernel): the activation is bound by its arithmetic (0.52 ns a value either
# way), so fusing saves no memory time worth having, and twelve inlined copies per tile (a
# branch each for the near form) cost more than the row kernel's tight loop.
FUSE_VECTOR_ACTIVATIONS = False
_VECTOR_ACTS = {tvm.ir.Op.get(f"relax.{op}"): act for op, act in (
    ("nn.silu", "silu"), ("sigmoid", "sigmoid"), ("nn.gelu", "gelu"), ("nn.gelu_tanh", "gelu_tanh"), ("tanh", "tanh"))}
_CLIP = tvm.ir.Op.get("relax.clip")
_MAX = tvm.ir.Op.get("relax.maximum")
_MIN = tvm.ir.Op.get("relax.minimum")
_MUL = tvm.ir.Op.get("relax.multiply")
_DIVIDE = tvm.ir.Op.get("relax.divide")


@dataclass
class Conv:
    """One conv2d we run, and what is fused into it."""

    call: relax.Call
    blocked: bool  # NCHW16c in and out (else NCHW, our layout transforms around it)
    data_shape: tuple  # NCHW
    weight_shape: tuple  # OIHW
    bias: np.ndarray | None = None  # (O,)
    residual: relax.Expr | None = None
    activation: str | None = None
    clip: tuple[float, float] = (0.0, 6.0)
    skipped: list = field(default_factory=list)  # the fused bindings' vars

    @property
    def depthwise(self) -> bool:  # its kernel fuses bias and an activation, not a residual
        return depthwise(self.data_shape[1], int(self.call.attrs.groups))


def _attrs_ok(a, blocked: bool, block: int) -> bool:
    want = (f"NCHW{block}c", f"OIHW{block}i{block}o", f"NCHW{block}c") if blocked else ("NCHW", "OIHW", "NCHW")
    return (str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) == want and \
        (a.out_dtype is None or str(a.out_dtype) in ("", "float32", "void"))


def _lanes_blocked(a, block: int) -> bool:
    """A depthwise conv, or one of narrow groups on the plain blocked layout, that ConvertLayout
    blocked (pipeline._desired_layouts): its filters as (output blocks, C/groups, kh, kw, block)."""
    return (str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) == \
        (f"NCHW{block}c", f"OIHW{block}o", f"NCHW{block}c") and (a.out_dtype is None or str(a.out_dtype) in ("", "float32", "void"))


def classify(call, block: int) -> tuple[Conv | None, str]:
    """Whether we run this conv2d, and why not when we do not."""
    data, weight = call.args
    a = call.attrs
    ds, ws = exprs.shape(data), exprs.shape(weight)
    if exprs.dtype(data) != "float32" or exprs.dtype(weight) != "float32":
        return None, f"dtype {exprs.dtype(data)}/{exprs.dtype(weight)} (ours: float32)"
    if ds is None or ws is None:
        return None, "shapes not static"
    groups = int(a.groups)
    if len(ds) == 5 and _lanes_blocked(a, block):
        if exprs.const(weight) is None:
            return None, "blocked grouped conv2d whose weights are not constants (bind params)"
        ob, cg, kh, kw, bo = ws
        return Conv(call, True, (ds[0], ds[1] * ds[4], ds[2], ds[3]), (ob * bo, cg, kh, kw)), ""
    if len(ds) == 5 and _attrs_ok(a, True, block):
        ob, _ib, kh, kw, _bi, bo = ws
        c, o = ds[1] * ds[4], ob * bo
        return Conv(call, True, (ds[0], c, ds[2], ds[3]), (o, c // groups, kh, kw)), ""
    if len(ds) == 4 and _attrs_ok(a, False, block):
        # Depthwise and narrow groups (in the lanes, or tiling a block block-diagonally) run on ours,
        # blocked; other groups (RegNetX's 24 channels) with each group padded to whole blocks.
        if exprs.const(weight) is None:
            return None, "NCHW conv2d whose weights are not constants (bind params)"
        return Conv(call, False, ds, ws), ""
    return None, f"layouts {a.data_layout}/{a.kernel_layout}/{a.out_layout}"


def _scalar(expr) -> float | None:
    """A clip bound: a FloatImm/IntImm (bare or in a PrimValue), or a scalar constant tensor."""
    if type(expr).__name__ == "PrimValue":
        expr = expr.value
    if isinstance(getattr(expr, "value", None), (int, float)) and not isinstance(expr, GenericConst):
        return float(expr.value)
    v = exprs.const(expr)
    return float(v) if v is not None and v.size == 1 else None


def _bias_vector(expr, conv: Conv, block: int) -> np.ndarray | None:
    """(O,) when `expr` is a constant that adds one value per output channel."""
    v = exprs.const(expr)
    if v is None or v.dtype != np.float32:
        return None
    o = conv.weight_shape[0]
    if conv.blocked:
        ob = -(-o // block)
        if v.shape in ((1, ob, 1, 1, block), (ob, 1, 1, block)):
            return v.reshape(ob * block)[:o]
        return None
    if v.shape in ((1, o, 1, 1), (o, 1, 1)):
        return v.reshape(o)
    return None


def _winograd_candidate(conv: Conv) -> bool:
    """A layer algorithm="auto" may give Winograd (3x3, stride 1, no dilation, one group), whose
    output transform applies ReLU and clips only: a vector-math activation after it stays a
    row kernel of its own rather than turn the layer direct."""
    a = conv.call.attrs
    return (conv.weight_shape[2:] == (3, 3) and [int(v) for v in a.strides] == [1, 1]
            and [int(v) for v in a.dilation] == [1, 1] and int(a.groups) == 1)


def fuse_chain(conv: Conv, var, users: dict, uses: dict, block: int, claimed, algorithm: str = "auto") -> relax.Var:
    """Extend `conv` along its single-user chain of post-ops; return the chain's last var.
    A binding another conv's chain has taken (the add joining two conv branches) stops it."""
    cur = var
    vector_acts = algorithm == "direct" or not _winograd_candidate(conv)
    while uses.get(cur, 0) == 1 and cur in users:
        nxt, value = users[cur]
        if nxt in claimed:
            break
        act = next((a for op, a in _VECTOR_ACTS.items() if exprs.is_call(value, op)), None)
        if act is not None and conv.activation is None and vector_acts and FUSE_VECTOR_ACTIVATIONS:
            conv.activation = act
            conv.skipped.append(cur)
            cur = nxt
            continue
        if exprs.is_call(value, _ADD) and conv.residual is None and conv.activation is None:
            a, b = value.args
            other = b if a.same_as(cur) else a if b.same_as(cur) else None
            if other is None or other.same_as(cur):
                break
            bias = _bias_vector(other, conv, block)
            if bias is not None and conv.bias is None:
                conv.bias = bias
            elif (exprs.shape(other) == exprs.shape(cur) and exprs.dtype(other) == "float32" and exprs.const(other) is None
                  and not conv.depthwise):
                conv.residual = other
            else:
                break
        elif exprs.is_call(value, _RELU) and conv.activation is None:
            conv.activation = "relu"
        elif exprs.is_call(value, _MAX) and conv.activation is None and _scalar(value.args[1]) is not None:
            # A clip arrives as maximum then minimum (_split_clips); a bare maximum with 0 is a ReLU.
            lo = _scalar(value.args[1])
            after = users.get(nxt) if uses.get(nxt, 0) == 1 else None
            hi = _scalar(after[1].args[1]) if after and exprs.is_call(after[1], _MIN) and after[0] not in claimed else None
            if hi is not None and lo < hi:
                conv.activation, conv.clip = "clip", (lo, hi)
                conv.skipped.append(cur)
                cur = nxt
                nxt = after[0]
            elif lo == 0.0:
                conv.activation = "relu"
            else:
                break
        else:
            break
        conv.skipped.append(cur)
        cur = nxt
    end = _hardswish(conv, cur, users, uses, claimed) if vector_acts else None
    return cur if end is None else end


# hardswish as the torch frontend writes it, x * (clip(x + 3, 0, 6) / 6) with the clip split
# (SplitClips): the ops from x to the divide, each with its constant.
_HARDSWISH = ((_ADD, 3.0), (_MAX, 0.0), (_MIN, 6.0), (_DIVIDE, 6.0))


def _hardswish(conv: Conv, cur, users: dict, uses: dict, claimed) -> relax.Var | None:
    """The var of `cur * (clip(cur + 3, 0, 6) / 6)` (MobileNetV3's hardswish after a conv), whose
    chain then joins conv's post-ops as activation "hardswish"; None where cur is not so used.
    Four cheap operations a vector: fused, they spare a pass over the map (the vector math's
    SiLU or GELU, bound by their arithmetic, do not pay so: FUSE_VECTOR_ACTIVATIONS)."""
    if conv.activation is not None or uses.get(cur, 0) != 2:
        return None
    chain, v = [], cur
    for op, k in _HARDSWISH:
        nxt, value = users.get(v, (None, None))
        if nxt is None or nxt in claimed or not exprs.is_call(value, op) or not value.args[0].same_as(v) \
                or _scalar(value.args[1]) != k or uses.get(nxt, 0) != 1:
            return None
        chain.append(v)
        v = nxt
    end, value = users.get(v, (None, None))
    if end is None or end in claimed or not exprs.is_call(value, _MUL):
        return None
    a, b = value.args
    if not ((a.same_as(cur) and b.same_as(v)) or (a.same_as(v) and b.same_as(cur))):
        return None
    conv.activation = "hardswish"
    conv.skipped.extend(chain + [v])
    return end


@expr_functor.mutator
class SplitClips(PyExprMutator):
    """clip(x, lo, hi) with constant bounds -> minimum(maximum(x, lo), hi). ConvertLayout has no
    layout rule for clip and would un-block the tensor around it; it carries these two
    elementwise ops through the blocked layout, and the fusion folds them back into a clip."""

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not exprs.is_call(call, _CLIP) or exprs.dtype(call.args[0]) != "float32":
            return call
        lo, hi = (_scalar(b) for b in call.args[1:])
        if lo is None or hi is None:
            return call
        x = call.args[0]
        low = self.builder_.emit(relax.op.maximum(x, relax.const(np.float32(lo))))
        return relax.op.minimum(low, relax.const(np.float32(hi)))
