"""Elementwise row kernels of the vector math (microkernels/f32_vmath/) in LLVM IR: y = f(x)
over n contiguous float32 values, a vector of the ISA's lanes at a time and one masked vector
for the tail. The algorithms are f32_vmath's, rendered here by `IrOps` into SSA instructions on
<lanes x float>, so the operations and their order are the ones the bounds were measured for.

    void mk_f32_vmap_<fn>_<isa>[_a<alpha bits>](ptr x, ptr y, i64 n)

x and y may be the same buffer (each vector is loaded before its result is stored) but must not
overlap otherwise; no alignment is assumed. `fn` with a parameter (leaky ReLU's and ELU's alpha)
names the float32 bits of it.

Why IR and not TIR: the same functions as TIR expressions (each step let-bound) vectorized
well but took seconds each to compile (a SiLU 3.7 s, EfficientNet-B0's first call over a
minute): TVM's analyzer binds every let variable to its value and substitutes it into the
next, so a chain that reuses its intermediates grows exponentially in its passes
(IRMutatorWithAnalyzer's Let visitor; measured: 24 steps 0.67 s, 32 steps 30 s). LLVM takes
the same steps as SSA values in milliseconds. `IrOps` is also what a kernel's epilogue can
render an activation with.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from . import f32_vmath as vm
from .isa import Isa


def float_literal(v: float) -> str:
    """A float32 value as LLVM IR writes a float constant: the bits of the double it widens to."""
    return "0x" + struct.pack(">d", float(np.float32(v))).hex().upper()


# The variable permute of floats within 128-bit lanes by i32 indices, per vector width (x86: the
# only ISAs here).
PERMUTE = {8: "avx.vpermilvar.ps.256", 16: "avx512.vpermilvar.ps.512"}


class IrOps(vm.Ops):
    """f32_vmath's operations as LLVM IR instructions appended to `out` on vectors of `lanes`
    floats; values are SSA names (constants: splat literals). Names carry `tag`, so two
    renderings can share a function."""

    def __init__(self, lanes: int, out: list[str], tag: str = ""):
        self.lanes, self.out, self.tag, self.count = lanes, out, tag, 0
        self.vt, self.mt, self.it = f"<{lanes} x float>", f"<{lanes} x i1>", f"<{lanes} x i32>"
        self.used: set[str] = set()  # the intrinsics called, for `declarations`

    def _emit(self, rhs: str) -> str:
        name = f"%v{self.tag}_{self.count}"
        self.count += 1
        self.out.append(f"  {name} = {rhs}")
        return name

    def _call(self, fn: str, *args: str) -> str:
        self.used.add(fn)
        return self._emit(f"call {self.vt} @llvm.{fn}.v{self.lanes}f32({', '.join(f'{self.vt} {a}' for a in args)})")

    def _splat(self, scalar_type: str, literal: str) -> str:
        return "<" + ", ".join([f"{scalar_type} {literal}"] * self.lanes) + ">"

    def c(self, v):
        return self._splat("float", float_literal(v))

    def add(self, a, b):
        return self._emit(f"fadd {self.vt} {a}, {b}")

    def sub(self, a, b):
        return self._emit(f"fsub {self.vt} {a}, {b}")

    def mul(self, a, b):
        return self._emit(f"fmul {self.vt} {a}, {b}")

    def div(self, a, b):
        return self._emit(f"fdiv {self.vt} {a}, {b}")

    def fma(self, a, b, c):
        return self._call("fma", a, b, c)

    def neg(self, a):
        return self._emit(f"fneg {self.vt} {a}")

    def abs(self, a):
        return self._call("fabs", a)

    def lt(self, a, b):
        return self._emit(f"fcmp olt {self.vt} {a}, {b}")

    def gt(self, a, b):
        return self._emit(f"fcmp ogt {self.vt} {a}, {b}")

    def ugt(self, a, b):
        return self._emit(f"fcmp ugt {self.vt} {a}, {b}")

    def isnan(self, a):
        return self._emit(f"fcmp uno {self.vt} {a}, {a}")

    def select(self, m, a, b):
        return self._emit(f"select {self.mt} {m}, {self.vt} {a}, {self.vt} {b}")

    def round(self, a):
        return self._call("roundeven", a)

    def copysign(self, a, b):
        return self._call("copysign", a, b)

    def fence(self, a):
        return self._call("arithmetic.fence", a)

    def _int(self, n):
        return self._emit(f"fptosi {self.vt} {n} to {self.it}")

    def pow2(self, n):
        biased = self._emit(f"add {self.it} {self._int(n)}, {self._splat('i32', '127')}")
        bits = self._emit(f"shl {self.it} {biased}, {self._splat('i32', '23')}")
        return self._emit(f"bitcast {self.it} {bits} to {self.vt}")

    def half_int(self, n):
        half = self._emit(f"ashr {self.it} {self._int(n)}, {self._splat('i32', '1')}")
        return self._emit(f"sitofp {self.it} {half} to {self.vt}")

    def binade(self, a, first, top):
        bits = self._emit(f"bitcast {self.vt} {a} to {self.it}")
        k = self._emit(f"lshr {self.it} {bits}, {self._splat('i32', '23')}")
        base = int(np.float32(first).view(np.int32)) >> 23
        k = self._emit(f"sub {self.it} {k}, {self._splat('i32', str(base))}")
        self.used.add("smin")
        top = self._splat("i32", str(top))
        return self._emit(f"call {self.it} @llvm.smin.v{self.lanes}i32({self.it} {k}, {self.it} {top})")

    def lookup(self, k, values):
        """A variable permute within each 128-bit lane (vpermilps: one cheap uop, where vpermps
        across the register costs two on Zen 3), the 4 values in every lane: the index's low two
        bits pick (a negative index, below `first`, some entry)."""
        assert len(values) == 4 and self.lanes in PERMUTE, (len(values), self.lanes)
        table = "<" + ", ".join(f"float {float_literal(v)}" for v in list(values) * (self.lanes // 4)) + ">"
        self.used.add("permute")
        return self._emit(f"call {self.vt} @llvm.x86.{PERMUTE[self.lanes]}({self.vt} {table}, {self.it} {k})")


def declarations(lanes: int, used) -> list[str]:
    """The declarations of the intrinsics an IrOps rendering called."""
    vt, it = f"<{lanes} x float>", f"<{lanes} x i32>"
    arity = {"fma": 3, "fabs": 1, "roundeven": 1, "arithmetic.fence": 1, "copysign": 2}
    other = {"smin": f"declare {it} @llvm.smin.v{lanes}i32({it}, {it})",
             "permute": f"declare {vt} @llvm.x86.{PERMUTE.get(lanes)}({vt}, {it})"}
    return [other[fn] if fn in other else f"declare {vt} @llvm.{fn}.v{lanes}f32({', '.join([vt] * arity[fn])})"
            for fn in sorted(used)]


@dataclass(frozen=True)
class VmapKernel:
    """y[i] = fn(x[i]) for i < n: f32_vmath's `fn` (alpha: its parameter, None for the default
    or for a function without one) on the ISA's vectors."""

    fn: str
    isa: Isa
    alpha: float | None = None

    def __post_init__(self):
        vm.evaluate(vm.NumpyOps(), self.fn, np.zeros(1, np.float32), self.alpha)  # a bad name or alpha: refused here
        if self.fn in vm.PARAMETRIC and self.alpha is None:
            object.__setattr__(self, "alpha", vm.PARAMETRIC[self.fn])
        if self.alpha is not None:
            object.__setattr__(self, "alpha", float(np.float32(self.alpha)))

    @property
    def name(self) -> str:
        suffix = "" if self.alpha is None else "_a" + np.float32(self.alpha).view(np.uint32).tobytes()[::-1].hex()
        return f"mk_f32_vmap_{self.fn}_{self.isa.name}{suffix}"

    def llvm_ir(self) -> str:
        return _generate(self)


def vector_function(fn: str, lanes: int, alpha: float | None = None) -> tuple[str, list[str]]:
    """f32_vmath's `fn` on one <lanes x float> vector as an internal function LLVM inlines:
    (its name, its definition and the declarations it needs). A function with a near form
    (vm.NEAR) tests the vector and takes the near form when every value is within, else the
    full one. The row kernels call it per vector, and a kernel's epilogue per output vector
    (f32_gemm.activation_ir): a call, so the branch it holds leaves the caller's blocks as
    they are (the inliner splits them)."""
    vt, mt = f"<{lanes} x float>", f"<{lanes} x i1>"
    suffix = "" if alpha is None else "_a" + np.float32(alpha).view(np.uint32).tobytes()[::-1].hex()
    name = f"mk_f32_vec_{fn}_v{lanes}{suffix}"
    out = [f"define internal {vt} @{name}({vt} %xv) alwaysinline {{", "entry:"]
    used: set = set()
    extra: list[str] = []
    if fn in vm.NEAR:
        # Every |x| within NEAR (not NaN) takes the near form, else the full one.
        near = IrOps(lanes, out, "n")
        out += [f"  %ax = call {vt} @llvm.fabs.v{lanes}f32({vt} %xv)",
                f"  %out = fcmp ugt {vt} %ax, {near.c(vm.NEAR[fn])}",
                f"  %anyout = call i1 @llvm.vector.reduce.or.v{lanes}i1({mt} %out)",
                "  br i1 %anyout, label %full, label %near",
                "near:"]
        yn = vm.evaluate(near, fn, "%xv", alpha, near=True)
        out += ["  br label %join", "full:"]
        full = IrOps(lanes, out, "b")
        yf = vm.evaluate(full, fn, "%xv", alpha)
        out += ["  br label %join", "join:", f"  %yv = phi {vt} [{yn}, %near], [{yf}, %full]", f"  ret {vt} %yv"]
        used |= near.used | full.used | {"fabs"}
        extra = [f"declare i1 @llvm.vector.reduce.or.v{lanes}i1({mt})"]
    else:
        full = IrOps(lanes, out, "b")
        out.append(f"  ret {vt} {vm.evaluate(full, fn, '%xv', alpha)}")
        used |= full.used
    return name, out + ["}", *declarations(lanes, used), *extra]


def merged(lines: list[str]) -> list[str]:
    """`lines` of a module with each repeated declaration kept once (a kernel and the vector
    functions it calls may declare the same intrinsic; LLVM refuses a second declare)."""
    seen: set = set()
    out = []
    for line in lines:
        if line.startswith("declare "):
            if line in seen:
                continue
            seen.add(line)
        out.append(line)
    return out


def _generate(kern: VmapKernel) -> str:
    """One vector per iteration (vector_function, near form where every value allows it), then
    one masked vector in the full form. Two or four independent vectors per iteration measured
    no faster (Zen 4, AVX-512 and AVX2: within 5%, exp alone 15% faster at four, GELU 5%
    slower): the functions are bound by their arithmetic, not by a chain's latency."""
    lanes, vt = kern.isa.lanes, kern.isa.vector_type
    mt = f"<{lanes} x i1>"
    fname, fdef = vector_function(kern.fn, lanes, kern.alpha)
    out = [f"define internal void @{kern.name}(ptr %x, ptr %y, i64 %n) alwaysinline {{",
           "entry:",
           "  %pos = icmp sgt i64 %n, 0",
           "  %m = select i1 %pos, i64 %n, i64 0",  # n <= 0: nothing, not a masked vector
           f"  %nv = and i64 %m, {-lanes}",
           "  %any = icmp sgt i64 %nv, 0",
           "  br i1 %any, label %body, label %tail",
           "body:",
           "  %i = phi i64 [0, %entry], [%next, %body]",
           "  %px = getelementptr inbounds float, ptr %x, i64 %i",
           f"  %xv = load {vt}, ptr %px, align 4",
           f"  %yv = call {vt} @{fname}({vt} %xv)"]
    used: set = set()
    yv = "%yv"
    out += ["  %py = getelementptr inbounds float, ptr %y, i64 %i",
            f"  store {vt} {yv}, ptr %py, align 4",
            f"  %next = add nuw nsw i64 %i, {lanes}",
            "  %more = icmp slt i64 %next, %nv",
            "  br i1 %more, label %body, label %tail",
            "tail:",
            "  %left = sub i64 %m, %nv",
            "  %some = icmp sgt i64 %left, 0",
            "  br i1 %some, label %last, label %exit",
            "last:",
            "  %pxt = getelementptr inbounds float, ptr %x, i64 %nv",
            "  %pyt = getelementptr inbounds float, ptr %y, i64 %nv",
            f"  %lefti = insertelement <{lanes} x i64> poison, i64 %left, i64 0",
            f"  %leftv = shufflevector <{lanes} x i64> %lefti, <{lanes} x i64> poison, <{lanes} x i32> zeroinitializer",
            f"  %mask = icmp ult <{lanes} x i64> <{', '.join(f'i64 {j}' for j in range(lanes))}>, %leftv",
            f"  %xt = call {vt} @llvm.masked.load.v{lanes}f32.p0(ptr %pxt, i32 4, {mt} %mask, {vt} zeroinitializer)"]
    tail = IrOps(lanes, out, "t")
    yt = vm.evaluate(tail, kern.fn, "%xt", kern.alpha)
    out += [f"  call void @llvm.masked.store.v{lanes}f32.p0({vt} {yt}, ptr %pyt, i32 4, {mt} %mask)",
            "  br label %exit",
            "exit:",
            "  ret void",
            "}",
            *fdef,
            f"declare {vt} @llvm.masked.load.v{lanes}f32.p0(ptr, i32, {mt}, {vt})",
            f"declare void @llvm.masked.store.v{lanes}f32.p0({vt}, ptr, i32, {mt})",
            *declarations(lanes, used | tail.used), ""]
    return "\n".join(merged(out))
