"""TVM tensor intrinsics over the micro-kernels: each a TIR description plus an
implementation that calls the kernel. Import from `microkernels` only."""

from .f32_gemm import avx2_fma_gemm, avx512_fma_gemm, intrin_name, names, register

__all__ = ["avx2_fma_gemm", "avx512_fma_gemm", "intrin_name", "names", "register"]
