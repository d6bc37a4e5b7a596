"""The quantized conv2d as users call it: `prepare` checks the layer and schedules it (the form
chosen by forms.choose, the plan and TIR by build), `schedule` compiles it, and Int8Conv2dOp
packs weights and runs the module: under qemu-user on ARM, natively or on the Bochs CPU on x86."""

from __future__ import annotations

import numpy as np
import tvm

from microkernels import AMX_INT8, AVX512_VNNI, Isa

from ...common.targets import check_array, int_target, require_host, set_threads
from ...emulation import bochs, qemu
from ..geometry import NO_POST_OPS, Geometry, PostOps, Quantization
from . import forms
from .build import build
from .plan import Int8Plan
from .tiles import MAX_K, MAX_PRODUCT, conv_kernel, exact_bound
from .values import ZERO_POINT_RANGE, data_shift, is_depthwise, weight_shift, zero_point
from .weights import pack_weights


class Int8Conv2dOp:
    """A compiled quantized conv2d. op(data, weight, bias=None) -> NCHW output (int32
    accumulators, or requantized / dequantized as the Quantization says), run under qemu-user
    on ARM and natively (or on the Bochs CPU, emulate=True) on x86. `op.pack_weights(weight)`
    packs the weights once (a tuple: kernel_vec, plus the per-channel terms on the raw-8-bit
    tiles); `op.run_packed(data, packed, bias=None)` then skips that. `op.asm` is the assembly,
    `op.plan` the Int8Plan (`op.plan.why`: which tile runs and why). `lib` is None for an op
    that only packs (the Relax pass compiles the module with the model)."""

    def __init__(self, g, isa: Isa, lib, plan: Int8Plan, quant: Quantization, zp_x: int, zp_w: int,
                 threads: int | None = None, emulate: bool = False):
        self.geometry, self.isa, self.lib, self.plan, self.quant = g, isa, lib, plan, quant
        self.dtype, self.weight_dtype, self.zp_x, self.zp_w = quant.dtype, quant.weight_dtype, zp_x, zp_w
        self.threads, self.emulate = threads, emulate
        self.multipliers = quant.multipliers(g.o) if quant.requantizes else None

    @property
    def asm(self) -> str:
        return self.lib.mod.inspect_source("asm")

    def build(self) -> "Int8Conv2dOp":  # dispatch.schedule's interface: already compiled
        return self

    @property
    def data_shape(self) -> tuple:
        """The data's shape as the user gives it (NCHW, or NHWC with data_layout="NHWC"); the module's
        may be its flattened form (flat_geometry), the same memory."""
        g = self.geometry
        return (g.n, g.h, g.w, g.c) if self.plan.nhwc else (g.n, g.c, g.h, g.w)

    @property
    def out_shape(self) -> tuple:
        g, (oh, ow) = self.geometry, self.geometry.out_hw
        return (g.n, oh, ow, g.o) if self.plan.nhwc else (g.n, g.o, oh, ow)

    @property
    def kernel(self):
        return self.plan.kern

    def _check_legalized(self, name: str, arr: np.ndarray) -> None:
        # int16 inputs come from the legalize pass, already x - zp: the exactness bound (and the
        # meaning of the result) holds only while they stay within what 8-bit data can produce.
        if arr.dtype == np.int16 and arr.size and np.abs(arr.astype(np.int32)).max() > 255:
            raise ValueError(f"int16 {name} must lie in [-255, 255] (8-bit values minus a zero point), "
                             f"got magnitude {np.abs(arr.astype(np.int32)).max()}")

    def pack_weights(self, weight: np.ndarray) -> tuple:
        g = self.geometry
        check_array("weight", weight, (g.o, g.cg, g.kh, g.kw), self.weight_dtype)
        self._check_legalized("weight", weight)
        return pack_weights(self.plan, weight, self.zp_w, self.zp_x + data_shift(self.plan, self.dtype))

    def run_packed(self, data: np.ndarray, packed: tuple, bias: np.ndarray | None = None,
                   residual: np.ndarray | None = None) -> np.ndarray:
        plan = self.plan
        check_array("data", data, self.data_shape, self.dtype)
        specs = [(plan.weight_shape, plan.weight_dtype)] + ([(plan.bias_shape, "int32")] if plan.expands else [])
        if not isinstance(packed, tuple) or len(packed) != len(specs):
            raise TypeError(f"packed must be the tuple of {len(specs)} array(s) that op.pack_weights returns")
        for i, (arr, (shape, dt)) in enumerate(zip(packed, specs)):
            check_array(f"packed[{i}]", arr, shape, dt)
        self._check_legalized("data", data)
        args = [data.reshape(plan.data_shape), *self.arguments(packed, bias, residual)]
        if self.isa.arch != "x86":
            return qemu.run(self.lib, self.isa.arch, args, [len(args) - 1])[0].reshape(self.out_shape)
        if self.emulate:
            out = bochs.run(self.lib, [np.ascontiguousarray(a) for a in args], [len(args) - 1])[0]
            return out.reshape(self.out_shape)
        require_host(plan.kern.isa)  # a tile instruction the CPU lacks (or AMX without the OS's leave) kills the process
        set_threads(self.threads)
        tensors = [tvm.runtime.tensor(a) for a in args]
        self.lib(*tensors)
        return tensors[-1].numpy().reshape(self.out_shape)

    def arguments(self, packed: tuple, bias: np.ndarray | None, residual: np.ndarray | None = None) -> list[np.ndarray]:
        """The compiled function's arguments after the data: `constants`, the residual (with a
        fused residual add), a new output array; in the module's shapes (flat_geometry)."""
        return [*self.constants(packed, bias), *self._residual(residual),
                np.zeros(self.plan.out_shape, self.plan.output_dtype)]

    def _residual(self, residual: np.ndarray | None) -> list[np.ndarray]:
        """[residual] checked and in the module's shape, or [] for an op without a residual add."""
        plan = self.plan
        if (residual is None) != (plan.residual is None):
            raise TypeError("this op adds a residual: pass residual= (the output's shape and dtype)" if residual is None
                            else "this op was compiled without a residual add (conv2d(..., residual=True, ...))")
        if residual is None:
            return []
        check_array("residual", residual, self.out_shape, plan.output_dtype)
        return [residual.reshape(plan.out_shape)]

    def constants(self, packed: tuple, bias: np.ndarray | None) -> list[np.ndarray]:
        """The arguments that stay fixed from call to call: packed weights, the per-channel int32
        terms (the expansion's plus the user's bias), the multipliers."""
        plan, g = self.plan, self.geometry
        args = [packed[0]]
        if plan.bias:
            total = packed[1].astype(np.int64) if plan.expands else np.zeros(plan.bias_shape, np.int64)
            if bias is not None:
                check_array("bias", bias, (g.o,), "int32")
                total = total + bias.astype(np.int64).reshape(plan.bias_shape)
            if np.abs(total).max(initial=0) > 2**31 - 1:
                raise ValueError("bias plus the zero-point terms overflows int32")
            args.append(total.astype(np.int32))
        elif bias is not None:
            raise TypeError("this op was compiled without bias (conv2d(..., bias=True) takes one)")
        if self.multipliers is not None:
            args.append(self.multipliers)
        return args

    def __call__(self, data: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
                 residual: np.ndarray | None = None) -> np.ndarray:
        return self.run_packed(data, self.pack_weights(weight), bias, residual)

    def bind(self, weight: np.ndarray, bias: np.ndarray | None = None):
        """Pack `weight` (and fold `bias` with the zero-point terms) once, into TVM tensors; the
        result is f(data) -> output, which only checks and wraps the data. x86, not emulated."""
        if self.isa.arch != "x86" or self.emulate:
            raise ValueError("bind() runs the layer natively on x86; use op(data, weight) here")
        require_host(self.plan.kern.isa)
        plan = self.plan
        fixed = [tvm.runtime.tensor(a) for a in self.constants(self.pack_weights(weight), bias)]
        out = tvm.runtime.tensor(np.zeros(plan.out_shape, plan.output_dtype))

        def run(data: np.ndarray, residual: np.ndarray | None = None) -> np.ndarray:
            check_array("data", data, self.data_shape, self.dtype)
            self._check_legalized("data", data)
            extra = [tvm.runtime.tensor(r) for r in self._residual(residual)]
            set_threads(self.threads)
            self.lib(tvm.runtime.tensor(data.reshape(plan.data_shape)), *fixed, *extra, out)
            return out.numpy().reshape(self.out_shape)

        return run


def schedule(g: Geometry, isa: Isa, quant: Quantization, post_ops: PostOps = NO_POST_OPS,
             threads: int | None = None, emulate: bool = False, algorithm: str = "auto") -> Int8Conv2dOp:
    """The layer compiled (what conv2d returns for a quantized layer; compiling is cheap). ARM
    ops run under qemu, x86 ones natively or, with emulate, on the Bochs CPU (quant.data_layout:
    NCHW, or NHWC on x86); algorithm as `prepare` takes it."""
    mod, op = prepare(g, isa, quant, post_ops, threads, emulate, algorithm)
    op.lib = tvm.compile(mod, target=int_target(op.plan.kern.isa) if isa.arch == "x86" else isa.target)
    return op


def prepare(g: Geometry, isa: Isa, quant: Quantization, post_ops: PostOps = NO_POST_OPS,
            threads: int | None = None, emulate: bool = False,
            algorithm: str = "auto") -> tuple[tvm.IRModule, Int8Conv2dOp]:
    """The layer checked and scheduled, not compiled: (its IRModule, an op without a library,
    which packs weights and makes the arguments). `schedule` compiles it; the Relax pass adds the
    module's function to the model instead. algorithm: "auto" (Winograd where `winograd` takes
    the layer, else direct), "direct", or "winograd" (refused, saying why, where it does not apply)."""
    data_layout = quant.data_layout
    if data_layout == "NHWC" and isa.arch != "x86":
        raise ValueError("data_layout='NHWC' is an x86 option of the quantized conv2d; the ARM targets take NCHW")
    if isa.name == AMX_INT8.name and emulate:
        isa = AVX512_VNNI  # the Bochs CPU has no AMX; its VNNI runs the same arithmetic
    dtype, weight_dtype = quant.dtype, quant.weight_dtype
    for name, dt in (("dtype", dtype), ("weight_dtype", weight_dtype)):
        if dt not in ZERO_POINT_RANGE:
            raise ValueError(f"{name} {dt!r} is not supported on {isa.name} targets; "
                             f"use 'int8' or 'uint8' (or 'int16' for legalized, zero-point-free data)")
    if (dtype == "int16") != (weight_dtype == "int16"):
        raise ValueError(f"dtype {dtype!r} with weight_dtype {weight_dtype!r}: int16 is the legalized, "
                         "zero-point-free form, for data and weights together")
    zp_x = zero_point("input_zero_point", quant.input_zero_point, dtype)
    zp_w = zero_point("weight_zero_point", quant.weight_zero_point, weight_dtype)
    if post_ops.residual != quant.adds_residual:
        raise ValueError("a fused residual on the quantized conv2d is the quantized add: residual=True with "
                         "residual_scale, residual_zero_point, sum_scale and sum_zero_point, together")
    if post_ops.residual and isa.arch != "x86":
        raise ValueError("the fused quantized residual add is an x86 option; the ARM targets add it after the layer")
    if post_ops.activation == "clip":
        raise ValueError("activation 'clip' is not available on the quantized conv2d; a requantized output "
                         "saturates to its dtype, and 'relu' raises the lower bound to the output zero point")
    if quant.requantizes:
        quant.multipliers(g.o)  # the per-channel count and float32 range, before compiling
    k = g.cg * g.kh * g.kw
    pairs = quant.weight_bits == 7  # the vpmaddubsw tile where the ISA has it (tiles.takes_pairs)
    kern = conv_kernel(isa, dtype, is_depthwise(g), g, pairs=pairs)
    if k > MAX_K:
        raise ValueError(f"reduction length C/groups*KH*KW = {k} exceeds {MAX_K}, the longest sum of "
                         f"8-bit products (each up to {MAX_PRODUCT}) that int32 holds exactly")
    bound, what = exact_bound(kern)
    if k > bound:
        raise ValueError(f"reduction length C/groups*KH*KW = {k} exceeds {bound}, the longest the {what} keeps "
                         "exact in int32")
    residual = (*quant.residual_ratios(), quant.residual_zero_point, quant.sum_zero_point) if post_ops.residual else None
    output = {"output_dtype": quant.output_dtype, "bias": post_ops.bias, "activation": post_ops.activation,
              "zp_out": quant.output_zero_point, "nhwc": data_layout == "NHWC", "residual": residual}
    zw8 = zp_w - weight_shift(weight_dtype)
    geometry, form = forms.choose(g, isa, forms.Layer(quant, kern, zp_x, zp_w, zw8), algorithm)
    # Winograd's transformed weights leave the pair bound: its GEMMs stay on the upcast, which beat the
    # direct conv on the pairs tile on 3x3 stride-1 layers (Zen 3, 1 thread: 0.93 against 1.31 ms at
    # 128 x 28 x 28, 0.90 against 1.31 at 256 x 14 x 14; level at 64 x 56 x 56).
    mod, plan = build(geometry, isa, dtype, zp_x, zp_w=zp_w, weight_dtype=weight_dtype, output=output,
                      source=(g, form) if form else None, pairs=pairs and form != forms.WINOGRAD)
    return mod, Int8Conv2dOp(g, isa, None, plan, quant, zp_x, zp_w, threads, emulate)
