"""schedules.relax.schedule_rest: the ops around the convs, lowered by TVM and scheduled by us.

Scheduling only reorders, fuses, splits, vectorizes and parallelizes spatial loops, and keeps
each output's reduction loops in their order: every output is computed by the same sequence of
float operations as TVM's own lowering, so the results are compared bit for bit against TVM's
unscheduled build of the same module. Covers the host's ISA only (the rules name no ISA: LLVM
picks the vector width from the target).
"""

import re

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

from schedules import relax as mkrelax

from .test_conv2d import HOST, call_tirs, op_calls

TARGET = mkrelax.llvm_target(HOST)


def module(shape, body, params=()):
    """main(x: shape, *params) = body(bb, x, *params), built with a BlockBuilder."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    pv = [relax.Var(f"p{i}", relax.TensorType(p.shape, "float32")) for i, p in enumerate(params)]
    with bb.function("main", [x, *pv]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(body(bb, x, *pv)))
        bb.emit_func_output(out)
    return bb.get()


def run(mod, *args) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET), tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()


def scheduled(mod, threads=None):
    report = []
    return mkrelax.schedule_rest(mod, threads, report), report


def check(mod, *args, threads=None):
    """Every function ours (or a copy-free view), results equal to TVM's unscheduled build."""
    opt, report = scheduled(mod, threads)
    assert report and all(r["runs_on"] in ("ours", "view") for r in report), report
    np.testing.assert_array_equal(run(opt, *args), run(mod, *args))
    return opt, report


def rng_array(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


@settings(max_examples=8, deadline=None)
@given(c=st.sampled_from([3, 16, 24, 64]), hw=st.integers(5, 20), k=st.sampled_from([2, 3]),
       stride=st.sampled_from([1, 2]), blocked=st.booleans(), seed=st.integers(0, 99))
def test_max_and_avg_pool(c, hw, k, stride, blocked, seed):
    """NCHW and NCHW16c pools (the layout ConvertLayout gives them between blocked convs),
    with padding: the pad block is inlined, the channel block is the vector."""
    rng = np.random.default_rng(seed)
    layout = "NCHW16c" if blocked else "NCHW"
    shape = (1, -(-c // 16), hw, hw, 16) if blocked else (1, c, hw, hw)
    for pool in (relax.op.nn.max_pool2d, relax.op.nn.avg_pool2d):
        mod = module(shape, lambda bb, x, p=pool: p(x, pool_size=k, strides=stride, padding=k // 2, layout=layout))
        _, report = check(mod, rng_array(rng, shape))
        if blocked:
            assert any("vector 16" in r["reason"] for r in report), report


@settings(max_examples=6, deadline=None)
@given(n=st.sampled_from([1, 3]), c=st.sampled_from([16, 40, 1280]), hw=st.sampled_from([1, 7, 10]),
       seed=st.integers(0, 99))
def test_mean_over_h_and_w(n, c, hw, seed):
    rng = np.random.default_rng(seed)
    mod = module((n, c, hw, hw), lambda bb, x: relax.op.mean(x, axis=[2, 3]))
    check(mod, rng_array(rng, (n, c, hw, hw)))
    blocked = (n, c // 8, hw, hw, 8)
    check(module(blocked, lambda bb, x: relax.op.mean(x, axis=[2, 3], keepdims=True)), rng_array(rng, blocked))


@settings(max_examples=8, deadline=None)
@given(batch=st.sampled_from([1, 2, 8]), k=st.sampled_from([7, 64, 1280]), n=st.sampled_from([10, 16, 1000]),
       seed=st.integers(0, 99))
def test_classifier_matmul_plus_bias(batch, k, n, seed):
    """The head as the torch frontend imports nn.Linear: matmul with (K, N) weights, then the
    bias added with the bias first; batch 1 is the GEMV."""
    rng = np.random.default_rng(seed)
    w, b = rng_array(rng, (k, n)), rng_array(rng, (n,))
    mod = module((batch, k), lambda bb, x, w_, b_: relax.op.add(b_, bb.emit(relax.op.matmul(x, w_))), (w, b))
    check(mod, rng_array(rng, (batch, k)), w, b)


def test_elementwise_and_layout_transforms():
    """An add of two maps that follows no conv, then NCHW -> NCHW16c with padding (24
    channels) and back with a slice: one chain of copies and maps."""
    rng = np.random.default_rng(1)
    shape = (1, 24, 9, 9)

    def body(bb, x, y):
        s = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(x, y))))
        blocked = bb.emit(relax.op.layout_transform(s, index_map=lambda n, c, h, w: (n, c // 16, h, w, c % 16),
                                                    pad_value=0.0))
        back = bb.emit(relax.op.layout_transform(blocked, index_map=lambda n, c, h, w, i: (n, c * 16 + i, h, w)))
        return relax.op.strided_slice(back, axes=[1], begin=[0], end=[24])

    y = rng_array(rng, shape)
    check(module(shape, body, (y,)), rng_array(rng, shape), y)


def test_single_thread_plans_stay_serial_and_small_nests_too():
    """threads=1: no parallel region at all; a tiny nest is serial whatever the threads."""
    rng = np.random.default_rng(2)
    shape = (1, 64, 28, 28)
    mod = module(shape, lambda bb, x: relax.op.nn.max_pool2d(x, pool_size=3, strides=2, padding=1))
    _, report = check(mod, rng_array(rng, shape), threads=1)
    assert all("parallel" not in r["reason"] for r in report), report
    _, report = check(mod, rng_array(rng, shape), threads=2)
    assert any("parallel" in r["reason"] for r in report), report
    tiny = module((1, 4), lambda bb, x: relax.op.nn.relu(x))
    _, report = check(tiny, rng_array(rng, (1, 4)), threads=2)
    assert all("parallel" not in r["reason"] for r in report), report


def test_gemv_is_vector_fma_in_the_assembly():
    """The batch-1 classifier: vector FMAs on the weights' rows (ymm or zmm by the target),
    from a parallel region."""
    rng = np.random.default_rng(3)
    w, b = rng_array(rng, (1280, 1000)), rng_array(rng, (1000,))
    mod = module((1, 1280), lambda bb, x, w_, b_: relax.op.add(b_, bb.emit(relax.op.matmul(x, w_))), (w, b))
    opt, _ = check(mod, rng_array(rng, (1, 1280)), w, b, threads=2)
    (name,) = [n for n in call_tirs(opt) if "matmul" in n]
    lib = tvm.compile(tvm.IRModule({"main": opt[name]}), target=TARGET)
    asm = lib.mod.inspect_source("asm")
    assert re.search(r"vfmadd\w+ps\s+.*%[yz]mm", asm), "no packed FMA on ymm/zmm registers"
    assert "TVMBackendParallelLaunch" in asm


def test_what_no_rule_fits_stays_tvms_and_says_why():
    """A symbolic batch: no static extent to split; the function is TVM's, named in the report."""
    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.relu(x)))
        bb.emit_func_output(out)
    mod = bb.get()
    opt, report = scheduled(mod)
    assert [r["runs_on"] for r in report] == ["tvm"] and "symbolic" in report[0]["reason"], report
    xv = np.random.default_rng(4).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_array_equal(run(opt, xv), np.maximum(xv, 0))


def test_scheduled_functions_are_not_fused_again_by_tvm_compile():
    """tvm.compile runs FuseOps again; ours are marked opaque, so two scheduled maps in a row
    stay two functions (fusing would merge their parallel regions' bodies)."""
    shape = (1, 64, 32, 32)
    mod = module(shape, lambda bb, x: relax.op.nn.relu(bb.emit(relax.op.nn.max_pool2d(x, pool_size=2, strides=2))))
    opt, report = scheduled(mod)
    names = sorted(r["op"] for r in report)
    with TARGET:
        again = relax.transform.FuseTIR()(relax.transform.FuseOps()(relax.transform.AnnotateTIROpPattern()(opt)))
    assert sorted(gv.name_hint for gv, f in again.functions_items() if gv.name_hint != "main") == names


@pytest.mark.parametrize("lower", [True, False])
def test_optimize_lowers_the_rest_unless_asked_not_to(lower):
    rng = np.random.default_rng(5)
    w = rng_array(rng, (32, 16, 3, 3))
    shape = (1, 16, 10, 10)
    mod = module(shape, lambda bb, x, w_: relax.op.mean(bb.emit(relax.op.nn.conv2d(x, w_, padding=1)), axis=[2, 3]),
                 (w,))
    report = []
    opt = mkrelax.optimize(mod, HOST, params={"p0": w}, report=report, lower=lower)
    rest = [r for r in report if r["op"] != "conv2d"]
    ops = {c.op.name for c in op_calls(opt["main"])}
    if lower:
        assert rest and all(r["runs_on"] in ("ours", "view") for r in rest), report
        assert ops == {"relax.call_tir"}, ops
    else:
        assert not rest and "relax.mean" in ops
    xv = rng_array(rng, shape)
    got = run(opt, xv)
    np.testing.assert_allclose(got, run(mod, xv, w), rtol=1e-5, atol=1e-5)


def test_transcendental_maps_on_our_vector_math():
    """sigmoid, SiLU, GELU and exp legalized to intrinsics.f32_vmath (not TVM's scalar expf and
    its 1 + erf GELU): calls of our row kernels, each in the report, within the functions' bounds of
    float64, no libm call in the module. TVM's GELU is off by far more in the tail (checked)."""
    from scipy import special

    from microkernels import f32_vmath as vm

    from ...intrinsics.test_f32_vmath import ulp_error

    shape = (1, 3, 40, 40)
    mod = module(shape, lambda bb, x: relax.op.concat([
        relax.op.nn.silu(x), relax.op.nn.gelu(relax.op.multiply(x, relax.const(4.0))),
        relax.op.add(relax.op.sigmoid(x), relax.const(1.0)), relax.op.exp(x)], axis=1))
    opt, report = scheduled(mod)
    assert report and all(r["runs_on"] in ("ours", "view") for r in report), report
    kernels = sorted(r["reason"].split(",")[0] for r in report if r["reason"].startswith("vector math"))
    assert [k.split("_")[3] for k in kernels] == ["exp", "gelu", "sigmoid", "silu"], report
    x = (np.random.default_rng(3).standard_normal(shape) * 6).astype(np.float32)
    got = run(opt, x)
    x64 = x.astype(np.float64)
    ref = np.concatenate([x64 * special.expit(x64), 4 * x64 * 0.5 * special.erfc(-4 * x64 / np.sqrt(2)),
                          special.expit(x64) + 1, np.exp(x64)], axis=1)
    bounds = [vm.ULP_BOUND["silu"], vm.ULP_BOUND["gelu"], vm.ULP_BOUND["sigmoid"] + 1, vm.ULP_BOUND["exp"]]
    for i, bound in enumerate(bounds):
        part = slice(3 * i, 3 * i + 3)
        assert ulp_error(got[:, part], ref[:, part]).max() <= bound + 0.5, i  # + the multiply's or add's rounding
    tvm_gelu = run(mod, x)[:, 3:6]
    assert ulp_error(tvm_gelu, ref[:, 3:6]).max() > 100  # the cancelling 1 + erf
    prims = tvm.IRModule({n: opt[n] for n in call_tirs(opt)})
    text = tvm.compile(prims, target=TARGET).mod.inspect_source("asm")
    assert re.search(r"vfmadd\w+ps\s+.*%[yz]mm", text), "no packed FMA"
    assert not re.search(r"\b(call|jmp)\s+\S*(expf|erff|exp|erf)\b", text)


def test_tanh_and_tanh_gelu_of_a_torch_model_on_our_vector_math():
    """A PyTorch model with tanh and GELU's tanh form (its approximate="tanh", relax.nn.gelu_tanh):
    both legalized to our row kernels (the report names them), within their bounds of float64, and
    equal to eager PyTorch to its own accuracy: eager's 1 + tanh(z) cancels in the negative tail
    (absolute errors of about |x| 2^-24, -0 where the GELU is -1e-13), ours does not."""
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    from microkernels import f32_vmath as vm

    from ...intrinsics.test_f32_vmath import reference, ulp_error

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.cat([torch.tanh(x), torch.nn.functional.gelu(x * 3, approximate="tanh")], 1)

    x = (np.random.default_rng(11).standard_normal((1, 4, 20, 20)) * 2).astype(np.float32)
    with torch.no_grad():
        want = Model()(torch.from_numpy(x)).numpy()
        mod = from_exported_program(torch.export.export(Model(), (torch.from_numpy(x),)), keep_params_as_input=False)
    opt, report = scheduled(mod)
    kernels = sorted(r["reason"].split(",")[0].split(": ")[1] for r in report if r["reason"].startswith("vector math"))
    assert [k.split("_", 3)[3].rsplit("_", 1)[0] for k in kernels] == ["gelu_tanh", "tanh"], report
    out = relax.VirtualMachine(tvm.compile(opt, target=TARGET), tvm.cpu())["main"](tvm.runtime.tensor(x))
    got = out[0].numpy()  # the exported program returns a tuple
    x3 = x * np.float32(3)
    for part, name, arg in ((slice(0, 4), "tanh", x), (slice(4, 8), "gelu_tanh", x3)):
        assert ulp_error(got[:, part], reference(name, arg)).max() <= vm.ULP_BOUND[name], name
        np.testing.assert_allclose(got[:, part], want[:, part], rtol=1e-6, atol=4e-6 if name == "gelu_tanh" else 0)
    assert ulp_error(want[:, 4:], reference("gelu_tanh", x3)).max() > 1e6  # eager's cancellation


def test_vector_math_read_at_two_positions():
    """A consumer that reads the map at two positions (shifted by one, so neither read is aligned
    to a vector) gets the right values at both: the map runs once over the whole tensor, with a
    masked tail (33 values a row, 1056 in all), and the slices read its output."""
    from microkernels import f32_vmath as vm

    shape = (1, 4, 8, 33)

    def body(bb, x):
        y = relax.op.nn.silu(x)
        left = relax.op.strided_slice(y, axes=[3], begin=[0], end=[32])
        right = relax.op.strided_slice(y, axes=[3], begin=[1], end=[33])
        return relax.op.subtract(right, left)

    opt, report = scheduled(module(shape, body))
    assert report and all(r["runs_on"] in ("ours", "view") for r in report), report
    assert any(r["reason"].startswith("vector math: mk_f32_vmap_silu") for r in report), report
    x = (np.random.default_rng(5).standard_normal(shape) * 8).astype(np.float32)
    s = vm.evaluate(vm.NumpyOps(), "silu", x)
    np.testing.assert_array_equal(run(opt, x), s[..., 1:] - s[..., :-1])


def test_silu_written_as_x_times_sigmoid_is_one_silu():
    """x * sigmoid(x) (ONNX's SiLU) in either order becomes one SiLU kernel, results as the
    SiLU kernel's bit for bit; a product with another tensor's sigmoid stays two ops."""
    from microkernels import f32_vmath as vm

    shape = (1, 2, 9, 11)

    def body(bb, x):
        a = bb.emit(relax.op.multiply(x, relax.op.sigmoid(x)))
        b = bb.emit(relax.op.multiply(relax.op.sigmoid(x), x))
        other = bb.emit(relax.op.multiply(relax.op.add(x, relax.const(1.0)), relax.op.sigmoid(x)))
        return relax.op.concat([a, b, other], axis=1)

    opt, report = scheduled(module(shape, body))
    kernels = [r["reason"].split(",")[0].split(": ")[1] for r in report if r["reason"].startswith("vector math")]
    assert {k.split("_")[3] for k in kernels} == {"sigmoid", "silu"}, report  # the third product keeps its sigmoid
    x = (np.random.default_rng(7).standard_normal(shape) * 8).astype(np.float32)
    got = run(opt, x)
    silu = vm.evaluate(vm.NumpyOps(), "silu", x)
    np.testing.assert_array_equal(got[:, 0:2], silu)
    np.testing.assert_array_equal(got[:, 2:4], silu)
    np.testing.assert_array_equal(got[:, 4:6], (x + np.float32(1)) * vm.evaluate(vm.NumpyOps(), "sigmoid", x))


@pytest.mark.parametrize("shape, axes, ours", [
    ((1, 14, 14, 96), [-1], True),  # ConvNeXt's tokens, NHWC
    ((2, 50, 40), [2], True),  # a tail of 40 % 16 on AVX-512, none on AVX2
    ((1, 8, 6, 6), [1], False),  # over channels in NCHW: TVM's legalization, scheduled by the rules
    ((3, 5, 7), [1, 2], False),  # over two axes
    # Over every axis (ONNX's LayerNormalization with axis 0): the mean and variance are 0-d
    # buffers, which the rules' output-dimension lookup raised an IndexError on.
    ((4, 5), [0, 1], False), ((2, 3, 4, 5), [0, 1, 2, 3], False),
])
def test_layer_norm_over_the_last_axis_on_our_row_kernel(shape, axes, ours):
    """relax.nn.layer_norm over the last axis is the row kernel (the report says so), equal to
    TVM's own lowering within a few ulp of the output (the sums' order differs); any other
    layer norm stays TVM's, scheduled by the rules, and the report says nothing of the kernel."""
    rng = np.random.default_rng(5)
    norm = [shape[a] for a in axes]
    g, b = rng_array(rng, norm), rng_array(rng, norm)
    mod = module(shape, lambda bb, x: relax.op.nn.layer_norm(x, relax.const(g), relax.const(b), axes=axes,
                                                             epsilon=1e-6))
    opt, report = scheduled(mod)
    assert all(r["runs_on"] in ("ours", "view") for r in report), report
    kernels = [r["reason"] for r in report if r["reason"].startswith("layer norm")]
    assert bool(kernels) == ours, report
    if ours:
        assert kernels[0].startswith(f"layer norm: mk_f32_layernorm_c{shape[-1]}_"), kernels
    x = (rng.standard_normal(shape) * 3 + 2).astype(np.float32)
    np.testing.assert_allclose(run(opt, x), run(mod, x), rtol=0, atol=2e-5 * (np.abs(g).max() + np.abs(b).max()))


def test_repeated_shapes_share_one_function():
    """A model repeats its shapes: each (op, shape) is one function, called at every place, and
    every call computes its own input (two layer norms of one shape with other gammas)."""
    shape = (1, 6, 6, 24)
    rng = np.random.default_rng(6)
    g1, g2, b = rng_array(rng, (24,)), rng_array(rng, (24,)), rng_array(rng, (24,))

    def body(bb, x):
        a = bb.emit(relax.op.nn.silu(x))
        c = bb.emit(relax.op.nn.silu(relax.op.multiply(a, relax.const(2.0))))
        d = bb.emit(relax.op.nn.silu(relax.op.reshape(c, (36, 24))))
        n1 = bb.emit(relax.op.nn.layer_norm(a, relax.const(g1), relax.const(b), axes=[-1]))
        n2 = bb.emit(relax.op.nn.layer_norm(c, relax.const(g2), relax.const(b), axes=[-1]))
        return relax.op.concat([n1, n2, relax.op.reshape(d, shape)], axis=0)

    mod = module(shape, body)
    opt, report = scheduled(mod)
    ours = sorted(r["reason"].split(":")[0] for r in report if r["reason"].startswith(("vector math", "layer norm")))
    assert ours == ["layer norm", "vector math", "vector math"], report  # silu at two shapes, one layer norm
    names = [gv.name_hint for gv, f in opt.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len([n for n in names if n.startswith(("mk_silu", "mk_layer_norm"))]) == 3, names
    x = rng_array(rng, shape)
    np.testing.assert_allclose(run(opt, x), run(mod, x), rtol=0, atol=1e-4)
