"""conv2d(..., autotune=True): time a layer's candidate plans on this host and keep the fastest.

The planners' rules were measured once, on one machine; a layer's best plan moves with the
host (cache sizes, FMA width) and the layer. Autotune compiles the candidates dispatch lists
for a layer (the direct conv's planned variant and a few neighbours, Winograd F(2), F(4),
F(6) where they apply), times each on random data and keeps the fastest, which
common/tuned.py remembers per layer and thread count: algorithm="auto" takes it from then on,
in this process and (unless the file is turned off) in every later one.

How a candidate is timed: as the layer runs inside a network at batch 1, with its weights
cold (a network's weights pass through the caches once per image, ResNet-50's 100 MB through
a 32 MiB L3) and its input warm (the layer before just wrote it). So each call is preceded,
untimed, by a flush of the caches and a read of the input. The candidates take turns, one call
each per round, so a shared machine's drift hits them alike; after three rounds those more than
SURVIVE times slower than the leader drop out, and rounds go on among the rest until the
budget is spent. Each candidate's figure is the median of its calls: the fastest call alone
let a plan whose calls vary (two threads, one sometimes late) win on one lucky call, and the
winner then changed from run to run.

Cost: compiling the candidates (their scheduling shared among the cores: common/parallel.py)
and `budget` seconds of timing, 0.5 s by default (at least ROUNDS_MIN rounds, whatever the budget).
"""

from __future__ import annotations

import time

import numpy as np
import tvm

from ..common import timing

BUDGET = 0.5  # seconds of timing per layer, flushes included
SURVIVE = 1.25  # after ROUNDS_MIN rounds, candidates slower than the leader by more than this drop out
ROUNDS_MIN = 3


def time_candidates(ops: dict, budget: float = BUDGET, seed: int = 0) -> dict[str, float]:
    """{label: the median call's seconds} of compiled conv2d ops of one layer (each a Conv2dOp
    of any family), timed in turns with cold weights and a warm input within `budget`."""
    if not ops:
        return {}
    g = next(iter(ops.values())).layer
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((g.n, g.c, g.h, g.w), np.float32)
    w = rng.standard_normal((g.o, g.cg, g.kh, g.kw), np.float32)
    calls = {}
    for label, op in ops.items():
        call, xb = blocked_call(op, x, w, seed)
        call()  # untimed: page faults, the thread pool's start
        calls[label] = call, timing.network_state(xb)
    times: dict[str, list[float]] = {label: [] for label in calls}
    alive = list(calls)
    start, rounds = time.perf_counter(), 0
    while rounds < ROUNDS_MIN or (time.perf_counter() - start < budget and len(alive) > 1):
        for label in alive:
            call, network_state = calls[label]
            network_state()
            t = time.perf_counter()
            call()
            times[label].append(time.perf_counter() - t)
        rounds += 1
        if rounds >= ROUNDS_MIN:
            median = {label: float(np.median(times[label])) for label in alive}
            lead = min(median.values())
            alive = [label for label in alive if median[label] <= SURVIVE * lead]
    return {label: float(np.median(t)) for label, t in times.items()}


def blocked_call(op, x, w, seed: int = 0):
    """(a call of a compiled conv2d op's module on TVM tensors made once, its blocked input
    tensor): the input converted and the weights packed beforehand, random bias and residual
    where the op fuses them, the output written in place. What autotune, `tune` and the
    benches time."""
    rng = np.random.default_rng(seed)
    tensor = tvm.runtime.tensor
    xb, wb = tensor(op.to_blocked(x)), tensor(op.pack_weights(w))
    bias = tensor(op.pack_bias(rng.standard_normal(op.layer.o).astype(np.float32))) if op.post.bias else None
    residual = tensor(rng.standard_normal(op.blocked_out_shape).astype(np.float32)) if op.post.residual else None
    out = tvm.runtime.empty(op.blocked_out_shape, "float32")
    return (lambda: op.run_blocked(xb, wb, bias=bias, residual=residual, out=out)), xb
