"""schedules.relax.torch_compile: `torch.compile(model, backend="microkernels")`.

Small models as PyTorch users write them (BatchNorm2d after convs, residual adds, grouped and
depthwise convs, F.conv2d with padding="same", adaptive pool + flatten + Linear) must match eager
PyTorch within float32 tolerance with their convs on our kernels and their batch norms folded
into frozen weights; the backend is found by name through its entry point; graphs (or calls)
it cannot take run eagerly and stay right; a shape change compiles again; options reach
optimize and a wrong name is refused; tensors cross DLPack without copies where aligned.
"""

import copy
import logging
import subprocess
import sys

import numpy as np
import pytest

from schedules.relax import torch_compile as tc

from .test_conv2d import HOST, close

torch = pytest.importorskip("torch", reason="PyTorch is in the test extra; the backend compiles PyTorch graphs")
nn = torch.nn
F = torch.nn.functional

IMAGE = 16


@pytest.fixture(autouse=True)
def fresh():
    """Each test compiles its own graphs and reads only its own reports."""
    torch._dynamo.reset()
    tc.clear_reports()
    yield
    torch._dynamo.reset()


def randomized(model, seed=0):
    """Batch-norm statistics and affine parameters far from their defaults (which fold to
    nothing), in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.running_mean.copy_(torch.rand(c, generator=gen) - 0.5)
                m.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(c, generator=gen) + 0.5)
                m.bias.copy_(torch.rand(c, generator=gen) - 0.5)
    return model.eval()


def image(c=16, hw=IMAGE, batch=1, seed=1):
    return torch.randn(batch, c, hw, hw, generator=torch.Generator().manual_seed(seed))


def eager(model, *args):
    with torch.no_grad():
        return model(*args)


def compiled(model, **kwargs):
    return torch.compile(model, backend="microkernels", **kwargs)


def assert_close(got, want):
    close(got.detach().numpy(), want.detach().numpy())


def conv_bn(cin, cout, k=3, stride=1, groups=1):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU())


class Residual(nn.Module):
    def __init__(self, c=16, groups=1):
        super().__init__()
        self.a = conv_bn(c, c, groups=groups)
        self.conv = nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(self.a(x))) + x)


class SameHead(nn.Module):
    """F.conv2d with padding="same" on a parameter, then the classifier head of torch_style
    (with a dropout, which eval mode turns off)."""

    def __init__(self, cin=3, c=16, classes=10):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(c, cin, 3, 3) / 5)
        self.bias = nn.Parameter(torch.randn(c) / 10)
        self.bn = nn.BatchNorm2d(c)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        x = torch.relu(self.bn(F.conv2d(x, self.weight, self.bias, padding="same")))
        x = F.adaptive_avg_pool2d(x, 1)
        return self.fc(self.drop(torch.flatten(x, 1)))


MODELS = {
    "conv-bn-relu": (lambda: conv_bn(16, 32), 16),
    "residual": (lambda: Residual(16), 16),
    "grouped": (lambda: nn.Sequential(conv_bn(32, 32, groups=2), conv_bn(32, 32, groups=8)), 32),
    "depthwise": (lambda: nn.Sequential(conv_bn(16, 16, groups=16), conv_bn(16, 32, 1)), 16),
    "same-padding-head": (lambda: SameHead(3), 3),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_user_style_models_match_eager_with_their_convs_on_our_kernels(name):
    build, cin = MODELS[name]
    model = randomized(build())
    x = image(cin)
    with torch.no_grad():
        got = compiled(model)(x)
    assert_close(got, eager(model, x))
    (rep,) = tc.reports()
    assert rep["runs_on"] == "microkernels", rep
    convs = [r for r in rep["ops"] if r["op"] == "conv2d"]
    norms = [r for r in rep["ops"] if r["op"] == "batch_norm"]
    assert convs and all(r["runs_on"] == "ours" for r in convs), convs
    assert len(norms) == sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert all(r["runs_on"] == "folded" for r in norms), norms
    # Every parameter and buffer was frozen; only the image stays an input.
    assert rep["frozen"] == len(list(model.parameters())) + len(list(model.buffers())) - \
        sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())  # num_batches_tracked: not read in eval
    assert rep["inputs"] == [tuple(x.shape)]


def test_eval_mode_without_no_grad_runs_ours_and_outputs_carry_no_grad():
    model = randomized(Residual())
    x = image()
    got = compiled(model)(x)  # grad mode on, parameters require grad: weights frozen all the same
    assert tc.last_report()["runs_on"] == "microkernels"
    assert not got.requires_grad
    assert_close(got, eager(model, x))


def test_the_backend_is_found_by_name_without_importing_it(tmp_path):
    code = (
        "import sys, torch\n"
        "assert 'schedules' not in sys.modules\n"
        "assert 'microkernels' in torch._dynamo.list_backends()\n"
        "m = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU()).eval()\n"
        "x = torch.randn(1, 16, 8, 8)\n"
        "with torch.no_grad():\n"
        "    y = torch.compile(m, backend='microkernels')(x)\n"
        "    assert torch.allclose(y, m(x), atol=1e-5), (y - m(x)).abs().max()\n"
        "from schedules.relax import torch_compile\n"
        "assert torch_compile.last_report()['runs_on'] == 'microkernels', torch_compile.last_report()\n"
        "print('ok')\n"
    )
    # From an empty directory: the installed package's entry point, not this checkout, finds it.
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


class Broken(nn.Module):
    """Two graphs around a graph break; the second has an op TVM's torch frontend lacks."""

    def __init__(self):
        super().__init__()
        self.a = conv_bn(16, 16)
        self.b = conv_bn(16, 16)

    def forward(self, x):
        x = self.a(x)
        torch._dynamo.graph_break()
        return torch.special.erfinv(torch.tanh(self.b(x)) * 0.5)


def test_a_graph_break_and_an_unsupported_op_run_eagerly_and_stay_right(caplog):
    model = randomized(Broken())
    x = image()
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="tvm_microkernels.torch"):
        f = compiled(model)
        got = f(x)
        again = f(x)
    assert_close(got, eager(model, x))
    assert torch.equal(got, again)
    first, second = tc.reports()
    assert first["runs_on"] == "microkernels", first
    assert second["runs_on"] == "eager" and "erfinv" in second["reason"], second
    # Logged once, with the reason, though the graph ran twice.
    eager_lines = [r.getMessage() for r in caplog.records if "runs eagerly" in r.getMessage()]
    assert len(eager_lines) == 1 and "erfinv" in eager_lines[0], eager_lines


def test_a_float64_model_runs_eagerly():
    model = randomized(conv_bn(16, 16)).double()
    x = image().double()
    got = compiled(model)(x)
    assert got.dtype == torch.float64
    assert torch.allclose(got, eager(model, x))
    rep = tc.last_report()  # refused before anything was exported
    assert rep["runs_on"] == "eager" and rep["reason"] == "torch.float64 input (our kernels are float32)", rep


def test_training_mode_and_inputs_that_require_grad_run_eagerly(caplog):
    model = randomized(Residual())
    x = image()
    # An input that requires grad: autograd needs the eager graph, and gets it.
    x_grad = x.clone().requires_grad_()
    f = compiled(model)
    y = f(x_grad)
    assert y.requires_grad
    y.sum().backward()
    assert x_grad.grad is not None
    assert_close(y, eager(model, x))
    # Training mode: batch statistics (and running-stat updates) are eager PyTorch's.
    torch._dynamo.reset()
    tc.clear_reports()
    model.train()
    want_model = copy.deepcopy(model)
    got = compiled(model)(x)
    assert_close(got, want_model(x))
    assert torch.allclose(model.bn.running_mean, want_model.bn.running_mean)
    (rep,) = tc.reports()
    assert rep["runs_on"] == "eager" and rep["reason"] == "batch_norm in training mode", rep
    assert "batch_norm in training mode" in caplog.text


class Counting(nn.Module):
    """Updates a buffer (or its input) in place, which the compiled module would not do."""

    def __init__(self, on_input: bool):
        super().__init__()
        self.on_input = on_input
        self.block = conv_bn(16, 16)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        if self.on_input:
            x.mul_(2)
        else:
            self.calls.add_(1)
        return self.block(x)


@pytest.mark.parametrize("on_input", [False, True])
def test_graphs_that_update_an_input_or_a_buffer_in_place_run_eagerly(on_input):
    model = randomized(Counting(on_input))
    x = image()
    f = compiled(model)
    with torch.no_grad():
        for _ in range(2):
            given = x.clone()
            assert_close(f(given), eager(model, x.clone()))
            assert torch.equal(given, x * 2 if on_input else x)
    assert model.calls.item() == (0 if on_input else 4)  # two compiled calls, two eager references
    assert tc.last_report()["runs_on"] == "eager" and "in place" in tc.last_report()["reason"]


def test_outputs_computed_from_weights_alone_are_fresh_tensors():
    """Such an output is a constant of the compiled module: each call hands out a copy, so
    writing to one changes neither the next nor the model."""
    model = randomized(conv_bn(16, 16))

    def with_weights(x):
        return model(x), model[0].weight.flatten() * 2

    f = compiled(with_weights)
    x = image()
    with torch.no_grad():
        y1, w1 = f(x)
        w1.zero_()
        y2, w2 = f(x)
    assert tc.last_report()["runs_on"] == "microkernels"
    assert torch.equal(w2, model[0].weight.flatten() * 2) and torch.equal(y1, y2)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_inference_mode_runs_ours_too(mode):
    model = randomized(Residual())
    x = image()
    with getattr(torch, mode)():
        got = compiled(model)(x)
    assert tc.last_report()["runs_on"] == "microkernels"
    assert_close(got, eager(model, x))


def test_a_shape_change_compiles_again_and_each_shape_is_right():
    model = randomized(Residual())
    f = compiled(model)
    with torch.no_grad():
        # 16: a static graph; 24: dynamo recompiles with symbolic H and W (automatic dynamic),
        # which we compile for 24, then 32; 24 again is that graph's compiled module.
        for hw in (16, 24, 32, 24):
            x = image(hw=hw, seed=hw)
            assert_close(f(x), eager(model, x))
    shapes = [r["inputs"] for r in tc.reports()]
    assert shapes == [[(1, 16, 16, 16)], [(1, 16, 24, 24)], [(1, 16, 32, 32)]], shapes
    assert all(r["runs_on"] == "microkernels" for r in tc.reports())


def test_dynamic_true_compiles_for_each_concrete_shape():
    model = randomized(SameHead(3))
    f = compiled(model, dynamic=True)
    with torch.no_grad():
        for hw in (16, 20, 16):
            x = image(3, hw=hw, seed=hw)
            assert_close(f(x), eager(model, x))
    assert [r["inputs"] for r in tc.reports()] == [[(1, 3, 16, 16)], [(1, 3, 20, 20)]]
    assert all(r["runs_on"] == "microkernels" for r in tc.reports())


def test_options_reach_optimize_and_size_the_run(monkeypatch):
    seen, pools = [], []
    real = tc.build
    monkeypatch.setattr(tc.graph, "build", lambda mod, target, **kw: seen.append((target, kw)) or real(mod, target,
                                                                                                     **kw))
    monkeypatch.setattr(tc.graph, "set_threads", lambda n: pools.append(n))
    model = randomized(Residual())
    x = image()
    with torch.no_grad():
        got = compiled(model, options={"threads": 1, "algorithm": "direct", "target": HOST})(x)
    assert_close(got, eager(model, x))
    ((target, kw),) = seen
    assert target == HOST and kw["threads"] == 1 and kw["algorithm"] == "direct"
    assert pools == [1]
    convs = [r for r in tc.last_report()["ops"] if r["op"] == "conv2d"]
    assert convs and all(r["algorithm"] == "direct" for r in convs)


@pytest.mark.parametrize("options, error, match", [
    ({"thread": 2}, ValueError, r"unknown option\(s\) \['thread'\].*accepted: algorithm, autotune, target, threads"),
    ({"autotune": "yes"}, TypeError, "autotune must be True or False"),
    ({"threads": 0}, ValueError, "threads must be >= 1"),
    ({"algorithm": "winograd"}, ValueError, "algorithm must be 'auto' or 'direct'"),
    ("threads=2", TypeError, "options must be a dict"),
])
def test_wrong_options_are_refused_not_fallen_back_on(options, error, match):
    with pytest.raises(error, match=match):
        tc.checked_options(options)
    with pytest.raises(Exception, match=match), torch.no_grad():  # dynamo wraps it: BackendCompilerFailed
        compiled(conv_bn(16, 16).eval(), options=options)(image())


def test_inputs_and_outputs_cross_without_copies_where_aligned():
    model = randomized(conv_bn(16, 16))

    def both(x):
        return model(x), x.flatten(1)

    f = compiled(both)
    x = image()
    assert x.data_ptr() % tc.ALIGN == 0
    with torch.no_grad():
        y, flat = f(x)
    assert_close(y, eager(model, x))
    # TVM's reshape is a view of its input, the input a view of x: no copy either way.
    assert flat.data_ptr() == x.data_ptr() and torch.equal(flat, x.flatten(1))
    # Misaligned (a slice one float in) and non-contiguous inputs are copied, and still right.
    base = torch.randn(x.numel() + 1)
    shifted = base[1:].view(x.shape)
    assert shifted.data_ptr() % tc.ALIGN
    strided = image(seed=5).transpose(2, 3)
    with torch.no_grad():
        for z in (shifted, strided):
            y, flat = f(z)
            assert_close(y, eager(model, z))
            assert flat.data_ptr() != z.data_ptr() and torch.equal(flat, z.flatten(1))


def test_a_misaligned_input_is_copied_without_torchs_thread_pool(monkeypatch):
    """The copy runs on the calling thread (numpy), not torch's copy_, whose OpenMP worker would
    go on spinning on a core while TVM's pool runs the model (twice the time at 2 threads on the
    Zen 3); a dtype numpy lacks falls back to copy_."""
    x = torch.randn(3 * 5 * 7 + 1)[1:].view(3, 5, 7).transpose(1, 2)  # misaligned and strided
    real = torch.Tensor.copy_

    def refused(self, *a, **k):
        raise AssertionError("torch's copy_ used for a float32 input")

    monkeypatch.setattr(torch.Tensor, "copy_", refused)
    out = tc.aligned_copy(x)
    assert out.data_ptr() % tc.ALIGN == 0 and out.is_contiguous() and torch.equal(out, x)
    monkeypatch.setattr(torch.Tensor, "copy_", real)
    half = x.to(torch.bfloat16)
    out = tc.aligned_copy(half)
    assert out.dtype == torch.bfloat16 and out.data_ptr() % tc.ALIGN == 0 and torch.equal(out, half)


def test_a_single_tensor_output_is_the_vms_own_memory():
    """backend() on a traced module (weights as get_attr, output a bare tensor, not a tuple)."""
    model = randomized(Residual())
    gm = torch.fx.symbolic_trace(model)
    x = image()
    fn = tc.backend(gm, [x])
    assert isinstance(fn, tc.Graph)
    (compiled_module,) = fn.compiled.values()
    vm_ptrs, main = [], compiled_module.main

    def spy(*args):
        out = main(*args)
        vm_ptrs.extend(o.data_ptr() for o in out)
        return out

    compiled_module.main = spy
    with torch.no_grad():
        got = fn(x)
    assert isinstance(got, torch.Tensor)
    assert got.data_ptr() == vm_ptrs[0]
    assert_close(got, eager(model, x))


def test_output_structure_is_the_models():
    model = randomized(conv_bn(16, 16))

    def structured(x):
        y = model(x)
        return {"y": y, "pair": [y.mean(), (x, y + 1)]}

    x = image()
    with torch.no_grad():
        got = compiled(structured)(x)
        want = structured(x)
    assert set(got) == {"y", "pair"} and isinstance(got["pair"], list) and isinstance(got["pair"][1], tuple)
    assert got["pair"][1][0] is x
    for g, w in ((got["y"], want["y"]), (got["pair"][0], want["pair"][0]), (got["pair"][1][1], want["pair"][1][1])):
        assert_close(g, w)


def test_frozen_weights_compile_again_when_they_change():
    model = randomized(Residual())
    x = image()
    f = compiled(model)
    with torch.no_grad():
        before = f(x)
        model.conv.weight.mul_(-1)  # in place: same object, its version counter moves
        after = f(x)
    assert_close(after, eager(model, x))
    assert not torch.allclose(before, after)
    assert len(tc.reports()) == 2


def test_a_torch_style_network_matches_eager():
    """MobileNetV2 as PyTorch users write it (BatchNorm2d, ReLU6(inplace=True), depthwise convs,
    inverted residuals, the pooled head), at 32x32: every conv on ours."""
    from models import torch_style

    model = torch_style.build("mobilenet_v2", seed=3)
    x = torch.from_numpy(np.random.default_rng(4).standard_normal((1, 3, 32, 32)).astype(np.float32))
    with torch.no_grad():
        got = compiled(model)(x)
    assert_close(got, eager(model, x))
    (rep,) = tc.reports()
    convs = [r for r in rep["ops"] if r["op"] == "conv2d"]
    assert len(convs) == sum(isinstance(m, nn.Conv2d) for m in model.modules())
    assert all(r["runs_on"] == "ours" for r in convs)


# One compile in a fresh process: the model seeded by argv[1], an input of side argv[2], the
# threads option argv[3]; prints "hit" where the graph came from the compile cache (its log line,
# written to the file argv[4]), else "miss".
_CACHED_GRAPH = """
import logging, sys
import torch
logging.basicConfig(level=logging.INFO, filename=sys.argv[4], filemode="w")
torch.manual_seed(int(sys.argv[1]))
m = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                        torch.nn.Conv2d(16, 32, 1)).eval()
x = torch.ones(1, 16, int(sys.argv[2]), int(sys.argv[2]))
with torch.no_grad():
    y = torch.compile(m, backend="microkernels", options={"threads": int(sys.argv[3])})(x)
    assert torch.allclose(y, m(x), rtol=1e-4, atol=1e-4), float((y - m(x)).abs().max())
logging.shutdown()
print("hit" if "graph 1 loaded from the compile cache" in open(sys.argv[4]).read() else "miss")
"""


def test_a_compiled_graph_is_loaded_from_the_cache_by_a_new_process(tmp_path):
    """The compile cache keeps each torch.compile graph under its code, inputs, frozen values
    and options: a second process with the same model loads it (no export, import or optimize);
    a changed weight, input shape or option compiles again, and each answer matches eager."""
    import os

    env = {**os.environ, "TVM_MICROKERNELS_CACHE": str(tmp_path / "cache")}

    def run(seed, side, threads):
        done = subprocess.run([sys.executable, "-c", _CACHED_GRAPH, str(seed), str(side), str(threads),
                               str(tmp_path / "log")], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.split()[-1]

    assert run(0, 12, 1) == "miss"
    assert run(0, 12, 1) == "hit"
    assert run(1, 12, 1) == "miss"  # other weights
    assert run(0, 10, 1) == "miss"  # another shape
    assert run(0, 12, 2) == "miss"  # another option


def test_a_graph_entry_that_names_no_model_is_rebuilt(tmp_path):
    """A graph's cache entry, sealed with the user's own key under its own name but holding no
    model's key (text, a number, a key of another kind, another graph's whole payload, which
    names its own key): the next process compiles again and matches eager, never raises."""
    import os

    from schedules.common import cache, private

    root = tmp_path / "cache"
    env = {**os.environ, "TVM_MICROKERNELS_CACHE": str(root)}

    def run(seed):
        done = subprocess.run([sys.executable, "-c", _CACHED_GRAPH, str(seed), "12", "1", str(tmp_path / "log")],
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.split()[-1]

    assert run(0) == "miss"
    mine, = (root / "graph").rglob("graph-*.pkl")
    assert run(1) == "miss"
    other, = set((root / "graph").rglob("graph-*.pkl")) - {mine}
    with private.Folder.root(root) as folder:
        secret = cache._secret(folder)
    good, k = mine.read_bytes(), mine.stem
    payload = other.read_bytes()[len(cache._MAGIC) + 32:]
    for blob in [cache._sealed(secret, k, v) for v in ("text", 3, cache.key("schedule", "x"))] + [
            cache._MAGIC + cache._mac(secret, k, payload) + payload]:
        mine.write_bytes(blob)
        assert run(0) == "miss" and run(1) == "hit"  # the answer checked against eager in the run
        mine.write_bytes(good)
