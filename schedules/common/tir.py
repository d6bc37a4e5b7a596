"""The pieces every TVMScript template in schedules/ spells the same way.

The templates are text because TIR drops unit-extent loops and folds constant bindings when a
PrimFunc is built from objects, and the tensorized blocks must keep exactly the loop and
iterator structure of their intrinsic's description (a tile of MR = 1, a one-row band). Text
keeps every loop the template writes; these helpers keep that text written once.
"""

from __future__ import annotations

from intrinsics import script


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def ceil_to(a: int, b: int) -> int:
    """The least multiple of b that is >= a."""
    return ceil_div(a, b) * b


def region(shape) -> str:
    """A whole buffer as a TVMScript region: "0:a, 0:b, ..."."""
    return ", ".join(f"0:{e}" for e in shape)


def buffer(name: str, shape, dtype: str = "float32") -> str:
    """A parameter declaration of the entry function."""
    return f"{name}: T.Buffer({tuple(shape)}, '{dtype}')"


def header(params: list[str]) -> list[str]:
    """The entry function's first lines. noalias: the operands never overlap, which lets LLVM
    keep loads in registers across stores."""
    return ["@T.prim_func(s_tir=True)", f"def main({', '.join(params)}):", "    T.func_attr({'tirx.noalias': True})"]


def padded_pack(indent: int, dst: str, loops: list[tuple[str, int]], inside: str, value: str,
                fill: str = "T.float32(0)", block: str = "pack") -> list[str]:
    """A block `block` copying `value` into `dst` where `inside` holds and `fill` elsewhere: the
    zero padding (or zero point) of a band's input written once, so the tiles that read it
    need no bounds checks. `loops` are (loop var, extent); the block's iterators are the loop
    vars prefixed with v, and `inside`/`value` are written in those."""
    pad = " " * indent
    names = [n for n, _ in loops]
    iters = ", ".join("v" + n for n in names)
    return [
        f"{pad}for {', '.join(names)} in T.grid({', '.join(str(e) for _, e in loops)}):",
        f"{pad}    with T.sblock('{block}'):",
        f"{pad}        {iters} = T.axis.remap('{'S' * len(names)}', [{', '.join(names)}])",
        f"{pad}        {dst}[{iters}] = T.if_then_else(",
        f"{pad}            {inside},",
        f"{pad}            {value}, {fill})",
    ]


def parse(lines: list[str], **names):
    """The PrimFunc of a template's lines; `names` are Python values the text refers to."""
    return script.parse("\n".join(lines) + "\n", **names)


def has_block(sch, name: str) -> bool:
    """Whether the schedule's function has a block of that name."""
    try:
        sch.get_sblock(name)
    except Exception:  # noqa: BLE001 (TVM raises its own error type for a missing block)
        return False
    return True


def vectorize_whole(sch, loop, extent: int) -> None:
    """Vectorize `loop` (of `extent`) by the widest of 16, 8, 4 lanes that divides it, or leave it:
    TIR leaves a vector loop with a predicated tail scalar, and vectorizes a store past the
    predicate that crops it."""
    lanes = next((v for v in (16, 8, 4) if extent % v == 0), None)
    if lanes:
        sch.vectorize(sch.split(loop, [None, lanes])[1])
