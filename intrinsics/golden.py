"""Golden assembly per kernel variant: what `asm_dumps/` holds and how it is regenerated.

Each dump is the normalized assembly of one tile (K = GOLDEN_K) run through its intrinsic,
compiled for the kernel's ISA: the FP32 GEMM tiles, and the integer tiles (NEON and x86, default
shapes; the AMX 32 x 32 tile as one call between its configuration and release);
of one Winograd transform (every kind, tile and x86 ISA) placed inside larger buffers; and of
one depthwise row (dw_cases) placed inside larger buffers.
Regenerate with `python -m microkernels regen-asm`; never edit.
"""

from __future__ import annotations

import functools
from pathlib import Path

import tvm

from microkernels import (
    ARM_ISAS,
    DEFAULT_TILES,
    ISAS,
    NO_EPILOGUE,
    Epilogue,
    GemmKernel,
    asm,
    default_kernel,
    matmul_kernels,
    max_tiles,
)
from microkernels import f32_wino as wino
from microkernels.f32_dwconv import DwKernel, default_mr
from microkernels.f32_layernorm import LayerNormKernel
from microkernels.f32_vmap import VmapKernel
from microkernels.f32_wino import WinoKernel
from microkernels.int_amx import AmxGemmKernel
from microkernels.int_gemm import PAIR_OPS, IntGemmKernel, default_int_kernel
from microkernels.int_mac import MacKernel, default_mac_kernel
from microkernels.isa import X86_INT_ISAS

from . import f32_vmath as ivmath
from . import f32_wino as iwino
from .f32_dwconv import DwRow, compile_row
from .tile_module import int_kernel_function, mac_tile_module, tile_asm

GOLDEN_K = 64
VMAP_N = 1000  # not a multiple of either width: the masked tail is in the dump
LAYER_NORM_C, LAYER_NORM_ROWS = 100, 9  # C: a tail on either width; the rows in one call
AMX_GOLDEN_K = 192  # three 64-deep steps: a K loop (one step would leave none)
DUMP_DIR = Path(__file__).resolve().parent.parent / "asm_dumps"


def cases() -> list:
    """Per ISA: every register-budget tile (MR >= 2), the default tile, the matmul tiles, and the
    default's beta=0 variant, plain and prefetching; the integer tiles (NEON and x86, default
    shapes; the AMX 32x32 tile accumulating and beta=0, as the conv tiles take it); every
    Winograd transform."""
    out = []
    for isa in ISAS.values():
        tiles = {GemmKernel(isa, mr, nr) for mr, nr in max_tiles(isa) if mr >= 2}
        tiles.add(default_kernel(isa.name))
        tiles.update(matmul_kernels(isa.name))
        out += sorted(tiles, key=lambda k: (k.nr, -k.mr))
        out.append(default_kernel(isa.name, accumulate=False))
        # Winograd's first GEMM segment: beta=0, prefetching the next U panel.
        out.append(GemmKernel(isa, *DEFAULT_TILES[isa.name], accumulate=False, prefetch=True))
    return (out + [default_mac_kernel(name) for name in ARM_ISAS] + [default_int_kernel(name) for name in X86_INT_ISAS]
            + [default_int_kernel(name, pairs=True) for name in PAIR_OPS]
            + [AmxGemmKernel(16, 2, 2), AmxGemmKernel(16, 2, 2, accumulate=False)] + wino_cases() + dw_cases() + vmap_cases() + layer_norm_cases())


def layer_norm_cases() -> list[LayerNormKernel]:
    """The LayerNorm row kernel per x86 ISA, on rows of LAYER_NORM_C values (a masked tail on both)."""
    return [LayerNormKernel(isa, LAYER_NORM_C, 1e-6) for isa in ISAS.values()]


def vmap_cases() -> list[VmapKernel]:
    """The vector math row kernels the Relax pass calls (rest.VECTOR_MATH's functions), per x86 ISA."""
    fns = ("exp", "sigmoid", "silu", "gelu", "tanh", "gelu_tanh")
    return [VmapKernel(fn, isa) for isa in ISAS.values() for fn in fns]


def dw_cases() -> list[DwRow]:
    """Per x86 ISA: the 3x3 and 5x5 depthwise rows at their default steps (19 pixels, stride 1),
    a 3x3 stride-2 row with bias and ReLU6 (MobileNet's); ResNeXt's grouped rows, 4 channels
    per group at stride 1 and 8 at stride 2 with bias and ReLU."""
    relu6, relu = Epilogue(True, False, "clip"), Epilogue(True, False, "relu")
    return [DwRow(DwKernel(isa, k, k, default_mr(isa, k, k, ep, g), ep, g), 19, sw)
            for isa in ISAS.values() for k, sw, ep, g in ((3, 1, NO_EPILOGUE, 1), (5, 1, NO_EPILOGUE, 1),
                                                           (3, 2, relu6, 1), (3, 1, NO_EPILOGUE, 4), (3, 2, relu, 8))]


def wino_cases() -> list[WinoKernel]:
    return [wino.kernel(isa, kind, m) for isa in ISAS for kind in wino.KINDS for m in sorted(wino.POINTS)]


def wino_placement(kern: WinoKernel) -> tuple:
    """(src_shape, src_at, dst_shape, dst_at) for iwino.compile_tile: the tile at a row and
    column offset inside larger buffers, and not at index 0 of a unit axis, so the kernel's
    strides and offsets are not all trivial."""
    return iwino.placement(kern, (1, 2, 1), (1, 1, 1), (1, 1, 1), (0, 1, 0))


def dump_path(kern) -> Path:
    return DUMP_DIR / f"{kern.name}.s"


@functools.lru_cache(maxsize=None)  # compiling is the slow part, and two test modules ask
def compiled_function(kern) -> str:
    """Assembly of the function that runs the golden tile."""
    if isinstance(kern, WinoKernel):
        lib = iwino.compile_tile(kern, *wino_placement(kern))
        return asm.compute_function(lib.mod.inspect_source("asm"))
    if isinstance(kern, DwRow):
        return asm.compute_function(compile_row(kern).mod.inspect_source("asm"))
    if isinstance(kern, (VmapKernel, LayerNormKernel)):  # the whole-tensor function, one call
        func = (ivmath.map_func(kern.fn, (VMAP_N,), kern.isa, 1, kern.alpha) if isinstance(kern, VmapKernel)
                else ivmath.layer_norm_func((LAYER_NORM_ROWS, kern.c), kern.isa, 1, kern.eps))
        lib = tvm.compile(tvm.IRModule({"main": func}), target=kern.isa.target)
        return asm.compute_function(lib.mod.inspect_source("asm"))
    if isinstance(kern, AmxGemmKernel):  # one call between its tile configuration and release, dense operands
        k = AMX_GOLDEN_K
        lda, ldb, ldc = k, kern.group * kern.nr, kern.nr
        mod = int_kernel_function(kern, (kern.mr * lda, k * kern.nr, kern.mr * ldc), (0, 0, 0), (lda, ldb, ldc), k,
                                  (1, 0, 1, 0, 1, 0))
        # A direct call has no separate compute function: the dump is the entry function.
        return asm.compute_function(tvm.compile(mod, target=kern.isa.target).mod.inspect_source("asm"), "_ffi_main")
    if isinstance(kern, (MacKernel, IntGemmKernel)):
        lib = tvm.compile(mac_tile_module(kern, GOLDEN_K), target=kern.isa.target)
        return asm.compute_function(lib.mod.inspect_source("asm"))
    return asm.compute_function(tile_asm(kern, GOLDEN_K))


_WINO_KIND = {"in": "input", "out": "output"}


def render(kern, fn_asm: str) -> str:
    """The dump text for `fn_asm`, the output of compiled_function(kern)."""
    if isinstance(kern, DwRow):
        what = f"a row of {kern.ow} pixels, stride {kern.sw}, inside larger buffers"
        return (f"# {kern.name}: {what}, target {kern.kern.isa.target}. Generated by `python -m microkernels regen-asm`.\n"
                + asm.normalize(fn_asm, kern.kern.isa.arch))
    if isinstance(kern, VmapKernel):
        what = f"{VMAP_N} values in one call"
    elif isinstance(kern, LayerNormKernel):
        what = f"{LAYER_NORM_ROWS} rows in one call"
    elif isinstance(kern, WinoKernel):
        src_shape, src_at, dst_shape, dst_at = wino_placement(kern)
        what = (f"{_WINO_KIND[kern.kind]} transform of F({kern.m}x{kern.m}, 3x3), src {src_shape} at {src_at},"
                f" dst {dst_shape} at {dst_at}")
    else:
        what = f"K={AMX_GOLDEN_K if isinstance(kern, AmxGemmKernel) else GOLDEN_K}"
    header = f"# {kern.name}: {what}, target {kern.isa.target}. Generated by `python -m microkernels regen-asm`.\n"
    return header + asm.normalize(fn_asm, kern.isa.arch)


def regenerate() -> list[Path]:
    DUMP_DIR.mkdir(exist_ok=True)
    written = []
    for kern in cases():
        path = dump_path(kern)
        path.write_text(render(kern, compiled_function(kern)))
        written.append(path)
    return written
