"""The transpose's TensorIntrin (intrinsics/f32_transpose.py): a tile inside larger buffers,
real row strides and unaligned starts, tensorized and run on both ISAs (AVX-512 on the Bochs CPU
where the host lacks it): every bit moved to its transposed place, nothing around it written."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from intrinsics import f32_transpose as itr
from microkernels.f32_transpose import TransposeKernel

from ..x86_exec import X86, X86_IDS, execute


@pytest.mark.parametrize("isa", X86, ids=X86_IDS)
def test_a_tile_in_larger_buffers(isa):
    kern = TransposeKernel(isa)
    n = kern.lanes

    @settings(max_examples=max(6, settings.default.max_examples // 5))
    @given(st.integers(0, 3), st.integers(0, 5), st.integers(0, 9), st.integers(0, 3), st.integers(0, 5),
           st.integers(0, 9), st.integers(0, 2**32 - 1))
    def check(si, sj, s_extra, di, dj, d_extra, seed):
        src_shape, dst_shape = (si + n + 1, sj + n + s_extra), (di + n + 1, dj + n + d_extra)
        rng = np.random.default_rng(seed)
        src = rng.integers(0, 2**32, size=src_shape, dtype=np.uint32).view(np.float32)
        dst = np.full(dst_shape, 7.0, np.float32)
        lib = itr.compile_tile(kern, src_shape, (si, sj), dst_shape, (di, dj))
        got, = execute(lib, isa, [src, dst], [1])
        want = dst.copy()
        want[di:di + n, dj:dj + n] = src[si:si + n, sj:sj + n].T
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))

    check()
