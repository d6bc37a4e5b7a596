"""Whole networks as PyTorch users write them (models.torch_style: BatchNorm2d after each conv,
ReLU modules, max pool, adaptive pool + flatten + Linear), imported with TVM's torch frontend
and optimized: nothing may be left on TVM's default lowering. Each network's full
architecture runs at 64x64 (every layer and op of the 224x224 one, on smaller maps), checked
against PyTorch; the report says where every op runs, and the module is checked too.
"""

import numpy as np
import pytest
import tvm
from tvm import relax

from models import torch_style
from schedules import relax as mkrelax

from .test_batchnorm import imported
from .test_conv2d import HOST, close, op_calls

torch = pytest.importorskip("torch", reason="PyTorch is in the test extra; the networks are PyTorch modules")

IMAGE = 64


def unscheduled(mod: tvm.IRModule) -> list[str]:
    """PrimFuncs neither ours (mk_*: our convs and the ops schedule_rest scheduled) nor reshapes
    that tvm.compile turns into views."""
    return [gv.name_hint for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
            and not gv.name_hint.startswith("mk_") and not relax.analysis.has_reshape_pattern(f)]


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2", "resnext50_32x4d", "mobilenet_v1", "regnetx_like",
                                  "resnet18"])
def test_nothing_is_left_to_tvms_default_lowering(name):
    model = torch_style.build(name, seed=1)
    x = np.random.default_rng(2).standard_normal((1, 3, IMAGE, IMAGE)).astype(np.float32)
    report = []
    opt = mkrelax.optimize(imported(model, x), HOST, report=report)
    by_op = {}
    for r in report:
        by_op.setdefault(r["op"] if r["op"] in ("conv2d", "batch_norm") else "other", []).append(r)
    convs = sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    norms = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert len(by_op["conv2d"]) == convs and all(r["runs_on"] == "ours" for r in by_op["conv2d"]), by_op["conv2d"]
    assert len(by_op["batch_norm"]) == norms
    assert all(r["reason"] == "into the conv's weights and bias" for r in by_op["batch_norm"]), by_op["batch_norm"]
    assert all(r["runs_on"] in ("ours", "view") for r in by_op["other"]), by_op["other"]
    assert unscheduled(opt) == []
    assert {c.op.name for c in op_calls(opt["main"])} <= {"relax.call_tir"}
    ex = tvm.compile(opt, target=mkrelax.llvm_target(HOST))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))[0].numpy()
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    close(got, want)
