"""Pictures of a bench's figures (`--plot FILE.png`): where each layer or matmul sits against
the machine's limits (a roofline), ours beside the peer, and ours over the peer per layer; for
the network benches, each engine's time per row. matplotlib comes with the `plot` extra.

The roofline's x axis is the arithmetic intensity of the operation's compulsory traffic: its
FLOPs over the bytes of its operands read once and its output written once (float32). Its two
limits are measured on this host in the same run: the FMA peak (`gemm.measure_peak`, times the
threads) and the read bandwidth of an array 16 times the L3 or more (`measure_bandwidth`). A
point under the sloped line at its intensity could be faster only by reusing caches across
calls, one under the flat line only by more FMAs per cycle.
"""

from __future__ import annotations

import statistics

import numpy as np

PEER_COLOR, OURS_COLOR = "#d62728", "#1f77b4"


def require_matplotlib():
    """matplotlib.pyplot with a file-only backend, or a clear error before any timing starts."""
    try:
        import matplotlib
    except ImportError as e:
        raise SystemExit('--plot needs matplotlib: pip install -e ".[plot]"') from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def measure_bandwidth(threads: int, mib: int = 512) -> float:
    """GB/s of reading a `mib` MiB float32 array once, `threads` threads each summing its share
    into four vector accumulators (four independent add chains, so the adds never wait on the
    loads' latency). The best median of three rounds, as measure_peak."""
    import tvm
    from tvm.script import tirx as T

    from schedules.common.targets import set_threads

    lanes = 64
    inner = mib * 2**20 // 4 // (threads * lanes)

    @T.prim_func(s_tir=True)
    def read(A: T.Buffer((threads, inner, lanes), "float32"), B: T.Buffer((threads, lanes), "float32")):
        T.func_attr({"tirx.noalias": True})
        for p in T.parallel(threads):
            for lane in T.vectorized(lanes):
                B[p, lane] = T.float32(0)
            for k in range(inner):
                for lane in T.vectorized(lanes):
                    B[p, lane] = B[p, lane] + A[p, k, lane]

    lib = tvm.compile(tvm.IRModule({"main": read}), target=tvm.target.Target({"kind": "llvm"}))
    a = tvm.runtime.tensor(np.ones((threads, inner, lanes), np.float32))
    b = tvm.runtime.tensor(np.zeros((threads, lanes), np.float32))
    set_threads(threads)
    ev = lib.mod.time_evaluator("main", tvm.cpu(), number=2, repeat=5)
    best = min(statistics.median(ev(a, b).results) for _ in range(3))
    if b.numpy()[0, 0] != inner:  # each lane summed `inner` ones: the loop read everything
        raise RuntimeError(f"bandwidth probe summed {b.numpy()[0, 0]}, not {inner}")
    return threads * inner * lanes * 4 / best / 1e9


def _roofline(ax, peak: float, bandwidth: float, intensities, highest: float) -> None:
    lo, hi = min(intensities) / 2, max(intensities) * 2
    x = np.geomspace(min(lo, peak / bandwidth / 4), max(hi, peak / bandwidth * 4), 200)
    ax.plot(x, np.minimum(peak, bandwidth * x), color="0.3", lw=1.5, label="roofline")
    ax.axhline(peak, color="0.3", ls=":", lw=1, label=f"FMA peak {peak:.0f} GFLOP/s")
    ax.plot(x, bandwidth * x, color="0.6", ls="--", lw=1, label=f"memory {bandwidth:.1f} GB/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per compulsory byte)")
    ax.set_ylabel("GFLOP/s")
    ax.set_ylim(top=max(peak, highest) * 1.6)
    ax.grid(True, which="both", alpha=0.2)


def _pairs(ax, intensity, ours, peer, peer_name: str, labels, effective=None) -> None:
    """Ours and the peer at each intensity, joined by a thin line per layer. `effective` marks
    our points that count FLOPs they did not do (Winograd: direct's FLOPs over its time)."""
    for x, a, b in zip(intensity, ours, peer):
        if b is not None:
            ax.plot([x, x], [a, b], color="0.8", lw=0.8, zorder=1)
    effective = effective or [False] * len(ours)
    for marker, flag, label in (("o", False, "ours"), ("^", True, "ours, Winograd (effective: direct's FLOPs)")):
        pts = [(x, a) for x, a, e in zip(intensity, ours, effective) if e == flag]
        if pts:
            ax.scatter(*zip(*pts), color=OURS_COLOR, marker=marker, s=22, zorder=3, label=label)
    have = [(x, b) for x, b in zip(intensity, peer) if b is not None]
    if have:
        ax.scatter(*zip(*have), color=PEER_COLOR, marker="x", s=22, zorder=3, label=peer_name)
    for x, a, text in zip(intensity, ours, labels):
        ax.annotate(text, (x, a), textcoords="offset points", xytext=(3, 3), fontsize=6, color="0.35")


def _ratios(ax, labels, ratios, peer_name: str) -> None:
    y = np.arange(len(labels))
    vals = [r if r is not None else np.nan for r in ratios]
    ax.barh(y, vals, color=[OURS_COLOR if v <= 1 else PEER_COLOR for v in np.nan_to_num(vals, nan=1.0)])
    ax.axvline(1.0, color="0.3", lw=1)
    ax.set_yticks(y, labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel(f"our time / {peer_name}'s (below 1: ours faster)")
    for yi, v in zip(y, vals):
        if not np.isnan(v):
            ax.annotate(f"{v:.2f}", (v, yi), textcoords="offset points", xytext=(2, -2), fontsize=6)


def conv2d_figure(result: dict, bandwidth: dict, title: str):
    """One row per (threads, cache) run of `bench conv2d`: roofline left, ratios right. Each
    layer once: the "auto" rows when timed, else direct's."""
    plt = require_matplotlib()
    runs = result["runs"]
    fig, axes = plt.subplots(len(runs), 2, figsize=(13, 4.8 * len(runs)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 2]})
    algo = "auto" if "auto" in result["algorithms"] else "direct"
    for (roof, bars), run in zip(axes, runs):
        rows = [r for r in run["layers"] if r["algorithm"] == algo]
        threads = run["threads"]
        peak = result["peak_gflops_1thread"] * threads
        intensity = [r["flops"] / r["bytes"] for r in rows]
        ours = [r["gflops"] for r in rows]
        peer = [r["flops"] / (r["torch_ms"] * 1e6) if r["torch_ms"] else None for r in rows]
        labels = [str(r["layer"]) for r in rows]
        _roofline(roof, peak, bandwidth[threads], intensity, max(ours))
        _pairs(roof, intensity, ours, peer, "PyTorch", labels, [r["plan"]["algorithm"] == "winograd" for r in rows])
        roof.set_title(f"{threads} thread(s), {run['cache']} cache: each layer (row # of the table), {algo}", fontsize=9)
        roof.legend(fontsize=7, loc="upper left")
        _ratios(bars, [f"{r['layer']}: {r['shape']}" for r in rows], [r["ratio_vs_torch"] for r in rows], "PyTorch")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def gemm_figure(result: dict, bandwidth: dict, title: str):
    """One row per thread count of `bench gemm`: matmuls on the roofline, ours and numpy."""
    plt = require_matplotlib()
    threads = sorted({r["threads"] for r in result["matmul"]})
    fig, axes = plt.subplots(len(threads), 2, figsize=(13, 4.5 * len(threads)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 2]})
    for (roof, bars), t in zip(axes, threads):
        rows = [r for r in result["matmul"] if r["threads"] == t]
        intensity = [2 * r["M"] * r["N"] * r["K"] / (4 * (r["M"] * r["K"] + r["K"] * r["N"] + r["M"] * r["N"]))
                     for r in rows]
        labels = [f"{r['M']}x{r['N']}x{r['K']}" for r in rows]
        _roofline(roof, result["peak_gflops_1thread"] * t, bandwidth[t], intensity, max(r["gflops"] for r in rows))
        _pairs(roof, intensity, [r["gflops"] for r in rows], [r["numpy_gflops"] for r in rows], "numpy", labels)
        roof.set_title(f"matmul, {t} thread(s)", fontsize=9)
        roof.legend(fontsize=7, loc="upper left")
        _ratios(bars, labels, [1 / r["speedup_vs_numpy"] for r in rows], "numpy")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _row_label(row: dict) -> str:
    """A network row's style and batch (bench resnet50 and the like), or a model's threads alone."""
    if "style" in row:
        return f"{row['style']}\nbatch {row['batch']}, {row['threads']} thr"
    return f"{row['threads']} thread(s)"


def network_figure(result: dict, title: str):
    """Each engine's milliseconds per row of a network or model bench (style, batch, threads)."""
    plt = require_matplotlib()
    rows = result["rows"]
    engines = list(dict.fromkeys(n for r in rows for n in r["ms"]))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows) + 2), 4.5))
    width = 0.8 / len(engines)
    x = np.arange(len(rows))
    for i, name in enumerate(engines):
        vals = [r["ms"].get(name, np.nan) for r in rows]
        bars = ax.bar(x + (i - (len(engines) - 1) / 2) * width, vals, width, label=name,
                      color=OURS_COLOR if name == "ours" else None)
        ax.bar_label(bars, fmt="%.1f", fontsize=6)
    ax.set_xticks(x, [_row_label(r) for r in rows], fontsize=7)
    ax.set_ylabel("ms per batch (best median)")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def save(fig, path: str) -> None:
    fig.savefig(path, dpi=110)
