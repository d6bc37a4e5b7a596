"""TensorIntrins for one output row of a depthwise (or narrow-group) convolution on the
depthwise kernel.

Description, for a row of OW output pixels of one 16-channel block:
    C[x, c] = act(sum over (r, s) of A[r*dh, x*sw + s*dw, c] * B[r, s, c] + Bias[c])
A is a window of the (band-packed) NCHW16c input: rows, columns, the 16 lanes; B the block's
KH x KW x 16 weights; C the output row (pixels 16 apart). With groups of G channels (the
kernel's `group`) B is KH x KW x G x 16 and the sum runs over j < G too, reading
A[..., c // G * G + j]. As for the conv tile, a spatial block
per output element whose body zeroes it, runs the taps as plain loops and applies the epilogue
(`templates.element_body`, which the depthwise schedule uses too).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tvm import s_tir

from microkernels import TileError
from microkernels.f32_dwconv import BLOCK, DwKernel
from microkernels.isa import normalize_ints

from .script import parse
from .templates import (DEFAULT_CLIP, Operand, element_body, f32, frame, free_stride, implementation_text,
                        register_text, template)


def weight_taps(kh: int, kw: int, group: int) -> tuple[int, ...]:
    """B's shape per block: the taps, then the group's input channels when G > 1."""
    return (kh, kw) + ((group,) if group > 1 else ())


def reduce_axes(kh: int, kw: int, group: int) -> list[tuple[str, int]]:
    """The reduction loops (r, s, j), those longer than 1."""
    return [(n, e) for n, e in (("r", kh), ("s", kw), ("j", group)) if e > 1]


def lane(c: str, group: int) -> str:
    """The input lane that output lane `c` reads at the group axis j (itself for depthwise)."""
    return c if group == 1 else f"{c} // {group} * {group} + j"


def weight_index(r: str, s: str, c: str, group: int) -> str:
    return f"{r}, {s}, " + ("j, " if group > 1 else "") + c


@dataclass(frozen=True)
class DwRow:
    kern: DwKernel
    ow: int  # output pixels in the row (the kernel loops over them)
    sw: int = 1
    dh: int = 1
    dw: int = 1
    clip: tuple[float, float] = DEFAULT_CLIP

    def __post_init__(self):
        normalize_ints(self, ("ow", "sw", "dh", "dw"), TileError)
        if self.ow < 2:
            raise TileError(f"a depthwise row needs at least 2 pixels to match (a unit loop is dropped), got {self.ow}")
        if not self.reduce_axes():
            raise TileError("a depthwise row must reduce over more than one tap (or a group's channels)")

    @property
    def name(self) -> str:
        clip = f"_{self.clip[0]:g}to{self.clip[1]:g}" if self.kern.epilogue.act == "clip" else ""
        return f"{self.kern.name}{clip}_row{self.ow}_s{self.sw}_d{self.dh}x{self.dw}"

    @property
    def window(self) -> tuple[int, int]:
        k = self.kern
        return (k.kh - 1) * self.dh + 1, (self.ow - 1) * self.sw + (k.kw - 1) * self.dw + 1

    def reduce_axes(self) -> list[tuple[str, int]]:
        k = self.kern
        return reduce_axes(k.kh, k.kw, k.group)

    def a_index(self, x: str, r: str, s: str, c: str) -> str:
        return f"{r} * {self.dh}, {x} * {self.sw} + {s} * {self.dw}, {self.lane(c)}"

    @property
    def b_taps(self) -> tuple[int, ...]:
        k = self.kern
        return weight_taps(k.kh, k.kw, k.group)

    def lane(self, c: str) -> str:
        return lane(c, self.kern.group)

    def b_index(self, r: str, s: str, c: str) -> str:
        return weight_index(r, s, c, self.kern.group)


def _frame(t: DwRow, stride) -> list[str]:
    ah, aw = t.window
    return frame([
        Operand("a", "A", (ah, aw, BLOCK), strides=f"[{stride('sa')}, 16, 1]"),
        Operand("b", "B", (*t.b_taps, BLOCK)),
        *([Operand("bias", "Bias", (BLOCK,))] if t.kern.epilogue.bias else []),
        # Output pixels of a row are one block (16 floats) apart in NCHW16c.
        Operand("c", "C", (t.ow, BLOCK)),
    ])


def _taps(t: DwRow) -> tuple[str, str]:
    """The kernel row and column of a tap as index text: the loop variable, or 0 for a unit axis."""
    names = dict(t.reduce_axes())
    return ("r" if "r" in names else "0"), ("s" if "s" in names else "0")


def description(t: DwRow) -> str:
    # Text, as f32_conv's: the taps' loops exist only where they are longer than 1, and the
    # element body is `element_body`'s, the depthwise schedule's spelling too.
    ep = t.kern.epilogue
    r, s = _taps(t)
    lines = _frame(t, free_stride) + [
        f"        for x, c in T.grid({t.ow}, {BLOCK}):",
        "            with T.sblock('update'):",
        "                vx, vc = T.axis.remap('SS', [x, c])",
    ]
    lines += element_body("C[vx, vc]", f"A[{t.a_index('vx', r, s, 'vc')}]", f"B[{t.b_index(r, s, 'vc')}]", t.reduce_axes(),
                          " " * 16, "Bias[vc]" if ep.bias else None, None, ep.act, t.clip)
    return template(lines)


def implementation(t: DwRow) -> str:
    """One call of the kernel for the whole row."""
    k, ep = t.kern, t.kern.epilogue
    extra = (", Bias.access_ptr('r')" if ep.bias else "") \
        + (f", {f32(t.clip[0])}, {f32(t.clip[1])}" if ep.act == "clip" else "")
    return implementation_text(functools.partial(_frame, t), [
        f"            T.evaluate(T.call_extern('void', '{k.name}', A.access_ptr('r'), {t.sw * BLOCK}, {t.dw * BLOCK},"
        f" sa * {t.dh}, B.access_ptr('r'), C.access_ptr('w'), {t.ow}{extra}))",
    ])


@functools.lru_cache(maxsize=None)
def register_dw(t: DwRow) -> str:
    """Register (once) the intrinsic for one depthwise row geometry; return its name."""
    return register_text(t.name, description(t), implementation(t), t.kern.llvm_ir())


# Where row_function places the row: its window at row 1, column 2 of A; the weights (and
# bias) of the second of two blocks; the output in row 1 of 3, from pixel 1.
ROW_A_AT, ROW_BLOCK, ROW_C_AT = (1, 2), 1, (1, 1)


def row_shapes(t: DwRow) -> tuple[tuple, tuple, tuple, tuple]:
    """Shapes of row_function's A, B, Bias and C."""
    ah, aw = t.window
    (ay, ax), (cy, cx) = ROW_A_AT, ROW_C_AT
    return ((ah + ay + 1, aw + ax + 1, BLOCK), (ROW_BLOCK + 1, *t.b_taps, BLOCK), (ROW_BLOCK + 1, BLOCK),
            (cy + 2, t.ow + cx, BLOCK))


def row_function(t: DwRow):
    """One row through the intrinsic, placed inside larger buffers (ROW_A_AT, ROW_BLOCK,
    ROW_C_AT), so the kernel sees real strides and offsets: for kernel tests and golden dumps."""
    import tvm

    ep = t.kern.epilogue
    red = t.reduce_axes()
    r, s = _taps(t)
    a_shape, b_shape, bias_shape, c_shape = row_shapes(t)
    (ay, ax), blk, (cy, cx) = ROW_A_AT, ROW_BLOCK, ROW_C_AT
    params = (f"A: T.Buffer({a_shape}, 'float32'), B: T.Buffer({b_shape}, 'float32'),"
              + (f" Bias: T.Buffer({bias_shape}, 'float32')," if ep.bias else "")
              + f" C: T.Buffer({c_shape}, 'float32')")
    lines = ["@T.prim_func(s_tir=True)", f"def main({params}):", "    T.func_attr({'tirx.noalias': True})",
             f"    for x, c in T.grid({t.ow}, {BLOCK}):", "        with T.sblock('row'):",
             "            vx, vc = T.axis.remap('SS', [x, c])"]
    lines += element_body(f"C[{cy}, vx + {cx}, vc]", f"A[{ay} + {r} * {t.dh}, {ax} + vx * {t.sw} + {s} * {t.dw}, {t.lane('vc')}]",
                          f"B[{blk}, {t.b_index(r, s, 'vc')}]", red, " " * 12, f"Bias[{blk}, vc]" if ep.bias else None, None,
                          ep.act, t.clip)
    sch = s_tir.Schedule(parse("\n".join(lines) + "\n"))
    sch.tensorize(sch.get_loops(sch.get_sblock("row"))[0], register_dw(t))
    return tvm.IRModule({"main": sch.mod["main"]})


def compile_row(t: DwRow):
    import tvm

    return tvm.compile(row_function(t), target=t.kern.isa.target)
