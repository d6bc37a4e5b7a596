"""Each output element from its accumulator: + bias, then as the Quantization says (int32 as it
is; 8-bit requantized as ONNX's QuantizeLinear: round half to even, + zero point, saturate;
float32 dequantized), then the fused quantized residual add (QLinearAdd's rule)."""

from __future__ import annotations

from microkernels.int_gemm import out_range


def bounds(plan) -> tuple[int, int]:
    """The 8-bit output's saturation bounds (lo, hi): the dtype's range, lo raised to the output's
    zero point by a fused ReLU. The TIR store (`output`) and the kernel's (gemm.fused_tile) both."""
    lo, hi = out_range(plan.output_dtype)
    return (max(lo, plan.zp_out), hi) if plan.activation == "relu" else (lo, hi)


def output(plan, acc: str, o: str, idx: str) -> str:
    """TVMScript of the output element Out[idx] from its accumulator `acc` (output channel `o`):
    + Bias, then as Quantization says (int32 as is; 8-bit requantized: round half to even, + zero
    point, saturate, clamped before the conversion so it stays in range; float32 dequantized),
    then the fused residual add of R[idx] (Quantization's rule) where the plan has one."""
    og = plan.layer.og
    o = f"({o})"
    if plan.bias:
        acc = f"{acc} + Bias[{o} // {og}, {o} % {og}]"
    out = plan.output_dtype
    if out == "int32":
        return f"T.max({acc}, T.int32(0))" if plan.activation == "relu" else acc
    real = f"T.Cast('float32', {acc}) * M[{o}]"
    if out == "float32":
        return f"T.max({real}, T.float32(0))" if plan.activation == "relu" else real
    lo, hi = bounds(plan)
    zp = plan.zp_out
    clamped = f"T.max(T.min(T.round({real}), T.float32({hi - zp})), T.float32({lo - zp}))"
    if plan.residual is not None:
        # y - zp is the clamped value itself; the sum is clamped to the dtype's range around its
        # own zero point, then converted, as above.
        ra, rb, zr, zz = plan.residual
        lo, hi = out_range(out)
        total = (f"T.float32({ra!r}) * {clamped} + T.float32({rb!r}) * "
                 f"T.Cast('float32', T.Cast('int32', R[{idx}]) - T.int32({zr}))")
        clamped = f"T.max(T.min(T.round({total}), T.float32({hi - zz})), T.float32({lo - zz}))"
        zp = zz
    return f"T.Cast('{out}', T.Cast('int32', {clamped}) + T.int32({zp}))"

