"""Quantized conv2d at the graph level: a Relax pass that turns an 8-bit conv2d into an int16 one.

`conv2d_int8` computes out[n, o, y, x] = sum (x_in - zp_x) * (w - zp_w) in int32 by upcasting at
the schedule: its pack stage widens the data to int16 and subtracts the zero point while laying
it out, and the weights stay int8 in the model until `pack_weights` widens them. This module is
the other design point. `legalize_int8_conv2d(zp_x, zp_w)` is a module pass that rewrites, in
every Relax function,

    R.nn.conv2d(x, W, <attrs>, out_dtype="int32")        x: int8/uint8, W: int8/uint8 constant
into
    R.nn.conv2d(R.subtract(R.astype(x, "int16"), R.const(zp_x, "int16")),
                R.const(W.astype(int16) - zp_w),                     # computed in numpy, offline
                <same attrs>, out_dtype="int32")

so the graph itself carries the zero points and any int16 conv2d kernel (ours, or the one Relax
legalizes to) serves the quantized layer. The subtract is left out when zp_x is 0.

Semantics. Relax's conv2d of 8-bit tensors with out_dtype="int32" is the plain sum of x * w (its
TOPI compute casts both to int32 before multiplying; there are no zero points). The module the
pass is given is *meant* as the quantized conv -- the zero points are not in the graph, they are
the pass's arguments -- so the result changes on purpose: after the pass the function computes
sum (x - zp_x) * (w - zp_w). Padding pads the int16, shifted data with 0, i.e. a padded pixel is
the zero point and contributes nothing, the same convention as the schedule's pack stage (and
QNN's). Each |x - zp_x|, |w - zp_w| is at most 255, so int16 holds them exactly and the int32
sum is exact while C/groups * KH * KW <= 33025 (`conv.int8.MAX_K`); a longer reduction (or a
weight whose shape is not static) is refused with a ValueError, never rewritten or passed over.

Trade-off against the schedule-level upcast:
  * Weights stored as int16 double their footprint: the constant in the module (and in the
    compiled artifact) is 2 bytes per element, where the schedule-level path keeps int8 weights
    in the model and widens them once into its packed buffer.
  * The data is widened in a separate graph op, an extra pass over memory: after LegalizeOps
    and FuseOps the astype and subtract become one kernel (`fused_cast_subtract`) of their own,
    since conv2d's inputs are never fused into it, which reads the int8 tensor and writes an
    int16 one twice its size for the conv2d to read again. The schedule-level upcast fuses the
    widening into the packing it has to do anyway.
  * In exchange, graph-level users need nothing but an int16 conv2d: no custom schedule, and the
    rewrite is visible (and testable) in the IR.

Matching: the call must be `relax.nn.conv2d`, its data and weight tensors of dtype int8 or
uint8, and its out_dtype int32; anything else is left as it was. A constant weight is widened
offline as above; a weight that is a function input (not bound with `relax.transform.
BindParams`) is widened in the graph like the data (astype, subtract), so its zero point is
never dropped. Zero points are per tensor and module wide: one zp_x for every matched
conv's data, one zp_w for every matched weight. They are checked against the 8-bit range of the
dtype they apply to (int8: [-128, 127], uint8: [0, 255]): values outside both are refused when the
pass is created, a value that misfits one conv's dtype when the pass meets that conv (ValueError
naming the range either way).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir import GenericConst
from tvm.relax import PyExprMutator, expr_functor

from ..common.targets import int_isa, resolve
from ..conv import int8
from ..conv.geometry import ConvParams, Geometry, PostOps, Quantization
from ..conv.int8 import MAX_K
from .qconcat import quantized_concats
from .qlayout import TO_NCHW, TO_NHWC, channels_last
from . import exprs

ZERO_POINT_RANGE = {"int8": (-128, 127), "uint8": (0, 255)}
EIGHT_BIT = tuple(ZERO_POINT_RANGE)
WIDE = "int16"
ACC = "int32"

_CONV2D = tvm.ir.Op.get("relax.nn.conv2d")


def _check_zero_point(name: str, zp) -> int:
    """An int that lies in the range of int8 or of uint8 ([-128, 255] overall)."""
    if isinstance(zp, (bool, np.bool_)) or not isinstance(zp, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(zp).__name__}")
    if not any(lo <= zp <= hi for lo, hi in ZERO_POINT_RANGE.values()):
        ranges = ", ".join(f"{dt} takes [{lo}, {hi}]" for dt, (lo, hi) in ZERO_POINT_RANGE.items())
        raise ValueError(f"{name}={zp} is out of range for every 8-bit dtype: {ranges}")
    return int(zp)


def _check_zero_point_for(name: str, zp: int, dtype: str) -> None:
    lo, hi = ZERO_POINT_RANGE[dtype]
    if not lo <= zp <= hi:
        raise ValueError(f"{name}={zp} is out of range for {dtype}: must lie in [{lo}, {hi}]")


def _tensor_dtype(expr) -> str | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.is_missing():
        return None
    return str(ty.dtype)


def _matches(call) -> bool:
    """An 8-bit conv2d with an 8-bit weight and an int32 result."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(_CONV2D)):
        return False
    data, weight = call.args
    return (
        _tensor_dtype(data) in EIGHT_BIT
        and _tensor_dtype(weight) in EIGHT_BIT
        and str(call.attrs.out_dtype) == ACC
    )


def _check_reduction(weight) -> None:
    """Refuse a conv whose int32 sum of (x - zp_x)(w - zp_w) could wrap: rewriting it would
    change its result silently, and leaving it would drop the zero points just as silently."""
    shape = weight.ty.shape if isinstance(weight.ty, relax.TensorType) else None
    if shape is None or len(shape) != 4 or not all(isinstance(d, tvm.tirx.IntImm) for d in shape):
        raise ValueError(f"cannot legalize an 8-bit conv2d whose weight shape is not static: {shape}")
    _, cg, kh, kw = (int(d) for d in shape)
    if cg * kh * kw > MAX_K:
        raise ValueError(f"cannot legalize an 8-bit conv2d exactly: its reduction C/groups*KH*KW = {cg}*{kh}*{kw} = "
                         f"{cg * kh * kw} exceeds {MAX_K}, beyond which the int32 sum of products up to 255*255 can wrap")


@expr_functor.mutator
class _Int8Conv2dLegalizer(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, zp_x: int, zp_w: int):
        super().__init__(mod)
        self.zp_x, self.zp_w = zp_x, zp_w
        self.rewritten = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)  # args first, so nested matches are rewritten too
        if not _matches(call):
            return call
        data, weight = call.args
        _check_zero_point_for("input_zero_point", self.zp_x, _tensor_dtype(data))
        _check_zero_point_for("weight_zero_point", self.zp_w, _tensor_dtype(weight))
        _check_reduction(weight)

        # The graph part: widen (and shift) the data. Emitted as bindings of their own, so the
        # function stays in normal form (call arguments are variables or constants).
        wide = self.builder_.emit(relax.op.astype(data, WIDE))
        if self.zp_x:
            wide = self.builder_.emit(relax.op.subtract(wide, relax.const(self.zp_x, WIDE)))
        if isinstance(weight, GenericConst):
            # The offline part: the weight constant, widened and shifted once, here.
            w_wide = relax.const(weight.value.numpy().astype(np.int16) - np.int16(self.zp_w), WIDE)
        else:
            # A weight that is a function input is widened in the graph, like the data.
            w_wide = self.builder_.emit(relax.op.astype(weight, WIDE))
            if self.zp_w:
                w_wide = self.builder_.emit(relax.op.subtract(w_wide, relax.const(self.zp_w, WIDE)))
        a = call.attrs
        self.rewritten += 1
        return relax.op.nn.conv2d(
            wide,
            w_wide,
            strides=a.strides,
            padding=a.padding,
            dilation=a.dilation,
            groups=a.groups,
            data_layout=a.data_layout,
            kernel_layout=a.kernel_layout,
            out_layout=a.out_layout,
            out_dtype=ACC,
        )


def legalize_int8_conv2d(input_zero_point: int, weight_zero_point: int) -> tvm.ir.transform.Pass:
    """A module pass: every 8-bit conv2d -> int16 conv2d of (x - zp_x) and the constant w - zp_w.

    Use it as any pass, `legalize_int8_conv2d(zp_x, zp_w)(mod)` or inside a `tvm.transform.
    Sequential`. Functions with no matching conv2d come back unchanged. See the module docstring
    for what matches, the semantics, and the trade-off against the schedule-level upcast.
    """
    zp_x = _check_zero_point("input_zero_point", input_zero_point)
    zp_w = _check_zero_point("weight_zero_point", weight_zero_point)

    @tvm.ir.transform.module_pass(opt_level=0, name="LegalizeInt8Conv2d")
    def legalize(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mutator = _Int8Conv2dLegalizer(mod, zp_x, zp_w)
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function):
                continue
            before = mutator.rewritten
            new = mutator.visit_expr(func)
            if mutator.rewritten != before:
                mutator.builder_.update_func(gv, new)
        return mutator.builder_.get()

    return legalize


# ---------------------------------------------------------------------------------------------
# Quantized models as a quantizer writes them (QDQ), on our int8 conv2d.

_DEQUANTIZE = tvm.ir.Op.get("relax.dequantize")
_QUANTIZE = tvm.ir.Op.get("relax.quantize")
_ADD = tvm.ir.Op.get("relax.add")
_RELU = tvm.ir.Op.get("relax.nn.relu")
_RESHAPE = tvm.ir.Op.get("relax.reshape")
_MATMUL = tvm.ir.Op.get("relax.matmul")
_PERMUTE = tvm.ir.Op.get("relax.permute_dims")
_MAX_POOL = tvm.ir.Op.get("relax.nn.max_pool2d")
_OPAQUE = 8  # relax.OpPatternKind.kOpaque


_scalar_const = exprs.scalar_const


class _QdqChain:
    """DequantizeLinear(x) -> conv2d(., DequantizeLinear(W)) -> [+ bias] -> [relu] -> QuantizeLinear,
    read off the graph; `why` says what does not fit when it does not."""

    def __init__(self, quant, values: dict, uses: dict):
        self.why, self.skipped = "", []
        self.quant = quant
        self.residual = None  # (r, its scale, its zero point, the sum's scale, zero point) once fused
        y = quant.args[0]
        self.relu = False
        if exprs.is_call(values.get(y), _RELU):
            self.skipped.append(y)
            self.relu, y = True, values[y].args[0]
        self.bias, self.feeds = None, []
        if exprs.is_call(values.get(y), _ADD):
            self.skipped.append(y)
            a, b = values[y].args
            self.bias, y = self._bias(b, values), a
        self.conv = values.get(y)
        self.conv_var = y
        # A fully connected layer (Gemm: matmul by the transposed weights) is a 1x1 conv of a 1x1 image.
        self.dense = exprs.is_call(self.conv, _MATMUL)
        if not exprs.is_call(self.conv, tvm.ir.Op.get("relax.nn.conv2d")) and not self.dense:
            self.why = "QuantizeLinear does not follow a conv2d or matmul (+ bias, ReLU)"
            return
        self.skipped.append(y)
        if any(uses.get(v, 0) != 1 for v in self.skipped):
            self.why = "an intermediate value of the chain has other users"
            return
        self._read_inputs(values)
        # The chain's own DequantizeLinears (and the bias's reshape) go with it where nothing else reads them.
        self.skipped += [v for v in self.feeds if isinstance(v, relax.Var) and uses.get(v, 0) == 1]

    def _bias(self, b, values: dict):
        """The bias as (int32 values, float scales) from its DequantizeLinear (through a reshape),
        or a float constant; None where it is neither."""
        self.feeds = [b]
        if exprs.is_call(values.get(b), _RESHAPE):
            b = values[b].args[0]
            self.feeds.append(b)
        dq = values.get(b)
        if exprs.is_call(dq, _DEQUANTIZE) and isinstance(dq.args[0], GenericConst):
            return ("int", exprs.const(dq.args[0]), exprs.const(dq.args[1]), exprs.const(dq.args[2]))
        if isinstance(b, GenericConst):
            return ("float", exprs.const(b))
        return "unknown"

    def _read_inputs(self, values: dict) -> None:
        data, weight = self.conv.args
        self.feeds += [data, weight]
        if self.dense:  # weight = permute_dims(dequantize(W (O, K)), [1, 0])
            t = values.get(weight)
            if not (exprs.is_call(t, _PERMUTE) and [int(v) for v in t.attrs.axes] == [1, 0]):
                self.why = "the matmul's weights are not a transposed DequantizeLinear (Gemm's)"
                return
            weight = t.args[0]
            self.feeds.append(weight)
        dq_x, dq_w = values.get(data), values.get(weight)
        if not exprs.is_call(dq_x, _DEQUANTIZE) or not exprs.is_call(dq_w, _DEQUANTIZE):
            self.why = "the conv's data or weights do not come from DequantizeLinear"
            return
        self.x = dq_x.args[0]
        self.sx, self.zx = _scalar_const(dq_x.args[1]), _scalar_const(dq_x.args[2])
        self.w = exprs.const(dq_w.args[0])
        if self.dense and self.w is not None:
            if self.w.ndim != 2 or exprs.shape(dq_x.args[0]) is None or len(exprs.shape(dq_x.args[0])) != 2:
                self.why = "a matmul of other than (N, K) data by (K, O) weights"
                return
            self.w = self.w[:, :, None, None]
        self.sw, zw = exprs.const(dq_w.args[1]), exprs.const(dq_w.args[2])
        self.sy, self.zy = _scalar_const(self.quant.args[1]), _scalar_const(self.quant.args[2])
        self.out_dtype = str(self.quant.attrs.out_dtype)
        if None in (self.sx, self.zx, self.sy, self.zy) or self.w is None or self.sw is None:
            self.why = "per-tensor constant scales and zero points on data and output, constant weights needed"
        elif exprs.dtype(self.x) not in EIGHT_BIT or str(self.w.dtype) != "int8" or self.out_dtype not in EIGHT_BIT:
            self.why = "uint8/int8 data and output with int8 weights needed"
        elif zw is not None and np.any(zw != 0):
            self.why = "weights with a non-zero zero point (quantizers write symmetric int8 weights)"
        elif self.bias == "unknown":
            self.why = "the added term is not a constant per-channel bias"
        elif exprs.shape(self.x) is None:
            self.why = "symbolic shapes"

    def bias_int32(self) -> np.ndarray | None:
        """The bias as int32 at scale sx * sw (QLinearConv's), from what the graph holds."""
        if self.bias is None:
            return None
        o = self.w.shape[0]
        if self.bias[0] == "int":
            _, q, s, z = self.bias
            q = q.astype(np.int64).reshape(-1) - (0 if z is None else z.astype(np.int64).reshape(-1))
            real = q * np.broadcast_to(s.astype(np.float64).reshape(-1), q.shape)
        else:
            real = self.bias[1].astype(np.float64).reshape(-1)
        if real.size != o:
            return None
        step = np.float64(np.float32(self.sx)) * np.broadcast_to(self.sw.astype(np.float64).reshape(-1), (o,))
        return np.clip(np.rint(real / step), -2**31, 2**31 - 1).astype(np.int32)


@expr_functor.mutator
class _QdqConvs(PyExprMutator):
    def __init__(self, mod, target, threads, report: list):
        super().__init__(mod)
        self.threads, self.report = threads, report
        self.isa = int_isa(target, resolve(target))
        self.chains: dict = {}  # quantize var -> _QdqChain
        self.skip: set = set()
        self.funcs: dict = {}

    def plan(self, func) -> None:
        uses = exprs.uses(func)
        for blk in func.body.blocks:
            values = {b.var: b.value for b in blk.bindings}
            for b in blk.bindings:
                if exprs.is_call(b.value, _QUANTIZE):
                    chain = _QdqChain(b.value, values, uses)
                    if chain.why:
                        if exprs.is_call(chain.conv, _CONV2D) or chain.dense:
                            self._log(chain, "tvm", chain.why)
                        continue
                    self.chains[b.var] = chain
                    self.skip.update(chain.skipped)
            for b in blk.bindings:
                self._fuse_residual(b, values, uses)

    def _fuse_residual(self, binding, values: dict, uses: dict) -> None:
        """quantize(add(dequantize(y), dequantize(r))) where y is a conv chain's output read by
        nothing else: the chain takes the add into its store (Quantization's residual add) and
        is emitted here, at the sum, instead of at y."""
        q = binding.value
        if not exprs.is_call(q, _QUANTIZE) or not exprs.is_call(values.get(q.args[0]), _ADD) or uses.get(q.args[0]) != 1:
            return
        add = values[q.args[0]]
        for mine, other in ((0, 1), (1, 0)):
            dq_y, dq_r = values.get(add.args[mine]), values.get(add.args[other])
            if not (exprs.is_call(dq_y, _DEQUANTIZE) and exprs.is_call(dq_r, _DEQUANTIZE)):
                return
            y = dq_y.args[0]
            chain = self.chains.get(y)
            if chain is None or chain.dense or chain.residual is not None or uses.get(y) != 1 \
                    or uses.get(add.args[mine]) != 1:
                continue
            r = dq_r.args[0]
            scales = [_scalar_const(v) for v in (dq_y.args[1], dq_y.args[2], dq_r.args[1], dq_r.args[2], q.args[1],
                                                  q.args[2])]
            if None in scales or scales[:2] != [chain.sy, chain.zy] or str(q.attrs.out_dtype) != chain.out_dtype \
                    or exprs.dtype(r) != chain.out_dtype or exprs.shape(r) != exprs.shape(chain.quant.args[0]):
                continue
            chain.residual = (r, float(scales[2]), int(scales[3]), float(scales[4]), int(scales[5]))
            del self.chains[y]
            self.chains[binding.var] = chain
            self.skip.update([y, q.args[0], add.args[mine]])
            if uses.get(add.args[other]) == 1:
                self.skip.add(add.args[other])
            return

    def _log(self, chain, where, why):
        entry = {"op": "qdense" if chain.dense else "qconv2d", "data": exprs.shape(chain.conv.args[0]),
                 "weight": exprs.shape(chain.conv.args[1]), "runs_on": where, "reason": why}
        self.report.append(entry)

    def visit_var_binding_(self, binding):
        if binding.var in self.skip:
            return
        chain = self.chains.get(binding.var)
        if chain is None:
            return super().visit_var_binding_(binding)
        value = self._lower(chain)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))

    def _lower(self, chain: _QdqChain):
        o = chain.w.shape[0]
        if chain.dense:
            n, k = exprs.shape(chain.x)
            params = ConvParams((n, k, 1, 1), chain.w.shape)
        else:
            a = chain.conv.attrs
            params = ConvParams(exprs.shape(chain.x), chain.w.shape, [int(s) for s in a.strides],
                                [int(p) for p in a.padding], [int(d) for d in a.dilation], int(a.groups))
        bias = chain.bias_int32()
        # Channels-last: the layer reads and writes what its pack and accumulators hold, and the
        # permutes around it cancel between layers (channels_last).
        res = {}
        if chain.residual is not None:
            _, sr, zr, sz, zz = chain.residual
            res = {"residual_scale": sr, "residual_zero_point": zr, "sum_scale": sz, "sum_zero_point": zz}
        quant = Quantization(exprs.dtype(chain.x), "int8", int(chain.zx), 0, chain.out_dtype, float(chain.sx),
                             tuple(float(v) for v in np.broadcast_to(chain.sw.reshape(-1), (o,))), float(chain.sy),
                             int(chain.zy), data_layout="NHWC", **res,
                             weight_bits=7 if int8.pairs_fit(chain.w) else 8)  # exact on vpmaddubsw, 7-bit weights
        post = PostOps(bias is not None, chain.residual is not None, "relu" if chain.relu else None)
        key = (params, quant, post)
        if key not in self.funcs:
            g = Geometry.of(params, block=int8.conv_kernel(self.isa).nr)
            mod, op = int8.prepare(g, self.isa, quant, post, self.threads)  # compiled with the model
            name = f"mk_qconv2d_{len(self.funcs)}_{op.plan.kern.name}"  # mk_: ours, which rest.py leaves alone
            # Opaque: FuseOps must not fuse the elementwise ops after it (MobileNetV3's dequantize
            # -> HardSwish -> quantize) into its TIR, whose Out may be the output flattened: FuseTIR
            # then refuses the buffers, and the whole model fell back to TVM's own build.
            func = mod["main"].with_attr("global_symbol", name).with_attr("op_pattern", _OPAQUE)
            self.funcs[key] = (self.builder_.add_func(func, name), op)
        gv, op = self.funcs[key]
        if chain.dense:  # (N, K) is (N, 1, 1, K) channels-last, as it is
            x = self.builder_.emit(relax.op.reshape(chain.x, (params.data_shape[0], 1, 1, params.data_shape[1])))
        else:
            x = self.builder_.emit(relax.op.permute_dims(chain.x, TO_NHWC))
        # The module may take the layer's data or output flattened (conv.int8.forms.direct.flat_geometry, a
        # subsampled 1x1 layer's output): the same memory.
        flat_in, flat_out = op.plan.data_shape != op.data_shape, op.plan.out_shape != op.out_shape
        if flat_in:
            x = self.builder_.emit(relax.op.reshape(x, op.plan.data_shape))
        args = [x, *(relax.const(v) for v in op.constants(op.pack_weights(chain.w), bias))]
        if chain.residual is not None:
            r = self.builder_.emit(relax.op.permute_dims(chain.residual[0], TO_NHWC))
            args.append(self.builder_.emit(relax.op.reshape(r, op.plan.out_shape)) if flat_out else r)
        self._log(chain, "ours", op.plan.why + ("; the quantized residual add fused into its store"
                                                if chain.residual is not None else ""))
        y = self.builder_.emit(relax.call_tir(gv, args, relax.TensorType(op.plan.out_shape, chain.out_dtype)))
        if flat_out:
            y = self.builder_.emit(relax.op.reshape(y, op.out_shape))
        if chain.dense:
            return relax.op.reshape(y, (params.data_shape[0], o))
        return relax.op.permute_dims(y, TO_NCHW)


def _same_quantization(a, b) -> bool:
    """Two (scale, zero point) argument pairs that are the same scalar constants."""
    return all(_scalar_const(x) is not None and _scalar_const(x) == _scalar_const(y) for x, y in zip(a, b))


@expr_functor.mutator
class _IntegerMaxPools(PyExprMutator):
    """quantize(max_pool2d(dequantize(x, s, z)), s, z) -> max_pool2d(x): with one scale and zero
    point on both sides the maximum commutes with the (monotonic) quantization, so the pool runs on
    the 8-bit tensor, a quarter of the float bytes (uint8's padding, 0, is its minimum, as -inf is
    the float one's)."""

    def __init__(self, mod, report: list):
        super().__init__(mod)
        self.report = report

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not exprs.is_call(call, _QUANTIZE):
            return call
        pool = self.lookup_binding(call.args[0]) if isinstance(call.args[0], relax.Var) else None
        if not exprs.is_call(pool, _MAX_POOL):
            return call
        dq = self.lookup_binding(pool.args[0]) if isinstance(pool.args[0], relax.Var) else None
        if not exprs.is_call(dq, _DEQUANTIZE) or not _same_quantization(dq.args[1:], call.args[1:]) \
                or exprs.dtype(dq.args[0]) != str(call.attrs.out_dtype):
            return call
        a = pool.attrs
        self.report.append({"op": "max_pool2d", "runs_on": "int8",
                            "reason": "pooled on the 8-bit tensor: one scale and zero point on both sides"})
        return relax.op.nn.max_pool2d(dq.args[0], [int(v) for v in a.pool_size], [int(v) for v in a.strides],
                                      [int(v) for v in a.padding], [int(v) for v in a.dilation], bool(a.ceil_mode),
                                      bool(a.count_include_pad), layout=str(a.layout),
                                      out_layout=str(a.out_layout) if a.out_layout else None)


def qdq_convs(mod: tvm.IRModule, target="native", threads=None, report: list | None = None) -> tvm.IRModule:
    """Every DequantizeLinear -> conv2d -> [+ bias] -> [ReLU] -> QuantizeLinear chain of `mod` (as
    ONNX's QDQ format arrives through tvm.relax.frontend.onnx: per-tensor data and output
    quantization, int8 weights with per-channel scales and zero point 0) replaced by a call of our
    int8 conv2d with the requantization fused; chains that do not fit stay (report says why)."""
    report = [] if report is None else report
    mod = relax.transform.DeadCodeElimination()(exprs.mutate(mod, _IntegerMaxPools(mod, report)))
    mutator = _QdqConvs(mod, target, threads, report)
    mod = exprs.mutate(mod, mutator, mutator.plan)
    return quantized_concats(channels_last(mod), report) if mutator.chains else mod
