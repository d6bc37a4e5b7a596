"""`bench model SOURCE` and `bench zoo`: any model a user brings, ours against the engines they
deploy with, in one run, as OpenVINO's benchmark_app does for one engine.

SOURCE is an ONNX file, `torchvision:NAME` or `timm:NAME` (zoo.py: seeded random weights, eval
mode, nothing downloaded). Ours runs the way a user runs it: a torch model through
`torch.compile(model, backend="microkernels")` (compiled once per thread count, since plans
depend on it), an ONNX file through TVM's ONNX importer and `schedules.relax.build`. Beside it,
with `peers`, ONNX Runtime and OpenVINO (f32 forced, read back) on the ONNX file or on the torch
module's ONNX export, and PyTorch eager for a torch model. The engines take turns (turns.py),
ROUNDS rounds, each keeping its best round's median; every engine's output is compared with the
reference (PyTorch eager, or ONNX Runtime for an ONNX file). The per-function breakdown of our
VM (network.profile and breakdown: our convs, our other ops, TVM's lowering, layout transforms)
names the heaviest functions outside our kernels. "first call" is the seconds of ours' first
call in this process (export, import, optimize, compile, or the compile cache's copy);
`bench zoo --first-calls` measures it in fresh processes, cold (an empty cache folder) and
cached (the same folder again). `bench model SOURCE --int8` (run_int8) quantizes the model's float32
ONNX with quantize_static and runs it as the int8 network commands do (int8.run_network).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

from . import network, peers, zoo
from .turns import take_turns

ROUNDS = 3
PAUSE = 0.2  # s before each turn: the previous engine's idle workers spin for a while
FIRST_CALL = "first-call: "  # the line `bench model --first-call` prints, JSON after it


class _Ours:
    """Our build of a source at one thread count: call() runs one forward pass on the input."""

    def __init__(self, src: zoo.Source, x: np.ndarray, threads: int, target: str):
        import tvm

        self.x, self.report, self.vm = x, [], None
        start = time.perf_counter()
        if src.kind == "torch":
            import torch

            from schedules.relax import torch_compile

            torch._dynamo.reset()
            torch_compile.clear_reports()
            fast = torch.compile(src.module, backend="microkernels", options={"threads": threads, "target": target})
            xt = torch.from_numpy(x)

            def call():
                with torch.no_grad():
                    return fast(xt)

            out = call()
            self.first_call = time.perf_counter() - start
            self.graphs = torch_compile.reports()
            self.report = [op for g in self.graphs for op in g["ops"]]
            ran = [g for g in self.graphs if g["runs_on"] == "microkernels"]
            if len(ran) == 1 and ran[0]["inputs"] == [x.shape]:  # one graph, on the image alone
                self.vm = torch_compile.virtual_machine(ran[0]["graph"])
            self.out = out.numpy()
        else:
            import onnx
            from tvm import relax
            from tvm.relax.frontend import onnx as onnx_frontend

            import schedules

            model = onnx.load(src.onnx_path)
            name = zoo.first_input(model).name
            mod = onnx_frontend.from_onnx(model, shape_dict={name: x.shape}, keep_params_in_input=False)
            ex = schedules.relax.build(mod, target, threads=threads, report=self.report)
            self.vm = relax.VirtualMachine(ex, tvm.cpu())
            main, xv = self.vm["main"], tvm.runtime.tensor(x)

            def call():
                return main(xv)

            self.out = network.first_output(call()).numpy()
            self.first_call = time.perf_counter() - start
            self.graphs = [{"graph": "main", "runs_on": "microkernels", "reason": ""}]
        self.call = call

    def summary(self) -> str:
        line = network.summarize(self.report) if self.report else "no op reports"
        eager = [g for g in self.graphs if g["runs_on"] != "microkernels"]
        if len(self.graphs) > 1 or eager:
            line += f"; {len(self.graphs)} graph(s), {len(eager)} eager" + "".join(
                f" ({g['graph']}: {g['reason']})" for g in eager)
        return line


def _engines(src: zoo.Source, x: np.ndarray, threads: int, with_peers: bool, exports) -> tuple[list, list]:
    """The other engines at `threads`: ONNX Runtime and OpenVINO (with_peers; those installed),
    PyTorch eager for a torch model; and why any engine was left out (a package missing, or an
    engine that crashed on this model)."""
    if src.kind == "torch":
        if not with_peers:
            return [peers.pytorch(src.module, x, threads)], []
        return exports.engines(x, threads), exports.skipped
    out, skipped = [], []
    if with_peers:
        if not peers.missing("ONNX Runtime"):
            out.append(peers.onnx_runtime(src.onnx_path, x, threads))
        if not peers.missing("OpenVINO"):
            why = peers.crashes("OpenVINO", src.onnx_path, x.shape)
            if why is None:
                out.append(peers.openvino(src.onnx_path, x, threads))
            else:
                skipped.append(why)
    return out, skipped


def _reference(src: zoo.Source, x: np.ndarray):
    """(name, output) the others are compared with: PyTorch eager, or ONNX Runtime on the file."""
    if src.kind == "torch":
        import torch

        with torch.no_grad():
            return "PyTorch", src.module(torch.from_numpy(x)).numpy()
    if peers.missing("ONNX Runtime"):
        return None, None
    return "ONNX Runtime", peers.onnx_runtime(src.onnx_path, x, 1).run()


def run(source: str, threads: list[int], log, batch: int = 1, image: tuple | None = None, with_peers: bool = False,
        repeat: int = 10, target: str = "native") -> dict:
    """Load, build, check and time one model at each thread count; the figures as a dict."""
    import torch

    from schedules.common.targets import set_threads

    src = zoo.load(source)
    image = tuple(image or src.image)
    x = np.random.default_rng(1).standard_normal((batch, *image)).astype(np.float32)
    result = {"model": source, "input": list(x.shape), "engines": {}, "rows": []}
    ref_name, want = _reference(src, x)
    exports = peers.Peers(src.module) if src.kind == "torch" and with_peers else None
    said: list[str] = []
    try:
        for t in threads:
            ours = _Ours(src, x, t, target)
            log(f"{source} {'x'.join(map(str, x.shape))}, {t} thread(s): first call {ours.first_call:.1f} s; "
                f"{ours.summary()}")
            engines, skipped = _engines(src, x, t, with_peers, exports)
            for why in skipped:
                if why not in said:
                    said.append(why)
                    log(why)
            result["skipped"] = said
            diffs = {"ours": ours.out}
            for e in engines:
                if e.name not in result["engines"]:
                    result["engines"][e.name] = {"version": e.version, "precision": e.precision}
                    log(f"  {e.name} {e.version}, precision {e.precision}")
                if e.name != ref_name:
                    diffs[e.name] = e.run()
            if want is not None:
                errs = {n: network.rel_diff(np.asarray(o).reshape(want.shape), want) for n, o in diffs.items()}
                log(f"  outputs vs {ref_name}, max |diff| / max |{ref_name}|: "
                    + ", ".join(f"{network.SHORT.get(n, n)} {v:.1e}" for n, v in errs.items())
                    + ("  ABOVE " + str(network.FLAG) if max(errs.values()) > network.FLAG else ""))
            set_threads(t)
            torch.set_num_threads(t)
            secs = take_turns({"ours": ours.call, **{e.name: e.run for e in engines}}, t, 1, repeat, PAUSE,
                              ("ours",), ROUNDS)
            ms = {n: s * 1e3 for n, s in secs.items()}
            row = {"threads": t, "ms": ms, "first_call_s": ours.first_call}
            peer = min(((v, n) for n, v in ms.items() if n in ("ONNX Runtime", "OpenVINO")), default=None)
            line = f"  {t} thread(s): " + ", ".join(f"{network.SHORT.get(n, n)} {v:.2f} ms" for n, v in ms.items())
            if peer:
                row["ours_over_best_peer"], row["best_peer"] = ms["ours"] / peer[0], peer[1]
                line += f"; ours/best peer {row['ours_over_best_peer']:.2f} ({network.SHORT.get(peer[1], peer[1])})"
            if "PyTorch" in ms:
                row["ours_over_eager"] = ms["ours"] / ms["PyTorch"]
                line += f"; ours/eager {row['ours_over_eager']:.2f}"
            log(line)
            if ours.vm is not None:
                import tvm

                time.sleep(PAUSE)
                network.log_breakdown(network.profile(ours.vm, tvm.runtime.tensor(x)), row, log)
            result["rows"].append(row)
    finally:
        if exports is not None:
            exports.close()
    return result


def run_int8(source: str, threads: list[int], log, batch: int = 1, image: tuple | None = None, repeat: int = 10,
             target: str = "native", reduce_range: bool = False) -> dict:
    """`bench model SOURCE --int8`: the model's float32 ONNX (the file, or the torch module's export)
    quantized by int8.quantize, then ours against ONNX Runtime and OpenVINO on the QDQ file as the
    network commands run theirs (int8.run_network)."""
    from . import int8

    src = zoo.load(source)
    shape = (batch, *(image or src.image))

    def make(path: str, reduce_range: bool) -> tuple[str, tuple]:
        fp32 = src.onnx_path or peers.export(src.module, shape, os.path.join(os.path.dirname(path), "fp32.onnx"))
        return int8.quantize(fp32, path, shape, reduce_range), shape

    return int8.run_network(source, threads, repeat, log, target, reduce_range=reduce_range, make=make)


def first_call(source: str, threads: int, target: str = "native") -> dict:
    """Seconds of ours' first call on a fresh load of `source`, in this process."""
    src = zoo.load(source)
    x = np.random.default_rng(1).standard_normal((1, *src.image)).astype(np.float32)
    ours = _Ours(src, x, threads, target)
    return {"model": source, "threads": threads, "first_call_s": ours.first_call, "summary": ours.summary()}


def first_calls(models, threads: int, log, target: str = "native") -> list[dict]:
    """Each model's first call in a new process with an empty compile cache, then in another
    with the cache the first filled: one row each."""
    rows = []
    log(f"first calls, {threads} thread(s), each in a new process: cold (empty compile cache), cached")
    for m in models:
        with tempfile.TemporaryDirectory(prefix="mk-zoo-cache-") as folder:
            row = {"model": m}
            for what in ("cold", "cached"):
                env = {**os.environ, "TVM_MICROKERNELS_CACHE": folder}
                cmd = [sys.executable, "-m", "microkernels", "bench", "model", m, "--first-call", "--threads",
                       str(threads), "--target", target]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                line = next((s for s in proc.stdout.splitlines() if s.startswith(FIRST_CALL)), None)
                if proc.returncode or line is None:
                    row[what] = None
                    row["error"] = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
                    break
                row[what] = json.loads(line[len(FIRST_CALL):])["first_call_s"]
        log(f"  {m:<36} " + (f"cold {row['cold']:6.1f} s, cached {row['cached']:5.1f} s" if "error" not in row
                             else f"failed: {row['error']}"))
        rows.append(row)
    return rows


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def run_zoo(models, threads: list[int], log, with_peers: bool = False, repeat: int = 10,
            target: str = "native") -> dict:
    """`run` over `models`, then one table: a line per model and thread count, the geo-mean and
    the worst of ours over the faster peer (with peers) or over PyTorch eager."""
    results, failed = [], {}
    for m in models:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results.append(run(m, threads, log, with_peers=with_peers, repeat=repeat, target=target))
        except Exception as e:  # noqa: BLE001 - one model's failure is a row of the table, not the end of the run
            failed[m] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            log(f"{m}: FAILED {failed[m]}")
    key = "ours_over_best_peer" if with_peers else "ours_over_eager"
    log(f"zoo: {len(results)} models, {ROUNDS} rounds x {repeat} runs, best per-round median; "
        f"ratio = {'ours / the faster of ONNX Runtime and OpenVINO' if with_peers else 'ours / PyTorch eager'}")
    log(f"  {'model':<36} {'threads':>7} {'ours ms':>9} {'ORT ms':>9} {'OV ms':>9} {'eager ms':>9} {'ratio':>6}")
    per_threads: dict[int, list[float]] = {}
    for r in results:
        for row in r["rows"]:
            ms = row["ms"]
            ratio = row.get(key, float("nan"))
            per_threads.setdefault(row["threads"], []).append(ratio)
            log(f"  {r['model']:<36} {row['threads']:>7} {ms['ours']:>9.2f} {ms.get('ONNX Runtime', math.nan):>9.2f} "
                f"{ms.get('OpenVINO', math.nan):>9.2f} {ms.get('PyTorch', math.nan):>9.2f} {ratio:>6.2f}")
    summary = {}
    for t, ratios in sorted(per_threads.items()):
        ok = [v for v in ratios if v == v]
        worst = max(ok, default=math.nan)
        summary[t] = {"geomean": _geomean(ok), "worst": worst}
        log(f"  {t} thread(s): geo-mean {summary[t]['geomean']:.2f}, worst {worst:.2f} over {len(ok)} models")
    for m, why in failed.items():
        log(f"  {m}: failed ({why})")
    return {"models": results, "failed": failed, "summary": summary}
