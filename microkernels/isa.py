"""Instruction-set descriptions: the only place that knows vector widths and register files.

Everything above this module reads lanes, register counts and LLVM target settings from an
``Isa`` instead of spelling them again.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import platform
from dataclasses import dataclass


@dataclass(frozen=True)
class Isa:
    name: str  # the suffix in kernel names, e.g. "avx512"
    lanes: int  # float32 lanes per vector register
    vector_registers: int
    vector_bits: int
    llvm_target: tuple  # (key, value) pairs of the TVM target dict; a tuple keeps Isa hashable
    host_flags: tuple  # /proc/cpuinfo flags a host needs to run this code
    # An FMA can take its broadcast operand straight from memory ({1to16}), so a broadcast
    # used once costs no register.
    embedded_broadcast: bool
    # "x86", "armv7" or "aarch64": which emulator and toolchain run this code on another host.
    arch: str = "x86"
    # Registers a by-lane (indexed) multiply can take its scalar from: d0-d7 on ARMv7 for
    # 16-bit lanes (counted here in q registers), v0-v15 on AArch64. 0: no by-lane form.
    lane_registers: int = 0

    @property
    def target(self) -> dict:
        # Tuples keep the Isa hashable; TVM wants lists for multi-valued options such as mattr.
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.llvm_target}

    @property
    def vector_type(self) -> str:
        return f"<{self.lanes} x float>"

    def host_missing(self) -> list[str]:
        """Flags this host lacks to run the ISA (empty when it can run it)."""
        flags = host_cpu_flags()
        if flags is None:  # unknown host: let the CPU speak for itself
            return []
        missing = [f for f in self.host_flags if f not in flags]
        if not missing and "amx_tile" in self.host_flags and not request_amx():
            missing.append("AMX tile data permission (arch_prctl ARCH_REQ_XCOMP_PERM refused)")
        return missing

    def host_supports(self) -> bool:
        return not self.host_missing()


AVX512 = Isa(
    name="avx512",
    lanes=16,
    vector_registers=32,
    vector_bits=512,
    llvm_target=(("kind", "llvm"), ("mcpu", "skylake-avx512")),
    host_flags=("avx512f", "fma"),
    embedded_broadcast=True,
)

AVX2 = Isa(
    name="avx2",
    lanes=8,
    vector_registers=16,
    vector_bits=256,
    llvm_target=(("kind", "llvm"), ("mcpu", "haswell")),
    host_flags=("avx2", "fma"),
    embedded_broadcast=False,
)

# The x86 integer kernels' dot-product ISAs. skylake-avx512 plus the one feature, rather than an
# Ice Lake mcpu, so the compiler uses nothing else a Tiger Lake model (Bochs) or a Zen 4 lacks.
AVX512_VNNI = dataclasses.replace(
    AVX512, name="avx512vnni", host_flags=("avx512f", "avx512bw", "avx512_vnni"),
    llvm_target=(("kind", "llvm"), ("mcpu", "skylake-avx512"), ("mattr", ("+avx512vnni",))))

# AVX-VNNI: the same vpdpbusd, VEX-encoded on ymm, for hosts with it but no AVX-512 (Alder Lake
# and later client cores; Zen 5 has both).
AVX_VNNI = dataclasses.replace(
    AVX2, name="avxvnni", host_flags=("avx2", "avx_vnni"),
    llvm_target=(("kind", "llvm"), ("mcpu", "haswell"), ("mattr", ("+avxvnni",))))

# AMX-INT8 (Sapphire Rapids and later Xeons): tdpbusd multiplies a 16 x 64 tile of uint8 by a
# 16 x 16 x 4 tile of int8 into 16 x 16 int32 in one instruction (16384 MACs; vpdpbusd does 64).
# The tiles' code (microkernels.int_amx) runs beside AVX-512 VNNI code for packing and stores, so
# the target is the VNNI one plus the two AMX features. Linux lends a process the tile state only
# when it asks (arch_prctl), which host_missing does.
AMX_INT8 = dataclasses.replace(
    AVX512_VNNI, name="amxint8", host_flags=("avx512f", "avx512bw", "avx512_vnni", "amx_tile", "amx_int8"),
    llvm_target=(("kind", "llvm"), ("mcpu", "skylake-avx512"), ("mattr", ("+avx512vnni", "+amx-tile", "+amx-int8"))))

# ARM NEON, for the integer kernels. These never run natively here: an x86 host has no "neon"
# flag, so require_host refuses them and the schedules run them under qemu-user instead.
# cortex-a53 is the Raspberry Pi 3 class core; without the hard-float ABI a 32-bit object does
# not link with a gnueabihf toolchain.
NEON = Isa(
    name="neon",
    lanes=4,
    vector_registers=16,
    vector_bits=128,
    llvm_target=(("kind", "llvm"), ("mtriple", "armv7l-linux-gnueabihf"), ("mcpu", "cortex-a53"),
                 ("mattr", ("+neon",)), ("mfloat-abi", "hard")),
    host_flags=("neon",),
    embedded_broadcast=False,
    arch="armv7",
    lane_registers=4,
)

AARCH64 = Isa(
    name="aarch64",
    lanes=4,
    vector_registers=32,
    vector_bits=128,
    llvm_target=(("kind", "llvm"), ("mtriple", "aarch64-linux-gnu"), ("mcpu", "cortex-a53"),
                 ("mattr", ("+neon",))),
    host_flags=("asimd",),
    embedded_broadcast=False,
    arch="aarch64",
    lane_registers=16,
)

# ARMv8.2 dot product (sdot): cortex-a55 is the in-order core that has it.
AARCH64_DOT = Isa(
    name="aarch64dot",
    lanes=4,
    vector_registers=32,
    vector_bits=128,
    llvm_target=(("kind", "llvm"), ("mtriple", "aarch64-linux-gnu"), ("mcpu", "cortex-a55"),
                 ("mattr", ("+neon", "+dotprod"))),
    host_flags=("asimddp",),
    embedded_broadcast=False,
    arch="aarch64",
    lane_registers=32,
)

# The FP32 kernels' ISAs, and the integer kernels' ones: each family iterates its own.
ISAS = {isa.name: isa for isa in (AVX512, AVX2)}
ARM_ISAS = {isa.name: isa for isa in (NEON, AARCH64, AARCH64_DOT)}
# The x86 integer GEMM's ISAs (microkernels.int_gemm): vpdpbusd where there is VNNI, vpmaddwd on
# int16 where there is not (AVX-512 here means AVX-512BW, which every AVX-512 core since
# Skylake-SP has).
X86_INT_ISAS = {isa.name: isa for isa in (AVX512_VNNI, AVX_VNNI, AVX512, AVX2)}


@functools.lru_cache(maxsize=1)
def host_cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ("flags", "model name", ...); {} where it
    cannot be read (non-Linux)."""
    fields = {}
    if platform.system() != "Linux":
        return fields
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return {}
    return fields


@functools.lru_cache(maxsize=1)
def host_cpu_flags() -> frozenset | None:
    """CPU feature flags of this host, or None where they cannot be read (non-Linux)."""
    flags = host_cpuinfo().get("flags")
    return None if flags is None else frozenset(flags.split())


@functools.lru_cache(maxsize=1)
def request_amx() -> bool:
    """Ask Linux for this process's AMX tile state (ARCH_REQ_XCOMP_PERM for XTILEDATA); without
    it the first tile instruction raises SIGILL. Process-wide and idempotent; False where refused
    or not Linux."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    import ctypes

    sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0
    except (OSError, AttributeError):
        return False


def best_host_isa() -> Isa:
    """The widest x86 ISA this host runs."""
    for isa in (AVX512, AVX2):
        if isa.host_supports():
            return isa
    raise RuntimeError(
        "this host has neither AVX-512F nor AVX2+FMA; tvm-microkernels' x86 kernels need one of them"
    )


# TVM indexes buffers with int32 arithmetic: a buffer of more elements than this fails deep in
# the compiler ("Literal value ... exceeds range of int32"); every layer refuses it first.
MAX_ELEMENTS = 2**31 - 1


def positive_int(label: str, value, error: type[Exception] = ValueError, minimum: int = 1) -> int:
    """`value` as an int if it is an integer (Python or numpy, not bool) of at least `minimum`;
    otherwise `error` naming `label`."""
    what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    try:
        if isinstance(value, bool) or type(value).__name__ == "bool_":
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise error(f"{label} must be {what}, got {value!r}") from None
    if v < minimum:
        raise error(f"{label} must be {what}, got {value!r}")
    return v


def normalize_ints(obj, fields, error: type[Exception]) -> None:
    """Check a frozen dataclass's integer fields and store them as plain ints (numpy integers
    would otherwise leak into kernel names and TIR). `fields`: names, or {name: label}."""
    labels = fields if isinstance(fields, dict) else {f: f for f in fields}
    for field, label in labels.items():
        object.__setattr__(obj, field, positive_int(label, getattr(obj, field), error))
