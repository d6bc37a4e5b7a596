"""FP32 conv2d, NCHWc direct, tensorized on the batch-reduce GEMM tile.

One output tile is MR pixels of an output row x NR output channels (one output block). Its
whole reduction (input-channel blocks x KH x KW x channels of a block) runs inside one call of
the batch-reduce kernel, so each output tile is stored once and never reloaded.

Loop nest, outer to inner:
    n, band     : VH output rows; the band's input rows (halo and zero padding included) are
                  packed into a small buffer first when the layer pads, so what the tiles read
                  stays in L2 (per-segment spatial packing). The window a band needs is
                  KH + SH*(VH-1) rows tall (dilated: (KH-1)*DH + 1 + SH*(VH-1)).
    o           : output-channel block (the weights of one block stay in L2 across rows)
    row, tile   : the tiles of one output row; a row that MR does not divide ends in one or two
                  narrower tiles (never MR = 1 unless the row is one pixel wide)
Threads split the bands when the input is larger than L2 (each thread packs its own bands),
and the output-channel blocks otherwise.
"""

from __future__ import annotations

from tvm import s_tir

from intrinsics.f32_conv import ConvTile, reduce_axes, register_conv
from intrinsics.templates import element_body
from microkernels import GemmKernel, Isa
from microkernels.f32_gemm import registers_needed

from ..common.targets import check_elements
from ..common.tir import buffer, header, parse, region
from .geometry import ConvBlocking, Geometry, PostOps, segments
from .plans import DirectPlan, largest_divisor
from .templates import band_pack, post_params, post_reads


def applies(g: Geometry) -> bool:
    """The direct conv computes every float32 layer; the dispatcher tries it last."""
    return True


def bands(g: Geometry, blocking: ConvBlocking, threads: int) -> tuple[int, bool]:
    """(rows per band VH, whether threads split bands rather than output blocks).

    An input that fits in half of L2 is packed whole and every output block sweeps it there.
    A larger one is cut into bands of output rows whose input fits in a quarter of L2; all
    output blocks are computed per band, so the weights are re-read per band, which costs less
    than it seems: they are one contiguous run the prefetchers follow, while an input re-read
    per output block jumps between channel blocks. (Measured on ResNet-50, one thread: on all
    six layers where a bytes-moved model picked blocks-outer instead, bands were faster.)
    """
    oh, _ = g.out_hw
    row_bytes = g.groups * g.nb * g.bi * (g.w + g.pad[1] + g.pad[3]) * 4
    if g.input_rows(oh) * row_bytes <= blocking.image_budget and g.groups * g.ob >= threads:
        return oh, False
    fits = lambda d: g.input_rows(d) * row_bytes <= blocking.band_budget  # noqa: E731
    vh = largest_divisor(oh, fits) or 1
    # Enough bands that every thread gets the same number, where a divisor allows it.
    balanced = largest_divisor(oh, lambda d: fits(d) and (g.n * oh // d) % threads == 0)
    if balanced and g.n * oh // balanced >= 2 * threads:
        vh = balanced
    elif threads > 1 and (g.n * oh // vh) % threads and g.groups * g.ob >= 4 * threads:
        # Bands that do not split evenly leave a thread idle at the end (7 one-row bands on
        # 2 threads: 4 and 3); the threads split each band's output blocks instead. Measured
        # on 1024x14x14->2048 1x1 s2, 2 threads: 12% faster. Where bands do split evenly,
        # splitting them was 2-8% faster (one parallel region instead of one per band).
        return vh, False
    return vh, True


def output_blocks(g: Geometry, isa: Isa, mr: int) -> int:
    """Output blocks per tile: 2 where every tile of a row is short (4 to 14 pixels, as on the
    7- and 14-wide layers) and two blocks' accumulators fit in the registers, else 1. A short
    one-block tile has too few independent FMA chains to cover the FMA latency (7x16: 80% of
    peak in L1 on Zen 5, 7x32: 99%). Only groups = 1 layers with an even number of blocks."""
    if g.groups != 1 or g.ob % 2:
        return 1
    two = 2 * g.block
    ok = all(4 <= t and registers_needed(isa, t, two) <= isa.vector_registers for _, _, t in segments(g.out_hw[1], mr))
    return 2 if ok else 1


def band_shape(g: Geometry, vh: int) -> tuple:
    """P: one band's input, VH output rows' worth, padding included (input blocks, rows,
    columns, lanes)."""
    return (g.groups * g.nb, g.input_rows(vh), g.input_cols(g.out_hw[1]), g.bi)


def render(g: Geometry, isa: Isa, mr: int, vh: int, band_parallel: bool, post: PostOps,
           blocks: int = 1) -> tuple[list[str], list[tuple[str, ConvTile]]]:
    """TVMScript lines of the whole layer, and the (block name, tile) pairs to tensorize. blocks:
    output blocks per tile (output_blocks)."""
    oh, ow = g.out_hw
    (sh, sw), (dh, dw) = g.stride, g.dilation
    nbands = oh // vh
    bi, bo = g.bi, g.block
    L = header([buffer("D", g.data_shape), buffer("Wt", g.weight_shape), *post_params(post, g), buffer("Out", g.out_shape)])
    L += [
        f"    for n, yb in T.grid({g.n}, {nbands}):" if not band_parallel
        else f"    for nyb in T.parallel({g.n * nbands}):",
        "        with T.sblock('band'):",
    ]
    if band_parallel:
        L.append(f"            vn = T.axis.spatial({g.n}, nyb // {nbands})")
        L.append(f"            vyb = T.axis.spatial({nbands}, nyb % {nbands})")
    else:
        L.append("            vn, vyb = T.axis.remap('SS', [n, yb])")
    # Spelled out: inferred, the band's reads would name its own scratch buffer P.
    L.append(f"            T.reads(D[vn, {region(g.data_shape[1:])}], Wt[{region(g.weight_shape)}]{post_reads(post, g, vh)})")
    L.append(f"            T.writes(Out[vn, 0:{g.out_shape[1]}, vyb * {vh}:vyb * {vh} + {vh}, {region(g.out_shape[3:])}])")
    if g.padded:
        L.append(f"            P = T.alloc_buffer({band_shape(g, vh)}, 'float32')")
        L += band_pack(g, "vyb", vh * sh, band_shape(g, vh))
    jobs = g.groups * g.ob // blocks
    o_loop = f"T.parallel({jobs})" if not band_parallel else f"T.serial({jobs})"
    L.append(f"            for o in {o_loop}:")
    L.append(f"                for yi in T.serial({vh}):")
    tensorized = []
    axes = reduce_axes(g.nb, g.kh, g.kw, bi)
    ep = post.epilogue
    for si, (start, count, t) in enumerate(segments(ow, mr)):
        name = f"conv_{si}"
        # A one-pixel row or a one-element reduction (a 1x1 depthwise layer) has no tile to
        # run; that block stays plain TIR.
        tile = None
        if t >= 2 and axes:
            kern = GemmKernel(isa, t, bo * blocks, accumulate=False, batch_reduce=True, epilogue=ep,
                              col_block=bo if blocks > 1 else 0)
            tile = ConvTile(kern, g.nb, g.kh, g.kw, bi, sw, dh, dw, post.clip)
        loops, exts = (["tt", "m", "j"], [count, t, bo]) if t >= 2 else (["tt", "j"], [count, bo])
        if blocks > 1:
            loops.insert(1, "g")
            exts.insert(1, blocks)
        L.append(f"                    for {', '.join(loops)} in T.grid({', '.join(map(str, exts))}):")
        L.append(f"                        with T.sblock('{name}'):")
        if blocks > 1:
            # As for the columns below: the first block is an iterator of its own, so the
            # tile's inner bindings are exactly the description's (g, not o * 2 + g).
            L.append(f"                            vo0 = T.axis.spatial({g.groups * g.ob}, o * {blocks})")
            L.append(f"                            vg = T.axis.spatial({blocks}, g)")
            L.append(f"                            vyi = T.axis.spatial({vh}, yi)")
            vo = "vo0 + vg"
        else:
            L.append("                            vo, vyi = T.axis.remap('SS', [o, yi])")
            vo = "vo"
        # The tile's first column is an iterator of its own, so that splitting the block at
        # `m` leaves the inner bindings exactly the description's (m, not start + m).
        L.append(f"                            vx0 = T.axis.spatial({ow}, {start} + tt * {t})")
        if t >= 2:
            L.append(f"                            vm = T.axis.spatial({t}, m)")
        L.append(f"                            vj = T.axis.spatial({bo}, j)")
        # The reduction runs as plain loops inside the block, then the epilogue: the form of
        # the tile's description (intrinsics.templates.element_body).
        v = {a: a for a, _ in axes}
        qg = f"vo // {g.ob} * {g.nb} + " if g.groups > 1 else ""  # groups > 1: one block per tile
        q = f"{qg}{v.get('q', '0')}"
        vx = "vx0 + vm" if t >= 2 else "vx0"
        col = f"({vx}) * {sw} + {v.get('s', '0')} * {dw}"
        if g.padded:  # P holds the band's rows only
            row = f"vyi * {sh} + {v.get('r', '0')} * {dh}"
            a_ref = f"P[{q}, {row}, {col}, {v.get('i', '0')}]"
        else:
            row = f"(vyb * {vh} + vyi) * {sh} + {v.get('r', '0')} * {dh}"
            a_ref = f"D[vn, {q}, {row}, {col}, {v.get('i', '0')}]"
        w_ref = f"Wt[{vo}, {v.get('q', '0')}, {v.get('r', '0')}, {v.get('s', '0')}, {v.get('i', '0')}, vj]"
        out_ref = f"Out[vn, {vo}, vyb * {vh} + vyi, {vx}, vj]"
        res_ref = f"Res[vn, {vo}, vyb * {vh} + vyi, {vx}, vj]" if ep.residual else None
        L += element_body(out_ref, a_ref, w_ref, axes, " " * 28, f"Bias[{vo}, vj]" if ep.bias else None,
                          res_ref, ep.act, post.clip)
        if tile:
            tensorized.append((name, tile))
    return L, tensorized


def schedule(g: Geometry, isa: Isa, mr: int, post: PostOps, blocking: ConvBlocking, threads: int,
             reason: str):
    """The layer's tensorized module (not compiled) and its DirectPlan; threads: the pool it
    divides, mr: the tile's rows."""
    vh, band_parallel = bands(g, blocking, threads)
    check_elements(data=g.data_shape, weight=g.weight_shape, output=g.out_shape,
                   band=band_shape(g, vh))
    blocks = output_blocks(g, isa, mr)
    lines, tiles = render(g, isa, mr, vh, band_parallel, post, blocks)
    sch = s_tir.Schedule(parse(lines))
    for name, tile in tiles:
        loops = sch.get_loops(sch.get_sblock(name))
        sch.tensorize(loops[-3 if blocks > 1 else -2], register_conv(tile))  # the tile's ([g,] m, j) loops
    if g.padded:
        sch.vectorize(sch.get_loops(sch.get_sblock("pack"))[-1])
    plan = DirectPlan("direct", reason, mr=mr, output_blocks=blocks, band_rows=vh, band_parallel=band_parallel,
                      segments=segments(g.out_hw[1], mr))
    return sch.mod, plan
