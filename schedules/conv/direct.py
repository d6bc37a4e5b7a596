"""FP32 conv2d, NCHWc direct, tensorized on the batch-reduce GEMM tile.

One output tile is MR pixels of an output row x NR output channels (one output block). Its
whole reduction (input-channel blocks x KH x KW x channels of a block) runs inside one call of
the batch-reduce kernel, so each output tile is stored once and never reloaded; except on the
small maps where that would stream the weights from memory once per row (chunks, below).

Loop nest, outer to inner:
    n, band     : VH output rows; the band's input rows (halo and zero padding included) are
                  packed into a small buffer first when the layer pads, so what the tiles read
                  stays in L2 (per-segment spatial packing). The window a band needs is
                  KH + SH*(VH-1) rows tall (dilated: (KH-1)*DH + 1 + SH*(VH-1)).
    o           : output-channel block (the weights of one block stay in L2 across rows);
                  on AVX-512 every tile call prefetches into L2 the panel after its own: the
                  next output block's weights, which in a network come from memory (its
                  weights do not stay in cache between inferences). Measured on the Zen 5:
                  EfficientNet-B0's 192 -> 1152 1x1 layer at 7x7 0.141 -> 0.090 ms with caches
                  flushed (0.086 warm), the whole network 5.41 -> 5.10 ms, ResNet-50 29.0 ->
                  28.1 (1 thread). On AVX2 (the Zen 3) whole networks ran faster without it
                  (microkernels.PREFETCH_WHOLE_REDUCTIONS)
    [chunk]     : where one band covers the map and a job's weights outgrow half of L1, the
                  reduction is cut into chunks of input-channel blocks (chunk_blocks): each
                  chunk's tiles add to the output the previous chunk stored, the last applies
                  the post-ops, and every call prefetches the next chunk's weights
    row, tile   : the tiles of one output row; a row that MR does not divide ends in one or two
                  narrower tiles (never MR = 1 unless the row is one pixel wide)
A 1x1, stride-1, unpadded layer runs each band as one row of band_rows x width pixels (flat):
in NCHWc those pixels follow one another in memory, so the tiles run along the whole band
instead of stopping at each row's end (a 7-wide row took a 4- and a 3-pixel tile, 14 a 2-pixel
one; measured on the Zen 3, flat was 8-28% faster on 7x7 and 14x14 maps).
Threads split the bands when the input is larger than L2 (each thread packs its own bands),
and the output-channel blocks otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tvm import s_tir

from intrinsics.f32_conv import ConvTile, reduce_axes, register_conv
from intrinsics.templates import element_body
from microkernels import PREFETCH_WHOLE_REDUCTIONS, GemmKernel, Isa
from microkernels.f32_gemm import NO_EPILOGUE, Epilogue, registers_needed

from ..common.targets import check_elements
from ..common.tir import buffer, header, parse, region
from .geometry import ConvBlocking, Geometry, PostOps, segments
from .plans import DirectPlan, largest_divisor
from .templates import band_pack, post_params, post_reads


def applies(g: Geometry) -> bool:
    """The direct conv computes every float32 layer; the dispatcher tries it last."""
    return True


def input_bytes(g: Geometry, rows: int) -> int:
    """Bytes of input the tiles of `rows` output rows read. A padded layer's band is packed
    whole, window and padding; an unpadded one is read in place, and a strided 1x1 layer then
    touches only every stride-th row and pixel (1024x14x14 -> 2048 s2: 196 KiB, not 728)."""
    if not g.padded and (g.kh, g.kw) == (1, 1):
        return g.groups * g.nb * g.bi * rows * g.out_hw[1] * 4
    return g.groups * g.nb * g.bi * g.input_rows(rows) * (g.w + g.pad[1] + g.pad[3]) * 4


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
    if input_bytes(g, oh) <= blocking.image_budget and g.groups * g.ob >= threads:
        return oh, False
    fits = lambda d: input_bytes(g, d) <= blocking.band_budget  # noqa: E731
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


def two_blocks_fit(g: Geometry, isa: Isa, mr: int, shortest: int = 2) -> bool:
    """Whether tiles may span two output blocks: groups = 1, an even number of blocks, and every
    tile of a row at least `shortest` pixels wide with two blocks' accumulators in registers."""
    if g.groups != 1 or g.ob % 2:
        return False
    return all(shortest <= t and registers_needed(isa, t, 2 * g.block) <= isa.vector_registers
               for _, _, t in segments(g.out_hw[1], mr))


def output_blocks(g: Geometry, isa: Isa, mr: int) -> int:
    """Output blocks per tile: 2 where every tile of a row is short (4 to 14 pixels, as on the
    7- and 14-wide layers) and two blocks' accumulators fit in the registers, else 1. A short
    one-block tile has too few independent FMA chains to cover the FMA latency (7x16: 80% of
    peak in L1 on Zen 5, 7x32: 99%). Only groups = 1 layers with an even number of blocks."""
    return 2 if two_blocks_fit(g, isa, mr, shortest=4) else 1


@dataclass(frozen=True)
class Variant:
    """The direct plan's free choices: pixels per tile, output blocks per tile, output rows per
    band, and whether threads split the bands (else each band's output blocks). The rules above
    pick one (planned); autotune times a few others (variants) on the host."""

    mr: int
    blocks: int
    band_rows: int
    band_parallel: bool

    @property
    def label(self) -> str:
        return f"direct {self.mr}x{self.blocks} {'bands' if self.band_parallel else 'blocks'} of {self.band_rows}"

    def check(self, g: Geometry, isa: Isa) -> None:
        """Refuse a variant this layer cannot run (a hand-edited measurement file)."""
        if not (isinstance(self.mr, int) and self.mr >= 1 and self.blocks in (1, 2) and isinstance(self.band_rows, int)
                and self.band_rows >= 1 and g.out_hw[0] % self.band_rows == 0 and isinstance(self.band_parallel, bool)):
            raise ValueError(f"{self} does not fit the layer's {g.out_hw[0]} output rows")
        if self.blocks == 2 and not two_blocks_fit(g, isa, self.mr):
            raise ValueError(f"{self}: this layer's tiles cannot span two output blocks")
        for t in {t for _, _, t in segments(g.out_hw[1], self.mr)}:
            kernel(g, isa, t, self.blocks)  # the tile the build would make: TileError where the ISA cannot hold it


def planned(g: Geometry, isa: Isa, mr: int, blocking: ConvBlocking, threads: int) -> Variant:
    vh, band_parallel = bands(g, blocking, threads)
    return Variant(mr, output_blocks(g, isa, mr), vh, band_parallel)


def variants(g: Geometry, isa: Isa, mr: int, blocking: ConvBlocking, threads: int) -> list[Variant]:
    """The planned variant first, then the ones autotune also times: the other tile shape
    (half the pixels on two blocks, or one block where the plan took two), the other way to
    split the work among threads, and bands of half the rows. Each changes one choice of the
    plan, so the list stays short (compiling is most of autotune's time); duplicates, and
    variants that differ only in tiles no row has, are dropped."""
    base = planned(g, isa, mr, blocking, threads)
    out = [base]
    if base.blocks == 2:
        out.append(replace(base, blocks=1))
    elif mr >= 4 and two_blocks_fit(g, isa, mr // 2):
        out.append(replace(base, mr=mr // 2, blocks=2))
    if threads > 1:
        out.append(replace(base, band_parallel=not base.band_parallel))
    half = largest_divisor(g.out_hw[0], lambda d: d <= base.band_rows // 2)
    if half:
        out.append(replace(base, band_rows=half))
    seen, unique = set(), []
    for v in out:
        same = (tuple(segments(g.out_hw[1], v.mr)), v.blocks, v.band_rows, v.band_parallel)
        if same not in seen:
            seen.add(same)
            unique.append(v)
    return unique



@dataclass(frozen=True)
class ChunkPhase:
    """One stretch of a reduction cut into chunks of input-channel blocks (chunk_phases)."""

    tag: str  # block-name prefix ("" when the reduction is not cut)
    nb: int  # input-channel blocks per chunk
    q0: str  # the phase's first input block, as block-iterator text
    loop: int  # > 0: the phase is a loop over this many chunks (iterator c, block axis vc)
    init: bool  # the first chunk overwrites C; the others add to it
    epilogue: Epilogue  # only the last chunk's: bias, residual and act see the whole sum


def chunk_phases(nb: int, chunk: int, ep: Epilogue) -> list[ChunkPhase]:
    """The first chunk, the middle ones as one loop, the last chunk; or the whole reduction as
    one phase when chunk == nb. A chunk's tile prefetches the next chunk's weights, a whole
    reduction's the next output block's where the ISA's entry says so (_tile, module doc)."""
    n = nb // chunk
    if n == 1:
        return [ChunkPhase("", nb, "0", 0, True, ep)]
    phases = [ChunkPhase("c0_", chunk, "0", 0, True, NO_EPILOGUE)]
    if n > 2:
        phases.append(ChunkPhase("cm_", chunk, f"(vc + 1) * {chunk}", n - 2, False, NO_EPILOGUE))
    return phases + [ChunkPhase("cl_", chunk, str((n - 1) * chunk), 0, False, ep)]


def chunk_blocks(g: Geometry, blocks: int, vh: int, l1_bytes: int) -> int:
    """Input-channel blocks per reduction chunk: all of them, except where a job's weights
    outgrow half of L1 and every row of the layer is one band (the small maps of a network's
    last stages). There each row's tile used to walk all of the job's weights: the first row
    from memory, since a network's weights stream from DRAM, at a rate the FMAs outran by 3x
    (512x7x7 3x3: 1.5 ms in ResNet-50 against 0.94 warm). Cut into chunks that stay in L1,
    every row reuses a chunk while the kernel prefetches the next one, so the weights are read
    once, ahead of need. The price is one load and store of the accumulators per chunk."""
    per_block = g.kh * g.kw * g.bi * g.block * blocks * 4  # bytes of one input block's weights per job
    if g.groups != 1 or vh != g.out_hw[0] or g.nb * per_block <= l1_bytes // 2 or g.out_hw == (1, 1):
        return g.nb  # (a 1x1 map: one tile per job, nothing reuses a chunk)
    return largest_divisor(g.nb, lambda d: d * per_block <= l1_bytes // 2) or 1


def kernel(g: Geometry, isa: Isa, t: int, blocks: int, **kw) -> GemmKernel:
    """The batch-reduce kernel of a segment whose tiles are t pixels wide on `blocks` output
    blocks (kw: the phase's accumulate and epilogue, and prefetch); TileError where the ISA's
    registers cannot hold it."""
    return GemmKernel(isa, t, g.block * blocks, batch_reduce=True, col_block=g.block if blocks > 1 else 0, **kw)


def _tile(g: Geometry, isa: Isa, t: int, phase: ChunkPhase, blocks: int, post: PostOps) -> ConvTile | None:
    """The tensorized tile of a segment whose tiles are t pixels wide (t = 1 only where the row
    is one pixel wide: a conv on a 1x1 map, squeeze-and-excitation's FCs, runs as a GEMV on
    the 1-row tile); None for a one-element reduction (a 1x1 depthwise layer), which stays
    plain TIR."""
    if not reduce_axes(phase.nb, g.kh, g.kw, g.bi):
        return None
    # A chunk's calls prefetch the next chunk's weights; a whole reduction's the next output
    # block's, where the ISA's entry says it pays (module doc).
    prefetch = bool(phase.tag) or PREFETCH_WHOLE_REDUCTIONS[isa.name]
    kern = kernel(g, isa, t, blocks, accumulate=not phase.init, epilogue=phase.epilogue, prefetch=prefetch)
    return ConvTile(kern, phase.nb, g.kh, g.kw, g.bi, g.stride[1], *g.dilation, post.clip)


def _tile_block(g: Geometry, seg: tuple[int, int, int], name: str, phase: ChunkPhase, vh: int, blocks: int,
                post: PostOps, indent: int) -> list[str]:
    """The loops and block of one segment of a row (first column, tiles, tile width) in one phase."""
    start, count, t = seg
    (sh, sw), (dh, dw) = g.stride, g.dilation
    bo, ow = g.block, g.out_hw[1]
    sp, b = " " * indent, " " * (indent + 8)
    loops, exts = (["tt", "m", "j"], [count, t, bo]) if t >= 2 else (["tt", "j"], [count, bo])
    if blocks > 1:
        loops.insert(1, "g")
        exts.insert(1, blocks)
    L = [f"{sp}for {', '.join(loops)} in T.grid({', '.join(map(str, exts))}):", f"{sp}    with T.sblock('{name}'):"]
    if blocks > 1:
        # As for the columns below: the first block is an iterator of its own, so the
        # tile's inner bindings are exactly the description's (g, not o * 2 + g).
        L.append(f"{b}vo0 = T.axis.spatial({g.groups * g.ob}, o * {blocks})")
        L.append(f"{b}vg = T.axis.spatial({blocks}, g)")
        L.append(f"{b}vyi = T.axis.spatial({vh}, yi)")
        vo = "vo0 + vg"
    else:
        L.append(f"{b}vo, vyi = T.axis.remap('SS', [o, yi])")
        vo = "vo"
    if phase.loop:  # the middle chunks' index: it only places A and B, as vo places C
        # Bound to c itself (the chunk is vc + 1): blockizing a one-pixel tile at its j loop
        # dropped the offset of a binding c + 1 (TVM 0.27), so the tiles read the wrong chunk.
        L.append(f"{b}vc = T.axis.spatial({phase.loop}, c)")
    # The tile's first column is an iterator of its own, so that splitting the block at
    # `m` leaves the inner bindings exactly the description's (m, not start + m).
    L.append(f"{b}vx0 = T.axis.spatial({ow}, {start} + tt * {t})")
    if t >= 2:
        L.append(f"{b}vm = T.axis.spatial({t}, m)")
    L.append(f"{b}vj = T.axis.spatial({bo}, j)")
    # The reduction runs as plain loops inside the block, then the epilogue: the form of
    # the tile's description (intrinsics.templates.element_body).
    axes = reduce_axes(phase.nb, g.kh, g.kw, g.bi)
    v = {a: a for a, _ in axes}
    if phase.q0 == "0":
        qg = f"vo // {g.ob} * {g.nb} + " if g.groups > 1 else ""  # groups > 1: one block per tile
        q, qw = f"{qg}{v.get('q', '0')}", v.get("q", "0")
    else:  # a later chunk (groups = 1 only)
        q = qw = f"{phase.q0} + {v.get('q', '0')}"
    vx = "vx0 + vm" if t >= 2 else "vx0"
    col = f"({vx}) * {sw} + {v.get('s', '0')} * {dw}"
    if g.padded:  # P holds the band's rows only
        row = f"vyi * {sh} + {v.get('r', '0')} * {dh}"
        a_ref = f"P[{q}, {row}, {col}, {v.get('i', '0')}]"
    else:
        row = f"(vyb * {vh} + vyi) * {sh} + {v.get('r', '0')} * {dh}"
        a_ref = f"D[vn, {q}, {row}, {col}, {v.get('i', '0')}]"
    w_ref = f"Wt[{vo}, {qw}, {v.get('r', '0')}, {v.get('s', '0')}, {v.get('i', '0')}, vj]"
    out_ref = f"Out[vn, {vo}, vyb * {vh} + vyi, {vx}, vj]"
    ep = phase.epilogue
    res_ref = f"Res[vn, {vo}, vyb * {vh} + vyi, {vx}, vj]" if ep.residual else None
    return L + element_body(out_ref, a_ref, w_ref, axes, " " * (indent + 8), f"Bias[{vo}, vj]" if ep.bias else None,
                            res_ref, ep.act, post.clip, init=phase.init)


def band_shape(g: Geometry, vh: int) -> tuple:
    """P: one band's input, VH output rows' worth, padding included (input blocks, rows,
    columns, lanes)."""
    return (g.groups * g.nb, g.input_rows(vh), g.input_cols(g.out_hw[1]), g.bi)


def flat_rows(g: Geometry, vh: int) -> int | None:
    """Pixels of a band as one row (vh rows of the output's width) where the layer is 1x1,
    stride 1 and unpadded and the rows are more than one pixel wide; else None (module doc)."""
    if (g.kh, g.kw) != (1, 1) or g.stride != (1, 1) or g.padded or g.out_hw[1] == 1:
        return None
    return vh * g.out_hw[1]


def flattened(g: Geometry, vh: int) -> Geometry:
    """g with each band of vh rows as one row: the same memory, a different shape."""
    return replace(g, h=g.h // vh, w=vh * g.w)


def _params(g: Geometry, post: PostOps, outer: Geometry | None) -> list[str]:
    """The entry function's parameters, then (flat) the views of the layer's tensors as the
    flattened geometry g shapes them."""
    if outer is None:
        return header([buffer("D", g.data_shape), buffer("Wt", g.weight_shape), *post_params(post, g),
                       buffer("Out", g.out_shape)])
    views = [("D", g.data_shape)] + ([("Res", g.out_shape)] if post.residual else []) + [("Out", g.out_shape)]
    params = [buffer("D_", outer.data_shape), buffer("Wt", g.weight_shape), *post_params(post, outer, "Res_"),
              buffer("Out_", outer.out_shape)]
    return header(params) + [f"    {name} = T.decl_buffer({tuple(shape)}, 'float32', data={name}_.data)"
                             for name, shape in views]


def render(g: Geometry, isa: Isa, mr: int, vh: int, band_parallel: bool, post: PostOps,
           blocks: int = 1, chunk: int | None = None, outer: Geometry | None = None
           ) -> tuple[list[str], list[tuple[str, ConvTile]]]:
    """TVMScript lines of the whole layer, and the (block name, tile) pairs to tensorize. blocks:
    output blocks per tile (output_blocks); chunk: input-channel blocks per reduction chunk
    (chunk_blocks; None: the whole reduction in one call); outer: the layer's own geometry
    when g is its flattened form (flat_rows), whose shapes the function's parameters keep."""
    chunk = chunk or g.nb
    oh, ow = g.out_hw
    (sh, sw), (dh, dw) = g.stride, g.dilation
    nbands = oh // vh
    bi, bo = g.bi, g.block
    L = _params(g, post, outer)
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
    tensorized = []
    for phase in chunk_phases(g.nb, chunk, post.epilogue):
        indent = 16
        if phase.loop:  # the middle chunks: one loop over them, the chunk an iterator of each block
            L.append(f"                for c in T.serial({phase.loop}):")
            indent += 4
        L.append(" " * indent + f"for yi in T.serial({vh}):")
        for si, seg in enumerate(segments(ow, mr)):
            name = f"conv_{phase.tag}{si}"
            L += _tile_block(g, seg, name, phase, vh, blocks, post, indent + 4)
            tile = _tile(g, isa, seg[2], phase, blocks, post)
            if tile:
                tensorized.append((name, tile))
    return L, tensorized


def schedule(g: Geometry, isa: Isa, mr: int, post: PostOps, blocking: ConvBlocking, threads: int,
             reason: str, variant: Variant | None = None):
    """The layer's tensorized module (not compiled) and its DirectPlan; threads: the pool it
    divides, mr: the tile's rows; variant: the choices to take instead of the planned ones."""
    if variant is None:
        variant = planned(g, isa, mr, blocking, threads)
    variant.check(g, isa)
    mr, blocks, vh, band_parallel = variant.mr, variant.blocks, variant.band_rows, variant.band_parallel
    check_elements(data=g.data_shape, weight=g.weight_shape, output=g.out_shape,
                   band=band_shape(g, vh))
    chunk = chunk_blocks(g, blocks, vh, blocking.l1)
    flat = flat_rows(g, vh)
    if flat:
        layer, g = g, flattened(g, vh)
        blocks = blocks if blocks == 1 or two_blocks_fit(g, isa, mr) else 1
        lines, tiles = render(g, isa, mr, 1, band_parallel, post, blocks, chunk, outer=layer)
    else:
        lines, tiles = render(g, isa, mr, vh, band_parallel, post, blocks, chunk)
    sch = s_tir.Schedule(parse(lines))
    for name, tile in tiles:
        loops = sch.get_loops(sch.get_sblock(name))
        sch.tensorize(loops[-len(tile.free_loops())], register_conv(tile))  # the tile's ([g,] [m,] j) loops
    if g.padded:
        sch.vectorize(sch.get_loops(sch.get_sblock("pack"))[-1])
    plan = DirectPlan("direct", reason, mr=mr, output_blocks=blocks, band_rows=vh, band_parallel=band_parallel,
                      segments=segments(g.out_hw[1], mr), chunk=chunk if chunk < g.nb else None, flat_rows=flat)
    return sch.mod, plan
