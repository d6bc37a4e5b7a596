"""The whole-model int8 benches: `bench resnet50|mobilenet_v2|resnext50 --int8 [--reduce-range]` and
`bench model SOURCE --int8 [--reduce-range]`. quantize_static's weights span the full int8 range by
default and 7 bits with --reduce-range; `bench model X.onnx --int8` runs end to end on a small file."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import cli

for _pkg in ("onnx", "onnxruntime", "openvino"):
    pytest.importorskip(_pkg, reason=f"{_pkg} is in the peers extra: pip install -e \".[peers]\"")

ROOT = Path(__file__).resolve().parents[2]
SHAPE = (1, 8, 16, 16)


@pytest.fixture(scope="module")
def two_convs(tmp_path_factory) -> Path:
    """A float32 ONNX model of two 3x3 convs with a ReLU between, its input named "data" (not "x")."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32), n)
             for n, s in (("w1", (16, 8, 3, 3)), ("b1", (16,)), ("w2", (16, 16, 3, 3)), ("b2", (16,)))]
    nodes = [helper.make_node("Conv", ["data", "w1", "b1"], ["h"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)]
    graph = helper.make_graph(nodes, "two_convs", [helper.make_tensor_value_info("data", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 16, 16, 16))], inits)
    path = tmp_path_factory.mktemp("int8") / "two_convs.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _int8_weights(path) -> list[np.ndarray]:
    import onnx
    from onnx import TensorProto, numpy_helper

    model = onnx.load(str(path))
    arrays = [numpy_helper.to_array(i) for i in model.graph.initializer if i.data_type == TensorProto.INT8]
    return [a for a in arrays if a.ndim == 4]  # the conv weights, not their zero points


def test_cli_parses_reduce_range():
    for cmd in (["resnet50"], ["mobilenet_v2"], ["resnext50"], ["model", "x.onnx"]):
        args = cli.parser().parse_args(["bench", *cmd, "--int8", "--reduce-range"])
        assert args.int8 is True and args.reduce_range is True, cmd
        args = cli.parser().parse_args(["bench", *cmd, "--int8"])
        assert args.int8 is True and args.reduce_range is False, cmd


def test_reduce_range_without_int8_is_refused(capsys):
    for cmd in (["resnet50"], ["model", "x.onnx"], ["conv2d"]):
        with pytest.raises(SystemExit):
            cli.main(["bench", *cmd, "--reduce-range"])
        assert "--reduce-range quantizes the int8 model: add --int8 (bench conv2d: --dtype int8)" \
            in capsys.readouterr().err, cmd


def test_layer_bench_reduce_range_gives_every_engine_7_bit_weights_and_ours_weight_bits_7(monkeypatch):
    """`bench conv2d --dtype int8 --reduce-range`: the layer's weights span [-64, 64] (64 reached),
    the default's reach past it, and our op is compiled with weight_bits=7 (the pairs tile on AVX2)."""
    from benchmarks import int8
    from benchmarks.conv2d import load_workloads

    assert cli.parser().parse_args(["bench", "conv2d", "--dtype", "int8", "--reduce-range"]).reduce_range
    layer = load_workloads("resnet50_v1.5")[1]
    w7, w8 = (int8.quantized_layer(layer, 0, rr)["w"] for rr in (True, False))
    assert np.abs(w7).max() == 64 and np.abs(w8).max() > 64
    op, _ = int8.ours(layer, int8.quantized_layer(layer, 0, True), "x86-avx2", 1, "NHWC", 7)
    assert op.quant.weight_bits == 7 and op.plan.kern.pairs, op.plan.why


@pytest.mark.parametrize("flags, reduce_range", [([], False), (["--reduce-range"], True)])
def test_network_commands_pass_reduce_range_to_the_quantization(monkeypatch, flags, reduce_range):
    """`bench resnet50 --int8 [--reduce-range]` builds its QDQ model with reduce_range as given
    (qdq_network stopped there: no export, no timing)."""
    from benchmarks import int8

    class Stop(Exception):
        pass

    def qdq_network(name, path, reduce_range=False, seed=0):
        raise Stop(name, reduce_range)

    monkeypatch.setattr(int8, "qdq_network", qdq_network)
    with pytest.raises(Stop) as stop:
        cli.main(["bench", "resnet50", "--int8", *flags, "--threads", "1"])
    assert stop.value.args == ("resnet50", reduce_range)


def test_quantize_full_range_by_default_and_7_bit_weights_with_reduce_range(two_convs, tmp_path):
    """quantize_static's symmetric per-channel int8 weights: each channel's largest weight at
    127 by default; with reduce_range=True at 64, everything in [-64, 64] (ONNX Runtime's
    reduced int8 range), the input read by its own name."""
    from benchmarks import int8

    full = int8.quantize(str(two_convs), str(tmp_path / "full.onnx"), SHAPE)
    weights = _int8_weights(full)
    assert len(weights) == 2 and max(int(np.abs(w.astype(np.int32)).max()) for w in weights) == 127
    reduced = int8.quantize(str(two_convs), str(tmp_path / "reduced.onnx"), SHAPE, reduce_range=True)
    weights = _int8_weights(reduced)
    assert len(weights) == 2
    assert all(w.min() >= -64 and w.max() <= 64 for w in weights), [(w.min(), w.max()) for w in weights]
    assert max(int(np.abs(w.astype(np.int32)).max()) for w in weights) == 64


def test_bench_model_int8_on_an_onnx_file(two_convs, tmp_path):
    """`bench model X.onnx --int8 --reduce-range`: the file quantized (7-bit weights), ours against
    ONNX Runtime and OpenVINO on the QDQ file, the lines run_network prints, the JSON saying
    which quantization ran."""
    out_json = tmp_path / "int8.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "microkernels", "bench", "model", str(two_convs), "--int8",
                           "--reduce-range", "--threads", "1", "--repeat", "1", "--json", str(out_json)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, f"{out}\n{proc.stderr[-3000:]}"
    assert "reduce_range" in out and "7-bit" in out, out
    assert "2 of 2 quantized convs and fully connected layers on our int8 conv2d" in out, out
    assert "other ops left on TVM's default lowering" in out, out
    assert "1 thread(s): ours " in out and "ours/best peer" in out, out
    assert "outputs on 100 random images" in out and "ours vs reference " in out and "OV vs reference " in out, out
    result = json.loads(out_json.read_text())
    assert result["model"] == str(two_convs) and result["quantization"]["reduce_range"] is True
    assert result["quantization"]["weight_bits"] == 7 and result["samples"] == 100
    assert [r["threads"] for r in result["rows"]] == [1] and "report" not in result
    # the breakdown counts our int8 convs (mk_qconv2d_*) as ours, not as TVM's lowering
    assert "ours by kind: conv " in out, out
    kinds = result["rows"][0]["breakdown_ms"]
    assert kinds.get("conv", 0) > 0 and "conv (TVM's lowering)" not in kinds, kinds


@pytest.mark.parametrize("child, want", [
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "crashed loading and running it (SIGSEGV)"),
    ("raise SystemExit(3)", "failed loading and running it (exit 3"),
    ("pass", None),
])
def test_crashes_tells_an_engine_that_kills_its_process(monkeypatch, two_convs, child, want):
    """peers.crashes loads and runs the file in a child process: a segfault or a silent exit
    there is the reason OpenVINO is left out; a clean exit is None."""
    from benchmarks import peers

    monkeypatch.setattr(peers, "CHILD", child)
    monkeypatch.setattr(peers, "_crashes", {})
    why = peers.crashes("OpenVINO", str(two_convs), SHAPE)
    if want is None:
        assert why is None
    else:
        assert why is not None and why.startswith("OpenVINO skipped on two_convs.onnx: ") and want in why, why


def test_the_real_child_runs_openvino_on_the_file(monkeypatch, two_convs):
    from benchmarks import peers

    monkeypatch.setattr(peers, "_crashes", {})
    assert peers.crashes("OpenVINO", str(two_convs), SHAPE) is None


def test_int8_network_bench_goes_on_without_an_engine_that_crashes(monkeypatch, two_convs):
    """`bench model X.onnx --int8` where OpenVINO would kill the process (DenseNet-121's QDQ model
    with OpenVINO 2026.4): ours against ONNX Runtime alone, the reason said."""
    from benchmarks import model, peers

    reason = "OpenVINO skipped on qdq.onnx: crashed loading and running it (SIGSEGV)"
    monkeypatch.setattr(peers, "crashes", lambda engine, path, shape, timeout=600: reason)

    def no_openvino(*args, **kwargs):
        raise AssertionError("OpenVINO built in-process on a model it crashes on")

    monkeypatch.setattr(peers, "openvino", no_openvino)
    lines: list[str] = []
    result = model.run_int8(str(two_convs), [1], lines.append, repeat=1)
    out = "\n".join(lines)
    assert reason in out and result["skipped"] == [reason], out
    assert "1 thread(s): ours " in out and "ORT " in out and " OV " not in out and "ours/best peer" in out, out
    assert "OV vs reference" not in out and "ours vs ORT " in out, out
    assert set(result["rows"][0]["ms"]) == {"ours", "ORT"}, result["rows"][0]


def test_model_bench_goes_on_without_an_engine_that_crashes(monkeypatch, two_convs):
    """`bench model X.onnx --peers` (float32) likewise: the reason said once, OpenVINO not built."""
    from benchmarks import model, peers

    reason = "OpenVINO skipped on two_convs.onnx: crashed loading and running it (SIGSEGV)"
    monkeypatch.setattr(peers, "crashes", lambda engine, path, shape, timeout=600: reason)
    monkeypatch.setattr(peers, "openvino", lambda *a, **k: (_ for _ in ()).throw(AssertionError("OpenVINO built")))
    lines: list[str] = []
    result = model.run(str(two_convs), [1, 2], lines.append, with_peers=True, repeat=1)
    out = "\n".join(lines)
    assert out.count(reason) == 1 and result["skipped"] == [reason], out
    assert all(set(r["ms"]) == {"ours", "ONNX Runtime"} for r in result["rows"]), result["rows"]
