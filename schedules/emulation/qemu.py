"""Run a TVM-compiled ARM kernel under qemu-user and bring its outputs back as numpy arrays.
(x86 code the host cannot run, AVX-512 on an AVX2 machine, runs on the Bochs CPU: bochs.py.)

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
import threading
from pathlib import Path
from typing import NamedTuple

import numpy as np
import tvm_ffi

from .arguments import DLPACK_CODE, check_args


class Toolchain(NamedTuple):
    gcc: str  # cross compiler command
    qemu: str  # qemu-user binary
    packages: tuple[str, ...]  # Debian packages that provide both, and the C library gcc links


# The cross C library is only *recommended* by the cross gcc, so `--no-install-recommends`
# leaves gcc unable to include <stdio.h> or link -static: it must be named on its own.
ARCHES = {
    "armv7": Toolchain("arm-linux-gnueabihf-gcc", "qemu-arm",
                       ("gcc-arm-linux-gnueabihf", "libc6-dev-armhf-cross", "qemu-user")),
    "aarch64": Toolchain("aarch64-linux-gnu-gcc", "qemu-aarch64",
                         ("gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross", "qemu-user")),
}
PACKAGES = tuple(dict.fromkeys(p for t in ARCHES.values() for p in t.packages))
# One command for both arches: whoever needs one usually soon needs the other.
INSTALL_HINT = "apt-get install " + " ".join(PACKAGES)
HARNESS = Path(__file__).with_name("qemu_harness.c")
TIMEOUT = 300  # seconds per qemu run; a hung kernel should fail a test, not stall CI
_LOCK = threading.Lock()

# The self-check's program: C library headers, static libc and qemu, nothing of TVM's.
_PROBE_C = r"""
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    long n = argc > 1 ? strtol(argv[1], NULL, 10) : 0, sum = 0;
    for (long i = 1; i <= n; i++) sum += i * i;
    printf("%ld\n", sum);
    return 0;
}
"""
_PROBE_N, _PROBE_SUM = 10, 385


class ToolchainError(RuntimeError):
    """The cross compiler, its C library or qemu failed for a reason that is not the kernel:
    nothing about the inputs can change the outcome, so callers need not retry other inputs."""


class EmulatorMissingError(ToolchainError):
    """The cross compiler or qemu-user binary for an arch is not on PATH."""


def _arch(arch: str) -> Toolchain:
    if arch not in ARCHES:
        raise ValueError(f"unknown arch {arch!r}; expected one of {sorted(ARCHES)}")
    return ARCHES[arch]


def missing_tools(arch: str) -> list[str]:
    t = _arch(arch)
    return [tool for tool in (t.gcc, t.qemu) if shutil.which(tool) is None]


def missing_packages(arch: str) -> list[str] | None:
    """`arch`'s Debian packages that dpkg says are not installed; None where there is no dpkg."""
    if shutil.which("dpkg-query") is None:
        return None
    missing = []
    for pkg in _arch(arch).packages:
        proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True)
        if proc.returncode or not proc.stdout.endswith(" installed"):
            missing.append(pkg)
    return missing


def require_tools(arch: str) -> None:
    missing = missing_tools(arch)
    if missing:
        raise EmulatorMissingError(
            f"cannot emulate {arch}: {', '.join(missing)} not found on PATH; install with: {INSTALL_HINT}"
        )


def self_check(arch: str) -> None:
    """Compile, statically link and run a small C program under qemu for `arch`, or raise
    ToolchainError saying what is missing (by Debian package where dpkg can tell)."""
    require_tools(arch)
    t = ARCHES[arch]
    with tempfile.TemporaryDirectory(prefix="tvm-emulate-check-") as tmp:
        src, exe = Path(tmp) / "probe.c", Path(tmp) / "probe"
        src.write_text(_PROBE_C)
        try:
            _output([t.gcc, "-O2", "-static", "-o", str(exe), str(src)])
            out = _output([t.qemu, str(exe), str(_PROBE_N)], timeout=60)
        except ToolchainError as err:
            missing = missing_packages(arch)
            hint = (f"Debian packages not installed: {' '.join(missing)}" if missing
                    else "the packages are installed, so read the error above")
            raise ToolchainError(f"{arch} toolchain self-check failed ({hint}; install with: {INSTALL_HINT})"
                                 f"\n{err}") from None
    if out.split() != [str(_PROBE_SUM)]:
        raise ToolchainError(f"{arch} self-check program under {t.qemu} printed {out!r}, expected {_PROBE_SUM}")


@functools.lru_cache(maxsize=None)
def toolchain_problem(arch: str) -> str | None:
    """self_check's message, or None when `arch` emulates; checked once per process."""
    try:
        self_check(arch)
    except ToolchainError as err:
        return str(err)
    return None


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
    _output([ARCHES[arch].gcc, "-O2", "-std=c11", "-Wall", "-I", str(include), "-c", str(HARNESS), "-o", str(out)])
    return out


def _output(cmd: list[str], timeout: float | None = None, error=ToolchainError) -> str:
    """Run `cmd`; its stdout, or `error` carrying the command and its stderr."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise error(f"{cmd[0]} timed out after {timeout} s") from None
    except OSError as err:
        raise error(f"{cmd[0]} could not start: {err}") from None
    if proc.returncode != 0:
        raise error(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc.stdout



def run(lib, arch: str, args: list[np.ndarray], outputs: list[int]) -> list[np.ndarray]:
    """Call `lib`'s "main" on `args` under qemu; return copies of args[k] for k in `outputs`."""
    check_args(args, outputs)
    require_tools(arch)
    gcc, qemu, _ = ARCHES[arch]
    # Compiling the harness and linking touch only the toolchain: their failures are
    # ToolchainError. Running is the kernel's part: a crash or TVM's argument checks there
    # come back as a plain RuntimeError. The cached work folder and harness object, and TVM's
    # write_to_file on a module two threads share, are not safe to run concurrently (a double
    # free, seen with two threads calling one op): they run under a lock, qemu outside it.
    with _LOCK:
        harness = _harness_object(arch)
        tmp = Path(tempfile.mkdtemp(dir=_workdir()))
        try:
            lib.mod.write_to_file(str(tmp / "kernel.o"))
            _output([gcc, "-static", "-o", str(tmp / "run"), str(harness), str(tmp / "kernel.o"), "-lm"])
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    try:
        argv = [qemu, str(tmp / "run")]
        for i, a in enumerate(args):
            a.tofile(tmp / f"arg{i}.bin")
            argv += [str(DLPACK_CODE[a.dtype.kind]), str(a.dtype.itemsize * 8), str(a.ndim)]
            argv += [str(d) for d in a.shape] + [str(tmp / f"arg{i}.bin")]
        _output(argv, timeout=TIMEOUT, error=RuntimeError)
        return [np.fromfile(tmp / f"arg{k}.bin", dtype=args[k].dtype).reshape(args[k].shape) for k in outputs]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
