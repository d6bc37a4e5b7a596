"""Named target presets, and the checks every public entry point runs on its inputs."""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path

import numpy as np
import tvm_ffi

from microkernels import AMX_INT8, ARM_ISAS, ISAS, X86_INT_ISAS, Isa, best_host_isa
from microkernels.isa import MAX_ELEMENTS, request_amx

PRESETS = {"x86-avx512": "avx512", "x86-avx2": "avx2", "x86-avx512vnni": "avx512vnni", "x86-avxvnni": "avxvnni",
           "x86-amx": "amxint8",
           "armv7-neon": "neon", "aarch64-neon": "aarch64", "aarch64-dotprod": "aarch64dot"}

# TVM sizes its worker pool once, from this variable, when it first runs parallel code, and
# config_threadpool can only shrink it later; without it the pool may start with one thread.
os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))


class UnsupportedHostError(RuntimeError):
    """Code for an ISA this host cannot execute was asked to run here."""


def resolve(target) -> Isa:
    """Map a preset name ("x86-avx512", "x86-avx2", or "native" for the best this host runs), or
    a tvm.target.Target (isa_of_target), to its ISA."""
    import tvm

    if isinstance(target, tvm.target.Target):
        return isa_of_target(target)
    if target == "native":
        return best_host_isa()
    if isinstance(target, str) and target in PRESETS:
        name = PRESETS[target]
        return ISAS.get(name) or X86_INT_ISAS.get(name) or {AMX_INT8.name: AMX_INT8}.get(name) or ARM_ISAS[name]
    hint = ""
    if isinstance(target, str) and target.startswith("llvm"):
        hint = " (TVM 0.27 no longer parses target strings such as 'llvm -mcpu=...'; pick a preset)"
    elif isinstance(target, dict):
        hint = " (target dicts are chosen for you by the preset)"
    raise ValueError(f"unknown target {target!r}{hint}; expected one of {sorted(PRESETS)}, 'native' or a "
                     "tvm.target.Target")


def float_isa(isa: Isa) -> Isa:
    """The FP32 kernels' ISA for a target: the VNNI presets name integer ISAs, whose vector
    width the FP32 code then uses (AVX-512 VNNI -> AVX-512, AVX-VNNI -> AVX2)."""
    if isa.arch != "x86" or isa.name in ISAS:
        return isa
    return ISAS["avx512"] if isa.vector_bits == 512 else ISAS["avx2"]


def int_isa(target, isa: Isa) -> Isa:
    """The x86 integer tiles' ISA for a target (`isa`: what resolve() made of it). A VNNI preset,
    "x86-amx", or "x86-avx512" / "x86-avx2" (the int16 upcast, VNNI or not), names its ISA; "native"
    and a Target without CPU are this host's best (AMX where it has it and the OS lends the tile
    state, else VNNI where it has it); a tvm.target.Target gets what its features allow."""
    import tvm

    if isinstance(target, tvm.target.Target) and (target.attrs.get("mcpu") or target.attrs.get("mattr")):
        from tvm.target import codegen

        if codegen.target_has_features(["amx-int8", "amx-tile", "avx512vnni"], target):
            return AMX_INT8
        for name, features in (("avx512vnni", ["avx512vnni", "avx512bw"]), ("avxvnni", ["avxvnni", "avx2"]),
                               ("avx512", ["avx512bw"]), ("avx2", ["avx2"])):
            if codegen.target_has_features(features, target):
                return X86_INT_ISAS[name]
    elif target == "native" or isinstance(target, tvm.target.Target):
        for cand in (AMX_INT8, *X86_INT_ISAS.values()):
            if cand.host_supports():
                return cand
        raise UnsupportedHostError("this host has none of AVX-512 VNNI, AVX-VNNI, AVX-512BW, AVX2")
    return AMX_INT8 if isa.name == AMX_INT8.name else X86_INT_ISAS[isa.name]


def int_target(isa: Isa) -> dict:
    """The target quantized operators compile for: the integer tile's ISA, told not to vectorize
    their pack and unpack transposes with gathers and scatters. LLVM picks them there (17 and 15
    in one small conv layer), they are slow on the cores we know, and the Bochs CPU cannot run them."""
    if isa.name == AMX_INT8.name:
        # The process that compiles AMX code usually runs it: ask for the tile state now (a
        # process that only loads the library must call microkernels.isa.request_amx itself).
        request_amx()
    target = isa.target
    return {**target, "mattr": [*target.get("mattr", []), "+prefer-no-gather", "+prefer-no-scatter"]}


def isa_of_target(target) -> Isa:
    """The ISA a TVM CPU target allows, by what LLVM says its mcpu and mattr enable: AVX-512
    (avx512f + fma), else AVX2 (avx2 + fma) on x86; armv7 NEON; AArch64, with dotprod where the
    CPU has it. An x86 target that names no CPU and no features (Target({"kind": "llvm"})) means
    this host, as "native" does."""
    from tvm.target import codegen

    if target.kind.name != "llvm":
        raise ValueError(f"target {target} is not a CPU target (kind 'llvm'); expected a preset "
                         f"{sorted(PRESETS)}, 'native' or an llvm tvm.target.Target")
    triple = str(target.attrs.get("mtriple", "") or "")
    has = lambda *features: bool(codegen.target_has_features(list(features), target))  # noqa: E731
    if triple.startswith(("armv7", "arm-")):
        if not has("neon"):
            raise ValueError(f"target {target}: the ARMv7 kernels need NEON (mattr '+neon')")
        return ARM_ISAS["neon"]
    if triple.startswith(("aarch64", "arm64")):
        return ARM_ISAS["aarch64dot" if has("dotprod") else "aarch64"]
    if triple and not triple.startswith(("x86_64", "i686", "i386")):
        raise ValueError(f"target {target}: no kernels for triple {triple!r}; x86, armv7 and aarch64 have them")
    if not target.attrs.get("mcpu") and not target.attrs.get("mattr"):
        return best_host_isa()
    if has("avx512f", "fma"):
        return ISAS["avx512"]
    if has("avx2", "fma"):
        return ISAS["avx2"]
    raise ValueError(f"target {target}: its CPU has neither AVX-512 nor AVX2 with FMA, which the x86 kernels need")


def require_host(isa: Isa) -> None:
    missing = isa.host_missing()
    if missing:
        emulate = (" or pass emulate=True to run it on the Bochs CPU emulator (single-threaded, slow; "
                   "needs bochscpu-python==0.3.1)") if isa.arch == "x86" else ""
        raise UnsupportedHostError(
            f"this host cannot run {isa.name} code: its CPU lacks {', '.join(missing)}; "
            f"compile for it here (op.asm works) but run it elsewhere, use target='native',{emulate}"
        )


# More pool threads than this is a mistake, not a machine: TVM's pool fails at call time.
MAX_THREADS = 1024


def check_emulate(emulate, isa: Isa) -> bool:
    """emulate=True asks for the Bochs CPU: x86 targets only, and the package must import."""
    if not isinstance(emulate, bool):
        raise TypeError(f"emulate must be True or False, got {emulate!r}")
    if emulate:
        if isa.arch != "x86":
            raise ValueError(f"emulate=True runs x86 code on the Bochs CPU; {isa.name} runs under qemu already")
        from ..emulation import bochs

        why = bochs.available()
        if why:
            raise bochs.EmulatorUnavailable(why)
    return emulate


def positive_int(name: str, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def thread_count(threads) -> int | None:
    """None, or a positive int no larger than MAX_THREADS."""
    if threads is None:
        return None
    threads = positive_int("threads", threads)
    if threads > MAX_THREADS:
        raise ValueError(f"threads={threads} is more than {MAX_THREADS}; this host has {os.cpu_count()} cores")
    return threads


def check_elements(**buffers: tuple) -> None:
    """Refuse any buffer (name=shape) of MAX_ELEMENTS elements or more, naming it."""
    for name, shape in buffers.items():
        count = int(np.prod([int(d) for d in shape], dtype=object))
        if count > MAX_ELEMENTS:
            raise ValueError(f"{name} would hold {count} elements {tuple(shape)}; TVM's int32 index "
                             f"arithmetic allows at most {MAX_ELEMENTS} per buffer")


def dtype_name(name: str, value) -> str | None:
    """A dtype given as a string, a numpy dtype or a numpy scalar type (np.float32), by name."""
    if value is None or isinstance(value, str):
        return value
    try:
        return np.dtype(value).name
    except TypeError:
        raise TypeError(f"{name} must be a dtype name such as 'float32' or a numpy dtype, got {value!r}") from None


def check_array(name: str, arr, shape: tuple, dtype: str) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(arr).__name__}")
    if arr.dtype != np.dtype(dtype):
        raise TypeError(f"{name} must have dtype {dtype}, got {arr.dtype}")
    if arr.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {arr.shape}")
    if not arr.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (row-major); pass np.ascontiguousarray({name})")
    return arr


# What set_threads last configured, per Python thread: TVM keeps one pool per calling thread,
# so a size cached for the process let a call from a new thread run on that thread's default.
_POOL = threading.local()


def set_threads(threads: int | None) -> None:
    """Size the calling thread's TVM CPU thread pool; None means one thread per core. Every op
    call runs this; reconfiguring TVM's pool costs tens of microseconds, so only a change does."""
    n = threads if threads is not None else (os.cpu_count() or 1)
    if getattr(_POOL, "size", None) == n:
        return
    # Mode 1 spreads the pool over the big cores; on a homogeneous CPU that is all of them.
    tvm_ffi.get_global_func("runtime.config_threadpool")(1, n)
    _POOL.size = n


CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")


@functools.lru_cache(maxsize=1)  # read once: every compile consults it
def host_caches() -> tuple[tuple[int, str, str], ...]:
    """(level, type, size) of each cache of cpu0, as sysfs gives them ("48K"); () where unknown."""
    out = []
    for d in sorted(CACHE_DIR.glob("index*")):
        try:
            out.append((int((d / "level").read_text()), (d / "type").read_text().strip(),
                        (d / "size").read_text().strip()))
        except (OSError, ValueError):
            continue
    return tuple(out)


def host_cache_bytes(level: int, default: int) -> int:
    """Size in bytes of cpu0's data (or unified) cache at `level`; `default` where sysfs does not say."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for lvl, kind, size in host_caches():
        if lvl == level and kind != "Instruction":
            try:
                return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
            except ValueError:
                break
    return default
