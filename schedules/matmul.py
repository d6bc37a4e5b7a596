"""FP32 matmul, BLIS-style, tensorized on the GEMM tile.

Loop nest (outer to inner), as BLIS runs it:
    nc  : NC-wide column block of B          (B block kc x NC stays in L3)
    ko  : kc-deep slice of the reduction     (C tiles accumulate across slices)
    mc*n: MC-tall row block of A x NR panels (A block MC x kc stays in L2; parallel)
    mr  : MR-tall tiles of the row block
    tile: the micro-kernel, kc FMA steps on an MR x NR register tile (B panel in L1)
A and B are packed once into tile-ordered panels, zero-padded to whole tiles, so every edge
is handled by padding instead of by a second kernel; the result is cropped on the way out.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir, te

import intrinsics
from microkernels import GemmKernel, Isa, default_kernel

from .compiled import CompiledOp, check_operand
from .targets import check_elements, check_emulate, positive_int, resolve, thread_count


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Blocking:
    """Cache blocking in elements (kc) and in tiles (mc, nc); chosen for ~32 KiB L1, >=512 KiB L2."""

    kc_max: int = 256  # a kc x NR B panel (16 KiB at NR=16) in half of L1
    mc_elems: int = 144  # an MC x kc A block (144 KiB) in L2
    nc_elems: int = 2048  # a kc x NC B block (2 MiB) in L3


def _split_evenly(extent: int, unit: int, max_block: int) -> tuple[int, int]:
    """(blocks, units per block) covering `extent` with the least padding for a max block size."""
    units = _ceil_div(extent, unit)
    per_block_max = max(1, max_block // unit)
    blocks = _ceil_div(units, per_block_max)
    return blocks, _ceil_div(units, blocks)


class MatmulOp(CompiledOp):
    """A compiled C = A @ B for fixed (M, N, K); call it on numpy arrays."""

    def __init__(self, M, N, K, isa: Isa, kernel: GemmKernel, lib, threads, emulate: bool = False):
        super().__init__(isa, lib, threads, emulate)
        self.M, self.N, self.K, self.kernel = M, N, K, kernel

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    def _args(self, a, b, out=None):
        check_operand("a", a, (self.M, self.K), "float32")
        check_operand("b", b, (self.K, self.N), "float32")
        if out is not None:
            check_operand("out", out, (self.M, self.N), "float32")
        return self._tensors((a, b), (self.M, self.N), out)

    def __call__(self, a, b, out=None):
        """A @ B. Operands are numpy arrays or TVM tensors; 64-byte aligned numpy memory
        (schedules.aligned_empty) is used in place, and the result is written into `out` when
        given (and returned)."""
        return self._run(self._args(a, b, out))

    def time(self, a, b, number=10, repeat=5, cold=False) -> list[float]:
        """Seconds per call, one entry per repeat (cold: the cache is flushed before each repeat)."""
        return self._time(self._args(a, b), number, repeat, cold)


def matmul(M, N, K, target="native", threads=None, kernel: GemmKernel | None = None,
           blocking: Blocking = Blocking(), emulate: bool = False) -> MatmulOp:
    """Compile C[M, N] = A[M, K] @ B[K, N] (float32, row-major) for a target preset.

    target: "x86-avx512", "x86-avx2" or "native" (the widest this host runs).
    threads: size of TVM's thread pool while this op runs (None: one per core).
    kernel: the tile to use (default: the ISA's default tile).
    emulate: run calls on the Bochs CPU (x86 targets; AVX-512 on a host without it), one thread.
    """
    M, N, K = (positive_int(n, v) for n, v in (("M", M), ("N", N), ("K", K)))
    check_elements(A=(M, K), B=(K, N), C=(M, N))
    threads = thread_count(threads)
    isa = resolve(target)
    emulate = check_emulate(emulate, isa)
    kern = kernel or default_kernel(isa.name)
    if kern.isa != isa or not kern.accumulate:
        raise ValueError(f"kernel {kern.name} does not fit target {target!r}: need an accumulating {isa.name} tile")
    mr, nr = kern.mr, kern.nr

    nk, kc = _split_evenly(K, 1, blocking.kc_max)
    # TIR drops a reduction loop of extent 1, which then no longer matches the intrinsic's
    # description; K = 1 gets one zero-padded step instead.
    kc = max(kc, 2)
    n_mblk, mcb = _split_evenly(M, mr, blocking.mc_elems)
    n_nblk, ncb = _split_evenly(N, nr, blocking.nc_elems)
    mt, nt = n_mblk * mcb, n_nblk * ncb  # tiles, padded to whole blocks
    check_elements(packed_A=(mt, nk, mr, kc), packed_B=(nt, nk, kc, nr), C_tiles=(mt, nt, mr, nr))

    A = te.placeholder((M, K), "float32", name="A")
    B = te.placeholder((K, N), "float32", name="B")
    zero = tvm.tirx.const(0, "float32")

    def a_elem(m, k):
        return te.if_then_else(tvm.tirx.all(m < M, k < K), A[m, k], zero)

    def b_elem(k, n):
        return te.if_then_else(tvm.tirx.all(k < K, n < N), B[k, n], zero)

    Ap = te.compute((mt, nk, mr, kc), lambda t, o, i, k: a_elem(t * mr + i, o * kc + k), name="A_pack")
    Bp = te.compute((nt, nk, kc, nr), lambda t, o, k, j: b_elem(o * kc + k, t * nr + j), name="B_pack")
    ro = te.reduce_axis((0, nk), name="ro")
    ri = te.reduce_axis((0, kc), name="ri")
    Ct = te.compute(
        (mt, nt, mr, nr),
        lambda tm, tn, i, j: te.sum(Ap[tm, ro, i, ri] * Bp[tn, ro, ri, j], axis=[ro, ri]),
        name="C_tiles",
    )
    C = te.compute((M, N), lambda m, n: Ct[m // mr, n // nr, m % mr, n % nr], name="C")
    sch = s_tir.Schedule(te.create_prim_func([A, B, C]))

    blk = sch.get_sblock("C_tiles")
    tm, tn, i, j, ko, ki = sch.get_loops(blk)
    mo, mi = sch.split(tm, [n_mblk, mcb])
    no, ni = sch.split(tn, [n_nblk, ncb])
    sch.reorder(no, ko, mo, ni, mi, i, j, ki)
    par = sch.fuse(mo, ni)
    sch.parallel(par)
    init = sch.decompose_reduction(blk, ko)
    sch.tensorize(i, intrinsics.register(kern, kc))
    sch.vectorize(sch.get_loops(init)[-1])

    for name in ("A_pack", "B_pack"):
        b = sch.get_sblock(name)
        loops = sch.get_loops(b)
        sch.parallel(sch.fuse(*loops[:2]))
    bp_loops = sch.get_loops(sch.get_sblock("B_pack"))
    sch.vectorize(bp_loops[-1])
    c_loops = sch.get_loops(sch.get_sblock("C"))
    sch.parallel(c_loops[0])

    lib = tvm.compile(sch.mod, target=isa.target)
    return MatmulOp(M, N, K, isa, kern, lib, threads, emulate)

