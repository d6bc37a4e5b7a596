"""schedules.conv.op: the compiled conv2d's calls on numpy arrays. No copies of aligned operands
(the compiled module is handed the caller's own buffers), out= written in place, TVM tensors
accepted, bind packing once, and the arrays each call refuses."""

import numpy as np
import pytest

import schedules
from schedules import aligned_empty, layouts
from schedules.common.layouts import is_aligned

from ...conftest import Spy, unaligned
from ...x86_exec import HOST

def rand(shape, seed=0):
    a = aligned_empty(shape)
    a[...] = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    return a


def test_run_blocked_hands_the_callers_buffers_to_the_kernel():
    op = schedules.conv2d((1, 32, 9, 9), (32, 32, 3, 3), padding=1, threads=1, bias=True)
    x = rand((1, 32, 9, 9))
    xb, wb, bb = op.to_blocked(x), op.pack_weights(rand((32, 32, 3, 3), 1)), op.pack_bias(rand((32,), 2))
    assert all(is_aligned(a) for a in (xb, wb, bb))  # what the transforms return goes in as it is
    out = aligned_empty(op.blocked_out_shape)
    op.lib = Spy(op.lib)
    got = op.run_blocked(xb, wb, bb, out=out)
    assert got is out
    assert op.lib.seen == [[a.ctypes.data for a in (xb, wb, bb, out)]]
    want = op.run_blocked(unaligned(xb), unaligned(wb), unaligned(bb))  # copied into aligned tensors
    np.testing.assert_array_equal(out, want)


def test_bind_packs_once_and_matches_the_blocked_path():
    op = schedules.conv2d((2, 20, 9, 9), (30, 20, 3, 3), padding=1, threads=1, bias=True, residual=True,
                          activation="relu")
    g = op.geometry
    x, w, b, r = rand((2, 20, 9, 9)), rand((30, 20, 3, 3), 1), rand((30,), 2), rand((2, 30, 9, 9), 3)
    want = op.from_blocked(op.run_blocked(op.to_blocked(x), op.pack_weights(w), op.pack_bias(b),
                                          layouts.to_nchwc(r, g.block, g.groups)))
    f = op.bind(w, b)
    weight = f.weight
    out = aligned_empty(want.shape)
    assert f(x, r, out=out) is out
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(f(x, r), want)
    np.testing.assert_array_equal(op(x, w, b, r), want)
    assert f.weight is weight  # packed once, kept on TVM's side


@pytest.mark.parametrize("stride", [1, 2])
def test_nchw_paths_read_and_write_unaligned_arrays_in_place(stride):
    """The NCHW paths take numpy arrays at any alignment without copying them (their transforms
    assume 4 bytes), out= included; a 1x1 strided layer converts only the pixels it reads."""
    op = schedules.conv2d((1, 32, 10, 10), (48, 32, 1, 1), stride=stride, threads=1)
    x, w = rand((1, 32, 10, 10)), rand((48, 32, 1, 1), 1)
    want = op.from_blocked(op.run_blocked(op.to_blocked(x), op.pack_weights(w)))
    xu, wu = unaligned(x), unaligned(w)
    out = unaligned(np.zeros(want.shape, np.float32))
    f = op.bind(wu)
    assert f(xu, out=out) is out
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(op(xu, wu), want)


# Refused arrays

@pytest.fixture(scope="module")
def small_op():
    return schedules.conv2d((1, 4, 8, 8), (8, 4, 3, 3), padding=1, target=HOST, algorithm="direct")


_X = np.zeros((1, 4, 8, 8), np.float32)
_W = np.zeros((8, 4, 3, 3), np.float32)


@pytest.mark.parametrize("data, weight, exc, msg", [
    (_X.astype(np.float64), _W, TypeError, "data must have dtype float32, got float64"),
    (_X, _W.astype(np.float64), TypeError, "weight must have dtype float32"),
    (np.zeros((1, 4, 8, 9), np.float32), _W, ValueError, r"data must have shape \(1, 4, 8, 8\)"),
    (np.zeros((1, 8, 8, 4), np.float32).transpose(0, 3, 1, 2), _W, ValueError, "data must be C-contiguous"),
    (_X, np.zeros((8, 4, 3, 2), np.float32), ValueError, r"weight must have shape \(8, 4, 3, 3\)"),
    (_X, np.zeros((3, 3, 4, 8), np.float32).transpose(3, 2, 0, 1), ValueError, "weight must be C-contiguous"),
    (_X.tolist(), _W, TypeError, "data must be a numpy.ndarray"),
])
def test_bad_arrays(small_op, data, weight, exc, msg):
    with pytest.raises(exc, match=msg):
        small_op(data, weight)


def test_bad_blocked_arrays(small_op):
    xb, wb = small_op.to_blocked(_X), small_op.pack_weights(_W)
    with pytest.raises(ValueError, match="data must have shape"):
        small_op.run_blocked(_X, wb)  # NCHW where NCHWc is expected
    with pytest.raises(ValueError, match="weight must have shape"):
        small_op.run_blocked(xb, _W)
    with pytest.raises(ValueError, match="out must have shape"):
        small_op.from_blocked(np.zeros((1, 1, 8, 8, 8), np.float32))
