"""The fused expand 1x1 + depthwise block (schedules.conv.inverted): random blocks against the
float64 reference on both x86 targets, bit for bit against the unfused pair of conv2d ops on
the blocked path, both kernels' FMAs in its assembly, refusals."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedules
from microkernels import ISAS, asm
from schedules import ConvBlocking, PostOps
from schedules import inverted_residual

from ...conv_reference import EPS, ref_conv2d
from ...x86_exec import HOST, X86, X86_IDS, on

POSTS = st.builds(PostOps, bias=st.booleans(), activation=st.sampled_from([None, "relu", "clip"]))


@st.composite
def blocks(draw):
    c, t = draw(st.sampled_from([16, 24, 32])), draw(st.sampled_from([1, 6]))
    k = draw(st.sampled_from([3, 3, 5]))
    return {"n": draw(st.integers(1, 2)), "c": c, "e": c * t, "h": draw(st.integers(5, 30)),
            "w": draw(st.integers(5, 30)), "k": k, "stride": draw(st.sampled_from([1, 2])),
            "expand_post": draw(POSTS), "dw_post": draw(POSTS),
            # 8 KiB of "L2": bands of one or a few rows, so the halo carry runs
            "blocking": draw(st.sampled_from([ConvBlocking(), ConvBlocking(l2_bytes=8 * 1024)]))}


def _build(b, **kw):
    return inverted_residual((b["n"], b["c"], b["h"], b["w"]), (b["e"], b["c"], 1, 1), (b["e"], 1, b["k"], b["k"]),
                             b["stride"], b["expand_post"], b["dw_post"], blocking=b["blocking"], **kw)


def _inputs(b, seed):
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.standard_normal(shape, dtype=np.float32)
    return (f(b["n"], b["c"], b["h"], b["w"]), f(b["e"], b["c"], 1, 1), f(b["e"], 1, b["k"], b["k"]), f(b["e"]),
            f(b["e"]))


def _post(v, b, post):
    v = v + b[None, :, None, None] if post.bias else v
    if post.activation == "relu":
        return np.maximum(v, 0)
    return np.clip(v, *post.clip) if post.activation == "clip" else v


@pytest.mark.parametrize("isa", X86, ids=X86_IDS)
def test_block_matches_the_reference(isa):
    @settings(max_examples=max(6, settings.default.max_examples // 5), deadline=None)
    @given(blocks(), st.sampled_from([None, 1, 2]), st.integers(0, 2**32 - 1))
    def check(b, threads, seed):
        _assert_matches_the_reference(_build(b, threads=threads, **on(isa)), b, seed)

    check()


def _assert_matches_the_reference(op, b, seed):
    """The block's output against the float64 reference, within its rounding bound."""
    x, we, wd, be, bd = _inputs(b, seed)
    ep, dp = b["expand_post"], b["dw_post"]
    got = op(x, we, wd, be if ep.bias else None, bd if dp.bias else None)
    dw = {"stride": b["stride"], "padding": b["k"] // 2, "groups": b["e"]}
    y = _post(ref_conv2d(x, we), be, ep)
    want = _post(ref_conv2d(y, wd, **dw), bd, dp)
    # The expand: C products and the bias, one rounding each; its error then passes through
    # the depthwise (|wd| times it; the activations are 1-Lipschitz), which adds K*K + 2
    # roundings of its own.
    tol_y = (b["c"] + 2) * EPS * (ref_conv2d(np.abs(x), np.abs(we))
                                  + (np.abs(be)[None, :, None, None] if ep.bias else 0))
    mag = ref_conv2d(np.abs(y) + tol_y, np.abs(wd), **dw) + (np.abs(bd)[None, :, None, None] if dp.bias else 0)
    tol = ref_conv2d(tol_y, np.abs(wd), **dw) + (b["k"] ** 2 + 2) * EPS * mag + np.finfo(np.float32).tiny
    assert got.shape == want.shape
    err = np.abs(got - want)
    assert (err <= tol).all(), f"worst error {err.max():.3g}, plan {op.plan}"


@settings(max_examples=max(6, settings.default.max_examples // 5), deadline=None)
@given(blocks(), st.integers(0, 2**32 - 1))
def test_block_equals_the_unfused_pair_bit_for_bit(b, seed):
    """The same kernels, each output's reduction in the same order: the expand conv2d (direct,
    1x1) then the depthwise conv2d, both blocked, give exactly the fused block's output, the
    padding lanes of the last block included."""
    _assert_equals_the_unfused_pair(_build(b, target=HOST), b, seed)


@pytest.mark.parametrize("h, w", [(1, 1), (2, 2), (1, 3), (3, 1)])
@pytest.mark.parametrize("stride", [1, 2])
def test_tiny_maps(h, w, stride):
    """The maps at the end of small networks and in SE-like blocks: 1x1, 2x2, 1x3 and 3x1, stride
    1 and 2 (every output row one or two pixels wide, or one row tall; a one-pixel input row's
    expand is the direct conv's 1-row tile). Against the float64 reference and, bit for bit, the
    unfused pair. One-pixel output rows raised ScheduleError ('vectorize') when built."""
    post = PostOps(bias=True, activation="clip")
    b = {"n": 1, "c": 24, "e": 48, "h": h, "w": w, "k": 3, "stride": stride, "expand_post": post, "dw_post": post,
         "blocking": ConvBlocking()}
    op = _build(b, target=HOST)
    assert op.plan.expand_kernel.startswith(f"mk_f32_brgemm_{min(w, op.plan.mr)}x16"), op.plan
    assert (op.plan.dw_kernel is None) == (op.blocked_out_shape[3] == 1), op.plan
    _assert_matches_the_reference(op, b, 7)
    _assert_equals_the_unfused_pair(op, b, 7)


def _assert_equals_the_unfused_pair(op, b, seed):
    ep, dp = b["expand_post"], b["dw_post"]
    n, c, e, h, w, k = (b[key] for key in ("n", "c", "e", "h", "w", "k"))
    expand = schedules.conv2d((n, c, h, w), (e, c, 1, 1), target=HOST, algorithm="direct", bias=ep.bias,
                              activation=ep.activation, clip=ep.clip)
    depthwise = schedules.conv2d((n, e, h, w), (e, 1, k, k), stride=b["stride"], padding=k // 2, groups=e,
                                 target=HOST, bias=dp.bias, activation=dp.activation, clip=dp.clip)
    assert depthwise.plan.algorithm == "depthwise" and expand.blocked_out_shape == depthwise.blocked_data_shape
    x, we, wd, be, bd = _inputs(b, seed)
    xb = op.to_blocked(x)
    np.testing.assert_array_equal(xb, expand.to_blocked(x))
    y = expand.run_blocked(xb, expand.pack_weights(we), expand.pack_bias(be) if ep.bias else None)
    want = depthwise.run_blocked(y, depthwise.pack_weights(wd), depthwise.pack_bias(bd) if dp.bias else None)
    got = op.run_blocked(xb, *op.pack_weights(we, wd), *op.pack_bias(be if ep.bias else None, bd if dp.bias else None))
    np.testing.assert_array_equal(got, want)


def test_both_kernels_fmas_are_in_the_module():
    """Compiled only, for AVX-512 on any host: the expand's K loop is exactly a 28 x 16 tile's
    K step (28 FMAs on zmm with their broadcasts folded, one weight load, no store or stack
    access; LLVM runs the two input blocks' K steps as two such loops), and the depthwise row's MR-pixel step holds MR * 9 FMAs on zmm."""
    isa = ISAS["avx512"]
    clip = PostOps(bias=True, activation="clip")
    op = inverted_residual((1, 32, 28, 28), (192, 32, 1, 1), (192, 1, 3, 3), 1, clip, clip, target="x86-avx512",
                           threads=1)
    assert op.plan.segments == [(0, 1, 28)] and op.plan.expand_kernel.startswith("mk_f32_brgemm_28x16_avx512")
    loops = asm.fma_loops(op.asm)
    tiles = [lp for lp in loops if not asm.tile_loop_problems(lp, isa, 28, 1)]
    assert tiles, [asm.tile_loop_problems(lp, isa, 28, 1) for lp in loops]  # one per input block of 16
    mr = int(op.plan.dw_kernel.split("_")[4].split("x")[0])  # mk_f32_dwconv_3x3_<MR>x16_...
    steps = [lp for lp in loops if lp.count("vfmadd") == mr * 9]
    assert steps, [lp.count("vfmadd") for lp in loops]
    for lp in steps:
        fmas = [i for i in lp.body if i.startswith("vfmadd")]
        assert all("%zmm" in i and "{1to16}" not in i for i in fmas), fmas
        assert not lp.stack_accesses()


def test_several_bands_carry_their_halo():
    """A budget of one output row per band: every band after the first takes K - S rows over
    from the one before (the plan says so), and the result is the one-band block's."""
    shape = ((1, 16, 11, 9), (96, 16, 1, 1), (96, 1, 3, 3))
    small = inverted_residual(*shape, 1, target=HOST, blocking=ConvBlocking(l2_bytes=1024))
    whole = inverted_residual(*shape, 1, target=HOST, blocking=ConvBlocking(l2_bytes=1 << 30))
    assert small.plan.band_rows == 1 and small.plan.halo_rows == 2
    assert whole.plan.band_rows == 11 and whole.plan.halo_rows == 0
    x, we, wd, _, _ = _inputs({"n": 1, "c": 16, "e": 96, "h": 11, "w": 9, "k": 3}, 3)
    np.testing.assert_array_equal(small(x, we, wd), whole(x, we, wd))


@pytest.mark.parametrize("args, match", [
    (((1, 16, 8, 8), (96, 16, 1, 1), (96, 1, 3, 3), 1, PostOps(residual=True)), "not a residual"),
    (((1, 16, 8, 8), (96, 16, 3, 3), (96, 1, 3, 3)), "must be \\(E, 16, 1, 1\\)"),
    (((1, 16, 8, 8), (96, 16, 1, 1), (96, 1, 4, 4)), "K in \\(3, 5\\)"),
    (((1, 16, 8, 8), (96, 16, 1, 1), (48, 1, 3, 3)), "dw_weight_shape"),
    (((1, 16, 8, 8), (96, 16, 1, 1), (96, 1, 3, 3), 3), "stride must be 1 or 2"),
])
def test_refusals(args, match):
    with pytest.raises(ValueError, match=match):
        inverted_residual(*args, target=HOST)


def test_a_call_must_pass_the_biases_it_was_built_for():
    op = inverted_residual((1, 16, 8, 8), (32, 16, 1, 1), (32, 1, 3, 3), expand_post=PostOps(bias=True), target=HOST)
    b = np.zeros(32, np.float32)
    with pytest.raises(ValueError, match="with expand_bias"):
        op.pack_bias(None, None)
    with pytest.raises(ValueError, match="without dw_bias"):
        op.pack_bias(b, b)

    with pytest.raises(ValueError, match="with expand_bias"):
        op.bind(np.zeros((32, 16, 1, 1), np.float32), np.zeros((32, 1, 3, 3), np.float32))


@pytest.mark.parametrize("shape, stride", [((1, 24, 15, 13), 2), ((2, 16, 9, 9), 1)])
def test_bound_block_runs_nchw_arrays_through_compiled_transforms(shape, stride):
    """bind packs once; each call converts NCHW -> NCHW16c and back with compiled code around the
    block: the same output as run_blocked between numpy's transforms, bit for bit, call after
    call, into `out` and from an input that is not 64-byte aligned; E = 72 pads to five blocks, whose
    padding lanes must not reach the NCHW output."""
    n, c, h, w = shape
    e = 72
    post = PostOps(bias=True, activation="clip")
    op = inverted_residual(shape, (e, c, 1, 1), (e, 1, 3, 3), stride, post, post, target=HOST)
    rng = np.random.default_rng(5)
    we, wd = rng.standard_normal((e, c, 1, 1), dtype=np.float32), rng.standard_normal((e, 1, 3, 3), dtype=np.float32)
    be, bd = rng.standard_normal(e, dtype=np.float32), rng.standard_normal(e, dtype=np.float32)
    f = op.bind(we, wd, be, bd)
    packed = op.pack_weights(we, wd) + op.pack_bias(be, bd)
    for _ in range(2):
        x = rng.standard_normal(shape, dtype=np.float32)
        want = op.from_blocked(np.asarray(op.run_blocked(op.to_blocked(x), *packed)))
        got = f(x)
        np.testing.assert_array_equal(got, want)
        assert got.shape == (n, e, *op.blocked_out_shape[2:4])
    unaligned = np.empty(x.size + 1, np.float32)[1:].reshape(shape)  # 4 bytes past an aligned start
    unaligned[...] = x
    out = np.full(want.shape, np.nan, np.float32)
    assert f(unaligned, out=out) is out
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(op(x, we, wd, be, bd), want)

def test_fusing_pays_only_where_the_expanded_map_would_leave_l2():
    """inverted_pays: more than half of L2 for the expanded map (n * E * H * W floats)."""
    from schedules.conv import inverted_pays

    l2 = ConvBlocking(l2_bytes=1 << 20)
    assert inverted_pays((1, 16, 112, 112), 96, l2)  # 4.6 MiB: MobileNetV2's first expand
    assert inverted_pays((1, 32, 28, 28), 192, l2)  # 588 KiB
    assert not inverted_pays((1, 64, 14, 14), 384, l2)  # 294 KiB
    assert not inverted_pays((1, 16, 16, 32), 256, l2)  # exactly half: 512 KiB
    assert inverted_pays((2, 16, 16, 32), 256, l2)  # a batch of two doubles it
