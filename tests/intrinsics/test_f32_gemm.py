"""Intrinsic level: registration contract, and each tile's numerics through its intrinsic."""

import numpy as np
import pytest
import tvm
from hypothesis import given
from hypothesis import strategies as st
from tvm import s_tir, te

import intrinsics
from microkernels import GemmKernel, TileError, max_tiles

from ..conftest import assert_close_f32
from ..testers.common import layouts
from ..testers.f32_gemm import GemmTester
from ..x86_exec import X86, X86_IDS, execute

# Every ISA: natively where the host runs it, on the Bochs CPU where it does not (x86_exec).
RUNNABLE = X86


def test_contract_returns_registered_names_once():
    n1 = intrinsics.avx512_fma_gemm(28, 16, 128)
    n2 = intrinsics.avx2_fma_gemm(6, 16, 128, accumulate=False)
    assert n1 == "mk_f32_gemm_28x16_avx512_k128"
    assert n2 == "mk_f32_gemm_6x16_avx2_beta0_k128"
    assert intrinsics.avx512_fma_gemm(28, 16, 128) == n1  # second call: no re-registration error
    assert {n1, n2} <= set(intrinsics.names())
    assert s_tir.TensorIntrin.get(n1) is not None


@pytest.mark.parametrize(
    "call, msg",
    [(lambda: intrinsics.avx512_fma_gemm(30, 32, 64), "needs"), (lambda: intrinsics.avx2_fma_gemm(6, 16, 1), "K must"),
     (lambda: intrinsics.avx2_fma_gemm(1, 16, 64), "MR must be >= 2"), (lambda: intrinsics.avx2_fma_gemm(6, 20, 64), "multiple")],
)
def test_bad_intrinsic_requests_are_refused(call, msg):
    with pytest.raises(TileError, match=msg):
        call()


def _tiles(isa):
    """Any tile within the budget with MR >= 2 (not just the maximal ones)."""
    return st.sampled_from(
        [(mr, nr) for mr0, nr in max_tiles(isa) for mr in range(2, mr0 + 1)]
    )


@st.composite
def gemm_testers(draw, isa):
    mr, nr = draw(_tiles(isa))
    kern = GemmKernel(isa, mr, nr, draw(st.booleans()))
    return GemmTester(kern, layout=draw(layouts(kern, st.integers(2, 300))))


@pytest.mark.parametrize("accumulate", [True, False])
@pytest.mark.parametrize("isa", RUNNABLE, ids=X86_IDS)
def test_row_strides_are_told_apart(isa, accumulate):
    """lda, ldb and ldc all different (matmul's packed panels have ldb = ldc = NR, where a kernel
    that mixed them up would pass), the tile away from every buffer edge."""
    mr, nr = max_tiles(isa)[0]
    k = 37
    GemmTester(GemmKernel(isa, mr, nr, accumulate), k).at(
        lda=k + 5, ldb=nr + 3, ldc=nr + 11, a_col=2, b_col=1, c_col=4, c_row=1).test(seed=7)


@pytest.mark.parametrize("isa", RUNNABLE, ids=X86_IDS)
def test_tile_matches_numpy(isa):
    @given(gemm_testers(isa), st.integers(0, 2**32 - 1))
    def check(tester, seed):
        tester.test(seed)

    check()


@pytest.mark.parametrize("isa", RUNNABLE, ids=X86_IDS)
def test_tile_extremes(isa):
    """Huge, tiny and signed-zero inputs: exact float32 semantics, no flush or reordering surprise."""
    tester = GemmTester(GemmKernel(isa, 2, isa.lanes), 4)
    a = np.array([[3e38, -3e38, 1e-30, 0.0], [-0.0, 1.0, 2.0, 3.0]], np.float32)
    b = np.tile(np.array([[1.0], [1.0], [1e-10], [-0.0]], np.float32), (1, isa.lanes))
    c = np.zeros(tester.shapes()[2], np.float32)
    got = tester.run(a, b, c)
    expect = np.zeros_like(c)  # the guard rows below the tile stay 0
    for i in range(2):  # the kernel's order: a sequence of float32 FMAs over k
        for kk in range(4):
            expect[i] = (expect[i].astype(np.float64) + np.float64(a[i, kk]) * b[kk].astype(np.float64)).astype(np.float32)
    assert np.array_equal(got, expect)


@pytest.mark.parametrize("isa", RUNNABLE, ids=X86_IDS)
def test_user_schedule_from_readme(isa):
    """The README's example: a hand-written schedule tensorizing onto the public intrinsic."""
    M, N, K = 12, 32, 128
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    sch = s_tir.Schedule(te.create_prim_func([A, B, C]))
    block = sch.get_sblock("C")
    i, j, kk = sch.get_loops(block)
    io, ii = sch.split(i, [None, 6])
    jo, ji = sch.split(j, [None, 16])
    sch.reorder(io, jo, ii, ji, kk)
    sch.tensorize(ii, getattr(intrinsics, f"{isa.name}_fma_gemm")(6, 16, K, accumulate=False))
    lib = tvm.compile(sch.mod, target=isa.target)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    c, = execute(lib, isa, [a, b, np.full((M, N), np.nan, np.float32)], [2])  # beta=0 must not read C
    assert_close_f32(c, a, b)



def _literal(kern, kk):
    """The description and implementation as they were written before K became a parameter
    (K a closure constant), the reference for the specialized ones."""
    from tvm.script import tirx as T

    mr, nr, sym, ir = kern.mr, kern.nr, kern.name, kern.llvm_ir()

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle):
        A = T.match_buffer(a, (mr, kk), "float32", offset_factor=1, strides=[T.int32(), 1], align=4)
        B = T.match_buffer(b, (kk, nr), "float32", offset_factor=1, strides=[T.int32(), 1])
        C = T.match_buffer(c, (mr, nr), "float32", offset_factor=1, strides=[T.int32(), 1], align=4)
        with T.sblock("root"):
            T.reads(C[0:mr, 0:nr], A[0:mr, 0:kk], B[0:kk, 0:nr])
            T.writes(C[0:mr, 0:nr])
            for i, j, k in T.grid(mr, nr, kk):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle):
        sa = T.int32()
        sb = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (mr, kk), "float32", offset_factor=1, strides=[sa, 1], align=4)
        B = T.match_buffer(b, (kk, nr), "float32", offset_factor=1, strides=[sb, 1])
        C = T.match_buffer(c, (mr, nr), "float32", offset_factor=1, strides=[sc, 1], align=4)
        with T.sblock("root"):
            T.reads(C[0:mr, 0:nr], A[0:mr, 0:kk], B[0:kk, 0:nr])
            T.writes(C[0:mr, 0:nr])
            with T.attr(0, "pragma_import_llvm", ir):
                T.evaluate(T.call_extern("void", sym, A.access_ptr("r"), sa, B.access_ptr("r"), sb,
                                         C.access_ptr("w"), sc, kk))

    return desc, impl


@pytest.mark.parametrize("k", [2, 7, 96, 1536])
def test_an_intrinsic_specialized_to_k_is_the_one_written_with_k(k):
    """register parses each tile's description and implementation once, with K a parameter, and
    binds K per call: the result must be, structurally, the pair written with K in the text."""
    import tvm_ffi

    from intrinsics import f32_gemm, registry
    from microkernels import AVX2

    kern = GemmKernel(AVX2, 4, 24, accumulate=True)
    desc, impl = registry._DEFINED[f32_gemm.register(kern, k)]
    want_desc, want_impl = _literal(kern, k)
    assert len(desc.params) == len(impl.params) == 3  # a, b, c: K bound, not a parameter
    assert tvm_ffi.structural_equal(desc, want_desc) and tvm_ffi.structural_equal(impl, want_impl)
