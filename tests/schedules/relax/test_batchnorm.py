"""schedules.relax.batchnorm: inference batch norm folded at compile time.

PyTorch modules (nn.Conv2d of every grouping, with and without bias, then nn.BatchNorm2d with
random running statistics) imported through torch.export and TVM's frontend must lose every
batch_norm and still match PyTorch; batch norms that follow no conv, or a conv whose output is
read elsewhere too, become a scale and a shift; the ones the pass cannot fold (training mode,
statistics that are not constants, float16, a tuple whose running statistics are read) come
back untouched. Hand-built modules are checked against TVM's own build of the unfolded module.
"""

import logging

import numpy as np
import pytest
import tvm
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

from schedules import relax as mkrelax
from schedules.relax.batchnorm import fold_batch_norm

torch = pytest.importorskip("torch", reason="PyTorch is in the test extra; these tests import PyTorch models")
nn = torch.nn

# Relative to the output's largest magnitude: a handful of float32 reductions of at most a few
# dozen terms, with the folded weights rounded once; observed ~1e-7.
RTOL = 1e-5


def imported(model, x: np.ndarray, keep_params: bool = False) -> tvm.IRModule:
    from tvm.relax.frontend.torch import from_exported_program

    ep = torch.export.export(model.eval(), (torch.from_numpy(x),))
    mod = from_exported_program(ep, keep_params_as_input=keep_params)
    if keep_params:
        # What optimize(mod, params=...) does first, and what fold_batch_norm expects.
        mod, params = relax.frontend.detach_params(mod)
        names = [v.name for v in mod["main"].params[1:]]
        mod = relax.transform.BindParams("main", dict(zip(names, params["main"])))(mod)
    return mod


def torch_out(model, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model.eval()(torch.from_numpy(x)).numpy()


def randomize(model, seed: int, var_low: float = 0.05):
    """Running statistics and affine parameters far from the defaults (which fold to nothing);
    variances as small as var_low so that epsilon matters at the tolerance."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d | nn.BatchNorm1d):
                c = m.num_features
                m.running_mean.copy_(torch.rand(c, generator=gen) * 4 - 2)
                m.running_var.copy_(torch.rand(c, generator=gen) * 2 + var_low)
                if m.affine:
                    m.weight.copy_(torch.rand(c, generator=gen) * 3 - 1.5)
                    m.bias.copy_(torch.rand(c, generator=gen) * 2 - 1)
    return model.eval()


def run_all(mod: tvm.IRModule, x: np.ndarray, target=None) -> list[np.ndarray]:
    """Every output of main (one tensor or a tuple of them)."""
    ex = tvm.compile(mod, target=target or tvm.target.Target("llvm"))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def run(mod: tvm.IRModule, x: np.ndarray, target=None) -> np.ndarray:
    return run_all(mod, x, target)[0]


def close(got, want, rtol=RTOL):
    assert got.shape == want.shape, (got.shape, want.shape)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= rtol, f"max |diff| = {err:.3g} of the largest output"


def calls(mod: tvm.IRModule, name: str) -> list:
    """The calls of Relax operator `name` in main."""
    found = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == name:
            found.append(e)

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


class ConvBN(nn.Module):
    def __init__(self, c, o, k, stride, groups, bias, eps, affine):
        super().__init__()
        self.conv = nn.Conv2d(c, o, k, stride=stride, padding=k // 2, groups=groups, bias=bias)
        self.bn = nn.BatchNorm2d(o, eps=eps, affine=affine)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


@st.composite
def conv_bn_layers(draw):
    kind = draw(st.sampled_from(["dense", "depthwise", "grouped"]))
    if kind == "dense":
        groups, cg, og = 1, draw(st.integers(1, 6)), draw(st.integers(1, 8))
    elif kind == "depthwise":
        groups, cg, og = draw(st.integers(2, 8)), 1, draw(st.integers(1, 2))
    else:
        groups, cg, og = draw(st.integers(2, 3)), draw(st.integers(2, 3)), draw(st.integers(1, 3))
    return {"c": groups * cg, "o": groups * og, "k": draw(st.sampled_from([1, 3])), "stride": draw(st.integers(1, 2)),
            "groups": groups, "bias": draw(st.booleans()), "eps": draw(st.sampled_from([1e-5, 1e-3, 0.1])),
            "affine": draw(st.booleans())}


@settings(max_examples=10, deadline=None)
# A grouped conv that is not depthwise, which the derandomized draws can miss.
@example(layer={"c": 6, "o": 4, "k": 3, "stride": 2, "groups": 2, "bias": True, "eps": 1e-3, "affine": True},
         size=7, keep_params=True, seed=9)
@given(layer=conv_bn_layers(), size=st.integers(4, 8), keep_params=st.booleans(), seed=st.integers(0, 2**16))
def test_a_pytorch_conv_and_batch_norm_fold_into_one_conv(layer, size, keep_params, seed):
    model = randomize(ConvBN(**layer), seed)
    x = np.random.default_rng(seed).standard_normal((1, layer["c"], size, size)).astype(np.float32)
    mod = imported(model, x, keep_params)
    assert len(calls(mod, "relax.nn.batch_norm")) == 1
    report = []
    folded = fold_batch_norm(mod, report=report)
    assert [r["folded_into"] for r in report] == ["conv2d"], report
    # What is left is conv2d -> add(one (1, O, 1, 1) constant) -> relu: the bias's reshape went too.
    assert not calls(folded, "relax.nn.batch_norm") and not calls(folded, "relax.multiply")
    assert not calls(folded, "relax.reshape")
    (conv,), (add,) = calls(folded, "relax.nn.conv2d"), calls(folded, "relax.add")
    assert int(conv.attrs.groups) == layer["groups"] and add.args[1].value.numpy().shape == (1, layer["o"], 1, 1)
    close(run(folded, x), torch_out(model, x))


class TwoBranches(nn.Module):
    """A batch norm at the input, and two after the sum of two convs: none follows a conv, and the
    last reads what the one before it became."""

    def __init__(self):
        super().__init__()
        self.bn_in = nn.BatchNorm2d(3)
        self.a = nn.Conv2d(3, 5, 3, padding=1)
        self.b = nn.Conv2d(3, 5, 1, bias=False)
        self.bn = nn.BatchNorm2d(5)
        self.bn2 = nn.BatchNorm2d(5)

    def forward(self, x):
        x = self.bn_in(x)
        return torch.relu(self.bn2(self.bn(self.a(x) + self.b(x))))


def test_batch_norms_after_no_conv_become_a_scale_and_a_shift():
    model = randomize(TwoBranches(), seed=1)
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 6)).astype(np.float32)
    report = []
    folded = fold_batch_norm(imported(model, x), report=report)
    assert [r["folded_into"] for r in report] == ["scale_shift"] * 3, report
    assert "not a conv2d" in report[0]["reason"] and "add" in report[1]["reason"], report
    assert not calls(folded, "relax.nn.batch_norm") and len(calls(folded, "relax.multiply")) == 3
    scales = [m.args[1].value.numpy() for m in calls(folded, "relax.multiply")]
    assert [s.shape for s in scales] == [(1, 3, 1, 1), (1, 5, 1, 1), (1, 5, 1, 1)]
    bn = model.bn
    np.testing.assert_allclose(scales[1].ravel(), (bn.weight / torch.sqrt(bn.running_var + bn.eps)).detach().numpy(),
                               rtol=1e-6)
    close(run(folded, x), torch_out(model, x))


class SharedConv(nn.Module):
    """The conv's raw output is read by the batch norm and by the final add."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(6)

    def forward(self, x):
        y = self.conv(x)
        return torch.relu(self.bn(y)) + y


def test_a_conv_whose_output_is_read_elsewhere_keeps_its_weights():
    model = randomize(SharedConv(), seed=2)
    x = np.random.default_rng(2).standard_normal((1, 4, 6, 6)).astype(np.float32)
    report = []
    folded = fold_batch_norm(imported(model, x), report=report)
    assert [r["folded_into"] for r in report] == ["scale_shift"] and "other users" in report[0]["reason"], report
    (conv,) = calls(folded, "relax.nn.conv2d")
    np.testing.assert_array_equal(conv.args[1].value.numpy(), model.conv.weight.detach().numpy())
    assert not calls(folded, "relax.nn.batch_norm")
    close(run(folded, x), torch_out(model, x))


def test_a_conv_with_bias_whose_sum_is_read_elsewhere_is_not_folded():
    """conv -> add(bias) -> bn with the biased output also returned: the add has two users."""
    rng = np.random.default_rng(3)
    x = relax.Var("x", relax.TensorType((1, 4, 5, 5), "float32"))
    w = relax.const(rng.standard_normal((6, 4, 3, 3)).astype(np.float32))
    stats = [relax.const(v.astype(np.float32)) for v in (rng.uniform(0.5, 2, 6), rng.standard_normal(6),
                                                          rng.standard_normal(6), rng.uniform(0.1, 1, 6))]
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            b = bb.emit(relax.op.add(c, relax.const(rng.standard_normal((1, 6, 1, 1)).astype(np.float32))))
            n = bb.emit(relax.TupleGetItem(bb.emit(relax.op.nn.batch_norm(b, *stats, axis=1, training=False)), 0))
            out = bb.emit_output(relax.Tuple([n, b]))
        bb.emit_func_output(out)
    mod = bb.get()
    report = []
    folded = fold_batch_norm(mod, report=report)
    assert [r["folded_into"] for r in report] == ["scale_shift"] and "other users" in report[0]["reason"]
    xv = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    got, want = run_all(folded, xv), run_all(mod, xv)
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        close(g, w)


def _hand_built(bias_shape=None, bias_first=False, stats_as_params=False, training=False, dtype="float32",
                read=(0,), axis=1, shape=(1, 4, 6, 6), conv=True, flags=(True, True)):
    """main(x[, gamma, beta, mean, var]) = [conv2d ->] [add(bias)] -> batch_norm -> its [i] for
    each i in `read` (a tuple of them when several)."""
    rng = np.random.default_rng(7)
    c = shape[axis]
    x = relax.Var("x", relax.TensorType(shape, dtype))
    values = [rng.uniform(0.5, 2, c), rng.standard_normal(c), rng.standard_normal(c), rng.uniform(0.05, 1, c)]
    if stats_as_params:
        stats = [relax.Var(n, relax.TensorType((c,), dtype)) for n in ("gamma", "beta", "mean", "var")]
    else:
        stats = [relax.const(v.astype(dtype)) for v in values]
    bb = relax.BlockBuilder()
    with bb.function("main", [x, *stats] if stats_as_params else [x]):
        with bb.dataflow():
            y = x
            if conv:
                w = relax.const(rng.standard_normal((c, c, 3, 3)).astype(dtype))
                y = bb.emit(relax.op.nn.conv2d(y, w, padding=1))
            if bias_shape is not None:
                b = relax.const(rng.standard_normal(bias_shape).astype(dtype))
                y = bb.emit(relax.op.add(b, y) if bias_first else relax.op.add(y, b))
            center, scale = flags
            t = bb.emit(relax.op.nn.batch_norm(y, *stats, axis=axis, epsilon=1e-3, center=center, scale=scale,
                                               training=training))
            outs = [bb.emit(relax.TupleGetItem(t, i)) for i in read]
            out = bb.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get(), rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("bias_shape, bias_first, into", [
    (None, False, "conv2d"),
    ((1, 4, 1, 1), False, "conv2d"),
    ((4, 1, 1), True, "conv2d"),
    ((1,), False, "conv2d"),  # one value for every channel is per channel too
    ((4,), False, "scale_shift"),  # broadcasts along the width (4 here, as many as the channels): not a bias
    ((1, 4, 5, 4), True, "scale_shift"),  # a whole tensor: not a bias either
])
def test_hand_built_conv_biases(bias_shape, bias_first, into):
    mod, x = _hand_built(bias_shape, bias_first, shape=(1, 4, 5, 4))
    report = []
    folded = fold_batch_norm(mod, report=report)
    assert [r["folded_into"] for r in report] == [into], report
    assert not calls(folded, "relax.nn.batch_norm")
    assert len(calls(folded, "relax.add")) == (1 if into == "conv2d" else 2)
    close(run(folded, x), run(mod, x))


@pytest.mark.parametrize("conv", [True, False])
@pytest.mark.parametrize("center, scale", [(False, True), (True, False), (False, False)])
def test_center_and_scale_off_drop_beta_and_gamma(conv, center, scale):
    """PyTorch's affine=False imports as center=scale=False with gamma 1 and beta 0, so only a
    hand-built module with other values tells whether the flags are honoured."""
    mod, x = _hand_built((1, 4, 1, 1), conv=conv, flags=(center, scale))
    report = []
    folded = fold_batch_norm(mod, report=report)
    assert [r["folded_into"] for r in report] == ["conv2d" if conv else "scale_shift"], report
    close(run(folded, x), run(mod, x))


def test_a_batch_norm_on_another_axis_and_rank_scales_along_that_axis():
    """BatchNorm1d's (N, C, L), and channels last on a 4-D tensor (axis 3)."""
    for shape, axis in (((2, 5, 7), 1), ((1, 3, 4, 6), 3)):
        mod, x = _hand_built(shape=shape, axis=axis, conv=False)
        report = []
        folded = fold_batch_norm(mod, report=report)
        assert [r["folded_into"] for r in report] == ["scale_shift"], report
        expect = [1] * len(shape)
        expect[axis] = shape[axis]
        assert calls(folded, "relax.multiply")[0].args[1].value.numpy().shape == tuple(expect)
        close(run(folded, x), run(mod, x))


def test_every_reader_of_the_output_sees_the_folded_value():
    mod, x = _hand_built((1, 4, 1, 1), read=(0, 0))
    report = []
    folded = fold_batch_norm(mod, report=report)
    assert [r["folded_into"] for r in report] == ["conv2d"] and not calls(folded, "relax.nn.batch_norm")
    got, want = run_all(folded, x), run_all(mod, x)
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        close(g, w)


@pytest.mark.parametrize("options, reason", [
    ({"stats_as_params": True}, "gamma/beta/mean/variance not constants"),
    ({"training": True}, "training=True"),
    ({"dtype": "float16"}, "dtype float16"),
    ({"read": (0, 1)}, "([1]/[2]) are used"),
    ({"read": (2,)}, "([1]/[2]) are used"),
])
def test_what_cannot_be_folded_is_left_untouched_and_logged(options, reason, caplog):
    mod, _ = _hand_built((1, 4, 1, 1), **options)
    report = []
    with caplog.at_level(logging.INFO, logger="tvm_microkernels.relax"):
        folded = fold_batch_norm(mod, report=report)
    assert [r["folded_into"] for r in report] == [None] and reason in report[0]["reason"], report
    assert reason in caplog.text
    tvm.ir.assert_structural_equal(folded, mod)


def test_a_training_mode_export_is_left_as_it_is():
    """torch.export of a model in train mode: batch statistics, and [1] read."""
    model = randomize(ConvBN(3, 4, 3, 1, 1, False, 1e-5, True), seed=4).train()
    x = np.random.default_rng(4).standard_normal((2, 3, 5, 5)).astype(np.float32)
    ep = torch.export.export(model, (torch.from_numpy(x),))
    from tvm.relax.frontend.torch import from_exported_program

    mod = from_exported_program(ep, keep_params_as_input=False)
    report = []
    folded = fold_batch_norm(mod, report=report)
    assert [r["folded_into"] for r in report] == [None] and "training=True" in report[0]["reason"]
    tvm.ir.assert_structural_equal(folded, mod)


class MobileBlock(nn.Module):
    """A stem (3 channels, stride 2, bias), a depthwise and a pointwise layer, each conv +
    BatchNorm2d + ReLU6, as torchvision's MobileNetV2 writes them."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=True), nn.BatchNorm2d(16), nn.ReLU6(),
            nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), nn.BatchNorm2d(16), nn.ReLU6(),
            nn.Conv2d(16, 32, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6())

    def forward(self, x):
        return self.layers(x)


def test_a_folded_pytorch_model_runs_every_conv_on_our_kernels_with_the_clip_fused():
    model = randomize(MobileBlock(), seed=5)
    x = np.random.default_rng(5).standard_normal((1, 3, 18, 18)).astype(np.float32)
    report = []
    opt = mkrelax.optimize(imported(model, x), "native", report=report, lower=False)
    folds = [r for r in report if r["op"] == "batch_norm"]  # optimize folds them itself
    assert [(f["runs_on"], f["reason"]) for f in folds] == [("folded", "into the conv's weights and bias")] * 3, folds
    convs = [r for r in report if r["op"] == "conv2d"]
    assert [r["runs_on"] for r in convs] == ["ours"] * 3, report
    assert [r["post_ops"] for r in convs] == ["bias+clip"] * 3, report
    for op in ("nn.batch_norm", "nn.conv2d", "add", "multiply", "clip", "maximum", "minimum"):
        assert not calls(opt, f"relax.{op}"), op
    close(run(opt, x, mkrelax.llvm_target("native")), torch_out(model, x))
