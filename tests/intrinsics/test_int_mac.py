"""Intrinsic level, integer NEON tiles: registration contract, bit-exact numerics under qemu through
each tile's intrinsic, and the K loop each one compiles to."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import s_tir

from intrinsics.int_mac import aarch64_int8_dot, aarch64_int16_mac, intrin_name, neon_int16_mac, register_mac
from microkernels import AARCH64, AARCH64_DOT, ARM_ISAS, NEON, TileError, asm
from microkernels.int_mac import MacKernel, default_mac_kernel, max_mac_tiles

from ..arm_tools import require_emulator
from ..testers.common import layouts
from ..testers.int_mac import INT32_MAX, INT32_MIN, MacTester, bounds

# Every kernel's default tile, and other legal shapes: odd MR (ARMv7 A rows are d registers, two
# to a q), the smallest intrinsic MR, and NR = 16 (two B vectors per row or group).
KERNELS = [
    default_mac_kernel("neon"), MacKernel(NEON, 2, 16), MacKernel(NEON, 3, 8),
    default_mac_kernel("aarch64"), MacKernel(AARCH64, 6, 8), MacKernel(AARCH64, 4, 16), MacKernel(AARCH64, 2, 8),
    default_mac_kernel("aarch64dot"), MacKernel(AARCH64_DOT, 4, 16), MacKernel(AARCH64_DOT, 2, 8),
]
DEFAULTS = [default_mac_kernel(n) for n in ("neon", "aarch64", "aarch64dot")]


def _ids(k):
    return k.name


# --- registration contract ------------------------------------------------------------------


def test_contract_returns_registered_names_once():
    n1 = neon_int16_mac(4, 8, 64)
    assert n1 == "mk_s16_mac_4x8_neon_k64" == intrin_name(default_mac_kernel("neon"), 64)
    assert aarch64_int16_mac(8, 8, 64) == "mk_s16_mac_8x8_aarch64_k64"
    assert aarch64_int8_dot(8, 8, 64) == "mk_s8_dot_8x8_aarch64dot_k64"
    assert neon_int16_mac(4, 8, 64) == n1  # second call: no re-registration error
    assert register_mac(MacKernel(NEON, 4, 8), 64) == n1
    assert s_tir.TensorIntrin.get(n1) is not None


@pytest.mark.parametrize(
    "call, msg",
    [(lambda: neon_int16_mac(4, 8, 6), r"K must be a positive multiple of 4 for mk_s16_mac_4x8_neon .* got 6"),
     (lambda: neon_int16_mac(4, 8, 0), "K must be a positive multiple of 4 .* got 0"),
     (lambda: neon_int16_mac(4, 8, -4), "K must be a positive multiple of 4 .* got -4"),
     (lambda: aarch64_int16_mac(8, 8, 4), "K must be a positive multiple of 8 for mk_s16_mac_8x8_aarch64 .* got 4"),
     (lambda: aarch64_int16_mac(8, 8, 12), "K must be a positive multiple of 8 .* got 12"),
     (lambda: aarch64_int8_dot(8, 8, 8), "K must be a positive multiple of 16 for mk_s8_dot_8x8_aarch64dot .* got 8"),
     (lambda: aarch64_int8_dot(8, 8, 0), "K must be a positive multiple of 16 .* got 0"),
     (lambda: aarch64_int8_dot(8, 8, 40), "K must be a positive multiple of 16 .* got 40"),
     (lambda: aarch64_int8_dot(8, 8, 16.0), r"K must be .* got 16\.0"),
     (lambda: neon_int16_mac(1, 8, 16), "MR must be >= 2 for an intrinsic, got 1"),
     (lambda: aarch64_int16_mac(1, 16, 16), "MR must be >= 2 for an intrinsic, got 1"),
     (lambda: aarch64_int8_dot(1, 8, 32), "MR must be >= 2 for an intrinsic, got 1"),
     (lambda: neon_int16_mac(6, 8, 16), "6x8 tile needs 17 q registers"),
     (lambda: aarch64_int8_dot(4, 12, 16), "NR=12 must be a multiple of 8")],
)
def test_bad_intrinsic_requests_are_refused(call, msg):
    with pytest.raises(TileError, match=msg):
        call()


# --- numerics under qemu ----------------------------------------------------------------------


@pytest.mark.parametrize("kern", KERNELS, ids=_ids)
def test_tile_matches_numpy_exactly(kern):
    require_emulator(kern.isa.arch)  # before hypothesis, which would shrink a missing toolchain

    @settings(max_examples=12)
    @given(st.data(), st.integers(0, 2**32 - 1))
    def check(data, seed):
        lay = data.draw(layouts(kern, st.integers(1, 8).map(lambda n: n * kern.k_step)), "layout")
        MacTester(kern, layout=lay).test(seed, data.draw(bounds(kern, lay.k), "bounds"))

    check()


@pytest.mark.parametrize("kern", DEFAULTS, ids=_ids)
def test_each_k_and_column_lands_in_its_place(kern, rng):
    """One-hot A and B: every (row, k, column) product must reach exactly C[row, column]; a
    mis-indexed lane, group or B row shows up as a wrong position, not just a wrong sum."""
    k = 2 * kern.k_step
    tester = MacTester(kern, k).at(lda=k + 3, ldb=4 * (kern.nr + 2) if kern.op == "dot" else kern.nr + 5,
                                   ldc=kern.nr + 1, a_row=1, a_col=3, b_row=1, b_col=1, c_row=2, c_col=1)
    lay = tester.layout
    a_shape, b_shape, c_shape = tester.shapes()
    a = np.zeros(a_shape, kern.dtype)
    b = np.zeros(b_shape, kern.dtype)
    # A[i, k] = i + 1 only at k = (3i + 1) mod K, B's k-th row = weights 1..NR times a per-k sign.
    for i in range(kern.mr):
        a[lay.a_row + i, lay.a_col + (3 * i + 1) % k] = i + 1
    for kk in range(k):
        col = (np.arange(kern.nr) + kk) % 7 + 1
        row = (col if kk % 2 else -col).astype(kern.dtype)
        if kern.op == "dot":
            b[lay.b_row + kk // 4, lay.b_col:lay.b_col + kern.nr, kk % 4] = row
        else:
            b[lay.b_row + kk, lay.b_col:lay.b_col + kern.nr] = row
    c = rng.integers(-100, 100, c_shape, dtype=np.int32, endpoint=True)
    tester.check(a, b, c)


@pytest.mark.parametrize("kern, low, high", [
    (MacKernel(AARCH64_DOT, 8, 8), -128, 127), (MacKernel(AARCH64_DOT, 2, 16), -128, 127),
    (default_mac_kernel("neon"), -255, 255), (default_mac_kernel("aarch64"), -255, 255), (MacKernel(AARCH64, 2, 16), -255, 255),
], ids=lambda v: v.name if isinstance(v, MacKernel) else str(v))
def test_extremes_fill_the_accumulator_exactly(kern, low, high):
    """The whole input range: int8 for sdot, +-255 (8-bit data less its zero point) for the int16
    MAC. All-`low` A against `low` (even tile columns: products low*low > 0) and `high` (odd:
    low*high < 0) B, with C0 chosen so the sums end exactly at INT32_MAX and INT32_MIN: sign
    handling, and an accumulator used to its last bit without ever overflowing (sums are monotone)."""
    k = 8 * kern.k_step
    ldb = 4 * (kern.nr + 1) if kern.op == "dot" else kern.nr + 1
    tester = MacTester(kern, k).at(lda=k + 1, ldb=ldb, ldc=kern.nr + 2, a_col=1, b_col=1, c_col=1)
    lay = tester.layout
    a_shape, b_shape, c_shape = tester.shapes()
    a = np.full(a_shape, low, kern.dtype)
    b = np.full(b_shape, high, kern.dtype)
    b[:, lay.b_col:lay.b_col + kern.nr:2, ...] = low
    c = np.zeros(c_shape, np.int32)
    even = np.arange(kern.nr) % 2 == 0
    c[:, lay.c_col:lay.c_col + kern.nr] = np.where(even, INT32_MAX - k * low * low, INT32_MIN - k * low * high)
    got = tester.check(a, b, c)
    tile = got[lay.tile(kern)]
    assert (tile[:, 0::2] == INT32_MAX).all() and (tile[:, 1::2] == INT32_MIN).all(), tile


# --- the K loop in the assembly ---------------------------------------------------------------


# Every tile the register budget accepts (NR up to 32): the budget is only honest if none spills.
ACCEPTED = [MacKernel(isa, mr, nr) for isa in ARM_ISAS.values() for mr, nr in max_mac_tiles(isa, 32)]


@pytest.mark.parametrize("kern", ACCEPTED, ids=_ids)
def test_k_loop_is_the_tile_and_nothing_else(kern):
    """One K loop of exactly instructions_per_step by-lane MACs (vmlal.s16 / smlal(2) / sdot), no
    widening, no stores, no stack traffic. Compiled only: no emulator needed."""
    fn = asm.compute_function(MacTester(kern, 8 * kern.k_step).compile().mod.inspect_source("asm"))
    loops = asm.mac_loops(fn, kern.isa.arch)
    assert len(loops) == 1, f"expected one K loop, found {len(loops)}"
    problems = asm.mac_loop_problems(loops[0], kern.isa.name, kern.instructions_per_step)
    assert problems == [], f"{kern.name}: {problems}\n" + "\n".join(loops[0].body)
