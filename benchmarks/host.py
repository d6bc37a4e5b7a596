"""What the figures were measured on: the CPU's name and its caches, read from the host."""

from __future__ import annotations

import os

from microkernels.isa import host_cpuinfo
from schedules.common.targets import host_caches


def cpu_name() -> str:
    fields = host_cpuinfo()
    if not fields:
        return "unknown CPU"
    return f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')})"


def describe() -> str:
    seen = ", ".join(f"L{lvl}{'d' if kind == 'Data' else ''} {size}" for lvl, kind, size in host_caches()
                     if kind != "Instruction")
    return f"host: {cpu_name()}, {os.cpu_count()} cores; caches of cpu0: {seen or 'unknown'}"
