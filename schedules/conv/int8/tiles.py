"""The integer conv tiles of every ISA, in one place (BLIS's per-architecture cntx_init): which
tile a layer runs on, its K step and operand dtypes (read off the kernel, microkernels/), how
its MR x NR is chosen, and how long a reduction its int32 sums keep exact. Every planner of the
int8 family reads `ARM_TILES` / `X86_TILES` through `conv_kernel` and `exact_bound`; nothing
else in the family names an ISA's tile.

    ISA         8-bit tile (A x B)               K step  int16 data, depthwise  MR x NR          exact while K <=
    neon        vmlal.s16, int16 x int16         4       neon                   DEFAULT_TILES    33025 (MAX_K)
    aarch64     smlal, int16 x int16             8       aarch64                DEFAULT_TILES    33025
    aarch64dot  sdot, int8 x int8 (expansion)    16      aarch64                DEFAULT_TILES    32767 (MAX_K_DOT)
    avx2        vpmaddwd, int16 x int16 (upcast) 2       avx2                   x86_tile         33025
    avx512      vpmaddwd, int16 x int16 (upcast) 2       avx512                 x86_tile         33025
    (pairs)     vpmaddubsw, uint8 x int8         4       (as above)             x86_tile         16448
                (AVX2 / AVX-512 layers whose weight pairs the bound admits: int8.pairs_fit)
    avxvnni     vpdpbusd, uint8 x int8           4       avx2                   x86_tile         16448 (MAX_K_VNNI)
    avx512vnni  vpdpbusd, uint8 x int8           4       avx512                 x86_tile         16448
    amxint8     tdpbusd, uint8 x int8            64      avx512                 amx_tile, or the avx512vnni tile
                                                                                                  16448
(`python -c "from schedules.conv.int8 import tiles; print(tiles.table())"` prints it from the entries.)
"""

from __future__ import annotations

from dataclasses import dataclass

from microkernels import AARCH64, AARCH64_DOT, AMX_INT8, ARM_ISAS, AVX2, AVX512, AVX512_VNNI, AVX_VNNI, NEON
from microkernels import X86_INT_ISAS, Isa
from microkernels.int_amx import K_DEPTH, TILE_ROWS, AmxGemmKernel, amx_tiles
from microkernels.int_gemm import DEFAULT_PAIR_TILES, DEFAULT_TILES, PAIR_OPS, IntGemmKernel
from microkernels.int_gemm import max_tiles as x86_int_tiles
from microkernels.int_mac import default_mac_kernel

from ...common.tir import ceil_to
from ..geometry import Geometry

# |x - zp_x| and |w - zp_w| are at most 255 for 8-bit data, so each product is at most 65025 in
# magnitude, and a sum of K of them is exact in int32 while K * 65025 <= 2**31 - 1.
MAX_PRODUCT = 255 * 255
MAX_K = (2**31 - 1) // MAX_PRODUCT  # 33025
# The sdot expansion adds four terms, each at most 128 * 128 * K in magnitude (the bias two of them):
# every partial sum is exact while 4 * 16384 * K <= 2**31 - 1.
MAX_K_DOT = (2**31 - 1) // (4 * 128 * 128)  # 32767
# vpdpbusd's uint8 x int8 terms are at most 255 * 128 each; four such sums (data x weights, the
# window sums times zp_w, the bias's two) stay exact while 4 * 32640 * K <= 2**31 - 1.
MAX_K_VNNI = (2**31 - 1) // (4 * 255 * 128)  # 16448
SDOT_BOUND = "sdot expansion (four terms, each up to 128*128*K)"
VNNI_BOUND = "vpdpbusd expansion (four terms, each up to 255*128*K)"
AMX_BOUND = "tdpbusd expansion (four terms, each up to 255*128*K)"  # uint8 x int8 as vpdpbusd
PAIRS_BOUND = "vpmaddubsw expansion (four terms, each up to 255*128*K)"  # uint8 x int8 as vpdpbusd


@dataclass(frozen=True)
class IsaTiles:
    """One ISA's integer conv tiles. instruction: what the 8-bit GEMM tile multiplies with;
    int16: the ISA whose tile takes int16 (legalized) data and depthwise layers, which the 8-bit
    tile does not (its own where it multiplies int16); shape: how MR x NR is chosen ("default":
    the kernel family's DEFAULT_TILES; "cost": x86_tile's cost model for the layer; "amx":
    amx_tile, or the `fallback` ISA's tile for the layers it passes over); max_k, bound: the
    longest reduction the tile's int32 sums keep exact (MAX_K for every tile, a zero-point
    expansion's own bound on the raw-8-bit tiles, and what that bound is of)."""

    instruction: str
    int16: Isa
    shape: str
    max_k: int = MAX_K
    bound: str = ""
    fallback: Isa | None = None


ARM_TILES = {
    NEON.name: IsaTiles("vmlal.s16 on x - zp_x and w - zp_w as int16", NEON, "default"),
    AARCH64.name: IsaTiles("smlal on x - zp_x and w - zp_w as int16", AARCH64, "default"),
    AARCH64_DOT.name: IsaTiles("sdot on int8 as it is, zero points through the expansion", AARCH64, "default",
                               MAX_K_DOT, SDOT_BOUND),
}
X86_TILES = {
    AVX2.name: IsaTiles("vpmaddwd on x - zp_x and w - zp_w packed as int16 (the upcast)", AVX2, "cost"),
    AVX512.name: IsaTiles("vpmaddwd on x - zp_x and w - zp_w packed as int16 (the upcast)", AVX512, "cost"),
    AVX_VNNI.name: IsaTiles("vpdpbusd on uint8 x int8 as they are", AVX2, "cost", MAX_K_VNNI, VNNI_BOUND),
    AVX512_VNNI.name: IsaTiles("vpdpbusd on uint8 x int8 as they are", AVX512, "cost", MAX_K_VNNI, VNNI_BOUND),
    AMX_INT8.name: IsaTiles("tdpbusd on uint8 x int8 as they are", AVX512, "amx", MAX_K_VNNI, AMX_BOUND,
                            fallback=AVX512_VNNI),
}
TILES = {**ARM_TILES, **X86_TILES}
assert set(ARM_TILES) == set(ARM_ISAS) and set(X86_TILES) == {*X86_INT_ISAS, AMX_INT8.name}


def takes_pairs(isa: Isa, dtype: str, depthwise: bool) -> bool:
    """Whether a layer whose weights fit the pair bound (int8.pairs_fit) runs on the vpmaddubsw
    pairs tile: 8-bit GEMM layers on the ISAs without VNNI that have it (AVX2, AVX-512BW), where
    it multiplies at 1.3x the upcast's rate on half the bytes. VNNI multiplies any weights
    exactly; int16 data and depthwise layers take the int16 tile."""
    return isa.name in PAIR_OPS and dtype != "int16" and not depthwise


def conv_kernel(isa: Isa, dtype: str = "int8", depthwise: bool = False, g: Geometry | None = None,
                pitched: bool = False, pairs: bool = False):
    """The tile a conv runs on, as the ISA's entry says: int16 data and depthwise layers on its
    `int16` ISA's tile (on the dotprod core, AArch64's s16 MAC: sdot cannot take int16, and a
    depthwise layer's channels-in-lanes path is an s16 MAC), shaped for the layer `g`; AMX's
    tiles where the layer's channels pad to whole 64-deep K steps cheaply (amx_tile; `pitched`:
    for tiles over the flat run of rows, Int8Plan.pitch), else its fallback's (AVX-512 VNNI).
    pairs: the layer's weights fit the pair bound (PAIR_BOUND); where `takes_pairs`, the
    vpmaddubsw tile instead of the upcast. The x86 GEMM tiles prefetch the next call's weights
    (IntGemmKernel.prefetch): a network's weights come from memory."""
    tiles = TILES[isa.name]
    if pairs and takes_pairs(isa, dtype, depthwise):
        return IntGemmKernel(isa, *x86_tile(isa, g, pairs=True), pairs=True, prefetch=True)
    if dtype == "int16" or depthwise:
        isa = tiles.int16
        tiles = TILES[isa.name]
    if tiles.shape == "default":
        return default_mac_kernel(isa.name)
    if tiles.shape == "amx":
        amx = amx_tile(g, pitched)
        if amx is not None:
            return AmxGemmKernel(*amx, accumulate=False)
        isa = tiles.fallback
    mr, nr = x86_tile(isa, g)
    return IntGemmKernel(isa, mr, nr, prefetch=True)


def exact_bound(kern) -> tuple[int, str]:
    """(the longest reduction `kern`'s int32 sums keep exact beyond MAX_K's, what bounds it), or
    (MAX_K, "") for the tiles that MAX_K alone bounds."""
    if getattr(kern, "pairs", False):
        return MAX_K_VNNI, PAIRS_BOUND
    tiles = TILES[kern.isa.name]
    return tiles.max_k, tiles.bound


def table() -> str:
    """The entries as a table: ISA, instruction, K step and operand dtypes of its 8-bit tile, the
    int16 ISA, how MR x NR is chosen, the exactness bound."""
    rows = []
    for name, t in TILES.items():
        isa = next(i for i in (*ARM_ISAS.values(), *X86_INT_ISAS.values(), AMX_INT8) if i.name == name)
        kern = conv_kernel(isa, "int8", False, None) if t.shape != "amx" else AmxGemmKernel(*amx_tiles()[0])
        rows.append(f"{name:<11} {t.instruction:<64} K step {kern.k_step:<3} {kern.a_dtype} x {kern.b_dtype:<6} "
                    f"int16: {t.int16.name:<8} {t.shape:<8} K <= {t.max_k}")
    return "\n".join(rows)


# Channels padded to whole 64-deep K steps for the AMX tiles: beyond this factor of the layer's
# own, the padded MACs cost more than AMX's advantage over the VNNI tile (5.4x at the tiles' L1 rates) gives back
# once the pack's extra bytes are counted; MobileNet's 16- to 32-channel layers stay on VNNI.
AMX_MAX_PADDING = 1.5


def amx_padded_channels(g: Geometry) -> int:
    """Channels per group padded so one kernel call's K (a kernel row's KW * C, or a tap's C with
    dilation) is a whole number of 64-deep tdpbusd steps."""
    span = g.kw if g.dilation[1] == 1 else 1
    cp = ceil_to(g.cg, 4)
    while (span * cp) % K_DEPTH:
        cp += 4
    return cp


def flat_rows(g: Geometry) -> bool:
    """Whether a layer's output rows are tiled as one flat run over its padded input rows
    (Int8Plan.pitch): stride 1, no dilation, a kernel of more than one row, and output rows
    narrower than two full A tiles (32 pixels), which no tile of its own rows fills. Wider rows
    fill 2 x 2 tiles of 14 or more rows already, and there the flat run measured 5% slower (56
    and 28 pixels, Xeon with AMX): it computes the padding columns too, and its store divides."""
    return g.stride == (1, 1) and g.dilation == (1, 1) and g.kh > 1 and g.out_hw[1] < 2 * TILE_ROWS


def amx_tile(g: Geometry | None, pitched: bool = False) -> tuple[int, int, int] | None:
    """(rows, A tiles, B tiles) of the AMX tile for a layer, or None where the VNNI tile suits it
    better (channel padding beyond AMX_MAX_PADDING, or no layer given). Of the shapes the eight tile
    registers allow, the fewest cycles per useful output: a K step issues A*B tdpbusd, each about
    6 + 0.625 * rows cycles (16 at 16 rows, 11 at 8: measured on a Xeon with AMX), against A+B tile
    loads of about 8 cycles each; times the padding of the row (to whole MR) and of the group's
    output channels (to whole NR). Ties: the most C tiles. `pitched`: the row is the flat run of
    OH x pitch positions (Int8Plan.pitch)."""
    if g is None or amx_padded_channels(g) > AMX_MAX_PADDING * g.cg:
        return None
    ow, og = g.out_hw[1], g.og
    if pitched:
        ow = g.out_hw[0] * (g.w + g.pad[1] + g.pad[3])

    def cost(t):
        rows, a, b = t
        cycles = max(a * b * (6 + 0.625 * rows), 8 * (a + b))
        waste = ceil_to(ow, a * rows) / ow * ceil_to(og, 16 * b) / og
        return round(cycles / (a * rows * b) * waste, 3), -a * b, -rows

    return min((t for t in amx_tiles() if 16 * t[2] <= ceil_to(og, 16)), key=cost)


def x86_tile(isa: Isa, g: Geometry | None, pairs: bool = False) -> tuple[int, int]:
    """(MR, NR) for a layer: of the tiles the register budget allows (MR <= 16), the one with the
    fewest cycles per useful output: a K step issues MR * NR/lanes multiplies and MR broadcasts
    of A plus NR/lanes rows of B, two multiplies and two loads per cycle on the cores we know, a
    row of B counting as two loads (the tile's B panel, K x NR, is past the L1 on most layers and
    comes from L2 on every tile of pixels, about a vector per cycle), so it takes
    max(multiplies, loads) / 2; times the padding of the output row (to whole MR) and of the
    group's output channels (to whole NR). Ties: the most accumulators. With B's rows counted
    once, 16-register tiles (AVX2, AVX-VNNI) took 2 x 32, four rows of B per two pixels, which
    left ResNet-50's 3x3 layers L2-bound on a Zen 3 (64x56x56 3x3: 2.88 ms on 2 x 32, 1.77 on
    4 x 16); the 32-register tiles (14 x 32, 7 x 32) are multiply-bound either way.
    pairs: the vpmaddubsw tile, two multiplies per accumulator and K step (its own register
    budget; DEFAULT_PAIR_TILES without a layer)."""
    if g is None:
        return DEFAULT_PAIR_TILES[isa.name] if pairs else DEFAULT_TILES[isa.name]
    ow, og = g.out_hw[1], g.og
    cands = [(mr, nr) for mr, nr in x86_int_tiles(isa, 4 * isa.lanes, pairs)
             if mr <= 16 and nr <= ceil_to(og, isa.lanes)]
    muls = 2 if pairs else 1

    def cost(t):
        mr, nr = t
        nv = nr // isa.lanes
        step = max(muls * mr * nv, mr + 2 * nv) / (mr * nv)
        waste = ceil_to(ow, mr) / ow * ceil_to(og, nr) / og
        if pairs:  # multiply-bound alike: then the fewest loads per accumulator (4 x 16 over 2 x 32: 1.4%
            # faster over ResNet-50's 1x1 and strided layers, 17% on 128 x 56 x 56 3x3 stride 2, Zen 3)
            return round(step * waste, 3), (mr + 2 * nv) / (mr * nv), -nr
        return round(step * waste, 3), -mr * nr, -nr

    return min(cands, key=cost)


FLAT_ROW_MAX = 256  # pixels per row of a flattened layer (flat_row)


def flat_row(pixels: int) -> int:
    """Pixels per row when `pixels` consecutive ones are tiled as rows (flat_geometry,
    subsampled): all of them up to FLAT_ROW_MAX, else the longest row up to that which divides
    them and takes whole 16- or 28-pixel tiles (56 x 56: 14 rows of 224). Rows rather than one
    long row give the threads rows of their own (Int8Plan.rows_outer)."""
    if pixels <= FLAT_ROW_MAX:
        return pixels
    rows = [d for d in range(16, FLAT_ROW_MAX + 1) if pixels % d == 0 and (d % 16 == 0 or d % 28 == 0)]
    return max(rows) if rows else pixels
