"""Integer GEMM tiles on x86: C[MR, NR] (+)= A[MR, K] @ B[K, NR] with int32 accumulators.

One parametric generator, two instructions, chosen by the ISA:
- u8s8 dot, `vpdpbusd` (AVX-512 VNNI on zmm, AVX-VNNI on ymm): uint8 A times int8 B, four
  products summed into each int32 lane per instruction, 64 MACs per zmm instruction. The
  products are at most 255 * 128 in magnitude and the instruction adds them in 32 bits without
  saturating (that is vpdpbusds), so the sums are exact while the int32 accumulator does not wrap.
- s16 madd, `vpmaddwd` + `vpaddd` (AVX-512BW, AVX2): the twin of the ARM path's upcast for hosts
  without VNNI. A and B are int16 (8-bit data widened, zero points subtracted, once by the
  packing); each instruction sums two products into an int32 lane. Unlike vpmaddubsw, whose
  16-bit pair sums saturate, a pair of products of 8-bit values (at most 2 * 255 * 255) always
  fits, so this is exact under the same accumulator bound.
- u8s7 pairs, `vpmaddubsw` + `vpmaddwd` by ones + `vpaddd` (AVX2, AVX-512BW; the `pairs` variant):
  uint8 A times int8 B as they are, B packed as for vpdpbusd. vpmaddubsw sums the products of
  two adjacent k into an int16 that saturates, so it is exact only while every such pair of
  weights has |w_a| + |w_b| <= PAIR_BOUND (255 * 128 = 32640 <= 32767): weights quantized to
  7 bits ([-64, 64]) always are, and the schedule proves it for the layer's packed weights
  before it takes this tile (int8 `pairs_exact`). The vpmaddwd by ones then adds the two int16
  sums of a group into the int32 lane, exactly. Per 32 products: two multiplies and an add on
  8-bit operands, where the upcast takes two vpmaddwd and two vpaddd on int16 ones.

B is packed in groups of `group` k (4 for dot, 2 for madd): group g of column j, the values
k = group*g .. group*g + group-1, sits at b + g*ldb + group*j, which is the order the instruction
multiplies in. A is row-major (A[i, k] at a + i*lda + k); each K step broadcasts one group of a
row (4 bytes, vpbroadcastd) and loads NR/lanes vectors of B, then MR * NR/lanes instructions
update the accumulators, which stay in registers for the whole reduction. Strides are in
elements of the operand's own type.

With `prefetch` (suffix _pf), every B load also prefetches into L2 (prefetcht1) the byte one
call's B further on (k/group*ldb, or n1*n2*n3 times that for a batch), as the FP32 kernels do
(microkernels.f32_gemm): a conv's consecutive calls walk the output blocks' weight panels in
order, and in a network those come from memory. On the Zen 5, int8 ResNet-50 QDQ 9.82 -> 9.19
ms at one thread, 5.01 -> 4.74 at two (alternating builds); MobileNetV2 unchanged.

Signature of every generated kernel (k a multiple of the group):
    void mk_u8s8_gemm_<MR>x<NR>_<isa>[_beta0][_pf](ptr a, i32 lda, ptr b, i32 ldb, ptr c, i32 ldc, i32 k)
    void mk_s16_gemm_<MR>x<NR>_<isa>[_beta0](...same...)
    void mk_u8s7_gemm_<MR>x<NR>_<isa>[_beta0](...same...)
The batch-reduce variant (brgemm) sums n1*n2*n3 products into one tile, A at
a + i1*sa1 + i2*sa2 + i3*sa3 and the B panels one after another (each k/group*ldb long), exactly
as the FP32 brgemm does for a direct convolution:
    void mk_u8s8_brgemm_<MR>x<NR>_<isa>[...](ptr a, i32 lda, ptr b, i32 ldb, ptr c, i32 ldc, i32 k,
        i32 n1, i32 sa1, i32 n2, i32 sa2, i32 n3, i32 sa3)

The requantizing variant (suffix _q<dtype>: _qu8, _qs8, _qf32) starts from zero and stores, instead
of the int32 accumulators, C = q(acc + bias[j]) in <dtype> (ldc in its elements), where for 8-bit
    q(v) = clamp(roundeven(float32(v) * scale[j]) + zp, lo, hi)
(float32 arithmetic, round half to even: ONNX QuantizeLinear's rule; lo/hi within the dtype's range
are the saturation bounds, and raising lo to zp is a fused ReLU), and for float32 (dequantize, the
last layer) q(v) = float32(v) * scale[j]. Its arguments follow the kernel's own:
    ptr bias (NR int32), ptr scale (NR float), i32 zp, i32 lo, i32 hi
"""

from __future__ import annotations

from dataclasses import dataclass

from .f32_gemm import PREFETCH_DECLARATION, TileError, batch_loops, batch_prefetch_distance, prefetch_b
from . import int_requant
from .isa import AVX2, AVX512, AVX512_VNNI, AVX_VNNI, X86_INT_ISAS, Isa, normalize_ints

# ISA name -> (operation, A dtype, B dtype, k per group): what each ISA multiplies with.
OPS = {
    AVX512_VNNI.name: ("u8s8", "uint8", "int8", 4),
    AVX_VNNI.name: ("u8s8", "uint8", "int8", 4),
    AVX512.name: ("s16", "int16", "int16", 2),
    AVX2.name: ("s16", "int16", "int16", 2),
}
# The `pairs` variant's operations, on the ISAs without VNNI (vpmaddubsw: AVX2, AVX-512BW).
PAIR_OPS = {
    AVX512.name: ("u8s7", "uint8", "int8", 4),
    AVX2.name: ("u8s7", "uint8", "int8", 4),
}
# The largest |w_a| + |w_b| of two weights vpmaddubsw multiplies in one 16-bit sum that keeps it
# exact for any uint8 data: 255 * 128 = 32640 <= 32767 (and 255 * 129 = 32895 is not).
PAIR_BOUND = 128
OUT_DTYPES = ("uint8", "int8", "float32")
_OUT_RANGE = int_requant.OUT_RANGE
_OUT_SUFFIX = {"uint8": "qu8", "int8": "qs8", "float32": "qf32"}


def out_range(dtype: str) -> tuple[int, int]:
    """The saturation range of an 8-bit requantized output."""
    return _OUT_RANGE[dtype]


@dataclass(frozen=True)
class IntGemmKernel:
    isa: Isa
    mr: int
    nr: int
    accumulate: bool = True  # False: beta=0, the tile starts from zero
    batch_reduce: bool = False
    requant: str | None = None  # None (store int32), or the requantized output's dtype
    # vpmaddubsw on uint8 x int8 (PAIR_OPS): exact only for weights within PAIR_BOUND per pair,
    # which the caller proves; AVX2 and AVX-512 without VNNI.
    pairs: bool = False
    prefetch: bool = False  # prefetch the B panel(s) that follow this call's (module doc)

    def __post_init__(self):
        if self.isa.name not in OPS:
            raise TileError(f"no x86 integer GEMM kernel for {self.isa.name}; expected one of {sorted(OPS)}")
        if self.pairs and self.isa.name not in PAIR_OPS:
            raise TileError(f"the vpmaddubsw pairs tile is for ISAs without VNNI ({sorted(PAIR_OPS)}); "
                            f"{self.isa.name} multiplies uint8 x int8 exactly with vpdpbusd")
        normalize_ints(self, {"mr": "MR", "nr": "NR"}, TileError)
        if self.requant is not None and self.requant not in OUT_DTYPES:
            raise TileError(f"requant must be None or one of {OUT_DTYPES}, got {self.requant!r}")
        if self.requant is not None and self.accumulate:
            # The requantized store discards the int32 tile, so there is nothing to accumulate into.
            object.__setattr__(self, "accumulate", False)
        check_tile(self.isa, self.mr, self.nr, self.pairs)

    @property
    def _ops(self) -> tuple:
        return (PAIR_OPS if self.pairs else OPS)[self.isa.name]

    @property
    def op(self) -> str:
        """"u8s8" (vpdpbusd), "s16" (vpmaddwd) or "u8s7" (vpmaddubsw pairs)."""
        return self._ops[0]

    @property
    def a_dtype(self) -> str:
        return self._ops[1]

    @property
    def b_dtype(self) -> str:
        return self._ops[2]

    @property
    def group(self) -> int:
        """K values per group of packed B, and per K step; K must be a multiple of it."""
        return self._ops[3]

    @property
    def k_step(self) -> int:
        """K values per loop iteration: one group."""
        return self.group

    @property
    def c_dtype(self) -> str:
        return self.requant or "int32"

    @property
    def vectors_per_row(self) -> int:
        return self.nr // self.isa.lanes

    @property
    def instructions_per_step(self) -> int:
        """Multiply instructions per K step of `group` values: vpdpbusd or vpmaddwd, one per
        accumulator; vpmaddubsw and its vpmaddwd by ones, two."""
        return self.mr * self.vectors_per_row * (2 if self.op == "u8s7" else 1)

    @property
    def macs_per_instruction(self) -> int:
        return self.isa.lanes * self.group

    @property
    def name(self) -> str:
        op = "brgemm" if self.batch_reduce else "gemm"  # self.op names the instruction
        # In the float tiles' order (docs/design.md): _beta0, _pf, then the store (_qu8 ...),
        # which implies beta=0 and so stands for it.
        suffix = "" if self.accumulate or self.requant else "_beta0"
        suffix += "_pf" if self.prefetch else ""
        if self.requant:
            suffix += f"_{_OUT_SUFFIX[self.requant]}"
        return f"mk_{self.op}_{op}_{self.mr}x{self.nr}_{self.isa.name}{suffix}"

    def llvm_ir(self) -> str:
        return _generate(self)


def registers_needed(isa: Isa, mr: int, nr: int, pairs: bool = False) -> int:
    """Vector registers the K loop holds: MR * NR/lanes accumulators, a row of B, one broadcast,
    for vpmaddwd the product on its way to the vpaddd, and for the pairs tile that product and
    the vector of ones its vpmaddwd multiplies by."""
    nv = nr // isa.lanes
    op = (PAIR_OPS if pairs else OPS)[isa.name][0]
    return mr * nv + nv + 1 + {"u8s8": 0, "s16": 1, "u8s7": 2}[op]


def check_tile(isa: Isa, mr: int, nr: int, pairs: bool = False) -> None:
    if nr % isa.lanes:
        raise TileError(f"NR={nr} must be a multiple of {isa.lanes} (int32 lanes of {isa.name})")
    need = registers_needed(isa, mr, nr, pairs)
    if need > isa.vector_registers:
        extra = "a vpmaddubsw product and a vector of ones" if pairs else "a vpmaddwd product"
        raise TileError(f"a {mr}x{nr} tile needs {need} vector registers (MR*NR/{isa.lanes} accumulators, "
                        f"a row of B, a broadcast, {extra}) but {isa.name} has {isa.vector_registers}")


def max_tiles(isa: Isa, nr_limit: int = 64, pairs: bool = False) -> list[tuple[int, int]]:
    """Every (MR, NR) with MR >= 2 whose K loop fits the register file, NR up to nr_limit."""
    return [(mr, nr) for nr in range(isa.lanes, nr_limit + 1, isa.lanes) for mr in range(2, 32)
            if registers_needed(isa, mr, nr, pairs) <= isa.vector_registers]


# Four zmm of B per row and 6 rows of A: 24 accumulators, the shape of the FP32 tile (whose
# reasons, the B row's loads amortized over 6 broadcasts, are the same); on ymm, 6 rows x 2.
DEFAULT_TILES = {AVX512_VNNI.name: (6, 64), AVX_VNNI.name: (6, 16), AVX512.name: (6, 64), AVX2.name: (6, 16)}


# The pairs tile's own default (two more registers than the upcast's): 5 x 16 on ymm (97.9 G
# multiply-adds/s L1-resident on a Zen 3, where the upcast's 6 x 16 ran 75.5), 6 x 64 on zmm.
DEFAULT_PAIR_TILES = {AVX512.name: (6, 64), AVX2.name: (5, 16)}
assert set(DEFAULT_PAIR_TILES) == set(PAIR_OPS)


def default_int_kernel(isa_name: str, pairs: bool = False, **variant) -> IntGemmKernel:
    mr, nr = (DEFAULT_PAIR_TILES if pairs else DEFAULT_TILES)[isa_name]
    return IntGemmKernel(X86_INT_ISAS[isa_name], mr, nr, pairs=pairs, **variant)


def _vec(kern: IntGemmKernel, elem: str) -> str:
    """The vector type of one register of `elem`: i32 lanes, or the bytes / words they hold."""
    return int_requant.vec(kern.isa.lanes, elem)


def _pmaddwd(kern: IntGemmKernel) -> str:
    vi, vw = _vec(kern, "i32"), _vec(kern, "i16")
    name = "llvm.x86.avx512.pmaddw.d.512" if kern.isa.vector_bits == 512 else "llvm.x86.avx2.pmadd.wd"
    return f"declare {vi} @{name}({vw}, {vw})"


def _pmaddubsw(kern: IntGemmKernel) -> str:
    vb, vw = _vec(kern, "i8"), _vec(kern, "i16")
    name = "llvm.x86.avx512.pmaddubs.w.512" if kern.isa.vector_bits == 512 else "llvm.x86.avx2.pmadd.ub.sw"
    return f"declare {vw} @{name}({vb}, {vb})"


def _multiply(kern: IntGemmKernel) -> tuple[str, str]:
    """(declaration, operand element) of the instruction a K step issues (for the pairs tile its
    first, vpmaddubsw; its vpmaddwd by ones is `_pmaddwd`)."""
    bits, vi = kern.isa.vector_bits, _vec(kern, "i32")
    if kern.op == "u8s8":
        vb = _vec(kern, "i8")
        return f"declare {vi} @llvm.x86.avx512.vpdpbusd.{bits}({vi}, {vb}, {vb})", "i8"
    if kern.op == "u8s7":
        return _pmaddubsw(kern), "i8"
    return _pmaddwd(kern), "i16"


def _callee(decl: str) -> str:
    return decl.split("@")[1].split("(")[0]


def _k_step(kern: IntGemmKernel, acc: str, nacc: str) -> list[str]:
    """One K step at group %kk: broadcast each A row's group, load B's group row, multiply-add."""
    vi, lanes, nv, g = _vec(kern, "i32"), kern.isa.lanes, kern.vectors_per_row, kern.group
    decl, elem = _multiply(kern)
    vo, vw = _vec(kern, elem), _vec(kern, "i16")
    callee, madd = _callee(decl), _callee(_pmaddwd(kern))
    ones = "<" + ", ".join(["i16 1"] * 2 * kern.isa.lanes) + ">"
    out = ["  %ka = mul i64 %kk, " + str(g), "  %kb = mul i64 %kk, %ldb64"]
    for j in range(nv):
        out.append(f"  %bo{j} = add i64 %kb, {j * lanes * g}")
        out.append(f"  %bp{j} = getelementptr inbounds {elem}, ptr %bb, i64 %bo{j}")
        out.append(f"  %bv{j} = load {vo}, ptr %bp{j}, align 1")
        if kern.prefetch:  # into L2, one call's B ahead (module doc)
            out += prefetch_b(elem, j)
    for i in range(kern.mr):
        out.append(f"  %aq{i} = getelementptr inbounds {elem}, ptr %ap{i}, i64 %ka")
        out.append(f"  %aw{i} = load i32, ptr %aq{i}, align 1")
        out.append(f"  %ai{i} = insertelement {vi} poison, i32 %aw{i}, i64 0")
        out.append(f"  %as{i} = shufflevector {vi} %ai{i}, {vi} poison, <{lanes} x i32> zeroinitializer")
        out.append(f"  %ab{i} = bitcast {vi} %as{i} to {vo}")
        for j in range(nv):
            if kern.op == "u8s8":  # vpdpbusd(acc, unsigned bytes, signed bytes)
                out.append(f"  {nacc}{i}_{j} = call {vi} @{callee}({vi} {acc}{i}_{j}, {vo} %ab{i}, {vo} %bv{j})")
            elif kern.op == "u8s7":  # vpmaddubsw(unsigned bytes, signed bytes), then pairs of int16 -> int32
                out.append(f"  %pw{i}_{j} = call {vw} @{callee}({vo} %ab{i}, {vo} %bv{j})")
                out.append(f"  %pr{i}_{j} = call {vi} @{madd}({vw} %pw{i}_{j}, {vw} {ones})")
                out.append(f"  {nacc}{i}_{j} = add {vi} {acc}{i}_{j}, %pr{i}_{j}")
            else:
                out.append(f"  %pr{i}_{j} = call {vi} @{callee}({vo} %ab{i}, {vo} %bv{j})")
                out.append(f"  {nacc}{i}_{j} = add {vi} {acc}{i}_{j}, %pr{i}_{j}")
    return out


def _generate(kern: IntGemmKernel) -> str:
    """Accumulators and loop counters live in allocas, which LLVM's SROA turns back into
    registers (as in the FP32 brgemm); the plain tile is the batch of one."""
    mr, nv, vi, lanes = kern.mr, kern.vectors_per_row, _vec(kern, "i32"), kern.isa.lanes
    decl, elem = _multiply(kern)
    a_elem = "i16" if kern.op == "s16" else "i8"
    tiles = [(i, j) for i in range(mr) for j in range(nv)]
    batch = ", i32 %n1, i32 %sa1, i32 %n2, i32 %sa2, i32 %n3, i32 %sa3" if kern.batch_reduce else ""
    out = [
        f"define internal void @{kern.name}(ptr noalias %a, i32 %lda, ptr noalias %b, i32 %ldb,"
        f" ptr noalias %c, i32 %ldc, i32 %k{batch}{int_requant.params(kern)}) alwaysinline {{",
        "entry:",
    ]
    counts = ("n1", "sa1", "n2", "sa2", "n3", "sa3") if kern.batch_reduce else ()
    for v in ("lda", "ldb", "ldc", "k", *counts):
        out.append(f"  %{v}64 = sext i32 %{v} to i64")
    if not kern.batch_reduce:
        out += ["  %n164 = add i64 0, 1", "  %n264 = add i64 0, 1", "  %n364 = add i64 0, 1",
                "  %sa164 = add i64 0, 0", "  %sa264 = add i64 0, 0", "  %sa364 = add i64 0, 0"]
    out.append(f"  %kg = sdiv i64 %k64, {kern.group}")
    for i, j in tiles:
        out.append(f"  %slot{i}_{j} = alloca {vi}, align 64")
    out += [f"  %{v} = alloca i64" for v in ("i1p", "i2p", "i3p", "kp")]
    out += ["  %bcur = alloca ptr", "  store ptr %b, ptr %bcur", "  %bstep = mul i64 %kg, %ldb64"]
    if kern.prefetch:
        out += batch_prefetch_distance()  # the plain tile is the batch of one: one call's B
    for i, j in tiles:
        if kern.accumulate:
            out.append(f"  %cro{i}_{j} = mul i64 {i}, %ldc64")
            out.append(f"  %cof{i}_{j} = add i64 %cro{i}_{j}, {j * lanes}")
            out.append(f"  %cin{i}_{j} = getelementptr inbounds i32, ptr %c, i64 %cof{i}_{j}")
            out.append(f"  %c0_{i}_{j} = load {vi}, ptr %cin{i}_{j}, align 4")
        out.append(f"  store {vi} {f'%c0_{i}_{j}' if kern.accumulate else 'zeroinitializer'}, ptr %slot{i}_{j}, align 64")
    step = [f"  %acc{i}_{j} = load {vi}, ptr %slot{i}_{j}, align 64" for i, j in tiles]
    step += _k_step(kern, "%acc", "%nacc")
    step += [f"  store {vi} %nacc{i}_{j}, ptr %slot{i}_{j}, align 64" for i, j in tiles]
    out += batch_loops(a_elem, elem, mr, "%kg", step)
    for i, j in tiles:
        out.append(f"  %res{i}_{j} = load {vi}, ptr %slot{i}_{j}, align 64")
    out += int_requant.store(kern, lambda i, j: f"%res{i}_{j}")
    out += ["  ret void", "}", decl] + ([_pmaddwd(kern)] if kern.op == "u8s7" else [])
    out += [PREFETCH_DECLARATION] if kern.prefetch else []
    out += int_requant.declarations(kern)
    out += ["!0 = distinct !{!0, !1}", '!1 = !{!"llvm.loop.unroll.disable"}', ""]
    return "\n".join(out)
