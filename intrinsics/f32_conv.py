"""TensorIntrins for one output tile of a direct convolution on the batch-reduce GEMM tile.

Description, for an MR x NR output tile (MR output pixels of one row, NR output channels):
    C[m, j] = act(sum over (q, r, s, i) of A[q, r*dh, m*sw + s*dw, i] * B[q, r, s, i, j]
                  + Bias[j] + R[m, j])
A is a window of NCHWc input (input-channel blocks q, rows, columns, channels i of a block),
B the tile's slice of OIHWio weights, C a row of NCHWc output; Bias, the residual R and act
(ReLU, or a clip to fixed bounds) are the kernel's epilogue and each is optional. The whole
reduction runs inside one kernel call (beta=0, so there is no separate init pass), which is
what keeps C in registers until its one store. A schedule that cuts the reduction into chunks
(schedules.conv.direct) uses an accumulating tile for the later ones: C += its part, no zero
fill, the epilogue on the last chunk only.

The description is a spatial block per output element whose body runs the reduction as plain
loops and then the epilogue: a TIR reduction block cannot apply anything after its last
update, and an epilogue block of its own would be a second pass over C. Tensorize compares
the loops and statements inside the block as they are, so the convolution schedule renders
its blocks in exactly this form (`element_body`).

Loops of extent 1 are left out of the description: TIR drops them from the blocks it builds,
and a description that kept them would never match (MR = 1, a row one pixel wide as a conv
on a 1x1 map has: no pixel loop, C's row 0; the tile is then a GEMV). The TVMScript is therefore rendered as
text per tile geometry; `reduce_axes` is the single place that decides which loops exist, and
the convolution schedule builds its blocks from it too.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from microkernels import GemmKernel, TileError
from microkernels.isa import normalize_ints

from . import registry
from .templates import (DEFAULT_CLIP, SYMBOL, Operand, element_body, f32, frame, free_stride, implementation_text,
                        register_text, specialized, template)

def reduce_axes(nb: int, kh: int, kw: int, bi: int) -> list[tuple[str, int]]:
    """(name, extent) of a conv tile's reduction loops, outer to inner, without unit extents:
    input-channel block q, kernel row r, kernel column s, channel of the block i."""
    return [(n, e) for n, e in (("q", nb), ("r", kh), ("s", kw), ("i", bi)) if e > 1]


@dataclass(frozen=True)
class ConvTile:
    """Geometry of one tensorized output tile. `kern` is a batch-reduce GEMM tile: beta=0 for a
    tile that computes the whole reduction, or one that accumulates (C += its part, then the
    epilogue if it has one) for the later chunks of a reduction cut into chunks."""

    kern: GemmKernel
    nb: int  # input-channel blocks reduced over
    kh: int
    kw: int
    bi: int  # channels per input block
    sw: int = 1  # stride along the width
    dh: int = 1  # dilation
    dw: int = 1
    clip: tuple[float, float] = DEFAULT_CLIP  # bounds, when the kernel's epilogue clips

    def __post_init__(self):
        if not self.kern.batch_reduce:
            raise TileError(f"a conv tile needs a batch-reduce kernel, got {self.kern.name}")
        normalize_ints(self, ("nb", "kh", "kw", "bi", "sw", "dh", "dw"), TileError)
        if not self.reduce_axes():
            raise TileError("a conv tile must reduce over more than one element")
        lo, hi = self.clip
        if not lo < hi:
            raise TileError(f"clip bounds must satisfy lo < hi, got {self.clip}")
        object.__setattr__(self, "clip", (float(lo), float(hi)))

    @property
    def groups(self) -> int:
        """Output blocks the tile spans: NR / col_block for a column-group kernel, else 1."""
        return self.kern.nr // self.kern.col_block if self.kern.col_block else 1

    @property
    def cols(self) -> int:
        """Output channels per block (the tile's columns in each group)."""
        return self.kern.col_block or self.kern.nr

    @property
    def name(self) -> str:
        clip = f"_{self.clip[0]:g}to{self.clip[1]:g}" if self.kern.epilogue.act == "clip" else ""
        return (f"{self.kern.name}{clip}_conv_q{self.nb}_k{self.kh}x{self.kw}_c{self.bi}"
                f"_s{self.sw}_d{self.dh}x{self.dw}")

    @property
    def window(self) -> tuple[int, int]:
        """Input rows and columns one tile reads: (KH-1)*DH + 1 and (MR-1)*SW + (KW-1)*DW + 1
        (not MR*SW + KW - 1, which over-counts by SW - 1)."""
        return (self.kh - 1) * self.dh + 1, (self.kern.mr - 1) * self.sw + (self.kw - 1) * self.dw + 1

    def reduce_axes(self) -> list[tuple[str, int]]:
        return reduce_axes(self.nb, self.kh, self.kw, self.bi)

    def free_loops(self) -> list[tuple[str, int]]:
        """(name, extent) of the tile's spatial loops, outer to inner, as TIR keeps them: the
        output block g and the pixel m only where they exceed 1, the column j always. The
        schedule tensorizes at the outermost of them."""
        return [(n, e) for n, e in (("g", self.groups), ("m", self.kern.mr), ("j", self.cols)) if e > 1 or n == "j"]

    def a_index(self, v: dict) -> tuple[str, str, str, str]:
        """Index expressions (q, row, column, channel) into the input window.

        `v` maps "m", "q", "r", "s", "i" to the expression text of each iterator; an axis that
        is absent from reduce_axes() has no iterator and contributes 0.
        """
        get = lambda k: v.get(k, "0")  # noqa: E731
        return (get("q"), f"{get('r')} * {self.dh}", f"{get('m')} * {self.sw} + {get('s')} * {self.dw}", get("i"))

    def b_index(self, v: dict) -> tuple[str, ...]:
        get = lambda k: v.get(k, "0")  # noqa: E731
        return (get("q"), get("r"), get("s"), get("i"), v["j"])

    def grouped(self, *idx: str, row: bool = False) -> str:
        """Index text of an operand with a leading block axis when the tile spans several (and,
        for C and R, the output row's unit axis after it)."""
        lead = (("vg", "0") if row else ("vg",)) if self.groups > 1 else ()
        return ", ".join(lead + idx)


def _frame(tile: ConvTile, stride) -> list[str]:
    mr, cb, G = tile.kern.mr, tile.cols, tile.groups
    ep = tile.kern.epilogue
    ah, aw = tile.window
    lead = (G,) if G > 1 else ()  # the block axis of a tile spanning several output blocks
    # Across blocks, C and R keep the output's row axis (extent 1) between the block and the
    # pixels: tensorize matches a buffer to the trailing axes of the workload's region, and
    # only axes in front of all of them may be dropped.
    c_shape = (G, 1, mr, cb) if G > 1 else (mr, cb)

    def rows(s: str) -> str:  # C and R: (blocks,) rows, columns; a block a whole output plane from the next
        return f"[{stride(s + 'g')}, {stride(s + 'y')}, {stride(s)}, 1]" if G > 1 else f"[{stride(s)}, 1]"

    return frame([
        # Pixels of a row are `bi` apart (NCHWc), which lets the kernel run (s, i) as one stretch.
        Operand("a", "A", (tile.nb, ah, aw, tile.bi), strides=f"[{stride('s1')}, {stride('s2')}, {tile.bi}, 1]"),
        # B is compact within a block: the kernel walks the weights of the reduction as one run.
        # A second block's weights follow the first's whole reduction (OIHWio), which is further
        # than this tile's part when the reduction is cut into chunks: a stride of its own.
        Operand("b", "B", lead + (tile.nb, tile.kh, tile.kw, tile.bi, cb),
                strides=f"[{stride('sbg')}, {tile.kh * tile.kw * tile.bi * cb}, {tile.kw * tile.bi * cb}, "
                        f"{tile.bi * cb}, {cb}, 1]" if G > 1 else None),
        *([Operand("bias", "Bias", lead + (cb,))] if ep.bias else []),
        *([Operand("r", "R", c_shape, strides=rows("sr"))] if ep.residual else []),
        Operand("c", "C", c_shape, strides=rows("sc")),
    ])


def description(tile: ConvTile) -> str:
    # Text, not a @T.prim_func factory: which reduction loops exist (and so how many names a
    # grid binds) depends on the geometry, and the element body is `element_body`'s text, the
    # one spelling the schedule's blocks are built from too.
    ep, axes, mr = tile.kern.epilogue, tile.reduce_axes(), tile.kern.mr
    # One pixel (a row one pixel wide: a conv on a 1x1 map is a GEMV): no m loop, C's row 0.
    v = {n: n for n, _ in axes} | ({"m": "vm"} if mr > 1 else {}) | {"j": "vj"}
    loops, extents = [n for n, _ in tile.free_loops()], [e for _, e in tile.free_loops()]
    iters = ", ".join(f"v{n}" for n in loops)
    vm = "vm" if mr > 1 else "0"
    lines = _frame(tile, free_stride) + [
        f"        for {', '.join(loops)} in T.grid({', '.join(str(e) for e in extents)}):",
        "            with T.sblock('update'):",
        f"                {iters} = T.axis.remap('{'S' * len(loops)}', [{', '.join(loops)}])",
    ]
    lines += element_body(f"C[{tile.grouped(vm, 'vj', row=True)}]", f"A[{', '.join(tile.a_index(v))}]",
                          f"B[{tile.grouped(*tile.b_index(v))}]", axes, " " * 16,
                          f"Bias[{tile.grouped('vj')}]" if ep.bias else None,
                          f"R[{tile.grouped(vm, 'vj', row=True)}]" if ep.residual else None, ep.act, tile.clip,
                          init=not tile.kern.accumulate)
    return template(lines)


def implementation(tile: ConvTile) -> str:
    """One call of the kernel for the whole reduction."""
    ep, G, bi, cb = tile.kern.epilogue, tile.groups, tile.bi, tile.cols
    # (s, i) are one contiguous run when dw == 1: the kernel's K loop then covers kw*bi
    # steps in one go instead of kw runs of bi.
    k_run, n3, sa3 = (tile.kw * bi, 1, 0) if tile.dw == 1 else (bi, tile.kw, bi * tile.dw)
    extra = (", sbg, scg" if G > 1 else "") + (", Bias.access_ptr('r')" if ep.bias else "") \
        + ((", R.access_ptr('r'), sr" + (", srg" if G > 1 else "")) if ep.residual else "") \
        + (f", {f32(tile.clip[0])}, {f32(tile.clip[1])}" if ep.act == "clip" else "")
    return implementation_text(functools.partial(_frame, tile), [
        f"            T.evaluate(T.call_extern('void', '{tile.kern.name}', A.access_ptr('r'), {bi * tile.sw},"
        f" B.access_ptr('r'), {cb}, C.access_ptr('w'), sc, {k_run}, {tile.nb}, s1, {tile.kh}, s2 * {tile.dh},"
        f" {n3}, {sa3}{extra}))",
    ])


@functools.lru_cache(maxsize=None)
def register_conv(tile: ConvTile) -> str:
    """Register (once) the intrinsic for one conv tile geometry; return its name.

    Tiles that differ only in the input-channel blocks they reduce over (DenseNet-121's 1x1
    layers: 72 of its 144) share one parse: the text is rendered with templates.SYMBOL for nb
    and specialized to each (a single block has no q loop, so another text)."""
    ir = tile.kern.llvm_ir()
    if tile.nb == 1:
        return register_text(tile.name, description(tile), implementation(tile), ir)
    model = dataclasses.replace(tile, nb=SYMBOL)
    return registry.register(tile.name, specialized(description(model), tile.nb),
                             specialized(implementation(model), tile.nb, kernel_ir=ir))
