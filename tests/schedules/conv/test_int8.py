"""schedules.conv2d on the ARM targets (quantized): bit-exact against an int64 reference under
qemu, at the edges of the 8-bit value range and of the int32 exactness bound (MAX_K), on the
shapes that take other paths (depthwise, tails, OW < MR), and every refusal."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedules
from microkernels import asm
from schedules.conv.int8 import MAX_K, MAX_K_DOT, MAX_PRODUCT

from ... import conv_reference
from ...arm_tools import require_emulator

TARGETS = ["armv7-neon", "aarch64-neon", "aarch64-dotprod"]
ARCH = {"armv7-neon": "armv7", "aarch64-neon": "aarch64", "aarch64-dotprod": "aarch64"}
RANGE = {"int8": (-128, 127), "uint8": (0, 255)}
INT32_MAX = 2**31 - 1


# ---------------------------------------------------------------------------------------------
# Reference


_pair, _pads = conv_reference.pair, conv_reference.pads
reference = conv_reference.qconv2d


def naive(x, w, zp_x, zp_w, stride, padding, dilation, groups):
    """The definition, one output element at a time (checks `reference` on tiny layers)."""
    (sh, sw), (dh, dw), (t, l, _, _) = _pair(stride), _pair(dilation), _pads(padding)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    ref = reference(x, w, zp_x, zp_w, stride, padding, dilation, groups)
    out = np.zeros_like(ref)
    og = o // groups
    for idx in np.ndindex(*out.shape):
        b, oc, y, xo = idx
        acc = 0
        for ci in range(cg):
            for ri in range(kh):
                for si in range(kw):
                    iy, ix = y * sh + ri * dh - t, xo * sw + si * dw - l
                    if 0 <= iy < h and 0 <= ix < wd:
                        acc += (int(x[b, oc // og * cg + ci, iy, ix]) - zp_x) * (int(w[oc, ci, ri, si]) - zp_w)
        out[idx] = acc
    return out


def random_values(rng, dtype, shape, extremes=False):
    lo, hi = RANGE[dtype]
    if extremes:
        return rng.choice(np.array([lo, hi], dtype), shape)
    return rng.integers(lo, hi + 1, shape).astype(dtype)


def compile_op(target, x_shape, w_shape, dtype="int8", weight_dtype="int8", zp_x=0, zp_w=0, **layer):
    return schedules.conv2d(x_shape, w_shape, dtype=dtype, target=target, weight_dtype=weight_dtype,
                            input_zero_point=zp_x, weight_zero_point=zp_w, **layer)


def assert_exact(got, want):
    assert got.dtype == np.int32, got.dtype
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.abs(want).max(initial=0) <= INT32_MAX, "the reference itself does not fit int32"
    bad = got.astype(np.int64) != want
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        pytest.fail(f"{bad.sum()} of {bad.size} outputs differ; first at {first}: got {got[first]}, want {want[first]}")


def check_layer(target, x, w, zp_x, zp_w, stride=1, padding=0, dilation=1, groups=1):
    """Compile, run under qemu, compare with the reference; returns (op, output)."""
    require_emulator(ARCH[target])
    op = compile_op(target, x.shape, w.shape, str(x.dtype), str(w.dtype), zp_x, zp_w,
                    stride=stride, padding=padding, dilation=dilation, groups=groups)
    assert op.isa.arch == ARCH[target]
    out = op(x, w)
    assert_exact(out, reference(x, w, zp_x, zp_w, stride, padding, dilation, groups))
    return op, out


def test_reference_matches_the_definition():
    rng = np.random.default_rng(0)
    for (n, c, h, wd, o, kh, kw, stride, padding, dilation, groups) in [
        (1, 4, 5, 6, 6, 3, 2, 1, (1, 0, 2, 1), (2, 1), 2),
        (2, 3, 7, 5, 3, 3, 3, 2, 1, 1, 3),
        (1, 2, 4, 4, 4, 1, 1, (2, 1), 0, 1, 1),
    ]:
        x = random_values(rng, "uint8", (n, c, h, wd))
        w = random_values(rng, "int8", (o, c // groups, kh, kw))
        want = naive(x, w, 17, -5, stride, padding, dilation, groups)
        np.testing.assert_array_equal(reference(x, w, 17, -5, stride, padding, dilation, groups), want)


# ---------------------------------------------------------------------------------------------
# Property: random layers, bit-exact


@st.composite
def layers(draw):
    shape = draw(st.sampled_from(["dense", "dense", "grouped", "depthwise", "multiplier"]))
    if shape == "dense":
        groups, c, o = 1, draw(st.integers(1, 12)), draw(st.integers(1, 20))
    elif shape == "grouped":
        groups = draw(st.integers(2, 4))
        c, o = groups * draw(st.integers(1, 5)), groups * draw(st.integers(1, 10))
    else:  # groups = C: depthwise proper (O = C) or with a channel multiplier (O = 2C, the GEMM path)
        groups = c = draw(st.integers(2, 20))
        o = c if shape == "depthwise" else 2 * c
    kernel = st.sampled_from([1, 2, 3, 3, 3, 5, 7])
    kh, kw = draw(kernel), draw(kernel)
    one_or_two = st.integers(1, 2)
    stride = draw(st.one_of(one_or_two, st.tuples(one_or_two, one_or_two)))
    dilation = draw(st.one_of(one_or_two, st.tuples(one_or_two, one_or_two)))
    padding = draw(st.one_of(st.integers(0, 2), st.tuples(*[st.integers(0, 2)] * 4)))
    (dh, dw), (t, l, b, r) = _pair(dilation), _pads(padding)
    h_min = max(1, (kh - 1) * dh + 1 - t - b)
    w_min = max(1, (kw - 1) * dw + 1 - l - r)
    h = draw(st.integers(h_min, max(h_min, 12)))
    wd = draw(st.integers(w_min, max(w_min, 12)))
    n = draw(st.integers(1, 2))
    dtype, weight_dtype = draw(st.sampled_from(["int8", "uint8"])), draw(st.sampled_from(["int8", "uint8"]))
    zp_x = draw(st.integers(*RANGE[dtype]))
    zp_w = draw(st.integers(*RANGE[weight_dtype]))
    extremes = draw(st.integers(0, 3)) == 0  # sometimes only the two ends of the range
    seed = draw(st.integers(0, 2**32 - 1))
    return dict(n=n, c=c, h=h, w=wd, o=o, kh=kh, kw=kw, stride=stride, padding=padding, dilation=dilation,
                groups=groups, dtype=dtype, weight_dtype=weight_dtype, zp_x=zp_x, zp_w=zp_w,
                extremes=extremes, seed=seed)


def check_random_layer(target, p):
    rng = np.random.default_rng(p["seed"])
    x = random_values(rng, p["dtype"], (p["n"], p["c"], p["h"], p["w"]), p["extremes"])
    w = random_values(rng, p["weight_dtype"], (p["o"], p["c"] // p["groups"], p["kh"], p["kw"]), p["extremes"])
    op, _ = check_layer(target, x, w, p["zp_x"], p["zp_w"], p["stride"], p["padding"], p["dilation"], p["groups"])
    assert op.plan.depthwise == (p["groups"] == p["c"] == p["o"] and p["groups"] > 1)
    # aarch64-dotprod runs the GEMM on sdot (int8 as is, zero points through the expansion);
    # depthwise layers keep the s16 MAC there too
    assert op.plan.dot == (target == "aarch64-dotprod" and not op.plan.depthwise)


@pytest.mark.parametrize("target", TARGETS)
@settings(max_examples=12)
@given(p=layers())
def test_random_layers_are_exact(target, p):
    check_random_layer(target, p)


# ---------------------------------------------------------------------------------------------
# Extremes of the 8-bit range and the int32 bound

# (data dtype, data value, zp_x, weight dtype, weight value, zp_w): every |x - zp| and |w - zp| is 255.
EXTREMES = [
    ("int8", -128, 127, "int8", 127, -128),  # -255 * 255
    ("int8", 127, -128, "int8", -128, 127),  # 255 * -255
    ("int8", -128, 127, "int8", -128, 127),  # -255 * -255
    ("uint8", 0, 255, "uint8", 255, 0),
    ("uint8", 255, 0, "int8", -128, 127),
    ("uint8", 0, 255, "uint8", 0, 255),
]


def _extreme_arrays(case, x_shape, w_shape):
    dtype, xv, zp_x, wdtype, wv, zp_w = case
    return np.full(x_shape, xv, dtype), np.full(w_shape, wv, wdtype), zp_x, zp_w


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", EXTREMES, ids=lambda c: f"{c[0]}{c[1]}zp{c[2]}-{c[3]}{c[4]}zp{c[5]}")
def test_extreme_values_are_exact(target, case):
    x, w, zp_x, zp_w = _extreme_arrays(case, (1, 8, 5, 6), (8, 8, 3, 3))
    product = (int(x.flat[0]) - zp_x) * (int(w.flat[0]) - zp_w)
    assert abs(product) == MAX_PRODUCT
    _, out = check_layer(target, x, w, zp_x, zp_w, padding=1)
    # Interior pixels see the full window, border pixels only the part inside the image: the
    # padding is the zero point, and contributes nothing.
    assert (out[:, :, 1:-1, 1:-1] == 8 * 9 * product).all()
    assert (out[:, :, 0, 0] == 8 * 4 * product).all()


@pytest.mark.parametrize("target", TARGETS)
def test_extreme_values_at_moderate_k(target):
    # K = 64 * 3 * 3 = 576, mixed signs: data at both ends, weights at both ends.
    rng = np.random.default_rng(7)
    x = random_values(rng, "int8", (1, 64, 5, 5), extremes=True)
    w = random_values(rng, "int8", (16, 64, 3, 3), extremes=True)
    check_layer(target, x, w, 127, -128, padding=1)
    # and all products of one sign, so the sums are as large as K allows
    x, w, zp_x, zp_w = _extreme_arrays(EXTREMES[2], (1, 64, 4, 4), (16, 64, 3, 3))
    _, out = check_layer(target, x, w, zp_x, zp_w)
    assert (out == 576 * MAX_PRODUCT).all()


def test_max_k_is_the_int32_bound():
    assert MAX_PRODUCT == 255 * 255
    assert MAX_K * MAX_PRODUCT <= INT32_MAX < (MAX_K + 1) * MAX_PRODUCT
    assert MAX_K == 33025
    # sdot's expansion adds four terms, each up to 128 * 128 * K in magnitude
    assert 4 * 128 * 128 * MAX_K_DOT <= INT32_MAX < 4 * 128 * 128 * (MAX_K_DOT + 1)
    assert MAX_K_DOT == 32767


# (target, dtype, K): the longest reduction each path accepts. int16 data on aarch64-dotprod
# runs the s16 tile, so MAX_K, not MAX_K_DOT, bounds it.
LONGEST = [("armv7-neon", "int8", MAX_K), ("aarch64-neon", "int8", MAX_K),
           ("aarch64-dotprod", "int8", MAX_K_DOT), ("aarch64-dotprod", "int16", MAX_K)]


@pytest.mark.parametrize("target,dtype,k", LONGEST, ids=lambda v: str(v))
@pytest.mark.parametrize("sign", [1, -1])
def test_longest_reduction_is_accepted_and_exact(target, dtype, k, sign):
    # 1x1 over K channels, every |x - zp| and |w - zp| 255: every output is +-K * 65025, the
    # largest magnitude the path promises to hold exactly.
    require_emulator(ARCH[target])
    if dtype == "int16":
        zp_x, zp_w, xv, wv = 0, 0, -255, (-255 if sign > 0 else 255)
    else:
        zp_x, xv = 127, -128
        zp_w, wv = (127, -128) if sign > 0 else (-128, 127)
    op = compile_op(target, (1, k, 1, 2), (8, k, 1, 1), dtype, dtype, zp_x, zp_w)
    assert op.plan.dot == (target == "aarch64-dotprod" and dtype == "int8")
    out = op(np.full((1, k, 1, 2), xv, dtype), np.full((8, k, 1, 1), wv, dtype))
    assert out.dtype == np.int32
    assert (out.astype(np.int64) == sign * k * MAX_PRODUCT).all()


@pytest.mark.parametrize("target", ["armv7-neon", "aarch64-dotprod"])
@pytest.mark.parametrize("weight_shape,groups", [((8, 3670, 3, 3), 1), ((8, 3670, 3, 3), 2), ((4, MAX_K + 1, 1, 1), 1)])
def test_k_over_max_k_is_refused(target, weight_shape, groups):
    o, cg, kh, kw = weight_shape
    assert cg * kh * kw > MAX_K
    with pytest.raises(ValueError, match=rf"C/groups\*KH\*KW = {cg * kh * kw} exceeds {MAX_K}, the longest sum"):
        schedules.conv2d((1, cg * groups, 4, 4), weight_shape, groups=groups, dtype="int8", target=target,
                         input_zero_point=0, weight_zero_point=0)


@pytest.mark.parametrize("k", [MAX_K_DOT + 1, MAX_K])
def test_k_over_max_k_dot_is_refused_on_sdot(k):
    with pytest.raises(ValueError, match=rf"C/groups\*KH\*KW = {k} exceeds {MAX_K_DOT}, the longest the sdot expansion"):
        schedules.conv2d((1, k, 1, 1), (8, k, 1, 1), dtype="uint8", target="aarch64-dotprod",
                         input_zero_point=3, weight_zero_point=0)


# ---------------------------------------------------------------------------------------------
# Shapes that take the other paths

SHAPES = {
    # name: (data shape, weight shape, layer kwargs)
    "depthwise-s2-pad-dil": ((1, 16, 11, 10), (16, 1, 3, 3), dict(stride=2, padding=(1, 2, 0, 1), dilation=2, groups=16)),
    "depthwise-c12": ((1, 12, 7, 9), (12, 1, 3, 3), dict(stride=1, padding=1, groups=12)),
    "depthwise-5x5-s2": ((2, 20, 9, 9), (20, 1, 5, 5), dict(stride=2, padding=2, groups=20)),
    "multiplier-2": ((1, 6, 8, 7), (12, 1, 3, 3), dict(stride=1, padding=1, groups=6)),
    "channels-not-x8": ((1, 13, 6, 7), (11, 13, 3, 3), dict(padding=1)),
    "batch-2": ((2, 8, 6, 6), (16, 8, 3, 3), dict(stride=2, padding=1)),
    "1x1": ((1, 24, 5, 7), (40, 24, 1, 1), {}),
    "first-layer-7x7-s2": ((1, 3, 20, 20), (16, 3, 7, 7), dict(stride=2, padding=3)),
    "ow-lt-mr": ((1, 8, 4, 3), (8, 8, 3, 3), dict(padding=1)),
    "dilated-w": ((1, 5, 7, 9), (10, 5, 3, 3), dict(dilation=(1, 2), padding=(0, 1))),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_shapes(target, name):
    x_shape, w_shape, layer = SHAPES[name]
    rng = np.random.default_rng(sorted(SHAPES).index(name))
    x = random_values(rng, "uint8", x_shape)
    w = random_values(rng, "int8", w_shape)
    op, _ = check_layer(target, x, w, 131, -7, **layer)
    groups = layer.get("groups", 1)
    assert op.plan.depthwise == (groups == x_shape[1] == w_shape[0] > 1)
    if name == "ow-lt-mr":
        assert op.geometry.out_hw[1] < op.plan.kern.mr and op.plan.ow_padded == op.plan.kern.mr
    if not op.plan.depthwise:
        assert op.plan.cp >= w_shape[1] and op.plan.op % op.plan.kern.nr == 0


# ---------------------------------------------------------------------------------------------
# Packed weights and the legalized int16 form


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("depthwise", [False, True], ids=["gemm", "depthwise"])
def test_run_packed_and_int16_legalized_match(target, depthwise):
    require_emulator(ARCH[target])
    rng = np.random.default_rng(3)
    c, o, groups = (16, 16, 16) if depthwise else (10, 12, 1)
    x_shape, w_shape = (1, c, 6, 7), (o, c // groups, 3, 3)
    layer = dict(stride=1, padding=1, groups=groups)
    x = random_values(rng, "int8", x_shape)
    w = random_values(rng, "uint8", w_shape)
    zp_x, zp_w = -3, 250
    op = compile_op(target, x_shape, w_shape, "int8", "uint8", zp_x, zp_w, **layer)
    want = reference(x, w, zp_x, zp_w, **layer)

    packed = op.pack_weights(w)
    assert isinstance(packed, tuple) and len(packed) == (2 if op.plan.dot else 1)
    assert packed[0].dtype == np.dtype(op.plan.weight_dtype) and packed[0].shape == op.plan.weight_shape
    if op.plan.dot:
        assert packed[0].dtype == np.int8
        assert packed[1].dtype == np.int32 and packed[1].shape == op.plan.bias_shape
    else:
        assert packed[0].dtype == np.int16
    assert_exact(op.run_packed(x, packed), want)
    assert_exact(op.run_packed(x, packed), want)  # the packed weights are reusable as they are
    assert_exact(op(x, w), want)

    legal = compile_op(target, x_shape, w_shape, "int16", "int16", 0, 0, **layer)
    assert legal.weight_dtype == "int16" and not legal.plan.dot
    x16 = (x.astype(np.int16) - zp_x).astype(np.int16)
    w16 = (w.astype(np.int16) - zp_w).astype(np.int16)
    assert_exact(legal(x16, w16), want)
    if not op.plan.dot:  # zero points already out: the legalized op packs the same int16 weights
        np.testing.assert_array_equal(legal.pack_weights(w16)[0], packed[0])


@pytest.mark.parametrize("target", TARGETS)
def test_int16_extremes_are_exact(target):
    require_emulator(ARCH[target])
    rng = np.random.default_rng(5)
    x = rng.choice(np.array([-255, 255], np.int16), (1, 32, 4, 5))
    w = rng.choice(np.array([-255, 255], np.int16), (8, 32, 3, 3))
    op = compile_op(target, x.shape, w.shape, "int16", "int16", 0, 0, padding=1)
    assert_exact(op(x, w), reference(x, w, 0, 0, padding=1))


# ---------------------------------------------------------------------------------------------
# Assembly: the tensorized K loop is the MAC tile and nothing else


@pytest.mark.parametrize("target,arch,isa_name", [("armv7-neon", "armv7", "neon"), ("aarch64-neon", "aarch64", "aarch64"),
                                                   ("aarch64-dotprod", "aarch64", "aarch64dot")])
def test_k_loops_hold_only_the_mac_tile(target, arch, isa_name):
    op = compile_op(target, (1, 64, 6, 6), (64, 64, 3, 3), "int8", "int8", 3, -2, padding=1)
    assert op.plan.kern.isa.name == isa_name
    fn = asm.compute_function(op.asm)
    # On sdot, LLVM also reduces the window sums with sdot-by-ones; only by-lane loops are tiles.
    loops = asm.mac_loops(fn, arch, isa_name if op.plan.dot else None)
    assert loops, "no MAC loop: the tile was not tensorized"
    macs = op.plan.kern.instructions_per_step
    for lp in loops:
        problems = asm.mac_loop_problems(lp, isa_name, macs)
        assert problems == [], f"{lp.label}: {problems}\n" + "\n".join(lp.body)


# ---------------------------------------------------------------------------------------------
# Refusals

LAYER = ((1, 8, 5, 5), (8, 8, 3, 3))


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(dtype="int8", input_zero_point=128), r"input_zero_point=128 is out of range for int8: must lie in \[-128, 127\]"),
    (dict(dtype="int8", input_zero_point=-129), r"\[-128, 127\]"),
    (dict(dtype="uint8", input_zero_point=-1), r"input_zero_point=-1 is out of range for uint8: must lie in \[0, 255\]"),
    (dict(dtype="uint8", input_zero_point=256), r"\[0, 255\]"),
    (dict(dtype="int8", weight_zero_point=200), r"weight_zero_point=200 is out of range for int8"),
    (dict(dtype="int8", weight_dtype="uint8", weight_zero_point=-1), r"weight_zero_point=-1 .*uint8.*\[0, 255\]"),
    (dict(dtype="int16", input_zero_point=3), r"out of range for int16: must lie in \[0, 0\]"),
    (dict(dtype="int16", weight_zero_point=-1), r"weight_zero_point=-1 is out of range for int16"),
])
def test_zero_point_out_of_range_is_refused(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        schedules.conv2d(*LAYER, target="aarch64-neon", **kwargs)


@pytest.mark.parametrize("zp", [1.5, 2.0, np.float64(3.0), "3", True, np.bool_(False)])
def test_non_int_zero_point_is_refused(zp):
    with pytest.raises(TypeError, match="input_zero_point must be an int"):
        schedules.conv2d(*LAYER, dtype="int8", target="armv7-neon", input_zero_point=zp)
    with pytest.raises(TypeError, match="weight_zero_point must be an int"):
        schedules.conv2d(*LAYER, dtype="int8", target="armv7-neon", weight_zero_point=zp)


def test_numpy_int_zero_points_are_accepted():
    op = schedules.conv2d(*LAYER, dtype="uint8", target="armv7-neon",
                          input_zero_point=np.uint8(200), weight_zero_point=np.int64(-128))
    assert (op.zp_x, op.zp_w) == (200, -128)
    assert type(op.zp_x) is int and type(op.zp_w) is int


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", ["float32", "int32", "float16"])
def test_unsupported_dtype_on_arm_is_refused(target, dtype):
    with pytest.raises(ValueError, match=rf"dtype '{dtype}' is not supported on .* targets; use 'int8' or 'uint8'"):
        schedules.conv2d(*LAYER, dtype=dtype, target=target)


def test_unsupported_weight_dtype_on_arm_is_refused():
    with pytest.raises(ValueError, match=r"weight_dtype 'float32' is not supported"):
        schedules.conv2d(*LAYER, dtype="int8", weight_dtype="float32", target="aarch64-neon")


@pytest.mark.parametrize("dtype, weight_dtype", [("int16", "int8"), ("float16", None)])
def test_other_dtypes_on_x86_name_what_is_taken(dtype, weight_dtype):
    match = "int16 is the legalized" if dtype == "int16" else "not supported on x86 targets; use 'float32', or 'uint8'"
    with pytest.raises(ValueError, match=match):
        schedules.conv2d(*LAYER, dtype=dtype, weight_dtype=weight_dtype, target="x86-avx2")


@pytest.mark.parametrize("kwargs", [dict(input_zero_point=0), dict(weight_zero_point=3), dict(weight_dtype="int8")])
def test_zero_points_on_x86_are_refused(kwargs):
    with pytest.raises(ValueError, match="zero points and weight_dtype apply to quantized"):
        schedules.conv2d(*LAYER, dtype="float32", target="x86-avx2", **kwargs)


@pytest.mark.parametrize("kwargs,exc,fragment", [
    (dict(stride=0), ValueError, "stride must be >= 1"),
    (dict(stride=1.0), TypeError, "stride must be an int or a tuple of one or two ints"),
    (dict(groups=3), ValueError, "groups=3 must divide both"),
    (dict(padding=(1, 2, 3)), ValueError, r"padding must be an int, \(h, w\), \(top, left, bottom, right\)"),
    (dict(dilation=4), ValueError, r"the \(dilated\) kernel 9x9 is larger than the padded input"),
])
def test_bad_geometry_is_refused(kwargs, exc, fragment):
    with pytest.raises(exc, match=fragment):
        schedules.conv2d(*LAYER, dtype="int8", target="armv7-neon", input_zero_point=1, **kwargs)


@pytest.fixture(scope="module")
def small_op():
    return schedules.conv2d((1, 8, 5, 5), (8, 8, 3, 3), dtype="uint8", target="armv7-neon",
                            input_zero_point=128, weight_zero_point=0)


def test_bad_arrays_are_refused(small_op):
    x = np.zeros((1, 8, 5, 5), np.uint8)
    w = np.zeros((8, 8, 3, 3), np.int8)
    with pytest.raises(TypeError, match="data must have dtype uint8, got int8"):
        small_op(x.astype(np.int8), w)
    with pytest.raises(TypeError, match="data must be a numpy.ndarray, got list"):
        small_op(x.tolist(), w)
    with pytest.raises(ValueError, match=r"data must have shape \(1, 8, 5, 5\), got \(1, 8, 5, 6\)"):
        small_op(np.zeros((1, 8, 5, 6), np.uint8), w)
    with pytest.raises(ValueError, match="data must be C-contiguous"):
        small_op(np.zeros((1, 8, 5, 10), np.uint8)[..., ::2], w)
    with pytest.raises(TypeError, match="weight must have dtype int8, got uint8"):
        small_op(x, w.astype(np.uint8))
    with pytest.raises(ValueError, match=r"weight must have shape \(8, 8, 3, 3\)"):
        small_op(x, np.zeros((8, 8, 3, 2), np.int8))
    (packed,) = small_op.pack_weights(w)
    with pytest.raises(TypeError, match="packed must be the tuple of 1 array"):
        small_op.run_packed(x, packed)
    with pytest.raises(TypeError, match="packed must be the tuple of 1 array"):
        small_op.run_packed(x, (packed, packed))
    with pytest.raises(TypeError, match=r"packed\[0\] must have dtype int16"):
        small_op.run_packed(x, (packed.astype(np.int32),))
    with pytest.raises(ValueError, match=r"packed\[0\] must have shape"):
        small_op.run_packed(x, (packed[..., :4].copy(),))


def test_bad_packed_arrays_are_refused_on_sdot():
    op = schedules.conv2d((1, 8, 5, 5), (8, 8, 3, 3), dtype="uint8", target="aarch64-dotprod",
                          input_zero_point=128, weight_zero_point=0)
    x = np.zeros((1, 8, 5, 5), np.uint8)
    kernel_vec, bias = op.pack_weights(np.zeros((8, 8, 3, 3), np.int8))
    with pytest.raises(TypeError, match="packed must be the tuple of 2 array"):
        op.run_packed(x, (kernel_vec,))
    with pytest.raises(TypeError, match=r"packed\[0\] must have dtype int8"):
        op.run_packed(x, (kernel_vec.astype(np.int16), bias))
    with pytest.raises(TypeError, match=r"packed\[1\] must have dtype int32"):
        op.run_packed(x, (kernel_vec, bias.astype(np.int64)))


def test_int16_values_beyond_8bit_range_are_refused():
    op = schedules.conv2d((1, 8, 5, 5), (8, 8, 3, 3), dtype="int16", target="aarch64-neon")
    x = np.zeros((1, 8, 5, 5), np.int16)
    w = np.zeros((8, 8, 3, 3), np.int16)
    bad_x, bad_w = x.copy(), w.copy()
    bad_x[0, 3, 2, 1] = -256
    bad_w[5, 0, 1, 1] = 256
    with pytest.raises(ValueError, match=r"int16 data must lie in \[-255, 255\].*got magnitude 256"):
        op(bad_x, w)
    with pytest.raises(ValueError, match=r"int16 weight must lie in \[-255, 255\].*got magnitude 256"):
        op(x, bad_w)
    with pytest.raises(ValueError, match=r"int16 weight must lie in \[-255, 255\]"):
        op.pack_weights(np.full((8, 8, 3, 3), np.iinfo(np.int16).min, np.int16))


def test_numpy_dtypes_are_accepted_and_int16_goes_with_int16():
    op = schedules.conv2d((1, 8, 5, 5), (8, 8, 3, 3), dtype=np.dtype("int8"), target="armv7-neon",
                          weight_dtype=np.dtype("uint8"))
    assert (op.dtype, op.weight_dtype) == ("int8", "uint8")
    with pytest.raises(ValueError, match="int16 is the legalized, zero-point-free form"):
        schedules.conv2d((1, 8, 5, 5), (8, 8, 3, 3), dtype="int8", target="armv7-neon", weight_dtype="int16")
