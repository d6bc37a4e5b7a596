"""The compiled float32 conv2d: Conv2dOp (blocked and NCHW calls), BoundConv2d (weights packed
once), and Scheduled (a layer planned and tensorized, not yet compiled). Every x86 family's op
is a Conv2dOp, or a subclass that changes its blocked shapes and weight packing."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import tvm

from microkernels import Isa

from ..common import layouts
from ..common.compiled import CompiledOp, check_operand, check_out, store, user_operand
from ..common.targets import check_array
from .geometry import NO_POST_OPS, Geometry, PostOps
from .plans import Plan


class Conv2dOp(CompiledOp):
    """A compiled conv2d for fixed shapes. op(data, weight) on NCHW / OIHW numpy arrays.

    The fast path a model uses keeps everything blocked: pack the weights once with
    `op.pack_weights(weight)`, keep activations in `op.blocked_data_shape` (NCHW[x]c), and call
    `op.run_blocked(data_nchwc, packed_weight)`, which returns the NCHW[y]c output.
    """

    def __init__(self, geometry: Geometry, isa: Isa, lib, threads, plan: Plan, post: PostOps = NO_POST_OPS,
                 emulate: bool = False):
        super().__init__(isa, lib, threads, emulate)
        self.geometry, self.plan, self.post = geometry, plan, post
        # The batch of the NCHW paths as the user declared it: None for unbatched (C, H, W)
        # input, 0 for an empty batch (conv2d plans both for one image).
        self.user_batch: int | None = geometry.n

    @property
    def layer(self) -> Geometry:
        """The layer as the user gave it; `geometry` is what the module computes, which differs
        where a grouped layer runs as wider groups (grouped.GroupedConv2dOp)."""
        return self.geometry

    @property
    def flops(self) -> int:  # the layer's, not the zeros a wider schedule multiplies
        return self.layer.flops

    @property
    def blocked_data_shape(self) -> tuple:
        return self.geometry.data_shape

    @property
    def blocked_weight_shape(self) -> tuple:
        return self.geometry.weight_shape

    @property
    def blocked_out_shape(self) -> tuple:
        return self.geometry.out_shape

    @property
    def bias_shape(self) -> tuple:  # what pack_bias returns
        return self.geometry.bias_shape

    def to_blocked(self, data: np.ndarray) -> np.ndarray:
        g = self.geometry
        check_array("data", data, (g.n, g.c, g.h, g.w), "float32")
        return layouts.to_nchwc(data, *self.data_layout)

    def from_blocked(self, out: np.ndarray) -> np.ndarray:
        check_array("out", out, self.blocked_out_shape, "float32")
        return layouts.from_nchwc(out, self.geometry.o, self.out_groups)

    def pack_weights(self, weight: np.ndarray) -> np.ndarray:
        g = self.geometry
        check_array("weight", weight, (g.o, g.cg, g.kh, g.kw), "float32")
        return layouts.pack_weights(weight, g.bi, g.block, g.groups)

    def pack_bias(self, bias: np.ndarray) -> np.ndarray:
        """(O,) -> (groups*OB, block), each group's channels zero-padded like the output."""
        g = self.geometry
        check_array("bias", bias, (g.o,), "float32")
        full = np.zeros((g.groups, g.ob * g.block), np.float32)
        full[:, :g.og] = bias.reshape(g.groups, g.og)
        return layouts.aligned(full.reshape(g.bias_shape))

    def _args(self, data_b, weight_b, bias_b=None, residual_b=None, out=None):
        check_operand("data", data_b, self.blocked_data_shape, "float32")
        check_operand("weight", weight_b, self.blocked_weight_shape, "float32")
        self.check_post(bias_b is not None, residual_b is not None)
        extra = []
        for label, arr, shape in (("bias", bias_b, self.bias_shape), ("residual", residual_b, self.blocked_out_shape)):
            if arr is not None:
                check_operand(label, arr, shape, "float32")
                extra.append(arr)
        if out is not None:
            check_operand("out", out, self.blocked_out_shape, "float32")
            check_out(out, data=data_b, weight=weight_b, bias=bias_b, residual=residual_b)
        return self._tensors((data_b, weight_b, *extra), self.blocked_out_shape, out)

    def check_post(self, bias: bool, residual: bool) -> None:
        """Raise unless a call passes exactly the post-op inputs the op was compiled for."""
        for label, given, on in (("bias", bias, self.post.bias), ("residual", residual, self.post.residual)):
            if on != given:
                raise ValueError(f"this conv2d was compiled {'with' if on else 'without'} a {label}: "
                                 f"{'pass' if on else 'do not pass'} {label}= ({self._post_hint()})")

    def _post_hint(self) -> str:
        p = self.post
        return f"bias={p.bias}, residual={p.residual}, activation={p.activation!r}"

    def run_blocked(self, data_b, weight_b, bias=None, residual=None, out=None):
        """Blocked in, blocked out. bias: op.pack_bias(b); residual: blocked output shape.
        Operands are numpy arrays or TVM tensors; aligned numpy memory (aligned_empty) is used
        in place, and the result is written into `out` when given (and returned)."""
        return self._run(self._args(data_b, weight_b, bias, residual, out))

    def __call__(self, data, weight, bias=None, residual=None, out=None):
        """NCHW data, OIHW weights, bias (O,), residual NCHW of the output's shape; returns NCHW
        (written into `out` when given). The layout transforms and the weight packing are
        compiled code; with weights reused across calls, `bind` packs them once."""
        return BoundConv2d(self, weight, bias, scratch=True)(data, residual, out)

    def bind(self, weight, bias=None) -> "BoundConv2d":
        """Pack OIHW `weight` (and `bias`) once; the result is f(x NCHW, residual=None, out=None)."""
        return BoundConv2d(self, weight, bias)

    def time(self, data_b, weight_b, number=10, repeat=5, cold=False, bias=None, residual=None) -> list[float]:
        """Seconds per call on blocked arrays, one entry per repeat (cold: caches flushed
        before each repeat, so use number=1)."""
        return self._time(self._args(data_b, weight_b, bias, residual), number, repeat, cold)

    # Layouts of the NCHW paths: (block, groups) of the blocked input, groups of the output.
    @property
    def data_layout(self) -> tuple[int, int]:
        return self.geometry.bi, self.geometry.groups

    @property
    def out_groups(self) -> int:
        return self.geometry.groups

    def packs_weights_compiled(self) -> bool:
        """Whether the NCHW paths pack weights with compiled code (weight_packer): the plain
        OIHW[x]i[y]o repacking here, Winograd's transform; not depthwise or block-diagonal
        weights, which numpy packs once per bind."""
        return type(self).pack_weights is Conv2dOp.pack_weights

    def emulated_weights(self, weight: np.ndarray) -> np.ndarray:
        """The packed weights an emulated op's NCHW paths run on (the emulator takes numpy)."""
        return self.pack_weights(weight)

    def weight_packer(self):
        """pack_weights compiled: f(w OIHW, out blocked) on TVM tensors."""
        g = self.geometry
        return layouts.compile_pack_weights((g.o, g.cg, g.kh, g.kw), g.bi, g.block, g.groups, self.isa)

    def scratch(self, name: str):
        """A blocked buffer of the NCHW paths ("data", "out", "residual", "weight"), one per
        Python thread (ops may be called from several at once), made on first use."""
        shape = {"data": self.blocked_data_shape, "out": self.blocked_out_shape,
                 "residual": self.blocked_out_shape, "weight": self.blocked_weight_shape}[name]
        return self.per_thread_buffer(name, shape)

    @functools.cached_property
    def transforms(self) -> dict:
        """Compiled layout transforms of this op's NCHW paths (built on first use), by name."""
        g = self.geometry
        block, groups = self.data_layout
        # A 1x1 strided layer without padding reads only every stride-th row and column of its
        # input: the others need no converting (a quarter of the pixels at stride 2).
        direct_1x1 = self.plan.algorithm == "direct" and (g.kh, g.kw) == (1, 1) and not g.padded
        step = g.stride if direct_1x1 else (1, 1)
        out = {"to_blocked": layouts.compile_to_nchwc((g.n, g.c, g.h, g.w), block, groups, self.isa, step),
               "from_blocked": layouts.compile_from_nchwc(self.blocked_out_shape, g.o, self.out_groups, self.isa)}
        if self.post.residual:
            out["residual"] = layouts.compile_to_nchwc((g.n, g.o, *g.out_hw), g.block, self.out_groups, self.isa)
        if self.packs_weights_compiled():
            out["pack_weights"] = self.weight_packer()
        return out


class BoundConv2d:
    """A conv2d with its weights (and bias) packed once, kept as TVM tensors: call it on NCHW
    arrays. Per call: the input transform, the convolution and the output transform, all
    compiled code, through blocked buffers the op keeps per Python thread (the result is a
    fresh array unless `out` is given)."""

    def __init__(self, op: Conv2dOp, weight, bias=None, scratch: bool = False):
        """scratch: pack into the op's per-thread weight buffer instead of a new one (op(x, w),
        which packs on every call: a fresh 10 MB buffer cost more in page faults than the
        packing itself)."""
        g = op.layer
        self.op = op
        self._in_shape, self._out_shape = (g.n, g.c, g.h, g.w), (g.n, g.o, *g.out_hw)
        lead = () if op.user_batch is None else (op.user_batch,)
        self._user_shapes = (*lead, g.c, g.h, g.w), (*lead, g.o, *g.out_hw)
        if op.emulate:
            self.weight = op.emulated_weights(weight)
            self.bias = None if bias is None else op.pack_bias(bias)
            return
        check_operand("weight", weight, (g.o, g.cg, g.kh, g.kw), "float32")
        op.check_post(bias is not None, op.post.residual)
        if op.packs_weights_compiled():
            self.weight = op.scratch("weight") if scratch else tvm.runtime.empty(op.blocked_weight_shape, "float32")
            src = user_operand(weight if isinstance(weight, tvm.runtime.Tensor) else np.ascontiguousarray(weight))
            op.prepare()
            op.transforms["pack_weights"](src, self.weight)
        else:  # depthwise and block-diagonal panels: numpy, once
            w = weight.numpy() if isinstance(weight, tvm.runtime.Tensor) else weight
            self.weight = tvm.runtime.tensor(op.pack_weights(w))
        self.bias = None if bias is None else tvm.runtime.tensor(op.pack_bias(bias))

    def __call__(self, data, residual=None, out=None):
        if self.op.user_batch != self.op.layer.n:
            return self._user_form(data, residual, out)
        return self._planned(data, residual, out)

    def _planned(self, data, residual, out):
        op = self.op
        check_operand("data", data, self._in_shape, "float32")
        op.check_post(self.bias is not None, residual is not None)
        if residual is not None:
            check_operand("residual", residual, self._out_shape, "float32")
        if op.emulate:  # the emulator runs the conv; the transforms are numpy's
            g = op.geometry
            res = None if residual is None else layouts.to_nchwc(residual, g.block, op.out_groups)
            y = op.from_blocked(op.run_blocked(op.to_blocked(data), self.weight, self.bias, res))
            return y if out is None else store(out, y)
        if out is None:
            out = np.empty(self._out_shape, np.float32)
        else:
            check_operand("out", out, self._out_shape, "float32")
            # Overlap is fine here: the input is read into a blocked buffer before out is written.
            check_out(out)
        op.prepare()
        t, xb, yb = op.transforms, op.scratch("data"), op.scratch("out")
        t["to_blocked"](user_operand(data), xb)
        args = [xb, self.weight] + ([self.bias] if self.bias is not None else [])
        if residual is not None:
            t["residual"](user_operand(residual), op.scratch("residual"))
            args.append(op.scratch("residual"))
        op.entry()(*args, yb)
        t["from_blocked"](yb, user_operand(out))
        return out

    def _user_form(self, data, residual, out):
        """Unbatched (C, H, W) arrays, or a batch of 0 (an empty output, no kernel call), as
        F.conv2d takes them: numpy views of one image around the planned call."""
        (in_shape, out_shape), op = self._user_shapes, self.op
        for name, arr in (("data", data), ("residual", residual), ("out", out)):
            if arr is not None and not isinstance(arr, np.ndarray):
                raise TypeError(f"{name} must be a numpy.ndarray for {'unbatched' if op.user_batch is None else 'empty'}"
                                f" input, got {type(arr).__name__}")
        check_operand("data", data, in_shape, "float32")
        op.check_post(self.bias is not None, residual is not None)
        if residual is not None:
            check_operand("residual", residual, out_shape, "float32")
        if out is not None:
            check_operand("out", out, out_shape, "float32")
        if op.user_batch == 0:
            return np.empty(out_shape, np.float32) if out is None else out
        one = lambda a: None if a is None else a.reshape(1, *a.shape)  # noqa: E731  (views: checked contiguous)
        y = self._planned(one(data), one(residual), one(out))
        return y.reshape(out_shape) if out is None else out


@dataclass
class Scheduled:
    """A float32 conv2d scheduled and tensorized but not compiled: what the Relax integration
    puts into a model (`mod["main"]`), and what `build` compiles into an operator."""

    cls: type
    geometry: Geometry
    isa: Isa
    mod: tvm.IRModule
    plan: Plan
    post: PostOps
    threads: int | None
    emulate: bool = False

    def build(self) -> Conv2dOp:
        return self.cls(self.geometry, self.isa, tvm.compile(self.mod, target=self.isa.target), self.threads,
                        self.plan, self.post, self.emulate)
