"""What every compiled operator shares: its module's assembly, running it, timing it."""

from __future__ import annotations

import numpy as np
import tvm

from microkernels import Isa

from . import bochs
from .targets import require_host, set_threads


class CompiledOp:
    """emulate=True: calls run on the Bochs CPU (schedules.bochs), single-threaded, whatever
    the host; for AVX-512 numerics on hosts without it. Such an op cannot be timed."""

    def __init__(self, isa: Isa, lib, threads: int | None, emulate: bool = False):
        self.isa, self.lib, self.threads, self.emulate = isa, lib, threads, emulate

    @property
    def asm(self) -> str:
        """Assembly of the compiled module (inspect_source("asm"))."""
        return self.lib.mod.inspect_source("asm")

    def _tensors(self, inputs, out_shape) -> list:
        """TVM tensors for checked numpy inputs plus an output; sizes the thread pool.
        (Emulated: the numpy arrays themselves, and a NaN-filled output.)"""
        if self.emulate:
            return [np.ascontiguousarray(a) for a in inputs] + [np.full(out_shape, np.nan, np.float32)]
        require_host(self.isa)
        set_threads(self.threads)
        return [tvm.runtime.tensor(a) for a in inputs] + [tvm.runtime.tensor(np.empty(out_shape, np.float32))]

    def _run(self, args) -> np.ndarray:
        if self.emulate:
            return bochs.run(self.lib, args, [len(args) - 1])[0]
        self.lib(*args)
        return args[-1].numpy()

    def _time(self, args, number: int, repeat: int, cold: bool) -> list[float]:
        if self.emulate:
            raise ValueError("an emulated op cannot be timed: its speed is the emulator's")
        # TVM flushes before each repeat, not each call: a cold figure wants number=1.
        kw = {"f_preproc": "cache_flush_cpu_non_first_arg"} if cold else {}
        ev = self.lib.mod.time_evaluator("main", tvm.cpu(), number=number, repeat=repeat, **kw)
        return list(ev(*args).results)
