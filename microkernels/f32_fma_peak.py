"""FP32 FMA throughput probe: independent FMA chains, nothing else in the loop.

The benchmark's "peak" is what this kernel reaches on the machine at hand, not a datasheet
figure. Enough chains hide the FMA latency on every core we know of (latency 4-5 x 2 ports).

    void mk_f32_fmapeak_<chains>_<isa>(ptr io, i32 iters)
io holds at least 2 + chains vectors: a multiplier, an addend, then the chains' start values,
which are overwritten with the results (so nothing can be optimized away).

With `loads=True` (mk_f32_fmapeak_load_...) every FMA takes its multiplier fresh from L1: the
rate of one load per FMA, which is a depthwise convolution's bound (each tap is one FMA on one
loaded input vector). The loads walk SLOTS x chains vectors after the start values, chosen by
the iteration number, so LLVM cannot hoist them out of the loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from .isa import Isa

SLOTS = 8  # load variant: distinct multipliers per chain (8 x 28 zmm = 14 KiB, in L1)


@dataclass(frozen=True)
class FmaPeakKernel:
    isa: Isa
    loads: bool = False

    @property
    def chains(self) -> int:
        return self.isa.vector_registers - 4

    @property
    def name(self) -> str:
        return f"mk_f32_fmapeak_{'load_' if self.loads else ''}{self.chains}_{self.isa.name}"

    @property
    def io_floats(self) -> int:
        return (2 + self.chains * (1 + SLOTS * self.loads)) * self.isa.lanes

    def flops(self, iters: int) -> int:
        return 2 * self.isa.lanes * self.chains * iters

    def llvm_ir(self) -> str:
        vt, lanes, n = self.isa.vector_type, self.isa.lanes, self.chains
        fma = f"@llvm.fma.v{lanes}f32"
        out = [f"define internal void @{self.name}(ptr noalias %io, i32 %iters) alwaysinline {{", "entry:"]
        out.append(f"  %m = load {vt}, ptr %io, align 4")
        out.append(f"  %pa = getelementptr inbounds float, ptr %io, i64 {lanes}")
        out.append(f"  %ad = load {vt}, ptr %pa, align 4")
        for c in range(n):
            out.append(f"  %p{c} = getelementptr inbounds float, ptr %io, i64 {(2 + c) * lanes}")
            out.append(f"  %s{c} = load {vt}, ptr %p{c}, align 4")
        out += ["  br label %loop", "loop:", "  %it = phi i32 [0, %entry], [%itn, %loop]"]
        for c in range(n):
            out.append(f"  %x{c} = phi {vt} [%s{c}, %entry], [%y{c}, %loop]")
        if self.loads:
            out += ["  %slot = and i32 %it, " + str(SLOTS - 1), "  %slot64 = zext i32 %slot to i64",
                    f"  %base = mul i64 %slot64, {n * lanes}", f"  %base2 = add i64 %base, {(2 + n) * lanes}"]
        for c in range(n):
            m = "%m"
            if self.loads:
                out.append(f"  %lo{c} = add i64 %base2, {c * lanes}")
                out.append(f"  %lp{c} = getelementptr inbounds float, ptr %io, i64 %lo{c}")
                out.append(f"  %lm{c} = load {vt}, ptr %lp{c}, align 4")
                m = f"%lm{c}"
            out.append(f"  %y{c} = call {vt} {fma}({vt} %x{c}, {vt} {m}, {vt} %ad)")
        out += [
            "  %itn = add nuw nsw i32 %it, 1",
            "  %more = icmp slt i32 %itn, %iters",
            "  br i1 %more, label %loop, label %exit",
            "exit:",
        ]
        for c in range(n):
            out.append(f"  store {vt} %y{c}, ptr %p{c}, align 4")
        out += ["  ret void", "}", f"declare {vt} {fma}({vt}, {vt}, {vt})", ""]
        return "\n".join(out)
