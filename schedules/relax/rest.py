"""The ops around the convs: every Relax op our conv pass leaves (pools, the global mean, the
classifier's matmul, adds that follow no conv, layout transforms at the model's edges), lowered
with TVM's legalization and then scheduled here, so none of them runs as TVM's default serial,
scalar loop nest.

TVM 0.27 ships no CPU schedules for these; left to `tvm.compile` they run as one thread of
scalar code (MobileNetV2's mean and classifier alone were 20% of its time). The rules are few,
because after our conv pass these ops are either copies, elementwise maps or small reductions,
all bound by memory:
  - inline every block that can be inlined (pads into pools, elementwise chains into one nest);
  - spatial nest: the loop that walks the output's last dimension goes innermost and is
    vectorized (the channel block of NCHW16c, or W of NCHW), the rest is fused and parallel;
  - reduction nest (max/avg pool, mean over H and W, matmul): the same for its spatial loops,
    with the reduction loops moved between the parallel loop and the vector loop, so each
    thread owns whole outputs and accumulates a vector of them in registers (for a batch-1
    classifier this is a GEMV that reads each weight once, as the matmul's columns are
    the output's last dimension);
  - nests too small to pay for waking the thread pool (about 16k multiply-adds) stay serial.
A function none of the rules fits stays as TVM lowered it; the report says which and why.

The transcendental maps (`VECTOR_MATH`: exp, sigmoid, SiLU, GELU in its erf and tanh forms, tanh) on float32
tensors of static shape are legalized to our vector math instead of TVM's, which calls the
scalar expf once per element (EfficientNet-B0's SiLU alone was half its time) and computes GELU
as 1 + erf(x / sqrt 2), which cancels to 0 below x = -5: each becomes a call of our row kernel
(microkernels/f32_vmap.py, range reduction and polynomials, bounds in microkernels/f32_vmath/)
over the tensor in parallel chunks (intrinsics.f32_vmath.map_func), opaque to FuseOps, so an
elementwise neighbour is a pass of its own. SiLU as the ONNX export writes it, x * sigmoid(x)
(either order), becomes one SiLU first: one pass, not two, and SiLU's bound, not the sum of two.

LayerNorm over the last axis of a float32 tensor (ConvNeXt's tokens, and its NCHW layer norms,
which the frontends write as permute, layer norm, permute) is legalized to the LayerNorm row
kernel (microkernels/f32_layernorm.py, intrinsics.f32_vmath.layer_norm_func): each row of C
values summed, its deviations summed and normalized in L1, rows in parallel chunks. TVM's
legalization reduced across pixels instead, a strided gather per value.

Functions are renamed `mk_<op>` (a prefix `bench`'s breakdown counts as ours) and marked
scheduled and opaque, so `tvm.compile`'s own FuseOps does not fuse them again.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax, s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline

from intrinsics import f32_vmath

from ..common.targets import float_isa, resolve
from . import exprs

PREFIX = "mk_"
SERIAL_WORK = 1 << 14  # below this many loop iterations a parallel region costs more than it saves
VECTOR_STEPS = (64, 32, 16, 8, 4)  # inner vector loop lengths tried, longest first (LLVM splits into registers)
_OPAQUE = 8  # relax.OpPatternKind.kOpaque
# On the legalized row-kernel functions (vector math, layer norm): the report's reason.
_VECTOR_MATH_ATTR = "mk_vector_math"


# Relax op -> the f32_vmath function it computes (float32 only; other dtypes keep TVM's).
VECTOR_MATH = {"relax.exp": "exp", "relax.sigmoid": "sigmoid", "relax.nn.silu": "silu", "relax.nn.gelu": "gelu",
               "relax.tanh": "tanh", "relax.nn.gelu_tanh": "gelu_tanh"}


def _call_ours(bb: relax.BlockBuilder, made: dict, key: tuple, make, name: str, args: list) -> relax.Expr:
    """call_tir of one of our row-kernel PrimFuncs, added once per `key` as mk_<name> (a model
    repeats its shapes: ConvNeXt's 18 GELUs are 4 functions): make() gives (the PrimFunc, what
    the report says of it), the function is marked scheduled and opaque (FuseOps leaves it
    alone); the call's output is shaped as args[0]."""
    gv = made.get(key)
    if gv is None:
        func, how = make()
        func = func.without_attr("global_symbol").with_attr("tir.is_scheduled", True).with_attr(
            "op_pattern", _OPAQUE).with_attr(_VECTOR_MATH_ATTR, how)
        gv = made[key] = bb.add_func(func, PREFIX + name)
        bb.update_func(gv, func.with_attr("global_symbol", gv.name_hint))  # the name add_func made unique
    return relax.call_tir(gv, args, args[0].ty)


def _vector_math_legalizer(op_name: str, fn: str, isa, threads: int | None, made: dict):
    default = tvm.ir.Op.get(op_name).get_attr("FLegalize")

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        x = call.args[0]
        shape = exprs.shape(x)
        if exprs.dtype(x) != "float32" or shape is None:
            return default(bb, call)
        return _call_ours(bb, made, (fn, shape), lambda: (
            f32_vmath.map_func(fn, shape, isa, threads), f"vector math: {f32_vmath.describe(fn, shape, isa, threads)}"),
            fn, [x])

    return legalize


def _layer_norm_legalizer(isa, threads: int | None, made: dict):
    """relax.nn.layer_norm over the last axis of a float32 tensor of static shape, with gamma
    and beta of C values, as the row kernel (intrinsics.f32_vmath.layer_norm_func); any other
    layer norm keeps TVM's legalization."""
    default = tvm.ir.Op.get("relax.nn.layer_norm").get_attr("FLegalize")

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        x, gamma, beta = call.args
        shape, a = exprs.shape(x), call.attrs
        axes = [int(v) for v in a.axes]
        if (not shape or 0 in shape or any(exprs.dtype(t) != "float32" for t in call.args) or not (a.center and a.scale)
                or [v % len(shape) for v in axes] != [len(shape) - 1]
                or exprs.shape(gamma) != (shape[-1],) or exprs.shape(beta) != (shape[-1],)):
            return default(bb, call)
        eps = float(a.epsilon)
        return _call_ours(bb, made, ("layer_norm", shape, eps), lambda: (
            f32_vmath.layer_norm_func(shape, isa, threads, eps),
            f"layer norm: {f32_vmath.describe_layer_norm(shape, isa, threads, eps)}"), "layer_norm", [x, gamma, beta])

    return legalize


def silu_from_parts(mod: tvm.IRModule) -> tvm.IRModule:
    """x * sigmoid(x) and sigmoid(x) * x -> silu(x) in every Relax function of `mod` (the same x:
    a product with another tensor's sigmoid is left alone)."""
    from tvm.relax import dpl

    x = dpl.wildcard()
    sig = dpl.is_op("relax.sigmoid")(x)
    pattern = dpl.is_op("relax.multiply")(x, sig) | dpl.is_op("relax.multiply")(sig, x)

    def rewrite(_call, matched):
        return relax.op.nn.silu(matched[x])

    out = {}
    for gv, func in mod.functions_items():
        out[gv] = dpl.rewrite_call(pattern, rewrite, func) if isinstance(func, relax.Function) else func
    return tvm.IRModule(out, attrs=mod.attrs)


def _legalize(isa, threads: int | None) -> tvm.transform.Pass:
    made: dict = {}  # one function per (op, shape), for every call of it in the module
    ours = {op: _vector_math_legalizer(op, fn, isa, threads, made) for op, fn in VECTOR_MATH.items()}
    ours["relax.nn.layer_norm"] = _layer_norm_legalizer(isa, threads, made)
    return tvm.transform.Sequential([
        relax.transform.LegalizeOps(customize_legalize_map=ours),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
    ])


def _extent(sch: s_tir.Schedule, loop) -> int | None:
    e = sch.get(loop).extent
    return int(e) if isinstance(e, tirx.IntImm) else None


def _vector_step(extent: int) -> int:
    if extent <= VECTOR_STEPS[0]:
        return extent
    return next((v for v in VECTOR_STEPS if extent % v == 0), 1)


def _innermost_output_var(block: tirx.SBlock):
    """The block iter var that indexes the written buffer's last dimension by itself (unit
    stride in the output), or None (also for a 0-d buffer: a layer norm's mean over every axis)."""
    if len(block.writes) != 1 or not block.writes[0].region:
        return None
    last = block.writes[0].region[-1].min
    for iv in block.iter_vars:
        if iv.var.same_as(last):
            return iv
    return None


def _schedule_nest(sch: s_tir.Schedule, block_rv, threads: int | None) -> str:
    """One block's loop nest, as the module doc's rules say; returns what was done."""
    block = sch.get(block_rv)
    loops = sch.get_loops(block_rv)
    if len(loops) != len(block.iter_vars):
        raise ValueError(f"{len(loops)} loops for {len(block.iter_vars)} block iters")
    extents = [_extent(sch, lp) for lp in loops]
    if any(e is None for e in extents):
        raise ValueError("symbolic loop extents")
    # The loops come from TE in block-iter order; bind each iter to its loop to reorder.
    spatial = [(lp, iv, e) for lp, iv, e in zip(loops, block.iter_vars, extents) if iv.iter_type == tirx.IterVar.DataPar]
    reduce = [lp for lp, iv in zip(loops, block.iter_vars) if iv.iter_type == tirx.IterVar.CommReduce]
    if len(spatial) + len(reduce) != len(loops) or not spatial:
        raise ValueError("iterators neither spatial nor reductions")
    inner_iv = _innermost_output_var(block)
    inner = next((s for s in spatial if inner_iv is not None and s[1].same_as(inner_iv)), None)
    if inner is None or inner[2] == 1:
        inner = None
    outer = [s[0] for s in spatial if s is not inner]
    order = outer + reduce + ([inner[0]] if inner else [])
    sch.reorder(*order)
    done = []
    vec = None
    if inner is not None:
        step = _vector_step(inner[2])
        if step > 1:
            rest, vec = sch.split(inner[0], [None, step])
            if reduce:
                sch.reorder(rest, *reduce)
            outer.append(rest)
            done.append(f"vector {step}")
        else:
            outer.append(inner[0])
    fused = sch.fuse(*outer) if len(outer) > 1 else (outer[0] if outer else None)
    work = math.prod(extents)
    if fused is not None and (threads is None or threads > 1) and work >= SERIAL_WORK and _extent(sch, fused) > 1:
        sch.parallel(fused)
        done.append("parallel")
    if vec is not None:
        sch.vectorize(vec)  # before the init is split off: TVM vectorizes only complete or reduction blocks
    if reduce:
        init = sch.decompose_reduction(block_rv, reduce[0])
        if vec is not None:
            init_loop = sch.get_loops(init)[-1]
            if sch.get(init_loop).kind != tirx.ForKind.VECTORIZED:
                sch.vectorize(init_loop)
    return ", ".join(done) or "serial"


def schedule_func(func: tirx.PrimFunc, threads: int | None) -> tuple[tirx.PrimFunc, str]:
    """`func` scheduled by the module doc's rules, and a line saying how. Raises ValueError
    (or TVM's ScheduleError) when a rule does not fit; the caller keeps TVM's version then."""
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if len(blocks) > 1:
        # dlight's inliner: every block that TVM can compute_inline into its consumer or
        # reverse_compute_inline into its producer goes; what is left gets a nest each.
        infos = normalize_prim_func(sch)
        if infos is None:
            raise ValueError("blocks the analysis cannot normalize")
        infos = try_inline(sch, infos)
        blocks = [i.block_rv for i in infos]
    how = [_schedule_nest(sch, b, threads) for b in blocks]
    scheduled = sch.mod["main"].with_attr("tir.is_scheduled", True).with_attr("op_pattern", _OPAQUE)
    return scheduled, "; ".join(how)


@relax.expr_functor.mutator
class _Rename(relax.PyExprMutator):
    """call_tir(old gv, ...) -> call_tir(new gv, ...)."""

    def __init__(self, mod, names: dict):
        super().__init__(mod)
        self.names = names

    def visit_global_var_(self, gv):
        return self.names.get(gv, gv)


def schedule_rest(mod: tvm.IRModule, threads: int | None, report: list | None = None, isa=None) -> tvm.IRModule:
    """Legalize every Relax op `mod` still has and schedule each PrimFunc that is not ours.
    `report` (a list) receives one dict per function, as optimize's report has them: "op" (its
    name), "runs_on" ("ours": scheduled here, "tvm": no rule fits, "view": a reshape that
    copies nothing) and "reason". isa: the vector math's (an x86 float32 Isa; None: this host's
    best)."""
    report = [] if report is None else report
    mod = _legalize(float_isa(resolve("native") if isa is None else isa), threads)(silu_from_parts(mod))
    rename = _Rename(mod, {})
    taken = {gv.name_hint for gv, _ in mod.functions_items()}
    for gv, func in mod.functions_items():
        name = gv.name_hint
        if not isinstance(func, tirx.PrimFunc):
            continue
        if _VECTOR_MATH_ATTR in (func.attrs or {}):
            report.append({"op": name, "runs_on": "ours", "reason": str(func.attrs[_VECTOR_MATH_ATTR])})
            continue
        if name.startswith(PREFIX):
            continue
        if relax.analysis.has_reshape_pattern(func):
            # RewriteDataflowReshape (in tvm.compile) turns these into views: no copy, no loop.
            report.append({"op": name, "runs_on": "view", "reason": "reshape without a copy"})
            continue
        try:
            func, how = schedule_func(func, threads)
        except (ValueError, RuntimeError) as e:  # TVM's ScheduleError is a RuntimeError
            lines = str(e).strip().splitlines()
            report.append({"op": name, "runs_on": "tvm", "reason": lines[0] if lines else type(e).__name__})
            continue
        fresh = PREFIX + name
        while fresh in taken:
            fresh += "_"
        taken.add(fresh)
        rename.names[gv] = rename.builder_.add_func(func.with_attr("global_symbol", fresh), fresh)
        report.append({"op": fresh, "runs_on": "ours", "reason": how})
    if not rename.names:
        return mod
    out = exprs.mutate(mod, rename)
    return tvm.IRModule({gv: f for gv, f in out.functions_items() if gv not in rename.names}, attrs=out.attrs)


__all__ = ["PREFIX", "VECTOR_MATH", "schedule_func", "schedule_rest"]
