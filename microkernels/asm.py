"""Reading assembly text as LLVM prints it (x86 AT&T, ARMv7, AArch64): normalize, find loops, count.

Kernel knowledge lives here so the tests state properties ("the K loop holds MR*NR/lanes FMAs")
instead of re-parsing assembly each in its own way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .isa import Isa

_LABEL = re.compile(r"^([.\w$]+):")
_LOCAL_LABEL = re.compile(r"\.L[\w$]+")
# Comment markers and branch forms per architecture. ARM immediates start with '#', so '#' is a
# comment only on x86.
_COMMENT = {"x86": "#", "armv7": "@", "aarch64": "//"}
_JUMPS = {
    "x86": re.compile(r"^\s*j\w+\s+(\.L[\w$]+)"),
    "armv7": re.compile(r"^\s*b(?:eq|ne|hs|lo|mi|pl|hi|ls|ge|lt|gt|le|cs|cc)?\s+(\.L[\w$]+)"),
    "aarch64": re.compile(r"^\s*(?:b(?:\.\w+)?|cbn?z\s+\w+,|tbn?z\s+\w+,\s*#\d+,)\s+(\.L[\w$]+)"),
}
_ARM_STACK = re.compile(r"\[sp\b|\bsp\]|\{[^}]*\}\s*,\s*\[sp|\b(?:push|pop|vpush|vpop)\b")
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


def normalize(fn_asm: str, arch: str = "x86") -> str:
    """Instructions and block labels only, labels renumbered by first appearance.

    Debug locations, CFI, alignment and other directives, comments and temporary labels go:
    a dump then changes only when the instructions do.
    """
    kept = []
    for ln in fn_asm.splitlines():
        s = ln.split(_COMMENT[arch], 1)[0].rstrip()
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
    arch: str = "x86"

    def count(self, mnemonic_prefix: str) -> int:
        return sum(1 for ins in self.body if ins.split()[0].startswith(mnemonic_prefix))

    def stack_accesses(self) -> list:
        return _stack_accesses(self.body, self.arch, self.frame_pointer)


def _stack_accesses(body: list, arch: str, frame_pointer: bool) -> list:
    if arch != "x86":
        return [i for i in body if _ARM_STACK.search(i)]
    return [i for i in body if _RSP.search(i) or (frame_pointer and _RBP.search(i))]


def single_block_loops(fn_asm: str, arch: str = "x86", side_exits: bool = False) -> list:
    """Loops that are one basic block: a label whose block ends by jumping back to it.

    side_exits: also accept conditional jumps out of the middle of the body (LLVM rotates some
    loops so that the exit test sits mid-body and the back edge is unconditional).
    """
    loops, current, body, fp = [], None, [], False
    jump = _JUMPS[arch]
    for ln in normalize(fn_asm, arch).splitlines():
        m = _LABEL.match(ln)
        if m:
            if not m.group(1).startswith(".L"):
                fp = False  # a new function
            current, body = m.group(1), []
            continue
        if ln.split() == ["movq", "%rsp,", "%rbp"]:
            fp = True
        body.append(ln.strip())
        j = jump.match(ln)
        if j and current is not None:
            if j.group(1) == current:
                loops.append(Loop(current, list(body), fp, arch))
                current = None
            elif not (side_exits and ln.split()[0] not in ("b", "jmp")):
                current = None  # a jump ends the block (a fallthrough block has no label here)
    return loops


# Packed-single arithmetic in AT&T mnemonics. An xor counts only as a sign flip (LLVM's fneg,
# with a -0.0 mask): with its two sources the same register it is the zeroing idiom.
_PS_ARITH = re.compile(r"^v(?:add|sub|mul)ps$|^vf(?:n?m(?:add|sub))(?:132|213|231)ps$")
_XOR = re.compile(r"^v(?:xorps|pxor[dq]?)$")
_X86_VREG = re.compile(r"%([xyz]mm)\d+")


def vector_arithmetic(fn_asm: str) -> dict[str, list[str]]:
    """x86 packed-single arithmetic instructions (add, sub, mul, every FMA form, sign-flip xor)
    of a function, keyed by the class of their destination register: "xmm", "ymm" or "zmm"
    ("other" if it is none of them)."""
    out: dict[str, list[str]] = {}
    for ins in normalize(fn_asm).splitlines():
        op, _, operands = ins.strip().partition(" ")
        args = [a.strip() for a in operands.split(",")]
        if _XOR.match(op):
            if len(set(args)) == 1:
                continue
        elif not _PS_ARITH.match(op):
            continue
        dest = _X86_VREG.search(args[-1])
        out.setdefault(dest.group(1) if dest else "other", []).append(ins.strip())
    return out


def stack_accesses(fn_asm: str, arch: str = "x86") -> list[str]:
    """Instructions of a whole function with a stack operand (spills and reloads; on ARM also
    push and pop): what Loop.stack_accesses finds in one loop, for straight-line kernels."""
    body = [ln.strip() for ln in normalize(fn_asm, arch).splitlines() if not _LABEL.match(ln)]
    return _stack_accesses(body, arch, frame_pointer=["movq", "%rsp,", "%rbp"] in (i.split() for i in body))


def fma_loops(fn_asm: str) -> list:
    return [lp for lp in single_block_loops(fn_asm) if lp.count("vfmadd") > 0]


# What a register tile's K loop may hold besides its FMAs, loads and broadcasts: pointer and
# counter arithmetic and the loop branch.
_BOOKKEEPING = ("add", "sub", "inc", "dec", "lea", "cmp", "test", "j", "mov")


def tile_loop_problems(lp: Loop, isa: Isa, mr: int, nv: int, prefetches: int = 0) -> list[str]:
    """Why `lp` is not exactly an MR x NV-vector tile's K step (empty list: it is).

    Allowed: MR*NV FMAs on the ISA's vector registers (zmm or ymm), NV vector loads (B), MR broadcasts of A (folded
    into the FMAs as {1to16} on AVX-512 with NV = 1), `prefetches` prefetcht1 (a prefetching
    kernel's, one per B vector), and bookkeeping on general registers.
    Not allowed: any store, any load of the output tile, any stack access.
    """
    problems = []
    if lp.count("prefetcht1") != prefetches:
        problems.append(f"{lp.count('prefetcht1')} prefetcht1, expected {prefetches}")
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
        elif op.startswith("vfmadd") or op == "vbroadcastss" or op == "prefetcht1":
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


def int_tile_loop_problems(lp: Loop, isa: Isa, op: str, mr: int, nv: int, prefetches: int = 0) -> list[str]:
    """Why `lp` is not exactly an x86 integer tile's K step (microkernels.int_gemm; empty: it is).

    Allowed: MR*NV vpdpbusd (op "u8s8"), or MR*NV vpmaddwd each with its vpaddd (op "s16"), or
    MR*NV vpmaddubsw each with a vpmaddwd by the one register of ones and a vpaddd (op "u8s7"), on
    the ISA's vector registers; NV vector loads (B); MR vpbroadcastd (A); `prefetches` prefetcht1
    (a prefetching kernel's, one per B vector); bookkeeping on general registers. Not allowed: any
    store, widening or other vector instruction, any stack access.
    """
    reg = {512: "%zmm", 256: "%ymm"}[isa.vector_bits]
    body = [i.removeprefix("{vex} ") for i in lp.body]
    mul = {"u8s8": "vpdpbusd", "s16": "vpmaddwd", "u8s7": "vpmaddubsw"}[op]
    muls = [i for i in body if i.split()[0] == mul]
    adds = [i for i in body if i.split()[0] == "vpaddd"]
    problems = []
    if lp.count("prefetcht1") != prefetches:
        problems.append(f"{lp.count('prefetcht1')} prefetcht1, expected {prefetches}")
    body = [i for i in body if i.split()[0] != "prefetcht1"]
    if len(muls) != mr * nv:
        problems.append(f"{len(muls)} {mul}, expected {mr * nv}")
    if op == "u8s7":
        # each product's pairs summed by a vpmaddwd with the same register of ones
        pairs = [i for i in body if i.split()[0] == "vpmaddwd"]
        ones = {i.split()[1].rstrip(",") for i in pairs}
        if len(pairs) != mr * nv or len(ones) != 1:
            problems.append(f"{len(pairs)} vpmaddwd by {sorted(ones)}, expected {mr * nv} by one register of ones")
        muls = muls + pairs
    if len(adds) != (0 if op == "u8s8" else mr * nv):
        problems.append(f"{len(adds)} vpaddd, expected {0 if op == 'u8s8' else mr * nv}")
    if not all(i.count(reg) == 3 for i in muls + adds):
        problems.append(f"multiplies not on {reg}")
    if lp.stack_accesses():
        problems.append(f"stack traffic: {lp.stack_accesses()}")
    loads = [i for i in body if i.split()[0].startswith("vmovdq") and "(" in i.split(None, 1)[1].rpartition(",")[0]]
    if len(loads) != nv:
        problems.append(f"{len(loads)} vector loads, expected {nv} (B only)")
    if sum(i.split()[0] == "vpbroadcastd" for i in body) != mr:
        problems.append(f"{sum(i.split()[0] == 'vpbroadcastd' for i in body)} vpbroadcastd, expected {mr}")
    known = set(muls + adds + loads)
    other = [i for i in body if i not in known and i.split()[0] != "vpbroadcastd"
             and (not i.split()[0].startswith(_BOOKKEEPING) or i.split()[0].startswith("vmov")
                  or (i.split()[0].startswith("mov") and "(" in i.split(None, 1)[1].rpartition(",")[2]))]
    if other:
        problems.append(f"unexpected instructions: {other[:4]}")
    return problems


# The by-lane MAC forms of the integer NEON tiles, and what must never appear in their K loop:
# widening (the schedule widens once, when it packs), stores, and scalar multiplies.
_MAC_FORMS = {
    "neon": re.compile(r"^vmlal\.s16 q\d+, d\d+, d[0-7]\[[0-3]\]$"),
    "aarch64": re.compile(r"^smlal2? v\d+\.4s, v\d+\.[48]h, v(?:[0-9]|1[0-5])\.h\[[0-7]\]$"),
    "aarch64dot": re.compile(r"^sdot v\d+\.4s, v\d+\.16b, v\d+\.4b\[[0-3]\]$"),
}
_MAC_MNEMONICS = ("vmlal", "smlal", "sdot")
_WIDENING = ("vmovl", "sxtl", "sshll", "uxtl", "ushll", "vmull", "smull", "sxth", "sxtb")
_ARM_STORE = ("vst", "str", "st1", "st2", "st3", "st4", "stp", "stm", "push", "vpush")
_ARM_SCALAR_MUL = ("mul", "mla", "smla", "smul", "madd", "msub")


def mac_loops(fn_asm: str, arch: str, isa_name: str | None = None) -> list:
    """Single-block loops holding MAC instructions; with `isa_name`, only those holding that
    ISA's by-lane form (a tile's K loop, not e.g. LLVM's own sdot-with-ones reduction)."""
    loops = [lp for lp in single_block_loops(fn_asm, arch)
             if any(i.split()[0].startswith(_MAC_MNEMONICS) for i in lp.body)]
    if isa_name is not None:
        form = _MAC_FORMS[isa_name]
        loops = [lp for lp in loops if any(form.match(" ".join(i.split())) for i in lp.body)]
    return loops


def mac_loop_problems(lp: Loop, isa_name: str, macs: int) -> list[str]:
    """Why `lp` is not exactly an integer tile's K step of `macs` by-lane MAC instructions.

    Allowed besides them: vector loads and general-register bookkeeping. Not allowed: a MAC
    that is not the by-lane form, widening, stores, stack traffic, scalar multiplies.
    """
    problems = []
    form = _MAC_FORMS[isa_name]
    found = [i for i in lp.body if i.split()[0].startswith(_MAC_MNEMONICS)]
    if len(found) != macs:
        problems.append(f"{len(found)} MAC instructions, expected {macs}")
    wrong = [i for i in found if not form.match(" ".join(i.split()))]
    if wrong:
        problems.append(f"MACs not in the by-lane form: {wrong[:3]}")
    for label, prefixes in (("widening", _WIDENING), ("stores", _ARM_STORE), ("scalar multiplies", _ARM_SCALAR_MUL)):
        bad = [i for i in lp.body if i.split()[0].startswith(prefixes) and not i.split()[0].startswith(_MAC_MNEMONICS)]
        if bad:
            problems.append(f"{label} in the K loop: {bad[:3]}")
    if lp.stack_accesses():
        problems.append(f"stack traffic: {lp.stack_accesses()}")
    return problems


# Multiplies per instruction, by mnemonic and result arrangement: a MAC is one product that
# is summed into an accumulator, whether by a fused multiply-add or a multiply and a later add.
_ARM_LANES = {".4s": 4, ".2s": 2, ".8h": 8, ".4h": 4, ".2d": 2}


def _arm_multiplies(ins: str, arch: str) -> int:
    op, _, operands = ins.partition(" ")
    if arch == "armv7":
        if op in ("vmlal.s16", "vmull.s16", "vmlal.u16", "vmull.u16"):
            return 4
        if op in ("vmlal.s8", "vmull.s8", "vmlal.u8", "vmull.u8"):
            return 8
        if op.startswith(("vmla.i", "vmul.i", "vmls.i")):
            width = int(op.split(".i")[1])
            return (128 if operands.lstrip().startswith("q") else 64) // width
        if op.startswith(("smla", "smul", "mla", "mul", "mls", "smlsd", "smuad", "smlad")):
            return 2 if op.startswith(("smlad", "smuad", "smlsd")) else 1
        return 0
    if op == "sdot" or op == "udot":
        return 16 if ".4s" in operands.split(",")[0] else 8
    if op.startswith(("smlal", "smull", "umlal", "umull", "mla", "mul", "mls", "smlsl")):
        dest = operands.split(",")[0].strip()
        for arr, n in _ARM_LANES.items():
            if dest.endswith(arr):
                return n
        return 1 if op in ("mul", "mla", "mls") else 0
    if op in ("madd", "msub", "smaddl", "umaddl", "smull", "smsubl"):
        return 1
    return 0


def loop_macs(lp: Loop) -> int:
    """Products one iteration of an ARM loop computes (vector lanes counted)."""
    return sum(_arm_multiplies(" ".join(i.split()), lp.arch) for i in lp.body)


def hot_loop(fn_asm: str, arch: str) -> Loop:
    """The single-block loop doing the most products per iteration: the K loop of a tile, or the
    innermost reduction of a plain schedule."""
    loops = [lp for lp in single_block_loops(fn_asm, arch, side_exits=True) if loop_macs(lp)]
    if not loops:
        raise ValueError("no single-block loop with multiplies in this function")
    return max(loops, key=loop_macs)
