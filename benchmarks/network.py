"""`bench resnet50` and `bench mobilenet_v2`: the whole network, ours (schedules.relax) against
TVM's default Relax build and PyTorch eager (oneDNN), in one run.

All three run the same network with the same weights (batch norm folded; models.resnet,
models.mobilenet), batch 1,
224x224, warm cache, latency of one forward pass. Ours and PyTorch are timed in alternating
rounds (ours, PyTorch, ours, ...), and each side keeps the smallest of its per-round medians, so
a drift of the shared machine's speed lands on both. TVM's default build is timed once per thread
count: it is two orders of magnitude slower and only there to show where a model stands without
conv schedules. The per-layer breakdown times every VM call of our model (the VM's instrument
hook) and sorts it into conv (our kernels, Winograd transforms included), layout transforms,
elementwise ops that were not fused, and the rest (pooling, the classifier).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from microkernels import Isa
from schedules.common.targets import require_host, set_threads

ROUNDS = 3


def _vm(ex):
    import tvm
    from tvm import relax

    return relax.VirtualMachine(ex, tvm.cpu())


def _time_vm(vm, x, repeat: int) -> float:
    import tvm

    ev = vm.time_evaluator("main", tvm.cpu(), number=1, repeat=repeat)
    return statistics.median(ev(x).results)


def _time_torch(model, x, repeat: int) -> float:
    import torch

    times = []
    with torch.no_grad():
        model(x)
        for _ in range(repeat):
            t = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def classify(symbol: str) -> str:
    if symbol.startswith("mk_conv2d"):
        return "conv"
    if "layout_transform" in symbol:
        return "layout transforms"
    if any(op in symbol for op in ("add", "relu", "clip", "multiply")) and "pool" not in symbol:
        return "unfused elementwise"
    return "other"


def breakdown(vm, x, repeat: int = 5) -> dict[str, float]:
    """Seconds per category of VM call, median over `repeat` passes."""
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
            cat = classify(name)
            current[cat] = current.get(cat, 0.0) + time.perf_counter() - starts.pop(name)
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
    cats = sorted({c for s in spans for c in s})
    return {c: statistics.median(s.get(c, 0.0) for s in spans) for c in cats}


def network(name: str):
    """(the Relax module, the PyTorch module, the input size) of a benchmark network."""
    from models import mobilenet, resnet

    family, net = {"resnet50": (resnet, resnet.resnet), "mobilenet_v2": (mobilenet, mobilenet.mobilenet_v2)}[name]
    net = net()
    params = family.random_params(net)
    return family.relax_module(net, params), family.torch_module(net, params), net.image


def run(isa: Isa, threads: list[int], repeat: int, log, default_tvm: bool = True, model: str = "resnet50") -> dict:
    import torch
    import tvm

    from schedules import relax as mkrelax

    require_host(isa)
    target = f"x86-{isa.name}"
    mod, tmodel, image = network(model)
    x_np = np.random.default_rng(1).standard_normal((1, 3, image, image)).astype(np.float32)
    x = tvm.runtime.tensor(x_np)
    xt = torch.from_numpy(x_np)

    t0 = time.perf_counter()
    report: list = []
    ours = _vm(tvm.compile(mkrelax.optimize(mod, target, report=report), target=mkrelax.llvm_target(target)))
    log(f"optimize + compile ours: {time.perf_counter() - t0:.1f} s; "
        f"{sum(r['runs_on'] == 'ours' for r in report)}/{len(report)} conv2d on our kernels")
    unfused = _vm(tvm.compile(mkrelax.optimize(mod, target, fuse=False), target=mkrelax.llvm_target(target)))
    default = _vm(tvm.compile(mod, target=mkrelax.llvm_target(target))) if default_tvm else None

    with torch.no_grad():
        want = tmodel(xt).numpy()
    got = ours["main"](x).numpy()
    err = float(np.abs(got - want).max() / np.abs(want).max())
    log(f"ours vs PyTorch: max |diff| / max |PyTorch| = {err:.2e}")

    result = {"model": model, "isa": isa.name, "max_rel_diff_vs_torch": err, "threads": {}}
    log(f"{'threads':>7} {'ours ms':>9} {'unfused':>9} {'PyTorch':>9} {'TVM dflt':>9} {'ours/PT':>8} {'fusion saves':>12}")
    for t in threads:
        set_threads(t)
        torch.set_num_threads(t)
        ours_t, torch_t, unfused_t = [], [], []
        for _ in range(ROUNDS):
            ours_t.append(_time_vm(ours, x, repeat))
            unfused_t.append(_time_vm(unfused, x, repeat))
            time.sleep(0.1)  # TVM's idle workers spin briefly after a call and would steal cores
            torch_t.append(_time_torch(tmodel, xt, repeat))
        o, u, p = min(ours_t), min(unfused_t), min(torch_t)
        d = _time_vm(default, x, 1) if default is not None else float("nan")
        parts = breakdown(ours, x)
        row = {"ours_ms": o * 1e3, "unfused_ms": u * 1e3, "torch_ms": p * 1e3, "tvm_default_ms": d * 1e3,
               "ours_over_torch": o / p, "breakdown_ms": {k: v * 1e3 for k, v in parts.items()}}
        result["threads"][t] = row
        log(f"{t:>7} {o * 1e3:>9.2f} {u * 1e3:>9.2f} {p * 1e3:>9.2f} {d * 1e3:>9.1f} {o / p:>8.2f} {(u - o) * 1e3:>10.2f}ms")
        total = sum(parts.values())
        log("        ours by kind: " + ", ".join(f"{k} {v * 1e3:.2f} ms ({v / total:.0%})" for k, v in parts.items()))
    return result
