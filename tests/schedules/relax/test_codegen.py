"""schedules.relax.codegen: the optimized model's PrimFuncs built on every core.

The executable must compute what `tvm.compile`'s does, from functions built in forked
children (each chunk an object file); exported (what the compile cache stores), it must load
and compute the same in a new process; with one job it is `tvm.compile`'s own.
"""

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is in the test extra; the model is a small torch module")
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

from schedules.relax import codegen, pipeline  # noqa: E402

nn = torch.nn


def _model():
    from tvm.relax.frontend.torch import from_exported_program

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 16, 1),
                      nn.Sigmoid(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).eval()
    x = torch.randn(1, 16, 12, 12)
    with torch.no_grad():
        ep = torch.export.export(m, (x,)).run_decompositions()
        want = m(x).numpy()
    mod = from_exported_program(ep, keep_params_as_input=False, run_ep_decomposition=False)
    return pipeline.optimize(mod, "native"), x.numpy(), want


def _run(ex, x):
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    return (out[0] if not hasattr(out, "numpy") else out).numpy()


def test_functions_built_in_children_compute_what_tvm_compile_does(monkeypatch):
    monkeypatch.setenv("TVM_MICROKERNELS_JOBS", "2")
    mod, x, want = _model()
    target = pipeline.llvm_target("native")
    ex = codegen.compile_model(mod, target)
    assert isinstance(ex, codegen.Executable)
    assert len(ex._objects) > 1  # cut into chunks, the children's among them
    np.testing.assert_allclose(_run(ex, x), _run(tvm.compile(mod, target=target), x), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(_run(ex, x), want, rtol=1e-4, atol=1e-5)


def test_the_exported_executable_loads_in_a_new_process(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_MICROKERNELS_JOBS", "2")
    mod, x, want = _model()
    ex = codegen.compile_model(mod, pipeline.llvm_target("native"))
    ex.export_library(str(tmp_path / "m.so"))
    np.save(tmp_path / "x.npy", x)
    script = (
        "import sys, numpy as np, tvm\nfrom tvm import relax\n"
        "lib = tvm.runtime.load_module(sys.argv[1])\n"
        "out = relax.VirtualMachine(lib, tvm.cpu())['main'](tvm.runtime.tensor(np.load(sys.argv[2])))\n"
        "out = out[0] if not hasattr(out, 'numpy') else out\n"
        "np.save(sys.argv[3], out.numpy())\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "m.so"), str(tmp_path / "x.npy"),
                           str(tmp_path / "y.npy")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-4, atol=1e-5)


def test_one_job_is_tvm_compile_itself(monkeypatch):
    monkeypatch.setenv("TVM_MICROKERNELS_JOBS", "1")
    mod, x, want = _model()
    ex = codegen.compile_model(mod, pipeline.llvm_target("native"))
    assert not isinstance(ex, codegen.Executable)
    np.testing.assert_allclose(_run(ex, x), want, rtol=1e-4, atol=1e-5)
