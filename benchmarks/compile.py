"""`bench compile`: how long `schedules.relax.build` (optimize + tvm.compile) takes for a whole
network, with the compile cache in each of its states. Every measurement is a fresh Python
process (an in-process copy would flatter the second build), building the same module; the
module's construction (and, for the user style, torch.export and the import) is not timed.

States, in order, over one temporary cache folder:
  off        TVM_MICROKERNELS_CACHE=off: nothing read or written (what every build cost before)
  cold       an empty cache: everything scheduled and compiled, then written
  layers     the model's library deleted, its layers' schedules kept: what a new model sharing
             layers with earlier ones costs (optimize's other steps and tvm.compile remain)
  cached     everything kept: the library is loaded
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

STATES = ("off", "cold", "layers", "cached")

_SCRIPT = """
    import json, sys, time, warnings
    import numpy as np, tvm
    from tvm import relax
    from benchmarks.network import TORCH_STYLE, import_torch, network
    from schedules import relax as mkrelax
    model, style, target = sys.argv[1:4]
    if style == "folded":
        mod, _, image = network(model, 1)
    else:
        from models import torch_style
        net, image = torch_style.build(TORCH_STYLE[model]), torch_style.IMAGE
        mod = import_torch(net, np.zeros((1, 3, image, image), np.float32))
    report = []
    t = time.perf_counter()
    ex = mkrelax.build(mod, target, report=report)
    seconds = time.perf_counter() - t
    x = np.random.default_rng(0).standard_normal((1, 3, image, image)).astype(np.float32)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    out = out.numpy() if hasattr(out, "numpy") else out[0].numpy()
    convs = [r for r in report if r.get("op", "conv2d") == "conv2d"]
    print(json.dumps({"seconds": seconds, "convs": len(convs), "ours": sum(r["runs_on"] == "ours" for r in convs),
                      "checksum": float(np.abs(out).astype(np.float64).sum())}))
"""


def _build(model: str, style: str, target: str, cache_env: str) -> dict:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TVM_MICROKERNELS_CACHE": cache_env,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_SCRIPT), model, style, target], cwd=root, env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise RuntimeError(f"building {model} ({style}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(models, style: str, target: str, log) -> dict:
    out = {"style": style, "target": target, "models": {}}
    log(f"bench compile: schedules.relax.build, {style} style, target {target}; one fresh process per build")
    log(f"  {'model':14s} " + " ".join(f"{s + ' s':>9s}" for s in STATES) + "  convs ours/all")
    for model in models:
        folder = Path(tempfile.mkdtemp(prefix="mk-compile-cache-"))
        try:
            got = {}
            for state in STATES:
                if state == "layers":
                    shutil.rmtree(folder / "model", ignore_errors=True)
                got[state] = _build(model, style, target, "off" if state == "off" else str(folder))
            sums = {round(g["checksum"], 2) for g in got.values()}
            if len(sums) != 1:
                raise RuntimeError(f"{model}: the builds disagree on the output ({sums})")
            first = got["cold"]
            log(f"  {model:14s} " + " ".join(f"{got[s]['seconds']:9.2f}" for s in STATES)
                + f"  {first['ours']}/{first['convs']}")
            out["models"][model] = {s: g["seconds"] for s, g in got.items()}
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return out
