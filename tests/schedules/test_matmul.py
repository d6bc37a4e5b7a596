"""schedules.matmul: numerics over awkward shapes, its hot loop, threads, and refused inputs."""

import importlib

import numpy as np
import pytest
import tvm
from hypothesis import given
from hypothesis import strategies as st

import microkernels.isa
import schedules
from microkernels import ISAS, MATMUL_TILES, GemmKernel, TileError, asm, best_host_isa
from schedules import Blocking, UnsupportedHostError
from schedules.matmul import plan

from ..conftest import Spy, assert_close_f32, unaligned
from ..x86_exec import HOST

matmul_module = importlib.import_module("schedules.matmul")  # schedules.matmul is the function
# Every x86 preset this host runs (AVX-512 paths on an AVX2-only host: see test_x86_targets).
HOST_PRESETS = [p for p in ("x86-avx512", "x86-avx2") if ISAS[p[4:]].host_supports()]
# 1, primes, tile and block edges, and sizes that straddle the kc / MC / NC blocks.
DIMS = st.one_of(st.sampled_from([1, 2, 3, 5, 7, 13, 16, 17, 31, 97, 256, 257, 263]), st.integers(1, 300))


@given(M=DIMS, N=DIMS, K=DIMS, threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**32 - 1))
def test_matmul_matches_numpy(M, N, K, threads, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    op = schedules.matmul(M, N, K, target=HOST, threads=threads)
    c = op(a, b)
    assert c.shape == (M, N) and c.dtype == np.float32
    assert_close_f32(c, a, b)


# Each way through the op, on the first matmul tile of each ISA (8x32, 6x16: 48 rows and 64
# columns are whole tiles of both): (pack_a, crop, tail op).
PATHS = [
    ((48, 64, 40, None), False, False, False),  # A in place, the tiles write C itself
    ((48, 50, 40, None), False, True, False),  # N ragged: scratch tiles cropped into C
    ((61, 64, 40, None), False, False, True),  # MR does not divide 61: a tail op for the last rows
    ((48, 64, 100, 32), False, False, False),  # 4 slices of 25
    ((48, 64, 101, 32), True, False, False),  # 101 is prime: 4 slices of 26 overhang K, A packed
    ((1, 64, 40, None), True, True, False),  # one row: a tile of 2 (padded), A packed
]


@pytest.mark.parametrize("preset", HOST_PRESETS)
@pytest.mark.parametrize("shape, pack_a, crop, tail", PATHS)
def test_every_path_matches_numpy_on_unaligned_arrays(preset, shape, pack_a, crop, tail, rng):
    M, N, K, kc_max = shape
    isa = ISAS[preset[4:]]
    mr, nr, _ = MATMUL_TILES[isa.name][0]
    op = schedules.matmul(M, N, K, target=preset, blocking=Blocking(kc_max), kernel=GemmKernel(isa, mr, nr))
    assert (op.plan.pack_a, op.plan.crop, op.tail is not None) == (pack_a, crop, tail)
    assert ("C_tiles" in op.lib.mod.inspect_source("ll")) == crop  # the scratch tiles exist only then
    if tail:
        assert op.plan.M % mr == 0 and 2 <= M - op.plan.M <= mr + 1 and op.tail.M == M - op.plan.M
    a = unaligned(rng.standard_normal((M, K), dtype=np.float32))
    b = rng.standard_normal((K, N), dtype=np.float32)
    out = unaligned(np.zeros((M, N), np.float32))  # the tiles store to it unaligned
    assert op(a, b, out=out) is out
    assert_close_f32(out, a, b)
    np.testing.assert_array_equal(op(tvm.runtime.tensor(np.ascontiguousarray(a)), b), out)
    assert len(op.time(a, b, number=1, repeat=2)) == 2


def test_an_emulated_op_with_a_tail_op_joins_their_rows(rng):
    M, N, K = 61, 40, 24
    op = schedules.matmul(M, N, K, target="x86-avx512", emulate=True, kernel=GemmKernel(ISAS["avx512"], 8, 32))
    assert op.tail is not None and op.tail.emulate
    a, b = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
    assert_close_f32(op(a, b), a, b)
    with pytest.raises(ValueError, match="returns its output"):
        op(a, b, out=np.zeros((M, N), np.float32))


def test_a_tail_op_reads_and_writes_the_callers_rows_in_place(rng):
    """The main module gets the caller's A and C, the tail op the same buffers from its first
    row on: no copies."""
    M, N, K = 61, 64, 40
    op = schedules.matmul(M, N, K, target=HOST, threads=1, kernel=GemmKernel(best_host_isa(), 8, 32)
                          if best_host_isa().name == "avx512" else GemmKernel(best_host_isa(), 6, 16))
    op.lib, op.tail.lib = Spy(op.lib), Spy(op.tail.lib)
    a, b = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
    out = np.zeros((M, N), np.float32)
    op(a, b, out=out)
    m = op.plan.M
    assert op.lib.seen == [[a.ctypes.data, b.ctypes.data, out.ctypes.data]]
    assert op.tail.lib.seen == [[a[m:].ctypes.data, b.ctypes.data, out[m:].ctypes.data]]
    assert_close_f32(out, a, b)


@pytest.mark.parametrize("isa, M, N, K, tile, how", [
    ("avx512", 56, 100, 64, (8, 32), "none"),
    ("avx512", 9, 100, 64, (9, 32), "none"),  # a few rows: one tile of exactly M
    ("avx512", 3, 100, 64, (3, 32), "none"),
    ("avx512", 61, 100, 64, (7, 32), "pack"),  # 63 padded rows beat a second op that packs B again
    ("avx512", 1000, 1000, 1000, (4, 48), "none"),  # 1008 columns of 48 pad less than 1024 of 32
    ("avx2", 1024, 1024, 1024, (4, 24), "none"),
    ("avx2", 3136, 64, 576, (6, 16), "tail"),  # N = 64: packing A would cost 17% of the multiply
    ("avx2", 49, 2048, 512, (5, 16), "pack"),  # a tail op would pack all of B a second time
])
def test_plan_weighs_padding_packing_and_a_tail_op(isa, M, N, K, tile, how):
    p = plan(M, N, K, ISAS[isa])
    got = "pack" if p.pack_a else "tail" if p.M < M else "none"
    assert ((p.kernel.mr, p.kernel.nr), got) == (tile, how)


def test_plan_slices_k_to_keep_a_b_panel_in_half_of_l2(monkeypatch):
    monkeypatch.setattr(matmul_module, "host_cache_bytes", lambda level, default: 1 << 20)
    assert Blocking().kc_limit(32) == 4096  # 4096 x 32 floats = 512 KiB
    p = plan(64, 64, 5000, ISAS["avx512"])
    assert (p.nk, p.kc, p.pack_a) == (2, 2500, False)
    monkeypatch.setattr(matmul_module, "host_cache_bytes", lambda level, default: default)
    assert Blocking().kc_limit(32) == 2048  # sysfs silent: a 512 KiB L2


@pytest.mark.parametrize("shape, kernel", [((61, 50, 37), None), ((61, 64, 40), (8, 32)), ((64, 64, 40), None)])
def test_phases_compute_what_the_op_does(shape, kernel, rng):
    """bench gemm --breakdown times these modules: run in turn, they give the op's C exactly."""
    M, N, K = shape
    isa = ISAS["avx512"] if kernel else best_host_isa()
    op = schedules.matmul(M, N, K, target=f"x86-{isa.name}", threads=1, emulate=not isa.host_supports(),
                          kernel=GemmKernel(isa, *kernel) if kernel else None)
    if kernel:
        assert op.tail is not None and op.tail.tail is None
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    phases = op.phases()
    assert set(phases) == ({"pack_a"} if op.plan.pack_a else set()) | {"pack_b", "kernel"} | (
        {"tail1"} if op.tail else set())
    if op.emulate:
        return  # the modules are AVX-512 code this host cannot run

    def run(part, *inputs):
        lib, shapes = phases[part]
        args = [tvm.runtime.tensor(x) for x in inputs] + [tvm.runtime.tensor(np.full(shapes[-1], np.nan, np.float32))]
        lib["main"](*args)
        return args[-1].numpy()

    m = op.plan.M
    a_in = run("pack_a", a) if op.plan.pack_a else a[:m]
    want = op(a, b)
    np.testing.assert_array_equal(run("kernel", a_in, run("pack_b", b))[:m, :N], want[:m])
    if op.tail:
        np.testing.assert_array_equal(run("tail1", a[m:], b), want[m:])


def test_large_blocked_matmul(rng):
    """Several kc slices, MC row blocks and NC column blocks, with ragged edges in each."""
    M, N, K = 601, 2100, 777
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    assert_close_f32(schedules.matmul(M, N, K, target=HOST)(a, b), a, b)


@pytest.mark.parametrize("preset", ["x86-avx512", "x86-avx2"])
def test_hot_loop_is_the_tile(preset):
    op = schedules.matmul(300, 200, 500, target=preset)
    kern = op.kernel
    loops = asm.fma_loops(op.asm)  # the tile sits in TVM's parallel lambda
    assert loops, "no FMA loop in the matmul"
    for lp in loops:
        assert lp.count("vfmadd231ps") == kern.fmas_per_k
        assert lp.stack_accesses() == []


def test_avx512_on_a_host_without_it_raises(monkeypatch):
    monkeypatch.setattr(microkernels.isa, "host_cpu_flags", lambda: frozenset({"avx2", "fma"}))
    op = schedules.matmul(8, 8, 8, target="x86-avx512")  # compiling for it is fine anywhere
    assert "zmm" in op.asm
    with pytest.raises(UnsupportedHostError, match="avx512f"):
        op(np.zeros((8, 8), np.float32), np.zeros((8, 8), np.float32))


@pytest.mark.parametrize(
    "kwargs, exc, msg",
    [
        (dict(M=0, N=4, K=4), ValueError, "M must be >= 1"),
        (dict(M=4, N=-3, K=4), ValueError, "N must be >= 1"),
        (dict(M=4, N=4, K=2.5), TypeError, "K must be an int"),
        (dict(M=4, N=4, K=4, threads=0), ValueError, "threads must be >= 1"),
        (dict(M=4, N=4, K=4, threads=2**31), ValueError, "threads=2147483648 is more than 1024"),
        (dict(M=50000, N=16, K=50000), ValueError, "A would hold 2500000000 elements .* int32 index"),
        (dict(M=4, N=4, K=4, target="x86-sse"), ValueError, "unknown target 'x86-sse'"),
        (dict(M=4, N=4, K=4, target="llvm -mcpu=skylake-avx512"), ValueError, "no longer parses target strings"),
        (dict(M=4, N=4, K=4, target={"kind": "llvm"}), ValueError, "unknown target"),
    ],
)
def test_bad_arguments(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        schedules.matmul(**kwargs)


def test_bad_kernel_for_target():
    from microkernels import GemmKernel

    with pytest.raises(ValueError, match="does not fit target"):
        schedules.matmul(8, 8, 8, target="x86-avx2", kernel=GemmKernel(ISAS["avx512"], 28, 16))
    with pytest.raises(TileError, match="needs"):
        schedules.matmul(8, 8, 8, target="x86-avx2", kernel=GemmKernel(ISAS["avx2"], 8, 16))


@pytest.mark.parametrize(
    "a, b, exc, msg",
    [
        (np.zeros((4, 5), np.float64), np.zeros((5, 6), np.float32), TypeError, "a must have dtype float32"),
        (np.zeros((4, 5), np.float32), np.zeros((5, 6), np.int32), TypeError, "b must have dtype float32"),
        (np.zeros((5, 4), np.float32), np.zeros((5, 6), np.float32), ValueError, r"a must have shape \(4, 5\)"),
        (np.zeros((4, 5), np.float32), np.zeros((6, 5), np.float32), ValueError, r"b must have shape \(5, 6\)"),
        (np.zeros((4, 5), np.float32), np.zeros((6, 5), np.float32).T, ValueError, "C-contiguous"),
        ([[0.0] * 5] * 4, np.zeros((5, 6), np.float32), TypeError, "numpy.ndarray"),
    ],
)
def test_bad_arrays(a, b, exc, msg):
    op = schedules.matmul(4, 6, 5, target=HOST)
    with pytest.raises(exc, match=msg):
        op(a, b)


def _aligned_rand(shape, seed=0):
    a = schedules.aligned_empty(shape)
    a[...] = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    return a


@pytest.mark.parametrize("place", [lambda a: a, unaligned], ids=["aligned", "unaligned"])
def test_matmul_hands_the_callers_buffers_to_the_module_at_any_alignment(place):
    """matmul declares A, B and C 4-byte aligned, so even unaligned arrays go in uncopied."""
    op = schedules.matmul(40, 48, 24, threads=1)
    a, b, out = place(_aligned_rand((40, 24))), place(_aligned_rand((24, 48), 1)), place(np.zeros((40, 48), np.float32))
    op.lib = Spy(op.lib)
    assert op(a, b, out=out) is out
    assert op.lib.seen[-1] == [a.ctypes.data, b.ctypes.data, out.ctypes.data]
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(op(a, tvm.runtime.tensor(np.ascontiguousarray(b))), out)
    with pytest.raises(ValueError, match=r"shape \(24, 48\)"):
        op(a, tvm.runtime.tensor(np.zeros((48, 24), np.float32)))


def test_read_only_operands_and_outputs():
    """Read-only A and B are valid (no copy where aligned); out over A or B, or a read-only out,
    is refused: the module reads A and B while it writes C."""
    op = schedules.matmul(40, 48, 24, threads=1)
    a, b = _aligned_rand((40, 24)), _aligned_rand((24, 48), 1)
    want = op(a, b)
    a.flags.writeable = b.flags.writeable = False
    op.lib = Spy(op.lib)
    np.testing.assert_array_equal(op(a, b), want)
    assert op.lib.seen[-1][:2] == [a.ctypes.data, b.ctypes.data]
    square = schedules.matmul(32, 32, 32, threads=1)
    s = _aligned_rand((32, 32), 2)
    big = _aligned_rand((64, 32), 4)
    for out in (s, big[16:48]):  # the same array, or rows that overlap A's last half
        with pytest.raises(ValueError, match="out overlaps a"):
            square(s if out is s else big[:32], _aligned_rand((32, 32), 3), out=out)
    with pytest.raises(ValueError, match="out overlaps b"):
        square(_aligned_rand((32, 32), 3), s, out=s)
    ro = np.zeros((40, 48), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        op(a, b, out=ro)


def test_threads_hold_on_every_python_thread():
    """TVM keeps one pool per calling thread: an op made with threads=1 runs with one thread
    from a thread that never sized its pool too (it ran TVM's default, one per core)."""
    import threading

    op = schedules.matmul(64, 64, 64, threads=1)
    a = _aligned_rand((64, 64))
    op(a, a)
    seen = []

    def call():
        op(a, a)
        seen.append(tvm.runtime.num_threads())

    t = threading.Thread(target=call)
    t.start()
    t.join()
    assert seen == [1]
