"""Static throughput of a loop body from llvm-mca, for code this host cannot run (ARM).

llvm-mca simulates a core's scheduling model on straight-line code repeated many times; a loop
body fed as is gives the steady-state cycles per iteration, branches assumed predicted.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from .asm import Loop

# Debian's `llvm` package provides it; any LLVM >= 14 has these ARM models.
TOOL = "llvm-mca"
TRIPLES = {"armv7": "armv7-linux-gnueabihf", "aarch64": "aarch64-linux-gnu"}
# LLVM has no ARMv7 scheduling model for cortex-a53 or cortex-a7; cortex-a57 is the nearest
# core it models in 32-bit mode.
MODELS = {"armv7": ("cortex-a57",), "aarch64": ("cortex-a53", "cortex-a72")}
ITERATIONS = 200


class McaMissingError(RuntimeError):
    """llvm-mca is not on PATH."""


def analyze(lp: Loop, cpu: str, mattr: str = "") -> tuple[float, float]:
    """(cycles per iteration in steady state, the resource bound: the cycles per iteration the
    busiest execution port alone needs, llvm-mca's "Block RThroughput")."""
    if shutil.which(TOOL) is None:
        raise McaMissingError(f"{TOOL} not found on PATH; install Debian's llvm package (apt-get install llvm)")
    cmd = [TOOL, f"-mtriple={TRIPLES[lp.arch]}", f"-mcpu={cpu}", f"-iterations={ITERATIONS}"]
    if mattr:
        cmd.append(f"-mattr={mattr}")
    # Labels and the backward branch's target mean nothing to a straight-line simulation.
    body = "\n".join(i for i in lp.body if not i.endswith(":"))
    proc = subprocess.run(cmd, input=body + "\n", capture_output=True, text=True, timeout=120)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    total = re.search(r"^Total Cycles:\s+(\d+)", proc.stdout, re.M)
    bound = re.search(r"^Block RThroughput:\s+([\d.]+)", proc.stdout, re.M)
    if not (total and bound):
        raise RuntimeError(f"no 'Total Cycles' or 'Block RThroughput' in llvm-mca's report:\n{proc.stdout[:500]}")
    return int(total.group(1)) / ITERATIONS, float(bound.group(1))


def cycles_per_iteration(lp: Loop, cpu: str, mattr: str = "") -> float:
    return analyze(lp, cpu, mattr)[0]
