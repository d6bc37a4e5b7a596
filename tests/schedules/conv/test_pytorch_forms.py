"""F.conv2d's argument forms as PyTorch users write them (issue 24): padding "same" and "valid",
one-element tuples; checked against torch.nn.functional.conv2d itself, in float64."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import schedules

from ...x86_exec import HOST


def _torch(x, w, **kw):
    return F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), **kw).numpy()


def _one(v, as_tuple):
    return (v,) if as_tuple else v


@pytest.mark.filterwarnings("ignore:Using padding=.same. with even kernel lengths")
@settings(max_examples=max(8, settings.default.max_examples // 3), deadline=None)
@given(k=st.tuples(st.integers(1, 5), st.integers(1, 5)), d=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       c=st.integers(1, 20), o=st.integers(1, 20), hw=st.tuples(st.integers(5, 12), st.integers(5, 12)),
       padding=st.sampled_from(["same", "valid"]), tuples=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_padding_strings_match_pytorch(k, d, c, o, hw, padding, tuples, seed):
    """'same' keeps the input's size with PyTorch's split (an odd total pads the bottom and right
    one more), even kernels and dilations included; 'valid' pads nothing. Stride and dilation as
    one-element tuples where `tuples`."""
    if padding == "valid" and any((kk - 1) * dd + 1 > n for kk, dd, n in zip(k, d, hw)):
        return  # PyTorch refuses a kernel larger than the input too
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, c, *hw), dtype=np.float32)
    w = rng.standard_normal((o, c, *k), dtype=np.float32)
    op = schedules.conv2d(x.shape, w.shape, stride=_one(1, tuples), padding=padding, dilation=d, target=HOST,
                          algorithm="direct")
    want = _torch(x, w, stride=1, padding=padding, dilation=d)
    got = op(x, w)
    assert got.shape == want.shape
    if padding == "same":
        assert got.shape[2:] == x.shape[2:]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("kw", [dict(stride=(2,), padding=(1,), dilation=(1,)), dict(stride=(2,), padding=(1, 0)),
                                dict(stride=(1, 2), padding=[2], dilation=[2])])
def test_one_element_tuples_mean_both_axes(kw, rng):
    x = rng.standard_normal((2, 5, 11, 9), dtype=np.float32)
    w = rng.standard_normal((7, 5, 3, 3), dtype=np.float32)
    op = schedules.conv2d(x.shape, w.shape, target=HOST, **kw)
    want = _torch(x, w, **{key: tuple(v) for key, v in kw.items()})
    np.testing.assert_allclose(op(x, w), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_same_is_split_the_way_pytorch_splits_it():
    """A 4x2 kernel: 3 rows of padding, 1 on top and 2 below; 1 column, on the right."""
    from schedules.conv import ConvParams

    assert ConvParams((1, 3, 8, 8), (4, 3, 4, 2), padding="same").padding == (1, 0, 2, 1)
    assert ConvParams((1, 3, 8, 8), (4, 3, 3, 3), padding="same", dilation=(2, 1)).padding == (2, 1, 2, 1)
    assert ConvParams((1, 3, 8, 8), (4, 3, 3, 3), padding="valid").padding == (0, 0, 0, 0)


@pytest.mark.parametrize("algorithm, groups", [("direct", 1), ("auto", 1), ("direct", 4)])
def test_unbatched_input_gives_unbatched_output(algorithm, groups, rng):
    """(C, H, W) in, (O, OH, OW) out, as F.conv2d: through op(x, w), bind, residual and out=."""
    x = rng.standard_normal((8, 14, 14), dtype=np.float32)
    w = rng.standard_normal((8, 8 // groups, 3, 3), dtype=np.float32)
    b = rng.standard_normal(8, dtype=np.float32)
    op = schedules.conv2d(x.shape, w.shape, padding="same", groups=groups, target=HOST, algorithm=algorithm,
                          bias=True, residual=True)
    assert op.user_batch is None
    res = rng.standard_normal((8, 14, 14), dtype=np.float32)
    want = F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), torch.from_numpy(b).double(),
                    padding="same", groups=groups).numpy() + res
    got = op(x, w, b, res)
    assert got.shape == (8, 14, 14)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    out = np.empty_like(got)
    assert op.bind(w, b)(x, res, out=out) is out
    np.testing.assert_array_equal(out, got)
    with pytest.raises(ValueError, match=r"data must have shape \(8, 14, 14\)"):
        op(x[None], w, b, res)


def test_a_batch_of_zero_gives_an_empty_output_without_a_kernel_call(rng, monkeypatch):
    x = np.zeros((0, 3, 9, 9), np.float32)
    w = rng.standard_normal((5, 3, 3, 3), dtype=np.float32)
    op = schedules.conv2d(x.shape, w.shape, stride=2, padding=1, target=HOST)
    monkeypatch.setattr(type(op), "entry", lambda self: pytest.fail("a kernel ran on an empty batch"))
    got = op(x, w)
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=2, padding=1)
    assert got.shape == tuple(want.shape) == (0, 5, 5, 5) and got.dtype == np.float32
    with pytest.raises(ValueError, match=r"data must have shape \(0, 3, 9, 9\)"):
        op(np.zeros((1, 3, 9, 9), np.float32), w)


def test_the_arm_targets_name_the_shapes_they_take():
    with pytest.raises(ValueError, match=r"unbatched input and a batch of 0 are taken by the x86 float32 conv2d"):
        schedules.conv2d((16, 8, 8), (16, 16, 3, 3), dtype="uint8", target="aarch64-neon")
