"""schedules.conv2d with algorithm="direct": numerics over awkward layers, its plan, the blocked fast path,
refused inputs. (The default, "auto", runs Winograd on some 3x3 layers: test_winograd.py covers it.)"""

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st

import schedules
from microkernels import DEFAULT_TILES, ISAS, best_host_isa
from schedules.conv import ConvBlocking, ConvParams, Geometry, direct
from schedules.conv import geometry as geometry_module
from schedules.conv.geometry import segments

from ... import conv_reference
from ...conv_reference import assert_conv_close, ref_conv2d
from ...x86_exec import HOST

MR, NR = DEFAULT_TILES[best_host_isa().name]


def _inputs(rng, data_shape, weight_shape):
    return (rng.standard_normal(data_shape, dtype=np.float32),
            rng.standard_normal(weight_shape, dtype=np.float32))


def _check_segments(op, ow, conv):
    """The plan's tiles cover one output row exactly (a 1x1 stride-1 unpadded layer's band of
    band_rows rows as one flat row, and only such a layer's), and none has MR = 1 unless OW == 1."""
    flat = op.plan.get("flat_rows")
    k, stride, pad = op.geometry.kh * op.geometry.kw, op.geometry.stride, op.geometry.padded
    assert (flat is not None) == (k == 1 and stride == (1, 1) and not pad and ow > 1), (op.plan, conv)
    if flat is not None:
        assert flat == op.plan["band_rows"] * ow, op.plan
        ow = flat
    col = 0
    for start, count, mr in op.plan["segments"]:
        assert start == col, op.plan["segments"]
        assert mr >= 2 or ow == 1, f"an MR=1 tile in {op.plan['segments']} for OW={ow}"
        col += count * mr
    assert col == ow, op.plan["segments"]


def run_and_check(rng, data_shape, weight_shape, threads=None, **conv):
    op = schedules.conv2d(data_shape, weight_shape, target=HOST, threads=threads, algorithm="direct", **conv)
    x, w = _inputs(rng, data_shape, weight_shape)
    out = op(x, w)
    assert_conv_close(out, x, w, **conv)
    if op.plan["algorithm"] == "depthwise":  # one kernel call per output row: no tile segments
        assert conv.get("groups", 1) == data_shape[1] and weight_shape[1] == 1, op.plan
    else:
        _check_segments(op, out.shape[3], conv)
    return op, x, w, out


# ---------------------------------------------------------------------------------------------
# Numerics over random layers

KSIZE = st.sampled_from([1, 2, 3, 4, 5, 7])
PAD = st.integers(0, 3)
PADDING = st.one_of(PAD, st.tuples(PAD, PAD), st.tuples(PAD, PAD, PAD, PAD))


@st.composite
def layers(draw):
    """A valid layer: channels per group of any size (not only multiples of 16), H, W <= 20."""
    groups = draw(st.sampled_from([1, 2, 3]))
    cg = draw(st.one_of(st.sampled_from([1, 3, 16, 17]), st.integers(1, 40 // groups)))
    og = draw(st.one_of(st.sampled_from([1, 5, 16, 17]), st.integers(1, 40 // groups)))
    kh, kw = draw(KSIZE), draw(KSIZE)
    stride = draw(st.one_of(st.integers(1, 3), st.tuples(st.integers(1, 3), st.integers(1, 3))))
    dilation = draw(st.one_of(st.integers(1, 2), st.tuples(st.integers(1, 2), st.integers(1, 2))))
    padding = draw(PADDING)
    top, left, bottom, right = conv_reference.pads(padding)
    dh, dw = conv_reference.pair(dilation)
    # Constructed valid: the dilated kernel fits the padded input.
    h = draw(st.integers(max(1, (kh - 1) * dh + 1 - top - bottom), 20))
    w = draw(st.integers(max(1, (kw - 1) * dw + 1 - left - right), 20))
    n = draw(st.integers(1, 2))
    return dict(data_shape=(n, groups * cg, h, w), weight_shape=(groups * og, cg, kh, kw),
                stride=stride, padding=padding, dilation=dilation, groups=groups)


# Each example compiles a module: fewer examples than the profile's (25 under "ci").
@settings(max_examples=settings.default.max_examples * 5 // 8)
@given(layer=layers(), threads=st.sampled_from([None, 1, 2]), seed=st.integers(0, 2**32 - 1))
def test_conv2d_matches_reference(layer, threads, seed):
    run_and_check(np.random.default_rng(seed), threads=threads, **layer)


# ---------------------------------------------------------------------------------------------
# Named layers


def test_resnet_first_layer_scaled_down(rng):
    """3 input channels (an input block narrower than 16), 7x7, stride 2, pad 3."""
    op, *_ = run_and_check(rng, (1, 3, 32, 32), (16, 3, 7, 7), stride=2, padding=3)
    assert op.blocked_data_shape == (1, 1, 32, 32, 3)


@pytest.mark.parametrize("stride, hw", [(1, 14), (2, 15)])
def test_pointwise(rng, stride, hw):
    run_and_check(rng, (1, 32, hw, hw), (48, 32, 1, 1), stride=stride)


@pytest.mark.parametrize("data_shape, weight_shape", [
    ((1, 1, 8, 8), (4, 1, 1, 1)),      # one input channel, 1x1: a single product per output
    ((1, 16, 8, 8), (16, 1, 1, 1)),    # depthwise 1x1
])
def test_pointwise_one_channel_per_group(rng, data_shape, weight_shape):
    run_and_check(rng, data_shape, weight_shape, groups=data_shape[1] // weight_shape[1])


@pytest.mark.parametrize("data_shape, weight_shape, padding", [
    ((1, 8, 5, 5), (16, 8, 5, 5), 0),   # one output pixel
    ((1, 8, 9, 3), (20, 8, 3, 3), 0),   # rows one pixel wide
    ((1, 8, 9, 1), (20, 8, 3, 3), 1),   # ... made so by the padding
])
def test_output_one_pixel_wide(rng, data_shape, weight_shape, padding):
    op, *_, out = run_and_check(rng, data_shape, weight_shape, padding=padding)
    assert out.shape[3] == 1
    assert op.plan["segments"] == [(0, 1, 1)]


@pytest.mark.parametrize("data_shape, weight_shape", [
    ((1, 240, 1, 1), (960, 240, 1, 1)),  # MobileNetV3's squeeze-and-excitation FCs
    ((2, 960, 1, 1), (240, 960, 1, 1)),  # a batch, and the reduction longer than L1 holds
    ((1, 40, 1, 1), (24, 40, 1, 1)),  # channel counts that fill no block
])
def test_a_conv_on_a_one_pixel_map_runs_on_the_kernel(rng, data_shape, weight_shape):
    """A 1x1 map's conv is a GEMV: its one-pixel tiles are the 1-row kernel, packed FMAs over
    the weights, not TIR's scalar loop (a chain of dependent scalar FMAs: 960 -> 240 took 191
    us on a Zen 4, the kernel 15), and no chunked reduction (one tile per job reuses nothing)."""
    op, *_ = run_and_check(rng, data_shape, weight_shape)
    assert op.plan["segments"] == [(0, 1, 1)] and op.plan.get("chunk") is None
    asm = op.lib.mod.inspect_source("asm")
    scalar = [line for line in asm.splitlines() if line.strip().startswith(("vfmadd", "vfnmadd")) and "ss\t" in line]
    assert not scalar, scalar[:3]
    assert any(line.strip().startswith("vfmadd") and "ps\t" in line for line in asm.splitlines())


@pytest.mark.parametrize("tiles", [1, 2])
def test_output_width_one_past_the_tile(rng, tiles):
    """OW = k*MR + 1: the last column must not become an MR = 1 tile."""
    ow = tiles * MR + 1
    op, *_, out = run_and_check(rng, (1, 16, 5, ow + 2), (16, 16, 3, 3))
    assert out.shape[3] == ow
    assert all(mr >= 2 for _, _, mr in op.plan["segments"]), op.plan["segments"]


@pytest.fixture
def l2_512k(monkeypatch):
    """The host's L2 as 512 KiB, whatever it is, for the tests that cross its budgets."""
    monkeypatch.setattr(geometry_module, "host_cache_bytes", lambda level, default: 512 * 1024)


def test_blocking_follows_the_hosts_l2(monkeypatch):
    """ConvBlocking() sizes its budgets from sysfs (512 KiB where it is silent); a 400 KiB input
    is packed whole under a 1 MiB L2 and cut into bands under a 512 KiB one."""
    g = Geometry.of(ConvParams((1, 64, 40, 40), (64, 64, 3, 3), padding=1))
    for l2, whole in ((1 << 20, True), (512 * 1024, False)):
        monkeypatch.setattr(geometry_module, "host_cache_bytes", lambda level, default, l2=l2: l2)
        assert ConvBlocking().image_budget == l2 // 2
        vh, band_parallel = direct.bands(g, ConvBlocking(), 1)
        assert (vh == 40 and not band_parallel) == whole
    monkeypatch.setattr(geometry_module, "host_cache_bytes", lambda level, default: default)
    assert ConvBlocking().l2 == 512 * 1024


def test_bands_that_do_not_split_evenly_split_output_blocks(rng):
    """7 one-row bands on 2 threads would run 4 and 3; the threads split each band's output
    blocks instead. Where they split evenly (1 thread, or 14 rows), the threads split bands."""
    shapes = (1, 256, 14, 14), (128, 256, 1, 1)
    small = ConvBlocking(l2_bytes=64 * 1024)  # bands of one output row (13 KiB of input each)
    g = Geometry.of(ConvParams(*shapes, stride=2))
    assert direct.bands(g, small, 2) == (1, False)
    assert direct.bands(g, small, 1) == (1, True)
    assert direct.bands(Geometry.of(ConvParams(*shapes)), small, 2)[1] is True
    x, w = _inputs(rng, *shapes)
    two = schedules.conv2d(*shapes, stride=2, target=HOST, threads=2, algorithm="direct", blocking=small)
    assert (two.plan["band_rows"], two.plan["band_parallel"]) == (1, False)
    np.testing.assert_array_equal(two(x, w), schedules.conv2d(*shapes, stride=2, target=HOST, threads=1,
                                                               algorithm="direct", blocking=small)(x, w))
    assert_conv_close(two(x, w), x, w, stride=2)


@pytest.mark.parametrize("n, padding, threads", [(1, 1, 1), (1, 0, None), (2, 1, 2)])
def test_band_mode(rng, l2_512k, n, padding, threads):
    """An input over half of L2 blocked (64 ch x 40 x 40 x 4 B = 400 KiB) is cut into row bands."""
    hw = 40 if padding else 42
    op, *_ = run_and_check(rng, (n, 64, hw, hw), (64, 64, 3, 3), padding=padding, threads=threads)
    assert op.plan["band_parallel"] is True
    assert op.plan["band_rows"] < 40


def test_batch_two(rng):
    run_and_check(rng, (2, 20, 9, 11), (24, 20, 3, 3), stride=(1, 2), padding=(1, 0, 2, 1))


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise(rng, stride):
    op, *_ = run_and_check(rng, (1, 16, 12, 12), (16, 1, 3, 3), stride=stride, padding=1, groups=16)
    assert op.plan["algorithm"] == "depthwise"  # tests/schedules/test_depthwise.py covers it


@pytest.mark.parametrize("data_shape, weight_shape, padding", [
    ((1, 32, 12, 12), (64, 32, 3, 3), 1),   # output blocks split between threads
    ((1, 64, 40, 40), (64, 64, 3, 3), 1),   # bands split between threads
])
def test_threads_give_identical_results(rng, l2_512k, data_shape, weight_shape, padding):
    x, w = _inputs(rng, data_shape, weight_shape)
    one = schedules.conv2d(data_shape, weight_shape, padding=padding, target=HOST, threads=1, algorithm="direct")(x, w)
    two = schedules.conv2d(data_shape, weight_shape, padding=padding, target=HOST, threads=2, algorithm="direct")(x, w)
    np.testing.assert_array_equal(one, two)
    assert_conv_close(two, x, w, padding=padding)


# ---------------------------------------------------------------------------------------------
# Blocked fast path


@pytest.mark.parametrize("data_shape, weight_shape, groups", [
    ((1, 20, 7, 9), (20, 20, 3, 3), 1),   # padded output channels
    ((2, 10, 6, 6), (6, 5, 3, 3), 2),     # groups, each padded to a block
    ((1, 3, 8, 8), (5, 3, 1, 1), 1),
])
def test_blocked_path_matches_and_pads_with_zeros(rng, data_shape, weight_shape, groups):
    op = schedules.conv2d(data_shape, weight_shape, padding=1, groups=groups, target=HOST, algorithm="direct")
    x, w = _inputs(rng, data_shape, weight_shape)
    xb, wb = op.to_blocked(x), op.pack_weights(w)
    assert xb.shape == op.blocked_data_shape and wb.shape == op.blocked_weight_shape
    ob = op.run_blocked(xb, wb)
    assert ob.shape == op.blocked_out_shape and ob.dtype == np.float32
    np.testing.assert_array_equal(op.from_blocked(ob), op(x, w))
    # Output channels past each group's last real one are exactly zero.
    o = weight_shape[0]
    og, blocks = o // groups, ob.shape[1] // groups
    by_group = ob.transpose(0, 1, 4, 2, 3).reshape(ob.shape[0], groups, blocks * NR, *ob.shape[2:4])
    assert np.all(by_group[:, :, og:] == 0)
    assert op.flops == 2 * np.prod(op.from_blocked(ob).shape) * np.prod(weight_shape[1:])


@pytest.mark.parametrize("algorithm", ["direct", "winograd"])
def test_output_tiles_are_not_zero_filled_before_the_kernel(algorithm, rng):
    """The tiles are beta=0 kernels that overwrite their output; the zero fill TVM keeps in front
    of each tensorized reduction (one memset per tile, 384 bytes for 6x16) must be gone, and the
    result must not depend on what the output held: a NaN-filled output comes out right."""
    import re


    x = rng.standard_normal((1, 32, 14, 14), dtype=np.float32)
    w = rng.standard_normal((32, 32, 3, 3), dtype=np.float32)
    op = schedules.conv2d(x.shape, w.shape, padding=1, target=HOST, algorithm=algorithm, threads=1)
    ll = op.lib.mod.inspect_source("ll")
    plan = op.plan
    rows = plan.segments if algorithm == "direct" else segments(plan.tiles_per_band, plan.mr)
    tile_bytes = {t * NR * 4 for _, _, t in rows if t >= 2}  # the heights this plan's tiles have
    fills = [int(n) for n in re.findall(r"call void @llvm\.memset[^(]*\([^,]*, i8 0, i64 (\d+)", ll)]
    assert not tile_bytes & set(fills), f"zero fills of an output tile's size: {fills}"
    args = [tvm.runtime.tensor(op.to_blocked(x)), tvm.runtime.tensor(op.pack_weights(w)),
            tvm.runtime.tensor(np.full(op.blocked_out_shape, np.nan, np.float32))]
    op.lib(*args)
    got = op.from_blocked(args[2].numpy())
    ref = ref_conv2d(x, w, padding=1)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


# ---------------------------------------------------------------------------------------------
# Reductions cut into chunks (direct.chunk_blocks): the small maps of a network's last stages

WHOLE = ConvBlocking(l1_bytes=1 << 30)  # every job's weights "fit in L1": one call per tile
CHUNKED = ConvBlocking(l1_bytes=1024)  # nothing fits: one input block per chunk


@pytest.mark.parametrize("data_shape, weight_shape, stride, padding, post, threads", [
    ((1, 32, 7, 7), (32, 32, 3, 3), 1, 1, {}, 1),  # two chunks: first and last
    ((1, 48, 7, 9), (40, 48, 3, 3), 1, 1, dict(bias=True, residual=True, activation="relu"), 2),  # a middle loop of one
    ((2, 80, 6, 6), (32, 80, 3, 3), 1, 1, dict(bias=True, activation="clip", clip=(-0.5, 0.5)), None),  # of three
    ((1, 64, 14, 14), (48, 64, 1, 1), 2, 0, dict(residual=True), 2),  # unpadded: the tiles read the input in place
    ((1, 48, 5, 1), (32, 48, 1, 1), 1, 0, dict(bias=True), 1),  # one-pixel tiles, a middle loop of one
])
def test_chunked_reduction_equals_one_call_bit_for_bit(rng, data_shape, weight_shape, stride, padding, post, threads):
    """A chunk's partial sum goes through memory as float32, and the next chunk adds in the
    order one call would: chunked and unchunked results are identical, bit for bit, and the
    post-ops (bias, residual, activation) see the whole sum, once."""
    conv = dict(stride=stride, padding=padding, target=HOST, threads=threads, algorithm="direct", **post)
    whole = schedules.conv2d(data_shape, weight_shape, blocking=WHOLE, **conv)
    chunked = schedules.conv2d(data_shape, weight_shape, blocking=CHUNKED, **conv)
    assert whole.plan.get("chunk") is None
    assert chunked.plan["chunk"] == 1 and chunked.plan["band_rows"] == chunked.layer.out_hw[0]
    x, w = _inputs(rng, data_shape, weight_shape)
    args = {}
    if post.get("bias"):
        args["bias"] = rng.standard_normal(weight_shape[0], dtype=np.float32)
    if post.get("residual"):
        args["residual"] = rng.standard_normal((data_shape[0], weight_shape[0], *whole.layer.out_hw), dtype=np.float32)
    got = chunked(x, w, **args)
    np.testing.assert_array_equal(got, whole(x, w, **args))
    want = ref_conv2d(x, w, stride=stride, padding=padding).astype(np.float64)
    if "bias" in args:
        want += args["bias"][None, :, None, None]
    if "residual" in args:
        want += args["residual"]
    if post.get("activation") == "relu":
        want = np.maximum(want, 0)
    elif post.get("activation") == "clip":
        want = np.clip(want, *post["clip"])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_chunks_where_a_jobs_weights_outgrow_l1_and_the_map_is_one_band():
    """ResNet-50's 7x7 layers (one band) cut their reduction so a chunk's weights stay in half of
    L1 (48 KiB: 3x3 at 18 KiB per input block of a two-block tile: one block per chunk; 1x1
    at 2 KiB: 8). Banded maps, grouped layers and jobs whose weights fit keep one call."""
    l1 = ConvBlocking(l2_bytes=1 << 20, l1_bytes=48 * 1024)
    chunk = lambda shapes, **kw: direct.chunk_blocks(  # noqa: E731
        g := Geometry.of(ConvParams(*shapes, **kw)), direct.output_blocks(g, ISAS["avx512"], 28),
        direct.bands(g, l1, 1)[0], l1.l1)
    assert chunk(((1, 512, 7, 7), (512, 512, 3, 3)), padding=1) == 1
    assert chunk(((1, 2048, 7, 7), (512, 2048, 1, 1))) == 8
    assert chunk(((1, 64, 56, 56), (64, 64, 3, 3)), padding=1) == 4  # banded: all 4 blocks
    assert chunk(((1, 32, 7, 7), (32, 32, 1, 1))) == 2  # 4 KiB of weights: all
    assert chunk(((1, 512, 7, 7), (512, 128, 3, 3)), padding=1, groups=4) == 8  # grouped: all


def test_strided_pointwise_counts_only_the_pixels_it_reads():
    """An unpadded strided 1x1 layer reads every stride-th row and pixel in place: ResNet-50's
    1024x14x14 -> 2048 s2 touches 196 KiB, so it runs as one band under a 1 MiB L2, where the
    whole window (728 KiB) would have cut it into one-row bands."""
    g = Geometry.of(ConvParams((1, 1024, 14, 14), (2048, 1024, 1, 1), stride=2))
    assert direct.input_bytes(g, 7) == 1024 * 7 * 7 * 4
    assert direct.bands(g, ConvBlocking(l2_bytes=1 << 20), 2) == (7, False)
    padded = Geometry.of(ConvParams((1, 1024, 14, 14), (2048, 1024, 1, 1), stride=2, padding=1))
    assert direct.input_bytes(padded, 7) == 1024 * 13 * 16 * 4  # 7 rows at stride 2 span 13, padded 16 wide
