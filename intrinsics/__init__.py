"""TVM tensor intrinsics over the micro-kernels: each a TIR description plus an
implementation that calls the kernel. Import from `microkernels` only."""

from . import f32_conv, f32_gemm, int_conv, int_mac
from .f32_conv import ConvTile, register_conv
from .f32_gemm import avx2_fma_gemm, avx512_fma_gemm, intrin_name, register
from .int_mac import aarch64_int8_dot, aarch64_int16_mac, neon_int16_mac, register_mac


def names() -> list[str]:
    """Names of the intrinsics this library has registered so far."""
    return f32_gemm.names() + f32_conv.names() + int_mac.names() + int_conv.names()


__all__ = ["ConvTile", "register_conv", "avx2_fma_gemm", "avx512_fma_gemm", "intrin_name", "names", "register",
           "aarch64_int8_dot", "aarch64_int16_mac", "neon_int16_mac", "register_mac"]
