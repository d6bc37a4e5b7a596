"""Hand-written micro-kernels as LLVM IR text, generated from a few parameters.

This layer knows ISAs, registers and instructions, and nothing of TVM scheduling.
"""

from .f32_fma_peak import FmaPeakKernel
from .f32_gemm import (DEFAULT_TILES, MATMUL_TILES, NARROW_TILES, NO_EPILOGUE, VECTOR_ACTIVATIONS, Epilogue,
                       GemmKernel, PREFETCH_WHOLE_REDUCTIONS, TileError, check_tile, default_kernel, matmul_kernels, max_tiles)
from .int_amx import AmxGemmKernel
from .int_gemm import IntGemmKernel, default_int_kernel
from .isa import (AARCH64, AARCH64_DOT, AMX_INT8, ARM_ISAS, AVX2, AVX512, AVX512_VNNI, AVX_VNNI, ISAS, NEON, X86_INT_ISAS,
                  Isa, best_host_isa, host_cpu_flags)

__all__ = [
    "AARCH64",
    "AARCH64_DOT",
    "AMX_INT8",
    "AmxGemmKernel",
    "ARM_ISAS",
    "NEON",
    "AVX2",
    "AVX512",
    "AVX512_VNNI",
    "AVX_VNNI",
    "X86_INT_ISAS",
    "IntGemmKernel",
    "default_int_kernel",
    "DEFAULT_TILES",
    "MATMUL_TILES",
    "NARROW_TILES",
    "PREFETCH_WHOLE_REDUCTIONS",
    "Epilogue",
    "NO_EPILOGUE",
    "VECTOR_ACTIVATIONS",
    "FmaPeakKernel",
    "GemmKernel",
    "ISAS",
    "Isa",
    "TileError",
    "best_host_isa",
    "check_tile",
    "default_kernel",
    "matmul_kernels",
    "host_cpu_flags",
    "max_tiles",
]
