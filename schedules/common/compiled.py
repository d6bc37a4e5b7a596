"""What every compiled operator shares: its module's assembly, running it, timing it."""

from __future__ import annotations

import threading

import numpy as np
import tvm
import tvm_ffi

from microkernels import Isa

from ..emulation import bochs
from .layouts import aligned_empty, is_aligned
from .targets import check_array, require_host, set_threads


def _dlpack(arr: np.ndarray, alignment: int):
    """A TVM tensor over a numpy array's memory. Through DLPack 1.0, which can say read-only:
    the older protocol refuses to export a read-only array (an np.load(mmap_mode="r") input,
    say), and the modules never write their inputs."""
    return tvm_ffi.from_dlpack(arr.__dlpack__(max_version=(1, 0)), require_alignment=alignment)


def operand(arr):
    """A TVM tensor over `arr`'s memory (no copy) if it is 64-byte aligned, else an aligned
    copy; a TVM tensor as it is."""
    if isinstance(arr, tvm.runtime.Tensor):
        return arr
    try:
        return _dlpack(arr, 64)  # what TVM's code assumes of a buffer it did not declare otherwise
    except RuntimeError:
        return tvm.runtime.tensor(arr)


def user_operand(arr):
    """A TVM tensor over a C-contiguous numpy array's memory whatever its alignment, for the
    compiled layout transforms, which declare their NCHW side 4-byte aligned; a TVM tensor as
    it is."""
    if isinstance(arr, tvm.runtime.Tensor):
        return arr
    return _dlpack(arr, 0)


def _byte_range(arr) -> tuple[int, int]:
    """[first byte, one past the last) of an operand's memory (numpy array or TVM tensor)."""
    if isinstance(arr, tvm.runtime.Tensor):
        start = arr.data_ptr()
        return start, start + arr.numel() * np.dtype(str(arr.dtype)).itemsize
    return np.lib.array_utils.byte_bounds(arr)


def check_out(out, **inputs) -> None:
    """Refuse an `out` that cannot be written (read-only) or that overlaps one of the call's
    inputs: the modules read their inputs tile by tile while writing the output, so an
    overlapping output corrupts what is still to be read."""
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ValueError("out is read-only; pass a writable array (or none, to get a new one)")
    lo, hi = _byte_range(out)
    for name, arr in inputs.items():
        if arr is not None:
            a_lo, a_hi = _byte_range(arr)
            if lo < a_hi and a_lo < hi:
                raise ValueError(f"out overlaps {name}: this op cannot write its result over an input it is "
                                 "reading; pass a separate array as out")


def declare_user_aligned(func, names):
    """`func` (a PrimFunc) with the named parameters declared 4-byte aligned instead of TVM's
    default 64, so its code assumes no more and any C-contiguous float32 numpy array goes in
    without a copy (user_operand). TE has no alignment argument, so the parameters are
    re-declared in the function's TVMScript signature and the script parsed back."""
    import re

    from intrinsics.script import parse

    text = func.script()
    sig = next(line for line in text.splitlines() if line.startswith("def main("))
    new = sig
    for name in names:
        new, hits = re.subn(rf'\b{name}: T\.Buffer\((\([^)]*\)), "float32"\)',
                            rf'{name}: T.Buffer(\1, "float32", align=4)', new)
        if hits != 1:
            raise RuntimeError(f"parameter {name} not found in the signature {sig!r}")
    return parse(text.replace(sig, new))


def check_operand(name: str, arr, shape: tuple, dtype: str):
    """check_array for a call's operands, which may also be TVM tensors (kept on TVM's side)."""
    if isinstance(arr, tvm.runtime.Tensor):
        if tuple(arr.shape) != tuple(shape) or str(arr.dtype) != dtype:
            raise ValueError(f"{name} must have shape {tuple(shape)} and dtype {dtype}, "
                             f"got a TVM tensor of {tuple(arr.shape)} {arr.dtype}")
        return arr
    return check_array(name, arr, shape, dtype)


def store(out, y: np.ndarray):
    """Write an emulated op's result `y` into the caller's `out` (checked) and return it."""
    check_operand("out", out, y.shape, "float32")
    check_out(out)
    if isinstance(out, tvm.runtime.Tensor):
        out.copyfrom(y)
    else:
        out[...] = y
    return out

class CompiledOp:
    """emulate=True: calls run on the Bochs CPU (schedules.bochs), single-threaded, whatever
    the host; for AVX-512 numerics on hosts without it. Such an op cannot be timed."""

    user_aligned = False  # True: the module declares its inputs and output 4-byte aligned

    def __init__(self, isa: Isa, lib, threads: int | None, emulate: bool = False):
        self.isa, self.lib, self.threads, self.emulate = isa, lib, threads, emulate
        self._host_checked = False
        self._entry = self._entry_of = None

    def entry(self):
        """The module's entry function, looked up once (calling the module looks it up on every
        call, a few microseconds)."""
        if self._entry_of is not self.lib:
            self._entry, self._entry_of = self.lib["main"], self.lib
        return self._entry

    def prepare(self) -> None:
        """Once per op: the host runs its ISA. Every call: the pool size (set_threads skips an
        unchanged one)."""
        if not self._host_checked:
            require_host(self.isa)
            self._host_checked = True
        set_threads(self.threads)

    def per_thread_buffer(self, name: str, shape: tuple):
        """A float32 TVM tensor of `shape` for the NCHW paths' blocked data, one per name and
        Python thread (ops may be called from several at once), made on first use."""
        local = self.__dict__.setdefault("_local", threading.local())
        buffers = local.__dict__.setdefault("buffers", {})
        if name not in buffers:
            buffers[name] = tvm.runtime.empty(shape, "float32")
        return buffers[name]

    @property
    def asm(self) -> str:
        """Assembly of the compiled module (inspect_source("asm"))."""
        return self.lib.mod.inspect_source("asm")

    def _tensors(self, inputs, out_shape, out=None) -> list:
        """TVM tensors for checked inputs (numpy arrays or TVM tensors) plus the output (`out`,
        or a new aligned array); sizes the thread pool. Numpy memory is handed over without a
        copy where it is 64-byte aligned (operand), or always when the module declares its
        operands 4-byte aligned (declare_user_aligned). (Emulated: numpy arrays, NaN-filled output.)"""
        if self.emulate:
            host = [a.numpy() if isinstance(a, tvm.runtime.Tensor) else np.ascontiguousarray(a) for a in inputs]
            if out is not None:
                raise ValueError("an emulated op returns its output; out= is for native calls")
            return host + [np.full(out_shape, np.nan, np.float32)]
        self.prepare()
        if out is None:
            out = aligned_empty(out_shape)
        elif not (self.user_aligned or isinstance(out, tvm.runtime.Tensor) or is_aligned(out)):
            raise ValueError("out must be 64-byte aligned to be written in place (TVM's code assumes it); "
                             "allocate it with schedules.aligned_empty(shape)")
        wrap = user_operand if self.user_aligned else operand
        return [wrap(a) for a in inputs] + [wrap(out), out]

    def _run(self, args):
        """The output: a numpy array (a TVM tensor if one was passed as out=)."""
        if self.emulate:
            return bochs.run(self.lib, args, [len(args) - 1])[0]
        self.entry()(*args[:-1])
        return args[-1]

    def _time(self, args, number: int, repeat: int, cold: bool) -> list[float]:
        if self.emulate:
            raise ValueError("an emulated op cannot be timed: its speed is the emulator's")
        # TVM flushes before each repeat, not each call: a cold figure wants number=1.
        kw = {"f_preproc": "cache_flush_cpu_non_first_arg"} if cold else {}
        ev = self.lib.mod.time_evaluator("main", tvm.cpu(), number=number, repeat=repeat, **kw)
        return list(ev(*args[:-1]).results)
