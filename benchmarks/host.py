"""What the figures were measured on: the CPU's name and its caches, read from the host."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")


def cpu_name() -> str:
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return "unknown CPU"
    return f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')})"


def caches() -> list[tuple[int, str, str]]:
    """(level, type, size) of each cache of cpu0, as sysfs gives them ("48K"); [] where unknown."""
    out = []
    for d in sorted(CACHE_DIR.glob("index*")):
        try:
            out.append((int((d / "level").read_text()), (d / "type").read_text().strip(),
                        (d / "size").read_text().strip()))
        except (OSError, ValueError):
            continue
    return out


def describe() -> str:
    seen = ", ".join(f"L{lvl}{'d' if kind == 'Data' else ''} {size}" for lvl, kind, size in caches()
                     if kind != "Instruction")
    return f"host: {cpu_name()}, {os.cpu_count()} cores; caches of cpu0: {seen or 'unknown'}"
