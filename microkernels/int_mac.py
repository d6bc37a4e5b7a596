"""Integer GEMM tiles on ARM NEON: C[MR, NR] += A[MR, K] @ B[K, NR] with int32 accumulators.

One parametric generator, two operations:
- s16 mac: int16 inputs, one widening multiply-accumulate per 4 products: `vmlal.s16 q, d, d[lane]`
  on ARMv7, `smlal` / `smlal2 v.4s, v.(4|8)h, v.h[lane]` on AArch64. Quantized int8 data is
  widened (and its zero point subtracted) once, by the schedule's packing, so the loop holds
  nothing but loads and MACs.
- s8 dot: int8 inputs on ARMv8.2's `sdot v.4s, v.16b, v.4b[lane]`, 16 products per instruction.

Each K step loads one vector of A per row (k_step values of that row), and for every k in it a
row of B; the A element multiplies B by lane, so no broadcast instruction is needed. That is why
A's registers must be ones a by-lane operand can name (d0-d7 on ARMv7, v0-v15 on AArch64).
The MR x NR/4 int32 accumulators stay in q registers for the whole K loop: C is loaded before it
and stored after.

Signature of every generated kernel (strides in elements, K a multiple of k_step):
    void mk_s16_mac_<MR>x<NR>_<isa>(ptr a, i32 lda, ptr b, i32 ldb, ptr c, i32 ldc, i32 k)
    void mk_s8_dot_<MR>x<NR>_<isa>(...same...)
For s16 mac, B row k starts at b + k*ldb. For s8 dot, B is packed in groups of 4 k: the 4 bytes
of column j for k = 4g..4g+3 sit at b + g*ldb + 4*j (the layout sdot multiplies in one go).
"""

from __future__ import annotations

from dataclasses import dataclass

from .f32_gemm import TileError
from .isa import AARCH64, AARCH64_DOT, ARM_ISAS, NEON, Isa, normalize_ints, positive_int

# What each ISA multiplies with, and how many K values one A register holds.
_OPS = {
    NEON.name: ("s16", "mac", 4),  # a d register: 4 x int16
    AARCH64.name: ("s16", "mac", 8),  # a q register: 8 x int16
    AARCH64_DOT.name: ("s8", "dot", 16),  # a q register: 16 x int8, 4 groups of 4
}


@dataclass(frozen=True)
class MacKernel:
    isa: Isa
    mr: int
    nr: int

    batch_reduce = False  # one call per run of K; a conv tile calls it per kernel row
    accumulate = True  # adds into C (a conv tile accumulates over its calls)

    def __post_init__(self):
        if self.isa.name not in _OPS:
            raise TileError(f"no integer MAC kernel for {self.isa.name}; expected one of {sorted(_OPS)}")
        normalize_ints(self, {"mr": "MR", "nr": "NR"}, TileError)
        check_tile(self.isa, self.mr, self.nr)

    @property
    def dtype(self) -> str:
        return "int8" if _OPS[self.isa.name][0] == "s8" else "int16"

    @property
    def op(self) -> str:
        return _OPS[self.isa.name][1]

    @property
    def k_step(self) -> int:
        """K values per loop iteration; K must be a multiple of it."""
        return _OPS[self.isa.name][2]

    @property
    def group(self) -> int:
        """k per group of packed B: 4 for sdot (B in quads), 1 for the MACs (B row by row)."""
        return 4 if self.op == "dot" else 1

    @property
    def a_dtype(self) -> str:
        return self.dtype

    @property
    def b_dtype(self) -> str:
        return self.dtype

    @property
    def macs_per_instruction(self) -> int:
        return 16 if self.op == "dot" else 4

    @property
    def instructions_per_step(self) -> int:
        """MAC instructions in one K iteration (k_step values of K)."""
        return self.mr * self.nr * self.k_step // self.macs_per_instruction

    @property
    def name(self) -> str:
        dt, op, _ = _OPS[self.isa.name]
        return f"mk_{dt}_{op}_{self.mr}x{self.nr}_{self.isa.name}"

    def llvm_ir(self) -> str:
        return _generate(self)


def registers_needed(isa: Isa, mr: int, nr: int) -> tuple[int, int]:
    """(q registers in the K loop, q registers holding A): accumulators, A rows, and two B rows in
    flight (a B row is NR/8 q registers of int16, or NR/4 of sdot's packed quads)."""
    a_regs = -(-mr // 2) if isa.arch == "armv7" else mr  # ARMv7's A rows are d registers, two to a q
    b_row = nr // 4 if _OPS[isa.name][1] == "dot" else nr // 8
    return mr * nr // 4 + a_regs + 2 * b_row, a_regs


def max_mac_tiles(isa: Isa, nr_limit: int = 64) -> list[tuple[int, int]]:
    """Every (MR, NR) with MR >= 2 that the register budget accepts, NR up to nr_limit."""
    return [(mr, nr) for nr in range(8, nr_limit + 1, 8) for mr in range(2, 64)
            if registers_needed(isa, mr, nr)[0] < isa.vector_registers
            and registers_needed(isa, mr, nr)[1] <= isa.lane_registers]


def check_tile(isa: Isa, mr: int, nr: int) -> None:
    for label, v in (("MR", mr), ("NR", nr)):
        positive_int(label, v, TileError)
    if nr % 8:
        # B rows are loaded 8 columns at a time (one q of int16, or two of sdot groups).
        raise TileError(f"NR={nr} must be a multiple of 8 on {isa.name}")
    need, a_regs = registers_needed(isa, mr, nr)
    # One register stays free: a tile that fills the file exactly (AArch64 10x8) spills in the loop.
    if need >= isa.vector_registers:
        raise TileError(
            f"a {mr}x{nr} tile needs {need} q registers (MR*NR/4 accumulators + A rows + two B rows) "
            f"plus one spare, but {isa.name} has {isa.vector_registers}"
        )
    if a_regs > isa.lane_registers:
        raise TileError(
            f"MR={mr} A rows need {a_regs} q registers that a by-lane multiply can address, "
            f"but {isa.name} has {isa.lane_registers}"
        )


# The QNNPACK/XNNPACK shapes: 4x8 fills ARMv7's q8-q15 with accumulators and q0-q1 with A;
# 8x8 uses 16 of AArch64's 32 registers for accumulators and 8 of the lane-addressable 16 for A.
DEFAULT_TILES = {NEON.name: (4, 8), AARCH64.name: (8, 8), AARCH64_DOT.name: (8, 8)}


def default_mac_kernel(isa_name: str) -> MacKernel:
    mr, nr = DEFAULT_TILES[isa_name]
    return MacKernel(ARM_ISAS[isa_name], mr, nr)


_WIDEN = {NEON.name: "@llvm.arm.neon.vmulls.v4i32", AARCH64.name: "@llvm.aarch64.neon.smull.v4i32"}
_SDOT = "@llvm.aarch64.neon.sdot.v4i32.v16i8"


def _mac_step(kern: MacKernel) -> tuple[list[str], dict]:
    """One K iteration at index %kk: A vectors, then for each k in it B and the by-lane MACs.
    Returns the lines and the name of each accumulator's value after the step."""
    mr, nq, ks = kern.mr, kern.nr // 4, kern.k_step
    at = f"<{ks} x i16>" if kern.op == "mac" else "<16 x i8>"
    out = []
    for i in range(mr):
        out.append(f"  %aep{i} = getelementptr inbounds {'i16' if kern.op == 'mac' else 'i8'}, ptr %ap{i}, i32 %kk")
        out.append(f"  %av{i} = load {at}, ptr %aep{i}, align {2 if kern.op == 'mac' else 1}")
    acc = {(i, q): f"%acc{i}_{q}" for i in range(mr) for q in range(nq)}
    if kern.op == "mac":
        mul = _WIDEN[kern.isa.name]
        for t in range(ks):
            out.append(f"  %k{t} = add i32 %kk, {t}")
            out.append(f"  %bo{t} = mul i32 %k{t}, %ldb")
            for h in range(nq // 2):  # one <8 x i16> load per 8 columns, split into halves
                out.append(f"  %bo{t}_{h} = add i32 %bo{t}, {8 * h}")
                out.append(f"  %bq{t}_{h} = getelementptr inbounds i16, ptr %b, i32 %bo{t}_{h}")
                out.append(f"  %bv{t}_{h} = load <8 x i16>, ptr %bq{t}_{h}, align 2")
                for half in range(2):
                    lanes = ", ".join(f"i32 {4 * half + x}" for x in range(4))
                    out.append(f"  %b{t}_{2 * h + half} = shufflevector <8 x i16> %bv{t}_{h}, <8 x i16> poison, <4 x i32> <{lanes}>")
            for i in range(mr):
                lane = ", ".join([f"i32 {t}"] * 4)
                out.append(f"  %s{i}_{t} = shufflevector {at} %av{i}, {at} poison, <4 x i32> <{lane}>")
                for q in range(nq):
                    p, n = f"%p{i}_{q}_{t}", f"%m{i}_{q}_{t}"
                    out.append(f"  {p} = call <4 x i32> {mul}(<4 x i16> %b{t}_{q}, <4 x i16> %s{i}_{t})")
                    out.append(f"  {n} = add <4 x i32> {acc[i, q]}, {p}")
                    acc[i, q] = n
    else:
        for i in range(mr):
            out.append(f"  %aw{i} = bitcast <16 x i8> %av{i} to <4 x i32>")
        for g in range(ks // 4):
            out.append(f"  %kg{g} = add i32 %kk, {4 * g}")
            out.append(f"  %go{g} = sdiv exact i32 %kg{g}, 4")
            out.append(f"  %bo{g} = mul i32 %go{g}, %ldb")
            for q in range(nq):
                out.append(f"  %bo{g}_{q} = add i32 %bo{g}, {16 * q}")
                out.append(f"  %bp{g}_{q} = getelementptr inbounds i8, ptr %b, i32 %bo{g}_{q}")
                out.append(f"  %b{g}_{q} = load <16 x i8>, ptr %bp{g}_{q}, align 1")
            for i in range(mr):
                lane = ", ".join([f"i32 {g}"] * 4)
                out.append(f"  %sw{i}_{g} = shufflevector <4 x i32> %aw{i}, <4 x i32> poison, <4 x i32> <{lane}>")
                out.append(f"  %s{i}_{g} = bitcast <4 x i32> %sw{i}_{g} to <16 x i8>")
                for q in range(nq):
                    n = f"%m{i}_{q}_{g}"
                    out.append(f"  {n} = call <4 x i32> {_SDOT}(<4 x i32> {acc[i, q]}, <16 x i8> %b{g}_{q}, <16 x i8> %s{i}_{g})")
                    acc[i, q] = n
    return out, acc


def _generate(kern: MacKernel) -> str:
    mr, nq, ks = kern.mr, kern.nr // 4, kern.k_step
    tiles = [(i, q) for i in range(mr) for q in range(nq)]
    out = [
        f"define internal void @{kern.name}(ptr noalias %a, i32 %lda, ptr noalias %b, i32 %ldb,"
        f" ptr noalias %c, i32 %ldc, i32 %k) alwaysinline {{",
        "entry:",
    ]
    elem = "i16" if kern.op == "mac" else "i8"
    for i in range(mr):
        out.append(f"  %arow{i} = mul i32 {i}, %lda")
        out.append(f"  %ap{i} = getelementptr inbounds {elem}, ptr %a, i32 %arow{i}")
        out.append(f"  %crow{i} = mul i32 {i}, %ldc")
        for q in range(nq):
            out.append(f"  %co{i}_{q} = add i32 %crow{i}, {4 * q}")
            out.append(f"  %cp{i}_{q} = getelementptr inbounds i32, ptr %c, i32 %co{i}_{q}")
            out.append(f"  %c0_{i}_{q} = load <4 x i32>, ptr %cp{i}_{q}, align 4")
    # A while loop, so K = 0 leaves C as it was instead of running once.
    out += ["  %empty = icmp sle i32 %k, 0", "  br i1 %empty, label %exit, label %loop", "loop:"]
    out.append("  %kk = phi i32 [0, %entry], [%kn, %loop]")
    step, nacc = _mac_step(kern)
    for i, q in tiles:
        out.append(f"  %acc{i}_{q} = phi <4 x i32> [%c0_{i}_{q}, %entry], [{nacc[i, q]}, %loop]")
    out += step
    out += [
        f"  %kn = add nuw nsw i32 %kk, {ks}",
        "  %more = icmp slt i32 %kn, %k",
        # One K step per iteration: the step is already k_step x MR x NR/4 MACs long, and a
        # loop that is exactly one step states the tile in its instruction counts.
        "  br i1 %more, label %loop, label %exit, !llvm.loop !0",
        "exit:",
    ]
    for i, q in tiles:
        out.append(f"  %res{i}_{q} = phi <4 x i32> [%c0_{i}_{q}, %entry], [{nacc[i, q]}, %loop]")
    for i, q in tiles:
        out.append(f"  store <4 x i32> %res{i}_{q}, ptr %cp{i}_{q}, align 4")
    out += ["  ret void", "}"]
    if kern.op == "mac":
        out.append(f"declare <4 x i32> {_WIDEN[kern.isa.name]}(<4 x i16>, <4 x i16>)")
    else:
        out.append(f"declare <4 x i32> {_SDOT}(<4 x i32>, <16 x i8>, <16 x i8>)")
    out += ["!0 = distinct !{!0, !1}", '!1 = !{!"llvm.loop.unroll.disable"}', ""]
    return "\n".join(out)
