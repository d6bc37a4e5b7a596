"""Instruction-set descriptions: the only place that knows vector widths and register files.

Everything above this module reads lanes, register counts and LLVM target settings from an
``Isa`` instead of spelling them again.
"""

from __future__ import annotations

import functools
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

    @property
    def target(self) -> dict:
        return dict(self.llvm_target)

    @property
    def vector_type(self) -> str:
        return f"<{self.lanes} x float>"

    def host_missing(self) -> list[str]:
        """Flags this host lacks to run the ISA (empty when it can run it)."""
        flags = host_cpu_flags()
        if flags is None:  # unknown host: let the CPU speak for itself
            return []
        return [f for f in self.host_flags if f not in flags]

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

ISAS = {isa.name: isa for isa in (AVX512, AVX2)}


@functools.lru_cache(maxsize=1)
def host_cpu_flags() -> frozenset | None:
    """CPU feature flags of this host, or None where they cannot be read (non-Linux)."""
    if platform.system() != "Linux":
        return None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def best_host_isa() -> Isa:
    """The widest x86 ISA this host runs."""
    for isa in (AVX512, AVX2):
        if isa.host_supports():
            return isa
    raise RuntimeError(
        "this host has neither AVX-512F nor AVX2+FMA; tvm-microkernels' x86 kernels need one of them"
    )
