"""`bench conv2d`: schedules.conv2d over the ResNet-50 v1.5 conv layers, next to PyTorch (oneDNN).

Ours is timed on one user path (`--path`, ours_seconds): by default the compiled kernel on the
blocked layouts (weights packed ahead of time), which is what a model runs; or numpy blocked
arrays, NCHW arrays with weights packed per call, or weights bound once. PyTorch gets plain
NCHW tensors, as a PyTorch model would, and does its own blocking inside oneDNN. Both are timed
in the same process, taking turns over three rounds (best median each); with more than one
thread a pause comes before each turn: TVM's and OpenMP's idle workers spin for a while after
a call and would steal the other side's cores.
Cold cache: before every single call the caches are flushed, the same way for both sides (a
64 MiB write, timing.flush_caches), so every call starts with weights and input in DRAM.
"Network" cache: flushed, then the input read back in, as a layer inside a network at batch 1
meets it (the layer before just wrote its input; its weights were last read an image ago).
--exhaustive times every candidate plan autotune would (direct variants, Winograd tiles) and
says how far algorithm="auto"'s choice is from the fastest.
"""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

import schedules
from microkernels import Isa
from schedules.common.targets import require_host, set_threads
from schedules.common.timing import network_state, seconds_per_call, settle
from schedules.conv import NO_POST_OPS, ConvParams, Geometry
from schedules.conv.autotune import blocked_call
from schedules.conv.dispatch import plan_label, schedule_args, scheduled_candidates
from schedules.conv.winograd import refusal

# Workload tables ship inside the package (benchmarks/workloads/<name>_conv2d.csv), so a clone
# or an installed copy finds them with nothing beside it.
WORKLOADS = resources.files(__package__) / "workloads"
DEFAULT_WORKLOADS = "resnet50_v1.5"


@dataclass(frozen=True)
class Layer:
    c: int
    h: int
    w: int
    o: int
    k: int
    stride: int
    pad: int
    count: int
    row: int = 0  # position in the workload file
    groups: int = 1

    @property
    def label(self) -> str:
        g = f" g{self.groups}" if self.groups > 1 else ""
        return f"{self.c}x{self.h}x{self.w}->{self.o} k{self.k} s{self.stride} p{self.pad}{g}"

    @property
    def weight_shape(self) -> tuple:
        return (self.o, self.c // self.groups, self.k, self.k)

    @property
    def compulsory_bytes(self) -> int:
        """Input and weights read once, output written once, float32: the roofline's bytes."""
        oh, ow = ((d + 2 * self.pad - self.k) // self.stride + 1 for d in (self.h, self.w))
        return 4 * (self.c * self.h * self.w + self.o * (self.c // self.groups) * self.k ** 2 + self.o * oh * ow)

    @property
    def kind(self) -> str:
        """depthwise (one channel per group), pointwise (1x1, groups 1) or other."""
        if self.groups > 1 and self.groups == self.c:
            return "depthwise"
        return "pointwise" if self.k == 1 and self.groups == 1 else "other"

    @property
    def shapes(self) -> tuple:
        return (1, self.c, self.h, self.w), self.weight_shape

    @property
    def kwargs(self) -> dict:
        return dict(stride=self.stride, padding=self.pad, groups=self.groups)

    @property
    def geometry_params(self) -> ConvParams:
        return ConvParams(*self.shapes, **self.kwargs)

    @property
    def geometry(self) -> Geometry:
        return Geometry.of(self.geometry_params)

    def conv(self, isa: Isa, threads: int, algorithm: str = "direct"):
        """Our op for `algorithm`: "direct", "auto" (conv2d's default choice) or "wino2"/"wino4"/
        "wino6" (Winograd F(m x m, 3 x 3)); None where Winograd cannot compute the layer."""
        shapes = self.shapes
        kw = {**self.kwargs, "target": f"x86-{isa.name}", "threads": threads}
        if algorithm in ("direct", "auto"):
            return schedules.conv2d(*shapes, algorithm=algorithm, **kw)
        if refusal(self.geometry):
            return None
        return schedules.conv2d(*shapes, algorithm="winograd", tile=int(algorithm.removeprefix("wino")), **kw)


EXHAUSTIVE = ("direct", "wino2", "wino4", "wino6")


def other_plans(isa: Isa, layer: Layer, threads: int) -> dict:
    """{label: op} of the layer's candidate plans (conv.dispatch.candidates, what autotune
    times) other than the planned one (the "direct" row: the direct or the depthwise family's)
    and Winograd's, which run under their own names."""
    conv = layer.geometry_params
    plans = scheduled_candidates(conv, NO_POST_OPS, isa, threads)
    return {plan_label(s.plan): s.build() for c, s in plans[1:] if c["algorithm"] != "winograd"}


def _distance(isa: Isa, layer: Layer, threads: int, seconds: dict, log) -> float:
    """Log and return algorithm="auto"'s time on `layer` over the fastest plan's, taking the
    chosen plan's time from `seconds` ({plan_label: s}, each timed under its own name: no
    second, noisier timing of the same plan)."""
    plan = schedule_args(*layer.shapes, target=f"x86-{isa.name}", threads=threads, **layer.kwargs).plan
    chosen = plan_label(plan)
    fastest = min(seconds, key=seconds.get)
    if chosen not in seconds:  # a plan no candidate is (the depthwise family): nothing to choose
        log(f"     auto: {chosen} ({plan.source}), the only plan")
        return 1.0
    ratio = seconds[chosen] / seconds[fastest]
    listed = ", ".join(f"{k} {v * 1e3:.3f}" for k, v in sorted(seconds.items(), key=lambda kv: kv[1]))
    log(f"     every plan (ms): {listed}")
    log(f"     auto: {chosen} ({plan.source}); fastest {fastest}: auto/fastest {ratio:.2f}")
    return ratio


def workload_names() -> list[str]:
    return sorted(f.name.removesuffix("_conv2d.csv") for f in WORKLOADS.iterdir() if f.name.endswith("_conv2d.csv"))


def load_workloads(source: str | Path = DEFAULT_WORKLOADS) -> list[Layer]:
    """Layers of a packaged table by name (`workload_names()`), or of a CSV file by path."""
    packaged = WORKLOADS / f"{source}_conv2d.csv"
    if packaged.is_file():
        text = packaged.read_text()
    elif Path(source).is_file():
        text = Path(source).read_text()
    else:
        raise FileNotFoundError(f"no workload table {str(source)!r}: not a file, nor one of the packaged "
                                f"tables {workload_names()}")
    keys = ("in_channels", "height", "width", "out_channels", "kernel", "stride", "padding", "count")
    # "groups" is optional: the ResNet-50 table has none (every layer groups = 1).
    return [Layer(*(int(row[k]) for k in keys), row=i, groups=int(row.get("groups") or 1))
            for i, row in enumerate(csv.DictReader(io.StringIO(text)))]


def torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return f"{torch.__version__} (oneDNN {'on' if torch.backends.mkldnn.is_available() else 'off'})"


def calls_per_repeat(flops: int, peak_gflops: float, cold: bool) -> int:
    """About 20 ms of work at peak per repeat; one call when cold (the flush is per repeat)."""
    return 1 if cold else max(1, int(0.02 * peak_gflops * 1e9 / flops))


def torch_seconds(layer: Layer, x, w, threads: int, number: int, repeat: int, cold: bool,
                  network: bool = False) -> float:
    import torch

    torch.set_num_threads(threads)
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    run = lambda: torch.nn.functional.conv2d(tx, tw, stride=layer.stride, padding=layer.pad,  # noqa: E731
                                             groups=layer.groups)
    with torch.no_grad():
        return seconds_per_call(run, number, repeat, cold, before=network_state(x) if network else None)


def dw_loop_gflops(isa: Isa, layer: Layer, calls: int = 2000, repeat: int = 5) -> float:
    """GFLOP/s of a depthwise layer's hot loop alone: its row kernel (the one the schedule picks
    for the layer's output width, stride and taps), called `calls` times on one L1-resident
    window, so neither the band pack nor cache misses count. Odd calls read the window one
    column later and calls write `slots` different output rows (up to 16 KiB): with identical
    calls LLVM hoisted a short row's FMAs (one unrolled step, no inner loop) out of the loop."""
    import tvm
    from tvm.script import tirx as T

    from microkernels.f32_dwconv import BLOCK, DwKernel, row_mr

    k = layer.k
    ow = (layer.w + 2 * layer.pad - k) // layer.stride + 1
    kern = DwKernel(isa, k, k, row_mr(isa, k, k, ow))
    aw = (ow - 1) * layer.stride + k
    sym, ir = kern.name, kern.llvm_ir()
    slots = max(2, min(64, 16384 // (ow * BLOCK * 4)))

    @T.prim_func(s_tir=True)
    def probe(a: T.Buffer((k, aw + 1, BLOCK), "float32"), w: T.Buffer((k, k, BLOCK), "float32"),
              c: T.Buffer((slots, ow, BLOCK), "float32")):
        for i in range(calls):
            with T.attr(0, "pragma_import_llvm", ir):
                T.evaluate(T.call_extern("void", sym, a.access_ptr("r", offset=i % 2 * BLOCK), layer.stride * BLOCK, BLOCK,
                                         (aw + 1) * BLOCK,
                                         w.access_ptr("r"), c.access_ptr("w", offset=i % slots * ow * BLOCK), ow))

    lib = tvm.compile(tvm.IRModule({"main": probe}), target=isa.target)
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal(s, dtype=np.float32)) for s in ((k, aw + 1, BLOCK), (k, k, BLOCK), (slots, ow, BLOCK))]
    res = lib.mod.time_evaluator("main", tvm.cpu(), number=3, repeat=repeat)(*args).results
    return 2 * k * k * ow * BLOCK * calls / statistics.median(res) / 1e9


ROUNDS = 3
PATHS = ("kernel", "blocked", "nchw", "bound")


def ours_seconds(op, path: str, x, w, threads: int, number: int, repeat: int, cold: bool,
                 network: bool = False) -> float:
    """Median seconds per call of `op` on one of the user paths (PATHS); network: cold
    weights, warm input (timing.network_state):
    kernel  the compiled module alone on TVM tensors made once (op.time);
    blocked op.run_blocked on numpy arrays in the blocked layouts (weights packed beforehand);
    nchw    op(x, w) on the NCHW / OIHW arrays PyTorch gets, weights packed on every call;
    bound   op.bind(w) once, then f(x) on the NCHW array."""
    set_threads(threads)
    data = x
    if path == "kernel" and not cold:
        xb, wb = op.to_blocked(x), op.pack_weights(w)
        return statistics.median(op.time(xb, wb, number=number, repeat=repeat))
    if path == "kernel":
        # Cold, the caches are flushed the way PyTorch's are (timing.flush_caches), not by TVM's
        # evaluator: it evicts the arguments but leaves the L3 clean, while a flush that writes
        # leaves it full of dirty lines the next call must write back, as PyTorch's calls face.
        # Checking TVM tensors costs microseconds against these milliseconds.
        call, data = blocked_call(op, x, w)
    elif path == "blocked":
        data, wb = op.to_blocked(x), op.pack_weights(w)
        call = lambda: op.run_blocked(data, wb)  # noqa: E731
    elif path == "nchw":
        call = lambda: op(x, w)  # noqa: E731
    elif path == "bound":
        f = op.bind(w)
        call = lambda: f(x)  # noqa: E731
    else:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    return seconds_per_call(call, number, repeat, cold, before=network_state(data) if network else None)


def run(isa: Isa, layers: list[Layer], thread_counts, repeat: int, modes, peak1: float, log,
        algorithms=("direct",), path: str = "kernel", exhaustive: bool = False) -> dict:
    """Every layer under each of `algorithms`, side by side with PyTorch in one run. Winograd
    figures are effective: the direct convolution's FLOPs over the time taken. `exhaustive`:
    every algorithm that applies is timed, and each layer says how far algorithm="auto"'s
    choice (the rule, or this host's measurements) is from the fastest of them."""
    require_host(isa)
    if exhaustive:
        algorithms = EXHAUSTIVE
    # Direct runs every layer: it is the baseline of each row and stands in where Winograd can't.
    algorithms = ("direct", *(a for a in algorithms if a != "direct"))
    tv = torch_version()
    log(f"PyTorch: {tv or 'not installed (pip install -e .[bench]); our figures only'}")
    out = {"isa": isa.name, "peak_gflops_1thread": peak1, "torch": tv, "algorithms": list(algorithms), "path": path,
           "runs": []}
    # A depthwise layer is bound by one L1 load per FMA, not by the FMA rate alone: its hot loop
    # (the row kernel, in L1) is reported against that measured rate.
    loop_pct = {}
    if any(layer.kind == "depthwise" and layer.k > 1 for layer in layers):
        from .gemm import measure_peak

        set_threads(1)
        bound = measure_peak(isa, loads=True)
        out["load_fma_bound_gflops_1thread"] = bound
        log(f"depthwise bound, 1 thread: {bound:.1f} GFLOP/s of FMAs each with one L1 load; 'loop' below is the"
            f" layer's row kernel alone on an L1-resident row, against it")
        loop_pct = {layer.row: 100 * dw_loop_gflops(isa, layer) / bound
                    for layer in layers if layer.kind == "depthwise" and layer.k > 1}
    rng = np.random.default_rng(0)
    for threads in thread_counts:
        ops = [{a: layer.conv(isa, threads, a) for a in algorithms} for layer in layers]
        # exhaustive: the direct conv's other candidate plans, timed in the same turns
        extras = [other_plans(isa, layer, threads) if exhaustive else {} for layer in layers]
        for mode in modes:
            cold, network = mode in ("cold", "network"), mode == "network"
            peak = peak1 * threads
            log(f"conv2d, {threads} thread(s), {mode} cache, path {path} (peak {peak:.0f} GFLOP/s):")
            log(f"  {'#':>2s} {'layer':34s} {'n':>2s} {'algo':>6s} {'ours ms':>8s} {'GF/s':>6s} {'%peak':>5s}"
                f" {'torch ms':>8s} {'ours/torch':>10s} {'/direct':>8s}" + (" /kernel" if path != "kernel" else "")
                + "  plan")
            tot_ours = {a: 0.0 for a in algorithms}
            tot_torch = 0.0
            by_kind: dict[str, list[float]] = {}  # kind -> [ours (first algorithm), torch], weighted
            rows = []
            distances = []  # (auto's time over the best, layer row), exhaustive
            weighted = [0.0, 0.0]  # auto's plans and the fastest ones, seconds times layer counts
            for layer, by_algo, extra in zip(layers, ops, extras):
                x = rng.standard_normal((1, layer.c, layer.h, layer.w), dtype=np.float32)
                w = rng.standard_normal(layer.weight_shape, dtype=np.float32)
                number = calls_per_repeat(by_algo["direct"].flops, peak, cold)
                # PyTorch and ours take turns, ROUNDS times, and each keeps its best median: a
                # drift of the shared machine's speed then hits both sides alike.
                ref, best, kernel = None, {}, None
                for _ in range(ROUNDS):
                    if tv:
                        settle(threads, 0.1)
                        t = torch_seconds(layer, x, w, threads, number, repeat, cold, network)
                        ref = t if ref is None else min(ref, t)
                    for algo, op in (*by_algo.items(), *extra.items()):
                        if op is not None:  # None: Winograd cannot run this layer
                            settle(threads, 0.1)
                            t = ours_seconds(op, path, x, w, threads, number, repeat, cold, network)
                            best[algo] = min(best.get(algo, t), t)
                    if path != "kernel":  # the same op's module alone, in the same turns
                        settle(threads, 0.1)
                        t = ours_seconds(by_algo["direct"], "kernel", x, w, threads, number, repeat, cold, network)
                        kernel = t if kernel is None else min(kernel, t)
                if ref is not None:
                    tot_torch += ref * layer.count
                for algo, op in by_algo.items():
                    if op is None:
                        continue
                    ours = best[algo]
                    base = ours if algo == "direct" else base
                    gf = op.flops / ours / 1e9
                    tot_ours[algo] += ours * layer.count
                    if algo == "direct":
                        kind = by_kind.setdefault(layer.kind, [0.0, 0.0])
                        kind[0] += ours * layer.count
                        kind[1] += (ref or 0.0) * layer.count
                    p = op.plan
                    plan = (f"F({p.tile}) {p.bands} bands of {p.tiles_per_band} tiles, U {p.weight_bytes >> 10} KiB"
                            if p.algorithm == "winograd" else
                            f"depthwise, bands of {p.band_rows} rows"
                            + (f", loop {loop_pct[layer.row]:.0f}% of bound" if layer.row in loop_pct else "")
                            if p.algorithm == "depthwise" else
                            f"{'bands' if p.band_parallel else 'blocks'} of {p.band_rows} rows"
                            + (f", chunks of {p.chunk} input blocks" if p.get("chunk") else ""))
                    tail = f" {ref * 1e3:8.3f} {ours / ref:10.2f}" if ref is not None else f" {'-':>8s} {'-':>10s}"
                    rel = f"{ours / base:8.2f}"
                    # The path's time over the module's alone (direct rows of a non-kernel path).
                    vs_kernel = ours / kernel if kernel is not None and algo == "direct" else None
                    if path != "kernel":
                        rel += f" {vs_kernel:7.2f}" if vs_kernel is not None else f" {'-':>7s}"
                    log(f"  {layer.row:2d} {layer.label:34s} {layer.count:2d} {algo:>6s} {ours * 1e3:8.3f} {gf:6.1f}"
                        f" {100 * gf / peak:5.1f}{tail} {rel}  {plan}")
                    rows.append({"layer": layer.row, "shape": layer.label, "count": layer.count, "algorithm": algo,
                                 "flops": op.flops, "bytes": layer.compulsory_bytes,
                                 "ours_ms": ours * 1e3, "gflops": gf, "pct_peak": 100 * gf / peak,
                                 "torch_ms": ref * 1e3 if ref is not None else None,
                                 "ratio_vs_torch": ours / ref if ref is not None else None,
                                 "ratio_vs_direct": ours / base, "ratio_vs_kernel": vs_kernel, "plan": p.as_dict(),
                                 "loop_pct_bound": loop_pct.get(layer.row) if p.algorithm == "depthwise" else None})
                for algo, op in by_algo.items():  # a layer Winograd skips costs direct's time
                    if op is None:
                        tot_ours[algo] += base * layer.count
                if exhaustive:
                    named = {plan_label(by_algo[a].plan) if a in by_algo and by_algo[a] is not None else a: t
                             for a, t in best.items()}
                    ratio = _distance(isa, layer, threads, named, log)
                    distances.append((ratio, layer.row))
                    weighted[0] += layer.count * ratio * min(named.values())
                    weighted[1] += layer.count * min(named.values())
            if len(by_kind) > 1:
                log("  by kind (direct): " + "; ".join(
                    f"{k} ours {o * 1e3:.2f} ms" + (f", torch {t * 1e3:.2f} ms, ours/torch {o / t:.2f}" if tv and t else "")
                    for k, (o, t) in sorted(by_kind.items())))
            flops = sum(by_algo["direct"].flops * layer.count for layer, by_algo in zip(layers, ops))
            for algo in algorithms:
                summary = (f"  weighted total {algo}: ours {tot_ours[algo] * 1e3:.2f} ms"
                           f" ({flops / tot_ours[algo] / 1e9:.1f} GF/s)")
                if tv:
                    summary += f", torch {tot_torch * 1e3:.2f} ms, ours/torch {tot_ours[algo] / tot_torch:.2f}"
                log(summary)
            if distances:
                near = sum(d <= 1.05 for d, _ in distances)
                worst, row = max(distances)
                log(f"  exhaustive: auto within 5% of the fastest on {near} of {len(distances)} layers; "
                    f"worst {worst:.2f}x (layer {row}); weighted by the layers' counts, auto's plans "
                    f"{weighted[0] * 1e3:.2f} ms against the fastest's {weighted[1] * 1e3:.2f} ms "
                    f"({weighted[0] / weighted[1]:.3f})")
            out["runs"].append({"threads": threads, "cache": mode, "layers": rows,
                                "auto_over_best": [{"layer": r, "ratio": d} for d, r in distances],
                                "by_kind_ms": {k: {"ours": o * 1e3, "torch": t * 1e3 if tv else None}
                                               for k, (o, t) in by_kind.items()},
                                "total_ours_ms": {a: t * 1e3 for a, t in tot_ours.items()},
                                "total_torch_ms": tot_torch * 1e3 if tv else None})
    return out
