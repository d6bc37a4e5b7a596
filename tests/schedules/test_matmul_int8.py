"""schedules.matmul(dtype="uint8" / "int8") on x86: bit-exact against int64 numpy on every integer
ISA (natively, or on the Bochs CPU; AVX-VNNI only where the host has it, skipped otherwise, its
tile covered at the kernel level), tails in M, N and K, zero points, the value extremes, refusals."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedules
from microkernels import X86_INT_ISAS
from schedules.matmul_int8 import MAX_K

from ..x86_exec import emulated

TARGETS = ["x86-avx512vnni", "x86-avxvnni", "x86-avx512", "x86-avx2"]


def _emulate(target):
    isa = X86_INT_ISAS[target.removeprefix("x86-")]
    if emulated(isa) and isa.name == "avxvnni":
        pytest.skip("this host has no avx_vnni and the Bochs CPU lacks it: the AVX-VNNI matmul cannot run here")
    return emulated(isa)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_matches_numpy_exactly(target, dtype):
    emulate = _emulate(target)

    @settings(max_examples=6, deadline=None)
    @given(st.integers(1, 40), st.integers(1, 70), st.integers(1, 70), st.integers(0, 2**32 - 1))
    def check(M, N, K, seed):
        rng = np.random.default_rng(seed)
        lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
        zp = int(rng.integers(lo, hi + 1)) if seed % 2 else 0
        op = schedules.matmul(M, N, K, target=target, dtype=dtype, a_zero_point=zp, emulate=emulate)
        a = rng.integers(lo, hi + 1, (M, K)).astype(dtype)
        b = rng.integers(-128, 128, (K, N)).astype(np.int8)
        got = op(a, b)
        assert got.dtype == np.int32 and got.shape == (M, N)
        np.testing.assert_array_equal(got, (a.astype(np.int64) - zp) @ b.astype(np.int64))

    check()


@pytest.mark.parametrize("target", ["x86-avx512vnni", "x86-avx2"])
def test_extremes_near_the_exactness_bound(target):
    """A at its extreme against B at +127 / -128, K close to MAX_K: every partial sum large, none
    wrapped (the zero point makes A - zp reach -255 for int8)."""
    K = MAX_K - 5
    op = schedules.matmul(3, 32, K, target=target, dtype="int8", a_zero_point=127, emulate=_emulate(target))
    a = np.full((3, K), -128, np.int8)
    b = np.where(np.arange(32) % 2 == 0, np.int8(127), np.int8(-128)) * np.ones((K, 1), np.int8)
    want = (a.astype(np.int64) - 127) @ b.astype(np.int64)
    assert abs(want).max() > 2**29
    np.testing.assert_array_equal(op(a, b), want)


def test_pack_b_once_and_why():
    op = schedules.matmul(8, 16, 24, target="x86-avx512vnni", dtype="uint8", emulate=_emulate("x86-avx512vnni"))
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 256, (8, 24)).astype(np.uint8), rng.integers(-128, 128, (24, 16)).astype(np.int8)
    packed = op.pack_b(b)
    np.testing.assert_array_equal(op.run_packed(a, packed), a.astype(np.int64) @ b)
    assert "vpdpbusd" in op.why
    up = schedules.matmul(8, 16, 24, target="x86-avx2", dtype="uint8", emulate=_emulate("x86-avx2"))
    assert "vpmaddwd" in up.why and up.kernel.op == "s16"


@pytest.mark.parametrize("kwargs, err, msg", [
    (dict(dtype="int16"), ValueError, r"dtype 'int16': the quantized matmul takes \('uint8', 'int8'\)"),
    (dict(dtype="uint8", a_zero_point=256), ValueError, r"a_zero_point=256 is out of range for uint8"),
    (dict(dtype="int8", a_zero_point=1.5), TypeError, "a_zero_point must be an int"),
    (dict(a_zero_point=3), ValueError, "a_zero_point applies to the quantized matmul"),
    (dict(dtype="uint8", K=MAX_K + 1), ValueError, f"K={MAX_K + 1} exceeds {MAX_K}"),
    (dict(dtype="uint8", target="aarch64-neon"), ValueError, "matmul runs on x86 targets"),
])
def test_refusals(kwargs, err, msg):
    shape = dict(M=4, N=8, K=kwargs.pop("K", 16))
    with pytest.raises(err, match=msg):
        schedules.matmul(**shape, **{"target": "x86-avx512vnni", **kwargs})


def test_call_checks_its_arrays():
    op = schedules.matmul(4, 8, 16, target="x86-avx2", dtype="uint8", emulate=_emulate("x86-avx2"))
    with pytest.raises(TypeError, match="a must have dtype uint8"):
        op(np.zeros((4, 16), np.int8), np.zeros((16, 8), np.int8))
    with pytest.raises(ValueError, match="b must have shape"):
        op(np.zeros((4, 16), np.uint8), np.zeros((8, 16), np.int8))
