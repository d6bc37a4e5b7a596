"""schedules.relax.functional: an exported program imported without run_decompositions().

Each op of OPS, exported from a small module, rewritten by `functionalize` and imported as it
is, must compute what eager PyTorch does (built with TVM's own lowering: this checks the import,
not our kernels); the in-place ops it makes functional must be only those whose old value
nothing reads afterwards, and anything else must send the caller to run_decompositions().
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is in the test extra; the backend compiles PyTorch graphs")
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

from schedules.relax import functional  # noqa: E402

nn, F, aten = torch.nn, torch.nn.functional, torch.ops.aten


def _bn(c):
    bn = nn.BatchNorm2d(c)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        bn.running_mean.copy_(torch.rand(c, generator=gen) - 0.5)
        bn.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
        bn.weight.copy_(torch.rand(c, generator=gen) + 0.5)
        bn.bias.copy_(torch.rand(c, generator=gen) - 0.5)
    return bn


class Lambda(nn.Module):
    def __init__(self, f, **mods):
        super().__init__()
        self.f = f
        for k, m in mods.items():
            setattr(self, k, m)

    def forward(self, x):
        return self.f(self, x)


# One module per op of OPS (the in-place forms through their functional ones), input 1x8x6x6.
CASES = {
    "adaptive_avg_pool2d": Lambda(lambda s, x: F.adaptive_avg_pool2d(x, 1)),
    "add": Lambda(lambda s, x: x + x * 2),
    "add_": Lambda(lambda s, x: s.c(x).add_(x), c=nn.Conv2d(8, 8, 1)),
    "avg_pool2d": Lambda(lambda s, x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)),
    "batch_norm": Lambda(lambda s, x: s.bn(x), bn=_bn(8)),
    "cat": Lambda(lambda s, x: torch.cat([x, x * 3], 1)),
    "chunk": Lambda(lambda s, x: (lambda a, b: a * b)(*x.chunk(2, 1))),
    "contiguous": Lambda(lambda s, x: x.permute(0, 2, 3, 1).contiguous() * 2),
    "conv2d": Lambda(lambda s, x: s.c(x), c=nn.Conv2d(8, 8, 3, padding=1, groups=2)),
    "dropout": Lambda(lambda s, x: F.dropout(x, 0.3, training=False)),
    "dropout_": Lambda(lambda s, x: F.dropout(x * 2, 0.3, training=False, inplace=True)),
    "flatten": Lambda(lambda s, x: torch.flatten(x, 1)),
    "gelu": Lambda(lambda s, x: F.gelu(x)),
    "hardsigmoid": Lambda(lambda s, x: F.hardsigmoid(x)),
    "hardswish_": Lambda(lambda s, x: F.hardswish(x * 3, inplace=True)),
    "hardtanh_": Lambda(lambda s, x: s.act(x * 5), act=nn.ReLU6(inplace=True)),
    "relu6_": Lambda(lambda s, x: F.relu6(x * 5, inplace=True)),
    "layer_norm": Lambda(lambda s, x: s.ln(x.permute(0, 2, 3, 1)), ln=nn.LayerNorm(8)),
    "linear": Lambda(lambda s, x: s.fc(x.flatten(1)), fc=nn.Linear(288, 10)),
    "max_pool2d": Lambda(lambda s, x: F.max_pool2d(x, 3, 2, 1)),
    "mean": Lambda(lambda s, x: x.mean((2, 3), keepdim=True)),
    "mul": Lambda(lambda s, x: x * x),
    "permute": Lambda(lambda s, x: x.permute(0, 3, 1, 2) + 1),
    "relu_": Lambda(lambda s, x: F.relu(x * 2, inplace=True)),
    "sigmoid": Lambda(lambda s, x: torch.sigmoid(x)),
    "silu_": Lambda(lambda s, x: F.silu(x * 2, inplace=True)),
    "transpose": Lambda(lambda s, x: x.transpose(1, 2) * 2),
    "view": Lambda(lambda s, x: x.view(1, 8, 36) * 2),
    # The same ops with the arguments the defaults above leave out.
    # (divisor_override is left out: TVM 0.27's converter ignores it, decomposed or not)
    "avg_pool2d ceil": Lambda(lambda s, x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=True)),
    "chunk uneven": Lambda(lambda s, x: (lambda a, b, c: torch.cat([a * b, c], 1))(*x.chunk(3, 1))),
    "conv2d dilated, no bias": Lambda(lambda s, x: s.c(x), c=nn.Conv2d(8, 4, 3, stride=2, padding=2, dilation=2,
                                                                    bias=False)),
    "flatten middle": Lambda(lambda s, x: torch.flatten(x, 1, 2) * 2),
    "gelu tanh": Lambda(lambda s, x: F.gelu(x, approximate="tanh")),
    "hardtanh bounds": Lambda(lambda s, x: F.hardtanh(x * 3, -0.5, 2.0, inplace=True)),
    "linear no bias": Lambda(lambda s, x: s.fc(x), fc=nn.Linear(6, 5, bias=False)),
    "max_pool2d ceil, dilated": Lambda(lambda s, x: F.max_pool2d(x, 2, 2, 0, dilation=2, ceil_mode=True)),
    "mean no keepdim": Lambda(lambda s, x: x.mean((1, 3))),
    "transpose negative": Lambda(lambda s, x: x.transpose(-1, -3) + 1),
}


def _export(model, x):
    with torch.no_grad():
        return torch.export.export(model.eval(), (x,))


def _run(mod, x):
    from tvm.relax.frontend.torch import from_exported_program  # noqa: F401 (imported with the frontend)

    ex = tvm.compile(mod, target=tvm.target.Target("llvm"))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    return out[0].numpy() if not hasattr(out, "numpy") else out.numpy()


def _ops(ep) -> set:
    return {n.target for n in ep.graph.nodes if n.op == "call_function"}


def test_every_op_taken_undecomposed_has_a_case():
    made = set()
    x = torch.randn(1, 8, 6, 6)
    for model in CASES.values():
        ep = _export(model, x)
        functional.functionalize(ep)
        made |= _ops(ep)
    assert functional.OPS <= made, f"OPS without a case here: {sorted(map(str, functional.OPS - made))}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_op_imported_undecomposed_matches_eager(name):
    from tvm.relax.frontend.torch import from_exported_program

    model, x = CASES[name].eval(), torch.randn(1, 8, 6, 6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x.clone()).numpy()
    ep = _export(model, x)
    assert functional.functionalize(ep), f"{name}: not taken undecomposed ({sorted(map(str, _ops(ep)))})"
    assert not any(getattr(t, "_schema", None) is not None and t._schema.is_mutable for t in _ops(ep))
    got = _run(from_exported_program(ep, keep_params_as_input=False, run_ep_decomposition=False), x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_tensor_read_after_its_update_reads_the_update():
    """Export's trace rebinds h to relu_'s output, so the functional form is exact."""
    from tvm.relax.frontend.torch import from_exported_program

    class Reads(nn.Module):
        def forward(self, x):
            h = x * 2
            y = h.relu_()
            return y + h

    x = torch.randn(1, 8, 6, 6, generator=torch.Generator().manual_seed(2))
    ep = _export(Reads(), x)
    assert functional.functionalize(ep)
    got = _run(from_exported_program(ep, keep_params_as_input=False, run_ep_decomposition=False), x)
    np.testing.assert_allclose(got, (2 * x).relu().numpy() * 2, rtol=1e-6)


def test_an_update_through_a_view_is_not_made_functional():
    class Viewed(nn.Module):  # v aliases h: relu_ on h is seen through v
        def forward(self, x):
            h = x * 2
            v = h.view(4)
            h.relu_()
            return v * 1

    ep = _export(Viewed(), torch.randn(1, 4))
    assert not functional.functionalize(ep)


def test_an_update_of_an_input_is_not_made_functional():
    class Updates(nn.Module):
        def forward(self, x):
            return x.relu_() * 2

    ep = _export(Updates(), torch.randn(1, 4))
    assert not functional.functionalize(ep)


def test_an_op_outside_ops_sends_the_graph_to_the_decomposition():
    ep = _export(Lambda(lambda s, x: torch.cumsum(x, 1)), torch.randn(1, 4))
    assert not functional.functionalize(ep)


def test_an_op_the_importer_takes_only_decomposed_falls_back_to_the_decomposition():
    """layer_norm without weight and bias: TVM's undecomposed converter fails on it, so the
    backend's import returns None and it decomposes (and the compiled model is still right)."""
    from schedules.relax import torch_compile

    model = Lambda(lambda s, x: F.layer_norm(x, (6, 6), eps=1e-3))
    x = torch.randn(1, 8, 6, 6)
    ep = _export(model, x)
    assert functional.functionalize(ep) and torch_compile.imported(ep) is None
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model.eval(), backend="microkernels")(x)
    np.testing.assert_allclose(got.numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)


def test_a_training_batch_norm_is_left_as_it_is():
    bn = _bn(8).train()
    with torch.no_grad():
        ep = torch.export.export(bn, (torch.randn(2, 8, 3, 3),))
    assert not functional.functionalize(ep)


def test_a_graph_tvm_would_import_wrongly_runs_eagerly():
    """avg_pool2d's divisor_override: TVM 0.27's converter ignores it (1.28 off here, decomposed
    or not), so the backend leaves the graph to PyTorch and says why."""
    from schedules.relax import torch_compile

    model = Lambda(lambda s, x: F.avg_pool2d(s.c(x), 3, 2, 1, divisor_override=4), c=nn.Conv2d(8, 16, 3))
    x = torch.randn(1, 8, 9, 9)
    assert functional.wrongly_imported(_export(model, x))
    torch._dynamo.reset()
    torch_compile.clear_reports()
    with torch.no_grad():
        got = torch.compile(model.eval(), backend="microkernels")(x)
        want = model(x)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    (rep,) = torch_compile.reports()
    assert rep["runs_on"] == "eager" and "divisor_override" in rep["reason"], rep
    assert functional.wrongly_imported(_export(CASES["avg_pool2d"], torch.randn(1, 8, 6, 6))) is None
