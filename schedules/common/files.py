"""The user's folder and atomic writes, shared by the compile cache (cache.py) and this host's
measurements (tuned.py), each of which an environment variable may point elsewhere or turn off."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

OFF = ("off", "0", "false", "no")


def from_env(name: str, default: Path) -> Path | None:
    """$name as a path, None when it says off, `default` when it is unset or empty."""
    env = os.environ.get(name, "")
    if env.lower() in OFF:
        return None
    return Path(env) if env else default


def user_folder() -> Path:
    """$XDG_CACHE_HOME/tvm-microkernels, else ~/.cache/tvm-microkernels."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tvm-microkernels"


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename it into place: readers in other
    processes see the old file or the whole new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
