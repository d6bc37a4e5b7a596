"""The conv-tile intrinsic: what it refuses, that its description omits unit loops, and the
batch-reduce kernel's store (beta=0 and the fused epilogue) called directly."""

import numpy as np
import pytest

from intrinsics import ConvTile
from intrinsics.f32_conv import description
from microkernels import AVX2, ISAS, GemmKernel, TileError

from ..x86_exec import X86_IDS, execute

BR0 = GemmKernel(AVX2, 6, 16, accumulate=False, batch_reduce=True)


@pytest.mark.parametrize(
    "kern, kwargs, msg",
    [(GemmKernel(AVX2, 6, 16), {}, "needs a batch-reduce kernel"),
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
    text = description(tile)
    # One spatial block per output element, the reduction as plain loops inside it.
    assert "for m, j in T.grid(6, 16)" in text and "for s, i in T.grid(3, 16)" in text
    # A 6-wide output row at stride 2 under a 3-tap kernel dilated by 2 reads (6-1)*2 + (3-1)*2 + 1
    # columns, not 6*2 + 3 - 1.
    assert tile.window == (1, 15)
    assert tile.name == "mk_f32_brgemm_6x16_avx2_beta0_conv_q1_k1x3_c16_s2_d1x2"


def test_a_one_pixel_tile_has_no_pixel_loop():
    """MR = 1 (a row one pixel wide: a conv on a 1x1 map as a GEMV): TIR drops a unit loop, so
    the description has none and writes C's row 0."""
    tile = ConvTile(GemmKernel(AVX2, 1, 16, accumulate=False, batch_reduce=True), nb=15, kh=1, kw=1, bi=16)
    text = description(tile)
    assert "for j in T.grid(16)" in text and " m" not in text.split("T.grid(16)")[0].split("for ")[-1]
    assert "C[0, vj] = C[0, vj] + A[q, 0 * 1, 0 * 1 + 0 * 1, i] * B[q, 0, 0, i, vj]" in text
    assert tile.window == (1, 1)


def test_an_accumulating_tile_adds_to_c_and_applies_its_epilogue_after():
    """The later chunks of a reduction cut into chunks: no zero fill, C + the products, then the
    epilogue once; the beta=0 tile of the same geometry starts from zero."""
    from microkernels import Epilogue

    acc = ConvTile(GemmKernel(AVX2, 6, 16, accumulate=True, batch_reduce=True, epilogue=Epilogue(act="relu")),
                   nb=2, kh=3, kw=3, bi=8)
    text, zeroed = description(acc), description(ConvTile(BR0, nb=2, kh=3, kw=3, bi=8))
    assert "T.float32(0)\n" in zeroed and "C[vm, vj] = T.float32(0)" not in text
    assert "C[vm, vj] = C[vm, vj] + A[q, r * 1, vm * 1 + s * 1, i] * B[q, r, s, i, vj]" in text
    assert text.index("C[vm, vj] + A") < text.index("T.max(T.float32(0), C[vm, vj])")


def _call_kernel_directly(kern, a, b, c, lda, ldb, ldc, k, batches, bias=None, res=None, ldr=0, clip=(0.0, 6.0),
                          groups=(0, 0, 0)):
    """Run a batch-reduce kernel through T.call_extern alone: no TIR description, so nothing
    zeroes C first and what C holds afterwards is the kernel's doing only."""
    import tvm
    from tvm.script import tirx as T

    (n1, sa1), (n2, sa2), (n3, sa3) = batches
    bgs, cgs, rgs = groups  # column-group strides (kern.col_block)
    grouped = kern.col_block > 0  # TVMScript's conditionals take a bool, not an int
    sym, ir = kern.name, kern.llvm_ir()
    ep = kern.epilogue
    bias = np.zeros(1, np.float32) if bias is None else bias
    res = np.zeros(1, np.float32) if res is None else res

    @T.prim_func(s_tir=True)
    def call(A: T.Buffer(a.shape, "float32"), B: T.Buffer(b.shape, "float32"), Bi: T.Buffer(bias.shape, "float32"),
             R: T.Buffer(res.shape, "float32"), C: T.Buffer(c.shape, "float32")):
        with T.attr(0, "pragma_import_llvm", ir):
            # One expression: TVMScript binds a name once, so the list cannot be grown in steps.
            T.evaluate(T.call_extern(
                "void", sym, *([A.access_ptr("r"), lda, B.access_ptr("r"), ldb, C.access_ptr("w"), ldc, k,
                               n1, sa1, n2, sa2, n3, sa3]
                              + ([bgs, cgs] if grouped else [])
                              + ([Bi.access_ptr("r")] if ep.bias else [])
                              + ([R.access_ptr("r"), ldr] + ([rgs] if grouped else []) if ep.residual else [])
                              + ([T.float32(clip[0]), T.float32(clip[1])] if ep.act == "clip" else []))))

    lib = tvm.compile(tvm.IRModule({"main": call}), target=kern.isa.target)
    return execute(lib, kern.isa, [a, b, bias, res, c], [4])[0]


@pytest.mark.parametrize("isa_name", list(ISAS), ids=X86_IDS)
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


@pytest.mark.parametrize("isa_name", list(ISAS), ids=X86_IDS)
@pytest.mark.parametrize("bias, residual, act", [(True, False, None), (False, True, None), (False, False, "relu"),
                                                 (True, True, "relu"), (True, True, "clip"), (False, False, "clip")])
def test_epilogue_is_applied_before_the_one_store(isa_name, bias, residual, act):
    """C = act(sum + bias[j] + R[i, j]) with C prefilled with NaN (a kernel that read C, or
    stored before its epilogue and reloaded, gives NaN or the bare sum); the residual has a row
    stride of its own, wider than NR; guard columns of C stay NaN. Bounds chosen so that the
    activation changes about half the elements."""
    import numpy as np

    from microkernels import Epilogue

    isa = ISAS[isa_name]
    mr, nr = 3, 2 * isa.lanes
    kern = GemmKernel(isa, mr, nr, accumulate=False, batch_reduce=True, epilogue=Epilogue(bias, residual, act))
    k, lda, ldb, ldc, ldr = 4, 6, nr, nr + 3, nr + 7
    rng = np.random.default_rng(5)
    a = rng.standard_normal(mr * lda, dtype=np.float32)
    b = rng.standard_normal((k, ldb), dtype=np.float32)
    bv = rng.standard_normal(nr, dtype=np.float32)
    r = rng.standard_normal((mr, ldr), dtype=np.float32)
    c = np.full((mr, ldc), np.nan, np.float32)
    clip = (-0.5, 0.75)
    got = _call_kernel_directly(kern, a, b.reshape(-1), c.reshape(-1), lda, ldb, ldc, k, ((1, 0), (1, 0), (1, 0)),
                                bv if bias else None, r.reshape(-1) if residual else None, ldr, clip).reshape(mr, ldc)
    want = np.stack([a[m * lda: m * lda + k] for m in range(mr)]).astype(np.float64) @ b[:, :nr].astype(np.float64)
    if bias:
        want = want + bv
    if residual:
        want = want + r[:, :nr]
    if act == "relu":
        want = np.maximum(want, 0)
    elif act == "clip":
        want = np.clip(want, *clip)
    assert not np.isnan(got[:, :nr]).any()
    np.testing.assert_allclose(got[:, :nr], want, rtol=1e-5, atol=1e-5)
    assert np.isnan(got[:, nr:]).all(), "the kernel wrote past its NR columns"
    assert kern.name.endswith(Epilogue(bias, residual, act).suffix)


@pytest.mark.parametrize("isa_name", list(ISAS), ids=X86_IDS)
@pytest.mark.parametrize("residual", [False, True])
def test_column_groups_read_and_write_each_group_at_its_own_offset(isa_name, residual):
    """col_block: a tile of two column groups (two NCHW16c output blocks on AVX-512), each group
    of B, C and the residual at its own offset, in one flat buffer each with NaN between and
    around the groups: any element read or written at the wrong place shows."""
    from microkernels import Epilogue

    isa = ISAS[isa_name]
    g, mr, k = isa.lanes * (2 if isa.name == "avx512" else 1), 5, 6
    nr = 2 * g
    kern = GemmKernel(isa, mr, nr, accumulate=False, batch_reduce=True, col_block=g,
                      epilogue=Epilogue(True, residual, "relu"))
    lda, ldb, ldc, ldr = 7, g, g + 3, g + 5  # each group's rows: B compact, C and R padded
    bgs, cgs, rgs = k * ldb * 2 + 11, mr * ldc + 13, mr * ldr + 17  # group 1 this far after group 0
    rng = np.random.default_rng(11)
    a = rng.standard_normal(mr * lda, dtype=np.float32)
    b = np.full(bgs + k * ldb, np.nan, np.float32)
    r = np.full(rgs + mr * ldr, np.nan, np.float32)
    bv = rng.standard_normal(nr, dtype=np.float32)
    want = np.zeros((mr, nr))
    a64 = np.stack([a[m * lda: m * lda + k] for m in range(mr)]).astype(np.float64)
    for grp in range(2):
        panel = rng.standard_normal((k, g), dtype=np.float32)
        b[grp * bgs: grp * bgs + k * ldb] = panel.reshape(-1)
        res = rng.standard_normal((mr, g), dtype=np.float32)
        for m in range(mr):
            r[grp * rgs + m * ldr: grp * rgs + m * ldr + g] = res[m]
        want[:, grp * g:(grp + 1) * g] = a64 @ panel + bv[grp * g:(grp + 1) * g] + (res if residual else 0)
    want = np.maximum(want, 0)
    c = np.full(cgs + mr * ldc, np.nan, np.float32)
    got = _call_kernel_directly(kern, a, b, c, lda, ldb, ldc, k, ((1, 0), (1, 0), (1, 0)), bv,
                                r if residual else None, ldr, groups=(bgs, cgs, rgs))
    for grp in range(2):
        tile = np.stack([got[grp * cgs + m * ldc: grp * cgs + m * ldc + g] for m in range(mr)])
        np.testing.assert_allclose(tile, want[:, grp * g:(grp + 1) * g], rtol=1e-5, atol=1e-5)
        for m in range(mr):
            got[grp * cgs + m * ldc: grp * cgs + m * ldc + g] = np.nan
    assert np.isnan(got).all(), "the kernel wrote outside its two groups"
    assert "g" + str(g) + "_" in kern.name


def test_column_groups_refusals():
    with pytest.raises(TileError, match="col_block=12 must be a multiple of 8"):
        GemmKernel(AVX2, 2, 16, col_block=12)
    with pytest.raises(TileError, match="at least two groups"):
        GemmKernel(AVX2, 2, 16, col_block=16)


def test_epilogue_refusals():
    from microkernels import Epilogue

    with pytest.raises(TileError, match="activation must be one of"):
        Epilogue(act="exp")  # exp is vector math, but no activation
    with pytest.raises(TileError, match="must be an Epilogue"):
        GemmKernel(AVX2, 6, 16, epilogue="relu")
    with pytest.raises(TileError, match="lo < hi"):
        ConvTile(GemmKernel(AVX2, 6, 16, accumulate=False, batch_reduce=True, epilogue=Epilogue(act="clip")),
                 nb=1, kh=3, kw=3, bi=16, clip=(6, 0))


def _vmap_directly(fn: str, isa, x: np.ndarray) -> np.ndarray:
    """The standalone row kernel of `fn` (microkernels.f32_vmap) over x, called as
    _call_kernel_directly calls a tile."""
    import tvm
    from tvm.script import tirx as T

    from microkernels.f32_vmap import VmapKernel

    kern = VmapKernel(fn, isa)
    n = x.size

    @T.prim_func(s_tir=True)
    def call(X: T.Buffer(x.shape, "float32"), Y: T.Buffer(x.shape, "float32")):
        with T.attr(0, "pragma_import_llvm", kern.llvm_ir()):
            T.evaluate(T.call_extern("void", kern.name, X.access_ptr("r"), Y.access_ptr("w"), T.int64(n)))

    lib = tvm.compile(tvm.IRModule({"main": call}), target=isa.target)
    return execute(lib, isa, [x, np.zeros_like(x)], [1])[0]


@pytest.mark.parametrize("isa_name", list(ISAS), ids=X86_IDS)
@pytest.mark.parametrize("act", ["silu", "sigmoid", "gelu", "gelu_tanh", "tanh", "hardswish", "hardsigmoid"])
def test_a_vector_math_activation_in_the_epilogue_equals_the_row_kernel_bit_for_bit(isa_name, act):
    """The epilogue's SiLU (and the rest of the vector math's activations) is the standalone row
    kernel's code on each output vector: the fused tile's C equals the row kernel applied to the
    unfused tile's C, bit for bit, sums spread to +-100 so that some vectors take the far form
    (|x| > 64 for SiLU and sigmoid, > 8 for GELU) and others the near one."""
    from microkernels import VECTOR_ACTIVATIONS, Epilogue

    assert act in VECTOR_ACTIVATIONS
    isa = ISAS[isa_name]
    mr, nr, k = 5, 2 * isa.lanes, 4
    rng = np.random.default_rng(8)
    a = rng.standard_normal(mr * k, dtype=np.float32)
    b = (rng.standard_normal((k, nr)) * np.where(rng.random(nr) < 0.25, 25.0, 2.0)).astype(np.float32)
    bv = rng.standard_normal(nr, dtype=np.float32)
    outs = {}
    for a_ in (None, act):
        kern = GemmKernel(isa, mr, nr, accumulate=False, batch_reduce=True, epilogue=Epilogue(True, False, a_))
        c = np.full((mr, nr), np.nan, np.float32)
        outs[a_] = _call_kernel_directly(kern, a, b.reshape(-1), c.reshape(-1), k, nr, nr, k,
                                         ((1, 0), (1, 0), (1, 0)), bv).reshape(mr, nr)
    assert np.abs(outs[None]).max() > 64 and (np.abs(outs[None]) < 8).mean() > 0.3
    want = _vmap_directly(act, isa, outs[None].reshape(-1)).reshape(mr, nr)
    np.testing.assert_array_equal(outs[act].view(np.uint32), want.view(np.uint32))
    assert kern.name.endswith(f"_bias_{act}")
