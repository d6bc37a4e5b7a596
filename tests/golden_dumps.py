"""The one comparison of emitted assembly against a golden dump, for every dump test."""

import difflib

import pytest


def check(path, got: str, what: str) -> None:
    """Fail with a unified diff when `got` differs from the dump at `path` (or it is missing)."""
    assert path.exists(), f"{path.name} missing: run `python -m microkernels regen-asm`"
    want = path.read_text()
    if want != got:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), f"golden/{path.name}", "emitted"))
        pytest.fail(f"{what} changed (regenerate with `python -m microkernels regen-asm` if intended):\n{diff}")
