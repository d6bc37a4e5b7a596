"""The one place tests decide what to do when an ARM emulator toolchain is absent or broken."""

import os
import shutil

import pytest

from microkernels import mca
from schedules.emulation import qemu as emulate


def _unavailable(reason: str) -> None:
    """Skip; fail instead under CI=true, so a misprovisioned CI machine cannot turn the ARM
    checks into silent skips."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def require_emulator(arch: str) -> None:
    """Go on only if `arch`'s toolchain passed its self-check (compile, link -static, run under
    qemu), which runs once per session: a broken toolchain costs seconds, not every test."""
    problem = emulate.toolchain_problem(arch)
    if problem:
        _unavailable(problem)


def require_mca() -> None:
    if shutil.which(mca.TOOL) is None:
        _unavailable(f"static ARM throughput needs {mca.TOOL} (apt-get install llvm)")


class ToolchainBroken(BaseException):
    """What tests see in place of emulate.ToolchainError. Hypothesis shrinks every Exception
    (pytest.fail's too) through minutes of examples, but lets other BaseExceptions through at
    once; and a toolchain failure says nothing about the example that met it."""
