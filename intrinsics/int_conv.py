"""TensorIntrins for one output tile of a spatially packed integer convolution on an integer tile:
a NEON MAC tile (microkernels.int_mac) or an x86 one (microkernels.int_gemm).

Description, for an MR x NR output tile (MR output pixels of one row, NR output channels):
    C[m, j] += sum over (r, s, i) of int32(A[r*dh, m*sw + s*dw, i]) * int32(B[r, s, i, j])
A is a window of the packed input (rows, columns, the group's channels i, zero point already
subtracted), B the tile's weights (KH, KW, channels, NR), C a row of the int32 output.
On a kernel that takes B in groups of G k (sdot and vpdpbusd: 4, vpmaddwd: 2) the channels go
in groups, i = G*q + t, and B is (KH, KW, C/G, NR, G). A and B have the kernel's own dtypes
(uint8 A with int8 B on VNNI).
C accumulates: the schedule zeroes it in an init block, and the implementation calls the kernel
once per kernel row r, or, for a batch-reduce kernel (the AMX tiles), once for all of them. That
one call is the tile's whole reduction, so a batch-reduce kernel may be beta=0 (it overwrites C):
the schedule then drops the dead zeroing (intrinsics.beta0). With dw = 1 the columns of a row (s, i) lie back to back in A, so one
call covers KW * channels values of K; with dilation it is one call per (r, s).

With a row pitch P (`pitch`, stride 1, no dilation), the rows of the packed input are P pixels
apart in one flat run and A is that run, (pixels, channels): kernel row r starts r*P pixels on,
so the tile's MR pixels may cross from one output row into the next (the schedule packs the
padded rows back to back and drops the columns past each row's end when it stores). One layout
serves every row, so a tile is as tall as the kernel allows, not as the output row is wide.

Loops of extent 1 are left out of the description, as in `f32_conv`, so the TVMScript is
rendered per geometry and `reduce_axes` decides which loops exist for schedule and intrinsic.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from microkernels import TileError
from microkernels.int_amx import AmxGemmKernel
from microkernels.int_gemm import IntGemmKernel
from microkernels.int_mac import MacKernel
from microkernels.isa import normalize_ints, positive_int

from .templates import (
    Operand,
    frame,
    free_stride,
    implementation_text,
    register_text,
    template,
)


def reduce_axes(kh: int, kw: int, ci: int, group: int = 1) -> list[tuple[str, int]]:
    """(name, extent) of the tile's reduction loops, outer to inner, without unit extents:
    kernel row r, kernel column s, channel i (in groups of G > 1: group q and t within it)."""
    chans = (("q", ci // group), ("t", group)) if group > 1 else (("i", ci),)
    return [(n, e) for n, e in (("r", kh), ("s", kw), *chans) if e > 1]


@dataclass(frozen=True)
class IntConvTile:
    kern: MacKernel | IntGemmKernel | AmxGemmKernel
    kh: int
    kw: int
    ci: int  # packed channels of a group: the pixel stride of A
    sw: int = 1
    dh: int = 1
    dw: int = 1
    pitch: int = 0  # > 0: A is the flat run of packed rows, this many pixels apart (stride 1)

    def __post_init__(self):
        normalize_ints(self, ("kh", "kw", "ci", "sw", "dh", "dw"), TileError)
        object.__setattr__(self, "pitch", positive_int("pitch", self.pitch, TileError, minimum=0))
        if self.pitch and (self.sw, self.dh, self.dw) != (1, 1, 1):
            raise TileError("a pitched (flat-row) tile takes stride 1 without dilation")
        if self.pitch and not self.kern.batch_reduce:
            raise TileError(f"{self.kern.name}: a pitched tile needs a batch-reduce kernel (one call, every row)")
        if self.pitch and self.pitch < self.kw:
            raise TileError(f"row pitch {self.pitch} is shorter than the kernel's {self.kw} columns")
        if self.ci % self.kern.group:
            raise TileError(f"{self.kern.name} takes channels in groups of {self.kern.group}; ci={self.ci} is not a multiple")
        if self.kern.mr < 2:
            raise TileError(f"MR must be >= 2 for a conv tile, got {self.kern.mr} (a unit loop cannot match)")
        if self.k_run % self.kern.k_step:
            raise TileError(f"one kernel call covers {self.k_run} values of K, not a multiple of "
                            f"{self.kern.name}'s step {self.kern.k_step}; pad the channels")
        if not self.kern.accumulate and not self.kern.batch_reduce:
            raise TileError(f"{self.kern.name}: a conv tile accumulates over its calls (one per kernel row); "
                            "use the accumulating kernel")

    @property
    def group(self) -> int:
        """k per group of packed B: 4 for sdot and vpdpbusd, 2 for vpmaddwd, 1 for the NEON MACs."""
        return self.kern.group

    @property
    def k_run(self) -> int:
        """K of one kernel call: a whole kernel row when dw = 1, one column otherwise."""
        return self.kw * self.ci if self.dw == 1 else self.ci

    @property
    def name(self) -> str:
        pitch = f"_p{self.pitch}" if self.pitch else ""
        return f"{self.kern.name}_conv_k{self.kh}x{self.kw}_c{self.ci}_s{self.sw}_d{self.dh}x{self.dw}{pitch}"

    @property
    def window(self) -> tuple[int, ...]:
        """Input rows and columns one tile reads; with a pitch, the pixels of the flat run."""
        if self.pitch:
            return ((self.kh - 1) * self.pitch + self.kern.mr + self.kw - 1,)
        return (self.kh - 1) * self.dh + 1, (self.kern.mr - 1) * self.sw + (self.kw - 1) * self.dw + 1

    def reduce_axes(self) -> list[tuple[str, int]]:
        return reduce_axes(self.kh, self.kw, self.ci, self.group)

    def channel(self, v: dict) -> str:
        if self.group == 1:
            return v.get("i", "0")
        return f"{v['q']} * {self.group} + {v['t']}" if "q" in v else v["t"]

    def a_index(self, v: dict) -> tuple[str, str, str]:
        """Index expressions (row, column, channel) into the window; `v` maps "m", "r", "s", "i" to
        iterator text, and an axis absent from reduce_axes() contributes 0."""
        get = lambda k: v.get(k, "0")  # noqa: E731
        if self.pitch:  # (pixel of the flat run, channel)
            return f"{get('r')} * {self.pitch} + {get('m')} + {get('s')}", self.channel(v)
        return f"{get('r')} * {self.dh}", f"{get('m')} * {self.sw} + {get('s')} * {self.dw}", self.channel(v)

    def b_index(self, v: dict) -> tuple[str, ...]:
        get = lambda k: v.get(k, "0")  # noqa: E731
        if self.group > 1:
            return get("r"), get("s"), get("q"), v["j"], v["t"]
        return get("r"), get("s"), get("i"), v["j"]

    @property
    def b_shape(self) -> tuple:
        nr = self.kern.nr
        g = self.group
        return (self.kh, self.kw, self.ci // g, nr, g) if g > 1 else (self.kh, self.kw, self.ci, nr)


def _frame(tile: IntConvTile, stride) -> list[str]:
    at, bt, ci = tile.kern.a_dtype, tile.kern.b_dtype, tile.ci
    # Pixels are `ci` apart in A, a constant in description and implementation alike: that
    # is what makes (s, i) one run.
    a = (Operand("a", "A", (*tile.window, ci), at, f"[{ci}, 1]") if tile.pitch else
         Operand("a", "A", (*tile.window, ci), at, f"[{stride('s1')}, {ci}, 1]"))
    return frame(reads_output=tile.kern.accumulate, operands=[
        a,
        Operand("b", "B", tile.b_shape, bt),
        Operand("c", "C", (tile.kern.mr, tile.kern.nr), "int32", f"[{stride('sc')}, 1]"),
    ])


def description(tile: IntConvTile) -> str:
    # Text, as f32_conv's: the grid binds a name per reduction loop, and which loops exist
    # depends on the geometry.
    names = [n for n, _ in tile.reduce_axes()]
    v = {n: f"v{n}" for n in ["m", "j"] + names}
    a_idx, b_idx = ", ".join(tile.a_index(v)), ", ".join(tile.b_index(v))
    loop_vars = ", ".join(["m", "j"] + names)
    extents = ", ".join(str(e) for e in [tile.kern.mr, tile.kern.nr] + [e for _, e in tile.reduce_axes()])
    return template(_frame(tile, free_stride) + [
        f"        for {loop_vars} in T.grid({extents}):",
        "            with T.sblock('update'):",
        f"                {', '.join(v[n] for n in ['m', 'j'] + names)} = "
        f"T.axis.remap('SS{'R' * len(names)}', [{loop_vars}])",
        # beta=0: the reduction with its init, as the workload's block is before tensorize (the
        # reads spelled out: TIR lists C among a reduction block's reads)
        *([] if tile.kern.accumulate else [
            f"                T.reads(C[vm, vj], A[{a_idx}], B[{b_idx}])", "                T.writes(C[vm, vj])",
            "                with T.init():", "                    C[vm, vj] = 0"]),
        f"                C[vm, vj] = C[vm, vj] + T.Cast('int32', A[{a_idx}]) * T.Cast('int32', B[{b_idx}])",
    ])


def implementation(tile: IntConvTile) -> str:
    """The kernel called once per kernel row (per tap with dilation along the width), or once
    with those rows (taps) as its batch when it is a batch-reduce kernel."""
    nr, ci = tile.kern.nr, tile.ci
    if tile.kern.batch_reduce:
        # The batch walks the rows (n1) and, with dilation, the taps of a row (n2); the B panels
        # follow each other in that order, as the weights are packed (KH, KW, C/G, NR, G).
        n2, sa2 = (1, 0) if tile.dw == 1 else (tile.kw, tile.dw * ci)
        row = f"{tile.pitch * ci}" if tile.pitch else f"{tile.dh} * s1"
        return implementation_text(functools.partial(_frame, tile), [
            f"            T.evaluate(T.call_extern('void', '{tile.kern.name}', A.access_ptr('r'), {tile.sw * ci},"
            f" B.access_ptr('r'), {tile.group * nr}, C.access_ptr('w'), sc, {tile.k_run}, {tile.kh},"
            f" {row}, {n2}, {sa2}, 1, 0))",
        ])
    calls = [("r", tile.kh)] + ([] if tile.dw == 1 else [("s", tile.kw)])
    a_off = f"r * {tile.dh} * s1" + ("" if tile.dw == 1 else f" + s * {tile.dw * ci}")
    b_off = f"r * {tile.kw * ci * nr}" + ("" if tile.dw == 1 else f" + s * {ci * nr}")
    return implementation_text(functools.partial(_frame, tile), [
        f"            for {', '.join(n for n, _ in calls)} in T.grid({', '.join(str(e) for _, e in calls)}):",
        f"                T.evaluate(T.call_extern('void', '{tile.kern.name}', A.access_ptr('r', offset={a_off}),"
        f" {tile.sw * ci}, B.access_ptr('r', offset={b_off}), {tile.group * nr}, C.access_ptr('w'), sc,"
        f" {tile.k_run}))",
    ])


def thread_setup(kern, indent: str) -> tuple[list[str], list[str], dict]:
    """What a schedule puts around a run of `kern`'s calls on one thread: (statements before,
    statements after, names they refer to, for the parser). AMX tiles: the tile configuration
    and its release (microkernels.int_amx), each an opaque block that imports the kernel's IR;
    other kernels need nothing."""
    if not isinstance(kern, AmxGemmKernel):
        return [], [], {}

    def block(name: str, symbol: str) -> list[str]:
        return [f"{indent}with T.sblock('{name}'):", f"{indent}    T.reads()", f"{indent}    T.writes()",
                f"{indent}    with T.attr(0, 'pragma_import_llvm', amx_ir):",
                f"{indent}        T.evaluate(T.call_extern('void', '{symbol}'))"]

    return (block("tile_config", kern.config_symbol), block("tile_release", kern.release_symbol),
            {"amx_ir": kern.llvm_ir()})


@functools.lru_cache(maxsize=None)
def register_int_conv(tile: IntConvTile) -> str:
    """Register (once) the intrinsic for one conv tile geometry; return its name."""
    return register_text(tile.name, description(tile), implementation(tile), tile.kern.llvm_ir())
