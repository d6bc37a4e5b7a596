"""The conv-tile intrinsic: what it refuses, and that its description omits unit loops."""

import pytest

from intrinsics import ConvTile
from intrinsics.f32_conv import render_description
from microkernels import AVX2, ISAS, GemmKernel, TileError

BR0 = GemmKernel(AVX2, 6, 16, accumulate=False, batch_reduce=True)


@pytest.mark.parametrize(
    "kern, kwargs, msg",
    [(GemmKernel(AVX2, 6, 16), {}, "beta=0 batch-reduce"),
     (GemmKernel(AVX2, 6, 16, accumulate=True, batch_reduce=True), {}, "beta=0 batch-reduce"),
     (GemmKernel(AVX2, 1, 16, accumulate=False, batch_reduce=True), {}, "MR must be >= 2"),
     (BR0, {"kh": 0}, "kh must be a positive int"),
     (BR0, {"sw": 1.5}, "sw must be a positive int"),
     (BR0, {"nb": 1, "kh": 1, "kw": 1, "bi": 1}, "more than one element")],
)
def test_bad_tiles_are_refused(kern, kwargs, msg):
    args = {"nb": 2, "kh": 3, "kw": 3, "bi": 16} | kwargs
    with pytest.raises(TileError, match=msg):
        ConvTile(kern, **args)


def test_unit_loops_are_left_out_and_window_is_exact():
    tile = ConvTile(BR0, nb=1, kh=1, kw=3, bi=16, sw=2, dh=1, dw=2)
    assert tile.reduce_axes() == [("s", 3), ("i", 16)]
    text = render_description(tile)
    assert "T.grid(6, 16, 3, 16)" in text
    # A 6-wide output row at stride 2 under a 3-tap kernel dilated by 2 reads (6-1)*2 + (3-1)*2 + 1
    # columns, not 6*2 + 3 - 1.
    assert tile.window == (1, 15)
    assert tile.name == "mk_f32_brgemm_6x16_avx2_beta0_conv_q1_k1x3_c16_s2_d1x2"


def _call_kernel_directly(kern, a, b, c, lda, ldb, ldc, k, batches):
    """Run a batch-reduce kernel through T.call_extern alone: no TIR description, so nothing
    zeroes C first and what C holds afterwards is the kernel's doing only."""
    import tvm
    from tvm.script import tirx as T

    (n1, sa1), (n2, sa2), (n3, sa3) = batches
    sym, ir = kern.name, kern.llvm_ir()

    @T.prim_func(s_tir=True)
    def call(A: T.Buffer(a.shape, "float32"), B: T.Buffer(b.shape, "float32"), C: T.Buffer(c.shape, "float32")):
        with T.attr(0, "pragma_import_llvm", ir):
            T.evaluate(T.call_extern("void", sym, A.access_ptr("r"), lda, B.access_ptr("r"), ldb,
                                     C.access_ptr("w"), ldc, k, n1, sa1, n2, sa2, n3, sa3))

    lib = tvm.compile(tvm.IRModule({"main": call}), target=kern.isa.target)
    tc = tvm.runtime.tensor(c)
    lib(tvm.runtime.tensor(a), tvm.runtime.tensor(b), tc)
    return tc.numpy()


@pytest.mark.parametrize("isa_name", [n for n, isa in ISAS.items() if isa.host_supports()])
def test_beta0_brgemm_overwrites_c_prefilled_with_nan(isa_name):
    """The beta=0 batch-reduce kernel alone, C filled with NaN: every element of the tile must
    come out as the sum over the batch (a kernel that accumulated into C would give NaN), and
    C's guard columns stay NaN. The conv tests cannot see this: their blocks zero C first."""
    import numpy as np

    isa = ISAS[isa_name]
    mr, nr = 4, 2 * isa.lanes
    kern = GemmKernel(isa, mr, nr, accumulate=False, batch_reduce=True)
    k, lda, ldb, ldc = 5, 9, nr + 3, nr + 5
    batches = ((2, 40), (3, 7), (1, 0))  # (count, A offset per step) for the three batch levels
    rng = np.random.default_rng(3)
    a = rng.standard_normal(2 * 40 + 3 * 7 + mr * lda, dtype=np.float32)
    b = rng.standard_normal((2 * 3, k, ldb), dtype=np.float32)  # panels follow one another
    c = np.full((mr, ldc), np.nan, np.float32)
    got = _call_kernel_directly(kern, a, b.reshape(-1), c.reshape(-1), lda, ldb, ldc, k, batches).reshape(mr, ldc)
    want = np.zeros((mr, nr))
    for i1 in range(2):
        for i2 in range(3):
            base = i1 * 40 + i2 * 7
            a_blk = np.stack([a[base + m * lda: base + m * lda + k] for m in range(mr)]).astype(np.float64)
            want += a_blk @ b[i1 * 3 + i2, :, :nr].astype(np.float64)
    assert not np.isnan(got[:, :nr]).any(), "the kernel read C (NaN) instead of overwriting it"
    np.testing.assert_allclose(got[:, :nr], want, rtol=1e-5, atol=1e-5)
    assert np.isnan(got[:, nr:]).all(), "the kernel wrote past its NR columns"
