"""FP32 GEMM tile: C[MR, NR] (+)= A[MR, K] @ B[K, NR], one parametric LLVM IR generator.

The K loop lives inside the kernel and the MR x NR/lanes accumulators stay in vector registers
for all of it: C is loaded once before the loop (or zeroed, for the beta=0 variant) and stored
once after. Each K step broadcasts MR elements of A and loads NR/lanes vectors of B.
Row strides of A, B and C are arguments, so one kernel serves packed GEMM panels and direct
convolution on NCHWc data alike; columns are unit stride.

Signature of every generated kernel (all strides in elements):
    void mk_f32_gemm_<MR>x<NR>_<isa>[_beta0](ptr a, i32 lda, ptr b, i32 ldb, ptr c, i32 ldc, i32 k)
"""

from __future__ import annotations

from dataclasses import dataclass

from .isa import ISAS, Isa


class TileError(ValueError):
    """A tile shape the ISA cannot hold in registers, or that is malformed."""


@dataclass(frozen=True)
class GemmKernel:
    isa: Isa
    mr: int
    nr: int
    accumulate: bool = True  # False: the beta=0 variant, C is overwritten

    def __post_init__(self):
        check_tile(self.isa, self.mr, self.nr)

    @property
    def vectors_per_row(self) -> int:
        return self.nr // self.isa.lanes

    @property
    def fmas_per_k(self) -> int:
        return self.mr * self.vectors_per_row

    @property
    def name(self) -> str:
        suffix = "" if self.accumulate else "_beta0"
        return f"mk_f32_gemm_{self.mr}x{self.nr}_{self.isa.name}{suffix}"

    def llvm_ir(self) -> str:
        return _generate(self)


def registers_needed(isa: Isa, mr: int, nr: int) -> int:
    """Vector registers a tile occupies in its K loop: accumulators, B row, broadcast."""
    nv = nr // isa.lanes
    broadcast = 0 if (isa.embedded_broadcast and nv == 1) else 1
    return mr * nv + nv + broadcast


def check_tile(isa: Isa, mr: int, nr: int) -> None:
    for label, v in (("MR", mr), ("NR", nr)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise TileError(f"{label} must be a positive int, got {v!r}")
    if nr % isa.lanes:
        raise TileError(f"NR={nr} must be a multiple of the {isa.name} vector width ({isa.lanes} floats)")
    need = registers_needed(isa, mr, nr)
    if need > isa.vector_registers:
        raise TileError(
            f"a {mr}x{nr} tile needs {need} vector registers (MR*NR/{isa.lanes} accumulators + "
            f"NR/{isa.lanes} B vectors + broadcast) but {isa.name} has {isa.vector_registers}"
        )


def max_tiles(isa: Isa) -> list[tuple[int, int]]:
    """Every (MR, NR) whose MR is the largest the register file allows for that NR."""
    tiles = []
    nr = isa.lanes
    while registers_needed(isa, 1, nr) <= isa.vector_registers:
        mr = 1
        while registers_needed(isa, mr + 1, nr) <= isa.vector_registers:
            mr += 1
        tiles.append((mr, nr))
        nr += isa.lanes
    return tiles


# Chosen by measurement (README, "Choosing the tile"). AVX2: 6x16 led three of four sweeps
# here, at the FMA peak. AVX-512: a one-vector-wide tile lets
# every broadcast fold into its FMA ({1to16}), so 28 accumulators fit beside the B vector, and
# NR = 16 is the NCHW16c block of the convolutions; llvm-mca puts it at 96% of the FMA ports.
DEFAULT_TILES = {"avx2": (6, 16), "avx512": (28, 16)}


def default_kernel(isa_name: str, accumulate: bool = True) -> GemmKernel:
    mr, nr = DEFAULT_TILES[isa_name]
    return GemmKernel(ISAS[isa_name], mr, nr, accumulate)


def _generate(kern: GemmKernel) -> str:
    mr, nv, lanes = kern.mr, kern.vectors_per_row, kern.isa.lanes
    vt = kern.isa.vector_type
    fma = f"@llvm.fma.v{lanes}f32"
    out = [
        f"define internal void @{kern.name}(ptr noalias %a, i32 %lda, ptr noalias %b, i32 %ldb,"
        f" ptr noalias %c, i32 %ldc, i32 %k) alwaysinline {{",
        "entry:",
        "  %lda64 = sext i32 %lda to i64",
        "  %ldb64 = sext i32 %ldb to i64",
        "  %ldc64 = sext i32 %ldc to i64",
        "  %k64 = sext i32 %k to i64",
    ]
    for i in range(mr):
        out.append(f"  %crow{i} = mul i64 {i}, %ldc64")
        out.append(f"  %arow{i} = mul i64 {i}, %lda64")
        out.append(f"  %ap{i} = getelementptr inbounds float, ptr %a, i64 %arow{i}")
        for j in range(nv):
            out.append(f"  %co{i}_{j} = add i64 %crow{i}, {j * lanes}")
            out.append(f"  %cp{i}_{j} = getelementptr inbounds float, ptr %c, i64 %co{i}_{j}")
            if kern.accumulate:
                out.append(f"  %c0_{i}_{j} = load {vt}, ptr %cp{i}_{j}, align 4")
    init = (lambda i, j: f"%c0_{i}_{j}") if kern.accumulate else (lambda i, j: "zeroinitializer")
    # A while loop, so K = 0 leaves C as it was (or zero for beta=0) instead of running once.
    out += ["  %empty = icmp sle i64 %k64, 0", "  br i1 %empty, label %exit, label %loop", "loop:"]
    out.append("  %kk = phi i64 [0, %entry], [%kn, %loop]")
    for i in range(mr):
        for j in range(nv):
            out.append(f"  %acc{i}_{j} = phi {vt} [{init(i, j)}, %entry], [%nacc{i}_{j}, %loop]")
    out.append("  %brow = mul i64 %kk, %ldb64")
    for j in range(nv):
        out.append(f"  %bo{j} = add i64 %brow, {j * lanes}")
        out.append(f"  %bp{j} = getelementptr inbounds float, ptr %b, i64 %bo{j}")
        out.append(f"  %bv{j} = load {vt}, ptr %bp{j}, align 4")
    for i in range(mr):
        out.append(f"  %aep{i} = getelementptr inbounds float, ptr %ap{i}, i64 %kk")
        out.append(f"  %as{i} = load float, ptr %aep{i}, align 4")
        out.append(f"  %ai{i} = insertelement {vt} poison, float %as{i}, i64 0")
        out.append(f"  %ab{i} = shufflevector {vt} %ai{i}, {vt} poison, <{lanes} x i32> zeroinitializer")
        for j in range(nv):
            out.append(f"  %nacc{i}_{j} = call {vt} {fma}({vt} %ab{i}, {vt} %bv{j}, {vt} %acc{i}_{j})")
    out += [
        "  %kn = add nuw nsw i64 %kk, 1",
        "  %more = icmp slt i64 %kn, %k64",
        # Unrolling only repeats the same FMAs; keeping one K step per iteration keeps the
        # loop small and its FMA count a direct statement of the tile.
        "  br i1 %more, label %loop, label %exit, !llvm.loop !0",
        "exit:",
    ]
    tiles = [(i, j) for i in range(mr) for j in range(nv)]
    for i, j in tiles:
        out.append(f"  %res{i}_{j} = phi {vt} [{init(i, j)}, %entry], [%nacc{i}_{j}, %loop]")
    for i, j in tiles:
        out.append(f"  store {vt} %res{i}_{j}, ptr %cp{i}_{j}, align 4")
    out += [
        "  ret void",
        "}",
        f"declare {vt} {fma}({vt}, {vt}, {vt})",
        "!0 = distinct !{!0, !1}",
        '!1 = !{!"llvm.loop.unroll.disable"}',
        "",
    ]
    return "\n".join(out)
