"""FP32 depthwise and narrow-group convolution: one output row of NCHW16c, one parametric LLVM
IR generator.

Channels are the vector lanes (XNNPACK's dwconv idea): a depthwise tap is one vector FMA per
output pixel, input vector times the tap's weight vector, with no reduction across lanes. One
call computes `n` output pixels of one row for the 16 channels of a block:
    out[x, c] = act(sum over (r, s) of in[x*pix + r*row + s*col + c] * w[r, s, c] + bias[c])
The KH*KW weight vectors are loaded once per call and held in registers across the pixel loop
when they fit beside MR accumulators; MR pixels are computed per step (their input loads fold
into the FMAs), then single pixels for the tail. AVX2 runs the block as two 8-lane halves, each
with its own taps in registers. Where the taps do not fit (5x5 on AVX2, 7x7 on AVX-512) they are
read from memory (L1) inside the loop instead of being spilled.

Groups of G = 2, 4 or 8 channels with G outputs each (ResNeXt's 3x3 layers: `group`): a group
never straddles a vector, so every output lane's inputs are in the same input vector, G lanes
wide. Per tap the kernel loads the input vector once per pixel and, for each j < G, permutes
it so every lane holds lane j of its own group ((lane // G) * G + j) and multiplies by the
weight vector of (tap, j): G permutes and G FMAs per pixel and tap, no multiplied zeros (the
block-diagonal direct conv does 16 / G times the FMAs). Within a 128-bit lane (G <= 4) the
permute is an immediate shuffle; G = 8 on AVX-512 crosses lanes (vpermps, an index register).
    out[x, c] = act(sum over (r, s, j) of in[x*pix + r*row + s*col + (c // G) * G + j]
                    * w[r, s, j, c] + bias[c])

Signature (strides in elements; `pix` = stride*16, `col` = dilation*16, `row` = dilation * the
input row's length in elements):
    void mk_f32_dwconv_<KH>x<KW>_<MR>x16_<isa>[_bias][_relu|_clip](ptr in, i32 pix, i32 col,
        i32 row, ptr w, ptr out, i32 n [, ptr bias] [, float lo, float hi])
with weights (KH, KW, 16); `mk_f32_gconv<G>_...`, the same arguments, weights (KH, KW, G, 16).
"""

from __future__ import annotations

from dataclasses import dataclass

from .f32_gemm import NO_EPILOGUE, Epilogue, TileError, activation_definitions, activation_ir, clip_bounds_ir
from .f32_vmap import merged
from .isa import Isa, normalize_ints

BLOCK = 16  # channels per call: the NCHW16c block


@dataclass(frozen=True)
class DwKernel:
    isa: Isa
    kh: int
    kw: int
    mr: int  # output pixels per step of the pixel loop
    epilogue: Epilogue = NO_EPILOGUE
    group: int = 1  # channels per group (and outputs per group when > 1); 1: depthwise

    def __post_init__(self):
        normalize_ints(self, {"kh": "KH", "kw": "KW", "mr": "MR", "group": "group"}, TileError)
        if self.isa.arch == "x86" and self.isa.lanes % self.group:
            raise TileError(f"a group of {self.group} channels must divide {self.isa.name}'s {self.isa.lanes} lanes")
        if self.isa.arch != "x86" or BLOCK % self.isa.lanes:
            raise TileError(f"depthwise kernels are x86 kernels over a {BLOCK}-channel block, not {self.isa.name}")
        if self.epilogue.residual:
            raise TileError("a depthwise kernel's epilogue takes a bias and an activation, not a residual")
        if self.mr + 1 + self.live_inputs > self.isa.vector_registers:
            raise TileError(f"MR={self.mr} accumulators do not fit in {self.isa.name}'s registers")

    @property
    def halves(self) -> int:
        return BLOCK // self.isa.lanes

    @property
    def taps(self) -> int:
        return self.kh * self.kw

    @property
    def weight_vectors(self) -> int:
        return self.taps * self.group

    @property
    def live_inputs(self) -> int:
        """Input vectors held across a tap's G permutes: one per pixel of the step (none for
        depthwise, where each feeds one FMA)."""
        return self.mr if self.group > 1 else 0

    @property
    def taps_in_registers(self) -> bool:
        """KH*KW weight vectors + MR accumulators + three spare fit in the register file. The
        spares hold input vectors: with stride 1 (a constant once the kernel is inlined) LLVM
        loads each input column once and reuses it across the taps of neighbouring pixels,
        which keeps a few live. With fewer spares LLVM spilled (5x5 on AVX-512 at MR 5 and 6,
        3x3 on AVX2 at MR 6). The epilogue's constants count too: the bias vector, ReLU's zero,
        clip's two bounds. Groups never hold them (their tap loop loads them)."""
        return self.group == 1 and (self.taps + self.mr + 3 + epilogue_registers(self.epilogue)
                                    <= self.isa.vector_registers)

    @property
    def name(self) -> str:
        ep = self.epilogue
        suffix = ("_bias" if ep.bias else "") + (f"_{ep.act}" if ep.act else "")
        op = "dwconv" if self.group == 1 else f"gconv{self.group}"
        return f"mk_f32_{op}_{self.kh}x{self.kw}_{self.mr}x{BLOCK}_{self.isa.name}{suffix}"

    def llvm_ir(self) -> str:
        return _generate(self)


def epilogue_registers(ep: Epilogue) -> int:
    # A vector-math activation runs on one accumulator at a time after the taps, with a few
    # temporaries of its own (its constants are memory operands).
    return int(ep.bias) + {None: 0, "relu": 1, "clip": 2}.get(ep.act, 4)


def default_mr(isa: Isa, kh: int, kw: int, epilogue: Epilogue = NO_EPILOGUE, group: int = 1) -> int:
    """The widest pixel step that leaves the taps in registers (DwKernel.taps_in_registers),
    at most 8; 4 when they cannot stay there anyway (then they come from L1 or LLVM's spill
    slots, one load per FMA either way, and only the accumulators matter). Groups: GROUP_MR."""
    if group > 1:
        return GROUP_MR[isa.name][group]
    room = isa.vector_registers - kh * kw - 3 - epilogue_registers(epilogue)
    return min(8, room) if room >= 2 else 4


# The grouped kernel's widest pixel step per ISA and G: a pixel holds an accumulator and its
# input vector across the G permutes. Fewer than 8 pixels leave FMA latency exposed (each
# pixel's FMAs form one chain), more spill. The largest steps with no stack traffic in the tap
# loop (test_f32_dwconv checks it), except G = 8 on AVX-512, whose permute is two shuffles
# (vshufps, vpermpd) with temporaries: 7-8 pixels spill about one access per 4 FMAs there and
# still ran 1.2x the 4-5 pixels that fit (Zen 5, ResNeXt's 256-channel 28x28 layer, 146 against
# 122 GFLOP/s). A vpermps with a constant index measured the same as LLVM's pair.
GROUP_MR = {"avx512": {2: 10, 4: 10, 8: 8}, "avx2": {2: 4, 4: 5, 8: 6}}


def row_mr(isa: Isa, kh: int, kw: int, ow: int, epilogue: Epilogue = NO_EPILOGUE, group: int = 1) -> int:
    """The pixel step for a row of `ow` pixels: at most default_mr, chosen to waste least on the
    single-pixel tail, whose KH*KW*G FMAs form one dependent chain. Cost model, in FMA slots: a
    step of m pixels costs max(m, CHAINS) (fewer than CHAINS independent accumulators leave the
    FMA pipes idle: latency 4 x 2 pipes), a tail pixel CHAINS. A 14-wide row then runs as two
    steps of 7 instead of one of 8 and six single pixels."""
    chains = 8
    best = default_mr(isa, kh, kw, epilogue, group)
    cost = lambda m: (ow // m) * max(m, chains) + (ow % m) * chains  # noqa: E731
    return min(range(2, best + 1), key=lambda m: (cost(m), -m)) if best >= 2 else best


def _generate(k: DwKernel) -> str:
    lanes, vt = k.isa.lanes, k.isa.vector_type
    fma = f"@llvm.fma.v{lanes}f32"
    ep = k.epilogue
    params = "ptr noalias %in, i32 %pix, i32 %col, i32 %row, ptr noalias %w, ptr noalias %out, i32 %n"
    params += ", ptr noalias %bias" if ep.bias else ""
    params += ", float %lo, float %hi" if ep.act == "clip" else ""
    out = [f"define internal void @{k.name}({params}) alwaysinline {{", "entry:"]
    for v in ("pix", "col", "row", "n"):
        out.append(f"  %{v}64 = sext i32 %{v} to i64")
    if ep.act == "clip":
        out += clip_bounds_ir(vt, lanes)
    out.append("  br label %h0")
    for h in range(k.halves):
        out += _half(k, h, vt, fma)
    out += ["done:", "  ret void", "}", f"declare {vt} {fma}({vt}, {vt}, {vt})",
            *activation_definitions(ep.act, lanes),
            "!0 = distinct !{!0, !1}", '!1 = !{!"llvm.loop.unroll.disable"}', ""]
    return "\n".join(merged(out))


def _half(k: DwKernel, h: int, vt: str, fma: str) -> list[str]:
    """Lanes [h*lanes, (h+1)*lanes) of every pixel: taps, MR-pixel steps, single-pixel tail."""
    lanes, ep = k.isa.lanes, k.epilogue
    p = f"h{h}"
    nxt = f"h{h + 1}" if h + 1 < k.halves else "done"
    out = [f"h{h}:"]

    g = k.group
    taps_rs = [(r, s) for r in range(k.kh) for s in range(k.kw)]

    def tap(r: int, s: int, where: str) -> str:
        """Depthwise: the weight vector of tap (r, s) (groups load theirs in tap_loop)."""
        name = f"%{p}{where}w{r}_{s}"
        out.append(f"  {name}p = getelementptr inbounds float, ptr %w, i64 {(r * k.kw + s) * BLOCK + h * lanes}")
        out.append(f"  {name} = load {vt}, ptr {name}p, align 4")
        return name

    hoisted = {}
    if k.taps_in_registers:
        hoisted = {rs: tap(*rs, "") for rs in taps_rs}
    if ep.bias:
        out.append(f"  %{p}bp = getelementptr inbounds float, ptr %bias, i64 {h * lanes}")
        out.append(f"  %{p}b = load {vt}, ptr %{p}bp, align 4")
    init = f"%{p}b" if ep.bias else "zeroinitializer"

    def unrolled_taps(loop: str, count: int) -> list[str]:
        """Depthwise: every tap unrolled, its weight a hoisted register or an L1 load."""
        taps = hoisted or {rs: tap(*rs, loop) for rs in taps_rs}
        accs = [init] * count
        for r in range(k.kh):
            for s in range(k.kw):
                out.append(f"  %{p}{loop}o{r}_{s} = add i64 %{p}{loop}rowoff{r}, {s}")
                for m in range(count):
                    a = f"%{p}{loop}a{r}_{s}_{m}"
                    out.append(f"  {a}o = add i64 %{p}{loop}xo{m}, %{p}{loop}c{r}_{s}")
                    out.append(f"  {a}p = getelementptr inbounds float, ptr %in, i64 {a}o")
                    out.append(f"  {a} = load {vt}, ptr {a}p, align 4")
                    out.append(f"  %{p}{loop}acc{r}_{s}_{m} = call {vt} {fma}({vt} {a}, {vt} {taps[r, s]}, {vt} {accs[m]})")
                    accs[m] = f"%{p}{loop}acc{r}_{s}_{m}"
        return accs

    # Lane i of a permuted input holds lane j of i's group.
    masks = [", ".join(f"i32 {i // g * g + j}" for i in range(lanes)) for j in range(g)]

    def tap_loop(loop: str, count: int) -> list[str]:
        """Groups: the taps as a loop that is not unrolled, so each weight vector is loaded
        inside it, next to its G x MR uses. Unrolled, LLVM hoisted all KH*KW*G of them out of
        the pixel loop and spilled them, with the inputs and accumulators after them."""
        q = f"%{p}{loop}"
        entry, body = f"{p}{loop}", f"{p}{loop}k"
        out.append(f"  br label %{body}")
        out.append(f"{body}:")
        out.append(f"  {q}t = phi i64 [0, %{entry}], [{q}tn, %{body}]")
        for m in range(count):
            out.append(f"  {q}acc{m} = phi {vt} [{init}, %{entry}], [{q}acc{m}_{g - 1}, %{body}]")
        out.extend([f"  {q}r = udiv i64 {q}t, {k.kw}", f"  {q}s = urem i64 {q}t, {k.kw}",
                    f"  {q}ro = mul i64 {q}r, %row64", f"  {q}so = mul i64 {q}s, %col64", f"  {q}c = add i64 {q}ro, {q}so",
                    f"  {q}wt = mul i64 {q}t, {g * BLOCK}"])
        for m in range(count):
            a = f"{q}a{m}"
            out.extend([f"  {a}o = add i64 {q}xo{m}, {q}c", f"  {a}p = getelementptr inbounds float, ptr %in, i64 {a}o",
                        f"  {a} = load {vt}, ptr {a}p, align 4"])
        for j in range(g):
            w = f"{q}w{j}"
            out.extend([f"  {w}o = add i64 {q}wt, {j * BLOCK + h * lanes}",
                        f"  {w}p = getelementptr inbounds float, ptr %w, i64 {w}o", f"  {w} = load {vt}, ptr {w}p, align 4"])
            for m in range(count):
                prev = f"{q}acc{m}" if j == 0 else f"{q}acc{m}_{j - 1}"
                out.extend([f"  {q}a{m}j{j} = shufflevector {vt} {q}a{m}, {vt} poison, <{lanes} x i32> <{masks[j]}>",
                            f"  {q}acc{m}_{j} = call {vt} {fma}({vt} {q}a{m}j{j}, {vt} {w}, {vt} {prev})"])
        out.extend([f"  {q}tn = add i64 {q}t, 1", f"  {q}tm = icmp ult i64 {q}tn, {k.taps}",
                    f"  br i1 {q}tm, label %{body}, label %{latch(loop)}, !llvm.loop !0", f"{latch(loop)}:"])
        return [f"{q}acc{m}_{g - 1}" for m in range(count)]

    def latch(loop: str) -> str:
        """The block a pixel step ends in: its own, or after the tap loop."""
        return f"{p}{loop}" if g == 1 else f"{p}{loop}e"

    def pixels(loop: str, count: int, x: str) -> None:
        accs = unrolled_taps(loop, count) if g == 1 else tap_loop(loop, count)
        for m in range(count):
            v = activation_ir(ep.act, vt, lanes, accs[m], f"{p}{loop}{m}", out)
            out.append(f"  %{p}{loop}x{m} = add i64 {x}, {m}")
            out.append(f"  %{p}{loop}yo{m} = mul i64 %{p}{loop}x{m}, {BLOCK}")
            out.append(f"  %{p}{loop}yoh{m} = add i64 %{p}{loop}yo{m}, {h * lanes}")
            out.append(f"  %{p}{loop}yp{m} = getelementptr inbounds float, ptr %out, i64 %{p}{loop}yoh{m}")
            out.append(f"  store {vt} {v}, ptr %{p}{loop}yp{m}, align 4")

    def offsets(loop: str, count: int, x: str) -> None:
        """Input offsets: per pixel x*pix + half; per tap r*row + s*col (depthwise)."""
        for m in range(count):
            out.append(f"  %{p}{loop}xm{m} = add i64 {x}, {m}")
            out.append(f"  %{p}{loop}xp{m} = mul i64 %{p}{loop}xm{m}, %pix64")
            out.append(f"  %{p}{loop}xo{m} = add i64 %{p}{loop}xp{m}, {h * lanes}")
        for r in range(k.kh if g == 1 else 0):  # groups: tap_loop computes its tap's offset
            out.append(f"  %{p}{loop}rowoff{r} = mul i64 %row64, {r}")
            for s in range(k.kw):
                out.append(f"  %{p}{loop}cs{r}_{s} = mul i64 %col64, {s}")
                out.append(f"  %{p}{loop}c{r}_{s} = add i64 %{p}{loop}rowoff{r}, %{p}{loop}cs{r}_{s}")

    # MR-pixel steps while a whole step fits, then one pixel at a time. Both loops test before
    # their first trip, so n < MR (or n = 0) runs only the tail (or nothing).
    out += [f"  br label %{p}mh",
            f"{p}mh:", f"  %{p}mx = phi i64 [0, %h{h}], [%{p}mxn, %{latch('m')}]",
            f"  %{p}mend = add i64 %{p}mx, {k.mr}", f"  %{p}mok = icmp sle i64 %{p}mend, %n64",
            f"  br i1 %{p}mok, label %{p}m, label %{p}th",
            f"{p}m:"]
    offsets("m", k.mr, f"%{p}mx")
    pixels("m", k.mr, f"%{p}mx")
    out += [f"  %{p}mxn = add i64 %{p}mx, {k.mr}", f"  br label %{p}mh, !llvm.loop !0",
            f"{p}th:", f"  %{p}tx = phi i64 [%{p}mx, %{p}mh], [%{p}txn, %{latch('t')}]",
            f"  %{p}tok = icmp slt i64 %{p}tx, %n64", f"  br i1 %{p}tok, label %{p}t, label %{nxt}",
            f"{p}t:"]
    offsets("t", 1, f"%{p}tx")
    pixels("t", 1, f"%{p}tx")
    out += [f"  %{p}txn = add i64 %{p}tx, 1", f"  br label %{p}th, !llvm.loop !0"]
    return out
