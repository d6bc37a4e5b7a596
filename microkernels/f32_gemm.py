"""FP32 GEMM tile: C[MR, NR] (+)= A[MR, K] @ B[K, NR], one parametric LLVM IR generator.

The K loop lives inside the kernel and the MR x NR/lanes accumulators stay in vector registers
for all of it: C is loaded once before the loop (or zeroed, for the beta=0 variant) and stored
once after. Each K step broadcasts MR elements of A and loads NR/lanes vectors of B.
Row strides of A, B and C are arguments, so one kernel serves packed GEMM panels and direct
convolution on NCHWc data alike; columns are unit stride.

Signature of every generated kernel (all strides in elements):
    void mk_f32_gemm_<MR>x<NR>_<isa>[_beta0](ptr a, i32 lda, ptr b, i32 ldb, ptr c, i32 ldc, i32 k)

An epilogue (oneDNN's post-ops) may follow the last K step, applied to the register tile
before its one store, so a fused layer writes its output once:
    C = act(acc + bias[j] + R[i, j]),   act: none, relu (max with 0), clip (to [lo, hi]) or one
    of the vector math's activations (VECTOR_ACTIVATIONS: SiLU, sigmoid, GELU, ...)
Each part is optional and adds arguments after the kernel's own, in this order:
    ptr bias (NR floats) | ptr r, i32 ldr (residual tile, row stride ldr) | float lo, float hi

Column groups (`col_block` = G > 0): the NR columns are NR/G groups of G, and group g of B, C
and the residual lies g*bgs, g*cgs, g*rgs elements after group 0 (each group's rows keep their
own row stride). A convolution tile spanning two 16-channel output blocks of NCHW16c is such a
tile: its blocks are a whole output plane apart. The group strides are arguments after the
kernel's own (`i32 bgs, i32 cgs`, and `i32 rgs` after the residual's `ldr`); names carry `g<G>`
(mk_f32_brgemm_7x32g16_avx512_beta0).

The batch-reduce variant (oneDNN's brgemm) sums n1*n2*n3 such products into one register tile,
C (+)= sum over (i1, i2, i3) of A[a + i1*sa1 + i2*sa2 + i3*sa3] @ B_(i1,i2,i3), where the B
panels follow one another in memory (each k*ldb long). A direct convolution is exactly this
with (i1, i2, i3) = (input-channel block, kh, kw): C is loaded and stored once per output tile.
    void mk_f32_brgemm_<MR>x<NR>_<isa>[_beta0](ptr a, i32 lda, ptr b, i32 ldb, ptr c, i32 ldc,
        i32 k, i32 n1, i32 sa1, i32 n2, i32 sa2, i32 n3, i32 sa3)
With `prefetch` (suffix _pf), every B load also prefetches into L2 the element one call's B
further on (k*ldb, or n1*n2*n3*k*ldb for a batch): what the next call reads when calls walk B
in order, as a conv whose reduction is cut into chunks of input-channel blocks does, or
Winograd's GEMMs over U's panels. A network's weights come from DRAM; a panel streamed on
demand stalls every FMA behind it, while one fetched a whole call ahead arrives in time.
"""

from __future__ import annotations

from dataclasses import dataclass

from .f32_vmap import merged, vector_function
from .isa import ISAS, Isa, normalize_ints, positive_int


class TileError(ValueError):
    """A tile shape the ISA cannot hold in registers, or that is malformed."""


# The vector math's activations an epilogue applies (f32_vmap.vector_function, the same
# instructions as the standalone row kernels: fused equals unfused bit for bit).
VECTOR_ACTIVATIONS = ("sigmoid", "silu", "gelu", "gelu_tanh", "tanh", "hardsigmoid", "hardswish")
ACTIVATIONS = (None, "relu", "clip", *VECTOR_ACTIVATIONS)


@dataclass(frozen=True)
class Epilogue:
    """What happens to the finished accumulators before their store (module doc)."""

    bias: bool = False
    residual: bool = False
    act: str | None = None  # None, "relu", "clip" (bounds are kernel arguments) or a VECTOR_ACTIVATIONS name

    def __post_init__(self):
        if self.act not in ACTIVATIONS:
            raise TileError(f"epilogue activation must be one of {ACTIVATIONS}, got {self.act!r}")

    def __bool__(self) -> bool:
        return self.bias or self.residual or self.act is not None

    @property
    def suffix(self) -> str:
        return "".join(f"_{p}" for p, on in (("bias", self.bias), ("res", self.residual), (self.act, self.act)) if on)


NO_EPILOGUE = Epilogue()


@dataclass(frozen=True)
class GemmKernel:
    isa: Isa
    mr: int
    nr: int
    accumulate: bool = True  # False: the beta=0 variant, C is overwritten
    batch_reduce: bool = False  # True: sum a 3-deep strided batch of A blocks (see module doc)
    epilogue: Epilogue = NO_EPILOGUE
    col_block: int = 0  # > 0: columns in groups of this many, each group at its own offset
    prefetch: bool = False  # prefetch the B panel(s) that follow this call's (module doc)

    def __post_init__(self):
        normalize_ints(self, {"mr": "MR", "nr": "NR"}, TileError)
        check_tile(self.isa, self.mr, self.nr)
        g = self.col_block
        if g and (not isinstance(g, int) or g < 0 or g % self.isa.lanes or self.nr % g or g == self.nr):
            raise TileError(f"col_block={g!r} must be a multiple of {self.isa.lanes} that divides NR={self.nr} "
                            "into at least two groups (0: one contiguous group)")
        if not isinstance(self.epilogue, Epilogue):
            raise TileError(f"epilogue must be an Epilogue, got {type(self.epilogue).__name__}")

    @property
    def vectors_per_row(self) -> int:
        return self.nr // self.isa.lanes

    @property
    def fmas_per_k(self) -> int:
        return self.mr * self.vectors_per_row

    @property
    def name(self) -> str:
        op = "brgemm" if self.batch_reduce else "gemm"
        suffix = ("" if self.accumulate else "_beta0") + ("_pf" if self.prefetch else "")
        groups = f"g{self.col_block}" if self.col_block else ""
        return f"mk_f32_{op}_{self.mr}x{self.nr}{groups}_{self.isa.name}{suffix}{self.epilogue.suffix}"

    def column(self, j: int, stride: str) -> str:
        """IR for the element offset of column vector j from column 0: j*lanes, or its group's
        offset (group index times the `stride` argument) plus its place in the group."""
        at = j * self.isa.lanes
        if not self.col_block:
            return str(at)
        return f"%{stride}g{at // self.col_block}_{at % self.col_block}"

    def column_offsets(self, stride: str) -> list[str]:
        """Definitions of the names column(j, stride) uses."""
        if not self.col_block:
            return []
        out = []
        for j in range(self.vectors_per_row):
            at = j * self.isa.lanes
            g, off = divmod(at, self.col_block)
            out.append(f"  %{stride}g{g}_{off}m = mul i64 %{stride}64, {g}")
            out.append(f"  %{stride}g{g}_{off} = add i64 %{stride}g{g}_{off}m, {off}")
        return out

    def llvm_ir(self) -> str:
        return _generate_batched(self) if self.batch_reduce else _generate(self)


def registers_needed(isa: Isa, mr: int, nr: int) -> int:
    """Vector registers a tile occupies in its K loop: accumulators, B row, broadcast."""
    nv = nr // isa.lanes
    broadcast = 0 if (isa.embedded_broadcast and nv == 1) else 1
    return mr * nv + nv + broadcast


def check_tile(isa: Isa, mr: int, nr: int) -> None:
    for label, v in (("MR", mr), ("NR", nr)):
        positive_int(label, v, TileError)
    if nr % isa.lanes:
        raise TileError(f"NR={nr} must be a multiple of the {isa.name} vector width ({isa.lanes} floats)")
    need = registers_needed(isa, mr, nr)
    if need > isa.vector_registers:
        raise TileError(
            f"a {mr}x{nr} tile needs {need} vector registers (MR*NR/{isa.lanes} accumulators + "
            f"NR/{isa.lanes} B vectors + broadcast) but {isa.name} has {isa.vector_registers}"
        )


def max_tiles(isa: Isa) -> list[tuple[int, int]]:
    """Every (MR, NR) whose MR is the largest the register file allows for that NR."""
    tiles = []
    nr = isa.lanes
    while registers_needed(isa, 1, nr) <= isa.vector_registers:
        mr = 1
        while registers_needed(isa, mr + 1, nr) <= isa.vector_registers:
            mr += 1
        tiles.append((mr, nr))
        nr += isa.lanes
    return tiles


# Chosen by measurement (docs/design/kernels.md, "Choosing the tile"). AVX2: 6x16 led three of four sweeps
# here, at the FMA peak. AVX-512: a one-vector-wide tile lets
# every broadcast fold into its FMA ({1to16}), so 28 accumulators fit beside the B vector, and
# NR = 16 is the NCHW16c block of the convolutions; llvm-mca puts it at 96% of the FMA ports.
DEFAULT_TILES = {"avx2": (6, 16), "avx512": (28, 16)}

# The tile of a one-vector output block, for grouped convs whose groups the default block pads
# more (schedules.conv.dispatch.tile_for): RegNetX's 24 channels a group are 3 blocks of 8 on
# AVX2, against 2 of 16 whose padding makes (32/24)^2 = 1.78x the multiply-adds. 14 accumulators
# beside the B vector and the broadcast: measured on the Zen 3 against 12x8 and 8x8 (RegNetX-1.6GF's
# grouped 3x3s 75-87 GFLOP/s of real work, 43-53 on 6x16 with the padding). AVX-512's vector is
# the 16-channel block itself: none.
NARROW_TILES = {"avx2": (14, 8)}

# Whether a tile that runs a whole reduction per call (an unchunked direct conv, the packed
# matmul) prefetches the next call's weight panel (GemmKernel.prefetch); cut reductions and
# Winograd's GEMMs prefetch on every ISA. Measured whole networks, alternating builds, 1 thread:
# AVX-512 on the Zen 5, faster with it (EfficientNet-B0 5.41 -> 5.10 ms, ResNet-50 29.0 -> 28.1,
# ConvNeXt-Tiny 43.96 -> 42.42); AVX2 on the Zen 3, slower with it in all of seven runs (medians
# of ten rounds: ResNet-50 125.3 against 130.4 ms, MobileNetV3-Large 10.36 against 11.25;
# docs/design/conv.md). There a 32-byte B vector fetches each line twice and L2 is half the
# Zen 5's; which of the two costs it was not settled.
PREFETCH_WHOLE_REDUCTIONS = {"avx2": False, "avx512": True}

# The plain matmul's tiles (schedules.matmul) per ISA: (MR, NR, the share of the FMA peak the
# tile reached L1-resident on the Zen 5 host, best of three). schedules.matmul.plan weighs
# them per shape: padding N to whole tiles, and for the rows MR does not divide, a packed A
# or a second op. Below 12 accumulators a tile loses (AVX2 4x16: 86%).
MATMUL_TILES = {
    "avx512": ((8, 32, 1.00), (7, 32, 1.00), (6, 32, 1.00), (5, 32, 0.97), (4, 48, 0.99)),
    "avx2": ((6, 16, 0.99), (4, 24, 0.99), (5, 16, 0.96), (3, 24, 0.92)),
}


def matmul_kernels(isa_name: str) -> list[GemmKernel]:
    return [GemmKernel(ISAS[isa_name], mr, nr) for mr, nr, _ in MATMUL_TILES[isa_name]]


def default_kernel(isa_name: str, accumulate: bool = True, batch_reduce: bool = False) -> GemmKernel:
    mr, nr = DEFAULT_TILES[isa_name]
    return GemmKernel(ISAS[isa_name], mr, nr, accumulate, batch_reduce)


def _k_step(kern: GemmKernel, b: str, ap: str, acc: str, nacc: str) -> list[str]:
    """One K step at index %kk: NR/lanes B loads, MR broadcasts of A, MR*NR/lanes FMAs (and,
    with prefetch, one prefetch per B vector, %pfd elements ahead)."""
    mr, nv, lanes, vt = kern.mr, kern.vectors_per_row, kern.isa.lanes, kern.isa.vector_type
    fma = f"@llvm.fma.v{lanes}f32"
    out = ["  %brow = mul i64 %kk, %ldb64"]
    for j in range(nv):
        out.append(f"  %bo{j} = add i64 %brow, {kern.column(j, 'bgs')}")
        out.append(f"  %bp{j} = getelementptr inbounds float, ptr {b}, i64 %bo{j}")
        out.append(f"  %bv{j} = load {vt}, ptr %bp{j}, align 4")
        if kern.prefetch:
            out += prefetch_b("float", j)
    for i in range(mr):
        out.append(f"  %aep{i} = getelementptr inbounds float, ptr {ap}{i}, i64 %kk")
        out.append(f"  %as{i} = load float, ptr %aep{i}, align 4")
        out.append(f"  %ai{i} = insertelement {vt} poison, float %as{i}, i64 0")
        out.append(f"  %ab{i} = shufflevector {vt} %ai{i}, {vt} poison, <{lanes} x i32> zeroinitializer")
        for j in range(nv):
            out.append(f"  {nacc}{i}_{j} = call {vt} {fma}({vt} %ab{i}, {vt} %bv{j}, {vt} {acc}{i}_{j})")
    return out


def _declarations(kern: GemmKernel) -> list[str]:
    """The intrinsics a kernel calls besides the FMA (declared with it)."""
    return [PREFETCH_DECLARATION] if kern.prefetch else []


PREFETCH_DECLARATION = "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)"


def prefetch_b(elem: str, j: int) -> list[str]:
    """The prefetch that follows B vector j's load at %bp<j> (this family's and
    microkernels.int_gemm's): %pfd elements of `elem` further on, into L2 (locality 2:
    prefetcht1): the panel is wanted a whole call later, and in L1 it would evict the A window
    this call still reads. One 64-byte vector (AVX-512) is one cache line; AVX2 fetches each
    line twice (where that costs: PREFETCH_WHOLE_REDUCTIONS)."""
    return [f"  %pf{j} = getelementptr {elem}, ptr %bp{j}, i64 %pfd",
            f"  call void @llvm.prefetch.p0(ptr %pf{j}, i32 0, i32 2, i32 1)"]


def batch_prefetch_distance() -> list[str]:
    """%pfd for a batch-reduce kernel: the elements to the panels after this call's, all
    n1*n2*n3 of them (%bstep each)."""
    return ["  %pfn1 = mul i64 %bstep, %n164", "  %pfn2 = mul i64 %pfn1, %n264", "  %pfd = mul i64 %pfn2, %n364"]


def _epilogue_params(kern: GemmKernel) -> str:
    """Arguments after the kernel's own: the column-group strides, then the epilogue's."""
    e, grouped = kern.epilogue, bool(kern.col_block)
    return "".join([", i32 %bgs, i32 %cgs" if grouped else "", ", ptr noalias %bias" if e.bias else "",
                    (", ptr noalias %r, i32 %ldr" + (", i32 %rgs" if grouped else "")) if e.residual else "",
                    ", float %lo, float %hi" if e.act == "clip" else ""])


def _group_strides(kern: GemmKernel) -> list[str]:
    """64-bit copies of the group strides and the column offsets built from them."""
    if not kern.col_block:
        return []
    names = ["bgs", "cgs"] + (["rgs"] if kern.epilogue.residual else [])
    out = [f"  %{v}64 = sext i32 %{v} to i64" for v in names]
    for v in names:
        out += kern.column_offsets(v)
    return out


def clip_bounds_ir(vt: str, lanes: int) -> list[str]:
    """%lov and %hiv: the clip bounds (float arguments %lo, %hi) splat across a vector."""
    out = []
    for b in ("lo", "hi"):
        out.append(f"  %{b}i = insertelement {vt} poison, float %{b}, i64 0")
        out.append(f"  %{b}v = shufflevector {vt} %{b}i, {vt} poison, <{lanes} x i32> zeroinitializer")
    return out


def activation_ir(act: str | None, vt: str, lanes: int, x: str, tag: str, out: list[str]) -> str:
    """Append act(x) to `out` (names suffixed by `tag`); return the result's name. The epilogue
    of every kernel family with one (GEMM tiles, depthwise rows)."""
    if act is None:
        return x
    if act in VECTOR_ACTIVATIONS:  # a call of the vector function, which LLVM inlines
        out.append(f"  %ev{tag} = call {vt} @{vector_function(act, lanes)[0]}({vt} {x})")
        return f"%ev{tag}"
    # x < lo ? lo : x, and x > hi ? hi : x: a NaN compares false and passes through, as it does
    # through the unfused np.maximum / torch.relu / torch.clamp. Still one vmaxps (vminps) each,
    # with the bound as its first operand: on a NaN that instruction returns its second.
    lo = "zeroinitializer" if act == "relu" else "%lov"
    out.append(f"  %lt{tag} = fcmp olt {vt} {x}, {lo}")
    out.append(f"  %ea{tag} = select <{lanes} x i1> %lt{tag}, {vt} {lo}, {vt} {x}")
    x = f"%ea{tag}"
    if act == "clip":
        out.append(f"  %gt{tag} = fcmp ogt {vt} {x}, %hiv")
        out.append(f"  %ec{tag} = select <{lanes} x i1> %gt{tag}, {vt} %hiv, {vt} {x}")
        x = f"%ec{tag}"
    return x


def activation_definitions(act: str | None, lanes: int) -> list[str]:
    """What a kernel module whose epilogue applies `act` must define besides the kernel: the
    vector function activation_ir calls (with its declarations; merge them: f32_vmap.merged)."""
    return vector_function(act, lanes)[1] if act in VECTOR_ACTIVATIONS else []


def _store(kern: GemmKernel, value, cp) -> list[str]:
    """The tile's one store, after the epilogue. value(i, j) / cp(i, j): the finished
    accumulator and the C address of vector j of row i."""
    e, nv, lanes, vt = kern.epilogue, kern.vectors_per_row, kern.isa.lanes, kern.isa.vector_type
    out = []
    if e.residual:
        out.append("  %ldr64 = sext i32 %ldr to i64")
    if e.bias:  # one load per column vector, shared by every row
        for j in range(nv):
            out.append(f"  %biasp{j} = getelementptr inbounds float, ptr %bias, i64 {j * lanes}")
            out.append(f"  %biasv{j} = load {vt}, ptr %biasp{j}, align 4")
    if e.act == "clip":
        out += clip_bounds_ir(vt, lanes)
    for i in range(kern.mr):
        for j in range(nv):
            x = value(i, j)
            if e.bias:
                out.append(f"  %eb{i}_{j} = fadd {vt} {x}, %biasv{j}")
                x = f"%eb{i}_{j}"
            if e.residual:
                out.append(f"  %ro{i}_{j} = mul i64 {i}, %ldr64")
                out.append(f"  %roj{i}_{j} = add i64 %ro{i}_{j}, {kern.column(j, 'rgs')}")
                out.append(f"  %rp{i}_{j} = getelementptr inbounds float, ptr %r, i64 %roj{i}_{j}")
                out.append(f"  %rv{i}_{j} = load {vt}, ptr %rp{i}_{j}, align 4")
                out.append(f"  %er{i}_{j} = fadd {vt} {x}, %rv{i}_{j}")
                x = f"%er{i}_{j}"
            x = activation_ir(e.act, vt, lanes, x, f"{i}_{j}", out)
            out.append(f"  store {vt} {x}, ptr {cp(i, j)}, align 4")
    return out


def _generate(kern: GemmKernel) -> str:
    mr, nv, lanes = kern.mr, kern.vectors_per_row, kern.isa.lanes
    vt = kern.isa.vector_type
    fma = f"@llvm.fma.v{lanes}f32"
    out = [
        f"define internal void @{kern.name}(ptr noalias %a, i32 %lda, ptr noalias %b, i32 %ldb,"
        f" ptr noalias %c, i32 %ldc, i32 %k{_epilogue_params(kern)}) alwaysinline {{",
        "entry:",
        "  %lda64 = sext i32 %lda to i64",
        "  %ldb64 = sext i32 %ldb to i64",
        "  %ldc64 = sext i32 %ldc to i64",
        "  %k64 = sext i32 %k to i64",
    ]
    if kern.prefetch:
        out.append("  %pfd = mul i64 %k64, %ldb64")
    out += _group_strides(kern)
    for i in range(mr):
        out.append(f"  %crow{i} = mul i64 {i}, %ldc64")
        out.append(f"  %arow{i} = mul i64 {i}, %lda64")
        out.append(f"  %ap{i} = getelementptr inbounds float, ptr %a, i64 %arow{i}")
        for j in range(nv):
            out.append(f"  %co{i}_{j} = add i64 %crow{i}, {kern.column(j, 'cgs')}")
            out.append(f"  %cp{i}_{j} = getelementptr inbounds float, ptr %c, i64 %co{i}_{j}")
            if kern.accumulate:
                out.append(f"  %c0_{i}_{j} = load {vt}, ptr %cp{i}_{j}, align 4")
    init = (lambda i, j: f"%c0_{i}_{j}") if kern.accumulate else (lambda i, j: "zeroinitializer")
    # A while loop, so K = 0 leaves C as it was (or zero for beta=0) instead of running once.
    out += ["  %empty = icmp sle i64 %k64, 0", "  br i1 %empty, label %exit, label %loop", "loop:"]
    out.append("  %kk = phi i64 [0, %entry], [%kn, %loop]")
    for i in range(mr):
        for j in range(nv):
            out.append(f"  %acc{i}_{j} = phi {vt} [{init(i, j)}, %entry], [%nacc{i}_{j}, %loop]")
    out += _k_step(kern, "%b", "%ap", "%acc", "%nacc")
    out += [
        "  %kn = add nuw nsw i64 %kk, 1",
        "  %more = icmp slt i64 %kn, %k64",
        # Unrolling only repeats the same FMAs; keeping one K step per iteration keeps the
        # loop small and its FMA count a direct statement of the tile.
        "  br i1 %more, label %loop, label %exit, !llvm.loop !0",
        "exit:",
    ]
    tiles = [(i, j) for i in range(mr) for j in range(nv)]
    for i, j in tiles:
        out.append(f"  %res{i}_{j} = phi {vt} [{init(i, j)}, %entry], [%nacc{i}_{j}, %loop]")
    out += _store(kern, lambda i, j: f"%res{i}_{j}", lambda i, j: f"%cp{i}_{j}")
    out += [
        "  ret void",
        "}",
        f"declare {vt} {fma}({vt}, {vt}, {vt})",
        *_declarations(kern),
        *activation_definitions(kern.epilogue.act, lanes),
        "!0 = distinct !{!0, !1}",
        '!1 = !{!"llvm.loop.unroll.disable"}',
        "",
    ]
    return "\n".join(merged(out))


def _generate_batched(kern: GemmKernel) -> str:
    """The batch-reduce variant. Accumulators and counters live in allocas, which LLVM's SROA
    turns back into registers; that keeps four nested loops free of hand-threaded phis."""
    mr, nv, lanes, vt = kern.mr, kern.vectors_per_row, kern.isa.lanes, kern.isa.vector_type
    tiles = [(i, j) for i in range(mr) for j in range(nv)]
    out = [
        f"define internal void @{kern.name}(ptr noalias %a, i32 %lda, ptr noalias %b, i32 %ldb,"
        f" ptr noalias %c, i32 %ldc, i32 %k, i32 %n1, i32 %sa1, i32 %n2, i32 %sa2, i32 %n3, i32 %sa3"
        f"{_epilogue_params(kern)}) alwaysinline {{",
        "entry:",
    ]
    for v in ("lda", "ldb", "ldc", "k", "n1", "sa1", "n2", "sa2", "n3", "sa3"):
        out.append(f"  %{v}64 = sext i32 %{v} to i64")
    out += _group_strides(kern)
    for i, j in tiles:
        out.append(f"  %slot{i}_{j} = alloca {vt}, align 32")
    out += [f"  %{v} = alloca i64" for v in ("i1p", "i2p", "i3p", "kp")]
    out += ["  %bcur = alloca ptr", "  store ptr %b, ptr %bcur", "  %bstep = mul i64 %k64, %ldb64"]
    if kern.prefetch:
        out += batch_prefetch_distance()
    for i, j in tiles:
        out.append(f"  %crow{i}_{j} = mul i64 {i}, %ldc64")
        out.append(f"  %coff{i}_{j} = add i64 %crow{i}_{j}, {kern.column(j, 'cgs')}")
        out.append(f"  %cp{i}_{j} = getelementptr inbounds float, ptr %c, i64 %coff{i}_{j}")
        init = f"%c0_{i}_{j}" if kern.accumulate else "zeroinitializer"
        if kern.accumulate:
            out.append(f"  %c0_{i}_{j} = load {vt}, ptr %cp{i}_{j}, align 4")
        out.append(f"  store {vt} {init}, ptr %slot{i}_{j}, align 32")
    step = [f"  %acc{i}_{j} = load {vt}, ptr %slot{i}_{j}, align 32" for i, j in tiles]
    step += _k_step(kern, "%bb", "%ap", "%acc", "%nacc")
    step += [f"  store {vt} %nacc{i}_{j}, ptr %slot{i}_{j}, align 32" for i, j in tiles]
    out += batch_loops("float", "float", mr, "%k64", step)
    for i, j in tiles:
        out.append(f"  %res{i}_{j} = load {vt}, ptr %slot{i}_{j}, align 32")
    out += _store(kern, lambda i, j: f"%res{i}_{j}", lambda i, j: f"%cp{i}_{j}")
    out += [
        "  ret void",
        "}",
        f"declare {vt} @llvm.fma.v{lanes}f32({vt}, {vt}, {vt})",
        *_declarations(kern),
        *activation_definitions(kern.epilogue.act, lanes),
        "!0 = distinct !{!0, !1}",
        '!1 = !{!"llvm.loop.unroll.disable"}',
        "",
    ]
    return "\n".join(merged(out))


def batch_loops(a_elem: str, b_elem: str, mr: int, k_steps: str, step: list[str]) -> list[str]:
    """The batch-reduce kernels' loop nest (this family's and microkernels.int_gemm's): three
    counted loops over the batch around a K loop of `k_steps` iterations running `step` (which
    reads A rows at %ap<i>, B at %bb, the K index %kk). Expects %n164..%sa364, %lda64, %bstep and
    the allocas %i1p %i2p %i3p %kp %bcur; ends at label %done. Each header tests before its
    first trip, so any count <= 0 runs nothing and the tile keeps its initial value."""
    out = [
        "  store i64 0, ptr %i1p", "  br label %h1",
        "h1:", "  %i1 = load i64, ptr %i1p", "  %t1 = icmp slt i64 %i1, %n164", "  br i1 %t1, label %s1, label %done",
        "s1:", "  store i64 0, ptr %i2p", "  br label %h2",
        "h2:", "  %i2 = load i64, ptr %i2p", "  %t2 = icmp slt i64 %i2, %n264", "  br i1 %t2, label %s2, label %e1",
        "s2:", "  store i64 0, ptr %i3p", "  br label %h3",
        "h3:", "  %i3 = load i64, ptr %i3p", "  %t3 = icmp slt i64 %i3, %n364", "  br i1 %t3, label %s3, label %e2",
        "s3:",
        "  %o1 = mul i64 %i1, %sa164", "  %o2 = mul i64 %i2, %sa264", "  %o3 = mul i64 %i3, %sa364",
        "  %o12 = add i64 %o1, %o2", "  %o123 = add i64 %o12, %o3",
        f"  %abase = getelementptr inbounds {a_elem}, ptr %a, i64 %o123",
        "  %bb = load ptr, ptr %bcur",
    ]
    for i in range(mr):
        out.append(f"  %arow{i} = mul i64 {i}, %lda64")
        out.append(f"  %ap{i} = getelementptr inbounds {a_elem}, ptr %abase, i64 %arow{i}")
    out += ["  store i64 0, ptr %kp", "  br label %hk",
            "hk:", "  %kk = load i64, ptr %kp", f"  %tk = icmp slt i64 %kk, {k_steps}", "  br i1 %tk, label %sk, label %e3",
            "sk:"]
    out += step
    return out + [
        "  %kn = add nsw i64 %kk, 1", "  store i64 %kn, ptr %kp",
        # One K step per iteration, no unrolling: the step is MR x NR/lanes multiplies already,
        # and a loop that is exactly one step states the tile in its instruction counts.
        "  br label %hk, !llvm.loop !0",
        "e3:",
        f"  %bn = getelementptr inbounds {b_elem}, ptr %bb, i64 %bstep", "  store ptr %bn, ptr %bcur",
        "  %i3n = add nsw i64 %i3, 1", "  store i64 %i3n, ptr %i3p", "  br label %h3",
        "e2:", "  %i2n = add nsw i64 %i2, 1", "  store i64 %i2n, ptr %i2p", "  br label %h2",
        "e1:", "  %i1n = add nsw i64 %i1, 1", "  store i64 %i1n, ptr %i1p", "  br label %h1",
        "done:",
    ]
