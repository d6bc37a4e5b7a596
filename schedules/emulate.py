"""Run a TVM-compiled ARM kernel under qemu-user and bring its outputs back as numpy arrays.

Why: ARM schedules must be checked bit for bit on x86 hosts, where the TVM runtime cannot load
ARM code and is not cross-built. A PrimFunc's object file imports only TVM's error hook, so we
link it statically with a tiny C harness (qemu_harness.c) that reads and writes raw buffers
from files, and run that binary under qemu.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import tvm_ffi

# arch -> (cross gcc, qemu-user binary, Debian packages providing them)
ARCHES = {
    "armv7": ("arm-linux-gnueabihf-gcc", "qemu-arm", ("gcc-arm-linux-gnueabihf", "qemu-user")),
    "aarch64": ("aarch64-linux-gnu-gcc", "qemu-aarch64", ("gcc-aarch64-linux-gnu", "qemu-user")),
}
# One command for both arches: whoever needs one usually soon needs the other.
INSTALL_HINT = "apt-get install gcc-arm-linux-gnueabihf gcc-aarch64-linux-gnu qemu-user"
HARNESS = Path(__file__).with_name("qemu_harness.c")
TIMEOUT = 300  # seconds per qemu run; a hung kernel should fail a test, not stall CI
DLPACK_CODE = {"i": 0, "u": 1, "f": 2}  # numpy kind -> DLPack kDLInt / kDLUInt / kDLFloat


class EmulatorMissingError(RuntimeError):
    """The cross compiler or qemu-user binary for an arch is not on PATH."""


def _arch(arch: str):
    if arch not in ARCHES:
        raise ValueError(f"unknown arch {arch!r}; expected one of {sorted(ARCHES)}")
    return ARCHES[arch]


def missing_tools(arch: str) -> list[str]:
    gcc, qemu, _ = _arch(arch)
    return [tool for tool in (gcc, qemu) if shutil.which(tool) is None]


def require_tools(arch: str) -> None:
    missing = missing_tools(arch)
    if missing:
        raise EmulatorMissingError(
            f"cannot emulate {arch}: {', '.join(missing)} not found on PATH; install with: {INSTALL_HINT}"
        )


@functools.lru_cache(maxsize=None)
def _tempdir() -> tempfile.TemporaryDirectory:
    # One per process, kept alive by the cache so harness objects survive between runs;
    # TemporaryDirectory removes it at interpreter exit.
    return tempfile.TemporaryDirectory(prefix="tvm-emulate-")


def _workdir() -> Path:
    return Path(_tempdir().name)


@functools.lru_cache(maxsize=None)
def _harness_object(arch: str) -> Path:
    out = _workdir() / f"harness-{arch}.o"
    include = Path(tvm_ffi.__file__).parent / "include"
    _check([ARCHES[arch][0], "-O2", "-std=c11", "-Wall", "-I", str(include), "-c", str(HARNESS), "-o", str(out)])
    return out


def _check(cmd: list[str], timeout: float | None = None) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{cmd[0]} timed out after {timeout} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")


def _validate(i: int, a) -> None:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"args[{i}] must be a numpy.ndarray, got {type(a).__name__}")
    if a.dtype.kind not in DLPACK_CODE or not a.dtype.isnative:
        raise TypeError(f"args[{i}] has dtype {a.dtype}; expected a native-endian int, uint or float")
    if not a.flags.c_contiguous:
        raise ValueError(f"args[{i}] must be C-contiguous")


def run(lib, arch: str, args: list[np.ndarray], outputs: list[int]) -> list[np.ndarray]:
    """Call `lib`'s "main" on `args` under qemu; return copies of args[k] for k in `outputs`."""
    for i, a in enumerate(args):
        _validate(i, a)
    for k in outputs:
        if not 0 <= k < len(args):
            raise IndexError(f"output index {k} out of range for {len(args)} args")
    require_tools(arch)
    gcc, qemu, _ = ARCHES[arch]
    harness = _harness_object(arch)
    with tempfile.TemporaryDirectory(dir=_workdir()) as tmp:
        tmp = Path(tmp)
        lib.mod.write_to_file(str(tmp / "kernel.o"))
        _check([gcc, "-static", "-o", str(tmp / "run"), str(harness), str(tmp / "kernel.o"), "-lm"])
        argv = [qemu, str(tmp / "run")]
        for i, a in enumerate(args):
            a.tofile(tmp / f"arg{i}.bin")
            argv += [str(DLPACK_CODE[a.dtype.kind]), str(a.dtype.itemsize * 8), str(a.ndim)]
            argv += [str(d) for d in a.shape] + [str(tmp / f"arg{i}.bin")]
        _check(argv, timeout=TIMEOUT)
        return [np.fromfile(tmp / f"arg{k}.bin", dtype=args[k].dtype).reshape(args[k].shape) for k in outputs]
