"""What ran where: one reports() entry per graph dynamo handed over (and per signature of a
dynamic one), the logger, and the live graphs' VMs for profilers."""

from __future__ import annotations

import collections
import logging
import weakref

LOG = logging.getLogger("tvm_microkernels.torch")
REPORTS: collections.deque = collections.deque(maxlen=256)
LIVE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # graph name -> its newest compiled module


def reports() -> list[dict]:
    """One dict per graph dynamo handed over (and per shape of a dynamic one) since the last
    clear_reports(), oldest first: where it runs ("microkernels" or "eager") and why."""
    return list(REPORTS)


def last_report() -> dict | None:
    """The newest reports() entry, or None."""
    return REPORTS[-1] if REPORTS else None


def clear_reports() -> None:
    REPORTS.clear()


def virtual_machine(graph: str):
    """The relax.VirtualMachine a graph (reports()'s "graph" name) runs on, as compiled for its
    newest input signature, while the compiled model is alive; else None. For profiling: its
    "main" takes the graph's tensor inputs (the report's "inputs") as TVM tensors. It is the VM
    of the thread that compiled the graph (each calling thread runs a VM of its own)."""
    compiled = LIVE.get(graph)
    return compiled.vm if compiled is not None else None


def first_line(e: Exception) -> str:
    lines = [s for s in str(e).splitlines() if s.strip()]
    return lines[0][:300] if lines else ""


class Fallback(Exception):
    """A reason to run a graph eagerly (the message says which)."""
