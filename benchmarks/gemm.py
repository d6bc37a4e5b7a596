"""`bench gemm`: FMA peak, L1-resident tile, and schedules.matmul next to numpy, per thread count."""

from __future__ import annotations

import statistics

import numpy as np
import tvm
from tvm import s_tir, te
from tvm.script import tirx as T

import intrinsics
import schedules
from microkernels import (
    MATMUL_TILES,
    FmaPeakKernel,
    GemmKernel,
    IntGemmKernel,
    Isa,
    best_host_isa,
    default_int_kernel,
    max_tiles,
)
from microkernels.int_amx import AmxGemmKernel, AmxPeakKernel
from microkernels.int_dot_peak import DotPeakKernel
from microkernels.int_gemm import PAIR_OPS
from microkernels.int_gemm import max_tiles as int_max_tiles
from microkernels.isa import AMX_INT8
from schedules.common.targets import require_host, set_threads
from schedules.common.timing import seconds_per_call, settle

ROUNDS = 3


# M x N x K: squares, and ResNet-50 layers lowered to GEMM (pixels x output channels x
# input channels * taps): 56x56 3x3 64->64, 28x28 3x3 128->128, 7x7 1x1 512->2048.
SIZES = [(512,) * 3, (1000,) * 3, (1024,) * 3, (2048,) * 3, (3136, 64, 576), (784, 128, 1152), (49, 2048, 512)]


def measure_peak(isa: Isa, iters: int = 200_000, repeat: int = 5, loads: bool = False) -> float:
    """GFLOP/s of independent FMA chains on one thread of this host; with `loads`, each FMA's
    multiplier loaded from L1 (one load per FMA: the depthwise bound). The best median of
    ROUNDS rounds: a busy neighbour on the shared host only ever lowers it."""
    kern = FmaPeakKernel(isa, loads)
    return kern.flops(iters) / _probe_seconds(kern, iters, np.full(kern.io_floats, 0.5, np.float32), repeat) / 1e9


def _probe_seconds(kern, iters: int, io: np.ndarray, repeat: int) -> float:
    """Seconds of one call of a throughput probe on `io`: the best median of ROUNDS rounds (a busy
    neighbour on the shared host only ever lowers the rate)."""
    buf = tvm.runtime.tensor(io)
    ev = compile_peak(kern, iters).mod.time_evaluator("main", tvm.cpu(), number=3, repeat=repeat)
    return min(statistics.median(ev(buf).results) for _ in range(ROUNDS))


def compile_peak(kern: FmaPeakKernel | DotPeakKernel, iters: int, target: dict | None = None):
    """The probe module: main(io) runs the FP32 or integer throughput probe for `iters` iterations
    on io (float32 or int32 elements), compiled for its ISA or `target` (an emulator's stand-in)."""
    n, dtype = (kern.io_floats, "float32") if isinstance(kern, FmaPeakKernel) else (kern.io_words, "int32")
    sym, ir = kern.name, kern.llvm_ir()

    @T.prim_func(s_tir=True)
    def probe(io: T.Buffer((n,), dtype)):
        with T.attr(0, "pragma_import_llvm", ir):
            T.evaluate(T.call_extern("void", sym, io.access_ptr("rw"), iters))

    return tvm.compile(tvm.IRModule({"main": probe}), target=target or kern.isa.target)


def tile_gflops(kern: GemmKernel, kc: int = 256, calls: int = 2000, repeat: int = 5) -> float:
    """GFLOP/s of the tile kernel alone, its A and B panels L1-resident, called `calls` times."""
    A = te.placeholder((kern.mr, kc), "float32", name="A")
    B = te.placeholder((kc, kern.nr), "float32", name="B")
    r = te.reduce_axis((0, calls), name="r")
    k = te.reduce_axis((0, kc), name="k")
    C = te.compute((kern.mr, kern.nr), lambda i, j: te.sum(A[i, k] * B[k, j], axis=[r, k]), name="C")
    sch = s_tir.Schedule(te.create_prim_func([A, B, C]))
    blk = sch.get_sblock("C")
    i, j, rr, kk = sch.get_loops(blk)
    sch.reorder(rr, i, j, kk)
    sch.decompose_reduction(blk, rr)
    sch.tensorize(i, intrinsics.register(kern, kc))
    lib = tvm.compile(sch.mod, target=kern.isa.target)
    args = [tvm.runtime.tensor(np.random.rand(*s).astype(np.float32)) for s in ((kern.mr, kc), (kc, kern.nr))]
    args.append(tvm.runtime.tensor(np.zeros((kern.mr, kern.nr), np.float32)))
    res = lib.mod.time_evaluator("main", tvm.cpu(), number=3, repeat=repeat)(*args).results
    return 2 * kern.mr * kern.nr * kc * calls / statistics.median(res) / 1e9


def numpy_blas() -> str:
    from threadpoolctl import threadpool_info

    libs = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return ", ".join(f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')})" for i in libs) or "?"


def numpy_seconds(a, b, threads: int, repeat: int) -> float:
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=threads):
        return seconds_per_call(lambda: a @ b, 1, repeat, cold=False)


def phase_seconds(op, repeat: int) -> dict:
    """Seconds per call of each of the op's phases (MatmulOp.phases), on TVM tensors, best
    median over ROUNDS; "rest": the whole op's time less theirs, the cropping into C and what
    the phases do not overlap."""
    out = {}
    for part, (lib, shapes) in op.phases().items():
        args = [tvm.runtime.tensor(np.ones(s, np.float32)) for s in shapes]
        ev = lib.mod.time_evaluator("main", tvm.cpu(), number=max(1, int(1e8 // op.flops) + 1), repeat=repeat)
        out[part] = min(statistics.median(ev(*args).results) for _ in range(ROUNDS))
    return out


def run(isa: Isa, sizes, thread_counts, repeat: int, sweep: bool, log, breakdown: bool = False,
        exhaustive: bool = False) -> dict:
    """`exhaustive`: each size is also run with every matmul tile forced, and each says how far
    the planner's tile (from the shipped rates or `tune`'s) is from the fastest."""
    require_host(isa)
    set_threads(1)
    peak1 = measure_peak(isa)
    out = {"isa": isa.name, "peak_gflops_1thread": peak1, "tiles": [], "matmul": []}
    log(f"ISA {isa.name}: measured FP32 FMA peak, 1 thread: {peak1:.1f} GFLOP/s")
    log(f"numpy BLAS: {numpy_blas()}")
    ours = {(mr, nr) for mr, nr, _ in MATMUL_TILES[isa.name]}
    tiles = ours | ({t for t in max_tiles(isa) if t[0] >= 2} if sweep else set())
    for mr, nr in sorted(tiles, key=lambda t: (t[1], -t[0])):
        kern = GemmKernel(isa, mr, nr)
        g = tile_gflops(kern)
        mark = "  (a matmul tile)" if (mr, nr) in ours else ""
        log(f"  tile {kern.name:28s} L1-resident: {g:7.1f} GFLOP/s  {100 * g / peak1:5.1f}% of peak{mark}")
        out["tiles"].append({"kernel": kern.name, "gflops": g, "pct_peak": 100 * g / peak1, "matmul": bool(mark)})
    for threads in thread_counts:
        set_threads(threads)
        peak = peak1 * threads
        log(f"  matmul, {threads} thread(s) (peak {peak:.0f} GFLOP/s = {threads} x 1-thread peak):")
        log(f"    {'M x N x K':>18s} {'tile':>6s} {'A':>8s} {'ours GF/s':>10s} {'%peak':>6s} {'numpy GF/s':>11s}"
            f" {'ours/numpy':>10s} {'op(a,b)/numpy':>13s}")
        distances = []
        for M, N, K in sizes:
            op = schedules.matmul(M, N, K, target=f"x86-{isa.name}", threads=threads)
            rng = np.random.default_rng(0)
            a = rng.standard_normal((M, K), dtype=np.float32)
            b = rng.standard_normal((K, N), dtype=np.float32)
            number = max(1, int(2e8 // op.flops))
            # Turns, ROUNDS times, best median each: the machine's drift hits both sides; each
            # turn starts after settle() (without it, 3136x64x576 on two threads timed 12 ms
            # instead of 0.64).
            ref = ours = user = float("inf")
            for _ in range(ROUNDS):
                settle(threads, 0.2)
                ref = min(ref, numpy_seconds(a, b, threads, repeat))
                settle(threads, 0.2)
                ours = min(ours, statistics.median(op.time(a, b, number=number, repeat=repeat)))
                user = min(user, seconds_per_call(lambda: op(a, b), number, repeat, cold=False))  # noqa: B023
            g, gn = op.flops / ours / 1e9, op.flops / ref / 1e9
            p = op.plan
            tile, a_how = f"{p.kernel.mr}x{p.kernel.nr}", "packed" if p.pack_a else "in place"
            log(f"    {f'{M}x{N}x{K}':>18s} {tile:>6s} {a_how:>8s} {g:10.1f} {100 * g / peak:6.1f} {gn:11.1f}"
                f" {ref / ours:10.2f}x {ref / user:12.2f}x")
            row = {"M": M, "N": N, "K": K, "threads": threads, "tile": tile, "pack_a": p.pack_a, "gflops": g,
                   "pct_peak": 100 * g / peak, "numpy_gflops": gn, "speedup_vs_numpy": ref / ours,
                   "user_call_speedup_vs_numpy": ref / user}
            if breakdown:
                phases = phase_seconds(op, repeat)
                phases["rest"] = ours - sum(phases.values())
                log("      breakdown: " + ", ".join(f"{k.replace('_', ' ')} {v * 1e3:.3f} ms ({100 * v / ours:.1f}%)"
                                                   for k, v in phases.items()))
                row["breakdown_seconds"] = phases
            if exhaustive:
                row["tile_seconds"] = _every_tile(isa, (M, N, K), threads, a, b, number, repeat, tile, op)
                fastest = min(row["tile_seconds"], key=row["tile_seconds"].get)
                ratio = row["tile_seconds"][tile] / row["tile_seconds"][fastest]
                distances.append((ratio, f"{M}x{N}x{K}"))
                log("      every tile: " + ", ".join(f"{t} {v * 1e3:.3f} ms" for t, v in row["tile_seconds"].items())
                    + f"; chosen {tile}, fastest {fastest}: chosen/fastest {ratio:.2f}")
            out["matmul"].append(row)
        if distances:
            worst, where = max(distances)
            log(f"    exhaustive: the chosen tile within 5% of the fastest on {sum(d <= 1.05 for d, _ in distances)} of "
                f"{len(distances)} sizes; worst {worst:.2f}x ({where})")
    return out


def _every_tile(isa: Isa, size: tuple, threads: int, a, b, number: int, repeat: int, chosen: str,
                chosen_op) -> dict:
    """Seconds per call of the matmul with each MATMUL_TILES tile forced and of the chosen op,
    all taking turns ROUNDS times (the same conditions for each), best median each."""
    got = {}
    ops = {chosen: chosen_op}
    ops.update({f"{mr}x{nr}": schedules.matmul(*size, target=f"x86-{isa.name}", threads=threads,
                                               kernel=GemmKernel(isa, mr, nr))
                for mr, nr, _ in MATMUL_TILES[isa.name] if f"{mr}x{nr}" != chosen})
    for _ in range(ROUNDS):
        for t, op in ops.items():
            settle(threads, 0.2)
            got[t] = min(got.get(t, float("inf")), statistics.median(op.time(a, b, number=number, repeat=repeat)))
    return got


def measure_int_peak(isa: Isa, iters: int = 200_000, repeat: int = 5, pairs: bool = False) -> float:
    """Integer GOP/s (multiply + add per MAC) of independent chains of `isa`'s integer tile
    instruction (vpdpbusd, or vpmaddwd + vpaddd; pairs: vpmaddubsw + vpmaddwd by ones + vpaddd)
    on one thread: the integer tiles' peak, measured as measure_peak measures the FP32 one."""
    kern = DotPeakKernel(isa, pairs)
    return kern.ops(iters) / _probe_seconds(kern, iters, np.full(kern.io_words, 3, np.int32), repeat) / 1e9


def int_tile_gops(kern: IntGemmKernel, kc: int = 512, calls: int = 2000, repeat: int = 5) -> float:
    """Integer GOP/s of the tile kernel alone, called `calls` times on L1-resident A and B panels
    (kc values of K: MR*kc + kc*NR bytes, 35 KiB for the 6x64 VNNI tile)."""
    mr, nr, g, sym, ir = kern.mr, kern.nr, kern.group, kern.name, kern.llvm_ir()
    at, bt = kern.a_dtype, kern.b_dtype

    @T.prim_func(s_tir=True)
    def loop(A: T.Buffer((mr * kc,), at), B: T.Buffer((kc * nr,), bt), C: T.Buffer((mr * nr,), "int32")):
        for _r in range(calls):
            with T.attr(0, "pragma_import_llvm", ir):
                T.evaluate(T.call_extern("void", sym, A.access_ptr("r"), kc, B.access_ptr("r"), g * nr,
                                         C.access_ptr("rw"), nr, kc))

    lib = tvm.compile(tvm.IRModule({"main": loop}), target=kern.isa.target)
    args = [tvm.runtime.tensor(np.ones(n, dt)) for n, dt in ((mr * kc, at), (kc * nr, bt), (mr * nr, "int32"))]
    res = lib.mod.time_evaluator("main", tvm.cpu(), number=3, repeat=repeat)(*args).results
    return 2 * mr * nr * kc * calls / statistics.median(res) / 1e9


def amx_gops(kern, calls: int = 2000, kc: int = 512, repeat: int = 5) -> float:
    """Integer GOP/s on one thread of an AMX tile (AmxGemmKernel: `calls` calls on L1-resident A
    and B, kc deep, the tiles configured once around them) or of the tdpbusd probe
    (AmxPeakKernel: `calls` iterations)."""
    require_host(AMX_INT8)  # also asks the OS for the tile state, without which tdpbusd is illegal
    if isinstance(kern, AmxPeakKernel):
        return kern.ops(calls) / _probe_seconds(kern, calls, np.full(kern.io_words, 3, np.int32), repeat) / 1e9
    mr, nr, sym, ir = kern.mr, kern.nr, kern.name, kern.llvm_ir()

    @T.prim_func(s_tir=True)
    def loop(A: T.Buffer((mr * kc,), "uint8"), B: T.Buffer((kc * nr,), "int8"), C: T.Buffer((mr * nr,), "int32")):
        with T.attr(0, "pragma_import_llvm", ir):
            T.evaluate(T.call_extern("void", kern.config_symbol))
            for _r in range(calls):
                T.evaluate(T.call_extern("void", sym, A.access_ptr("r"), kc, B.access_ptr("r"), 4 * nr,
                                         C.access_ptr("rw"), nr, kc, 1, 0, 1, 0, 1, 0))
            T.evaluate(T.call_extern("void", kern.release_symbol))

    lib = tvm.compile(tvm.IRModule({"main": loop}), target=kern.isa.target)
    args = [tvm.runtime.tensor(np.ones(n, dt)) for n, dt in ((mr * kc, "uint8"), (kc * nr, "int8"), (mr * nr, "int32"))]
    res = lib.mod.time_evaluator("main", tvm.cpu(), number=3, repeat=repeat)(*args).results
    return 2 * mr * nr * kc * calls / statistics.median(res) / 1e9


def run_int(isas, log, sweep: bool = False) -> dict:
    """`bench gemm --int8`: per integer ISA this host runs, the measured peak of its instruction,
    then the L1-resident rate of the default tile (and with `sweep` every budget tile) as a share of
    that peak and as a multiple of the FP32 peak."""
    set_threads(1)
    out = {"fp32_peak_gflops": None, "isas": []}
    f32 = best_host_isa()
    out["fp32_peak_gflops"] = fp32 = measure_peak(f32)
    log(f"FP32 FMA peak ({f32.name}), 1 thread: {fp32:.1f} GFLOP/s")
    names = {"u8s8": "vpdpbusd", "s16": "vpmaddwd+vpaddd", "u8s7": "vpmaddubsw+vpmaddwd+vpaddd (pairs)"}
    for isa, pairs in [(isa, p) for isa in isas for p in (False, True) if not p or isa.name in PAIR_OPS]:
        peak = measure_int_peak(isa, pairs=pairs)
        kern = DotPeakKernel(isa, pairs)
        log(f"ISA {isa.name}: measured {names[kern.op]} peak, 1 thread: {peak:.1f} GOP/s "
            f"({peak / fp32:.2f}x the FP32 peak)")
        rows = []
        default = default_int_kernel(isa.name, pairs)
        tiles = [(default.mr, default.nr)]
        if sweep:
            tiles += [t for t in int_max_tiles(isa, 64, pairs) if t not in tiles]
        for mr, nr in tiles:
            k = IntGemmKernel(isa, mr, nr, pairs=pairs)
            g = int_tile_gops(k)
            mark = "  (default)" if (mr, nr) == tiles[0] else ""
            log(f"  tile {k.name:30s} L1-resident: {g:7.1f} GOP/s  {100 * g / peak:5.1f}% of peak  "
                f"{g / fp32:4.2f}x FP32 peak{mark}")
            rows.append({"kernel": k.name, "gops": g, "pct_peak": 100 * g / peak})
        out["isas"].append({"isa": isa.name + (" pairs" if pairs else ""), "peak_gops": peak, "tiles": rows})
    if AMX_INT8.host_supports():
        peak = amx_gops(AmxPeakKernel(), calls=200_000)
        log(f"ISA {AMX_INT8.name}: measured tdpbusd peak, 1 thread: {peak:.1f} GOP/s ({peak / fp32:.2f}x the FP32 peak)")
        rows = []
        for rows_, a, b in ((16, 2, 2), (14, 2, 2), (7, 1, 3)):
            k = AmxGemmKernel(rows_, a, b)
            g = amx_gops(k)
            log(f"  tile {k.name:30s} L1-resident: {g:7.1f} GOP/s  {100 * g / peak:5.1f}% of peak  {g / fp32:4.2f}x FP32 peak"
                + ("  (2x2 of 16 rows)" if rows_ == 16 else ""))
            rows.append({"kernel": k.name, "gops": g, "pct_peak": 100 * g / peak})
        out["isas"].append({"isa": AMX_INT8.name, "peak_gops": peak, "tiles": rows})
    else:
        log(f"ISA {AMX_INT8.name}: not on this host ({', '.join(AMX_INT8.host_missing())})")
    return out
