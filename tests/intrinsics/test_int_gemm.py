"""Intrinsic level, x86 integer tiles: registration contract, bit-exact numerics (natively, or on
the Bochs CPU where the host lacks the ISA) through each tile's intrinsic and through direct calls
of the batch-reduce and requantizing variants, and the K loop each one compiles to.

Coverage by host: AVX-512 VNNI, AVX-512BW and AVX2 run natively or on Bochs everywhere. AVX-VNNI
runs natively only on hosts with avx_vnni; elsewhere its IR is compiled for AVX-512 VNNI (the
same ymm instruction, EVEX-encoded) and run on Bochs, so its numerics are checked but not the VEX
encoding's execution. The VEX form is checked in the assembly on every host."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from intrinsics.int_gemm import intrin_name, register_int_gemm
from intrinsics.tile_module import TileLayout, compile_tile
from microkernels import TileError, asm
from microkernels.int_gemm import IntGemmKernel, default_int_kernel, max_tiles, out_range
from microkernels.isa import AVX2, AVX512, AVX512_VNNI, AVX_VNNI, X86_INT_ISAS

from ..testers.common import layouts
from ..testers.int_gemm import INT32_MAX, INT32_MIN, IntGemmTester, KernelCallTester
from ..x86_exec import how

KERNELS = [
    *(default_int_kernel(n) for n in X86_INT_ISAS),
    IntGemmKernel(AVX512_VNNI, 2, 16), IntGemmKernel(AVX512_VNNI, 14, 32), IntGemmKernel(AVX512_VNNI, 3, 48),
    IntGemmKernel(AVX_VNNI, 4, 24), IntGemmKernel(AVX512, 5, 32), IntGemmKernel(AVX2, 2, 32),
    # the vpmaddubsw pairs tile, its weights within the pair bound (testers.int_gemm.draw)
    IntGemmKernel(AVX2, 5, 16, pairs=True), IntGemmKernel(AVX2, 12, 8, pairs=True),
    IntGemmKernel(AVX512, 6, 64, pairs=True),
    # prefetching the next call's B (what the convs run): the same numerics
    IntGemmKernel(AVX512_VNNI, 14, 32, prefetch=True), IntGemmKernel(AVX2, 6, 16, prefetch=True),
    IntGemmKernel(AVX2, 5, 16, pairs=True, prefetch=True),
]


def _ids(k):
    return f"{k.name}-{how(k.isa)}"


def test_contract_returns_registered_names_once():
    kern = default_int_kernel("avx512vnni")
    name = register_int_gemm(kern, 64)
    assert name == "mk_u8s8_gemm_6x64_avx512vnni_k64" == intrin_name(kern, 64)
    assert register_int_gemm(kern, 64) == name


@pytest.mark.parametrize("kern, k, msg", [
    (default_int_kernel("avx512vnni"), 30, "K must be a positive multiple of 4 for mk_u8s8_gemm_6x64_avx512vnni"),
    (default_int_kernel("avx2"), 3, "K must be a positive multiple of 2"),
    (default_int_kernel("avx2"), 0, "K must be a positive multiple of 2"),
    (default_int_kernel("avx512vnni"), 4, "K=4 is one group of 4 .* use K >= 8"),
    (IntGemmKernel(AVX2, 1, 16), 8, "MR must be >= 2 for an intrinsic"),
    (IntGemmKernel(AVX2, 6, 16, accumulate=False), 8, "the GEMM intrinsic is the plain accumulating tile"),
    (IntGemmKernel(AVX2, 6, 16, batch_reduce=True), 8, "the GEMM intrinsic is the plain accumulating tile"),
], ids=lambda v: getattr(v, "name", str(v)))
def test_bad_intrinsic_requests_are_refused(kern, k, msg):
    with pytest.raises(TileError, match=msg):
        register_int_gemm(kern, k)


@pytest.mark.parametrize("kern", KERNELS, ids=_ids)
def test_tile_matches_numpy_exactly(kern):
    @settings(max_examples=6)
    @given(st.data(), st.integers(0, 2**32 - 1))
    def check(data, seed):
        lay = data.draw(layouts(kern, st.integers(2, 12).map(lambda n: n * kern.group)), "layout")
        IntGemmTester(kern, layout=lay).test(seed)

    check()


@pytest.mark.parametrize("isa_name", sorted(X86_INT_ISAS))
def test_each_k_and_column_lands_in_its_place(isa_name, rng):
    """One-hot A, B rows with a per-k pattern: a mis-indexed byte of a group, B row or column shows
    up as a wrong position, not just a wrong sum."""
    kern = default_int_kernel(isa_name)
    g, k = kern.group, 3 * kern.group
    tester = IntGemmTester(kern, k).at(lda=k + 3, ldb=g * (kern.nr + 2), ldc=kern.nr + 1, a_row=1, a_col=3,
                                      b_row=1, b_col=1, c_row=2, c_col=1)
    lay = tester.layout
    a_shape, b_shape, c_shape = tester.shapes()
    a = np.zeros(a_shape, kern.a_dtype)
    b = np.zeros(b_shape, kern.b_dtype)
    for i in range(kern.mr):
        a[lay.a_row + i, lay.a_col + (5 * i + 1) % k] = i + 1
    for kk in range(k):
        col = (np.arange(kern.nr) + kk) % 7 + 1
        b[lay.b_row + kk // g, lay.b_col:lay.b_col + kern.nr, kk % g] = col if kk % 2 else -col
    tester.check(a, b, rng.integers(-100, 100, c_shape, endpoint=True).astype(np.int32))


@pytest.mark.parametrize("isa_name", sorted(X86_INT_ISAS))
def test_extremes_fill_the_accumulator_exactly(isa_name):
    """The whole input range (u8 255 against s8 127 and -128; -255 against -+255 for the int16
    pack) with C0 chosen so the sums end exactly at INT32_MAX (even columns, positive products)
    and INT32_MIN (odd, negative): an accumulator used to its last bit and no saturation
    anywhere (vpdpbusd, not vpdpbusds; vpmaddwd's pair sums never reach 2**31)."""
    kern = default_int_kernel(isa_name)
    k = 16 * kern.group
    tester = IntGemmTester(kern, k).at(lda=k + 1, ldb=kern.group * (kern.nr + 1), ldc=kern.nr + 2, a_col=1, b_col=1, c_col=1)
    lay = tester.layout
    a_shape, b_shape, c_shape = tester.shapes()
    a_val, b_pos, b_neg = (255, 127, -128) if kern.op == "u8s8" else (-255, -255, 255)
    a = np.full(a_shape, a_val, kern.a_dtype)
    b = np.full(b_shape, b_neg, kern.b_dtype)
    b[:, lay.b_col:lay.b_col + kern.nr:2, :] = b_pos
    c = np.zeros(c_shape, np.int32)
    even = np.arange(kern.nr) % 2 == 0
    c[:, lay.c_col:lay.c_col + kern.nr] = np.where(even, INT32_MAX - k * a_val * b_pos, INT32_MIN - k * a_val * b_neg)
    tile = tester.check(a, b, c)[lay.tile(kern)]
    assert (tile[:, 0::2] == INT32_MAX).all() and (tile[:, 1::2] == INT32_MIN).all(), tile


@pytest.mark.parametrize("isa_name", sorted(X86_INT_ISAS))
def test_past_the_bound_the_accumulator_wraps_like_int32(isa_name):
    """Beyond the exactness bound the sums wrap modulo 2**32, as numpy's int64 sums cast to int32
    do: the non-saturating instruction (vpdpbusds would stick at INT32_MAX). The schedules refuse
    reductions long enough for this; the kernel itself must not hide it."""
    kern = default_int_kernel(isa_name)
    k = 4 * kern.group
    tester = IntGemmTester(kern, k)
    a_shape, b_shape, c_shape = tester.shapes()
    a_val, b_val = (255, 127) if kern.op == "u8s8" else (255, 255)
    a, b = np.full(a_shape, a_val, kern.a_dtype), np.full(b_shape, b_val, kern.b_dtype)
    c = np.full(c_shape, INT32_MAX - 10, np.int32)
    got = tester.run(a, b, c)[:kern.mr, :kern.nr]
    want = (np.int64(INT32_MAX - 10) + k * a_val * b_val + 2**31) % 2**32 - 2**31
    assert (got == want).all() and want < 0, (got[0, 0], want)


@pytest.mark.parametrize("isa", [AVX2, AVX512], ids=lambda i: i.name)
def test_pairs_tile_is_exact_at_the_bound_and_saturates_past_it(isa):
    """The pairs tile with A at 255: weight pairs with |w_a| + |w_b| = 128 (64 + 64, -128 + 0,
    -64 - 64) give exact sums; a pair at 129 (65 + 64) saturates vpmaddubsw's int16 at 32767 where
    the exact sum is 32895, which is why the schedules prove the bound before taking this tile."""
    kern = IntGemmKernel(isa, 2, isa.lanes, pairs=True)
    k = 4 * kern.group
    tester = IntGemmTester(kern, k)
    a_shape, b_shape, c_shape = tester.shapes()
    a = np.full(a_shape, 255, np.uint8)
    b = np.zeros(b_shape, np.int8).reshape(-1, 2)
    b[:] = [[64, 64], [-128, 0], [-64, -64], [0, -128]] * (len(b) // 4)
    c = np.zeros(c_shape, np.int32)
    tester.check(a, b.reshape(b_shape), c)
    b[:] = [65, 64]
    got = tester.run(a, b.reshape(b_shape), c)[:kern.mr, :kern.nr]
    assert (got == k // 2 * 32767).all(), (got[0, 0], k // 2 * 255 * 129)


# --- the variants without an intrinsic, one direct call each ----------------------------------

VARIANT_ISAS = [X86_INT_ISAS[n] for n in sorted(X86_INT_ISAS)]


@pytest.mark.parametrize("isa", VARIANT_ISAS, ids=how)
@pytest.mark.parametrize("accumulate", [True, False], ids=["acc", "beta0"])
def test_batch_reduce_sums_the_whole_batch(isa, accumulate):
    mr, nr = 4, 2 * isa.lanes
    kern = IntGemmKernel(isa, mr, nr, accumulate=accumulate, batch_reduce=True)

    @settings(max_examples=4)
    @given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 2), st.integers(1, 6), st.integers(0, 2**32 - 1))
    def check(n1, n2, n3, kg, seed):
        KernelCallTester(kern, kg * kern.group, (n1, n2, n3)).test(seed)

    check()


@pytest.mark.parametrize("isa", VARIANT_ISAS, ids=how)
def test_plain_and_beta0_calls_with_free_strides(isa):
    for accumulate in (True, False):
        kern = IntGemmKernel(isa, 3, isa.lanes, accumulate=accumulate)
        KernelCallTester(kern, 5 * kern.group, pad=5).test(7)


@pytest.mark.parametrize("isa", VARIANT_ISAS, ids=how)
@pytest.mark.parametrize("out", ["uint8", "int8", "float32"])
def test_requantized_store_is_onnx_rounding_bit_for_bit(isa, out):
    """float32(acc + bias) * scale, round half to even, + zp, saturate; random zero points and
    scales over four decades, so outputs land on both bounds and in between."""
    kern = IntGemmKernel(isa, 5, 2 * isa.lanes, batch_reduce=True, requant=out)
    seen = set()
    for seed in range(3):
        tile, _ = KernelCallTester(kern, 24 * kern.group, (2, 1, 3)).test(seed, "draw")
        seen |= set(np.unique(tile).tolist()) if out != "float32" else set()
    if out != "float32":
        lo, hi = (0, 255) if out == "uint8" else (-128, 127)
        assert lo in seen and hi in seen and len(seen) > 20, "the data did not reach both bounds and the middle"


@pytest.mark.parametrize("kern", [
    IntGemmKernel(AVX2, 3, 24, batch_reduce=True, requant="uint8", pairs=True),  # packed store, an odd vector
    IntGemmKernel(AVX2, 4, 16, batch_reduce=True, requant="int8", pairs=True),
    IntGemmKernel(AVX_VNNI, 2, 8, batch_reduce=True, requant="uint8"),
    IntGemmKernel(AVX512, 2, 48, batch_reduce=True, requant="int8", pairs=True),  # the generic store
], ids=lambda k: f"{k.name}-{how(k.isa)}")
def test_requantized_store_saturates_values_past_int32(kern):
    """Scales that carry float32(acc + bias) * scale past int32's range both ways (the packed
    store's vcvtps2dq then gives INT_MIN, which its saturating packs must keep at the low end),
    and a ReLU bound and an upper bound inside the dtype's range: every output is lo or hi where
    the reference says so, bit for bit, with random zero points and the relu'd lower bound."""
    lo, hi = out_range(kern.requant)
    rng = np.random.default_rng(5)
    seen = set()
    for seed in range(4):
        scale = (rng.choice([-1, 1], kern.nr) * 10.0 ** rng.uniform(-6, 6, kern.nr)).astype(np.float32)
        scale[::3] = np.abs(scale[::3]) * 1e5  # past int32 for most accumulators
        zp = int(rng.integers(lo, hi + 1))
        bounds = [(zp, lo, hi), (zp, max(lo, zp), hi), (zp, lo + 3, hi - 5)][seed % 3]
        tile, _ = KernelCallTester(kern, 8 * kern.group, (2, 1, 1)).test(seed, bounds, scale=np.abs(scale))
        seen |= set(np.unique(tile).tolist())
    assert lo in seen and hi in seen and len(seen) > 10, sorted(seen)


@pytest.mark.parametrize("isa", [AVX512_VNNI, AVX_VNNI, AVX2], ids=how)
def test_requantization_ties_and_relu_bounds(isa):
    """Values exactly on .5 go to the even neighbour (2.5 -> 2, 3.5 -> 4, -2.5 -> -2, -3.5 -> -4),
    and a lower bound raised to the zero point is a fused ReLU."""
    kern = IntGemmKernel(isa, 2, isa.lanes, requant="int8")
    tester = KernelCallTester(kern, kern.group, pad=0)
    a = np.zeros(tester.sizes[0], kern.a_dtype)  # acc = 0: the tile is q(bias)
    b = np.zeros(tester.sizes[1], kern.b_dtype)
    ties = np.array([5, 7, -5, -7, 1, -1, 3, 0] * (isa.lanes // 8), np.int32)
    half = np.full(isa.lanes, 0.5, np.float32)
    tile, _ = tester.test(0, (0, -128, 127), a=a, b=b, bias=ties, scale=half)
    assert tile[0, :8].tolist() == [2, 4, -2, -4, 0, 0, 2, 0]
    tile, _ = tester.test(0, (3, 3, 127), a=a, b=b, bias=ties, scale=half)
    assert tile[0, :8].tolist() == [5, 7, 3, 3, 3, 3, 5, 3]


# --- the K loop in the assembly ---------------------------------------------------------------

ACCEPTED = [IntGemmKernel(isa, mr, nr) for isa in X86_INT_ISAS.values() for mr, nr in max_tiles(isa, 64)
            if nr in (isa.lanes, 2 * isa.lanes, 4 * isa.lanes)]
ACCEPTED += [IntGemmKernel(isa, mr, nr, pairs=True) for isa in (AVX2, AVX512) for mr, nr in max_tiles(isa, 64, True)
             if nr in (isa.lanes, 2 * isa.lanes, 4 * isa.lanes)]
ACCEPTED += [default_int_kernel(n, prefetch=True) for n in X86_INT_ISAS]
ACCEPTED += [default_int_kernel(n, pairs=True, prefetch=True) for n in (AVX2.name, AVX512.name)]


@pytest.mark.parametrize("kern", ACCEPTED, ids=lambda k: k.name)
def test_k_loop_is_the_tile_and_nothing_else(kern):
    """One K loop of exactly MR * NR/lanes vpdpbusd (or vpmaddwd + vpaddd, or vpmaddubsw +
    vpmaddwd by ones + vpaddd) on the ISA's registers,
    NR/lanes B loads, MR broadcasts, a prefetching kernel's one prefetcht1 per B load, no stores,
    no stack traffic. Compiled only."""
    lib = compile_tile(kern, TileLayout.dense(kern, 8 * kern.group))  # the kernel's own target, run or not
    fn = asm.compute_function(lib.mod.inspect_source("asm"))
    loops = [lp for lp in asm.single_block_loops(fn) if any(m in i for i in lp.body for m in ("vpdpbusd", "vpmaddwd"))]
    assert len(loops) == 1, f"expected one K loop, found {len(loops)}"
    problems = asm.int_tile_loop_problems(loops[0], kern.isa, kern.op, kern.mr, kern.vectors_per_row,
                                          prefetches=kern.vectors_per_row if kern.prefetch else 0)
    assert problems == [], f"{kern.name}: {problems}\n" + "\n".join(loops[0].body)
    if kern.isa is AVX_VNNI:
        assert all(i.startswith("{vex} vpdpbusd") for i in loops[0].body if "vpdpbusd" in i)

