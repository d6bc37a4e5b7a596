"""Integer multiply-accumulate throughput probe, the integer tiles' peak (as f32_fma_peak is the
FP32 tiles'): independent chains of the instruction a tile's K step issues, nothing else.

    void mk_<op>_dotpeak_<chains>_<isa>(ptr io, i32 iters)
op "u8s8": one vpdpbusd per chain and iteration; op "s16": one vpmaddwd and one vpaddd, the
upcast tile's pair; op "u8s7" (pairs=True): vpmaddubsw, a vpmaddwd by ones and a vpaddd, the
pairs tile's three. io holds 2 + chains vectors (two operands, then the chains' start values,
overwritten with the results so nothing can be optimized away). Each vpmaddwd multiplies its
chain's own value, so it cannot be hoisted out of the loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from .int_gemm import OPS, PAIR_OPS, TileError
from .isa import Isa


@dataclass(frozen=True)
class DotPeakKernel:
    isa: Isa
    pairs: bool = False

    def __post_init__(self):
        ops = PAIR_OPS if self.pairs else OPS
        if self.isa.name not in ops:
            raise TileError(f"no integer peak probe for {self.isa.name}; expected one of {sorted(ops)}")

    @property
    def _ops(self) -> tuple:
        """(op, A dtype, B dtype, k per group) as the tile of this ISA (and variant) has them."""
        return (PAIR_OPS if self.pairs else OPS)[self.isa.name]

    @property
    def op(self) -> str:
        return self._ops[0]

    @property
    def chains(self) -> int:
        return self.isa.vector_registers - 4

    @property
    def name(self) -> str:
        return f"mk_{self.op}_dotpeak_{self.chains}_{self.isa.name}"  # op: u8s7 for the pairs probe

    @property
    def io_words(self) -> int:
        """int32 words of io."""
        return (2 + self.chains) * self.isa.lanes

    def ops(self, iters: int) -> int:
        """Integer operations (a multiply and an add per MAC) that `iters` iterations perform."""
        return 2 * self.isa.lanes * self._ops[3] * self.chains * iters

    def llvm_ir(self) -> str:
        lanes, bits, n = self.isa.lanes, self.isa.vector_bits, self.chains
        vi = f"<{lanes} x i32>"
        vo = f"<{4 * lanes} x i8>" if self.op in ("u8s8", "u8s7") else f"<{2 * lanes} x i16>"
        vw = f"<{2 * lanes} x i16>"
        madd = "@llvm.x86.avx512.pmaddw.d.512" if bits == 512 else "@llvm.x86.avx2.pmadd.wd"
        ubsw = "@llvm.x86.avx512.pmaddubs.w.512" if bits == 512 else "@llvm.x86.avx2.pmadd.ub.sw"
        ones = "<" + ", ".join(["i16 1"] * 2 * lanes) + ">"
        if self.op == "u8s8":
            callee, decl = f"@llvm.x86.avx512.vpdpbusd.{bits}", f"({vi}, {vo}, {vo})"
        elif self.op == "u8s7":
            callee, decl = ubsw, f"({vo}, {vo})"
        else:
            callee, decl = madd, f"({vo}, {vo})"
        out = [f"define internal void @{self.name}(ptr noalias %io, i32 %iters) alwaysinline {{", "entry:",
               f"  %m = load {vo}, ptr %io, align 4",
               f"  %pa = getelementptr inbounds i32, ptr %io, i64 {lanes}",
               f"  %ad = load {vi}, ptr %pa, align 4"]
        if self.op == "u8s8":
            out.append(f"  %adb = bitcast {vi} %ad to {vo}")
        for c in range(n):
            out.append(f"  %p{c} = getelementptr inbounds i32, ptr %io, i64 {(2 + c) * lanes}")
            out.append(f"  %s{c} = load {vi}, ptr %p{c}, align 4")
        out += ["  br label %loop", "loop:", "  %it = phi i32 [0, %entry], [%itn, %loop]"]
        out += [f"  %x{c} = phi {vi} [%s{c}, %entry], [%y{c}, %loop]" for c in range(n)]
        for c in range(n):
            if self.op == "u8s8":
                out.append(f"  %y{c} = call {vi} {callee}({vi} %x{c}, {vo} %m, {vo} %adb)")
            elif self.op == "u8s7":  # each chain's bytes times m, pairs summed by ones, + ad
                out.append(f"  %xb{c} = bitcast {vi} %x{c} to {vo}")
                out.append(f"  %w{c} = call {vw} {callee}({vo} %xb{c}, {vo} %m)")
                out.append(f"  %q{c} = call {vi} {madd}({vw} %w{c}, {vw} {ones})")
                out.append(f"  %y{c} = add {vi} %q{c}, %ad")
            else:
                out.append(f"  %xw{c} = bitcast {vi} %x{c} to {vo}")
                out.append(f"  %q{c} = call {vi} {callee}({vo} %xw{c}, {vo} %m)")
                out.append(f"  %y{c} = add {vi} %q{c}, %ad")
        out += ["  %itn = add nuw nsw i32 %it, 1", "  %more = icmp slt i32 %itn, %iters",
                "  br i1 %more, label %loop, label %exit", "exit:"]
        for c in range(n):
            out.append(f"  store {vi} %y{c}, ptr %p{c}, align 4")
        out += ["  ret void", "}"]
        out += [f"declare {vw} {callee}{decl}", f"declare {vi} {madd}({vw}, {vw})"] if self.op == "u8s7" else \
            [f"declare {vi} {callee}{decl}"]
        out.append("")
        return "\n".join(out)
