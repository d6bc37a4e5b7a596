"""`bench resnet50`, `bench mobilenet_v2` and `bench resnext50`: the whole network, ours
(schedules.relax) against PyTorch eager (oneDNN) and, with `peers`, ONNX Runtime and OpenVINO on
its ONNX export, in one run.

Two styles of the same architecture (`style`):
  - "folded": the network as models/ builds it (models.resnet, ResNeXt-50 32x4d included,
    models.mobilenet), batch norm folded by hand into each conv's weights and bias, written as a
    Relax module; PyTorch runs the same network and weights;
  - "user": the network as a PyTorch user writes it (models.torch_style: conv + BatchNorm2d +
    ReLU modules), imported with torch.export and TVM's torch frontend, then the same
    `schedules.relax.optimize` and `tvm.compile`.
Every engine runs the same PyTorch module of its style and the same input; 224x224, warm cache,
latency of one forward pass at each batch size (throughput too above batch 1).

The engines take turns over ROUNDS rounds (ours, [unfused,] ONNX Runtime, OpenVINO, PyTorch,
ours, ...), with a pause between turns, and each keeps the smallest of its per-round medians, so
a drift of the shared machine's speed lands on all of them. Without `peers`, ours is also timed
without fusion (`fuse=False`). With `default_tvm` (the command line's default unless --peers),
TVM's default build of the folded module is timed once per thread count (it has no conv
schedules; orders of magnitude slower). The per-layer breakdown times every VM call of our
model (the VM's instrument hook) and sorts it with classify().
"""

from __future__ import annotations

import contextlib
import statistics
import time

import numpy as np

from microkernels import Isa
from schedules.common import tuned
from schedules.common.targets import require_host, set_threads
from schedules.common.timing import seconds_per_call

from . import peers

ROUNDS = 3
PAUSE = 0.1  # s between turns: TVM's idle workers spin briefly after a call and would steal cores
MODELS = ("resnet50", "mobilenet_v2", "resnext50")
TORCH_STYLE = {"resnet50": "resnet50", "mobilenet_v2": "mobilenet_v2", "resnext50": "resnext50_32x4d"}
STYLES = ("folded", "user")
OVERHEAD = ("TVM lowering", "conv (TVM's lowering)", "layout transforms")  # the target: at most 5% of our time
FLAG = 1e-3  # an engine whose output differs from PyTorch's by more (relative to its largest) is flagged


def _vm(ex):
    import tvm
    from tvm import relax

    return relax.VirtualMachine(ex, tvm.cpu())


def _time_vm(vm, x, repeat: int) -> float:
    import tvm

    ev = vm.time_evaluator("main", tvm.cpu(), number=1, repeat=repeat)
    return statistics.median(ev(x).results)


def classify(symbol: str) -> str:
    """The kind of one VM call: "conv" (our conv2d, Winograd transforms included, and our int8
    conv2d of a QDQ conv or Gemm, mk_qconv2d_*), "layout
    transforms" (whoever scheduled them: they are overhead either way), "conv (TVM's lowering)"
    (a conv our kernels do not take, e.g. 4 or 8 channels per group: TVM's loop nest, which
    schedule_rest only vectorizes and parallelizes), "matmul" (our packed matmul of a Linear
    layer, relax/linear.py), "ours (other ops)" (the other functions schedule_rest schedules,
    named mk_*), or "TVM lowering" (the rest: TVM's default lowering)."""
    if symbol.startswith(("mk_conv2d", "mk_qconv2d")):
        return "conv"
    if symbol.startswith("mk_matmul"):
        return "matmul"
    if "layout_transform" in symbol:
        return "layout transforms"
    if "conv2d" in symbol:
        return "conv (TVM's lowering)"
    if symbol.startswith("mk_"):
        return "ours (other ops)"
    return "TVM lowering"


def profile(vm, x, repeat: int = 5) -> dict[str, float]:
    """Seconds per VM call symbol (summed over its calls in one pass), median over `repeat` passes."""
    from tvm.runtime import vm as rvm

    spans: list[dict[str, float]] = []
    current: dict[str, float] = {}
    starts: dict[str, float] = {}

    def hook(func, name, before, ret, *args):
        if name.startswith("vm.builtin"):
            return rvm.VMInstrumentReturnKind.NO_OP
        if before:
            starts[name] = time.perf_counter()
        else:
            current[name] = current.get(name, 0.0) + time.perf_counter() - starts.pop(name)
        return rvm.VMInstrumentReturnKind.NO_OP

    vm.set_instrument(hook)
    try:
        vm["main"](x)
        for _ in range(repeat):
            current = {}
            vm["main"](x)
            spans.append(current)
    finally:
        vm.set_instrument(None)
    names = sorted({n for s in spans for n in s})
    return {n: statistics.median(s.get(n, 0.0) for s in spans) for n in names}


def breakdown(symbols: dict[str, float]) -> dict[str, float]:
    """profile()'s seconds summed by classify()'s kinds."""
    out: dict[str, float] = {}
    for name, t in symbols.items():
        out[classify(name)] = out.get(classify(name), 0.0) + t
    return dict(sorted(out.items()))


def network(name: str, batch: int = 1):
    """(the Relax module, the PyTorch module, the input size) of a benchmark network, folded style."""
    from models import mobilenet, resnet

    family, net = {"resnet50": (resnet, resnet.resnet), "mobilenet_v2": (mobilenet, mobilenet.mobilenet_v2),
                   "resnext50": (resnet, resnet.resnext50_32x4d)}[name]
    net = net()
    params = family.random_params(net)
    return family.relax_module(net, params, batch), family.torch_module(net, params), net.image


def import_torch(model, x: np.ndarray):
    """A PyTorch module as a Relax module, the way a user imports one: torch.export, then TVM's
    torch frontend with the weights as constants. Its main returns a tuple (the output is [0])."""
    import warnings

    import torch
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's own pytree deprecation notice, not the user's
        ep = torch.export.export(model, (torch.from_numpy(x),))
        return from_exported_program(ep, keep_params_as_input=False)


def first_output(out):
    """The torch frontend's main returns a tuple; the folded modules a tensor."""
    return out if hasattr(out, "numpy") else out[0]


def rel_diff(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def summarize(report: list) -> str:
    convs = [r for r in report if r.get("op", "conv2d") == "conv2d"]
    line = f"{sum(r['runs_on'] == 'ours' for r in convs)}/{len(convs)} conv2d on our kernels"
    left = {}
    for r in report:
        if r["runs_on"] == "tvm":
            key = f"{r.get('op', 'conv2d')} ({r['reason']})"
            left[key] = left.get(key, 0) + 1
    if left:
        line += "; left to TVM: " + ", ".join(f"{n}x {k}" for k, n in left.items())
    return line


class _Case:
    """One style at one batch: the input, the PyTorch module, our build(s), the peers."""

    def __init__(self, style: str, batch: int, model: str, isa: Isa, log, options: dict):
        import torch
        import tvm

        from schedules import relax as mkrelax

        self.style, self.batch, self.tag = style, batch, f"[{style} b{batch}]"
        if style == "folded":
            mod, self.torch_model, image = network(model, batch)
        else:
            from models import torch_style

            self.torch_model, image = torch_style.build(TORCH_STYLE[model]), torch_style.IMAGE
        self.x_np = np.random.default_rng(1).standard_normal((batch, 3, image, image)).astype(np.float32)
        self.x = tvm.runtime.tensor(self.x_np)
        target = f"x86-{isa.name}"
        t0 = time.perf_counter()
        if style == "user":
            mod = import_torch(self.torch_model, self.x_np)
            log(f"{self.tag} torch.export + from_exported_program: {time.perf_counter() - t0:.1f} s")
            t0 = time.perf_counter()
        self.report: list = []
        llvm = mkrelax.llvm_target(target)
        # --autotune: "ours" on the shipped rules alone, beside the autotuned build
        with tuned.ignored() if options["autotune"] else contextlib.nullcontext():
            self.ours = _vm(tvm.compile(mkrelax.optimize(mod, target, report=self.report), target=llvm))
        log(f"{self.tag} optimize + compile ours: {time.perf_counter() - t0:.1f} s; {summarize(self.report)}")
        self.tuned = None
        if options["autotune"]:
            t0, tuned_report = time.perf_counter(), []
            self.tuned = _vm(tvm.compile(mkrelax.optimize(mod, target, report=tuned_report, autotune=True), target=llvm))
            log(f"{self.tag} autotune + optimize + compile: {time.perf_counter() - t0:.1f} s; "
                f"{sum('winograd' == r.get('algorithm') for r in tuned_report)} Winograd convs (rules: "
                f"{sum('winograd' == r.get('algorithm') for r in self.report)})")
        self.unfused = self.default = None
        if options["unfused"]:
            self.unfused = _vm(tvm.compile(mkrelax.optimize(mod, target, fuse=False), target=llvm))
        if options["default"] and style == "folded":
            self.default = _vm(tvm.compile(mod, target=llvm))
        with torch.no_grad():
            self.want = self.torch_model(torch.from_numpy(self.x_np)).numpy()
        self.peers = None
        if options["peers"]:
            self.peers = peers.Peers(self.torch_model)

    def engines(self, threads: int):
        """The peers' engines on this case's input; PyTorch alone (and no ONNX in sight) without peers."""
        if self.peers is not None:
            return self.peers.engines(self.x_np, threads)
        return [peers.pytorch(self.torch_model, self.x_np, threads)]

    def check(self, name: str, got: np.ndarray, log) -> float:
        err = rel_diff(np.asarray(got), self.want)
        log(f"{self.tag} {name} vs PyTorch: max |diff| / max |PyTorch| = {err:.2e}"
            + (f"  ABOVE {FLAG:g}" if err > FLAG else ""))
        return err

    def time(self, engines, repeat: int) -> dict[str, float]:
        """ms per engine: the engines take turns, ROUNDS rounds, best per-round median."""
        turns = [("ours", lambda: _time_vm(self.ours, self.x, repeat))]
        if self.tuned is not None:
            turns.append(("autotuned", lambda: _time_vm(self.tuned, self.x, repeat)))
        if self.unfused is not None:
            turns.append(("unfused", lambda: _time_vm(self.unfused, self.x, repeat)))
        turns += [(e.name, lambda e=e: seconds_per_call(e.run, 1, repeat, cold=False)) for e in engines]
        best: dict[str, list[float]] = {name: [] for name, _ in turns}
        for _ in range(ROUNDS):
            for name, fn in turns:
                best[name].append(fn())
                time.sleep(PAUSE)
        return {name: min(v) * 1e3 for name, v in best.items()}


SHORT = {"ONNX Runtime": "ORT"}


def log_breakdown(symbols: dict[str, float], row: dict, log) -> None:
    parts = breakdown(symbols)
    row["breakdown_ms"] = {k: v * 1e3 for k, v in parts.items()}
    total = sum(parts.values())
    log("        ours by kind: " + ", ".join(f"{k} {v * 1e3:.2f} ms ({v / total:.0%})" for k, v in parts.items()))
    overhead = sum(parts.get(k, 0.0) for k in OVERHEAD)
    row["overhead_share"] = overhead / total
    line = f"        TVM lowering (convs included) + layout transforms: {overhead * 1e3:.2f} ms = {overhead / total:.1%} of ours"
    line += " (target <= 5%)" if overhead / total > 0.05 else ""
    lowered = sorted(((v, n) for n, v in symbols.items() if classify(n) == "TVM lowering"), reverse=True)
    if lowered:
        line += "; largest lowered: " + ", ".join(f"{n} {v * 1e3:.2f} ms" for v, n in lowered[:3])
    log(line)


def run(isa: Isa, threads: list[int], repeat: int, log, default_tvm: bool = True, model: str = "resnet50",
        style: str = "folded", peers: bool = False, batches=(1,), autotune: bool = False) -> dict:
    """Build, check and time `model` in `style` ("folded", "user" or "both") at each batch size
    and thread count; one table row per (batch, threads); the figures as a dict. autotune: also
    an "autotuned" build (optimize(autotune=True), every conv layer's plans timed on this host,
    at the first thread count), and "ours" then plans from the shipped rules alone."""
    import torch

    require_host(isa)
    options = {"unfused": not peers and not autotune, "default": default_tvm, "peers": peers, "autotune": autotune}
    result = {"model": model, "isa": isa.name, "rounds": ROUNDS, "repeat": repeat, "engines": {}, "report": {},
              "rows": []}
    worst = 0.0
    for st in STYLES if style == "both" else [style]:
        cases = [_Case(st, b, model, isa, log, options) for b in batches]
        ready = {}  # the engines at the first thread count, checked and named before the table
        for c in cases:
            result["report"][c.tag[1:-1]] = c.report
            worst = max(worst, c.check("ours", first_output(c.ours["main"](c.x)).numpy(), log))
            if c.tuned is not None:
                worst = max(worst, c.check("autotuned", first_output(c.tuned["main"](c.x)).numpy(), log))
            ready[c.batch] = c.engines(threads[0])
            for e in ready[c.batch]:
                if e.name not in result["engines"]:
                    result["engines"][e.name] = {"version": e.version, "precision": e.precision}
                    log(f"{e.name} {e.version}, precision {e.precision}")
                if e.name != "PyTorch":
                    worst = max(worst, c.check(e.name, e.run(), log))
        for why in cases[0].peers.skipped if cases[0].peers else []:
            log(why)
        cols = ["ours"] + (["autotuned"] if autotune else []) + (["unfused"] if options["unfused"] else []) + [
            e.name for e in ready[cases[0].batch] if e.name != "PyTorch"] + ["PyTorch"]
        dflt_col = st == "folded" and (options["default"] or not peers)  # nan where skipped, as before --peers
        log(f"[{st}] {model}, {ROUNDS} rounds x {repeat} runs, best per-round median")
        log(f"{'threads':>7} {'batch':>5} " + " ".join(f"{SHORT.get(n, n) + ' ms':>11}" for n in cols)
            + (f" {'TVM dflt':>9}" if dflt_col else "")
            + (f" {'ours/best-peer':>14}" if peers else f" {'ours/PT':>8}")
            + (f" {'fusion saves':>12}" if options["unfused"] else "") + (f" {'tuned/ours':>10}" if autotune else ""))
        for t in threads:
            set_threads(t)
            torch.set_num_threads(t)
            for c in cases:
                engines = ready.pop(c.batch) if t == threads[0] else c.engines(t)
                ms = c.time(engines, repeat)
                row = {"style": st, "batch": c.batch, "threads": t, "ms": ms}
                line = f"{t:>7} {c.batch:>5} " + " ".join(f"{ms.get(n, float('nan')):>11.2f}" for n in cols)
                if dflt_col:
                    row["tvm_default_ms"] = _time_vm(c.default, c.x, 1) * 1e3 if c.default is not None else float("nan")
                    line += f" {row['tvm_default_ms']:>9.1f}"
                if peers:
                    best = min((v, n) for n, v in ms.items() if n not in ("ours", "unfused", "autotuned"))
                    row["ours_over_best_peer"], row["best_peer"] = ms["ours"] / best[0], best[1]
                    line += f" {ms['ours'] / best[0]:>8.2f} ({SHORT.get(best[1], best[1])})"
                else:
                    row["ours_over_torch"] = ms["ours"] / ms["PyTorch"]
                    line += f" {row['ours_over_torch']:>8.2f}"
                if options["unfused"]:
                    line += f" {ms['unfused'] - ms['ours']:>10.2f}ms"
                if autotune:
                    row["autotuned_over_ours"] = ms["autotuned"] / ms["ours"]
                    line += f" {row['autotuned_over_ours']:>10.3f}"
                log(line)
                time.sleep(PAUSE)  # the last engine's idle workers spin, as between turns
                log_breakdown(profile(c.ours, c.x), row, log)
                if c.batch > 1:
                    row["images_per_s"] = {n: c.batch / v * 1e3 for n, v in ms.items()}
                    log("        images/s: " + ", ".join(f"{SHORT.get(n, n)} {v:.1f}"
                                                         for n, v in row["images_per_s"].items()))
                result["rows"].append(row)
        for c in cases:
            if c.peers:
                c.peers.close()
    result["max_rel_diff_vs_torch"] = worst
    return result
