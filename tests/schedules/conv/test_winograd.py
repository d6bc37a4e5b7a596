"""schedules.conv2d(algorithm="winograd"): numerics against float64 with a bound derived from the
transform matrices, the blocked path, its plan, and the layers it refuses.

Runs on this host's best ISA only (AVX-512 Winograd is compiled by the asm tests but not run
on a host without AVX-512).
"""

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st

import schedules
from microkernels import ISAS, asm
from microkernels import f32_wino as wino
from schedules.conv import ConvParams, Geometry, winograd
from schedules.conv.geometry import segments

from ... import conv_reference
from ...conv_reference import EPS
from ...x86_exec import HOST


def winograd_bound(x, w, m, padding):
    """Elementwise error bound of float32 Winograd F(m, 3) against the exact conv.

    Every output is A^T [sum_c (G g_c G^T) * (B^T d_c B)] A over its tile. Whatever the order
    of the additions, each stage's rounding is within u = eps/2 of that stage's magnitudes, so
    |error| <= n * u * |A^T| [sum_c (|G||g_c||G^T|) * (|B^T||d_c||B|)] |A|, where n counts the
    roundings on the longest chain: 2*alpha in the input transform, 1 for G's float32 result
    (computed in float64), 1 for the product, C for the sum over channels, 2*alpha in the output
    transform. We allow eps (2u) per rounding, as the direct conv's bound does.
    """
    at, g, bt = (np.abs(wino.as_array(mat)) for mat in wino.matrices(m))
    alpha = m + 2
    t, l, b, r = conv_reference.pads(padding)
    n, c, h, wd = x.shape
    oh, ow = h + t + b - 2, wd + l + r - 2
    th, tw = -(-oh // m), -(-ow // m)
    xp = np.zeros((n, c, th * m + 2, tw * m + 2))
    xp[:, :, t:t + h, l:l + wd] = np.abs(x[:, :, :th * m + 2 - t, :tw * m + 2 - l])
    patches = np.lib.stride_tricks.sliding_window_view(xp, (alpha, alpha), axis=(2, 3))[:, :, ::m, ::m]
    v = np.einsum("xi,nctsij,yj->nctsxy", bt, patches, bt)
    u = np.einsum("xk,ockl,yl->ocxy", g, np.abs(w.astype(np.float64)), g)
    mm = np.einsum("ocxy,nctsxy->notsxy", u, v)
    y = np.einsum("ix,notsxy,jy->notisj", at, mm, at).reshape(n, w.shape[0], th * m, tw * m)[:, :, :oh, :ow]
    rounds = 4 * alpha + c + 2
    return rounds * EPS * y + np.finfo(np.float32).tiny


def check(m, data_shape, weight_shape, padding, rng, threads=None, blocking=None):
    x = rng.standard_normal(data_shape, dtype=np.float32)
    w = rng.standard_normal(weight_shape, dtype=np.float32)
    op = schedules.conv2d(data_shape, weight_shape, padding=padding, algorithm="winograd", tile=m,
                          target=HOST, threads=threads, blocking=blocking or schedules.ConvBlocking())
    got = op(x, w)
    ref = conv_reference.conv2d(x.astype(np.float64), w.astype(np.float64), padding=padding)
    assert got.shape == ref.shape and got.dtype == np.float32
    tol = winograd_bound(x, w, m, padding)
    err = np.abs(got - ref)
    bad = err > tol
    assert not bad.any(), f"{bad.sum()} of {bad.size} off; worst {err.max():.3g} vs bound {tol.flat[np.argmax(err)]:.3g}"
    return op, x, w, got


@given(m=st.sampled_from(sorted(wino.POINTS)), n=st.integers(1, 2), c=st.integers(1, 40), o=st.integers(1, 40),
       h=st.integers(1, 17), w=st.integers(1, 17), pad=st.tuples(*[st.integers(0, 2)] * 4),
       seed=st.integers(0, 2**16))
@settings(max_examples=25)
def test_matches_reference_within_bound(m, n, c, o, h, w, pad, seed):
    """Random sizes: partial tiles at the right and bottom, asymmetric padding, channel counts
    that are not multiples of 16 (or below it), batches."""
    t, l, b, r = pad
    if h + t + b < 3 or w + l + r < 3:
        return  # no output: geometry() refuses it (tested below)
    check(m, (n, c, h, w), (o, c, 3, 3), pad, np.random.default_rng(seed))


@pytest.mark.parametrize("m", sorted(wino.POINTS))
def test_resnet_like_layer_and_threads(m, rng):
    op, *_ = check(m, (1, 64, 20, 20), (48, 64, 3, 3), 1, rng, threads=2)
    assert op.plan["algorithm"] == "winograd" and op.plan["tile"] == m
    # Two threads split the bands when there are two, the output blocks otherwise.
    assert op.plan["band_parallel"] == (op.plan["bands"] >= 2) != op.plan["block_parallel"], op.plan


def test_one_band_on_two_threads_splits_its_input_transform_too(rng):
    """One band, two threads: they split the output blocks, and the band's pack and input
    transform before them split the input blocks (parallel loops, not one thread while the
    other waits). The result is the one-thread result, bit for bit."""
    from tvm import s_tir, tirx

    shapes = (1, 48, 14, 14), (32, 48, 3, 3)
    g = Geometry.of(ConvParams(*shapes, padding=1))
    mod, plan = winograd.schedule(g, ISAS["avx2"], 2, schedules.PostOps(), schedules.ConvBlocking(), 2, "test")
    assert plan.bands == 1 and plan.block_parallel
    sch = s_tir.Schedule(mod)
    for block in ("pack", "wino_in_o"):
        kinds = [sch.get(lp).kind for lp in sch.get_loops(sch.get_sblock(block))]
        assert kinds[1] == tirx.ForKind.PARALLEL, (block, kinds)
    x, w = (rng.standard_normal(s, dtype=np.float32) for s in shapes)
    one, two = (schedules.conv2d(*shapes, padding=1, algorithm="winograd", tile=2, target=HOST, threads=t)
                for t in (1, 2))
    np.testing.assert_array_equal(two(x, w), one(x, w))


@pytest.mark.parametrize("m", sorted(wino.POINTS))
@pytest.mark.parametrize("threads", [1, 2])
def test_several_bands_share_their_halo(m, threads, rng):
    """A budget small enough for several bands whatever the host's L2: each band's input starts
    m*VT rows below the previous one's and reads 2 rows past its end (the 3x3 halo), padding
    included at the top and bottom band."""
    op, *_ = check(m, (1, 32, 23, 21), (20, 32, 3, 3), (1, 2, 2, 1), rng, threads=threads,
                   blocking=schedules.ConvBlocking(l2_bytes=16 * 1024))
    assert op.plan.bands >= 3, op.plan


def test_blocked_path_chains_with_direct(rng):
    """Same NCHW16c layouts as the direct conv: its blocked output feeds a direct layer."""
    x = rng.standard_normal((1, 32, 12, 12), dtype=np.float32)
    w1 = rng.standard_normal((32, 32, 3, 3), dtype=np.float32)
    w2 = rng.standard_normal((16, 32, 1, 1), dtype=np.float32)
    wg = schedules.conv2d(x.shape, w1.shape, padding=1, algorithm="winograd", tile=4, target=HOST)
    d = schedules.conv2d((1, 32, 12, 12), w2.shape, target=HOST)
    assert wg.blocked_out_shape == d.blocked_data_shape
    y = d.from_blocked(d.run_blocked(wg.run_blocked(wg.to_blocked(x), wg.pack_weights(w1)), d.pack_weights(w2)))
    ref = conv_reference.conv2d(conv_reference.conv2d(x.astype(np.float64), w1.astype(np.float64), padding=1),
                                w2.astype(np.float64))
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-3 * np.abs(ref).max())


def test_packed_weights_shape_and_bytes(rng):
    op = schedules.conv2d((1, 20, 8, 8), (18, 20, 3, 3), padding=1, algorithm="winograd", tile=6, target=HOST)
    assert op.blocked_weight_shape == (2, 8, 8, 32, 16)  # O and C padded to blocks; alpha = 8
    u = op.pack_weights(rng.standard_normal((18, 20, 3, 3), dtype=np.float32))
    assert u.shape == op.blocked_weight_shape and u.dtype == np.float32
    assert op.plan["weight_bytes"] == u.nbytes
    assert not u[:, :, :, 20:].any() and not u.reshape(2, 8, 8, 32 * 16)[1, :, :, :].reshape(8, 8, 32, 16)[..., 2:].any()


@pytest.mark.parametrize("m", sorted(wino.POINTS))
@pytest.mark.parametrize("o, c", [(18, 20), (32, 16), (5, 3)])
def test_the_compiled_weight_transform_equals_numpys_within_one_ulp(rng, m, o, c):
    """op(x, w) and bind transform the weights with a compiled module (weight_packer), the Relax
    pass with numpy (pack_weights): both sum in float64 and round once, in different orders, so
    they agree to the last bit but for rare ties of the rounding (F(4)'s sixths: 0.08% of the
    values one ulp apart); every element written, padding channels zero; and op(x, w) through
    it matches the blocked path on numpy's weights."""
    op = schedules.conv2d((1, c, 9, 9), (o, c, 3, 3), padding=1, algorithm="winograd", tile=m, target=HOST)
    w = rng.standard_normal((o, c, 3, 3), dtype=np.float32) * 10
    want = op.pack_weights(w)
    got = tvm.runtime.empty(op.blocked_weight_shape, "float32")
    got.copyfrom(np.full(op.blocked_weight_shape, np.nan, np.float32))  # every element must be written
    op.weight_packer()(tvm.runtime.tensor(w), got)
    np.testing.assert_array_max_ulp(got.numpy(), want, maxulp=1)
    by_output = got.numpy().transpose(0, 4, 1, 2, 3).reshape(-1, *got.shape[1:4])  # (blocks * 16, a, a, C)
    assert not by_output[o:].any() and not by_output[..., c:].any()  # the padding channels
    x = rng.standard_normal((1, c, 9, 9), dtype=np.float32)
    np.testing.assert_allclose(op(x, w), op.from_blocked(op.run_blocked(op.to_blocked(x), want)), rtol=1e-5,
                               atol=1e-5 * np.abs(w).max() * np.abs(x).max() * c * 9)


@pytest.mark.parametrize("kw, why", [
    (dict(stride=2), "stride 1"),
    (dict(dilation=2), "dilation 1"),
    (dict(groups=2), "groups = 1"),
])
def test_unsupported_layers_refused(kw, why):
    with pytest.raises(ValueError, match=f"winograd.*needs {why}"):
        schedules.conv2d((1, 8, 16, 16), (8, 8 // kw.get("groups", 1), 3, 3), padding=2, algorithm="winograd",
                         target=HOST, **kw)


def test_bad_kernel_tile_and_algorithm_refused():
    with pytest.raises(ValueError, match="needs a 3x3 kernel, got 5x5"):
        schedules.conv2d((1, 8, 16, 16), (8, 8, 5, 5), algorithm="winograd", target=HOST)
    with pytest.raises(ValueError, match=r"tile must be one of \(2, 4, 6\)"):
        schedules.conv2d((1, 8, 16, 16), (8, 8, 3, 3), algorithm="winograd", tile=3, target=HOST)
    with pytest.raises(ValueError, match="tile=4 applies to algorithm='winograd' only"):
        schedules.conv2d((1, 8, 16, 16), (8, 8, 3, 3), tile=4, target=HOST)
    with pytest.raises(ValueError, match="'fft' is not available"):
        schedules.conv2d((1, 8, 16, 16), (8, 8, 3, 3), algorithm="fft", target=HOST)


def test_geometry_refusal_precedes_winograd():
    with pytest.raises(ValueError, match="larger than the padded input"):
        schedules.conv2d((1, 8, 2, 2), (8, 8, 3, 3), algorithm="winograd", target=HOST)
    assert Geometry.of(ConvParams((1, 8, 2, 2), (8, 8, 3, 3), padding=1)).out_hw == (2, 2)


@pytest.mark.parametrize("hw, want", [(56, 4), (28, 4), (14, 2), (7, None)])
def test_auto_follows_the_measured_rule(hw, want):
    """ResNet-50's 3x3 stride-1 maps: F(4) down to 28x28, F(2) at 14x14, direct at 7x7 (the
    measurements behind it are in winograd.choose); it is the default for float32."""
    g = Geometry.of(ConvParams((1, 16, hw, hw), (16, 16, 3, 3), padding=1))
    tile, reason, source = winograd.choose(g, HOST[4:])
    assert tile == want and source == "defaults", reason
    op = schedules.conv2d((1, 16, hw, hw), (16, 16, 3, 3), padding=1, target=HOST)  # algorithm="auto"
    assert op.plan["algorithm"] == ("direct" if want is None else "winograd"), op.plan
    assert op.plan.get("tile") == want and op.plan["reason"] == reason and op.plan["source"] == "defaults"


@pytest.mark.parametrize("kw, why", [(dict(stride=2), "stride 1"), (dict(weight_shape=(8, 8, 1, 1)), "a 3x3 kernel"),
                                     (dict(groups=8, weight_shape=(8, 1, 3, 3)), "groups = 1")])
def test_auto_runs_direct_where_winograd_cannot(kw, why, rng):
    w_shape = kw.pop("weight_shape", (8, 8, 3, 3))
    op = schedules.conv2d((1, 8, 30, 30), w_shape, padding=1, target=HOST, **kw)
    # A depthwise layer (groups = channels) goes to its own kernel; the others to direct.
    want = "depthwise" if kw.get("groups") == 8 else "direct"
    assert op.plan["algorithm"] == want, op.plan
    if want == "direct":
        assert why in op.plan["reason"], op.plan
    x = rng.standard_normal((1, 8, 30, 30), dtype=np.float32)
    w = rng.standard_normal(w_shape, dtype=np.float32)
    ref = conv_reference.conv2d(x.astype(np.float64), w.astype(np.float64), padding=1, **kw)
    np.testing.assert_allclose(op(x, w), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_winograd_refused_on_arm():
    with pytest.raises(ValueError, match="x86 float32 path"):
        schedules.conv2d((1, 8, 8, 8), (8, 8, 3, 3), dtype="uint8", target="armv7-neon", algorithm="winograd")


@pytest.mark.parametrize("isa_name", sorted(ISAS))
@pytest.mark.parametrize("m", sorted(wino.POINTS))
def test_gemm_k_loops_are_the_tile_and_transforms_stay_loops(m, isa_name):
    """Compiled only, so AVX-512 is checked on any host. Every K loop of the batched GEMMs is a
    register tile's K step and nothing else (the direct conv's check: MR*NR/lanes FMAs, B loads,
    broadcasts, no store or stack access; the first segment's also one prefetch per B vector),
    one per tile height the plan uses; the transforms' passes (the loops with adds and
    subtracts) are the two per lane chunk of each of the input and output kernels."""
    isa = ISAS[isa_name]
    op = schedules.conv2d((1, 32, 18, 18), (32, 32, 3, 3), padding=1, algorithm="winograd", tile=m,
                          target=f"x86-{isa_name}", threads=1)
    loops = asm.fma_loops(op.asm)
    transforms = [lp for lp in loops if lp.count("vadd") or lp.count("vsub")]
    gemms = [lp for lp in loops if lp not in transforms]
    nv = wino.BLOCK // isa.lanes
    segs = segments(op.plan.tiles_per_band, op.plan.mr)
    heights = {t for _, _, t in segs if t >= 2}
    seen = set()
    for lp in gemms:
        mr = lp.count("vfmadd") // nv
        # The first segment meets each U panel first and prefetches the next one.
        problems = asm.tile_loop_problems(lp, isa, mr, nv, prefetches=nv if mr == segs[0][2] else 0)
        assert mr in heights and not problems, f"{lp.label} ({mr} rows of {sorted(heights)}): {problems}\n" + "\n".join(lp.body)
        seen.add(mr)
    assert seen == heights
    assert len(asm.single_block_loops(op.asm)) >= len(gemms) + 2 * 2 * nv
