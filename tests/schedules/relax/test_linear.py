"""schedules.relax.linear: matmuls by a constant matrix (Linear layers) on our packed matmul.

Against numpy in float64: x of rank 2 to 4 (ConvNeXt's token form, a classifier's batch-1
GEMV), row counts MR does not divide, K and N of any size, the bias fused on either side of
the add or kept when it broadcasts the result; the report must say ours for each, and a
matmul by a non-constant, by a batch of matrices, or of another dtype must stay on TVM's
lowering with its reason; the packed matmul's K loop prefetches the next panel (compiled for AVX2 and
AVX-512 on any host). The numerics run the host's float ISA only (AVX2 on a Zen 3, AVX-512 where the
host has it): the tiles' numerics on each ISA are tests/intrinsics' and test_matmul's.
"""

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.script import relax as R

from schedules.relax import pipeline


def _build(func, report):
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    return relax.VirtualMachine(pipeline.build(mod, "native", report=report), tvm.cpu())["main"]


def _linear(x_shape, w, bias=None, bias_first=False):
    """main(x) = x @ w (+ bias), as the torch importer writes a Linear."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(w)))
            if bias is not None:
                b = relax.const(bias)
                y = bb.emit(relax.op.add(b, y) if bias_first else relax.op.add(y, b))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()["main"]


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([(1,), (7,), (3, 5), (1, 6, 5)]), st.integers(1, 70), st.integers(1, 50),
       st.sampled_from([None, "after", "before", "row"]), st.integers(0, 2**32 - 1))
def test_a_linear_layer_runs_on_our_matmul_and_matches_numpy(lead, k, n, bias, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*lead, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal((1, n) if bias == "row" else (n,)).astype(np.float32) if bias else None
    report = []
    f = _build(_linear(x.shape, w, b, bias == "before"), report)
    got = f(tvm.runtime.tensor(x)).numpy()
    want = x.astype(np.float64) @ w.astype(np.float64) + (0 if b is None else b.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    (entry,) = [r for r in report if r["op"] == "matmul"]
    assert entry["runs_on"] == "ours", entry
    assert ("bias fused" in entry["reason"]) == (b is not None), entry


def test_convnext_token_mlp_shapes_match_numpy():
    """(1, 56, 56, 96) x (96, 384) + bias: 3136 rows, which 6 does not divide (A packed or 4-row tiles)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 56, 56, 96)).astype(np.float32)
    w = rng.standard_normal((96, 384)).astype(np.float32)
    b = rng.standard_normal(384).astype(np.float32)
    report = []
    got = _build(_linear(x.shape, w, b, True), report)(tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, x.astype(np.float64) @ w + b, rtol=1e-4, atol=1e-3)
    assert [r["runs_on"] for r in report if r["op"] == "matmul"] == ["ours"]


def test_a_bias_that_broadcasts_the_result_is_not_fused():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal((3, 4, 16)).astype(np.float32)  # the sum is (3, 4, 16): not a bias
    report = []
    got = _build(_linear(x.shape, w, b), report)(tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, x @ w + b, rtol=1e-5, atol=1e-5)
    (entry,) = [r for r in report if r["op"] == "matmul"]
    assert entry["runs_on"] == "ours" and "bias fused" not in entry["reason"]


@R.function
def _two_inputs(x: R.Tensor((4, 8), "float32"), y: R.Tensor((8, 16), "float32")) -> R.Tensor((4, 16), "float32"):
    with R.dataflow():
        z = R.matmul(x, y)
        R.output(z)
    return z


@R.function
def _batched(x: R.Tensor((2, 4, 8), "float32")) -> R.Tensor((2, 4, 16), "float32"):
    with R.dataflow():
        z = R.matmul(x, R.const(np.ones((2, 8, 16), np.float32)))
        R.output(z)
    return z


@pytest.mark.parametrize("func, why", [(_two_inputs, "not a constant matrix"), (_batched, "not a constant matrix")])
def test_other_matmuls_stay_on_tvm_with_the_reason(func, why):
    report = []
    f = _build(func, report)
    (entry,) = [r for r in report if r["op"] == "matmul"]
    assert entry["runs_on"] == "tvm" and why in entry["reason"], entry
    rng = np.random.default_rng(2)
    args = [rng.standard_normal([int(d) for d in p.ty.shape]).astype(np.float32) for p in func.params]
    want = np.matmul(*args, *([np.ones((2, 8, 16), np.float32)] if len(args) == 1 else []))
    np.testing.assert_allclose(f(*map(tvm.runtime.tensor, args)).numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa_name", ["avx2", "avx512"])
@pytest.mark.parametrize("m, n, k", [(49, 3072, 768), (1, 1000, 2048)])
def test_the_packed_matmul_prefetches_the_next_panel(isa_name, m, n, k):
    """A model's weights come from memory: where the ISA's entry says it pays (AVX-512), each
    tile call of the packed matmul prefetches the B panel after its own, one prefetcht1 per B
    vector in the K loop, nothing else added; on AVX2 none. Compiled only (both ISAs on any host)."""
    from microkernels import ISAS, PREFETCH_WHOLE_REDUCTIONS, asm
    from schedules.matmul import packed_matmul

    isa = ISAS[isa_name]
    plan, mod = packed_matmul(m, n, k, isa, bias=True)
    assert plan.kernel.prefetch == PREFETCH_WHOLE_REDUCTIONS[isa_name]
    nv = plan.kernel.vectors_per_row
    pf = nv if plan.kernel.prefetch else 0
    loops = asm.fma_loops(tvm.compile(mod, target=isa.target).mod.inspect_source("asm"))
    assert loops, "no FMA loop: the tile was not tensorized"
    for lp in loops:
        # rows: the tile's, or where LLVM drops the zero-padded rows of a 1-row product, fewer
        rows = lp.count("vfmadd") // nv
        assert rows >= 1 and lp.count("vfmadd") == rows * nv, "\n".join(lp.body)
        if rows == 1:  # a GEMV's loop: LLVM folds a B load into an FMA, which the tile check refuses
            assert lp.count("prefetcht1") == pf and not lp.stack_accesses(), "\n".join(lp.body)
            continue
        problems = asm.tile_loop_problems(lp, isa, rows, nv, prefetches=pf)
        assert not problems, f"{lp.label}: {problems}\n" + "\n".join(lp.body)
