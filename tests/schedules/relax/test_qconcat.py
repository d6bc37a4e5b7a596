"""schedules.relax.qconcat: a quantized channel concat as one function, each branch requantized
into its slice with ONNX's DequantizeLinear-then-QuantizeLinear arithmetic, bit for bit against
numpy, uint8 and int8, odd channel counts, values saturating at both ends, a branch already at
the join's quantization copied."""

import numpy as np
import pytest
import tvm

from schedules.relax.qconcat import concat_func


def _onnx(x, s, z, so, zo, dtype):
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    real = (x.astype(np.int32) - z).astype(np.float32) * np.float32(s)
    return np.clip(np.rint(real / np.float32(so)) + zo, lo, hi).astype(dtype)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_each_branch_is_requantized_into_its_slice(dtype):
    rng = np.random.default_rng(0)
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    channels = [5, 16, 37, 8]
    so, zo = 0.05, int(rng.integers(lo, hi + 1))
    quant = [(0.2, int(rng.integers(lo, hi + 1))), (so, zo), (0.001, 3), (0.031, int(rng.integers(lo, hi + 1)))]
    xs = [rng.integers(lo, hi + 1, (2, 3, 5, c)).astype(dtype) for c in channels]
    f = tvm.compile(tvm.IRModule({"main": concat_func([x.shape for x in xs], dtype, quant, (so, zo))}), target="llvm")
    out = tvm.runtime.tensor(np.zeros((2, 3, 5, sum(channels)), dtype))
    f(*[tvm.runtime.tensor(x) for x in xs], out)
    want = np.concatenate([_onnx(x, s, z, so, zo, dtype) for x, (s, z) in zip(xs, quant)], axis=3)
    got = out.numpy()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[..., 5:21], xs[1])  # the branch at the join's scale: a copy
    assert lo in got[..., :5] and hi in got[..., :5]  # the 0.2-scale branch saturates both ways
