"""TVM tensor intrinsics over the micro-kernels: each a TIR description plus an
implementation that calls the kernel. Import from `microkernels` only."""

from .f32_conv import ConvTile, register_conv
from . import f32_conv, f32_gemm
from .f32_gemm import avx2_fma_gemm, avx512_fma_gemm, intrin_name, register


def names() -> list[str]:
    """Names of the intrinsics this library has registered so far."""
    return f32_gemm.names() + f32_conv.names()


__all__ = ["ConvTile", "register_conv", "avx2_fma_gemm", "avx512_fma_gemm", "intrin_name", "names", "register"]
