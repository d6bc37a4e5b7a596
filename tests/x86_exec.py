"""Run a compiled x86 module natively where the host executes its ISA, on the Bochs CPU where
it does not: the same test code covers AVX-512 on every x86 host.

MK_EMULATE_AVX512=1 forces AVX-512 (and AVX-VNNI, compiled as its AVX-512 stand-in) through the
emulator even on a host that has it, which is how
an AVX-512 machine checks what an AVX2-only one will run.
"""

import os

import numpy as np
import tvm

from microkernels import ISAS, Isa, best_host_isa
from microkernels.isa import AVX512_VNNI, AVX_VNNI
from schedules.emulation import bochs

FORCE = os.environ.get("MK_EMULATE_AVX512") == "1"


def emulated(isa: Isa) -> bool:
    return isa.arch == "x86" and (not isa.host_supports() or (FORCE and isa.vector_bits == 512)
                                  or (FORCE and isa.name == AVX_VNNI.name))


def compile_target(isa: Isa) -> dict:
    """The target to compile `isa`'s code for so that it runs here. Bochs models Tiger Lake, which
    has AVX-512 VNNI but not AVX-VNNI: where the host lacks avx_vnni, AVX-VNNI code is compiled
    for AVX-512 VNNI instead, and LLVM encodes the same ymm vpdpbusd with EVEX. That checks the
    kernel's numerics on every host; the VEX encoding itself is checked by the assembly tests."""
    if isa.name == AVX_VNNI.name and emulated(isa):
        return AVX512_VNNI.target
    return isa.target


def on(isa: Isa) -> dict:
    """An operator's target and emulate= arguments that run `isa` here."""
    return {"target": f"x86-{isa.name}", "emulate": emulated(isa)}


def how(isa: Isa) -> str:
    return f"{isa.name}-{'emulated' if emulated(isa) else 'native'}"


HOST = f"x86-{best_host_isa().name}"  # the suite's native target: the widest ISA this host runs
X86 = list(ISAS.values())  # every x86 ISA runs here, one way or the other
X86_IDS = [how(isa) for isa in X86]


def execute(lib, isa: Isa, args: list[np.ndarray], outputs: list[int]) -> list[np.ndarray]:
    """Call `lib`'s main on numpy `args`; copies of args[k] for k in outputs afterwards."""
    if emulated(isa):
        return bochs.run(lib, [np.ascontiguousarray(a) for a in args], outputs)
    tensors = [tvm.runtime.tensor(a) for a in args]
    lib(*tensors)
    return [tensors[k].numpy() for k in outputs]
