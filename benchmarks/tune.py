"""`python -m microkernels tune [--quick]`: measure on this host what the planners take from
schedules/common/tuned.py, and write it there.

Each figure is the best median of a few rounds (a busy neighbour only ever slows a run down):
- the FP32 FMA peak;
- each matmul tile's L1-resident rate (benchmarks.gemm.tile_gflops) as a share of that peak;
- the read bandwidth, turned into what packing an element costs in FLOPs (a pack moves 8
  bytes per element: 4 read, 4 written);
- per 3x3 stride-1 layer of a grid (channels in and out x map side), direct and Winograd F(2),
  F(4), F(6), warm and with cold weights (a layer's state in a network: _layer_seconds), on one
  thread and on all cores, for algorithm="auto": winograd.choose takes the fastest with cold
  weights on the nearest layer measured at the thread count the layer runs with.
--quick measures ResNet-50's four 3x3 shapes (64x56, 128x28, 256x14, 512x7); the full grid
adds the other pairings of those channels and sides.

--autotune TABLE...: then every layer of those workload tables (benchmarks/workloads) is
autotuned as conv2d(..., autotune=True) would, at one thread and at all cores: its candidate
plans compiled and timed, the fastest kept per layer (schedules/conv/autotune.py), which
algorithm="auto" and the Relax pass then take for those layers.
"""

from __future__ import annotations

import itertools
import os
import time

import numpy as np

from microkernels import MATMUL_TILES, GemmKernel, Isa
from schedules.common import timing, tuned
from schedules.common.targets import set_threads
from schedules.conv import measure
from schedules.conv.autotune import blocked_call

from . import conv2d, gemm, plot

QUICK_LAYERS = ((64, 56), (128, 28), (256, 14), (512, 7))
FULL_LAYERS = tuple(itertools.product((64, 128, 256, 512), (56, 28, 14, 7)))
ALGORITHMS = ("direct", "wino2", "wino4", "wino6")


def run(isa: Isa, quick: bool, log, where=None, layers=None) -> dict:
    """Measure, log each figure as it comes, write the file (tuned.save) and return its data.
    `layers`: (channels, map side) pairs instead of the grid."""
    start = time.perf_counter()
    set_threads(1)
    say = lambda what: log(f"[{time.perf_counter() - start:6.1f} s] {what}")
    peak = gemm.measure_peak(isa, iters=50_000 if quick else 200_000, repeat=3 if quick else 5)
    say(f"FP32 FMA peak, 1 thread: {peak:.1f} GFLOP/s")
    tiles = []
    for mr, nr, shipped in MATMUL_TILES[isa.name]:
        share = min(1.0, gemm.tile_gflops(GemmKernel(isa, mr, nr), calls=1000 if quick else 2000) / peak)
        tiles.append([mr, nr, round(share, 3)])
        say(f"matmul tile {mr}x{nr}: {share:.1%} of peak (shipped: {shipped:.0%})")
    bandwidth = plot.measure_bandwidth(1, mib=128 if quick else 512)
    # FLOPs the FMA units could run while one element is packed (8 bytes moved), per lane.
    pack = round(peak * 1e9 * 8 / (bandwidth * 1e9) / isa.lanes, 2)
    say(f"read bandwidth, 1 thread: {bandwidth:.1f} GB/s: packing costs {pack} FLOPs per lane")
    grid, layers = layers or (QUICK_LAYERS if quick else FULL_LAYERS), []
    for threads, (c, hw) in itertools.product(sorted({1, os.cpu_count() or 1}), grid):
        set_threads(threads)
        layer = conv2d.Layer(c, hw, hw, c, 3, 1, 1, 1)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((1, c, hw, hw), np.float32)
        w = rng.standard_normal(layer.weight_shape, np.float32)
        number = conv2d.calls_per_repeat(2 * c * c * 9 * hw * hw, peak * threads, cold=False)
        warm, network = {}, {}
        for alg in ALGORITHMS:
            key = alg.removeprefix("wino")
            warm[key], network[key] = _layer_seconds(layer.conv(isa, threads, alg), x, w, number, 3 if quick else 5)
        layers.append({"isa": isa.name, "c": c, "hw": hw, "threads": threads, "seconds": warm,
                       "seconds_network": network})
        what = f"3x3 {c}x{hw}x{hw}, {threads} thread(s), "
        say(f"{what}warm: {_listed(warm)}")
        say(f"{' ' * len(what)}cold weights: {_listed(network)}")
    data = {"measured": time.strftime("%Y-%m-%d %H:%M"), "quick": quick,
            "peak_gflops": {isa.name: round(peak, 1)}, "read_gbs": round(bandwidth, 1),
            "matmul_tiles": {isa.name: tiles}, "pack_flops_per_lane": {isa.name: pack}, "winograd": layers}
    written = tuned.save(data, where)
    say(f"wrote {written}; the planners read it from now on (TVM_MICROKERNELS_TUNE=off ignores it)")
    return data


def autotune_tables(isa: Isa, tables: list[str], log) -> list[dict]:
    """Autotune every layer of the workload tables at 1 thread and at all cores, again where
    they were timed before; log each layer's fastest plan. Returns the entries."""
    start, entries = time.perf_counter(), []
    layers = [layer for table in tables for layer in conv2d.load_workloads(table)]
    for threads in sorted({1, os.cpu_count() or 1}):
        for layer in layers:
            entry = measure(layer.geometry_params, target=f"x86-{isa.name}", threads=threads, again=True)
            if entry is None:
                log(f"[{time.perf_counter() - start:6.1f} s] {layer.label}: nothing to choose "
                    f"({'depthwise' if layer.geometry.depthwise else 'one plan'})")
                continue
            entries.append(entry)
            seconds = entry["seconds"]
            best = min(seconds, key=seconds.get)
            runner_up = sorted(seconds.values())[1] if len(seconds) > 1 else seconds[best]
            log(f"[{time.perf_counter() - start:6.1f} s] {layer.label}, {threads} thread(s): {best} "
                f"{seconds[best] * 1e3:.3f} ms, next {runner_up / seconds[best]:.2f}x, of {len(seconds)} plans")
    return entries


def _layer_seconds(op, x, w, number: int, repeat: int) -> tuple[float, float]:
    """(warm, cold weights) seconds per call of the compiled layer on blocked tensors; cold
    weights: the layer's state inside a network at batch 1 (timing.network_state)."""
    call, xb = blocked_call(op, x, w)
    warm = min(timing.seconds_per_call(call, number, repeat, cold=False) for _ in range(2))
    cold = min(timing.seconds_per_call(call, 3, repeat, cold=True, before=timing.network_state(xb)) for _ in range(2))
    return warm, cold


def _listed(seconds: dict) -> str:
    best = min(seconds, key=seconds.get)
    return ", ".join(f"{_name(k)} {v * 1e3:.3f} ms" for k, v in seconds.items()) + f"; fastest {_name(best)}"


def _name(key: str) -> str:
    # winograd.label's spelling; the conv families may be imported by benchmarks.conv2d only.
    return "direct" if key == "direct" else f"F({key})"
