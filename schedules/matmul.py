"""FP32 matmul, tensorized on the GEMM tile.

Loop nest (outer to inner):
    tn*tm : NR-wide column panel of B x MR-tall row tile of A, fused: the parallel loop
    ko    : kc-deep slices of K (one, unless K is longer than kc_max)
    tile  : the micro-kernel, kc FMA steps on an MR x NR register tile
Each tile reduces the whole of K into an MR x NR scratch tile, which is then cropped into C.
Ragged edges of M and N therefore cost padding inside that one tile, never a padded copy of
C or a second pass over it.

B is packed once into NR-wide panels, contiguous and zero-padded, so a tile streams one
K x NR panel, which stays in L2 while the row tiles below it reuse it. A is read in place
(its row stride is K) when MR divides M and kc divides K, and the tile is chosen so that MR
divides M where one of the ISA's candidates does. Otherwise A is packed into zero-padded
MR x kc panels first. Not packing A matters most for the shapes a convolution lowers to:
with few column panels, each element of A is used once or twice, and a pack would read and
write all of A to save nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir, te

import intrinsics
from microkernels import MATMUL_TILES, GemmKernel, Isa

from .compiled import CompiledOp, check_operand, declare_user_aligned
from .targets import check_elements, check_emulate, host_cache_bytes, positive_int, resolve, thread_count


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Blocking:
    """kc_max: the longest K slice one tile call reduces. None: as long as keeps a kc x NR
    B panel in half of the host's L2 (sysfs; 512 KiB where it does not say), at least 256."""

    kc_max: int | None = None

    def kc_limit(self, nr: int) -> int:
        if self.kc_max is not None:
            return positive_int("kc_max", self.kc_max)
        return max(256, host_cache_bytes(2, 512 * 1024) // 2 // (4 * nr))


@dataclass(frozen=True)
class Plan:
    """Every size a compiled matmul uses."""

    M: int
    N: int
    K: int
    kernel: GemmKernel
    kc: int  # K per tile call
    nk: int  # tile calls per tile
    pack_a: bool  # False: the tiles read A in place

    @property
    def mt(self) -> int:
        return _ceil_div(self.M, self.kernel.mr)

    @property
    def nt(self) -> int:
        return _ceil_div(self.N, self.kernel.nr)

    @property
    def crop(self) -> bool:
        """True: the tiles overhang M or N, so each is computed into a scratch tile and cropped."""
        return self.M % self.kernel.mr != 0 or self.N % self.kernel.nr != 0


# What packing one element of A costs, in FLOPs the FMA units could have run meanwhile: the
# pack moves 8 bytes per element at about 55 GB/s on the Zen 5 host, 0.15 ns, which is 20
# FLOPs at AVX2's peak and 40 at AVX-512's (2.5 per lane).
PACK_FLOPS_PER_LANE = 2.5


def _cost(M: int, N: int, K: int, isa: Isa, tile: tuple) -> float:
    """Estimated time of one MATMUL_TILES entry (MR, NR, share of peak), in FLOPs at peak: the
    multiply padded to whole tiles at the tile's share of peak, plus packing A where MR does
    not divide M."""
    mr, nr, efficiency = tile
    padded = 2 * _ceil_div(M, mr) * mr * _ceil_div(N, nr) * nr * K
    return padded / efficiency + (PACK_FLOPS_PER_LANE * isa.lanes * M * K if M % mr else 0)


def plan(M: int, N: int, K: int, isa: Isa, kernel: GemmKernel | None = None,
         blocking: Blocking = Blocking()) -> Plan:
    """The tile, the K slicing, and whether A is packed, for one (M, N, K) on one ISA."""
    if kernel is None:
        tiles = MATMUL_TILES[isa.name]
        if 2 <= M < min(t[0] for t in tiles):  # a few rows: one tile of exactly M
            kernel = GemmKernel(isa, M, tiles[0][1])
        else:
            mr, nr, _ = min(tiles, key=lambda t: _cost(M, N, K, isa, t))
            kernel = GemmKernel(isa, mr, nr)
    nk = _ceil_div(K, blocking.kc_limit(kernel.nr))
    # TIR drops a reduction loop of extent 1, which then no longer matches the intrinsic's
    # description; K = 1 gets one zero-padded step instead (and so a packed A).
    kc = max(_ceil_div(K, nk), 2)
    pack_a = M % kernel.mr != 0 or nk * kc != K
    return Plan(M, N, K, kernel, kc, nk, pack_a)


class MatmulOp(CompiledOp):
    """A compiled C = A @ B for fixed (M, N, K); call it on numpy arrays."""

    user_aligned = True

    def __init__(self, p: Plan, isa: Isa, lib, threads, emulate: bool = False):
        super().__init__(isa, lib, threads, emulate)
        self.plan, self.kernel = p, p.kernel
        self.M, self.N, self.K = p.M, p.N, p.K

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
        """A @ B. Operands are C-contiguous numpy arrays (used in place, however aligned) or
        TVM tensors; the result is written into `out` when given (and returned)."""
        return self._run(self._args(a, b, out))

    def time(self, a, b, number=10, repeat=5, cold=False) -> list[float]:
        """Seconds per call, one entry per repeat (cold: the cache is flushed before each repeat)."""
        return self._time(self._args(a, b), number, repeat, cold)

    def phases(self) -> dict:
        """The op's phases as separately compiled modules, for timing each (bench gemm
        --breakdown): {part: (module, shapes of its float32 arguments)}. "pack_a" (absent when
        A is read in place) main(A, A_pack); "pack_b" main(B, B_pack); "kernel" main(A or
        A_pack, B_pack, C_padded): the tiles alone, writing a padded C directly instead of
        scratch tiles cropped into C."""
        p, mr, nr = self.plan, self.kernel.mr, self.kernel.nr
        a_packed = (p.mt, p.nk, mr, p.kc)
        b_packed = (p.nt, p.nk, p.kc, nr)
        shapes = {"pack_a": [(p.M, p.K), a_packed], "pack_b": [(p.K, p.N), b_packed],
                  "kernel": [a_packed if p.pack_a else (p.M, p.K), b_packed, (p.mt * mr, p.nt * nr)]}
        if not p.pack_a:
            del shapes["pack_a"]
        return {part: (_compile(p, part), shape) for part, shape in shapes.items()}


def _compile(p: Plan, part: str = "all"):
    """The module of the whole op (part="all") or of one of its phases (MatmulOp.phases)."""
    kern, kc, nk, mt, nt, M, N, K = p.kernel, p.kc, p.nk, p.mt, p.nt, p.M, p.N, p.K
    mr, nr = kern.mr, kern.nr
    A = te.placeholder((M, K), "float32", name="A")
    B = te.placeholder((K, N), "float32", name="B")
    zero = tvm.tirx.const(0, "float32")
    Ap = te.compute((mt, nk, mr, kc), lambda t, o, i, k: te.if_then_else(
        tvm.tirx.all(t * mr + i < M, o * kc + k < K), A[t * mr + i, o * kc + k], zero), name="A_pack")
    Bp = te.compute((nt, nk, kc, nr), lambda t, o, k, j: te.if_then_else(
        tvm.tirx.all(o * kc + k < K, t * nr + j < N), B[o * kc + k, t * nr + j], zero), name="B_pack")
    if part in ("pack_a", "pack_b"):
        src, dst = (A, Ap) if part == "pack_a" else (B, Bp)
        sch = s_tir.Schedule(te.create_prim_func([src, dst]))
        _schedule_pack(sch, dst.op.name)
        return tvm.compile(sch.mod, target=kern.isa.target)
    if part == "kernel":  # the packed operands become inputs
        Ap = te.placeholder(Ap.shape, "float32", name="A_pack") if p.pack_a else Ap
        Bp = te.placeholder(Bp.shape, "float32", name="B_pack")

    ro = te.reduce_axis((0, nk), name="ro")
    ri = te.reduce_axis((0, kc), name="ri")
    if p.pack_a:
        def a_elem(m, o, k):
            return Ap[m // mr, o, m % mr, k]
    else:
        def a_elem(m, o, k):
            return A[m, o * kc + k]
    # Without ragged edges the tiles write C itself; with them, C_tiles is cropped into C.
    direct = part == "kernel" or not p.crop
    Ct = te.compute((mt * mr, nt * nr),
                    lambda m, n: te.sum(a_elem(m, ro, ri) * Bp[n // nr, ro, ri, n % nr], axis=[ro, ri]),
                    name="C" if part != "kernel" and direct else "C_tiles")
    if part == "kernel":
        args = [Ap if p.pack_a else A, Bp, Ct]
    else:
        args = [A, B, Ct if direct else te.compute((M, N), lambda m, n: Ct[m, n], name="C")]
    func = te.create_prim_func(args)
    # The user's arrays go in as they are, so the code may assume only 4-byte alignment.
    sch = s_tir.Schedule(func if part == "kernel" else declare_user_aligned(func, ("A", "B", "C")))

    blk = sch.get_sblock(Ct.op.name)
    m, n, ko, ki = sch.get_loops(blk)
    tm, i = sch.split(m, [mt, mr])
    tn, j = sch.split(n, [nt, nr])
    sch.reorder(tn, tm, ko, i, j, ki)
    par = sch.fuse(tn, tm)
    sch.parallel(par)
    if not direct:
        # Under the tile loop, C_tiles shrinks to one MR x NR scratch tile that stays in L1.
        crop = sch.get_sblock("C")
        sch.reverse_compute_at(crop, par)
        sch.vectorize(sch.get_loops(crop)[-1])
    if part == "all":
        for name in ("A_pack", "B_pack") if p.pack_a else ("B_pack",):
            _schedule_pack(sch, name)
    init = sch.decompose_reduction(blk, ko)
    sch.tensorize(i, intrinsics.register(kern, kc))
    sch.vectorize(sch.get_loops(init)[-1])
    return tvm.compile(sch.mod, target=kern.isa.target)


def _schedule_pack(sch, name: str) -> None:
    loops = sch.get_loops(sch.get_sblock(name))
    sch.parallel(sch.fuse(*loops[:2]))
    sch.vectorize(loops[-1])


def matmul(M, N, K, target="native", threads=None, kernel: GemmKernel | None = None,
           blocking: Blocking = Blocking(), emulate: bool = False) -> MatmulOp:
    """Compile C[M, N] = A[M, K] @ B[K, N] (float32, row-major) for a target preset.

    target: "x86-avx512", "x86-avx2" or "native" (the widest this host runs).
    threads: size of TVM's thread pool while this op runs (None: one per core).
    kernel: the tile to use (default: chosen per shape from MATMUL_TILES).
    emulate: run calls on the Bochs CPU (x86 targets; AVX-512 on a host without it), one thread.
    """
    M, N, K = (positive_int(n, v) for n, v in (("M", M), ("N", N), ("K", K)))
    check_elements(A=(M, K), B=(K, N), C=(M, N))
    threads = thread_count(threads)
    isa = resolve(target)
    emulate = check_emulate(emulate, isa)
    if kernel is not None and (kernel.isa != isa or not kernel.accumulate or kernel.batch_reduce
                               or kernel.col_block or kernel.epilogue):
        raise ValueError(f"kernel {kernel.name} does not fit target {target!r}: need a plain accumulating "
                         f"{isa.name} tile")
    p = plan(M, N, K, isa, kernel, blocking)
    check_elements(packed_A=(p.mt, p.nk, p.kernel.mr, p.kc), packed_B=(p.nt, p.nk, p.kc, p.kernel.nr),
                   C_tiles=(p.mt * p.kernel.mr, p.nt * p.kernel.nr))
    return MatmulOp(p, isa, _compile(p), threads, emulate)
