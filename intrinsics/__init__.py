"""TVM tensor intrinsics over the micro-kernels: each a TIR description plus an
implementation that calls the kernel. Import from `microkernels` only."""

from .f32_conv import ConvTile, register_conv
from .f32_gemm import avx2_fma_gemm, avx512_fma_gemm, check_kernel, intrin_name, register
from .int_gemm import register_int_gemm
from .int_mac import aarch64_int8_dot, aarch64_int16_mac, neon_int16_mac, register_mac
from .registry import names


__all__ = ["ConvTile", "register_conv", "avx2_fma_gemm", "avx512_fma_gemm", "check_kernel", "intrin_name", "names",
           "register", "register_int_gemm", "aarch64_int8_dot", "aarch64_int16_mac", "neon_int16_mac", "register_mac"]
