"""schedules.relax: whole models with every conv2d on our kernels.

Numerics against TVM's own (unoptimized) build of the same module and, for the networks of
models.resnet, against PyTorch; the shape of the optimized graph (two layout transforms, no
elementwise op left behind a conv); a model of odd layers TVM partly keeps; ResNet-50 itself
under the `slow` marker (`pytest -m slow`), and in `bench resnet50`.
"""

import os
import time

import numpy as np
import pytest
import tvm
from tvm import relax

from microkernels import best_host_isa
from models import resnet
from schedules import relax as mkrelax
from schedules.conv import inverted_pays

from ...conv_reference import assert_conv_close, ref_conv2d

HOST = f"x86-{best_host_isa().name}"
# Whole-network tolerance, relative to the output's largest magnitude: dozens of float32
# convolutions (reductions up to 4608 long) each within a few ulps of their own sums, summed
# along a residual path; observed 1e-6 to 3e-6 here, and both references differ by as much.
RTOL = 1e-4


def run(mod_or_ex, x: np.ndarray, compiled=False):
    ex = mod_or_ex if compiled else tvm.compile(mod_or_ex, target=mkrelax.llvm_target(HOST))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    return (out[0] if not hasattr(out, "numpy") else out).numpy()


def close(got, want, rtol=RTOL):
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= rtol, f"max |diff| = {err:.3g} of the largest output"


def calls(mod: tvm.IRModule, name: str) -> int:
    """Calls of the Relax operator `name` in main (after optimize, before build)."""
    count = 0

    def visit(e):
        nonlocal count
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == name:
            count += 1

    relax.analysis.post_order_visit(mod["main"], visit)
    return count


def lowered(mod: tvm.IRModule) -> tvm.IRModule:
    """A module optimized with lower=False (to count its Relax ops), lowered as optimize would."""
    return mkrelax.schedule_rest(mod, None)


def convs(report: list) -> list:
    return [r for r in report if r["op"] == "conv2d"]


def call_tirs(mod: tvm.IRModule) -> list[str]:
    names = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.call_tir":
            names.append(e.args[0].name_hint)

    relax.analysis.post_order_visit(mod["main"], visit)
    return names


SMALL = resnet.resnet(stages=((16, 1), (32, 3)), stem_width=16, image=32, classes=10)


@pytest.fixture(scope="module")
def small():
    params = resnet.random_params(SMALL, seed=3)
    x = np.random.default_rng(4).standard_normal((1, 3, 32, 32)).astype(np.float32)
    return resnet.relax_module(SMALL, params), params, x


def test_small_resnet_matches_tvm_and_runs_every_conv_on_our_kernels(small):
    mod, _, x = small
    report = []
    opt = mkrelax.optimize(mod, HOST, report=report, lower=False)
    assert len(convs(report)) == len(SMALL.convs) and all(r["runs_on"] == "ours" for r in convs(report)), report
    assert calls(opt, "relax.nn.conv2d") == 0
    close(run(lowered(opt), x), run(mod, x))
    # One PrimFunc per distinct layer: the last two blocks of the second stage share theirs.
    names = call_tirs(opt)
    assert len(set(names)) < len(names) and len(set(opt.get_global_vars())) == len(set(names)) + 1



def test_each_distinct_layer_is_scheduled_once_shared_among_processes(small, tmp_path, monkeypatch):
    """The pass schedules every distinct layer up front, once (the cache is off in the suite,
    so nothing else dedupes them), in two processes here; the module is the one a serial
    build makes."""
    from schedules.conv import dispatch

    mod, _, _ = small
    log, real = tmp_path / "scheduled", dispatch._schedule_x86

    def logged(conv, post, *a, **k):
        time.sleep(0.05)  # each item outlasts the child's start, so both processes take some
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {conv} {post}\n")
        return real(conv, post, *a, **k)

    monkeypatch.setattr(dispatch, "_schedule_x86", logged)
    monkeypatch.setenv("TVM_MICROKERNELS_JOBS", "2")
    report = []
    shared = mkrelax.optimize(mod, HOST, report=report, lower=False)
    lines = log.read_text().splitlines()
    layers = {(tuple(r["data"]), tuple(r["weight"]), tuple(r["stride"]), r["algorithm"], r["post_ops"])
              for r in convs(report)}
    assert len(lines) == len(layers) < len(convs(report)), lines
    assert len({line.split()[0] for line in lines}) == 2, lines
    monkeypatch.setenv("TVM_MICROKERNELS_JOBS", "1")
    tvm.ir.assert_structural_equal(shared, mkrelax.optimize(mod, HOST, lower=False))


def test_autotune_times_each_distinct_layer_once_and_the_model_runs_its_choices(small, monkeypatch):
    """optimize(autotune=True): every distinct conv layer of ours timed once (the timing made
    up here: the last candidate wins, a Winograd F(6) on 3x3 stride-1 layers, else a direct
    variant the planner would not take), the model built on those plans and right; a second
    optimize times nothing."""
    from schedules.common import tuned
    from schedules.conv import autotune, dispatch

    monkeypatch.setattr(tuned, "_MEMORY", {})
    timed = []

    def fake(ops, budget=autotune.BUDGET, seed=0):
        timed.append(list(ops))
        return {label: 1e-3 if i == len(ops) - 1 else 2e-3 for i, label in enumerate(ops)}

    monkeypatch.setattr(autotune, "time_candidates", fake)
    mod, _, x = small
    report = []
    opt = mkrelax.optimize(mod, HOST, report=report, lower=False, autotune=True)
    layers = {(tuple(r["data"]), tuple(r["weight"]), tuple(r["stride"])) for r in convs(report)}
    first = len(timed)
    assert 1 < first <= len(layers), timed
    assert sum(r["algorithm"] == "winograd" and "F6" in r["reason"] for r in convs(report)) >= 1
    assert all(r["reason"].endswith("plan autotuned (this process)") for r in convs(report)), report
    assert all(r["runs_on"] == "ours" for r in convs(report)), report
    close(run(lowered(opt), x), run(mod, x))
    mkrelax.optimize(mod, HOST, lower=False, autotune=True)
    assert len(timed) == first
    with pytest.raises(ValueError, match="autotune=True chooses"):
        mkrelax.optimize_pass(HOST, algorithm="direct", autotune=True)


def test_a_tvm_target_object_builds_for_its_own_cpu(small):
    """TVM users hold a tvm.target.Target: build() takes it, picks the ISA its CPU allows and
    compiles the model for that Target itself."""
    mod, _, x = small
    target = tvm.target.Target({"kind": "llvm", "mcpu": {"avx512": "znver4", "avx2": "haswell"}[best_host_isa().name]})
    assert mkrelax.llvm_target(target) is target
    report = []
    ex = mkrelax.build(mod, target, report=report)
    convs = [r for r in report if r["op"] == "conv2d"]
    assert convs and all(r["runs_on"] == "ours" for r in convs), report
    close(run(ex, x, compiled=True), run(mod, x))

def test_fusion_leaves_no_elementwise_op_over_a_conv_output(small):
    mod, _, x = small
    opt = mkrelax.optimize(mod, HOST, lower=False)
    unfused = mkrelax.optimize(mod, HOST, fuse=False, lower=False)
    # Every bias add, residual add and ReLU of the network sits behind a conv.
    # the classifier's bias too, in our matmul's store (linear.py)
    assert calls(opt, "relax.add") == 0 and calls(opt, "relax.nn.relu") == 0
    assert calls(unfused, "relax.add") == 1 + len(SMALL.convs) + len(SMALL.blocks)
    assert calls(unfused, "relax.nn.relu") == len(SMALL.convs) - sum(b.down is not None for b in SMALL.blocks)
    fused_names = call_tirs(opt)
    assert sum("_res_relu" in n for n in fused_names) == len(SMALL.blocks)
    close(run(lowered(opt), x), run(lowered(unfused), x))


def test_two_layout_transforms_when_the_first_conv_is_blocked():
    """A model whose input has 16 channels is blocked from its first conv to its last op: one
    transform in, one out (a ResNet's 3-channel stem too, its pair cancelling around the max pool)."""
    rng = np.random.default_rng(0)
    w = lambda *s: relax.const((rng.standard_normal(s) * 0.2).astype(np.float32))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 12, 12), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, w(32, 16, 3, 3), padding=1))))
            z = bb.emit(relax.op.nn.conv2d(y, w(32, 32, 1, 1)))
            y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(z, y))))
            y = bb.emit(relax.op.nn.conv2d(y, w(16, 32, 3, 3), strides=2, padding=1))
            out = bb.emit_output(bb.emit(relax.op.nn.avg_pool2d(y, pool_size=2, strides=2)))
        bb.emit_func_output(out)
    mod = bb.get()
    opt = mkrelax.optimize(mod, HOST, lower=False)
    assert calls(opt, "relax.layout_transform") == 2
    assert calls(opt, "relax.nn.conv2d") == 0 and len(call_tirs(opt)) == 3
    xv = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    close(run(lowered(opt), xv), run(mod, xv))


def test_odd_layers_compile_and_match():
    """5x5, stride 3, dilation 2, a grouped conv ConvertLayout blocks (16 channels per group),
    one of 4 per group (ours, in the lanes, between transforms), one of 8 in and 4 out per
    group (ours, direct, each group padded to a block), a depthwise conv (ours, in NCHW between
    transforms), a clip, a dense layer; and weights given as parameters, bound by optimize."""
    rng = np.random.default_rng(7)
    w = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)
    weights = {"w5": w(32, 16, 5, 5), "w3": w(32, 32, 3, 3), "wd": w(32, 32, 3, 3), "wg16": w(32, 16, 3, 3),
               "wg4": w(32, 4, 3, 3), "wg8": w(16, 8, 1, 1), "wdw": w(16, 1, 3, 3), "fc": w(10, 16)}
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 23, 23), "float32"))
    pv = {k: relax.Var(k, relax.TensorType(v.shape, "float32")) for k, v in weights.items()}
    with bb.function("main", [x, *pv.values()]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, pv["w5"], padding=2))
            y = bb.emit(relax.op.clip(y, 0.0, 6.0))
            y = bb.emit(relax.op.nn.conv2d(y, pv["w3"], strides=3, padding=1))
            y = bb.emit(relax.op.nn.conv2d(y, pv["wd"], padding=2, dilation=2))
            y = bb.emit(relax.op.nn.conv2d(y, pv["wg16"], padding=1, groups=2))
            y = bb.emit(relax.op.nn.conv2d(y, pv["wg4"], padding=1, groups=8))
            y = bb.emit(relax.op.nn.conv2d(y, pv["wg8"], groups=4))
            y = bb.emit(relax.op.nn.conv2d(y, pv["wdw"], padding=1, groups=16))
            y = bb.emit(relax.op.mean(y, axis=[2, 3]))
            out = bb.emit_output(bb.emit(relax.op.matmul(y, relax.op.permute_dims(pv["fc"]))))
        bb.emit_func_output(out)
    mod = bb.get()
    report = []
    opt = mkrelax.optimize(mod, HOST, params=weights, report=report)
    report = convs(report)
    where = [r["runs_on"] for r in report]
    assert where == ["ours"] * 7, report
    assert "clip" in report[0]["post_ops"] and report[4]["algorithm"] == "grouped"
    assert report[5]["algorithm"] == "direct" and report[6]["algorithm"] == "depthwise"
    xv = rng.standard_normal((1, 16, 23, 23)).astype(np.float32)
    ex = tvm.compile(mod, target=mkrelax.llvm_target(HOST))
    want = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(xv),
                                                        *(tvm.runtime.tensor(v) for v in weights.values())).numpy()
    close(run(opt, xv), want)


def test_small_resnext_runs_its_narrow_groups_blocked_on_our_kernels():
    """ResNeXt's 3x3s with 4 and 8 channels per group: ours (in the lanes), between transforms
    that cancel against the blocked neighbours', so the network has no more layout transforms
    than a plain ResNet of whole blocks (the edges'); PyTorch agrees."""
    torch = pytest.importorskip("torch", reason="PyTorch is in the test extra; without it this comparison cannot run")
    shape = {"stages": ((16, 1), (32, 2)), "stem_width": 16, "image": 32, "classes": 10, "base_width": 16}
    net = resnet.resnet(groups=4, **shape)
    assert sorted({c.cin // c.groups for c in net.convs if c.groups > 1}) == [4, 8]
    params = resnet.random_params(net, seed=4)
    x = np.random.default_rng(5).standard_normal((1, 3, 32, 32)).astype(np.float32)
    report = []
    opt = mkrelax.optimize(resnet.relax_module(net, params), HOST, report=report, lower=False)
    assert len(convs(report)) == len(net.convs) and all(r["runs_on"] == "ours" for r in convs(report)), report
    assert sum(r["algorithm"] == "grouped" for r in convs(report)) == sum(c.groups > 1 for c in net.convs), report
    baseline = mkrelax.optimize(resnet.relax_module(SMALL, resnet.random_params(SMALL)), HOST, lower=False)
    # The input's and the output's: the stem's own pair cancels around the blocked max pool.
    assert calls(opt, "relax.layout_transform") == calls(baseline, "relax.layout_transform") == 2
    with torch.no_grad():
        want = resnet.torch_module(net, params)(torch.from_numpy(x)).numpy()
    close(run(lowered(opt), x), want)


def _stem_pool_conv(pool, second_user=False):
    """A 3-channel stem conv (NCHW, ours between transforms), a pool, a 32-channel conv: the
    stem of a ResNet. second_user: the pool's output also leaves the model."""
    rng = np.random.default_rng(9)
    w = lambda *s: relax.const((rng.standard_normal(s) * 0.3).astype(np.float32))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 20, 20), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, w(32, 3, 3, 3), strides=2, padding=1))))
            p = bb.emit(pool(y, pool_size=3, strides=2, padding=1))
            z = bb.emit(relax.op.nn.conv2d(p, w(32, 32, 1, 1)))
            out = bb.emit_output(relax.Tuple([z, p]) if second_user else z)
        bb.emit_func_output(out)
    return bb.get(), rng.standard_normal((1, 3, 20, 20)).astype(np.float32)


@pytest.mark.parametrize("pool", [relax.op.nn.max_pool2d, relax.op.nn.avg_pool2d], ids=["max", "avg"])
def test_a_pool_between_the_stem_and_a_blocked_conv_runs_blocked(pool):
    mod, xv = _stem_pool_conv(pool)
    opt = mkrelax.optimize(mod, HOST, lower=False)
    (call,) = [c for c in op_calls(opt["main"]) if c.op.name == f"relax.nn.{pool.__name__}"]
    assert str(call.attrs.layout) == "NCHW16c" and str(call.attrs.out_layout) == "NCHW16c"
    assert calls(opt, "relax.layout_transform") == 2  # the input's and the output's only
    close(run(lowered(opt), xv), run(mod, xv))


def test_a_pool_whose_output_is_read_elsewhere_stays_nchw():
    mod, xv = _stem_pool_conv(relax.op.nn.max_pool2d, second_user=True)
    opt = mkrelax.optimize(mod, HOST, lower=False)
    (call,) = [c for c in op_calls(opt["main"]) if c.op.name == "relax.nn.max_pool2d"]
    assert str(call.attrs.layout) == "NCHW"
    vm = relax.VirtualMachine(tvm.compile(lowered(opt), target=mkrelax.llvm_target(HOST)), tvm.cpu())
    ref = relax.VirtualMachine(tvm.compile(mod, target=mkrelax.llvm_target(HOST)), tvm.cpu())
    for got, want in zip(vm["main"](tvm.runtime.tensor(xv)), ref["main"](tvm.runtime.tensor(xv))):
        close(got.numpy(), want.numpy())


def op_calls(func) -> list:
    found = []
    relax.analysis.post_order_visit(func, lambda e: found.append(e) if isinstance(e, relax.Call)
                                    and isinstance(e.op, tvm.ir.Op) else None)
    return found


@pytest.mark.parametrize("clip", [(0.0, 6.0), (1.0, 6.0)], ids=["act0_zero", "act0_one"])
def test_a_24_channel_layer_hands_its_padded_blocked_output_on_whatever_the_pad_lanes_hold(clip):
    """24 = 1.5 blocks: the graph is padded to 32 channels before ConvertLayout (channels.py), so
    the next conv reads the blocked output itself, whatever its padding lanes hold (clip(0) = 1
    with clip(1, 6)): its weights are zero there. Before, clip(1, 6) kept a slice and a re-pad
    between the two convs (4 transforms)."""
    transforms = 2
    rng = np.random.default_rng(10)
    w = lambda *s: relax.const((rng.standard_normal(s) * 0.3).astype(np.float32))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 9, 9), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.clip(bb.emit(relax.op.nn.conv2d(x, w(24, 16, 1, 1))), *clip))
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(y, w(16, 24, 3, 3), padding=1)))
        bb.emit_func_output(out)
    mod = bb.get()
    opt = mkrelax.optimize(mod, HOST, lower=False)
    assert calls(opt, "relax.layout_transform") == transforms
    xv = rng.standard_normal((1, 16, 9, 9)).astype(np.float32)
    close(run(lowered(opt), xv), run(mod, xv))


def test_refusals():
    with pytest.raises(ValueError, match="x86 float32"):
        mkrelax.optimize_pass("armv7-neon")
    with pytest.raises(ValueError, match="'auto' or 'direct'"):
        mkrelax.optimize_pass(HOST, algorithm="winograd")



def _conv_with_weight_param():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "float32"))
    w = relax.Var("w", relax.TensorType((16, 16, 3, 3), "float32"))
    n = tvm.tirx.Var("n", "int64")
    b = relax.Var("b", relax.TensorType((n,), "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(x, w, padding=1)))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("params, msg", [
    ({"weight": np.zeros((16, 16, 3, 3), np.float32)}, r"params \['weight'\] name no parameter of main; its parameters are \['b', 'w', 'x'\]"),
    ({"w": np.zeros((16, 16, 5, 5), np.float32)}, r"params\['w'\] has shape \(16, 16, 5, 5\), main's w is \(16, 16, 3, 3\)"),
    ({"w": np.zeros((16, 16, 3, 3))}, r"params\['w'\] has dtype float64, main's w is float32"),
    ({"b": np.zeros((2, 3), np.float32)}, r"params\['b'\] has shape \(2, 3\), main's b is \(\?,\)"),
])
def test_params_must_name_and_fit_mains_parameters(params, msg):
    """TVM's BindParams fails on an unknown name with an internal check and binds a 5x5 weight to
    a 3x3 parameter silently: optimize refuses both, and a dtype that differs, by name."""
    with pytest.raises(ValueError, match=msg):
        mkrelax.optimize(_conv_with_weight_param(), HOST, params=params)


def test_params_that_fit_are_bound(rng):
    mod = _conv_with_weight_param()
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    opt = mkrelax.optimize(mod, HOST, params={"w": w, "b": [0.0] * 5}, lower=False)
    assert [p.name for p in opt["main"].params] == ["x"]
    x = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    assert_conv_close(run(lowered(opt), x), x, w, padding=1)


def _model_with(case: str):
    """Two 3x3 convs around a ReLU, with what the pass does not take in between or instead."""
    dtype = "float16" if case == "float16" else "float32"
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var("n", "int64") if case == "symbolic batch" else 1
    x = relax.Var("x", relax.TensorType((n, 16, 8, 8), dtype))
    rng = np.random.default_rng(0)
    w = lambda *s: relax.const(rng.standard_normal(s).astype(dtype))  # noqa: E731
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w(16, 16, 3, 3), padding=1))
            if case == "conv2d_transpose":
                y = bb.emit(relax.op.nn.conv2d_transpose(y, w(16, 16, 3, 3), padding=1))
            if case == "scalar add":
                y = bb.emit(relax.op.add(y, relax.const(np.array(1.5, dtype))))
            if case == "stack":  # ONNX's Sum of two tensors, as TVM's importer writes it
                y = bb.emit(relax.op.sum(bb.emit(relax.op.stack([y, bb.emit(relax.op.sigmoid(y))], axis=1)), axis=[1]))
            y = bb.emit(relax.op.nn.relu(y))
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(y, w(16, 16, 3, 3), padding=1)))
        bb.emit_func_output(out)
    return bb.get(), dtype


@pytest.mark.parametrize("case, ours, why", [
    ("symbolic batch", 0, "shapes not static"), ("float16", 0, "dtype float16"),
    ("conv2d_transpose", 2, None), ("scalar add", 2, None), ("stack", 2, None),
])
def test_models_the_pass_does_not_expect_still_build_and_match_tvm(case, ours, why):
    """A conv the pass does not take (float16, a symbolic batch) stays NCHW through ConvertLayout
    and is TVM's to lower, with the reason in the report; a conv2d_transpose between blocked
    convs gets NCHW data back; so does a stack, whose layout TVM cannot infer (it is a concat
    of expand_dims for ConvertLayout). Each used to break the build (CodeGenVM could not emit a
    blocked conv2d; 'Layouts must have the same size'; 'Invalid SLayout:can't find S')."""
    mod, dtype = _model_with(case)
    report = []
    ex = mkrelax.build(mod, HOST, report=report)
    convs = [r for r in report if r["op"] == "conv2d" and "data" in r]
    assert len(convs) == 2 and sum(r["runs_on"] == "ours" for r in convs) == ours, convs
    assert why is None or all(why in r["reason"] for r in convs), convs
    x = np.random.default_rng(1).standard_normal((2 if case == "symbolic batch" else 1, 16, 8, 8)).astype(dtype)
    ref = tvm.compile(mod, target=mkrelax.llvm_target(HOST))
    got, want = run(ex, x, compiled=True), run(ref, x, compiled=True)
    close(got.astype(np.float64), want.astype(np.float64), rtol=1e-2 if dtype == "float16" else RTOL)

def test_small_resnet_matches_pytorch_and_the_torch_frontend(small):
    torch = pytest.importorskip("torch", reason="PyTorch is in the test extra; without it this comparison cannot run")
    from tvm.relax.frontend.torch import from_exported_program

    mod, params, x = small
    tmodel = resnet.torch_module(SMALL, params)
    with torch.no_grad():
        want = tmodel(torch.from_numpy(x)).numpy()
    close(run(mkrelax.optimize(mod, HOST), x), want)
    imported = from_exported_program(torch.export.export(tmodel, (torch.from_numpy(x),)))
    report = []
    opt = mkrelax.optimize(imported, HOST, report=report, lower=False)
    assert all(r["runs_on"] == "ours" for r in report) and calls(opt, "relax.nn.relu") == 0
    close(run(lowered(opt), x), want)


@pytest.mark.slow
def test_resnet50_matches_pytorch():
    torch = pytest.importorskip("torch")
    net = resnet.resnet()
    params = resnet.random_params(net)
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    report = []
    got = run(mkrelax.optimize(resnet.relax_module(net, params), HOST, report=report), x)
    assert len(convs(report)) == 53 and all(r["runs_on"] in ("ours", "view") for r in report), report
    with torch.no_grad():
        want = resnet.torch_module(net, params)(torch.from_numpy(x)).numpy()
    close(got, want)


@pytest.mark.parametrize("c, hw, stride, fused", [(16, 64, 1, True), (24, 64, 2, True), (16, 14, 1, False)],
                         ids=["blocked_expand_s1", "nchw_expand_s2", "small_map_unfused"])
def test_inverted_residual_block_runs_blocked_end_to_end(c, hw, stride, fused):
    """MobileNetV2's block: 1x1 expand + ReLU6, 3x3 depthwise + ReLU6, 1x1 project, residual
    add (stride 1). Where the expanded map would not stay in L2 (inverted_pays), the expand and
    the depthwise conv run as one fused call; the depthwise conv, blocked by ConvertLayout like
    its neighbours: two transforms in the whole model, every conv ours, bias and clips fused.
    24 channels: padded to 32 (channels.py), the model's input blocked with zero channels."""
    rng = np.random.default_rng(5)
    w = lambda *s: relax.const((rng.standard_normal(s) * 0.3).astype(np.float32))
    e_ch = 6 * c
    assert inverted_pays((1, c, hw, hw), e_ch) is fused
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, hw, hw), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(x, w(e_ch, c, 1, 1))), w(1, e_ch, 1, 1)))
            e = bb.emit(relax.op.clip(e, 0.0, 6.0))
            d = bb.emit(relax.op.nn.conv2d(e, w(e_ch, 1, 3, 3), strides=stride, padding=1, groups=e_ch))
            d = bb.emit(relax.op.clip(bb.emit(relax.op.add(d, w(1, e_ch, 1, 1))), 0.0, 6.0))
            p = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(d, w(c, e_ch, 1, 1))), w(1, c, 1, 1)))
            out = bb.emit_output(bb.emit(relax.op.add(p, x)) if stride == 1 else p)
        bb.emit_func_output(out)
    mod = bb.get()
    report = []
    opt = mkrelax.optimize(mod, HOST, report=report, lower=False)
    assert [r["runs_on"] for r in report] == ["ours"] * 3, report
    algorithms = ["inverted"] * 2 if fused else ["direct", "depthwise"]
    assert [(r["algorithm"], r["post_ops"]) for r in report[:2]] == list(zip(algorithms, ["bias+clip"] * 2)), report
    assert sum(n.startswith("mk_conv2d_inverted") for n in call_tirs(opt)) == fused
    assert calls(opt, "relax.layout_transform") == 2 and calls(opt, "relax.nn.conv2d") == 0
    assert calls(opt, "relax.add") == 0 and calls(opt, "relax.maximum") == 0
    xv = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    close(run(lowered(opt), xv), run(mod, xv))


def test_small_mobilenet_v2_matches_pytorch():
    """models.mobilenet with two stages at 32x32: every conv ours (depthwise included), every
    ReLU6 fused, matching PyTorch on the same weights."""
    from models import mobilenet

    torch = pytest.importorskip("torch", reason="PyTorch is in the test extra; without it this comparison cannot run")
    net = mobilenet.mobilenet_v2(settings=((1, 16, 1, 1), (6, 24, 2, 2)), image=32, classes=10)
    params = mobilenet.random_params(net, seed=2)
    x = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    report = []
    opt = mkrelax.optimize(mobilenet.relax_module(net, params), HOST, report=report, lower=False)
    assert len(convs(report)) == len(net.convs) and all(r["runs_on"] == "ours" for r in convs(report)), report
    # At 32x32 every expanded map stays in L2, where fusing does not pay (inverted_pays): the
    # depthwise convs run on their own kernel.
    assert sum(r["algorithm"] == "depthwise" for r in convs(report)) == len(net.blocks)
    # 24-channel layers are not blocked by ConvertLayout (24 is not whole blocks): they run on
    # ours, whose padded lanes are zeros (zero weights and bias, act(0) = 0), so the next layer
    # reads the padded blocked output itself: no transform but the model's edges.
    assert calls(opt, "relax.nn.conv2d") == 0 and calls(opt, "relax.clip") == 0
    assert calls(opt, "relax.layout_transform") == 2 and calls(opt, "relax.strided_slice") == 0
    with torch.no_grad():
        want = mobilenet.torch_module(net, params)(torch.from_numpy(x)).numpy()
    close(run(lowered(opt), x), want)


def test_a_residual_after_a_depthwise_conv_stays_a_graph_add():
    """The depthwise kernel fuses bias and activations but not a residual: the add stays."""
    rng = np.random.default_rng(6)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32, 9, 9), "float32"))
    w = relax.const((rng.standard_normal((32, 1, 3, 3)) * 0.3).astype(np.float32))
    with bb.function("main", [x]):
        with bb.dataflow():
            d = bb.emit(relax.op.nn.conv2d(x, w, padding=1, groups=32))
            out = bb.emit_output(bb.emit(relax.op.add(d, x)))
        bb.emit_func_output(out)
    mod = bb.get()
    report = []
    opt = mkrelax.optimize(mod, HOST, report=report, lower=False)
    assert report[0]["algorithm"] == "depthwise" and report[0]["post_ops"] == "" and calls(opt, "relax.add") == 1
    xv = rng.standard_normal((1, 32, 9, 9)).astype(np.float32)
    close(run(lowered(opt), xv), run(mod, xv))


def _conv_after(shape, transforms, tail=None, seed=8):
    """x -> each layout_transform in turn -> a 3x3 conv from 16 to 16 channels [-> tail(y)]."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((16, 16, 3, 3)) * 0.3).astype(np.float32)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for index_map in transforms:
                y = bb.emit(relax.op.layout_transform(y, index_map=index_map))
            y = bb.emit(relax.op.nn.conv2d(y, relax.const(w), padding=1))
            out = bb.emit_output(bb.emit(tail(y)) if tail else y)
        bb.emit_func_output(out)
    return bb.get(), w, rng.standard_normal(shape).astype(np.float32)


def _swap_last_two(x):
    return x.transpose(0, 1, 3, 2)


def _transpose_thirds_of_w(x):  # w = 3a + b -> 3b + a
    n, c, h, w = x.shape
    return x.reshape(n, c, h, 3, w // 3).swapaxes(3, 4).reshape(n, c, h, w)


@pytest.mark.parametrize("shape, transforms, numpy_equivalent, left", [
    # NCHW -> NHWC -> NCHW: a true round trip, which cancels.
    ((1, 16, 3, 5), [lambda n, c, h, w: (n, h, w, c), lambda n, h, w, c: (n, c, h, w)], lambda x: x, 2),
    # NCHW -> NHWC -> "NCWH": a transpose of H and W, the identity only where h == w, as at
    # every index of a square map that sampling tried.
    ((1, 16, 3, 3), [lambda n, c, h, w: (n, h, w, c), lambda n, h, w, c: (n, c, w, h)], _swap_last_two, 4),
    # W split in thirds and fused back in the other order: one index differs from the
    # identity, and only off w in {0, 4, 8}, where every sample of a 9-wide map lands.
    ((1, 16, 4, 9), [lambda n, c, h, w: (n, c, h, w // 3, w % 3), lambda n, c, h, a, b: (n, c, h, b * 3 + a)],
     _transpose_thirds_of_w, 4),
], ids=["inverse", "nhwc_then_ncwh", "w_thirds_transposed"])
def test_only_layout_transforms_proven_inverse_cancel(shape, transforms, numpy_equivalent, left):
    mod, w, xv = _conv_after(shape, transforms)
    opt = mkrelax.optimize(mod, HOST, lower=False)
    # ConvertLayout's pair around the blocked conv stays; the user's pair only if not an inverse.
    assert calls(opt, "relax.layout_transform") == left
    got = run(lowered(opt), xv)
    close(got, run(mod, xv))
    assert_conv_close(got, numpy_equivalent(xv), w, padding=1)


def test_a_maximum_with_a_nonzero_constant_is_not_a_relu():
    """max(y, 0.5) is no ReLU and no clip (no minimum after it): it stays a graph op."""
    mod, w, xv = _conv_after((1, 16, 6, 6), [], tail=lambda y: relax.op.maximum(y, relax.const(np.float32(0.5))))
    report = []
    opt = mkrelax.optimize(mod, HOST, report=report, lower=False)
    assert report[0]["runs_on"] == "ours" and report[0]["post_ops"] == "" and calls(opt, "relax.maximum") == 1
    got = run(lowered(opt), xv)
    close(got, run(mod, xv))
    np.testing.assert_allclose(got, np.maximum(ref_conv2d(xv, w, padding=1), 0.5), rtol=1e-5, atol=1e-5)


def _narrow_conv_then_maps(second_use: bool, parts: bool = False):
    """A 1x1 conv on 24 channels (not whole blocks: NCHW, between transforms of its own), SiLU
    and a clip, then a 3x3 conv on 32 channels (blocked); second_use: the SiLU's output also
    goes to the result transposed (H and W: no blocked twin); parts: SiLU
    written x * sigmoid(x), as torch.export and ONNX give it."""
    rng = np.random.default_rng(4)
    w1 = (rng.standard_normal((32, 24, 1, 1)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((32, 32, 3, 3)) * 0.2).astype(np.float32)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 24, 9, 9), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(w1)))
            s = bb.emit(relax.op.multiply(y, bb.emit(relax.op.sigmoid(y))) if parts else relax.op.nn.silu(y))
            c = bb.emit(relax.op.clip(s, 0.0, 4.0))
            out = bb.emit(relax.op.nn.conv2d(c, relax.const(w2), padding=1))
            if second_use:
                out = bb.emit(relax.op.add(out, relax.op.permute_dims(s, [0, 1, 3, 2])))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get(), rng.standard_normal((1, 24, 9, 9)).astype(np.float32)


@pytest.mark.parametrize("second_use, parts, left", [(False, False, 2), (False, True, 2), (True, False, 5)])
def test_transforms_cancel_through_elementwise_maps(second_use, parts, left):
    """to_nchw(conv) -> SiLU -> clip -> to_blocked: the pair cancels and the maps run blocked
    (the NCHW conv's input transform and the result's are left); where the SiLU's NCHW output
    has another user, every transform stays. Values as TVM's own build of the model."""
    mod, xv = _narrow_conv_then_maps(second_use, parts)
    opt = mkrelax.optimize(mod, HOST, lower=False)
    assert calls(opt, "relax.layout_transform") == left
    close(run(lowered(opt), xv), run(mod, xv))


def _squeeze_excite(second_use: bool):
    """conv 3x3 (16 -> 32, blocked) -> depthwise 3x3 (our NCHW family) -> SiLU -> mean over H, W ->
    1x1 conv 32 -> 8 -> SiLU -> 1x1 conv 8 -> 32 -> sigmoid -> times the map -> 1x1 conv 32 -> 16
    (EfficientNet's block); second_use: the SiLU's map also added to the result's first 16
    channels' worth (an NCHW value needed besides)."""
    rng = np.random.default_rng(6)

    def w(*shape):
        return relax.const((rng.standard_normal(shape) * 0.3).astype(np.float32))

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 10, 10), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w(32, 16, 3, 3), padding=1))
            d = bb.emit(relax.op.nn.conv2d(y, w(32, 1, 3, 3), padding=1, groups=32))
            s = bb.emit(relax.op.nn.silu(d))
            m = bb.emit(relax.op.mean(s, axis=[2, 3], keepdims=True))
            e = bb.emit(relax.op.nn.silu(bb.emit(relax.op.nn.conv2d(m, w(8, 32, 1, 1)))))
            g = bb.emit(relax.op.sigmoid(bb.emit(relax.op.nn.conv2d(e, w(32, 8, 1, 1)))))
            out = bb.emit(relax.op.nn.conv2d(bb.emit(relax.op.multiply(s, g)), w(16, 32, 1, 1)))
            if second_use:
                out = bb.emit(relax.op.add(out, relax.op.strided_slice(s, axes=[1], begin=[0], end=[16])))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get(), rng.standard_normal((1, 16, 10, 10)).astype(np.float32)


@pytest.mark.parametrize("second_use", [False, True])
def test_squeeze_excitation_runs_blocked(second_use, monkeypatch):
    """The depthwise conv (blocked by ConvertLayout), its SiLU, the mean, the SE convs on 8
    channels (padded to a block) and the scale run on the blocked map, transforms only at the
    model's edges, with or without sink_transforms (which did this for an NCHW depthwise conv);
    where the NCHW SiLU is needed besides, nothing is rewritten (no op computed twice). Values
    as TVM's."""
    from schedules.relax import cancel

    mod, xv = _squeeze_excite(second_use)
    opt = mkrelax.optimize(mod, HOST, lower=False)
    monkeypatch.setattr(cancel, "sink_transforms", lambda m: m)
    unsunk = mkrelax.optimize(mod, HOST, lower=False)
    big = [c for c in _layout_transforms(opt) if c[-2:] == (10, 10) or c[-3:-1] == (10, 10)]
    if second_use:
        assert calls(opt, "relax.layout_transform") == calls(unsunk, "relax.layout_transform")
    else:
        assert calls(opt, "relax.layout_transform") == calls(unsunk, "relax.layout_transform") == 2
        assert len(big) == 2, big  # the model's input and output
    close(run(lowered(opt), xv), run(mod, xv))


def _layout_transforms(mod) -> list:
    """The output shapes of `mod`'s layout transforms."""
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.layout_transform":
            found.append(tuple(int(d) for d in expr.ty.shape.values))

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


@pytest.mark.parametrize("c, o, groups, stride, residual", [
    (72, 72, 3, 1, False),   # RegNetX's 24 channels a group
    (168, 168, 7, 2, False),  # ... at stride 2
    (48, 96, 2, 1, False),   # 24 in, 48 out a group
    (36, 36, 3, 1, True),    # 12 a group (a 12-lane input block), a fused residual
    (40, 40, 2, 1, True),    # 20 a group
    (64, 32, 4, 1, False),   # 16 in, 8 out a group
])
def test_any_group_width_runs_on_our_kernels(c, o, groups, stride, residual):
    """Grouped convs whose groups are neither whole blocks, nor lanes, nor tile a block
    block-diagonally: on the direct family, each group padded to whole blocks between
    transforms of our own (RegNetX-1.6GF's 24-channel groups were 71% of its time on TVM's
    lowering). Between 1x1 convs, with a bias, ReLU and (where the shapes allow) the block's
    input as a fused residual; against TVM's own build of the same module."""
    rng = np.random.default_rng(c + o + groups)
    w = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, 14, 14), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, relax.const(w(c, c, 1, 1))))))
            y = bb.emit(relax.op.nn.conv2d(y, relax.const(w(o, c // groups, 3, 3)), strides=stride, padding=1,
                                           groups=groups))
            y = bb.emit(relax.op.add(y, relax.const(w(1, o, 1, 1))))
            if residual:
                y = bb.emit(relax.op.add(y, x))
            y = bb.emit(relax.op.nn.relu(y))
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(y, relax.const(w(16, o, 1, 1)))))
        bb.emit_func_output(out)
    mod = bb.get()
    report = []
    opt = mkrelax.optimize(mod, HOST, report=report)
    report = convs(report)
    assert [r["runs_on"] for r in report] == ["ours"] * 3, report
    assert report[1]["algorithm"] == "direct" and "relu" in report[1]["post_ops"], report[1]
    assert ("residual" in report[1]["post_ops"]) == residual, report[1]
    xv = rng.standard_normal((1, c, 14, 14)).astype(np.float32)
    want = relax.VirtualMachine(tvm.compile(mod, target=mkrelax.llvm_target(HOST)), tvm.cpu())["main"](
        tvm.runtime.tensor(xv)).numpy()
    close(run(opt, xv), want)


def test_vector_math_activations_fuse_into_the_convs_when_asked(monkeypatch):
    """fusion.FUSE_VECTOR_ACTIVATIONS (off: measured slower on the Zen 3, its comment): on, a
    1x1 conv + bias + SiLU and a depthwise conv + bias + sigmoid take them into their stores
    (no row kernel left), while a 3x3 stride-1 conv, a Winograd candidate, keeps its SiLU apart;
    values as TVM's own build. Off, every activation is a row kernel of its own."""
    from schedules.relax import fusion

    rng = np.random.default_rng(12)
    w = lambda *s: relax.const((rng.standard_normal(s) * 0.3).astype(np.float32))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 10, 10), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.silu(bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(x, w(32, 16, 1, 1))),
                                                             w(1, 32, 1, 1)))))
            y = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(y, w(32, 1, 3, 3), padding=1, groups=32)), w(1, 32, 1, 1)))
            y = bb.emit(relax.op.sigmoid(y))
            out = bb.emit_output(bb.emit(relax.op.nn.silu(bb.emit(relax.op.nn.conv2d(y, w(16, 32, 3, 3), padding=1)))))
        bb.emit_func_output(out)
    mod = bb.get()
    xv = rng.standard_normal((1, 16, 10, 10)).astype(np.float32)
    for fuse in (False, True):
        monkeypatch.setattr(fusion, "FUSE_VECTOR_ACTIVATIONS", fuse)
        report = []
        opt = mkrelax.optimize(mod, HOST, report=report, lower=False)
        posts = [r["post_ops"] for r in convs(report)]
        assert posts == (["bias+silu", "bias+sigmoid", ""] if fuse else ["bias", "bias", ""]), posts
        assert calls(opt, "relax.nn.silu") + calls(opt, "relax.sigmoid") == (1 if fuse else 3)
        close(run(lowered(opt), xv), run(mod, xv))


@pytest.mark.parametrize("extra_use", [False, True])
def test_hardswish_as_the_torch_frontend_writes_it_fuses_into_the_conv(extra_use):
    """x * (clip(x + 3, 0, 6) / 6) after a conv's bias (MobileNetV3's hardswish): the conv's
    post-op "hardswish", no elementwise op left; with x used a third time (added to the output),
    nothing is fused past the bias. A 3x3 stride-1 conv before it (a Winograd candidate) keeps
    it apart. Values as TVM's own build."""
    rng = np.random.default_rng(13)
    w = lambda *s: relax.const((rng.standard_normal(s) * 0.3).astype(np.float32))
    three, six = relax.const(np.float32(3)), relax.const(np.float32(6))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 10, 10), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = []
            for k, pad in ((1, 0), (3, 1)):
                y = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(x, w(32, 16, k, k), padding=pad)), w(1, 32, 1, 1)))
                g = bb.emit(relax.op.clip(bb.emit(relax.op.add(y, three)), 0.0, 6.0))
                h = bb.emit(relax.op.multiply(y, bb.emit(relax.op.divide(g, six))))
                outs.append(bb.emit(relax.op.add(h, y)) if extra_use else h)
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(bb.emit(relax.op.add(*outs)), w(16, 32, 1, 1))))
        bb.emit_func_output(out)
    mod = bb.get()
    xv = rng.standard_normal((1, 16, 10, 10)).astype(np.float32) * 3
    report = []
    opt = mkrelax.optimize(mod, HOST, report=report, lower=False)
    posts = [r["post_ops"] for r in convs(report)]
    assert posts == (["bias", "bias", ""] if extra_use else ["bias+hardswish", "bias", ""]), posts
    assert calls(opt, "relax.divide") == (2 if extra_use else 1)
    close(run(lowered(opt), xv), run(mod, xv))
