"""The engines people deploy a PyTorch model with, on the same module: ONNX Runtime and OpenVINO
on its ONNX export, and PyTorch eager itself.

`Peers(model)` exports the module to ONNX (TorchScript exporter, opset 17, one file per input
shape, in a temporary directory it removes on close) and `engines(x, threads)` returns one
`Engine` per engine that can run here: a callable that runs one forward pass on `x`, the
engine's version and the precision it computes in. ONNX Runtime runs on its CPU provider with
every graph optimization on, `threads` intra-op threads and one inter-op thread; OpenVINO on
"CPU" with the latency hint, f32 inference precision asked for and read back from the compiled
model, `threads` inference threads. An engine whose package is not installed (the `peers` extra:
onnx, onnxruntime, openvino) is left out, its one-line reason in `Peers.skipped`; so is an engine
that kills its process on a model (`crashes`: OpenVINO 2026.4 segfaults compiling DenseNet-121's
QDQ model, so OpenVINO first loads and runs each file once in a child process; ONNX Runtime has
not crashed on any model here and runs in-process directly).
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

OPSET = 17
# engine -> the packages it needs (onnx: the exporter writes the file with it)
NEEDS = {"ONNX Runtime": ("onnx", "onnxruntime"), "OpenVINO": ("onnx", "openvino")}


@dataclass
class Engine:
    name: str
    version: str
    precision: str
    run: Callable[[], np.ndarray]  # one forward pass on the input it was built for


def missing(engine: str) -> str | None:
    """Why `engine` cannot run here (a package it needs does not import), or None."""
    for pkg in NEEDS.get(engine, ()):
        try:
            importlib.import_module(pkg)
        except Exception as e:  # noqa: BLE001 (a broken install fails with more than ImportError)
            return f"{engine} skipped: `import {pkg}` failed ({type(e).__name__}: {e}); pip install -e \".[peers]\""
    return None


# What the child process of `crashes` runs: the engine's builder on the file, one pass on zeros.
CHILD = ("import sys, numpy as np; from benchmarks import peers; "
         "getattr(peers, sys.argv[1])(sys.argv[2], np.zeros(eval(sys.argv[3]), np.float32), 1).run()")
BUILDERS = {"ONNX Runtime": "onnx_runtime", "OpenVINO": "openvino"}
_crashes: dict[tuple, str | None] = {}


def crashes(engine: str, path: str, shape: tuple, timeout: float = 600) -> str | None:
    """Why `engine` cannot run the ONNX file at `path` on inputs of `shape`, where it kills the
    process that tries (a signal, or an exit without a Python error: something a try/except
    cannot catch), or None. The engine loads the file and runs it once in a child process;
    remembered per file and shape."""
    key = (engine, path, tuple(shape))
    if key not in _crashes:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
        try:
            proc = subprocess.run([sys.executable, "-c", CHILD, BUILDERS[engine], path, repr(tuple(shape))],
                                  env=env, capture_output=True, text=True, timeout=timeout)
            code, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired:
            code, err = None, ""
        why = None
        if code is None:
            why = f"did not load and run it within {timeout:.0f} s"
        elif code < 0:
            why = f"crashed loading and running it ({signal.Signals(-code).name})"
        elif code != 0:
            last = (err.strip().splitlines() or ["no message"])[-1]
            why = f"failed loading and running it (exit {code}: {last[:200]})"
        _crashes[key] = None if why is None else f"{engine} skipped on {os.path.basename(path)}: {why}"
    return _crashes[key]


def pytorch(model, x: np.ndarray, threads: int) -> Engine:
    import torch

    torch.set_num_threads(threads)
    xt = torch.from_numpy(x)

    def run():
        with torch.no_grad():
            return model(xt).numpy()

    return Engine("PyTorch", torch.__version__, "float32", run)


def onnx_runtime(path: str, x: np.ndarray, threads: int, optimize: bool = True) -> Engine:
    """optimize=False: the graph run as written, no fusions (for a QDQ model: DequantizeLinear, a
    float32 op, QuantizeLinear, the model's own definition, where the fused int8 kernels may
    differ from it)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                     else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: x}
    return Engine("ONNX Runtime", ort.__version__, "float32", lambda: session.run(None, feed)[0])


def openvino(path: str, x: np.ndarray, threads: int) -> Engine:
    import openvino as ov
    import openvino.properties as props
    import openvino.properties.hint as hints

    core = ov.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", {
        hints.inference_precision: ov.Type.f32,
        hints.performance_mode: hints.PerformanceMode.LATENCY,
        props.inference_num_threads: threads,
    })
    request = compiled.create_infer_request()
    precision = compiled.get_property(hints.inference_precision)  # what it compiled for, read back
    precision = precision.get_type_name() if hasattr(precision, "get_type_name") else str(precision)

    def run():
        request.infer([x])
        return request.get_output_tensor(0).data.copy()

    return Engine("OpenVINO", ov.__version__.split("-")[0], precision, run)


def export(model, shape: tuple, path: str) -> str:
    """The PyTorch module written to `path` as ONNX for inputs of `shape` (TorchScript exporter, opset
    OPSET), its input named x (the exporter's own "input.1" TVM's ONNX frontend renames, with a warning)."""
    import torch

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(model, (torch.zeros(shape),), path, dynamo=False, opset_version=OPSET, input_names=["x"],
                          output_names=["y"])
    return path


class Peers:
    """ONNX exports of one PyTorch module and the engines on them (module docstring)."""

    def __init__(self, model):
        self.model = model
        self.skipped = [why for why in map(missing, NEEDS) if why]
        self._dir = None
        self._exports: dict[tuple, str] = {}

    def export(self, x: np.ndarray) -> str:
        """The module exported to ONNX for inputs of x's shape (once per shape)."""
        if x.shape not in self._exports:
            if self._dir is None:
                self._dir = tempfile.TemporaryDirectory(prefix="mk-peers-")
            path = os.path.join(self._dir.name, f"model_{'x'.join(map(str, x.shape))}.onnx")
            self._exports[x.shape] = export(self.model, x.shape, path)
        return self._exports[x.shape]

    def engines(self, x: np.ndarray, threads: int) -> list[Engine]:
        """ONNX Runtime, OpenVINO (those that can run here) and PyTorch, each on input x."""
        out = []
        if len(self.skipped) < len(NEEDS):
            path = self.export(x)
            if not missing("ONNX Runtime"):
                out.append(onnx_runtime(path, x, threads))
            if not missing("OpenVINO"):
                why = crashes("OpenVINO", path, x.shape)
                if why is None:
                    out.append(openvino(path, x, threads))
                elif why not in self.skipped:
                    self.skipped.append(why)
        return out + [pytorch(self.model, x, threads)]

    def close(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
        self._exports.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
