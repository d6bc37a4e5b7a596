"""schedules.conv.op: the compiled conv2d's calls on numpy arrays. No copies of aligned operands
(the compiled module is handed the caller's own buffers), out= written in place, TVM tensors
accepted, bind packing once, and the arrays each call refuses."""

import numpy as np
import pytest
import tvm

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


# Read-only inputs, and outputs that cannot be written where asked (issue 26)

def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def test_read_only_inputs_go_in_without_a_copy():
    """A read-only array is a valid input (the modules never write their inputs): it reaches the
    module through DLPack 1.0, which can say read-only, still without a copy where aligned."""
    op = schedules.conv2d((1, 32, 9, 9), (32, 32, 3, 3), padding=1, threads=1, bias=True)
    x, w, b = rand((1, 32, 9, 9)), rand((32, 32, 3, 3), 1), rand((32,), 2)
    want = op(x, w, bias=b)
    xb, wb, bb = (_read_only(a) for a in (op.to_blocked(x), op.pack_weights(w), op.pack_bias(b)))
    op.lib = Spy(op.lib)
    out = op.run_blocked(xb, wb, bb)
    assert op.lib.seen[-1][:3] == [a.ctypes.data for a in (xb, wb, bb)]
    np.testing.assert_array_equal(op.from_blocked(out), want)
    x, w, b = (_read_only(a.copy()) for a in (x, w, b))
    np.testing.assert_array_equal(op(x, w, bias=b), want)
    np.testing.assert_array_equal(op.bind(w, bias=b)(x), want)


def test_memory_mapped_read_only_inputs(tmp_path):
    op = schedules.conv2d((1, 16, 6, 6), (16, 16, 3, 3), padding=1, threads=1)
    x, w = rand((1, 16, 6, 6)), rand((16, 16, 3, 3), 1)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "w.npy", w)
    xm, wm = np.load(tmp_path / "x.npy", mmap_mode="r"), np.load(tmp_path / "w.npy", mmap_mode="r")
    assert not xm.flags.writeable
    np.testing.assert_array_equal(op(xm, wm), op(x, w))


def test_an_output_over_an_input_is_refused_where_it_would_be_wrong():
    """run_blocked reads its input while writing out, tile by tile: out over the input or the
    residual (numpy arrays or TVM tensors over the same memory) is refused. The NCHW path reads
    the input into a blocked buffer first, so writing its result over the input is right, and
    allowed."""
    op = schedules.conv2d((1, 16, 8, 8), (16, 16, 3, 3), padding=1, threads=1, bias=True, residual=True)
    x, w, b, r = rand((1, 16, 8, 8)), rand((16, 16, 3, 3), 1), rand((16,), 2), rand((1, 16, 8, 8), 3)
    xb, wb, bb, rb = op.to_blocked(x), op.pack_weights(w), op.pack_bias(b), op.to_blocked(r)
    for name, out in (("data", xb), ("residual", rb), ("data", tvm.runtime.from_dlpack(xb))):
        with pytest.raises(ValueError, match=f"out overlaps {name}"):
            op.run_blocked(xb, wb, bb, rb, out=out)
    want = op(x, w, bias=b, residual=r)
    np.testing.assert_array_equal(op.from_blocked(op.run_blocked(xb, wb, bb, rb)), want)
    y = x.copy()
    assert op(y, w, bias=b, residual=r, out=y) is y
    np.testing.assert_array_equal(y, want)


def test_a_read_only_output_is_refused():
    op = schedules.conv2d((1, 16, 6, 6), (16, 16, 3, 3), padding=1, threads=1)
    x, w = rand((1, 16, 6, 6)), rand((16, 16, 3, 3), 1)
    with pytest.raises(ValueError, match="out is read-only"):
        op.run_blocked(op.to_blocked(x), op.pack_weights(w), out=_read_only(aligned_empty(op.blocked_out_shape)))
    with pytest.raises(ValueError, match="out is read-only"):
        op(x, w, out=_read_only(np.zeros((1, 16, 6, 6), np.float32)))
