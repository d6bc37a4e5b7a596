"""FP32 conv2d by Winograd F(m x m, 3 x 3), m in {2, 4, 6}, on NCHW16c data.

Per band of VT rows of output tiles (T = VT * tiles per row), all in buffers sized to the band:
    pack   the band's input rows, zero padding and channels padded to 16 included   P
    in     V[xi, nu, t, c]    = B^T d_t B          per tile and input block   (transform kernel)
    for each output block o:
      gemm   M[xi, nu, t, :16] = V[xi, nu, t, :] @ U[o, xi, nu, :, :16]       (GEMM tile, beta=0)
      out    Y[tile rows]      = A^T M_t A                                    (transform kernel)
      store  the valid part of Y into the output (the right and bottom tiles may be partial)
The band is sized so that V stays in L2 while every output block sweeps it; the whole image is
one band when its V fits in L2 (`_plan`). M and Y are one output block's worth, in L1. Threads
split the bands, or the output blocks when there are fewer bands than threads. The weights are
transformed once, ahead of time (`pack_weights`), into U[o, xi, nu, c, 16], the B panels the
GEMM reads: alpha^2 / 9 times the bytes of the 3x3 weights.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import tvm
from threadpoolctl import threadpool_limits
from tvm import s_tir, te, tirx

from intrinsics.beta0 import drop_dead_inits
from intrinsics.f32_gemm import register as register_gemm
from intrinsics.f32_wino import emit
from intrinsics.f32_wino import register as register_wino
from intrinsics.templates import epilogue_expr
from microkernels import DEFAULT_TILES, GemmKernel, Isa, best_host_isa
from microkernels import f32_wino as wino

from ..common import layouts, tuned
from ..common.targets import check_array, check_elements
from ..common.tir import buffer, ceil_div, ceil_to, header, parse, region
from .geometry import NO_POST_OPS, ConvBlocking, Geometry, PostOps, segments
from .op import Conv2dOp
from .plans import WinogradPlan, largest_divisor
from .templates import band_pack, post_params, post_reads

BLOCK = wino.BLOCK
TILES = tuple(sorted(wino.POINTS))
AUTO_MIN_TILES = 49  # output tiles per image below which "auto" steps down a tile size (choose)


def refusal(g: Geometry, post: PostOps | None = None) -> str | None:
    """Why Winograd F(m, 3) cannot compute this layer (with these post-ops), or None when it can."""
    if post is not None and post.activation not in (None, "relu", "clip"):
        return f"an activation its output transform applies (relu, clip), got {post.activation}"
    if (g.kh, g.kw) != (3, 3):
        return f"a 3x3 kernel, got {g.kh}x{g.kw}"
    if g.stride != (1, 1):
        return f"stride 1, got {g.stride}"
    if g.dilation != (1, 1):
        return f"dilation 1, got {g.dilation}"
    if g.groups != 1:
        return f"groups = 1, got {g.groups}"
    return None


def choose(g: Geometry, isa_name: str | None = None, threads: int = 1,
           post: PostOps | None = None) -> tuple[int | None, str, str]:
    """algorithm="auto": (Winograd tile, or None for direct; the reason; its source).

    With this host's measurements (`python -m microkernels tune`, common/tuned.py): the fastest
    algorithm, with cold weights as in a network, on the measured layer nearest to this one
    (map size first, then channels) among those measured at the thread count nearest `threads`
    (the pool the layer's plan divides).
    Without: the rule below, measured with `bench conv2d --algorithms direct wino2 wino4 wino6`
    on ResNet-50's 3x3 stride-1 layers (AVX2 Zen 3, 1 and 2 threads, warm and cold cache;
    README, Winograd): F(4) was fastest or within noise of F(6) at 56x56 and 28x28 (at least 49
    tiles of 4x4), F(2) at 14x14 (49 tiles of 2x2: F(4)'s 16 tiles leave the GEMMs too few rows
    and re-read a 9 MiB U per band), direct at 7x7, where even F(2) was 0.9-1.3x direct's time.
    """
    why = refusal(g, post)
    if why:
        return None, f"direct: Winograd needs {why}", "defaults"
    measured = _measured(g, isa_name, threads) if isa_name else None
    if measured is not None:
        return measured
    oh, ow = g.out_hw
    for m in (4, 2):
        tiles = ceil_div(oh, m) * ceil_div(ow, m)
        if tiles >= AUTO_MIN_TILES:
            return m, f"F({m}x{m}): {tiles} output tiles per image >= {AUTO_MIN_TILES}", "defaults"
    return None, f"direct: fewer than {AUTO_MIN_TILES} tiles of 2x2 per image", "defaults"


def _measured(g: Geometry, isa_name: str, threads: int) -> tuple[int | None, str, str] | None:
    """choose() from the measured layer nearest to g: a factor of 2 in the map's side counts
    twice a factor of 2 in the channels (the map decides how many tiles the GEMMs get)."""
    layers = [r for r in tuned.winograd_layers(isa_name) if _times(r).get("direct")]
    if not layers:
        return None
    pool = min({r.get("threads", 1) for r in layers}, key=lambda t: (abs(t - threads), t))
    layers = [r for r in layers if r.get("threads", 1) == pool]
    hw, ch = math.sqrt(g.out_hw[0] * g.out_hw[1]), math.sqrt(g.c * g.o)
    near = min(layers, key=lambda r: abs(math.log2(r["hw"] / hw)) + 0.5 * abs(math.log2(r["c"] / ch)))
    times = {k: float(v) for k, v in _times(near).items() if k == "direct" or int(k) in TILES}
    best = min(times, key=times.get)
    listed = ", ".join(f"{label(k)} {v * 1e3:.3g} ms" for k, v in times.items())
    what = "direct" if best == "direct" else f"F({best}x{best})"
    reason = (f"{what}: fastest on the measured {near['c']}x{near['hw']}x{near['hw']} layer, {pool} thread(s), "
              f"cold weights ({listed})")
    return (None if best == "direct" else int(best)), reason, tuned.source()


def label(key: str) -> str:
    """A measured algorithm's name for people: "direct", or "F(m)" for the tile key "m"."""
    return "direct" if key == "direct" else f"F({key})"


def _times(layer: dict) -> dict:
    """A measured layer's seconds per algorithm with cold weights, as in a network; warm where
    only those were measured."""
    return layer.get("seconds_network") or layer.get("seconds") or {}


def _plan(g: Geometry, m: int, blocking: ConvBlocking, threads: int) -> tuple[int, bool, bool]:
    """(tile rows per band VT, whether threads split the bands, whether they split the output
    blocks).

    Every band reads all of U, so each band costs U's bytes. Bands: VT is the most tile rows
    whose V fits in half of L2 (a divisor of the tile rows). The whole image is one band instead
    when its V still fits in L2 and the bands would read U more than once: small maps with many
    channels, where U dwarfs the image. (A whole-image V larger than L2, re-read from L3 by
    every output block, measured slower than re-reading U per band: 256x14x14 F(4), 2.5 ms in
    one band against 1.5 ms in four.) Threads split the bands when there are enough of them,
    the output blocks otherwise.
    """
    oh, ow = g.out_hw
    th, tw = ceil_div(oh, m), ceil_div(ow, m)
    alpha, cp = m + 2, ceil_to(g.c, BLOCK)
    v_bytes = lambda vt: alpha * alpha * vt * tw * cp * 4  # noqa: E731
    vt = largest_divisor(th, lambda d: v_bytes(d) <= blocking.image_budget) or 1
    if v_bytes(th) <= blocking.l2 and th // vt > 1:
        vt = th
    bands = g.n * (th // vt)
    if threads == 1:
        return vt, False, False
    if bands >= threads:
        return vt, True, False
    return vt, False, True


def band_shapes(g: Geometry, m: int, vt: int) -> tuple[tuple, tuple]:
    """P, one band's input (channel blocks, rows, columns, lanes; padding included), and V, its
    transformed tiles (alpha, alpha, tiles, channels padded to blocks), for VT tile rows."""
    tw, alpha, cb = ceil_div(g.out_hw[1], m), m + 2, ceil_div(g.c, BLOCK)
    return (cb, vt * m + 2, tw * m + 2, BLOCK), (alpha, alpha, vt * tw, cb * BLOCK)


def render(g: Geometry, isa: Isa, m: int, vt: int, band_parallel: bool, o_parallel: bool,
           post: PostOps = NO_POST_OPS) -> tuple[list[str], list[tuple[str, str]], dict]:
    """TVMScript lines of the whole layer, the (block name, intrinsic) pairs to tensorize, and
    the names the text calls to emit its transform blocks' bodies (intrinsics.f32_wino.emit)."""
    oh, ow = g.out_hw
    alpha = m + 2
    th, tw = ceil_div(oh, m), ceil_div(ow, m)
    nbands, nt = th // vt, vt * tw
    cb = ceil_div(g.c, BLOCK)
    cp, ob = cb * BLOCK, g.ob
    bt, at = wino.transform_matrix("in", m), wino.transform_matrix("out", m)
    mr = DEFAULT_TILES[isa.name][0]
    u_shape = (ob, alpha, alpha, cp, BLOCK)
    p_shape, v_shape = band_shapes(g, m, vt)
    L = header([buffer("D", g.data_shape), buffer("U", u_shape), *post_params(post, g), buffer("Out", g.out_shape)])
    L += [
        f"    for nb in T.{'parallel' if band_parallel else 'serial'}({g.n * nbands}):",
        "        with T.sblock('band'):",
        f"            vn = T.axis.spatial({g.n}, nb // {nbands})",
        f"            vb = T.axis.spatial({nbands}, nb % {nbands})",
        f"            T.reads(D[vn, {region(g.data_shape[1:])}], U[{region(u_shape)}]{post_reads(post, g)})",
        f"            T.writes(Out[vn, {region(g.out_shape[1:])}])",
        f"            P = T.alloc_buffer({p_shape}, 'float32')",
        f"            V = T.alloc_buffer({v_shape}, 'float32')",
    ]
    L += band_pack(g, "vb", vt * m, p_shape, lanes_used=None if g.bi == BLOCK else g.bi)
    L += [
        f"            for q, ty, tx, c in T.grid({cb}, {vt}, {tw}, {BLOCK}):",
        "                with T.sblock('wino_in'):",
        "                    vq, vty, vtx, vc = T.axis.remap('SSSS', [q, ty, tx, c])",
        "                    transform_in(V, P, vq, vty, vtx, vc)",
        f"            for o in T.{'parallel' if o_parallel else 'serial'}({ob}):",
        # One output block's GEMM result and transformed tiles: per thread when threads split
        # the blocks.
        "                with T.sblock('oblock'):",
        "                    vo = T.axis.spatial(%d, o)" % ob,
        f"                    T.reads(V[{region((alpha, alpha, nt, cp))}], U[vo, {region(u_shape[1:])}]{post_reads(post, g)})",
        f"                    T.writes(Out[vn, vo, {region(g.out_shape[2:])}])",
        f"                    M = T.alloc_buffer(({alpha}, {alpha}, {nt}, {BLOCK}), 'float32')",
        f"                    Y = T.alloc_buffer(({vt * m}, {tw * m}, {BLOCK}), 'float32')",
    ]
    inner = len(L)  # what follows sits inside 'oblock': indented once more below
    tensorized = [("wino_in", register_wino(wino.WinoKernel(isa, "in", m)))]
    for si, (start, count, t) in enumerate(segments(nt, mr)):
        name = f"wino_gemm_{si}"
        loops, exts = (["tt", "mm"], [count, t]) if t >= 2 else (["tt"], [count])
        L += [
            f"                for e1, e2, {', '.join(loops)}, jj, kk in T.grid({alpha}, {alpha}, "
            f"{', '.join(map(str, exts))}, {BLOCK}, {cp}):",
            f"                    with T.sblock('{name}'):",
            "                        ve1, ve2 = T.axis.remap('SS', [e1, e2])",
            f"                        vt0 = T.axis.spatial({nt}, {start} + tt * {t})",
        ]
        if t >= 2:
            L.append(f"                        vm = T.axis.spatial({t}, mm)")
        vtile = "vt0 + vm" if t >= 2 else "vt0"
        L += [
            f"                        vj = T.axis.spatial({BLOCK}, jj)",
            f"                        vk = T.axis.reduce({cp}, kk)",
            "                        with T.init():",
            f"                            M[ve1, ve2, {vtile}, vj] = T.float32(0)",
            f"                        M[ve1, ve2, {vtile}, vj] = M[ve1, ve2, {vtile}, vj]"
            f" + V[ve1, ve2, {vtile}, vk] * U[vo, ve1, ve2, vk, vj]",
        ]
        if t >= 2:
            # The first segment meets each U panel first, straight from memory in a network:
            # it prefetches the next panel (the next (xi, nu), or the next block's first) while
            # it computes on this one. The later segments find theirs in L1.
            kern = GemmKernel(isa, t, BLOCK, accumulate=False, prefetch=si == 0)
            tensorized.append((name, register_gemm(kern, cp)))
    L += [
        f"                for ty, tx, c in T.grid({vt}, {tw}, {BLOCK}):",
        "                    with T.sblock('wino_out'):",
        "                        vty, vtx, vc = T.axis.remap('SSS', [ty, tx, c])",
        "                        transform_out(Y, M, vty, vtx, vc)",
        f"                for y, x, c in T.grid({vt * m}, {ow}, {BLOCK}):",
        "                    with T.sblock('store'):",
        "                        vy, vx, vc = T.axis.remap('SSS', [y, x, c])",
        f"                        T.where(vb * {vt * m} + y < {oh})",
        # The post-ops ride on this one pass from the L1-resident Y into the output.
        f"                        Out[vn, vo, vb * {vt * m} + vy, vx, vc] = "
        + epilogue_expr("Y[vy, vx, vc]", "Bias[vo, vc]" if post.bias else None,
                        f"Res[vn, vo, vb * {vt * m} + vy, vx, vc]" if post.residual else None, post.activation, post.clip),
    ]
    tensorized.append(("wino_out", register_wino(wino.WinoKernel(isa, "out", m))))
    L[inner:] = ["    " + line for line in L[inner:]]
    names = {
        "transform_in": lambda v, p, vq, vty, vtx, vc: emit(
            bt, lambda i, j: (v, [i, j, vty * tw + vtx, vq * BLOCK + vc]),
            lambda k, l: p[vq, vty * m + k, vtx * m + l, vc]),
        "transform_out": lambda y, mm, vty, vtx, vc: emit(
            at, lambda i, j: (y, [vty * m + i, vtx * m + j, vc]), lambda k, l: mm[k, l, vty * tw + vtx, vc]),
    }
    return L, tensorized, names


def blocked_weight_shape(g: Geometry, m: int) -> tuple:
    """U's shape: (output blocks, alpha, alpha, input channels padded to blocks, 16)."""
    alpha = m + 2
    return (g.ob, alpha, alpha, ceil_to(g.c, BLOCK), BLOCK)


class WinogradConv2dOp(Conv2dOp):
    """A compiled Winograd conv2d: the direct op's layouts and calls, transformed weights."""

    @property
    def tile(self) -> int:
        return self.plan.tile

    @property
    def blocked_weight_shape(self) -> tuple:
        return blocked_weight_shape(self.geometry, self.tile)

    def packs_weights_compiled(self) -> bool:
        return True

    def weight_packer(self, isa: Isa | None = None):
        """The transform compiled (transform_weights_module) for `isa` (the op's by default):
        what op(x, w) runs on every call."""
        return tvm.compile(transform_weights_module(self.geometry, self.tile), target=(isa or self.isa).target)["main"]

    def emulated_weights(self, weight: np.ndarray) -> np.ndarray:
        """The same transform, compiled for this host: its float64 sums contract into FMAs as the
        native op's do (AVX2 and AVX-512 builds agree bit for bit), while numpy's pack_weights
        rounds each product, one ulp off on a few values; so an emulated op(x, w) matches a
        native one exactly."""
        g = self.geometry
        check_array("weight", weight, (g.o, g.cg, g.kh, g.kw), "float32")
        out = tvm.runtime.empty(self.blocked_weight_shape, "float32")
        self._host_weight_packer(tvm.runtime.tensor(np.ascontiguousarray(weight)), out)
        return out.numpy()

    @functools.cached_property  # compiled once per op: an emulated op(x, w) transforms on every call
    def _host_weight_packer(self):
        return self.weight_packer(best_host_isa())

    def pack_weights(self, weight: np.ndarray) -> np.ndarray:
        """U[o, xi, nu, c, j] = (G w G^T)[xi, nu] of output channel 16*o + j, input channel c,
        in float64 then rounded once; channels zero-padded to whole blocks. In numpy (the Relax
        pass folds each layer's weights once); the NCHW paths run weight_packer's module."""
        g = self.geometry
        check_array("weight", weight, (g.o, g.cg, g.kh, g.kw), "float32")
        gm = wino.as_array(wino.transform_matrix("wt", self.tile))
        ob, alpha, _, cp, _ = self.blocked_weight_shape
        # G w G^T for every (o, c) at once: one GEMM of kron(G, G), alpha^2 x 9, with the taps
        # laid out (9, c * o). A three-operand einsum took 120-170 ms on a 512x512 layer (op(x, w)
        # transforms on every call, the Relax pass once per conv); this takes about 20.
        taps = weight.reshape(g.o, g.c, 9).transpose(2, 1, 0).astype(np.float64)
        with threadpool_limits(1, user_api="blas"):  # no BLAS workers left spinning on our cores
            u = np.kron(gm, gm) @ taps.reshape(9, g.c * g.o)
        full = np.zeros((alpha, alpha, cp, ob * BLOCK), np.float32)
        full[:, :, :g.c, :g.o] = u.reshape(alpha, alpha, g.c, g.o)  # rounded once, from float64
        return layouts.aligned(full.reshape(alpha, alpha, cp, ob, BLOCK).transpose(3, 0, 1, 2, 4))


def transform_weights_module(g: Geometry, m: int) -> tvm.IRModule:
    """pack_weights as a module main(w OIHW, U blocked), within one ulp of the numpy one's values
    (both sum in float64 and round once; the order differs): per output block (in parallel) and
    input channel, T = G w for the block's 16 output channels (alpha x 3 each, computed once and
    kept), then U = T G^T for every (xi, nu), the 16 output channels in one vector. 3.2 ms for a
    512x512 F(2) layer here against numpy's 25 (op(x, w) transforms on every call)."""
    gm = wino.as_array(wino.transform_matrix("wt", m))
    ob, alpha, _, cp, _ = blocked_weight_shape(g, m)
    w = te.placeholder((g.o, g.c, 3, 3), "float32", name="w")

    def coefficient(col, index):  # gm[index, col] for a symbolic index: constants once unrolled
        value = tirx.const(0.0, "float64")
        for i in range(alpha):
            value = tirx.Select(index == i, tirx.const(float(gm[i, col]), "float64"), value)
        return value

    def first(o, c, xi, s):  # (G w)[xi, s]
        return sum((coefficient(k, xi) * w[o, c, k, s].astype("float64") for k in range(3)),
                   tirx.const(0.0, "float64"))

    t = te.compute((g.o, g.c, alpha, 3), first, name="t")

    def second(b, xi, nu, c, j):  # (G w G^T)[xi, nu], zero in the padding channels
        o = b * BLOCK + j
        value = sum((coefficient(s, nu) * t[tirx.min(o, g.o - 1), tirx.min(c, g.c - 1), xi, s] for s in range(3)),
                    tirx.const(0.0, "float64"))
        return tirx.Select(tirx.all(o < g.o, c < g.c), value.astype("float32"), tirx.const(0.0, "float32"))

    u = te.compute((ob, alpha, alpha, cp, BLOCK), second, name="u")
    sch = s_tir.Schedule(te.create_prim_func([w, u]))
    b, xi, nu, c, j = sch.get_loops(sch.get_sblock("u"))
    sch.reorder(b, c, xi, nu, j)
    sch.parallel(b)
    sch.vectorize(j)
    sch.unroll(xi)
    sch.unroll(nu)
    first_block = sch.get_sblock("t")
    sch.compute_at(first_block, c)
    for loop in sch.get_loops(first_block)[-2:]:
        sch.unroll(loop)
    return sch.mod


def schedule(g: Geometry, isa: Isa, m: int, post: PostOps, blocking: ConvBlocking, threads: int,
             reason: str) -> tuple[tvm.IRModule, WinogradPlan]:
    """The layer's tensorized module (not compiled) and its plan; threads: the pool it divides."""
    why = refusal(g, post)
    if why:
        raise ValueError(f"algorithm='winograd' needs {why}; use algorithm='direct' (or 'auto')")
    if m not in TILES:
        raise ValueError(f"Winograd tile must be one of {TILES} (F(m x m, 3 x 3)), got {m!r}")
    if g.block != BLOCK:
        raise ValueError(f"Winograd runs on {BLOCK}-channel blocks, got {g.block}")
    # U grows with alpha^2 / 9 of the weights: refused here, not deep in TVM's lowering.
    check_elements(data=g.data_shape, transformed_weight=blocked_weight_shape(g, m), output=g.out_shape)
    vt, band_parallel, o_parallel = _plan(g, m, blocking, threads)
    p_shape, v_shape = band_shapes(g, m, vt)
    check_elements(band=p_shape, band_transformed=v_shape)
    lines, tiles, names = render(g, isa, m, vt, band_parallel, o_parallel, post)
    sch = s_tir.Schedule(parse(lines, **names))
    if o_parallel:
        # Fewer bands than threads: the threads split the output blocks, and the band's pack and
        # input transform before them would run on one thread while the others wait (F(2)
        # 256x14x14: 1.67x from one thread to two). They split the input blocks instead.
        for name in ("pack", "wino_in"):
            sch.parallel(sch.get_loops(sch.get_sblock(name))[1])
    for name, intrin in tiles:
        loops = sch.get_loops(sch.get_sblock(name))
        # A transform covers its block's channel loop, a GEMM tile its last three (rows,
        # columns, K).
        sch.tensorize(loops[-1] if name in ("wino_in", "wino_out") else loops[-3], intrin)
    sch.vectorize(sch.get_loops(sch.get_sblock("pack"))[-1])
    sch.vectorize(sch.get_loops(sch.get_sblock("store"))[-1])
    # The GEMM tiles are beta=0: the zero fill tensorize keeps in front of each is dead.
    gemms = [f"{name}_o" for name, _ in tiles if name.startswith("wino_gemm")]
    mod = drop_dead_inits(sch.mod, gemms)
    oh, ow = g.out_hw
    plan = WinogradPlan("winograd", reason, tile=m, band_tile_rows=vt, band_parallel=band_parallel,
                        block_parallel=o_parallel, tiles_per_band=vt * ceil_div(ow, m),
                        bands=g.n * ceil_div(oh, m) // vt, mr=DEFAULT_TILES[isa.name][0],
                        weight_bytes=4 * int(np.prod(blocked_weight_shape(g, m))))
    return mod, plan
