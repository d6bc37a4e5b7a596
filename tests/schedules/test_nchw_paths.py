"""The user paths on numpy arrays: no copies of aligned operands (the compiled module is handed
the caller's own buffers), out= written in place, TVM tensors accepted, and the compiled layout
transforms and weight packing exact against the numpy ones (channel padding, groups)."""

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st

import schedules
from schedules import aligned_empty, layouts
from schedules.common.layouts import is_aligned
from microkernels.isa import best_host_isa

from ..conftest import Spy, unaligned

ISA = best_host_isa()  # the transforms are plain TVM code: the host's ISA is the one they run on


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


@pytest.mark.parametrize("place", [lambda a: a, unaligned], ids=["aligned", "unaligned"])
def test_matmul_hands_the_callers_buffers_to_the_module_at_any_alignment(place):
    """matmul declares A, B and C 4-byte aligned, so even unaligned arrays go in uncopied."""
    op = schedules.matmul(40, 48, 24, threads=1)
    a, b, out = place(rand((40, 24))), place(rand((24, 48), 1)), place(np.zeros((40, 48), np.float32))
    op.lib = Spy(op.lib)
    assert op(a, b, out=out) is out
    assert op.lib.seen[-1] == [a.ctypes.data, b.ctypes.data, out.ctypes.data]
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(op(a, tvm.runtime.tensor(np.ascontiguousarray(b))), out)
    with pytest.raises(ValueError, match=r"shape \(24, 48\)"):
        op(a, tvm.runtime.tensor(np.zeros((48, 24), np.float32)))


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


def test_strided_input_transform_leaves_the_other_pixels_alone():
    x = rand((1, 20, 7, 9))
    got = tvm.runtime.tensor(np.full((1, 2, 7, 9, 16), np.nan, np.float32))
    layouts.compile_to_nchwc(x.shape, 16, 1, ISA, step=(2, 3))(tvm.runtime.tensor(x), got)
    got, want = got.numpy(), layouts.to_nchwc(x, 16)
    np.testing.assert_array_equal(got[:, :, ::2, ::3], want[:, :, ::2, ::3])
    kept = np.ones(got.shape, bool)
    kept[:, :, ::2, ::3] = False
    assert np.isnan(got[kept]).all()


@st.composite
def layouts_cases(draw):
    groups = draw(st.integers(1, 4))
    cg, og = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    return (draw(st.integers(1, 2)), groups * cg, draw(st.integers(1, 6)), draw(st.integers(1, 6)), groups * og,
            draw(st.sampled_from([4, 8, 16])), draw(st.sampled_from([8, 16])), groups, draw(st.integers(1, 3)))


@settings(max_examples=25, deadline=None)
@given(layouts_cases(), st.integers(0, 2**32 - 1))
def test_compiled_transforms_equal_numpy(case, seed):
    n, c, h, w, o, bi, bo, groups, k = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    xb = layouts.to_nchwc(x, bi, groups)
    got = np.full(xb.shape, np.nan, np.float32)
    layouts.compile_to_nchwc(x.shape, bi, groups, ISA)(tvm.runtime.tensor(x), out := tvm.runtime.tensor(got))
    np.testing.assert_array_equal(out.numpy(), xb)  # padding lanes included: zeros, not NaN

    yb = rng.standard_normal(layouts.to_nchwc(np.zeros((n, o, h, w), np.float32), bo, groups).shape, dtype=np.float32)
    back = tvm.runtime.tensor(np.full((n, o, h, w), np.nan, np.float32))
    layouts.compile_from_nchwc(yb.shape, o, groups, ISA)(tvm.runtime.tensor(yb), back)
    np.testing.assert_array_equal(back.numpy(), layouts.from_nchwc(yb, o, groups))

    wt = rng.standard_normal((o, c // groups, k, k), dtype=np.float32)
    want = layouts.pack_weights(wt, bi, bo, groups)
    packed = tvm.runtime.tensor(np.full(want.shape, np.nan, np.float32))
    layouts.compile_pack_weights(wt.shape, bi, bo, groups, ISA)(tvm.runtime.tensor(wt), packed)
    np.testing.assert_array_equal(packed.numpy(), want)
