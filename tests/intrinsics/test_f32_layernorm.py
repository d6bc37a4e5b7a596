"""LayerNorm over the last axis (microkernels/f32_layernorm.py through
intrinsics.f32_vmath.layer_norm_func) against float64 numpy: row lengths around the vector
width (whole vectors, a masked tail, less than one vector), rows split into parallel chunks,
large means, NaN rows; and its assembly.

Runs the host's widest x86 ISA (AVX2 on an AVX2-only host: the AVX-512 kernel is then compiled
and its assembly checked, not run)."""

import re

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st

from intrinsics import f32_vmath as iv
from microkernels import AVX2, AVX512, best_host_isa

HOST = best_host_isa()


def layer_norm(x, g, b, eps, threads=2, isa=HOST):
    lib = tvm.compile(tvm.IRModule({"main": iv.layer_norm_func(x.shape, isa, threads, eps)}), target=isa.target)
    y = tvm.runtime.tensor(np.full(x.shape, np.nan, np.float32))
    lib["main"](*(tvm.runtime.tensor(a) for a in (x, g, b)), y)
    return y.numpy()


def reference(x, g, b, eps):
    xd = x.astype(np.float64)
    m = xd.mean(-1, keepdims=True)
    v = ((xd - m) ** 2).mean(-1, keepdims=True)
    return (xd - m) / np.sqrt(v + np.float64(np.float32(eps))) * g + b


def check(x, g, b, eps, **kw):
    got, ref = layer_norm(x, g, b, eps, **kw), reference(x, g, b, eps)
    # The mean carries the sum's rounding, up to about C ulp of the row's largest |x| (a large
    # mean: ConvNeXt's rows are not centred), which the normalization divides by sd; then the
    # variance's and the last four operations' roundings, a few ulp of the output.
    c, xd = x.shape[-1], x.astype(np.float64)
    sd = np.sqrt(xd.var(-1) + np.float32(eps))
    spread = (np.abs(xd).max(-1) / sd).max()
    tol = (8 + 2 * c) * 2.0**-24 * (spread * np.abs(g).max() + np.abs(b).max() + 1)
    np.testing.assert_allclose(got, ref, rtol=0, atol=tol)
    return got


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 40), c=st.integers(1, 130), eps=st.sampled_from([0.0, 1e-6, 1e-5, 0.1]),
       mean=st.sampled_from([0.0, 3.0, -1e3]), threads=st.sampled_from([1, 2]), seed=st.integers(0, 99))
def test_rows_against_float64(rows, c, eps, mean, threads, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, c)) * 2 + mean).astype(np.float32)
    if c == 1 and eps == 0.0:
        eps = 1e-5  # a one-value row has variance 0: 0 / sqrt(0) is NaN, in numpy as here
    check(x, rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32), eps, threads=threads)


@pytest.mark.parametrize("shape", [(1, 56, 56, 96), (2, 7, 768), (3, 9, 100)])
def test_model_shapes_in_parallel_chunks(shape):
    """ConvNeXt's token rows (and a tail of 100 % 8 = 4), large enough to be split into
    chunks of whole rows: every row written, each right."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    c = shape[-1]
    assert iv.describe_layer_norm(shape, HOST, 2).endswith("rows") or np.prod(shape) < iv.SERIAL
    check(x, rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32), 1e-6)


def test_a_nan_spoils_its_row_only():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 37)).astype(np.float32)
    x[2, 5] = np.nan
    got = layer_norm(x, np.ones(37, np.float32), np.zeros(37, np.float32), 1e-5)
    assert np.isnan(got[2]).all() and np.isfinite(np.delete(got, 2, axis=0)).all()


@pytest.mark.parametrize("isa", [AVX2, AVX512], ids=lambda i: i.name)
def test_assembly_packed_and_no_libm(isa):
    """Packed arithmetic on the ISA's registers, the masked tail as vmaskmovps (AVX2) or a
    k-masked move (AVX-512), a vsqrtss and a division for rstd: no call to sqrtf, no
    approximate vrsqrt."""
    mod = tvm.IRModule({"main": iv.layer_norm_func((9, 100), isa, 1, 1e-5)})
    text = tvm.compile(mod, target=isa.target).mod.inspect_source("asm")
    reg = "zmm" if isa is AVX512 else "ymm"
    assert re.search(rf"vfmadd\w+ps\s+.*%{reg}", text) and re.search(rf"vsubps\s+.*%{reg}", text)
    assert "vsqrtss" in text and not re.search(r"vrsqrt|\bcall\s+\S*sqrt", text)
    assert ("vmaskmovps" in text) if isa is AVX2 else re.search(r"vmovups\s+.*\{%k\d\}", text)
