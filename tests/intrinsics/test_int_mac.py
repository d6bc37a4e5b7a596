"""Intrinsic level, integer NEON tiles: registration contract, bit-exact numerics under qemu through
each tile's intrinsic, and the K loop each one compiles to."""

from dataclasses import dataclass

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import s_tir
from tvm.script import tirx as T

from intrinsics.int_mac import aarch64_int8_dot, aarch64_int16_mac, intrin_name, neon_int16_mac, register_mac
from microkernels import AARCH64, AARCH64_DOT, ARM_ISAS, NEON, TileError, asm
from microkernels.int_mac import MacKernel, default_mac_kernel, max_mac_tiles
from schedules import emulate

from ..arm_tools import require_emulator

INT32_MAX = 2**31 - 1
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


@dataclass(frozen=True)
class IntLayout:
    """The tile inside larger buffers. A is (a_row + MR, lda), the tile at (a_row, a_col).
    mac: B is (b_row + K, ldb) with the tile at (b_row, b_col); dot: B is (b_row + K/4, ldb/4, 4)
    with the tile at group b_row, column b_col (ldb, the group stride, is a multiple of 4).
    C is (c_row + MR, ldc), the tile at (c_row, c_col)."""

    k: int
    lda: int
    ldb: int
    ldc: int
    a_row: int = 0
    a_col: int = 0
    b_row: int = 0
    b_col: int = 0
    c_row: int = 0
    c_col: int = 0

    @staticmethod
    def dense(kern, k):
        return IntLayout(k, k, kern.nr * (4 if kern.op == "dot" else 1), kern.nr)

    def shapes(self, kern):
        a = (self.a_row + kern.mr, self.lda)
        if kern.op == "dot":
            b = (self.b_row + self.k // 4, self.ldb // 4, 4)
        else:
            b = (self.b_row + self.k, self.ldb)
        return a, b, (self.c_row + kern.mr, self.ldc)


def tile_function(kern, lay):
    mr, nr, kk, dt = kern.mr, kern.nr, lay.k, kern.dtype
    ar, ac, br, bc, cr, cc = lay.a_row, lay.a_col, lay.b_row, lay.b_col, lay.c_row, lay.c_col
    a_shape, b_shape, c_shape = lay.shapes(kern)
    if kern.op == "dot":

        @T.prim_func(s_tir=True)
        def tile(A: T.Buffer(a_shape, dt), B: T.Buffer(b_shape, dt), C: T.Buffer(c_shape, "int32")):
            T.func_attr({"tirx.noalias": True})
            for i, j, g, t in T.grid(mr, nr, kk // 4, 4):
                with T.sblock("tile"):
                    vi, vj, vg, vt = T.axis.remap("SSRR", [i, j, g, t])
                    C[vi + cr, vj + cc] = C[vi + cr, vj + cc] + T.Cast("int32", A[vi + ar, vg * 4 + vt + ac]) * T.Cast(
                        "int32", B[vg + br, vj + bc, vt])

    else:

        @T.prim_func(s_tir=True)
        def tile(A: T.Buffer(a_shape, dt), B: T.Buffer(b_shape, dt), C: T.Buffer(c_shape, "int32")):
            T.func_attr({"tirx.noalias": True})
            for i, j, k in T.grid(mr, nr, kk):
                with T.sblock("tile"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi + cr, vj + cc] = C[vi + cr, vj + cc] + T.Cast("int32", A[vi + ar, vk + ac]) * T.Cast(
                        "int32", B[vk + br, vj + bc])

    sch = s_tir.Schedule(tile)
    sch.tensorize(sch.get_loops(sch.get_sblock("tile"))[0], register_mac(kern, kk))
    return sch.mod


def compile_tile(kern, lay):
    return tvm.compile(tile_function(kern, lay), target=kern.isa.target)


def reference(kern, lay, a, b, c):
    """C0 + A @ B on the tile, in int64; everything outside the tile unchanged."""
    mr, nr, k = kern.mr, kern.nr, lay.k
    a_t = a[lay.a_row:lay.a_row + mr, lay.a_col:lay.a_col + k].astype(np.int64)
    if kern.op == "dot":
        # B[g, j, t] is column j at k = 4g + t.
        b_t = b[lay.b_row:lay.b_row + k // 4, lay.b_col:lay.b_col + nr, :].transpose(0, 2, 1).reshape(k, nr)
    else:
        b_t = b[lay.b_row:lay.b_row + k, lay.b_col:lay.b_col + nr]
    out = c.astype(np.int64)
    out[lay.c_row:lay.c_row + mr, lay.c_col:lay.c_col + nr] += a_t @ b_t.astype(np.int64)
    assert -2**31 <= out.min() and out.max() <= INT32_MAX, "test data would overflow int32"
    return out


def run_tile(kern, lay, a, b, c):
    lib = compile_tile(kern, lay)
    (got,) = emulate.run(lib, kern.isa.arch, [a, b, c], outputs=[2])
    return got


def assert_tile_exact(kern, lay, a, b, c):
    got = run_tile(kern, lay, a, b, c)
    want = reference(kern, lay, a, b, c)
    rows, cols = slice(lay.c_row, lay.c_row + kern.mr), slice(lay.c_col, lay.c_col + kern.nr)
    outside = np.ones(c.shape, bool)
    outside[rows, cols] = False
    assert np.array_equal(got[outside], c[outside]), "the kernel wrote outside its tile"
    bad = got != want
    assert not bad.any(), (f"{bad.sum()} of {kern.mr * kern.nr} elements differ, first at "
                           f"{np.argwhere(bad)[0].tolist()}: got {got[bad][0]}, expected {want[bad][0]}")


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


@st.composite
def layouts(draw, kern):
    k = kern.k_step * draw(st.integers(1, 8))
    pad = st.integers(0, 9)
    a_row, a_col, c_row, c_col = draw(st.integers(0, 2)), draw(pad), draw(st.integers(0, 3)), draw(pad)
    b_row = draw(st.integers(0, 2))
    if kern.op == "dot":
        b_col = draw(st.integers(0, 3))  # in columns of 4 bytes: B tile starts at 4*b_col + groups
        ldb = 4 * (kern.nr + b_col + draw(st.integers(0, 3)))
    else:
        b_col = draw(pad)
        ldb = kern.nr + b_col + draw(pad)
    return IntLayout(k, k + a_col + draw(pad), ldb, kern.nr + c_col + draw(pad), a_row, a_col, b_row, b_col, c_row, c_col)


@st.composite
def bounds(draw, kern, k):
    """(max |a|, max |b|, max |c0|) with K * |a| * |b| + |c0| inside int32: one operand may use its
    whole range (int16 A of 32767 against small B, or the reverse), so sign and high bits of both
    operands are exercised without overflowing the accumulator."""
    c0 = draw(st.sampled_from([0, 1000, 2**20]))
    if kern.op == "dot":
        return 128, 128, c0
    big = draw(st.sampled_from([255, 4095, 32767]))
    small = min(32767, (INT32_MAX - c0) // (k * big))
    return (big, small, c0) if draw(st.booleans()) else (small, big, c0)


def random_operands(kern, lay, bound, seed):
    rng = np.random.default_rng(seed)
    ma, mb, mc = bound
    dt = np.dtype(kern.dtype)
    a_shape, b_shape, c_shape = lay.shapes(kern)
    lo = lambda m: max(-m, np.iinfo(dt).min)  # noqa: E731 (int8: -128 is legal, +128 is not)
    hi = lambda m: min(m, np.iinfo(dt).max)  # noqa: E731
    a = rng.integers(lo(ma), hi(ma), a_shape, dtype=dt, endpoint=True)
    b = rng.integers(lo(mb), hi(mb), b_shape, dtype=dt, endpoint=True)
    c = rng.integers(-mc, mc, c_shape, dtype=np.int32, endpoint=True)
    return a, b, c


@pytest.mark.parametrize("kern", KERNELS, ids=_ids)
def test_tile_matches_numpy_exactly(kern):
    require_emulator(kern.isa.arch)

    @settings(max_examples=12)
    @given(st.data(), st.integers(0, 2**32 - 1))
    def check(data, seed):
        lay = data.draw(layouts(kern), "layout")
        bound = data.draw(bounds(kern, lay.k), "bounds")
        assert_tile_exact(kern, lay, *random_operands(kern, lay, bound, seed))

    check()


@pytest.mark.parametrize("kern", DEFAULTS, ids=_ids)
def test_each_k_and_column_lands_in_its_place(kern, rng):
    """One-hot A and B: every (row, k, column) product must reach exactly C[row, column]; a
    mis-indexed lane, group or B row shows up as a wrong position, not just a wrong sum."""
    require_emulator(kern.isa.arch)
    k = 2 * kern.k_step
    lay = IntLayout(k, k + 3, 4 * (kern.nr + 2) if kern.op == "dot" else kern.nr + 5, kern.nr + 1,
                    a_row=1, a_col=3, b_row=1, b_col=1, c_row=2, c_col=1)
    a_shape, b_shape, c_shape = lay.shapes(kern)
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
    assert_tile_exact(kern, lay, a, b, c)


@pytest.mark.parametrize("kern, low, high", [
    (MacKernel(AARCH64_DOT, 8, 8), -128, 127), (MacKernel(AARCH64_DOT, 2, 16), -128, 127),
    (default_mac_kernel("neon"), -255, 255), (default_mac_kernel("aarch64"), -255, 255), (MacKernel(AARCH64, 2, 16), -255, 255),
], ids=lambda v: v.name if isinstance(v, MacKernel) else str(v))
def test_extremes_fill_the_accumulator_exactly(kern, low, high):
    """The whole input range: int8 for sdot, +-255 (8-bit data less its zero point) for the int16
    MAC. All-`low` A against `low` (even tile columns: products low*low > 0) and `high` (odd:
    low*high < 0) B, with C0 chosen so the sums end exactly at INT32_MAX and INT32_MIN: sign
    handling, and an accumulator used to its last bit without ever overflowing (sums are monotone)."""
    require_emulator(kern.isa.arch)
    k = 8 * kern.k_step
    ldb = 4 * (kern.nr + 1) if kern.op == "dot" else kern.nr + 1
    lay = IntLayout(k, k + 1, ldb, kern.nr + 2, a_col=1, b_col=1, c_col=1)
    a_shape, b_shape, c_shape = lay.shapes(kern)
    a = np.full(a_shape, low, kern.dtype)
    b = np.full(b_shape, high, kern.dtype)
    b[:, lay.b_col:lay.b_col + kern.nr:2, ...] = low
    c = np.zeros(c_shape, np.int32)
    even = np.arange(kern.nr) % 2 == 0
    c[:, lay.c_col:lay.c_col + kern.nr] = np.where(even, INT32_MAX - k * low * low, -2**31 - k * low * high)
    got = run_tile(kern, lay, a, b, c)
    tile = got[:, lay.c_col:lay.c_col + kern.nr]
    assert (tile[:, 0::2] == INT32_MAX).all() and (tile[:, 1::2] == -2**31).all(), tile
    assert np.array_equal(got, reference(kern, lay, a, b, c))


# --- the K loop in the assembly ---------------------------------------------------------------


# Every tile the register budget accepts (NR up to 32): the budget is only honest if none spills.
ACCEPTED = [MacKernel(isa, mr, nr) for isa in ARM_ISAS.values() for mr, nr in max_mac_tiles(isa, 32)]


@pytest.mark.parametrize("kern", ACCEPTED, ids=_ids)
def test_k_loop_is_the_tile_and_nothing_else(kern):
    """One K loop of exactly instructions_per_step by-lane MACs (vmlal.s16 / smlal(2) / sdot), no
    widening, no stores, no stack traffic. Compiled only: no emulator needed."""
    fn = asm.compute_function(compile_tile(kern, IntLayout.dense(kern, 8 * kern.k_step)).mod.inspect_source("asm"))
    loops = asm.mac_loops(fn, kern.isa.arch)
    assert len(loops) == 1, f"expected one K loop, found {len(loops)}"
    problems = asm.mac_loop_problems(loops[0], kern.isa.name, kern.instructions_per_step)
    assert problems == [], f"{kern.name}: {problems}\n" + "\n".join(loops[0].body)
