"""The one place tests decide what to do when an ARM emulator toolchain is absent."""

import os

import pytest

from schedules import emulate


def require_emulator(arch: str) -> None:
    """Skip when `arch`'s cross gcc or qemu is missing; fail instead under CI=true,
    so a misprovisioned CI image cannot turn the ARM checks into silent skips."""
    missing = emulate.missing_tools(arch)
    if missing:
        reason = f"{arch} emulation needs {', '.join(missing)} on PATH ({emulate.INSTALL_HINT})"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


def require_mca() -> None:
    """Skip (fail under CI=true) when llvm-mca is missing."""
    import shutil

    from microkernels import mca

    if shutil.which(mca.TOOL) is None:
        reason = f"static ARM throughput needs {mca.TOOL} (apt-get install llvm)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
