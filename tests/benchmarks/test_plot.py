"""The bench pictures (benchmarks.plot) drawn from figures made up here: every layer and peer
on the roofline where its numbers put it, the limits as lines of the measured values, one bar
per layer with its ratio; and the bandwidth probe reads the whole array."""

import sys

import numpy as np
import pytest

from benchmarks import plot

pytest.importorskip("matplotlib", reason="matplotlib is in the test and plot extras")

PEAK, BW = 250.0, 30.0


def conv_result():
    def row(layer, algo, flops, nbytes, ms, torch_ms):
        return {"layer": layer, "shape": f"layer {layer}", "algorithm": algo, "flops": flops, "bytes": nbytes,
                "gflops": flops / ms / 1e6, "torch_ms": torch_ms, "ratio_vs_torch": ms / torch_ms if torch_ms else None,
                "plan": {"algorithm": "winograd" if algo == "auto" and layer == 1 else "direct"}}

    rows = [row(0, "direct", 2e8, 2e6, 1.0, 2.0), row(0, "auto", 2e8, 2e6, 1.0, 2.0),
            row(1, "direct", 4e8, 1e6, 2.0, 1.6), row(1, "auto", 4e8, 1e6, 0.5, 1.6),
            row(2, "direct", 1e7, 1e7, 0.5, None), row(2, "auto", 1e7, 1e7, 0.5, None)]
    return {"isa": "avx512", "peak_gflops_1thread": PEAK, "algorithms": ["direct", "auto"],
            "runs": [{"threads": t, "cache": "warm", "layers": rows} for t in (1, 2)]}


def points(ax):
    """(x, y) of each scatter collection, by its legend label."""
    return {c.get_label(): c.get_offsets().data.tolist() for c in ax.collections}


def test_conv2d_roofline_and_ratios():
    fig = plot.conv2d_figure(conv_result(), {1: BW, 2: 2 * BW}, "title")
    (roof1, bars1), (roof2, _) = np.reshape(fig.axes, (2, 2))
    pts = points(roof1)
    # The "auto" rows: layer 1 ran Winograd (its own marker), layers 0 and 2 direct.
    assert pts["ours"] == [[100.0, 200.0], [1.0, 20.0]]
    assert pts["ours, Winograd (effective: direct's FLOPs)"] == [[400.0, 800.0]]
    assert pts["PyTorch"] == [[100.0, 100.0], [400.0, 250.0]]  # layer 2 has no PyTorch time
    lines = {ln.get_label(): ln for ln in roof2.get_lines()}
    assert lines[f"FMA peak {2 * PEAK:.0f} GFLOP/s"].get_ydata()[0] == 2 * PEAK  # the threads' peak
    x, y = lines[f"memory {2 * BW:.1f} GB/s"].get_data()
    np.testing.assert_allclose(y / x, 2 * BW)
    assert roof1.get_ylim()[1] >= 800.0  # the Winograd point stays in view
    widths = [p.get_width() for p in bars1.patches]
    assert widths[:2] == [0.5, pytest.approx(0.5 / 1.6)] and np.isnan(widths[2])


def test_gemm_and_network_figures(tmp_path):
    mm = [{"M": m, "N": 64, "K": 64, "threads": 1, "gflops": 100.0, "numpy_gflops": 50.0, "speedup_vs_numpy": 2.0}
          for m in (64, 128)]
    fig = plot.gemm_figure({"peak_gflops_1thread": PEAK, "matmul": mm}, {1: BW}, "t")
    roof, bars = fig.axes
    intensity = 2 * 64 ** 3 / (4 * 3 * 64 * 64)
    assert points(roof)["ours"][0] == [pytest.approx(intensity), 100.0]
    assert [p.get_width() for p in bars.patches] == [0.5, 0.5]
    rows = [{"style": "user", "batch": 1, "threads": t, "ms": {"ours": 3.0, "OpenVINO": 4.0 + t}} for t in (1, 2)]
    fig = plot.network_figure({"rows": rows, "model": "m"}, "t")
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == [3.0, 3.0, 5.0, 6.0]  # per engine, its rows
    plot.save(fig, tmp_path / "n.png")
    assert (tmp_path / "n.png").read_bytes()[:4] == b"\x89PNG"


def test_bandwidth_probe_reads_everything():
    bw = plot.measure_bandwidth(1, mib=8)
    assert np.isfinite(bw) and bw > 0.1


def test_missing_matplotlib_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit, match=r'pip install -e "\.\[plot\]"'):
        plot.require_matplotlib()
