"""schedules.relax.build's guard: the pass never turns a model TVM builds into one it cannot
build. Where our pass, or the build of what it made, fails on a model that TVM's own build
takes, build returns TVM's own build with the reason in the report and a warning; where TVM's
own build fails too, our error stands. (Faults are injected here: ONNX's backend cases,
test_onnx_backend.py, check that no real model falls back.)"""

import logging

import numpy as np
import pytest
import tvm
from tvm import relax

from schedules import relax as mkrelax
from schedules.common import cache
from schedules.relax import pipeline

from .test_conv2d import HOST, close, run


def _model() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "float32"))
    rng = np.random.default_rng(0)
    w = lambda: relax.const(rng.standard_normal((16, 16, 3, 3)).astype(np.float32))  # noqa: E731
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, w(), padding=1))))
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(y, w(), padding=1)))
        bb.emit_func_output(out)
    return bb.get()


def _broken(*_args, **_kwargs):
    raise tvm.error.InternalError("injected: a layout no lowering takes")


@pytest.mark.parametrize("where", ["cancel_transforms", "compile_model"])
def test_a_model_our_pass_breaks_is_tvms_own_build_with_the_reason(where, monkeypatch, caplog):
    """A fault in a step of the pass, or in the build of its output: the model is TVM's own
    build, the report says so and why (and nothing of kernels that do not run), a warning too."""
    mod = _model()
    monkeypatch.setattr(pipeline, where, _broken)
    report: list = []
    with caplog.at_level(logging.WARNING, logger="tvm_microkernels.relax"):
        ex = mkrelax.build(mod, HOST, report=report)
    assert len(report) == 1 and report[0]["op"] == "model" and report[0]["runs_on"] == "tvm", report
    assert "InternalError: injected: a layout no lowering takes" in report[0]["reason"], report
    warned = [r.getMessage() for r in caplog.records if getattr(r, "mk_fallback", False)]
    assert len(warned) == 1 and "injected" in warned[0] and "TVM's own build" in warned[0], warned
    x = np.random.default_rng(1).standard_normal((1, 16, 8, 8)).astype(np.float32)
    close(run(ex, x, compiled=True), run(mod, x))
    caplog.clear()  # the fallback was this test's point (conftest fails a test that falls back)


def test_a_fallback_is_not_cached(tmp_path, monkeypatch, caplog):
    """With the compile cache on, TVM's own build in place of ours is not kept: the next build
    of the model tries ours again (a failure may be transient: a worker killed, memory short)."""
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "cache"))
    cache.clear_memory()
    mod = _model()
    monkeypatch.setattr(pipeline, "compile_model", _broken)
    keys: list = []
    mkrelax.build(mod, HOST, keys=keys)
    assert keys == []
    monkeypatch.undo()  # ours again, the cache still on
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "cache"))
    report: list = []
    mkrelax.build(mod, HOST, report=report, keys=keys)
    assert len(keys) == 1 and all(r["op"] != "model" for r in report) and any(r["runs_on"] == "ours" for r in report)
    cache.clear_memory()
    caplog.clear()


def test_a_model_tvm_cannot_build_either_raises_our_error(caplog):
    """ewise_fma has no lowering in TVM 0.27: its own build fails too, so the error stands."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.ewise_fma(x, x, x)))
        bb.emit_func_output(out)
    report: list = []
    with caplog.at_level(logging.INFO, logger="tvm_microkernels.relax"):
        with pytest.raises(tvm.error.InternalError, match="ewise_fma"):
            mkrelax.build(bb.get(), HOST, report=report)
    assert report == []
    assert any("TVM's own build fails too" in r.getMessage() for r in caplog.records), caplog.text


def test_options_are_refused_not_built_around():
    """A wrong option is the user's to fix: build raises it rather than falling back."""
    with pytest.raises(ValueError, match="'auto' or 'direct'"):
        mkrelax.build(_model(), HOST, algorithm="winograd")
