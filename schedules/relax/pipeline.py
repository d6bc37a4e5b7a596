"""Whole models through Relax, end to end: the pass pipeline around our convs and the build.

`optimize(mod, target, params)` (or `optimize_pass(...)` inside a user's own pipeline):
  1. binds `params` (weights given as function inputs become constants) and folds inference
     batch norms into the preceding convs' weights and bias (batchnorm.py; where no conv
     precedes one, into a scale and shift),
  2. pads channel counts to whole blocks (channels.py: zero filters, the padding carried
     through per-channel ops to the next convs' zero weights), then converts the float32 convs
     with static shapes to NCHW16c data / OIHW16i16o weights (depthwise: OIHW16o) with
     TVM's ConvertLayout, which carries the elementwise ops between them into the blocked
     layout and leaves one layout transform at the model's entry and one at its exit (every
     other conv, and ops such as conv2d_transpose, keep their layouts: `_desired_layouts`; a
     stack, whose layout rule in TVM 0.27 breaks the next op's, goes in as a concat of expand_dims);
     FoldConstant packs the weights then, at compile time, into exactly our weight layout,
  3. replaces each conv2d by a `call_tir` of our tensorized PrimFunc (one per distinct layer
     geometry and post-ops, shared by the layers that repeat it), with algorithm="auto"
     (Winograd weights transformed here, once),
  4. folds what follows a conv into its output tiles' store (oneDNN's post-ops): the chain
     conv2d -> [add(per-channel constant: bias)] -> [add(tensor of the output's shape:
     residual)] -> [relu | clip | maximum with 0 | maximum then minimum with constants], where
     each intermediate value has no other user (clips are split into maximum and minimum
     first, which ConvertLayout can carry through the blocked layout and it cannot a clip).
  5. replaces each matmul by a constant matrix (a Linear layer), with the bias add after it,
     by a call of our packed matmul on the GEMM tiles (linear.py),
  6. lowers every other op with TVM's legalization and schedules it (rest.py: pools, the mean,
     the classifier's matmul, adds that follow no conv, the edge layout transforms: vectorized
     and parallel), unless `lower=False`, which returns the Relax graph of steps 1-5.
Compile the result with `tvm.compile(mod, target=Target(...))` (`build` does both steps, its
PrimFuncs' machine code made on every core: codegen.py; where they fail on a model TVM's own
build takes, that build, with a warning and the reason in the report) and run it on
`relax.VirtualMachine`.

Which ops run where: conv2d.py's module doc.
"""

from __future__ import annotations

import functools

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from microkernels import DEFAULT_TILES

from ..common import cache
from ..common.targets import float_isa, int_isa, int_target, resolve, thread_count
from ..conv.geometry import block_diagonal, lane_groups
from . import exprs
from .batchnorm import fold_batch_norm
from .cancel import cancel_transforms
from .channels import pad_channels
from .codegen import compile_model
from .conv2d import LOG, swap
from .fusion import SplitClips
from .fold import fold_layout_transforms, read_tuple_items
from .int8 import qdq_convs
from .linear import swap_matmuls
from .rest import schedule_rest, silu_from_parts


def optimize_pass(target="native", algorithm="auto", threads=None, fuse: bool = True,
                  report: list | None = None, lower: bool = True, autotune: bool = False) -> tvm.transform.Pass:
    """Steps 2-6 of the module doc as one module pass (bind params before it). autotune: time
    each conv layer's candidate plans on this host before choosing (conv2d's autotune=True;
    a few seconds per distinct layer not timed before, kept for later builds)."""
    isa = resolve(target)
    if isa.arch != "x86":
        raise ValueError(f"the Relax integration runs the x86 float32 conv2d; target {target!r} is {isa.arch}")
    if algorithm not in ("auto", "direct"):
        raise ValueError(f"algorithm must be 'auto' or 'direct' inside a model, got {algorithm!r}")
    if not isinstance(autotune, bool):
        raise TypeError(f"autotune must be True or False, got {autotune!r}")
    if autotune and algorithm != "auto":
        raise ValueError("autotune=True chooses each layer's algorithm: use algorithm='auto'")
    threads = thread_count(threads)
    block = DEFAULT_TILES[isa.name][1]
    report = [] if report is None else report

    @tvm.ir.transform.module_pass(opt_level=0, name="MicrokernelsConv2d")
    def run(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod = silu_from_parts(read_tuple_items(mod))  # one op the layout passes see through
        mod = qdq_convs(mod, target, threads, report)
        mod = _fold_batch_norms(mod, report)
        mod = exprs.mutate(mod, SplitClips(mod))
        mod = exprs.mutate(mod, _StacksAsConcats(mod))
        mod = pad_channels(mod, block)  # whole blocks everywhere: ConvertLayout blocks only those
        mod = tvm.transform.Sequential([
            relax.transform.ConvertLayout({}, layout_cb=functools.partial(_desired_layouts, block=block)),
            relax.transform.Normalize(),
        ])(mod)
        mod = fold_layout_transforms(mod)  # the weights' transforms, in numpy: FoldConstant builds one module each
        mod = tvm.transform.Sequential([
            relax.transform.FoldConstant(),
            # The residual input's own copy of the entry transform is the same expression.
            relax.transform.EliminateCommonSubexpr(),
        ])(mod)
        mod = cancel_transforms(swap(mod, target, algorithm, threads, fuse, report, autotune))
        mod = swap_matmuls(mod, target, report, fuse)
        return _lower_rest(mod, threads, report, float_isa(isa)) if lower else mod

    return run


def _desired_layouts(call: relax.Call, block: int) -> dict:
    """ConvertLayout's choice per call: NCHW{block}c for a float32 conv2d with static shapes in
    NCHW/OIHW, the layouts it has for any other op that names them (a float16 or symbolic-batch
    conv, conv2d_transpose), so ConvertLayout hands those NCHW data and they stay TVM's to lower
    (the report says so) instead of meeting a blocked tensor no lowering takes."""
    name, a = call.op.name, call.attrs
    if name == "relax.nn.conv2d" and exprs.dtype(call.args[0]) == exprs.dtype(call.args[1]) == "float32" \
            and exprs.shape(call.args[0]) and exprs.shape(call.args[1]) \
            and (a.data_layout, a.kernel_layout) == ("NCHW", "OIHW"):
        c, o, groups = exprs.shape(call.args[0])[1], exprs.shape(call.args[1])[0], int(a.groups)
        whole = (c // groups) % block == 0 and (o // groups) % block == 0  # groups of whole blocks in and out
        if groups > 1 and c % block == 0 and o % block == 0 and (
                (groups == c == o and exprs.shape(call.args[1])[1] == 1)
                or lane_groups(c, o, groups) or block_diagonal(c, o, groups, block)
                or (c // groups > block and not whole)):
            # Depthwise, or narrow groups on the plain blocked layout (RegNetY's 8 channels, ResNeXt's
            # 4): filters blocked by output channel alone (conv2d.py repacks them), so what runs
            # between it and its neighbours stays blocked too. Groups wider than a block that are
            # not whole blocks (RegNetY-1.6GF's 24 channels on 336) likewise: conv2d.py regroups
            # the blocked tensor into their own layout and back.
            return {name: [f"NCHW{block}c", f"OIHW{block}o"]}
        if groups > 1 and not whole:
            # Groups that are not whole blocks in and out: conv2d.py packs them its own way (TVM's
            # rule would block one whose inputs are whole blocks but outputs are not, mixing groups
            # in an output block).
            return {name: ["NCHW", "OIHW"]}
        return {name: [f"NCHW{block}c", f"OIHW{block}i{block}o"]}
    if hasattr(a, "data_layout") and hasattr(a, "kernel_layout"):
        return {name: [a.data_layout, a.kernel_layout]}
    return {}


_STACK = tvm.ir.Op.get("relax.stack")


@relax.expr_functor.mutator
class _StacksAsConcats(relax.PyExprMutator):
    """stack(ts, axis) -> concat([expand_dims(t, axis) for t in ts], axis), the same tensor, for
    ConvertLayout: TVM 0.27's layout rule for stack names the new axis "S", which the next op's
    rule cannot find ("Invalid SLayout: can't find S in source layout ABCD": TVM's importer
    writes ONNX's Sum and Max of several tensors as a stack and a reduction over it), while
    expand_dims and concat hand a blocked tensor's NCHW form on, as their rules say."""

    def visit_call_(self, call):
        call = super().visit_call_(call)
        ndim = getattr(call.ty, "ndim", -1)
        if not exprs.is_call(call, _STACK) or ndim < 1 or not isinstance(call.args[0].ty, relax.TupleType):
            return call
        tensors = call.args[0]
        axis = 0 if call.attrs.axis is None else int(call.attrs.axis)
        axis = axis + ndim if axis < 0 else axis
        parts = tensors.fields if isinstance(tensors, relax.Tuple) else \
            [relax.TupleGetItem(tensors, i) for i in range(len(tensors.ty.fields))]
        return relax.op.concat([self.builder_.emit(relax.op.expand_dims(t, axis)) for t in parts], axis)


def _fold_batch_norms(mod: tvm.IRModule, report: list) -> tvm.IRModule:
    folds: list = []
    mod = fold_batch_norm(mod, folds)
    for f in folds:
        into = {"conv2d": "into the conv's weights and bias", "scale_shift": "into a scale and shift"}
        report.append({"op": "batch_norm", "runs_on": "folded" if f["folded_into"] else "kept",
                       "reason": into.get(f["folded_into"], f["reason"])})
    return mod


def _lower_rest(mod: tvm.IRModule, threads, report: list, isa) -> tvm.IRModule:
    rest: list = []
    mod = schedule_rest(mod, threads, rest, isa)
    for r in rest:
        LOG.info("%s: %s (%s)", r["op"], r["runs_on"], r["reason"])
    report += rest
    return mod


def optimize(mod: tvm.IRModule, target="native", params: dict | None = None, algorithm="auto", threads=None,
             fuse: bool = True, report: list | None = None, lower: bool = True, autotune: bool = False) -> tvm.IRModule:
    """The module doc's steps on `mod`; `params` maps "main"'s parameter names to numpy or TVM
    arrays. `report`, when given a list, receives one dict per conv2d (where it runs, why).
    autotune: time each conv layer's candidate plans on this host first (optimize_pass)."""
    return optimize_pass(target, algorithm, threads, fuse, report, lower, autotune)(_bound(mod, params))


def _bound(mod: tvm.IRModule, params: dict | None) -> tvm.IRModule:
    """`mod` with `params` bound as constants of main (checked_params first)."""
    return relax.transform.BindParams("main", checked_params(mod, params))(mod) if params else mod


def checked_params(mod: tvm.IRModule, params: dict) -> dict:
    """`params` as TVM tensors, each checked against main's parameter of that name: it must
    exist, and a numpy array or TVM tensor must have its dtype and shape (a symbolic dimension
    takes any size). Lists and scalars take the declared dtype. TVM's BindParams would fail on
    a wrong name with an internal check, and bind a wrong shape silently."""
    sig = {p.name: p.ty for p in mod["main"].params}
    unknown = sorted(set(params) - set(sig))
    if unknown:
        raise ValueError(f"params {unknown} name no parameter of main; its parameters are {sorted(sig)}")
    out = {}
    for name, v in params.items():
        want = sig[name]
        if not isinstance(want, relax.TensorType):
            raise ValueError(f"params[{name!r}]: main's {name} is not a tensor ({want}), so it cannot be bound")
        if isinstance(v, tvm.runtime.Tensor):
            arr_dtype, arr_shape = str(v.dtype), tuple(v.shape)
        else:
            v = v if isinstance(v, np.ndarray) else np.asarray(v, str(want.dtype))
            arr_dtype, arr_shape = str(v.dtype), v.shape
        if arr_dtype != str(want.dtype):
            raise ValueError(f"params[{name!r}] has dtype {arr_dtype}, main's {name} is {want.dtype}")
        dims = [d.value if isinstance(d, tvm.tirx.IntImm) else None for d in getattr(want.shape, "values", want.shape)] \
            if want.shape is not None else None
        if dims is not None and (len(dims) != len(arr_shape)
                                 or any(d is not None and d != a for d, a in zip(dims, arr_shape))):
            shown = "(" + ", ".join("?" if d is None else str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"
            raise ValueError(f"params[{name!r}] has shape {arr_shape}, main's {name} is {shown}")
        out[name] = v if isinstance(v, tvm.runtime.Tensor) else tvm.runtime.tensor(np.ascontiguousarray(v))
    return out


def llvm_target(target="native", quantized: bool = False) -> tvm.target.Target:
    """The Target a Relax build wants (an object, not the dict a PrimFunc build takes): the
    user's own when they pass one (its mcpu tunes the rest of the model), else the preset's.
    quantized: a model with our int8 convs, whose tiles need the integer ISA's features (VNNI)
    in the target the whole module is compiled for: the integer tiles' target then."""
    if isinstance(target, tvm.target.Target):
        resolve(target)  # refuses a target no kernel family serves
        return target
    isa = resolve(target)
    if quantized and isa.arch == "x86":
        return tvm.target.Target(int_target(int_isa(target, isa)))
    return tvm.target.Target(float_isa(isa).target)


def is_quantized(mod: tvm.IRModule) -> bool:
    """Whether `mod` holds a QuantizeLinear (relax.quantize): a QDQ model, whose convs run ours in int8."""
    found = []
    op = tvm.ir.Op.get("relax.quantize")

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.same_as(op):
            found.append(expr)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


def _said(err: BaseException) -> str:
    """An exception in one line: its type and its message's last line (TVM's own stack above it)."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[-1].strip()}" if lines else type(err).__name__


def _tvms_own(mod: tvm.IRModule, llvm: tvm.target.Target, err: Exception):
    """tvm.compile of `mod` itself, when our pass or the build of its output raised `err`: the
    pass must not turn a model TVM builds into one it cannot build. Warns (naming `err`, a bug
    of ours to report); where TVM's own build fails too, `err` stands."""
    try:
        ex = tvm.compile(mod, target=llvm)
    except Exception as own:  # noqa: BLE001 - any failure of TVM's own leaves ours the error to raise
        LOG.info("our build of the model failed (%s); TVM's own build fails too (%s)", _said(err), _said(own))
        raise err from None
    LOG.warning("our pass's output failed to build (%s): the model is TVM's own build instead, without our kernels; "
                "please report this model to tvm-microkernels", _said(err), extra={"mk_fallback": True})
    return ex


def build(mod: tvm.IRModule, target="native", params: dict | None = None, algorithm="auto", threads=None,
          fuse: bool = True, report: list | None = None, autotune: bool = False, keys: list | None = None):
    """optimize, then tvm.compile for the target: an executable for relax.VirtualMachine. With
    the compile cache on (schedules/common/cache.py), a model built before, by any process,
    with the same graph, weights and options is loaded from it instead (a runtime.Module,
    which relax.VirtualMachine takes the same way); `report` then gets the first build's.
    autotune: optimize's (each conv layer's plans timed on this host first). keys: a list that
    receives the cache key the model is kept under (nothing with the cache off).
    Where the pass, or the build of its output, fails on a model TVM's own build takes, the
    result is TVM's own build, with a warning and the reason in `report` (one entry, op
    "model"; not cached); where TVM's own build fails too, the pass's error is raised. Wrong
    options are refused first (ValueError), never built around."""
    mod = _bound(mod, params)
    llvm = llvm_target(target, is_quantized(mod))
    key = functools.partial(cache.key, "model", tvm_ffi.structural_hash(mod), str(llvm), str(resolve(target).name),
                            algorithm, threads, fuse, autotune)
    k = key() if cache.enabled() else None
    hit = cache.load_library(k) if k else None
    if hit is not None:
        lib, meta = hit
        LOG.info("model loaded from the compile cache (%s)", k)
        if report is not None:
            report += meta["report"]
        if keys is not None:
            keys.append(k)
        return lib
    ops: list = []
    run = optimize_pass(target, algorithm, threads, fuse, ops, autotune=autotune)  # refuses wrong options first
    try:
        ex = compile_model(run(mod), llvm)
    except Exception as err:  # noqa: BLE001 - _tvms_own re-raises it unless TVM builds the model; never silent
        ex = _tvms_own(mod, llvm, err)
        ops[:] = [{"op": "model", "runs_on": "tvm", "reason": f"our pass's output failed to build ({_said(err)}): "
                   "the model is TVM's own build"}]
        k = None  # not cached: the next build tries ours again (the failure may be transient)
    if report is not None:
        report += ops
    if k and autotune:  # under the measurements it was built with, which autotune may have added to
        k = key()
    if k:
        cache.put_library(k, ex, {"report": ops})
        if keys is not None:
            keys.append(k)
    return ex
