"""LayerNorm over the last axis in LLVM IR: rows of C contiguous float32 values, each
normalized by its own mean and variance, then scaled and shifted per channel:

    y[r, c] = (x[r, c] - mean_r) * rstd_r * gamma[c] + beta[c],
    mean_r = sum_c x[r, c] / C,   rstd_r = 1 / sqrt(sum_c (x[r, c] - mean_r)^2 / C + eps)

    void mk_f32_layernorm_c<C>_<isa>_e<eps bits>(ptr x, ptr gamma, ptr beta, ptr y, i64 rows)

Three passes over a row, which stays in L1 between them (C floats): the sum, the squared
deviations from the mean (two passes, as TVM's legalization computes it: no cancellation of a
sum of squares against the squared mean), and the store. Each pass runs a vector of the ISA's
lanes at a time and one masked vector for C's tail (masked lanes add nothing to either sum).
rstd is a correctly rounded 1 / sqrt, not the approximate reciprocal square root
instruction, whose bits differ between vendors. The sums are reduced across lanes in a tree
(reassociated), so a row's mean differs from a serial sum by the rounding of the order.

ConvNeXt normalizes its tokens over 96 to 768 channels (NHWC, and its downsampling layers'
NCHW tensors through a permute): TVM's lowering vectorized those reductions across pixels,
a strided gather per value, about 1.6 ns a value on the Zen 3.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .f32_gemm import TileError
from .f32_vmap import float_literal
from .isa import Isa


@dataclass(frozen=True)
class LayerNormKernel:
    """Rows of `c` float32 values normalized over the row, then gamma * . + beta (module doc)."""

    isa: Isa
    c: int
    eps: float = 1e-5

    def __post_init__(self):
        if not isinstance(self.c, int) or isinstance(self.c, bool) or self.c < 1:
            raise TileError(f"c must be a positive int, got {self.c!r}")
        eps = float(np.float32(self.eps))
        if not np.isfinite(eps) or eps < 0:
            raise TileError(f"eps must be a finite float >= 0, got {self.eps!r}")
        object.__setattr__(self, "eps", eps)

    @property
    def name(self) -> str:
        bits = np.float32(self.eps).view(np.uint32).tobytes()[::-1].hex()
        return f"mk_f32_layernorm_c{self.c}_{self.isa.name}_e{bits}"

    def llvm_ir(self) -> str:
        return _generate(self)


def _loop(out: list[str], tag: str, n: int, pre: str, accs: list[tuple[str, str]], body) -> list[str]:
    """A loop over the row's first n values (whole vectors), from block `pre`. accs: (name, initial value) of
    vector accumulators carried through it; body(i, acc names) appends the loop's instructions
    and returns the accumulators' next values. Returns the accumulators' final names. VT and LANES
    are left for _generate to fill in."""
    if n == 0:
        return [init for _, init in accs]
    out.append(f"  br label %{tag}")
    out.append(f"{tag}:")
    out.append(f"  %{tag}_i = phi i64 [0, %{pre}], [%{tag}_next, %{tag}]")
    for name, init in accs:
        out.append(f"  %{tag}_{name} = phi VT [{init}, %{pre}], [%{tag}_{name}_n, %{tag}]")
    nxt = body(f"%{tag}_i", [f"%{tag}_{name}" for name, _ in accs])
    for (name, _), value in zip(accs, nxt):
        out.append(f"  %{tag}_{name}_n = bitcast VT {value} to VT")
    out.append(f"  %{tag}_next = add nuw nsw i64 %{tag}_i, LANES")
    out.append(f"  %{tag}_more = icmp ult i64 %{tag}_next, {n}")
    out.append(f"  br i1 %{tag}_more, label %{tag}, label %{tag}_done")
    out.append(f"{tag}_done:")
    return [f"%{tag}_{name}_n" for name, _ in accs]


def _generate(kern: LayerNormKernel) -> str:
    lanes, vt, c = kern.isa.lanes, kern.isa.vector_type, kern.c
    mt = f"<{lanes} x i1>"
    full = c // lanes * lanes  # values in full vectors
    left = c - full
    zero = "zeroinitializer"
    out = [f"define internal void @{kern.name}(ptr noalias %x, ptr noalias %g, ptr noalias %b, ptr noalias %y,"
           " i64 %rows) alwaysinline {",
           "entry:",
           "  %any = icmp sgt i64 %rows, 0",
           "  br i1 %any, label %row, label %exit",
           "row:",
           "  %r = phi i64 [0, %entry], [%rnext, %row_end]",
           f"  %off = mul nuw nsw i64 %r, {c}",
           "  %px = getelementptr inbounds float, ptr %x, i64 %off",
           "  %py = getelementptr inbounds float, ptr %y, i64 %off"]
    if left:
        out.append(f"  %mask = icmp ult <{lanes} x i32> <{', '.join(f'i32 {j}' for j in range(lanes))}>, "
                   f"<{', '.join(f'i32 {left}' for _ in range(lanes))}>")

    def load(ptr: str, i: str, name: str, masked: bool = False) -> str:
        out.append(f"  %{name}_p = getelementptr inbounds float, ptr {ptr}, i64 {i}")
        if masked:
            out.append(f"  %{name} = call {vt} @llvm.masked.load.v{lanes}f32.p0(ptr %{name}_p, i32 4, {mt} %mask, "
                       f"{vt} {zero})")
        else:
            out.append(f"  %{name} = load {vt}, ptr %{name}_p, align 4")
        return f"%{name}"

    def reduce(acc: str, name: str) -> str:
        out.append(f"  %{name} = call reassoc float @llvm.vector.reduce.fadd.v{lanes}f32(float -0.0, {vt} {acc})")
        return f"%{name}"

    def splat(scalar: str, name: str) -> str:
        out.append(f"  %{name}_i = insertelement {vt} poison, float {scalar}, i64 0")
        out.append(f"  %{name} = shufflevector {vt} %{name}_i, {vt} poison, <{lanes} x i32> zeroinitializer")
        return f"%{name}"

    # The sum, then the mean.
    def sum_body(i, accs):
        v = load("%px", i, "s_x")
        out.append(f"  %s_add = fadd {vt} {accs[0]}, {v}")
        return ["%s_add"]

    (acc,) = _loop(out, "sum", full, "row", [("acc", zero)], sum_body)
    if left:
        v = load("%px", str(full), "s_xt", masked=True)
        out.append(f"  %s_acct = fadd {vt} {acc}, {v}")
        acc = "%s_acct"
    total = reduce(acc, "sum_r")
    out.append(f"  %mean = fdiv float {total}, {float_literal(c)}")
    mean = splat("%mean", "meanv")

    # The squared deviations, then rstd.
    def var_body(i, accs):
        v = load("%px", i, "v_x")
        out.append(f"  %v_d = fsub {vt} {v}, {mean}")
        out.append(f"  %v_fma = call {vt} @llvm.fma.v{lanes}f32({vt} %v_d, {vt} %v_d, {vt} {accs[0]})")
        return ["%v_fma"]

    (acc,) = _loop(out, "var", full, "sum_done" if full else "row", [("acc", zero)], var_body)
    if left:
        v = load("%px", str(full), "v_xt", masked=True)
        out.append(f"  %v_dt0 = fsub {vt} {v}, {mean}")
        out.append(f"  %v_dt = select {mt} %mask, {vt} %v_dt0, {vt} {zero}")
        out.append(f"  %v_acct = call {vt} @llvm.fma.v{lanes}f32({vt} %v_dt, {vt} %v_dt, {vt} {acc})")
        acc = "%v_acct"
    var = reduce(acc, "var_r")
    out += [f"  %variance = fdiv float {var}, {float_literal(c)}",
            f"  %vare = fadd float %variance, {float_literal(kern.eps)}",
            "  %sd = call float @llvm.sqrt.f32(float %vare)",
            f"  %rstd = fdiv float {float_literal(1.0)}, %sd"]
    rstd = splat("%rstd", "rstdv")

    # y = (x - mean) * rstd * gamma + beta.
    def store_body(i, accs, masked=False):
        t = "t" if masked else ""
        v = load("%px", i, f"o_x{t}", masked)
        gv = load("%g", i, f"o_g{t}", masked)
        bv = load("%b", i, f"o_b{t}", masked)
        out.append(f"  %o_d{t} = fsub {vt} {v}, {mean}")
        out.append(f"  %o_n{t} = fmul {vt} %o_d{t}, {rstd}")
        out.append(f"  %o_y{t} = call {vt} @llvm.fma.v{lanes}f32({vt} %o_n{t}, {vt} {gv}, {vt} {bv})")
        out.append(f"  %o_yp{t} = getelementptr inbounds float, ptr %py, i64 {i}")
        if masked:
            out.append(f"  call void @llvm.masked.store.v{lanes}f32.p0({vt} %o_y{t}, ptr %o_yp{t}, i32 4, {mt} %mask)")
        else:
            out.append(f"  store {vt} %o_y{t}, ptr %o_yp{t}, align 4")
        return []

    _loop(out, "out", full, "var_done" if full else "row", [], store_body)
    if left:
        store_body(str(full), [], masked=True)
    out += ["  br label %row_end",
            "row_end:",
            "  %rnext = add nuw nsw i64 %r, 1",
            "  %rmore = icmp slt i64 %rnext, %rows",
            "  br i1 %rmore, label %row, label %exit",
            "exit:",
            "  ret void",
            "}",
            f"declare {vt} @llvm.fma.v{lanes}f32({vt}, {vt}, {vt})",
            f"declare float @llvm.vector.reduce.fadd.v{lanes}f32(float, {vt})",
            "declare float @llvm.sqrt.f32(float)",
            f"declare {vt} @llvm.masked.load.v{lanes}f32.p0(ptr, i32, {mt}, {vt})",
            f"declare void @llvm.masked.store.v{lanes}f32.p0({vt}, ptr, i32, {mt})", ""]
    return "\n".join(out).replace("VT", vt).replace("LANES", str(lanes))
