"""Integer GEMM tiles on AMX: C[MR, NR] += A[MR, K] @ B[K, NR], uint8 A, int8 B, int32 C, on the
tile registers (AMX-INT8, `tdpbusd`).

A tile register holds up to 16 rows of 64 bytes. One `tdpbusd` multiplies a tile of A (rows x
64 uint8: 64 k of `rows` pixels) by a tile of B (16 rows of 64 bytes: 16 groups of 4 k, each row
16 columns x 4 k, the order vpdpbusd takes B in) into a tile of C (rows x 16 int32): 16384 MACs
at 16 rows, where one zmm vpdpbusd does 64. The kernel holds A_TILES x B_TILES tiles of C, so
MR = A_TILES * rows and NR = 16 * B_TILES, and needs A_TILES + B_TILES more for the operands:
eight tile registers in all, hence 2 x 2 (MR up to 32, NR 32) or 1 x 3 (MR up to 16, NR 48).
`rows` below 16 fits the tile to an output row (14 for 56 or 28 pixels, 7 for 7): a tdpbusd of
fewer rows costs less, though not proportionally.

Operands are those of microkernels.int_gemm's vpdpbusd tiles, so the packing and the intrinsics
are shared: A row-major (A[i, k] at a + i*lda + k), B packed in groups of 4 k (group g of column
j at b + g*ldb + 4*j), C int32 (C[i, j] at c + i*ldc + j); strides in elements. K must be a
multiple of 64, one tile's depth: the conv pads its channels to that (`k_step`), and so one
tile configuration serves the whole call (loading another zeroes every tile).

The kernel is batch-reduce:
    void mk_u8s8_brgemm_<MR>x<NR>_amxint8[_beta0](ptr a, i32 lda, ptr b, i32 ldb, ptr c, i32 ldc,
        i32 k, i32 n1, i32 sa1, i32 n2, i32 sa2, i32 n3, i32 sa3)
sums n1*n2*n3 products A(a + i1*sa1 + i2*sa2 + i3*sa3) @ B(panel) into C, the B panels one
after another (each k/4*ldb long), as microkernels.int_gemm's brgemm does; C is loaded first
(accumulate) or the C tiles start from tilezero (_beta0), and stored once at the end. One call
covers a conv tile's whole reduction, so the conv tiles take the beta=0 kernel: loading a tile
of zeros the schedule wrote first costs a 4 KiB fill and four tile loads per 32 x 32 tile, as
much as the whole 64-deep step of a 1x1 layer with 64 channels.

The tile configuration is the caller's, once per thread and run of calls:
    void <name>_config()     the shapes above (ldtilecfg)
    void <name>_release()    the tiles back to the init state (tilerelease)
ldtilecfg costs about 200 cycles, as much as a whole 64-deep step of a 32 x 32 tile, so a kernel
that configured itself would spend half its time on a 1x1 layer's short K doing so. The
configuration is thread state, saved and restored by the OS; nothing between the calls may
configure the tiles otherwise.

Running it needs a host with amx_tile and amx_int8 whose kernel granted the process the tile
state (isa.request_amx); no emulator here implements AMX.
"""

from __future__ import annotations

from dataclasses import dataclass

from .f32_gemm import TileError, batch_loops
from .isa import AMX_INT8, Isa, normalize_ints

TILE_ROWS = 16  # rows of a tile register
TILE_BYTES = 64  # bytes per row
TILE_REGISTERS = 8
K_DEPTH = TILE_BYTES  # k per tdpbusd: a row of A holds 64 uint8
C_COLS = TILE_BYTES // 4  # int32 columns per C tile


@dataclass(frozen=True)
class AmxGemmKernel:
    rows: int  # pixels per A tile (<= 16)
    a_tiles: int = 2
    b_tiles: int = 2
    isa: Isa = AMX_INT8
    accumulate: bool = True  # False: beta=0, the C tiles start from zero

    def __post_init__(self):
        normalize_ints(self, ("rows", "a_tiles", "b_tiles"), TileError)
        if self.rows > TILE_ROWS:
            raise TileError(f"an AMX tile holds at most {TILE_ROWS} rows, got rows={self.rows}")
        need = self.a_tiles * self.b_tiles + self.a_tiles + self.b_tiles
        if need > TILE_REGISTERS:
            raise TileError(f"{self.a_tiles} x {self.b_tiles} tiles of C need {need} tile registers "
                            f"(C, A and B tiles), AMX has {TILE_REGISTERS}")
        if self.mr < 2:
            raise TileError(f"MR = a_tiles * rows must be >= 2, got {self.mr}")

    # The attributes the intrinsics and schedules read of every integer tile.
    batch_reduce = True
    requant = None
    op = "u8s8"
    a_dtype = "uint8"
    b_dtype = "int8"
    c_dtype = "int32"
    group = 4  # k per group of packed B, as vpdpbusd

    @property
    def k_step(self) -> int:
        """K per step of the loop: one tile's depth; a call's K must be a multiple of it."""
        return K_DEPTH

    @property
    def mr(self) -> int:
        return self.a_tiles * self.rows

    @property
    def nr(self) -> int:
        return self.b_tiles * C_COLS

    @property
    def instructions_per_step(self) -> int:
        """tdpbusd per K step of 64."""
        return self.a_tiles * self.b_tiles

    @property
    def name(self) -> str:
        suffix = "" if self.accumulate else "_beta0"
        return f"mk_u8s8_brgemm_{self.mr}x{self.nr}_{self.isa.name}{suffix}"

    @property
    def config_symbol(self) -> str:
        """The function that configures the tiles for this kernel (ldtilecfg): call it on the
        thread before the kernel, once for any number of calls."""
        return f"{self.name}_config"

    @property
    def release_symbol(self) -> str:
        """The function that releases the tiles (tilerelease) after a run of calls."""
        return f"{self.name}_release"

    def llvm_ir(self) -> str:
        return _generate(self)


def amx_tiles(nr_limit: int = 48) -> list[tuple[int, int, int]]:
    """Every (rows, a_tiles, b_tiles) the tile registers allow, NR up to nr_limit."""
    out = []
    for a in (1, 2, 3):
        for b in (1, 2, 3):
            if a * b + a + b <= TILE_REGISTERS and b * C_COLS <= nr_limit:
                out += [(rows, a, b) for rows in range(1, TILE_ROWS + 1) if a * rows >= 2]
    return out


def _config(kern: AmxGemmKernel) -> list[tuple[int, int]]:
    """(rows, bytes per row) of each tile register in use: C tiles, then A tiles, then B tiles."""
    c = [(kern.rows, TILE_BYTES)] * (kern.a_tiles * kern.b_tiles)
    a = [(kern.rows, TILE_BYTES)] * kern.a_tiles
    b = [(K_DEPTH // 4, TILE_BYTES)] * kern.b_tiles
    return c + a + b


def _generate(kern: AmxGemmKernel) -> str:
    na, nb, rows = kern.a_tiles, kern.b_tiles, kern.rows

    def tc(i: int, j: int) -> int:  # tile registers: C tiles first, then A, then B
        return i * nb + j

    def ta(i: int) -> int:
        return na * nb + i

    def tb(j: int) -> int:
        return na * nb + na + j

    out = [
        (f"define internal void @{kern.name}(ptr noalias %a, i32 %lda, ptr noalias %b, i32 %ldb, ptr noalias %c,"
         " i32 %ldc, i32 %k, i32 %n1, i32 %sa1, i32 %n2, i32 %sa2, i32 %n3, i32 %sa3) alwaysinline {"),
        "entry:",
    ]
    for v in ("lda", "ldb", "ldc", "k", "n1", "sa1", "n2", "sa2", "n3", "sa3"):
        out.append(f"  %{v}64 = sext i32 %{v} to i64")
    out.append("  %cstride = mul i64 %ldc64, 4")
    for i in range(na):
        for j in range(nb):
            out += [f"  %co{i}_{j} = add i64 {i * rows} , 0", f"  %cr{i}_{j} = mul i64 %co{i}_{j}, %ldc64",
                    f"  %cc{i}_{j} = add i64 %cr{i}_{j}, {j * C_COLS}",
                    f"  %cp{i}_{j} = getelementptr inbounds i32, ptr %c, i64 %cc{i}_{j}",
                    f"  call void @llvm.x86.tileloadd64(i8 {tc(i, j)}, ptr %cp{i}_{j}, i64 %cstride)"
                    if kern.accumulate else f"  call void @llvm.x86.tilezero(i8 {tc(i, j)})"]
    out += ["  %kg = sdiv i64 %k64, 4", f"  %ksteps = sdiv i64 %k64, {K_DEPTH}"]
    out += [f"  %{v} = alloca i64" for v in ("i1p", "i2p", "i3p", "kp")]
    out += ["  %bcur = alloca ptr", "  store ptr %b, ptr %bcur", "  %bstep = mul i64 %kg, %ldb64",
            f"  %bdepth = mul i64 %ldb64, {K_DEPTH // 4}"]
    step = ["  %ka = mul i64 %kk, 64", "  %kb = mul i64 %kk, %bdepth"]
    for i in range(na):
        step += [f"  %aro{i} = mul i64 %lda64, {i * rows}", f"  %aoff{i} = add i64 %aro{i}, %ka",
                 f"  %at{i} = getelementptr inbounds i8, ptr %abase, i64 %aoff{i}",
                 f"  call void @llvm.x86.tileloadd64(i8 {ta(i)}, ptr %at{i}, i64 %lda64)"]
    for j in range(nb):
        step += [f"  %boff{j} = add i64 %kb, {j * TILE_BYTES}",
                 f"  %bt{j} = getelementptr inbounds i8, ptr %bb, i64 %boff{j}",
                 f"  call void @llvm.x86.tileloadd64(i8 {tb(j)}, ptr %bt{j}, i64 %ldb64)"]
    step += [f"  call void @llvm.x86.tdpbusd(i8 {tc(i, j)}, i8 {ta(i)}, i8 {tb(j)})" for i in range(na) for j in range(nb)]
    out += batch_loops("i8", "i8", 0, "%ksteps", step)
    out += [f"  call void @llvm.x86.tilestored64(i8 {tc(i, j)}, ptr %cp{i}_{j}, i64 %cstride)"
            for i in range(na) for j in range(nb)]
    out += ["  ret void", "}"]
    # The 64-byte configuration: palette 1, then bytes per row (u16 each, from byte 16) and rows
    # (u8 each, from byte 48) of every tile register; unused ones stay 0.
    out += [f"define internal void @{kern.config_symbol}() alwaysinline {{", "entry:",
            "  %cfg = alloca [64 x i8], align 64", "  call void @llvm.memset.p0.i64(ptr %cfg, i8 0, i64 64, i1 false)",
            "  store i8 1, ptr %cfg"]
    for t, (r, cb) in enumerate(_config(kern)):
        out += [f"  %cb{t} = getelementptr inbounds i8, ptr %cfg, i64 {16 + 2 * t}", f"  store i16 {cb}, ptr %cb{t}",
                f"  %rw{t} = getelementptr inbounds i8, ptr %cfg, i64 {48 + t}", f"  store i8 {r}, ptr %rw{t}"]
    out += ["  call void @llvm.x86.ldtilecfg(ptr %cfg)", "  ret void", "}",
            f"define internal void @{kern.release_symbol}() alwaysinline {{", "entry:",
            "  call void @llvm.x86.tilerelease()", "  ret void", "}"]
    out += ["declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)", "declare void @llvm.x86.ldtilecfg(ptr)",
            "declare void @llvm.x86.tilerelease()",
            "declare void @llvm.x86.tileloadd64(i8, ptr, i64)", "declare void @llvm.x86.tilestored64(i8, ptr, i64)",
            "declare void @llvm.x86.tdpbusd(i8, i8, i8)", "declare void @llvm.x86.tilezero(i8)",
            "!0 = distinct !{!0, !1}", '!1 = !{!"llvm.loop.unroll.disable"}', ""]
    return "\n".join(out)


@dataclass(frozen=True)
class AmxPeakKernel:
    """The tdpbusd throughput probe (as int_dot_peak is vpdpbusd's): the 2 x 2 tile's four
    tdpbusd per iteration on operand tiles loaded once, nothing else; C tiles stored at the end so
    nothing is optimized away.
        void mk_u8s8_amxpeak_amxint8(ptr io, i32 iters)   io: 4 C tiles, then A, then B (1 KiB each)
    It configures and releases the tiles itself (one call per measurement)."""

    isa: Isa = AMX_INT8

    @property
    def name(self) -> str:
        return f"mk_u8s8_amxpeak_{self.isa.name}"

    @property
    def io_words(self) -> int:
        return 6 * TILE_ROWS * TILE_BYTES // 4

    def ops(self, iters: int) -> int:
        """Integer operations (multiply and add per MAC) of `iters` iterations."""
        return 2 * 4 * TILE_ROWS * C_COLS * K_DEPTH * iters

    def llvm_ir(self) -> str:
        kern = AmxGemmKernel(TILE_ROWS, 2, 2)
        tile = TILE_ROWS * TILE_BYTES
        out = [f"define internal void @{self.name}(ptr noalias %io, i32 %iters) alwaysinline {{", "entry:",
               f"  call void @{kern.config_symbol}()"]
        for t in range(4, 8):
            out += [f"  %op{t} = getelementptr inbounds i8, ptr %io, i64 {(t if t < 6 else 5) * tile}",
                    f"  call void @llvm.x86.tileloadd64(i8 {t}, ptr %op{t}, i64 {TILE_BYTES})"]
        for t in range(4):
            out += [f"  %cp{t} = getelementptr inbounds i8, ptr %io, i64 {t * tile}",
                    f"  call void @llvm.x86.tileloadd64(i8 {t}, ptr %cp{t}, i64 {TILE_BYTES})"]
        out += ["  br label %loop", "loop:", "  %it = phi i32 [0, %entry], [%itn, %loop]"]
        out += [f"  call void @llvm.x86.tdpbusd(i8 {i * 2 + j}, i8 {4 + i}, i8 {6 + j})" for i in range(2) for j in range(2)]
        out += ["  %itn = add nuw nsw i32 %it, 1", "  %more = icmp slt i32 %itn, %iters",
                "  br i1 %more, label %loop, label %exit", "exit:"]
        out += [f"  call void @llvm.x86.tilestored64(i8 {t}, ptr %cp{t}, i64 {TILE_BYTES})" for t in range(4)]
        out += [f"  call void @{kern.release_symbol}()", "  ret void", "}"]
        # The tile kernel's IR brings the configuration, the release and the declarations.
        return "\n".join(out) + "\n" + kern.llvm_ir()
