"""benchmarks.peers: ONNX Runtime and OpenVINO on a module's ONNX export compute what PyTorch does,
in float32, and an engine whose package does not import is skipped with its reason."""

import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the peers run a PyTorch module (pip install -e \".[bench]\")")

from benchmarks import peers


def _tiny():
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.1, 0.1)
        model[1].running_var.uniform_(0.5, 1.5)
    return model.eval()


def test_ort_and_openvino_match_pytorch():
    for pkg in ("onnx", "onnxruntime", "openvino"):
        pytest.importorskip(pkg, reason=f"{pkg} is in the peers extra: pip install -e \".[bench,peers]\"")
    model = _tiny()
    x = np.random.default_rng(0).standard_normal((2, 3, 12, 12)).astype(np.float32)
    with peers.Peers(model) as p:
        assert p.skipped == []
        engines = p.engines(x, threads=1)
        assert [e.name for e in engines] == ["ONNX Runtime", "OpenVINO", "PyTorch"]
        want = engines[-1].run()
        for e in engines[:-1]:
            got = e.run()
            assert got.shape == want.shape and e.version
            assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), e.name
        assert {e.name: e.precision for e in engines} == {"ONNX Runtime": "float32", "OpenVINO": "f32",
                                                          "PyTorch": "float32"}
        path = p.export(x)
        assert os.path.isfile(path) and p.export(x) == path  # one export per input shape
        assert p.export(x[:1]) != path
    assert not os.path.exists(path)  # the temporary directory goes with the Peers


def test_an_engine_that_does_not_import_is_skipped_with_its_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino raises ImportError
    why = peers.missing("OpenVINO")
    assert why.startswith("OpenVINO skipped: `import ") and ".[peers]" in why, why
    p = peers.Peers(_tiny())
    assert why in p.skipped
    x = np.zeros((1, 3, 8, 8), np.float32)
    names = [e.name for e in p.engines(x, threads=1)]
    p.close()
    assert "OpenVINO" not in names and names[-1] == "PyTorch"


def test_export_names_the_input_x_so_tvm_does_not_rename_it(tmp_path):
    """peers.export (the int8 benches' float32 ONNX): the input named x, not the exporter's "input.1",
    which TVM's ONNX frontend renames with a UserWarning on every bench run."""
    onnx = pytest.importorskip("onnx", reason="onnx is in the peers extra: pip install -e \".[peers]\"")
    import warnings

    from tvm.relax.frontend.onnx import from_onnx

    path = peers.export(_tiny(), (1, 3, 8, 8), str(tmp_path / "tiny.onnx"))
    model = onnx.load(path)
    assert [i.name for i in model.graph.input] == ["x"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_onnx(model, shape_dict={"x": (1, 3, 8, 8)}, keep_params_in_input=False)
