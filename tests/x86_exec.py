"""Run a compiled x86 module natively where the host executes its ISA, on the Bochs CPU where
it does not: the same test code covers AVX-512 on every x86 host.

MK_EMULATE_AVX512=1 forces AVX-512 through the emulator even on a host that has it, which is how
an AVX-512 machine checks what an AVX2-only one will run.
"""

import os

import numpy as np
import tvm

from microkernels import ISAS, Isa, best_host_isa
from schedules.emulation import bochs

FORCE = os.environ.get("MK_EMULATE_AVX512") == "1"


def emulated(isa: Isa) -> bool:
    return isa.arch == "x86" and (not isa.host_supports() or (FORCE and isa.name == "avx512"))


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
