"""The README's commands work from a clone with nothing beside it.

Each bench command runs in a subprocess from a copy of the tracked files in a temporary folder
(no `shared/` next to it), importing the copy's packages, on one small case each. This is what
a user who clones or installs the project gets: a table read from a folder outside the project
would fail here as it did for them.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import conv2d

from ..arm_tools import require_mca

ROOT = Path(__file__).resolve().parents[2]
SMALL_LAYER = "22"  # ResNet-50's 512x7x7 3x3: the smallest map, a few ms to compile and time


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """The tracked files as they stand in the work tree, copied into a folder of their own."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    dest = tmp_path_factory.mktemp("fresh") / "tvm-microkernels"
    for name in filter(None, files.decode().split("\0")):
        src = ROOT / name
        if src.is_file():  # a file deleted in the work tree but not yet in git is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    assert not (dest.parent / "shared").exists()
    return dest


def cli(clone, *args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(clone)  # ahead of the editable install's finder
    proc = subprocess.run([sys.executable, *args], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_clone_imports_its_own_packages(clone):
    out = cli(clone, "-c", "import benchmarks, schedules; print(benchmarks.__file__); print(schedules.__file__)")
    assert all(Path(line).is_relative_to(clone) for line in out.split()), out


def test_bench_gemm(clone):
    out = cli(clone, "-m", "microkernels", "bench", "gemm", "--sizes", "96", "--threads", "1", "--repeat", "1")
    assert "GFLOP/s" in out and "96x96x96" in out, out
    assert out.startswith("host: ") and " cores; caches of cpu0: " in out.splitlines()[0], out


def test_bench_gemm_int8_prints_each_isa_peak_and_tile(clone):
    from microkernels import X86_INT_ISAS
    from microkernels.int_gemm import PAIR_OPS

    out = cli(clone, "-m", "microkernels", "bench", "gemm", "--int8")
    runs = [n for n, isa in X86_INT_ISAS.items() if isa.host_supports()]
    pairs = [n for n in runs if n in PAIR_OPS]  # and the vpmaddubsw pairs probe and tile on each ISA without VNNI
    assert "FP32 FMA peak" in out and out.count("measured vp") == len(runs) + len(pairs), out
    assert out.count("(pairs) peak") == len(pairs) and out.count("tile mk_u8s7_gemm") == len(pairs), out
    for line in (ln for ln in out.splitlines() if "L1-resident" in ln):
        pct = float(line.split("GOP/s")[1].split("%")[0])
        assert 0 < pct < 150, line


def test_bench_conv2d_int8_against_the_peers_on_a_qdq_layer(clone):
    """One ResNet-50 layer quantized: ours (channels-last) beside our float32 and, where the peers
    extra is installed, ONNX Runtime and OpenVINO on the one-layer QDQ model, outputs compared."""
    out = cli(clone, "-m", "microkernels", "bench", "conv2d", "--dtype", "int8", "--layers", "1", "--threads", "1",
              "--repeat", "1", "--layout", "NHWC")
    row = next(line for line in out.splitlines() if line.strip().startswith("64x56x56->64 k1"))
    assert re.search(r"mk_(u8s8_gemm_\d+x\d+_avx|s16_gemm_\d+x\d+_avx|u8s8_brgemm_\d+x\d+_amxint8)", row), row
    assert "weighted total: int8" in out and "(NHWC data and output)" in out, out
    if "ORT" in out.split("weighted total")[1]:
        # max diff: ours against the QDQ graph as ONNX defines it (ORT, optimizations off); the
        # last column, the peers' own (they saturate on hosts without VNNI), is not ours to test
        assert int(row.split()[-2]) <= 1, f"ours differs from the QDQ graph by more than one quantization step: {row}"
        assert re.fullmatch(r"\d+/\d+", row.split()[-1]), row


def test_bench_gemm_exhaustive_times_every_tile(clone):
    out = cli(clone, "-m", "microkernels", "bench", "gemm", "--sizes", "96", "--threads", "1", "--repeat", "1",
              "--exhaustive")
    every = [line for line in out.splitlines() if "every tile:" in line]
    assert len(every) == 1 and every[0].count(" ms") >= 4 and "chosen/fastest" in every[0], out
    assert "exhaustive: the chosen tile within 5% of the fastest on" in out, out


def test_bench_conv2d_reads_its_packaged_table(clone):
    out = cli(clone, "-m", "microkernels", "bench", "conv2d", "--layers", SMALL_LAYER, "--threads", "1",
              "--cache", "warm", "--repeat", "1", "--algorithms", "wino4")
    rows = [line.split() for line in out.splitlines() if "512x7x7->512 k3 s1 p1" in line]
    assert [r[6] for r in rows] == ["direct", "wino4"], out  # direct always runs, as the baseline
    assert "weighted total wino4" in out, out


def test_bench_conv2d_exhaustive_says_how_far_auto_is_from_the_fastest(clone):
    out = cli(clone, "-m", "microkernels", "bench", "conv2d", "--layers", SMALL_LAYER, "--threads", "1",
              "--cache", "warm", "--repeat", "1", "--exhaustive")
    rows = [line.split() for line in out.splitlines() if "512x7x7->512 k3 s1 p1" in line]
    assert [r[6] for r in rows] == ["direct", "wino2", "wino4", "wino6"], out
    auto = [line for line in out.splitlines() if line.strip().startswith("auto:")]
    assert len(auto) == 1 and "(defaults)" in auto[0] and "auto/fastest" in auto[0], out
    # Every candidate autotune would time, the direct conv's variants among them
    every = [line for line in out.splitlines() if line.strip().startswith("every plan (ms):")]
    assert len(every) == 1 and every[0].count("direct ") >= 2 and "F(6)" in every[0], out
    assert "exhaustive: auto within 5% of the fastest on" in out, out


def test_tune_writes_what_the_planners_then_read(clone, tmp_path):
    """A tiny tune (one small layer): the file names this host, holds the tile rates, the pack
    cost and the layer at each thread count, and a conv2d in a new process says it used it."""
    where = tmp_path / "tuned.json"
    table = tmp_path / "tiny_conv2d.csv"  # --autotune takes a table's path as well as a packaged name
    table.write_text("in_channels,height,width,out_channels,kernel,stride,padding,count\n16,8,8,16,3,1,1,1\n")
    out = cli(clone, "-m", "microkernels", "tune", "--quick", "--layers", "16x8", "--output", str(where),
              "--autotune", str(table))
    assert "FP32 FMA peak" in out and "matmul tile" in out and f"wrote {where}" in out, out
    data = json.loads(where.read_text())
    isa = data["winograd"][0]["isa"]
    assert data["host"]["cores"] == os.cpu_count() and data["matmul_tiles"][isa] and data["pack_flops_per_lane"][isa]
    assert sorted(r["threads"] for r in data["winograd"]) == sorted({1, os.cpu_count()})
    assert all(set(r["seconds_network"]) == {"direct", "2", "4", "6"} for r in data["winograd"])
    # --autotune: the layer's plans timed at each thread count, the fastest kept
    assert sorted(r["threads"] for r in data["layers"]) == sorted({1, os.cpu_count()})
    assert all({"F(2)", "F(4)", "F(6)"} < set(r["seconds"]) for r in data["layers"]), data["layers"]
    assert out.count("16x8x8->16 k3 s1 p1, ") == len({1, os.cpu_count()}) and " plans" in out, out
    out = cli(clone, "-c", "import os, schedules; os.environ['TVM_MICROKERNELS_TUNE'] = " + repr(str(where))
              + "; print(schedules.conv2d((1, 16, 8, 8), (16, 16, 3, 3), padding=1, target='x86-" + isa
              + "').plan['source'])")
    assert out.strip() == f"tuned ({where})", out


def test_bench_conv2d_draws_its_plot(clone, tmp_path):
    """--plot: the bandwidth it measures for the roofline is printed, and a PNG is written."""
    png = tmp_path / "conv.png"
    out = cli(clone, "-m", "microkernels", "bench", "conv2d", "--layers", SMALL_LAYER, "--threads", "1",
              "--cache", "warm", "--repeat", "1", "--plot", str(png))
    bw = float(out.split("read bandwidth, 1 thread(s): ")[1].split()[0])
    assert bw > 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000, out


@pytest.mark.parametrize("path", ["blocked", "nchw", "bound"])
def test_bench_conv2d_times_each_user_path(clone, path):
    out = cli(clone, "-m", "microkernels", "bench", "conv2d", "--layers", SMALL_LAYER, "--threads", "1",
              "--cache", "warm", "--repeat", "1", "--path", path)
    assert f"warm cache, path {path} (peak" in out, out
    rows = [line.split() for line in out.splitlines() if "512x7x7->512 k3 s1 p1" in line]
    assert len(rows) == 1 and float(rows[0][7]) > 0, out


def test_bench_conv2d_mobilenet_table_has_groups(clone):
    """The packaged MobileNetV2 table: its depthwise rows run on the depthwise path, and the
    totals are split by kind."""
    out = cli(clone, "-m", "microkernels", "bench", "conv2d", "--workloads", "mobilenet_v2", "--layers", "1", "2",
              "--threads", "1", "--cache", "warm", "--repeat", "1")
    rows = [line for line in out.splitlines() if "32x112x112->32 k3 s1 p1 g32" in line]
    assert len(rows) == 1 and "depthwise" in rows[0] and "% of bound" in rows[0], out
    assert "depthwise bound, 1 thread:" in out, out
    assert "by kind (direct): depthwise ours" in out and "pointwise ours" in out, out


def test_bench_resnet50_runs_from_a_clone(clone):
    """The whole network from the clone's own models/ package (about a minute: two builds)."""
    out = cli(clone, "-m", "microkernels", "bench", "resnet50", "--threads", "1", "--repeat", "1", "--no-default")
    assert "53/53 conv2d on our kernels" in out, out
    rows = [line.split() for line in out.splitlines() if line.split()[:2] == ["1", "1"]]
    assert len(rows) == 1 and rows[0][5] == "nan", out  # one thread, batch 1; TVM's default build skipped
    assert "ours by kind: conv" in out, out
    diff = float(out.split("max |PyTorch| = ")[1].split()[0])
    assert diff < 1e-4, out


def test_bench_mobilenet_v2_runs_from_a_clone(clone):
    out = cli(clone, "-m", "microkernels", "bench", "mobilenet_v2", "--threads", "1", "--repeat", "1", "--no-default")
    assert "52/52 conv2d on our kernels" in out, out
    assert float(out.split("max |PyTorch| = ")[1].split()[0]) < 1e-4, out


def test_bench_arm_reads_its_packaged_table(clone):
    require_mca()
    out = cli(clone, "-m", "microkernels", "bench", "arm", "--layers", SMALL_LAYER)
    assert "512x7x7->512 k3 s1 p1" in out, out


def test_check_tools_reports_every_tool(clone):
    """check-tools' lines, whatever this machine has; its verdict is the self-check's."""
    env = {**os.environ, "PYTHONPATH": str(clone)}
    proc = subprocess.run([sys.executable, "-m", "microkernels", "check-tools"], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["armv7", "aarch64", "llvm-mca"], proc.stdout
    assert proc.returncode == (0 if all(": ok (" in line for line in lines) else 1), proc.stdout


def test_packaged_tables_load_and_unknown_ones_are_named():
    assert {"resnet50_v1.5", "mobilenet_v2", "resnext50_32x4d_grouped"} <= set(conv2d.workload_names())
    mobilenet = conv2d.load_workloads("mobilenet_v2")
    assert len(mobilenet) == 30 and sum(layer.kind == "depthwise" for layer in mobilenet) == 10
    layers = conv2d.load_workloads()
    assert len(layers) == 23 and sum(layer.count for layer in layers) == 53
    # ResNeXt-50 32x4d's grouped 3x3 layers: 4, 8, 16 and 32 channels per group, 16 of its convs.
    grouped = conv2d.load_workloads("resnext50_32x4d_grouped")
    assert sum(layer.count for layer in grouped) == 16 and {layer.kind for layer in grouped} == {"other"}
    with pytest.raises(FileNotFoundError, match=r"'nope'.*resnet50_v1\.5"):
        conv2d.load_workloads("nope")


@pytest.fixture(scope="module")
def small_onnx(tmp_path_factory):
    """A small conv net (conv, batch norm, ReLU, a strided conv, mean, Linear) exported to ONNX."""
    import warnings

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                              torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10)).eval()
    path = tmp_path_factory.mktemp("onnx") / "small.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.randn(1, 3, 32, 32),), str(path), dynamo=False, opset_version=17)
    return path


def _no_peers(tmp_path) -> dict:
    """An environment in which onnxruntime and openvino fail to import (a user without the peers extra)."""
    for pkg in ("onnxruntime", "openvino"):
        (tmp_path / pkg).mkdir(exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("raise ImportError('not installed here')\n")
    return {"PYTHONPATH": str(tmp_path)}


def test_bench_model_on_an_onnx_file_against_the_peers(clone, small_onnx, tmp_path):
    """Ours through TVM's ONNX importer and schedules.relax.build, ONNX Runtime and OpenVINO on
    the file, taking turns; outputs against ONNX Runtime's; the ratio; our breakdown by kind;
    --plot: each engine's time drawn to a PNG."""
    png = tmp_path / "model.png"
    out = cli(clone, "-m", "microkernels", "bench", "model", str(small_onnx), "--peers", "--threads", "1",
              "--repeat", "1", "--plot", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000, out
    assert "1x3x32x32, 1 thread(s): first call" in out and "2/2 conv2d on our kernels" in out, out
    assert "ONNX Runtime 1.32.0, precision float32" in out and "OpenVINO 2026.4.1, precision f32" in out, out
    errs = out.split("max |diff| / max |ONNX Runtime|: ")[1].splitlines()[0]
    assert float(errs.split("ours ")[1].split(",")[0]) < 1e-5, out
    assert "ours/best peer" in out and "ours by kind: conv" in out, out


def test_bench_model_without_the_peers_says_why(clone, small_onnx, tmp_path):
    """Without the peers extra (their imports fail) and without --peers: ours alone, no ratio, no crash."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = f"{_no_peers(tmp_path)['PYTHONPATH']}:{clone}"
    proc = subprocess.run([sys.executable, "-m", "microkernels", "bench", "model", str(small_onnx), "--peers",
                           "--threads", "1", "--repeat", "1"], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2/2 conv2d on our kernels" in proc.stdout and "ours " in proc.stdout, proc.stdout
    assert "ours/best peer" not in proc.stdout and "ONNX Runtime 1" not in proc.stdout, proc.stdout
    out = cli(clone, "-m", "microkernels", "bench", "model", str(small_onnx), "--threads", "1", "--repeat", "1")
    assert "ours/best peer" not in out and "OpenVINO 2026" not in out, out


def test_bench_model_refuses_a_source_it_does_not_know(clone):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(clone)
    cases = [("resnet50", "torchvision:NAME or timm:NAME"), ("missing.onnx", "no ONNX file")]
    cases.append(("torchvision:no_such_net", "zoo extra" if _zoo_missing() else "has no model"))
    for source, says in cases:
        proc = subprocess.run([sys.executable, "-m", "microkernels", "bench", "model", source], cwd=clone, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0 and says in proc.stderr, (source, proc.stderr[-2000:])


def _zoo_missing() -> str | None:
    from benchmarks import zoo

    return zoo.missing("timm")


def test_bench_model_and_zoo_on_a_torchvision_name(clone, small_onnx):
    """A torchvision classifier by name (random seeded weights, nothing downloaded) through
    torch.compile, against PyTorch eager; the zoo table over it and an ONNX file, with the
    geo-mean; a first call as one JSON line."""
    if _zoo_missing():
        pytest.skip(_zoo_missing())
    out = cli(clone, "-m", "microkernels", "bench", "zoo", "--models", "torchvision:squeezenet1_1", str(small_onnx),
              "--threads", "1", "--repeat", "1")
    assert "torchvision:squeezenet1_1 1x3x224x224, 1 thread(s): first call" in out, out
    assert "26/26 conv2d on our kernels" in out and "outputs vs PyTorch" in out, out
    err = float(out.split("max |diff| / max |PyTorch|: ours ")[1].split(",")[0].split()[0])
    assert err < 1e-4, out
    rows = [line.split() for line in out.splitlines() if line.startswith("  torchvision:squeezenet1_1 ")]
    assert len(rows) == 1 and float(rows[0][5]) > 0 and float(rows[0][6]) > 0, out  # eager ms, ours / eager
    assert "1 thread(s): geo-mean" in out, out
    first = cli(clone, "-m", "microkernels", "bench", "model", "torchvision:squeezenet1_1", "--first-call",
                "--threads", "1")
    record = json.loads(next(s for s in first.splitlines() if s.startswith("first-call: "))[len("first-call: "):])
    assert record["model"] == "torchvision:squeezenet1_1" and record["first_call_s"] > 0, first
