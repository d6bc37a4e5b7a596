"""FP32 transposes of L x L tiles in registers, L the ISA's lanes (16 on AVX-512, 8 on AVX2):
the NCHW <-> NCHW16c layout conversions of the NCHW user paths.

In NCHW a channel's pixels are contiguous; in NCHW16c a pixel's 16 channels are. Converting
one into the other is a transpose of (channels x pixels) tiles. The compiled TIR transforms did
it with scalar loads that LLVM's SLP vectorizer turned into shuffles and measured 31-36 GB/s
on one Zen 5 thread; a tile loaded as L vectors, transposed in registers and stored as L
vectors moved 75-83 GB/s on the same layers (benchmarks: `bench conv2d --path bound|nchw`).

The transpose is the classic recursion, written as log2(L) stages of two-input shuffles: at
distance d (L/2, ..., 1) rows i and i + d (i without bit d) exchange the lanes with bit d set
of row i for the lanes with bit d clear of row i + d, which swaps the off-diagonal d x d blocks
of every 2d x 2d block. After the last stage row c holds column c. L log2(L) shuffles per tile
(64 on AVX-512, 24 on AVX2), LLVM picks the instructions (vunpck*, vshuf*, vperm*).

    void mk_f32_transpose_<L>x<L>_<isa>(ptr src, i32 src_row, i32 src_step,
                                         ptr dst, i32 dst_row, i32 dst_step, i32 n)
n tiles, one after the other: tile t reads row r (L contiguous floats) at src + t*src_step +
r*src_row and writes its column c (L contiguous floats) at dst + t*dst_step + c*dst_row.
Strides in floats; no alignment assumed (the NCHW side is the user's memory).
"""

from __future__ import annotations

from dataclasses import dataclass

from .isa import Isa


@dataclass(frozen=True)
class TransposeKernel:
    isa: Isa

    @property
    def lanes(self) -> int:
        return self.isa.lanes

    @property
    def name(self) -> str:
        return f"mk_f32_transpose_{self.lanes}x{self.lanes}_{self.isa.name}"

    @property
    def shuffles(self) -> int:
        """Two-input shuffles per tile in the IR: L per stage, log2(L) stages."""
        return self.lanes * (self.lanes.bit_length() - 1)

    def llvm_ir(self) -> str:
        return _generate(self)


def stage_masks(lanes: int, d: int) -> tuple[list[int], list[int]]:
    """The shufflevector masks of one stage at distance d: (new row i, new row i + d) from
    (row i, row i + d), indices >= lanes naming the second operand."""
    low = [j if not j & d else lanes + j - d for j in range(lanes)]
    high = [j + d if not j & d else lanes + j for j in range(lanes)]
    return low, high


def _generate(kern: TransposeKernel) -> str:
    n, vt = kern.lanes, kern.isa.vector_type
    out = [f"define internal void @{kern.name}(ptr noalias %src, i32 %src_row, i32 %src_step, ptr noalias %dst, "
           f"i32 %dst_row, i32 %dst_step, i32 %n) alwaysinline {{",
           "entry:",
           "  %sr = sext i32 %src_row to i64", "  %ss = sext i32 %src_step to i64",
           "  %dr = sext i32 %dst_row to i64", "  %ds = sext i32 %dst_step to i64", "  %n64 = sext i32 %n to i64",
           "  %any = icmp sgt i64 %n64, 0",
           "  br i1 %any, label %tile, label %exit",
           "tile:",
           "  %t = phi i64 [0, %entry], [%tn, %tile]",
           "  %so = mul i64 %t, %ss", "  %do = mul i64 %t, %ds"]
    rows = []
    for r in range(n):
        out += [f"  %sro{r} = mul i64 %sr, {r}", f"  %sa{r} = add i64 %so, %sro{r}",
                f"  %sp{r} = getelementptr inbounds float, ptr %src, i64 %sa{r}",
                f"  %r{r}_0 = load {vt}, ptr %sp{r}, align 4"]
        rows.append(f"%r{r}_0")
    d, stage = n // 2, 0
    while d:
        stage += 1
        low, high = stage_masks(n, d)
        new = list(rows)
        for i in range(n):
            if i & d:
                continue
            for row, mask in ((i, low), (i + d, high)):
                m = ", ".join(f"i32 {x}" for x in mask)
                out.append(f"  %r{row}_{stage} = shufflevector {vt} {rows[i]}, {vt} {rows[i + d]}, <{n} x i32> <{m}>")
                new[row] = f"%r{row}_{stage}"
        rows, d = new, d // 2
    for c in range(n):
        out += [f"  %dro{c} = mul i64 %dr, {c}", f"  %da{c} = add i64 %do, %dro{c}",
                f"  %dp{c} = getelementptr inbounds float, ptr %dst, i64 %da{c}",
                f"  store {vt} {rows[c]}, ptr %dp{c}, align 4"]
    out += ["  %tn = add nuw nsw i64 %t, 1", "  %more = icmp slt i64 %tn, %n64",
            "  br i1 %more, label %tile, label %exit", "exit:", "  ret void", "}", ""]
    return "\n".join(out)
