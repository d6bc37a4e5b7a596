"""Reading x86 assembly text (AT&T syntax, as LLVM prints it): normalize, find loops, count.

Kernel knowledge lives here so the tests state properties ("the K loop holds MR*NR/lanes FMAs")
instead of re-parsing assembly each in its own way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .isa import Isa

_LABEL = re.compile(r"^([.\w$]+):")
_LOCAL_LABEL = re.compile(r"\.L[\w$]+")
_JUMP = re.compile(r"^\s*j\w+\s+(\.L[\w$]+)")
# Stack spills and reloads: rsp-relative operands, and rbp-relative ones where the function
# keeps a frame pointer (elsewhere rbp is just another register, e.g. a B-row pointer).
_RSP = re.compile(r"\(%rsp[,)]")
_RBP = re.compile(r"\(%rbp[,)]")


def compute_function(asm: str, suffix: str = "_compute_") -> str:
    """The text of the first function whose label ends in `suffix` (TVM's kernel body)."""
    lines = asm.splitlines()
    start = next((n for n, ln in enumerate(lines) if re.match(rf"^[\w$.]*{suffix}:", ln)), None)
    if start is None:
        raise ValueError(f"no function ending in {suffix!r} in this assembly")
    end = next((n for n in range(start + 1, len(lines)) if lines[n].startswith(".Lfunc_end")), len(lines))
    return "\n".join(lines[start:end])


def normalize(fn_asm: str) -> str:
    """Instructions and block labels only, labels renumbered by first appearance.

    Debug locations, CFI, alignment and other directives, comments and temporary labels go:
    a dump then changes only when the instructions do.
    """
    kept = []
    for ln in fn_asm.splitlines():
        s = ln.split("#", 1)[0].rstrip()
        if not s.strip():
            continue
        m = _LABEL.match(s)
        if m:
            if m.group(1).startswith((".Ltmp", ".Lfunc_begin")):
                continue
            kept.append(s)
        elif s.lstrip().startswith("."):
            continue  # directive
        else:
            kept.append(" " + " ".join(s.split()))
    names: dict[str, str] = {}

    def rename(m):
        return names.setdefault(m.group(0), f".L{len(names)}")

    return "\n".join(_LOCAL_LABEL.sub(rename, ln) for ln in kept) + "\n"


@dataclass
class Loop:
    label: str
    body: list  # instructions from the label to the backward jump, inclusive
    frame_pointer: bool = False  # the enclosing function keeps rbp as its frame pointer

    def count(self, mnemonic_prefix: str) -> int:
        return sum(1 for ins in self.body if ins.split()[0].startswith(mnemonic_prefix))

    def stack_accesses(self) -> list:
        return [i for i in self.body if _RSP.search(i) or (self.frame_pointer and _RBP.search(i))]


def single_block_loops(fn_asm: str) -> list:
    """Loops that are one basic block: a label whose block ends by jumping back to it."""
    loops, current, body, fp = [], None, [], False
    for ln in normalize(fn_asm).splitlines():
        m = _LABEL.match(ln)
        if m:
            if not m.group(1).startswith(".L"):
                fp = False  # a new function
            current, body = m.group(1), []
            continue
        if ln.split() == ["movq", "%rsp,", "%rbp"]:
            fp = True
        body.append(ln.strip())
        j = _JUMP.match(ln)
        if j and current is not None:
            if j.group(1) == current:
                loops.append(Loop(current, list(body), fp))
            current = None  # a jump ends the block (a fallthrough block has no label here)
    return loops


def fma_loops(fn_asm: str) -> list:
    return [lp for lp in single_block_loops(fn_asm) if lp.count("vfmadd") > 0]


# What a register tile's K loop may hold besides its FMAs, loads and broadcasts: pointer and
# counter arithmetic and the loop branch.
_BOOKKEEPING = ("add", "sub", "inc", "dec", "lea", "cmp", "test", "j", "mov")


def tile_loop_problems(lp: Loop, isa: Isa, mr: int, nv: int) -> list[str]:
    """Why `lp` is not exactly an MR x NV-vector tile's K step (empty list: it is).

    Allowed: MR*NV FMAs on the ISA's vector registers (zmm or ymm), NV vector loads (B), MR broadcasts of A (folded
    into the FMAs as {1to16} on AVX-512 with NV = 1), and bookkeeping on general registers.
    Not allowed: any store, any load of the output tile, any stack access.
    """
    problems = []
    reg = {512: "%zmm", 256: "%ymm"}[isa.vector_bits]
    fmas = [i for i in lp.body if i.startswith("vfmadd")]
    if len(fmas) != mr * nv or lp.count("vfmadd231ps") != len(fmas):
        problems.append(f"{len(fmas)} FMAs, expected {mr * nv} vfmadd231ps")
    if not all(reg in i for i in fmas):
        problems.append(f"FMAs not on {reg}")
    if lp.stack_accesses():
        problems.append(f"stack traffic: {lp.stack_accesses()}")
    vloads, stores, other = [], [], []
    for ins in lp.body:
        op, *args = ins.split(None, 1)
        operands = args[0] if args else ""
        if op in ("vmovups", "vmovaps"):
            src, _, dst = operands.rpartition(",")
            (stores if "(" in dst else vloads).append(ins)
        elif op.startswith("vfmadd") or op == "vbroadcastss":
            continue
        elif not op.startswith(_BOOKKEEPING) or (op.startswith("mov") and "(" in operands.rpartition(",")[2]):
            other.append(ins)
    if len(vloads) != nv:
        problems.append(f"{len(vloads)} vector loads, expected {nv} (B only): {vloads}")
    if stores:
        problems.append(f"stores in the K loop: {stores}")
    if other:
        problems.append(f"unexpected instructions: {other}")
    folded = sum("{1to16}" in i for i in fmas)
    if isa.embedded_broadcast and nv == 1:
        if folded != mr or lp.count("vbroadcastss"):
            problems.append(f"{folded} folded broadcasts of {mr}, {lp.count('vbroadcastss')} vbroadcastss")
    elif lp.count("vbroadcastss") != mr or folded:
        problems.append(f"{lp.count('vbroadcastss')} broadcasts, expected {mr}")
    return problems
