"""schedules.common.layouts: the blocked layouts, the numpy transforms into and out of them, the
compiled transforms (exact against the numpy ones: channel padding, groups, strided 1x1
inputs), and the 64-byte aligned arrays every op hands over without a copy."""

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st

from microkernels.isa import best_host_isa
from schedules.common import layouts

from ...x86_exec import X86, X86_IDS, execute

ISA = best_host_isa()  # the transforms are plain TVM code: the host's ISA is the one they run on


@pytest.mark.parametrize("shape, dtype", [((3, 5), "float32"), (7, "int8"), ((0, 4), "float32"), ((2, 3, 4), "int32")])
def test_aligned_empty_is_aligned_and_contiguous(shape, dtype):
    a = layouts.aligned_empty(shape, dtype)
    assert layouts.is_aligned(a) and a.flags.c_contiguous and a.dtype == np.dtype(dtype)
    assert a.shape == ((shape,) if isinstance(shape, int) else shape)


def test_aligned_keeps_an_aligned_array_and_copies_the_rest():
    a = layouts.aligned_empty((4, 4))
    assert layouts.aligned(a) is a
    b = np.arange(16, dtype=np.float32).reshape(4, 4).T  # not C-contiguous
    c = layouts.aligned(b)
    assert c is not b and layouts.is_aligned(c) and c.flags.c_contiguous
    np.testing.assert_array_equal(c, b)


@given(n=st.integers(1, 2), groups=st.integers(1, 4), cg=st.integers(1, 40), h=st.integers(1, 5),
       w=st.integers(1, 5), block=st.sampled_from([1, 3, 8, 16]), seed=st.integers(0, 2**32 - 1))
def test_layout_round_trip(n, groups, cg, h, w, block, seed):
    rng = np.random.default_rng(seed)
    c = groups * cg
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    xb = layouts.to_nchwc(x, block, groups)
    cb = -(-cg // block)
    assert xb.shape == (n, groups * cb, h, w, block)
    np.testing.assert_array_equal(layouts.from_nchwc(xb, c, groups), x)
    # The padding lanes of each group are zero, and the real ones hold exactly the data.
    by_group = xb.transpose(0, 1, 4, 2, 3).reshape(n, groups, cb * block, h, w)
    assert np.all(by_group[:, :, cg:] == 0)
    assert np.count_nonzero(xb) == np.count_nonzero(x)


def test_packed_weights_round_trip(rng):
    groups, og, cg, kh, kw, bi, bo = 3, 5, 7, 2, 3, 4, 16
    wt = rng.standard_normal((groups * og, cg, kh, kw), dtype=np.float32)
    p = layouts.pack_weights(wt, bi, bo, groups)
    assert p.shape == (groups * 1, 2, kh, kw, bi, bo)
    # (G*OB, IB, KH, KW, i, o) -> (G, OB*o, IB*i, KH, KW)
    full = p.reshape(groups, 1, 2, kh, kw, bi, bo).transpose(0, 1, 6, 2, 5, 3, 4).reshape(groups, bo, 2 * bi, kh, kw)
    np.testing.assert_array_equal(full[:, :og, :cg].reshape(wt.shape), wt)
    assert np.all(full[:, og:] == 0) and np.all(full[:, :, cg:] == 0)


def test_strided_input_transform_leaves_the_other_pixels_alone():
    x = np.random.default_rng(0).standard_normal((1, 20, 7, 9), dtype=np.float32)
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


@pytest.mark.parametrize("isa", X86, ids=X86_IDS)
@pytest.mark.parametrize("shape", [(1, 16, 1, 1), (1, 16, 4, 4), (2, 32, 7, 7), (1, 48, 3, 11), (1, 16, 1, 17),
                                   (1, 32, 8, 8)])
def test_the_transposing_transforms_move_every_bit(isa, shape):
    """Channels in whole blocks take the register transpose (microkernels/f32_transpose.py) both
    ways: every bit pattern (NaNs with payloads, infinities, -0, subnormals) arrives unchanged,
    whole tiles and the pixels past the last one (P % L) alike, and nothing else is written."""
    assert layouts._transposes(isa, 16, shape[1])
    rng = np.random.default_rng(sum(shape))
    x = rng.integers(0, 2**32, size=shape, dtype=np.uint32).view(np.float32)
    want = layouts.to_nchwc(x, 16)
    lib = tvm.compile(layouts.transpose_module(shape, isa, into_blocks=True), target=isa.target)
    got, = execute(lib, isa, [x, np.full(want.shape, 7.0, np.float32)], [1])
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    lib = tvm.compile(layouts.transpose_module(shape, isa, into_blocks=False), target=isa.target)
    back, = execute(lib, isa, [want, np.full(shape, 7.0, np.float32)], [1])
    np.testing.assert_array_equal(back.view(np.uint32), x.view(np.uint32))


@pytest.mark.parametrize("isa", X86, ids=X86_IDS)
@pytest.mark.parametrize("shape", [(16, 16, 1, 1), (32, 48, 1, 1), (48, 32, 1, 1), (64, 256, 1, 1)])
def test_1x1_weights_pack_through_the_transpose_bit_for_bit(isa, shape):
    """A 1x1 layer's OIHW weights, O and C in whole blocks: each 16 x 16 block of (O, C) is one
    transposed tile (four 8 x 8 quadrants on AVX2), every bit kept, nothing else written."""
    rng = np.random.default_rng(sum(shape))
    w = rng.integers(0, 2**32, size=shape, dtype=np.uint32).view(np.float32)
    want = layouts.pack_weights(w, 16, 16, 1)
    lib = tvm.compile(layouts.transpose_weights_module(shape, isa), target=isa.target)
    got, = execute(lib, isa, [w, np.full(want.shape, 7.0, np.float32)], [1])
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
