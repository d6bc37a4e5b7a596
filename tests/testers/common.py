"""What every tester shares: running a compiled module on the ISA it targets, the check that a
kernel wrote nothing but its output, and the GEMM tile's layout handling, which the FP32 and
integer families share."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import strategies as st

from intrinsics.tile_module import TileLayout, b_group, compile_tile
from microkernels import Isa
from schedules.emulation import qemu as emulate

from ..arm_tools import require_emulator
from ..x86_exec import compile_target
from ..x86_exec import execute as execute_x86


def execute(lib, isa: Isa, args: list[np.ndarray], outputs: list[int]) -> list[np.ndarray]:
    """Call `lib`'s main on numpy `args` where `isa` runs: natively, on the Bochs CPU (x86 the
    host lacks) or under qemu (ARM); copies of args[k] for k in outputs afterwards."""
    if isa.arch == "x86":
        return execute_x86(lib, isa, args, outputs)
    require_emulator(isa.arch)
    return emulate.run(lib, isa.arch, args, outputs=outputs)


def assert_written_only(got: np.ndarray, before: np.ndarray, region, what: str = "tile") -> None:
    """Everything of `got` outside `region` (an index into it) is still as in `before`."""
    outside = np.ones(got.shape, bool)
    outside[region] = False
    assert np.array_equal(got[outside], before[outside]), f"the kernel wrote outside its {what}"


@st.composite
def layouts(draw, kern, k):
    """The tile at any offset inside larger buffers, every row stride its own; `k` draws K."""
    k = draw(k)
    pad = st.integers(0, 9)
    a_row, a_col, b_row, c_row, c_col = (draw(st.integers(0, 2)), draw(pad), draw(st.integers(0, 2)),
                                         draw(st.integers(0, 3)), draw(pad))
    g = b_group(kern)
    if g > 1:
        b_col = draw(st.integers(0, 3))  # in columns of G values: B's tile starts at G*b_col + groups
        ldb = g * (kern.nr + b_col + draw(st.integers(0, 3)))
    else:
        b_col = draw(pad)
        ldb = kern.nr + b_col + draw(pad)
    return TileLayout(k, k + a_col + draw(pad), ldb, kern.nr + c_col + draw(pad), a_row, a_col, b_row, b_col,
                      c_row, c_col)


class TileTester:
    """One GEMM tile, MR x NR x K, placed by a TileLayout (dense unless told otherwise). The
    family's subclass draws operands and states how close the tile must be to the reference."""

    def __init__(self, kern, k: int | None = None, layout: TileLayout | None = None):
        if (k is None) == (layout is None):
            raise TypeError("give K (a dense tile) or a layout")
        self.kern = kern
        self.layout = layout or TileLayout.dense(kern, k)

    def at(self, **fields) -> "TileTester":
        """The same tester with some layout fields changed (offsets, row strides)."""
        return type(self)(self.kern, layout=dataclasses.replace(self.layout, **fields))

    def shapes(self) -> tuple[tuple, tuple, tuple]:
        return self.layout.shapes(self.kern)

    def compile(self):
        return compile_tile(self.kern, self.layout, compile_target(self.kern.isa) if self.kern.isa.arch == "x86" else None)

    def run(self, a, b, c) -> np.ndarray:
        """C after one call of the tile on these operands (the arrays themselves are not written)."""
        got, = execute(self.compile(), self.kern.isa, [a, b, c], [2])
        return got

    def operand_tiles(self, a, b) -> tuple[np.ndarray, np.ndarray]:
        """The tile's A (MR x K) and B (K x NR), B unpacked from its groups of G k."""
        lay, mr, nr, k = self.layout, self.kern.mr, self.kern.nr, self.layout.k
        a_t = a[lay.a_row:lay.a_row + mr, lay.a_col:lay.a_col + k]
        g = b_group(self.kern)
        if g > 1:
            # B[q, j, t] is column j at k = G*q + t.
            b_t = b[lay.b_row:lay.b_row + k // g, lay.b_col:lay.b_col + nr, :].transpose(0, 2, 1).reshape(k, nr)
        else:
            b_t = b[lay.b_row:lay.b_row + k, lay.b_col:lay.b_col + nr]
        return a_t, b_t

    def check(self, a, b, c) -> np.ndarray:
        """Run the tile, check it against the reference and that nothing around it changed;
        return C for any further assertion."""
        got = self.run(a, b, c)
        rows, cols = self.layout.tile(self.kern)
        assert_written_only(got, c, (rows, cols))
        self.assert_tile(got[rows, cols], *self.operand_tiles(a, b), c[rows, cols])
        return got

    def assert_tile(self, got, a_t, b_t, c0) -> None:
        raise NotImplementedError
