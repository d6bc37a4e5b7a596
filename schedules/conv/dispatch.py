"""conv2d's one entry point: checks the arguments, picks the family that runs the layer, and
schedules it. The only module that imports the families; they never import each other.

Order of choice on x86 (float32): Winograd where `algorithm` asks for it (or "auto" finds it
measured faster: winograd.choose), else depthwise (one input channel per group, or groups of
2, 4 or 8 channels with as many outputs: the kernel's grouped variant), else the direct conv,
on wider groups with block-diagonal weights where the layer's groups are narrower than a block
(grouped: other narrow groups, or a fused residual). The ARM targets run the quantized spatial pack (int8).
Two layers fused, MobileNet's 1x1 expand and the depthwise conv after it: inverted
(inverted_residual, and schedule_inverted for the Relax pass).

autotune=True (x86 float32, algorithm="auto"): the layer's candidate plans (candidates) are
compiled and timed on this host (autotune.py) unless they were before, and the fastest is kept
per layer and thread count (common/tuned.py); "auto" then takes it over every rule, with or
without autotune=True, until the measurements are deleted or made for another host.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os

import numpy as np
import tvm

from intrinsics.templates import DEFAULT_CLIP
from microkernels import DEFAULT_TILES, NARROW_TILES

from ..common import cache, parallel, tuned
from ..common.targets import (
    check_emulate,
    dtype_name,
    float_isa,
    int_isa,
    positive_int,
    require_host,
    resolve,
    thread_count,
)
from . import autotune, depthwise, direct, grouped, int8, inverted, winograd
from .geometry import (
    NO_POST_OPS,
    ConvBlocking,
    ConvParams,
    Geometry,
    PostOps,
    Quantization,
)
from .op import Conv2dOp, Scheduled

LOG = logging.getLogger("tvm_microkernels.autotune")
NO_BLOCKING = ConvBlocking()  # the host's caches
ALGORITHMS = ("auto", "direct", "winograd")

# conv2d's keyword options beyond the layer, the dtype, the target and the algorithm, with
# their defaults: each becomes part of one of the values schedule() takes.
OPTIONS = {"threads": None, "blocking": ConvBlocking(), "tile": None, "emulate": False, "autotune": False,
           "bias": False, "residual": False, "activation": None, "clip": DEFAULT_CLIP,
           "input_zero_point": None, "weight_zero_point": None, "weight_dtype": None,
           "output_dtype": None, "input_scale": None, "weight_scale": None, "output_scale": None,
           "output_zero_point": None, "data_layout": None, "residual_scale": None, "residual_zero_point": None,
           "sum_scale": None, "sum_zero_point": None, "weight_bits": None}
# The quantized conv2d's options, in Quantization's field order after dtype.
QUANT_OPTIONS = ("weight_dtype", "input_zero_point", "weight_zero_point", "output_dtype", "input_scale",
                 "weight_scale", "output_scale", "output_zero_point", "data_layout", "residual_scale",
                 "residual_zero_point", "sum_scale", "sum_zero_point", "weight_bits")


def conv2d(data_shape, weight_shape, stride=1, padding=0, dilation=1, groups=1, dtype="float32",
           target="native", algorithm="auto", **options):
    """Compile a conv2d for NCHW data of `data_shape` and OIHW weights of `weight_shape`.

    stride, dilation: int or (h, w) (or (v,)). padding: int, (h, w), (top, left, bottom, right),
    "valid" or "same" (PyTorch's split: an odd total pads the bottom/right more; stride 1 only).
    target: "x86-avx512", "x86-avx2" or "native" (float32), or "armv7-neon", "aarch64-neon",
    "aarch64-dotprod" (quantized: dtype "int8"/"uint8", int32 output of
    sum (x - input_zero_point) * (w - weight_zero_point); weight_dtype defaults to "int8";
    dtype "int16" takes data the legalize pass already widened).
    algorithm (float32, x86): "auto" (Winograd where it applies and measured faster, else
    direct; op.plan says which and why), "direct", or "winograd" with tile = 2, 4 or 6
    (F(tile x tile, 3 x 3); 3x3 kernels, stride 1, dilation 1, groups 1 only). Quantized
    (x86): "auto" runs 3x3 stride-1 layers on the int16 upcast (hosts
    without VNNI) as exact integer Winograd F(2x2, 3x3), "direct" never, "winograd" or an error
    saying why it does not apply (conv.int8.forms.winograd).
    autotune (x86 float32, algorithm "auto"): time the layer's candidate plans on this host
    first (a few seconds, once per layer and thread count: the result is kept, see
    common/tuned.py) and run the fastest; op.plan["source"] then names the measurements.
    Keyword options (OPTIONS): threads, TVM's pool size while it runs (None: one per core; the
    ARM targets run single-threaded); blocking, the cache budgets (ConvBlocking); tile;
    bias, residual, activation, clip (float32, x86): post-ops fused into the output tiles'
    store (PostOps): out = activation(conv + bias + residual), activation None, "relu",
    "clip" (to `clip`, ReLU6 by default) or a vector-math activation (microkernels.
    VECTOR_ACTIVATIONS: "silu", "gelu", ...; not on Winograd), and the op then takes op(data, weight, bias=,
    residual=); input_zero_point, weight_zero_point, weight_dtype, output_dtype and the scales
    (quantized, Quantization; residual=True with residual_scale, residual_zero_point, sum_scale,
    sum_zero_point fuses a quantized residual add, x86 8-bit outputs; weight_bits=7 promises
    weights whose pairs (input channels 2i, 2i + 1 at a tap) have |w_a| + |w_b| <= 128, as 7-bit
    weights do, and runs the layer on the exact vpmaddubsw tile on x86 hosts without VNNI; packing
    refuses weights that break it);
    emulate (x86): calls run on the Bochs CPU, one thread: AVX-512 numerics on a host without it.
    Returns a Conv2dOp (x86; a WinogradConv2dOp for Winograd) or an Int8Conv2dOp (ARM):
    op(data, weight) -> NCHW output. As F.conv2d, x86 float32 also takes unbatched data_shape
    (C, H, W) (op takes and returns (C, H, W) / (O, OH, OW) arrays) and a batch of 0 (an empty
    output, no kernel call); its blocked path (run_blocked) works on one image then.
    """
    planned, batch = user_batch(data_shape)
    s = schedule_args(planned, weight_shape, stride, padding, dilation, groups, dtype, target, algorithm, **options)
    if batch != planned[0] and not isinstance(s, Scheduled):
        raise ValueError(f"data_shape {tuple(data_shape)}: unbatched input and a batch of 0 are taken by the x86 "
                         "float32 conv2d; give the ARM targets (N, C, H, W) with N >= 1")
    op = s.build()
    op.user_batch = batch
    return op


def user_batch(data_shape) -> tuple:
    """(the NCHW shape to plan for, the batch the NCHW paths take): F.conv2d's unbatched
    (C, H, W) input is planned as one image, batch None; a batch of 0 is planned as one image and
    runs no kernel. Anything else is passed on as it is, for ConvParams to check."""
    if not isinstance(data_shape, (tuple, list)) or len(data_shape) not in (3, 4):
        raise ValueError(f"data_shape must be (N, C, H, W) or, unbatched, (C, H, W), got {data_shape!r}")
    if len(data_shape) == 3:
        return (1, *data_shape), None
    if isinstance(data_shape[0], (int, np.integer)) and not isinstance(data_shape[0], (bool, np.bool_)) \
            and data_shape[0] == 0:
        return (1, *data_shape[1:]), 0
    return data_shape, data_shape[0]


def schedule_args(data_shape, weight_shape, stride=1, padding=0, dilation=1, groups=1, dtype="float32",
                  target="native", algorithm="auto", **options):
    """conv2d's checks and planning without the compile (same arguments): schedule() on the
    values they make."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"conv2d() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
                        f"it takes {', '.join(OPTIONS)}")
    o = {**OPTIONS, **options}
    dtype = dtype_name("dtype", dtype)
    quant = None
    if dtype != "float32" or any(o[a] is not None for a in QUANT_OPTIONS if a != "data_layout"):
        given = {a: o[a] for a in QUANT_OPTIONS if o[a] is not None}
        quant = Quantization(dtype, **given)
    post = PostOps(o["bias"], o["residual"], o["activation"], o["clip"])
    layout = o["data_layout"] or "NCHW"
    if layout != "NCHW" and quant is None:
        raise ValueError(f"data_layout={layout!r} is an option of the quantized conv2d; float32 takes NCHW")
    if layout == "NHWC" and isinstance(data_shape, (tuple, list)) and len(data_shape) == 4:
        # The shapes stay NCHW inside: the family reads and writes NHWC.
        n, h, w, c = data_shape
        data_shape = (n, c, h, w)
    return schedule(ConvParams(data_shape, weight_shape, stride, padding, dilation, groups), post_ops=post,
                    quant=quant, target=target, algorithm=algorithm, tile=o["tile"], threads=o["threads"],
                    blocking=o["blocking"], emulate=o["emulate"], autotune=o["autotune"])


def schedule(conv: ConvParams, *, post_ops: PostOps = NO_POST_OPS, quant: Quantization | None = None,
             target="native", algorithm="auto", tile=None, threads=None, blocking: ConvBlocking = ConvBlocking(),
             emulate=False, autotune=False):
    """A Scheduled (planned and tensorized, not compiled) on the x86 float32 targets; on ARM
    the compiled Int8Conv2dOp, whose build() returns itself. quant: None for float32."""
    if not isinstance(autotune, bool):
        raise TypeError(f"autotune must be True or False, got {autotune!r}")
    if autotune and algorithm != "auto":
        raise ValueError(f"autotune=True chooses the algorithm: use algorithm='auto', not {algorithm!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r} is not available; use 'auto', 'direct' or 'winograd'")
    if tile is not None and algorithm != "winograd":
        raise ValueError(f"tile={tile!r} applies to algorithm='winograd' only")
    if tile is not None:
        tile = positive_int("tile", tile)  # numpy integers too; the family says which tiles it has
    if not isinstance(blocking, ConvBlocking):
        raise TypeError(f"blocking must be a schedules.ConvBlocking, got {type(blocking).__name__}")
    if not isinstance(post_ops, PostOps):
        raise TypeError(f"post_ops must be a schedules.PostOps, got {type(post_ops).__name__}")
    threads = thread_count(threads)
    isa = resolve(target)
    emulate = check_emulate(emulate, isa)
    if isa.arch != "x86":
        if algorithm == "winograd":
            raise ValueError("algorithm='winograd' is an x86 float32 path; the ARM targets run the quantized spatial pack")
        if post_ops:
            raise ValueError("bias, residual and activation are fused on the x86 float32 conv2d only")
        quant = quant or Quantization("float32")  # refused by the family, naming the dtypes it takes
        g = Geometry.of(conv, block=int8.conv_kernel(isa).nr)
        return int8.schedule(g, isa, quant)
    if quant is not None:
        if quant.dtype in ("int8", "uint8", "int16"):
            if tile is not None:
                raise ValueError(f"tile={tile!r} chooses the float32 Winograd tile; the quantized Winograd is "
                                 "F(2x2, 3x3) only")
            iisa = int_isa(target, isa)
            if emulate and iisa.name == "avxvnni":
                raise ValueError("emulate=True: the Bochs CPU has no AVX-VNNI; use target 'x86-avx512vnni' "
                                 "(the same instruction on AVX-512) or run natively")
            g = Geometry.of(conv, block=int8.conv_kernel(iisa).nr)
            return int8.schedule(g, iisa, quant, post_ops, threads, emulate, algorithm)
        if quant.dtype != "float32":
            raise ValueError(f"dtype {quant.dtype!r} is not supported on x86 targets; use 'float32', or "
                             "'uint8' / 'int8' for the quantized conv2d")
        raise ValueError("zero points and weight_dtype apply to quantized conv2d only (dtype 'uint8' or 'int8')")
    isa = float_isa(isa)
    pool = threads or os.cpu_count() or 1  # the threads the plan divides work among
    if autotune:
        if emulate:
            raise ValueError("autotune=True times the layer on this host; an emulated op cannot be timed")
        measure(conv, post_ops, target, threads, blocking)
    # Everything the schedule depends on (the host's caches, the sources and the measurements
    # (tuned.py) are in every key).
    return cache.cached("schedule", (conv, post_ops, isa.name, algorithm, tile, threads, pool, blocking.l1,
                                     blocking.l2, emulate),
                        lambda: _schedule_x86(conv, post_ops, isa, algorithm, tile, threads, pool, blocking, emulate),
                        valid=lambda s: _schedules(s, conv, post_ops, isa.name))


def _schedules(s, conv: ConvParams, post_ops: PostOps, isa_name: str) -> bool:
    """Whether a compile cache entry holds a schedule of this layer (an entry that does not is
    rebuilt): the cache binds entries to their keys, this checks what they hold."""
    if not (isinstance(s, Scheduled) and isinstance(s.mod, tvm.IRModule) and isinstance(s.geometry, Geometry)
            and s.post == post_ops and getattr(s.isa, "name", None) == isa_name):
        return False
    g, (o, _, kh, kw) = s.geometry, conv.weight_shape
    return ((g.n, g.c, g.h, g.w) == tuple(conv.data_shape) and (g.o, g.kh, g.kw) == (o, kh, kw)
            and g.stride == conv.stride and g.dilation == conv.dilation and g.pad == conv.padding)


def layer_key(conv: ConvParams) -> str:
    """How the measurements name a layer: its shapes and parameters (not its post-ops, which
    hardly move the best plan, so one timing serves every fusion of the layer)."""
    return (f"{'x'.join(map(str, conv.data_shape))} {'x'.join(map(str, conv.weight_shape))} "
            f"s{conv.stride[0]},{conv.stride[1]} p{','.join(map(str, conv.padding))} "
            f"d{conv.dilation[0]},{conv.dilation[1]} g{conv.groups}")


def candidates(conv: ConvParams, isa, pool: int, blocking: ConvBlocking = NO_BLOCKING,
               post_ops: PostOps = NO_POST_OPS) -> list[dict]:
    """The plans autotune times for a layer on x86, as choices (_schedule_x86): the planned
    variant of the family that runs it and its neighbours (direct.variants or
    depthwise.variants), and Winograd F(2), F(4), F(6) where it applies."""
    mr, nr = tile_for(conv, isa)
    g = Geometry.of(conv, block=nr)
    if _runs_depthwise(g, post_ops):
        return [{"algorithm": "depthwise", **dataclasses.asdict(v)}
                for v in depthwise.variants(g, isa, post_ops, blocking, pool)]
    out = [{"algorithm": "direct", **dataclasses.asdict(v)}
           for v in direct.variants(_direct_geometry(g), isa, mr, blocking, pool)]
    if winograd.refusal(g, post_ops) is None:
        out += [{"algorithm": "winograd", "tile": m} for m in winograd.TILES]
    return out


def tile_for(conv: ConvParams, isa) -> tuple[int, int]:
    """The direct conv's (MR, NR) tile on x86, NR being the output block: the ISA's default, or
    its narrow tile (NARROW_TILES) for groups wider than the default block that the narrow one
    pads to fewer multiply-adds (RegNetX's 24 channels a group: 3 blocks of 8 on AVX2, not 2 of
    16). Narrower groups keep the default block, on which they run in the lanes or block-diagonal."""
    mr, nr = DEFAULT_TILES[isa.name]
    narrow = NARROW_TILES.get(isa.name)
    groups = conv.groups
    if narrow is None or groups < 2:
        return mr, nr
    cg, og = conv.data_shape[1] // groups, conv.weight_shape[0] // groups
    if cg <= nr:
        return mr, nr

    def padded(b: int) -> int:
        return -(-cg // b) * b * -(-og // b) * b

    return narrow if padded(narrow[1]) < padded(nr) else (mr, nr)


def _runs_depthwise(g: Geometry, post_ops: PostOps) -> bool:
    """Narrow groups take the depthwise family's grouped kernel unless a residual is fused (its
    epilogue has none; the block-diagonal direct conv has)."""
    return g.depthwise or (depthwise.lane_groups(g) and not post_ops.residual)


def _direct_geometry(g: Geometry) -> Geometry:
    """What the direct conv computes for g: wider groups with block-diagonal weights where g's
    groups are narrower than a block (grouped.widen), else g itself."""
    return grouped.widen(g) if grouped.applies(g) else g


def _variant(choice: dict):
    """The family's Variant a direct or depthwise choice names (TypeError on missing fields)."""
    fields = {k: v for k, v in choice.items() if k != "algorithm"}
    return (direct.Variant if choice["algorithm"] == "direct" else depthwise.Variant)(**fields)


def scheduled_candidates(conv: ConvParams, post_ops: PostOps, isa, threads,
                         blocking: ConvBlocking = NO_BLOCKING) -> list[tuple[dict, Scheduled]]:
    """Each of the layer's candidates (candidates) with its Scheduled layer, not compiled;
    scheduled among the cores (common/parallel.py)."""
    pool = threads or os.cpu_count() or 1
    choices = candidates(conv, isa, pool, blocking, post_ops)
    make = [functools.partial(_schedule_x86, conv, post_ops, isa, "auto", None, threads, pool, blocking, False, c)
            for c in choices]
    return [(c, s or m()) for c, s, m in zip(choices, parallel.run(make), make)]


def plan_label(plan) -> str:
    """The candidate a plan is, in choice_label's form."""
    if plan.algorithm == "winograd":
        return f"F({plan.tile})"
    if plan.algorithm == "direct":
        return direct.Variant(plan.mr, plan.output_blocks, plan.band_rows, plan.band_parallel).label
    return depthwise.Variant(plan.step, plan.band_rows).label


def choice_label(choice: dict) -> str:
    if choice["algorithm"] == "winograd":
        return f"F({choice['tile']})"
    return _variant(choice).label


def measure(conv: ConvParams, post_ops: PostOps = NO_POST_OPS, target="native", threads=None,
            blocking: ConvBlocking = NO_BLOCKING, budget: float = autotune.BUDGET, again: bool = False) -> dict | None:
    """autotune=True's step: unless this layer was timed on this host at this thread count
    (or `again`), compile and time its candidates (autotune.py) and keep the fastest
    (tuned.save_layer). Returns the layer's entry; None where there is nothing to choose (a
    1x1 depthwise layer, which stays plain TIR)."""
    isa = resolve(target)
    if isa.arch != "x86":
        raise ValueError(f"autotune times the x86 float32 conv2d; target {isa.name} is {isa.arch}")
    require_host(isa)
    threads = thread_count(threads)
    pool = threads or os.cpu_count() or 1
    entry = tuned.layer(isa.name, layer_key(conv), pool)
    if entry is not None and not again:
        return entry
    plans = scheduled_candidates(conv, post_ops, isa, threads, blocking)
    if len(plans) < 2:
        return None
    ops = {choice_label(c): s.build() for c, s in plans}
    seconds = autotune.time_candidates(ops, budget)
    best = min(seconds, key=seconds.get)
    choice = plans[list(ops).index(best)][0]
    tuned.save_layer(isa.name, layer_key(conv), pool, choice, seconds)
    LOG.info("autotune %s, %d thread(s): %s", layer_key(conv), pool,
             ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in sorted(seconds.items(), key=lambda kv: kv[1])))
    return tuned.layer(isa.name, layer_key(conv), pool)


def _measured_choice(conv: ConvParams, g: Geometry, isa, pool: int, post_ops: PostOps) -> tuple[dict, str, str] | None:
    """(choice, reason, source) from the layer's own timing (autotune), or None. A choice this
    layer cannot take (a hand-edited file) is ignored with a warning."""
    entry = tuned.layer(isa.name, layer_key(conv), pool)
    if entry is None:
        return None
    choice, seconds = entry["choice"], entry["seconds"]
    if choice["algorithm"] == "winograd" and winograd.refusal(g) is None and winograd.refusal(g, post_ops):
        # Timed without post-ops (layer_key): Winograd won, but cannot apply this activation;
        # the rules' plan (direct) stands, as it would for any post-op Winograd refuses.
        return None
    try:
        family = "depthwise" if _runs_depthwise(g, post_ops) else "direct"
        if choice["algorithm"] == "winograd":
            if winograd.refusal(g, post_ops) is not None or choice.get("tile") not in winograd.TILES:
                raise ValueError(f"F({choice.get('tile')}) cannot run this layer")
        elif choice["algorithm"] != family:
            raise ValueError(f"the {family} family runs this layer")
        elif family == "depthwise":
            _variant(choice).check(g, isa, post_ops)
        else:
            _variant(choice).check(_direct_geometry(g), isa)
        label = choice_label(choice)
    except (TypeError, ValueError) as e:
        LOG.warning("ignoring the measured plan %r of %s, %d thread(s), from %s: %s; using the rules' plan instead",
                    choice, layer_key(conv), pool, entry["source"], e)
        return None
    listed = ", ".join(f"{k} {v * 1e3:.3g} ms" for k, v in sorted(seconds.items(), key=lambda kv: kv[1]))
    return choice, f"{label}: fastest of this layer's plans timed on this host, {pool} thread(s) ({listed})", \
        entry["source"]


def _schedule_x86(conv: ConvParams, post_ops: PostOps, isa, algorithm, tile, threads, pool: int,
                  blocking: ConvBlocking, emulate: bool, choice: dict | None = None):
    """choice: a plan to take as it is (candidates' form); algorithm "auto" takes the layer's
    measured choice where it has one."""
    mr, nr = tile_for(conv, isa)
    g = Geometry.of(conv, block=nr)
    reason, source, variant = None, "defaults", None
    if choice is None and algorithm == "auto":
        measured = _measured_choice(conv, g, isa, pool, post_ops)
        if measured is not None:
            choice, reason, source = measured
    if choice is not None:
        reason = reason or f"{choice_label(choice)}: a candidate autotune times"
        if choice["algorithm"] == "winograd":
            algorithm, tile = "winograd", choice["tile"]
        else:
            algorithm, variant = "direct", _variant(choice)
    if algorithm != "direct":
        if algorithm == "auto":
            tile, reason, source = winograd.choose(g, isa.name, pool, post_ops)
        elif tile is None:
            tile = 4
        if tile is not None:
            mod, plan = winograd.schedule(g, isa, tile, post_ops, blocking, pool, reason or "algorithm='winograd'")
            plan = dataclasses.replace(plan, source=source)
            return Scheduled(winograd.WinogradConv2dOp, g, isa, mod, plan, post_ops, threads, emulate)
    if _runs_depthwise(g, post_ops):
        why = reason if choice is not None else ("groups = input channels: the depthwise kernel" if g.depthwise else
                                                 f"groups of {g.cg} channels in the vector lanes: the depthwise "
                                                 "kernel's grouped variant")
        mod, plan = depthwise.schedule(g, isa, post_ops, blocking, pool, why, variant)
        return Scheduled(depthwise.DepthwiseConv2dOp, g, isa, mod, dataclasses.replace(plan, source=source), post_ops,
                         threads, emulate)
    reason = reason or "algorithm='direct'"
    if grouped.applies(g):  # small groups: blocks of 16 channels with block-diagonal weights
        wide = grouped.widen(g)
        mod, plan = direct.schedule(wide, isa, mr, post_ops, blocking, pool, reason, variant)
        plan = dataclasses.replace(plan, block_diagonal=f"{g.groups} groups of {g.cg} channels as {wide.groups} of {wide.cg}",
                                   source=source)
        cls = functools.partial(grouped.GroupedConv2dOp, user_geometry=g)
        return Scheduled(cls, wide, isa, mod, plan, post_ops, threads, emulate)
    mod, plan = direct.schedule(g, isa, mr, post_ops, blocking, pool, reason, variant)
    return Scheduled(Conv2dOp, g, isa, mod, dataclasses.replace(plan, source=source), post_ops, threads, emulate)


def schedule_inverted(data_shape, expand_weight_shape, dw_weight_shape, stride=1, expand_post: PostOps = NO_POST_OPS,
                      dw_post: PostOps = NO_POST_OPS, target="native"):
    """The fused expand 1x1 + depthwise block's (Layer, isa, tensorized module, plan), not
    compiled (the Relax pass compiles the whole model); inverted_residual compiles an op."""
    lay = inverted.layer(data_shape, expand_weight_shape, dw_weight_shape, stride, expand_post, dw_post)
    isa = resolve(target)
    if isa.arch != "x86":
        raise ValueError(f"the fused inverted residual block is an x86 float32 op, not {isa.name}")
    mod, plan = cache.cached("inverted", (lay, isa.name), lambda: inverted.schedule(lay, isa),
                             valid=lambda v: isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], tvm.IRModule)
                             and isinstance(v[1], inverted.InvertedPlan))
    return lay, isa, mod, plan


inverted_residual = inverted.inverted_residual
inverted_pays = inverted.pays
