"""FP32 matmul, tensorized on the GEMM tile.

Loop nest (outer to inner):
    tn*tm : NR-wide column panel of B x MR-tall row tile of A, fused: the parallel loop
    ko    : kc-deep slices of K (one, unless K is longer than kc_max)
    tile  : the micro-kernel, kc FMA steps on an MR x NR register tile
Each tile reduces the whole of K into C in place; where the tiles overhang C, into an MR x NR
scratch tile that is then cropped into C. Ragged edges therefore cost padding inside one
tile, never a padded copy of C or a second pass over it.

B is packed once into NR-wide panels, contiguous and zero-padded, so a tile streams one
K x NR panel, which stays in L2 while the row tiles below it reuse it. A is read in place
(its row stride is K). Where MR does not divide M, the op is two modules: one over the rows
MR divides, reading A and writing C in place, and a small op over the last rows (2 to MR + 1
of them, planned the same way). Only an op too short for that (M = 1, or MR + 1 rows that
split no further) or whose K slices overhang K packs A into zero-padded MR x kc panels.
Not packing A matters most for the shapes a convolution lowers to: with few column panels,
each element of A is used once or twice, and a pack would read and write all of A to save
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import tvm
from tvm import s_tir, te

import intrinsics
from microkernels import MATMUL_TILES, PREFETCH_WHOLE_REDUCTIONS, GemmKernel, Isa
from microkernels.f32_gemm import registers_needed

from .common import tuned
from .common.compiled import CompiledOp, check_operand, check_out, declare_user_aligned
from .common.layouts import aligned_empty
from .common.targets import (
    check_elements,
    check_emulate,
    dtype_name,
    float_isa,
    host_cache_bytes,
    int_isa,
    positive_int,
    resolve,
    thread_count,
)
from .common.tir import ceil_div


@dataclass(frozen=True)
class Blocking:
    """kc_max: the longest K slice one tile call reduces. None: as long as keeps a kc x NR
    B panel in half of the host's L2 (sysfs; 512 KiB where it does not say), at least 256."""

    kc_max: int | None = None

    def __post_init__(self):
        if self.kc_max is not None:
            object.__setattr__(self, "kc_max", positive_int("kc_max", self.kc_max))

    def kc_limit(self, nr: int) -> int:
        if self.kc_max is not None:
            return self.kc_max
        return max(256, host_cache_bytes(2, 512 * 1024) // 2 // (4 * nr))


@dataclass(frozen=True)
class Plan:
    """Every size one compiled module of a matmul uses. M: the rows it computes, the first
    rows of the op's (the rest go to a tail op)."""

    M: int
    N: int
    K: int
    kernel: GemmKernel
    kc: int  # K per tile call
    nk: int  # tile calls per tile
    pack_a: bool  # False: the tiles read A in place
    source: str = "defaults"  # where the tile rates came from: the shipped ones or tune's (common/tuned.py)

    @property
    def mt(self) -> int:
        return ceil_div(self.M, self.kernel.mr)

    @property
    def nt(self) -> int:
        return ceil_div(self.N, self.kernel.nr)

    @property
    def crop(self) -> bool:
        """True: the tiles overhang M or N, so each is computed into a scratch tile and cropped."""
        return self.M % self.kernel.mr != 0 or self.N % self.kernel.nr != 0


# What packing one element costs, in FLOPs the FMA units could have run meanwhile: a pack
# moves 8 bytes per element at about 55 GB/s on the Zen 5 host, 0.15 ns, which is 20 FLOPs at
# AVX2's peak and 40 at AVX-512's (2.5 per lane).
PACK_FLOPS_PER_LANE = 2.5
# A tail op's rows run on a short tile, at about half the main tile's rate (2x16 on AVX2: 4
# accumulators); it also packs B again.
TAIL_SLOWDOWN = 2.0


def rates(isa: Isa) -> tuple[tuple, float, str]:
    """(tiles as (MR, NR, share of peak), pack cost in FLOPs per lane, their source): this
    host's measurements where `tune` made them (common/tuned.py), else the shipped ones. A
    measured tile the GEMM kernel or its intrinsic refuses (a hand-edited file) sets the
    measured tiles aside, with a warning."""
    tiles = tuned.matmul_tiles(isa.name, check=lambda mr, nr: intrinsics.check_kernel(GemmKernel(isa, mr, nr)))
    pack = tuned.pack_flops_per_lane(isa.name)
    if tiles is None and pack is None:
        return MATMUL_TILES[isa.name], PACK_FLOPS_PER_LANE, "defaults"
    return tiles or MATMUL_TILES[isa.name], pack or PACK_FLOPS_PER_LANE, tuned.source()


def _options(M: int, N: int, K: int, isa: Isa):
    """(estimated time in FLOPs at peak, (MR, NR), how the rows MR does not divide are done)
    for each tile of `rates` and each way: "none" (MR divides M), "pack" (A packed and
    zero-padded to whole tiles) or "tail" (a second op over the last rows, which packs B
    again)."""
    tiles, pack_per_lane, _ = rates(isa)
    pack = pack_per_lane * isa.lanes
    for mr, nr, efficiency in tiles:
        per_row = 2 * ceil_div(N, nr) * nr * K / efficiency
        tail = M % mr + (mr if M % mr == 1 else 0)  # a 1-row tile cannot be tensorized
        if tail == 0:
            yield per_row * M, (mr, nr), "none"
            continue
        yield per_row * ceil_div(M, mr) * mr + pack * M * K, (mr, nr), "pack"
        if tail < M:
            yield per_row * (M - tail + TAIL_SLOWDOWN * tail) + pack * K * N, (mr, nr), "tail"


def plan(M: int, N: int, K: int, isa: Isa, kernel: GemmKernel | None = None,
         blocking: Blocking = Blocking(), split_rows: bool = True) -> Plan:
    """The tile, the K slicing, and whether A is packed, for the first rows of (M, N, K) on
    one ISA: plan(...).M of them, the rest left to a tail op (matmul); with split_rows=False,
    every row (A packed where MR does not divide M)."""
    tiles, _, source = rates(isa)
    split = split_rows  # a given kernel splits off the rows its MR does not divide
    if kernel is None:
        nr = tiles[0][1]
        # A few rows (a tail op's, say): one tile of exactly M, where the registers hold it.
        if 2 <= M <= max(t[0] for t in tiles) + 1 and registers_needed(isa, M, nr) <= isa.vector_registers:
            kernel = GemmKernel(isa, M, nr)
        else:
            _, (mr, nr), how = min((o for o in _options(M, N, K, isa) if split_rows or o[2] != "tail"),
                                   key=lambda o: o[0])
            kernel, split = GemmKernel(isa, mr, nr), how == "tail"
    # As few K slices as keep a B panel in L2, and a count that divides K where one close by
    # does: slices that overhang K need a zero-padded (packed) A.
    least = ceil_div(K, blocking.kc_limit(kernel.nr))
    nk = next((n for n in range(least, least + 8) if K % n == 0), least)
    # TIR drops a reduction loop of extent 1, which then no longer matches the intrinsic's
    # description; K = 1 gets one zero-padded step instead (and so a packed A).
    kc = max(ceil_div(K, nk), 2)
    tail = M % kernel.mr
    tail += kernel.mr if tail == 1 else 0
    if nk * kc != K or (tail and (not split or tail >= M)):
        return Plan(M, N, K, kernel, kc, nk, True, source)
    return Plan(M - tail, N, K, kernel, kc, nk, False, source)


class MatmulOp(CompiledOp):
    """A compiled C = A @ B for fixed (M, N, K); call it on numpy arrays."""

    user_aligned = True

    def __init__(self, M: int, p: Plan, isa: Isa, lib, threads, emulate: bool = False,
                 tail: "MatmulOp | None" = None):
        super().__init__(isa, lib, threads, emulate)
        self.plan, self.kernel, self.tail = p, p.kernel, tail  # tail: the op over rows p.M..M-1
        self.M, self.N, self.K = M, p.N, p.K

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    def _check(self, a, b, out):
        check_operand("a", a, (self.M, self.K), "float32")
        check_operand("b", b, (self.K, self.N), "float32")
        if out is not None:
            check_operand("out", out, (self.M, self.N), "float32")
            check_out(out, a=a, b=b)

    @staticmethod
    def _host(x):
        """A numpy array as it is; a TVM tensor as a numpy view of its memory (DLPack, no copy)."""
        return np.from_dlpack(x) if isinstance(x, tvm.runtime.Tensor) else x

    def __call__(self, a, b, out=None):
        """A @ B. Operands are C-contiguous numpy arrays (used in place, however aligned) or
        TVM tensors; the result is written into `out` when given (and returned)."""
        self._check(a, b, out)
        if self.tail is None:
            return self._run(self._tensors((a, b), (self.M, self.N), out))
        m, a = self.plan.M, self._host(a)  # row slices of C-contiguous arrays: views, no copies
        if self.emulate:  # an emulated module returns its output
            if out is not None:
                raise ValueError("an emulated op returns its output; out= is for native calls")
            return np.concatenate([self._run(self._tensors((a[:m], b), (m, self.N))), self.tail(a[m:], b)])
        result = aligned_empty((self.M, self.N)) if out is None else out
        c = self._host(result)
        self._run(self._tensors((a[:m], b), (m, self.N), c[:m]))
        self.tail(a[m:], b, out=c[m:])
        return result

    def time(self, a, b, number=10, repeat=5, cold=False) -> list[float]:
        """Seconds per call, one entry per repeat (cold: the cache is flushed before each
        repeat); with a tail op, its time is added repeat by repeat."""
        self._check(a, b, None)
        if self.tail is None:
            return self._time(self._tensors((a, b), (self.M, self.N)), number, repeat, cold)
        m, a = self.plan.M, self._host(a)
        main = self._time(self._tensors((a[:m], b), (m, self.N)), number, repeat, cold)
        return [x + y for x, y in zip(main, self.tail.time(a[m:], b, number, repeat, cold))]

    def phases(self) -> dict:
        """The op's phases as separately compiled modules, for timing each (bench gemm
        --breakdown): {part: (module, shapes of its float32 arguments)}. "pack_a" (absent when
        A is read in place) main(A, A_pack); "pack_b" main(B, B_pack); "kernel" main(A or
        A_pack, B_pack, C_padded): the tiles alone, writing a padded C directly instead of
        scratch tiles cropped into C; "tail1", "tail2"...: the module of each tail op (its
        own tail excluded), main(A rows, B, C rows)."""
        p, mr, nr = self.plan, self.kernel.mr, self.kernel.nr
        a_packed = (p.mt, p.nk, mr, p.kc)
        b_packed = (p.nt, p.nk, p.kc, nr)
        shapes = {"pack_a": [(p.M, p.K), a_packed], "pack_b": [(p.K, p.N), b_packed],
                  "kernel": [a_packed if p.pack_a else (p.M, p.K), b_packed, (p.mt * mr, p.nt * nr)]}
        if not p.pack_a:
            del shapes["pack_a"]
        out = {part: (_compile(p, part), shape) for part, shape in shapes.items()}
        op, n = self.tail, 1
        while op is not None:  # each tail op's module, as it runs
            rows = op.plan.M
            out[f"tail{n}"] = (op.lib, [(rows, op.K), (op.K, op.N), (rows, op.N)])
            op, n = op.tail, n + 1
        return out


def _compile(p: Plan, part: str = "all"):
    """The module of the whole op (part="all") or of one of its phases (MatmulOp.phases)."""
    return tvm.compile(_schedule(p, part), target=p.kernel.isa.target)


def _schedule(p: Plan, part: str = "all", bias: bool = False) -> tvm.IRModule:
    """The scheduled TIR of `_compile`'s parts, and of "packed": main(A, B_pack[, Bias], C),
    B packed beforehand (a model's constant weights: `pack_b`), each output tile computed into
    a scratch tile and stored with the bias added while it is in L1 (bias=True)."""
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
        return sch.mod
    if part == "kernel":  # the packed operands become inputs
        Ap = te.placeholder(Ap.shape, "float32", name="A_pack") if p.pack_a else Ap
    if part in ("kernel", "packed"):
        Bp = te.placeholder(Bp.shape, "float32", name="B_pack")

    ro = te.reduce_axis((0, nk), name="ro")
    ri = te.reduce_axis((0, kc), name="ri")
    if p.pack_a:
        def a_elem(m, o, k):
            return Ap[m // mr, o, m % mr, k]
    else:
        def a_elem(m, o, k):
            return A[m, o * kc + k]
    # Without ragged edges (or a bias to add) the tiles write C itself; with them, C_tiles is
    # cropped into C.
    direct = part == "kernel" or (not p.crop and not bias)
    Ct = te.compute((mt * mr, nt * nr),
                    lambda m, n: te.sum(a_elem(m, ro, ri) * Bp[n // nr, ro, ri, n % nr], axis=[ro, ri]),
                    name="C" if part != "kernel" and direct else "C_tiles")
    Bias = te.placeholder((N,), "float32", name="Bias")
    if part == "kernel":
        args = [Ap if p.pack_a else A, Bp, Ct]
    else:
        crop = (lambda m, n: Ct[m, n] + Bias[n]) if bias else (lambda m, n: Ct[m, n])
        args = [A, B if part == "all" else Bp, *([Bias] if bias else []),
                Ct if direct else te.compute((M, N), crop, name="C")]
    func = te.create_prim_func(args)
    # The user's arrays go in as they are, so the code may assume only 4-byte alignment; a
    # model's tensors ("packed": the VM's, 64-byte aligned) keep TVM's default, and skip a parse.
    sch = s_tir.Schedule(declare_user_aligned(func, ("A", "B", "C")) if part == "all" else func)

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
    if part in ("all", "packed"):
        for name in ("A_pack", "B_pack") if p.pack_a else ("B_pack",):
            if part == "all" or name == "A_pack":
                _schedule_pack(sch, name)
    init = sch.decompose_reduction(blk, ko)
    sch.tensorize(i, intrinsics.register(kern, kc))
    sch.vectorize(sch.get_loops(init)[-1])
    return sch.mod


def pack_b(p: Plan, b: np.ndarray) -> np.ndarray:
    """B (K, N) as the op's B_pack (nt, nk, kc, NR): NR-wide panels, zero-padded."""
    nr = p.kernel.nr
    padded = np.zeros((p.nk * p.kc, p.nt * nr), np.float32)
    padded[:p.K, :p.N] = b
    return np.ascontiguousarray(padded.reshape(p.nk, p.kc, p.nt, nr).transpose(2, 0, 1, 3))


def packed_matmul(M: int, N: int, K: int, isa: Isa, bias: bool = False) -> tuple[Plan, tvm.IRModule]:
    """One module of C = A @ B (+ Bias) for every row, B packed beforehand (`pack_b`): the
    plan and the scheduled TIR of main(A, B_pack[, Bias], C), for a model whose weights are
    constants (schedules.relax.linear). Rows MR does not divide are computed in zero-padded
    tiles (A packed) rather than by a tail op. The tile prefetches the next call's B where the
    ISA's entry says so (PREFETCH_WHOLE_REDUCTIONS)."""
    p = plan(M, N, K, float_isa(isa), split_rows=False)
    # Where the ISA's entry says it pays, each tile call prefetches the B panel after its own
    # (GemmKernel.prefetch): a model's weights come from memory. ConvNeXt-Tiny on the Zen 5, 1
    # thread, alternating builds: 43.96 -> 42.42 and 42.64 -> 42.15 ms.
    p = replace(p, kernel=replace(p.kernel, prefetch=PREFETCH_WHOLE_REDUCTIONS[p.kernel.isa.name]))
    return p, _schedule(p, "packed", bias)


def _schedule_pack(sch, name: str) -> None:
    loops = sch.get_loops(sch.get_sblock(name))
    sch.parallel(sch.fuse(*loops[:2]))
    sch.vectorize(loops[-1])


def matmul(M, N, K, target="native", threads=None, kernel: GemmKernel | None = None,
           blocking: Blocking = Blocking(), emulate: bool = False, dtype="float32", a_zero_point=0):
    """Compile C[M, N] = A[M, K] @ B[K, N] (float32, row-major) for a target preset.

    target: "x86-avx512", "x86-avx2" or "native" (the widest this host runs); for the quantized
        matmul also "x86-avx512vnni" and "x86-avxvnni" (x86-avx512 / x86-avx2: the int16 upcast).
    threads: size of TVM's thread pool while this op runs (None: one per core).
    kernel: the tile to use (default: chosen per shape from MATMUL_TILES); the rows its MR
        does not divide go to a tail op that picks its own.
    emulate: run calls on the Bochs CPU (x86 targets; AVX-512 on a host without it), one thread.
    dtype "uint8" or "int8": the quantized matmul (schedules.matmul_int8), int32
        C = (A - a_zero_point) @ B with B int8; returns an Int8MatmulOp.
    """
    M, N, K = (positive_int(n, v) for n, v in (("M", M), ("N", N), ("K", K)))
    check_elements(A=(M, K), B=(K, N), C=(M, N))
    threads = thread_count(threads)
    isa = resolve(target)
    emulate = check_emulate(emulate, isa)
    dtype = dtype_name("dtype", dtype)
    if dtype != "float32":
        if isa.arch != "x86":
            raise ValueError(f"matmul runs on x86 targets; got {target!r}")
        if kernel is not None or blocking != Blocking():
            raise ValueError("kernel and blocking apply to the float32 matmul")
        from .matmul_int8 import matmul_int8

        return matmul_int8(M, N, K, dtype, int_isa(target, isa), threads, a_zero_point, emulate)
    if a_zero_point != 0:
        raise ValueError("a_zero_point applies to the quantized matmul (dtype 'uint8' or 'int8')")
    isa = float_isa(isa)
    if not isinstance(blocking, Blocking):
        raise TypeError(f"blocking must be a schedules.Blocking, got {type(blocking).__name__}")
    if kernel is not None and not isinstance(kernel, GemmKernel):
        raise TypeError(f"kernel must be a microkernels.GemmKernel, got {type(kernel).__name__}")
    if kernel is not None and (kernel.isa != isa or not kernel.accumulate or kernel.batch_reduce
                               or kernel.col_block or kernel.epilogue):
        raise ValueError(f"kernel {kernel.name} does not fit target {target!r}: need a plain accumulating "
                         f"{isa.name} tile")
    p = plan(M, N, K, isa, kernel, blocking)
    # Besides the user's arrays: the packed B, the packed A where A is not read in place, and C
    # padded to whole tiles. The padded C is no buffer (the tiles write C, or a scratch tile
    # cropped into it) but TVM still indexes its row range in int32 (matmul(2147483, 1000, 1):
    # "Literal value 2147484000 exceeds range of int32" deep in its lowering).
    check_elements(packed_B=(p.nt, p.nk, p.kc, p.kernel.nr), C_padded_to_tiles=(p.mt * p.kernel.mr, p.nt * p.kernel.nr),
                   **({"packed_A": (p.mt, p.nk, p.kernel.mr, p.kc)} if p.pack_a else {}))
    tail = matmul(M - p.M, N, K, target, threads, blocking=blocking, emulate=emulate) if p.M < M else None
    return MatmulOp(M, p, isa, _compile(p), threads, emulate, tail)
