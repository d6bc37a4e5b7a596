"""The requantizing store of the x86 integer GEMM tiles (int_gemm's `requant` variants): the
MR x NR int32 accumulators, in registers after the K loop, leave as

    8-bit:   C = clamp(roundeven(float32(acc + bias[j]) * scale[j]) + zp, lo, hi)
    float32: C = float32(acc + bias[j]) * scale[j]

(ONNX QuantizeLinear's rule, round half to even; lo/hi within the dtype's range, lo raised to zp
for a fused ReLU). Two forms of the 8-bit store, one rule:

- generic (zmm): per vector, LLVM's roundeven, a clamp to [lo - zp, hi - zp] in float32, fptosi,
  + zp, trunc. LLVM lowers the trunc to a byte shuffle per vector.
- packed (ymm, AVX2 and AVX-VNNI): `vcvtps2dq` rounds half to even itself (the default MXCSR
  mode, which TVM's runtime and numpy leave alone), the int32 values of two vectors go to int16
  with `vpackssdw` (saturating), + zp with `vpaddsw` (saturating), to 8 bits with `vpackuswb` /
  `vpacksswb` (saturating to the dtype), then `vpmaxub`/`vpminub` (`vpmaxsb`/`vpminsb`) clamp
  to [lo, hi]. Only the upper side needs a float32 clamp first (to hi - zp): a value past
  int32's range converts to INT_MIN, which every saturating step then keeps at the low end,
  where the true value belongs too. 18 instructions per 16 outputs where the generic form took
  about 28 on ymm (the MobileNetV2 1x1 layers of K = 16 and 24 store more than they multiply).
"""

from __future__ import annotations

OUT_RANGE = {"uint8": (0, 255), "int8": (-128, 127)}


def vec(lanes: int, elem: str) -> str:
    """The vector type of one register of `elem` at `lanes` int32 lanes."""
    return {"i32": f"<{lanes} x i32>", "i8": f"<{4 * lanes} x i8>", "i16": f"<{2 * lanes} x i16>",
            "float": f"<{lanes} x float>"}[elem]


def params(kern) -> str:
    return ", ptr noalias %bias, ptr noalias %scale, i32 %zp, i32 %lo, i32 %hi" if kern.requant else ""


def packed(kern) -> bool:
    """Whether the 8-bit store takes the packed form: ymm tiles."""
    return kern.requant in OUT_RANGE and kern.isa.vector_bits == 256


def _splat(out: list[str], name: str, ty: str, value: str, n: int) -> None:
    out.append(f"  %{name}i = insertelement <{n} x {ty}> poison, {ty} {value}, i64 0")
    out.append(f"  %{name} = shufflevector <{n} x {ty}> %{name}i, <{n} x {ty}> poison, <{n} x i32> zeroinitializer")


def store(kern, value) -> list[str]:
    """The tile's one store: the int32 accumulators (`value(i, j)`: row i's j-th vector), or their
    requantized values. C at %c, ldc in its own elements."""
    lanes, nv, q = kern.isa.lanes, kern.vectors_per_row, kern.requant
    vi, vf = vec(lanes, "i32"), vec(lanes, "float")
    out = []
    if q:
        for j in range(nv):
            out.append(f"  %biasp{j} = getelementptr inbounds i32, ptr %bias, i64 {j * lanes}")
            out.append(f"  %biasv{j} = load {vi}, ptr %biasp{j}, align 4")
            out.append(f"  %scp{j} = getelementptr inbounds float, ptr %scale, i64 {j * lanes}")
            out.append(f"  %scv{j} = load {vf}, ptr %scp{j}, align 4")
    if packed(kern):
        return out + _packed_store(kern, value)
    if q in OUT_RANGE:
        # Clamping the rounded value to [lo - zp, hi - zp] before converting it keeps fptosi in
        # range, and gives what clamping after adding zp would.
        for name, src in (("lomz", "%lo"), ("himz", "%hi")):
            out.append(f"  %{name}i = sub i32 {src}, %zp")
            out.append(f"  %{name} = sitofp i32 %{name}i to float")
        _splat(out, "zpv", "i32", "%zp", lanes)
        _splat(out, "lof", "float", "%lomz", lanes)
        _splat(out, "hif", "float", "%himz", lanes)
    ct = {"uint8": "i8", "int8": "i8", "float32": "float", None: "i32"}[q]
    for i in range(kern.mr):
        out.append(f"  %crow{i} = mul i64 {i}, %ldc64")
        for j in range(nv):
            x = value(i, j)
            out.append(f"  %co{i}_{j} = add i64 %crow{i}, {j * lanes}")
            out.append(f"  %cp{i}_{j} = getelementptr inbounds {ct}, ptr %c, i64 %co{i}_{j}")
            if not q:
                out.append(f"  store {vi} {x}, ptr %cp{i}_{j}, align 4")
                continue
            t = f"{i}_{j}"
            out.append(f"  %qb{t} = add {vi} {x}, %biasv{j}")
            out.append(f"  %qf{t} = sitofp {vi} %qb{t} to {vf}")
            out.append(f"  %qs{t} = fmul {vf} %qf{t}, %scv{j}")
            if q == "float32":
                out.append(f"  store {vf} %qs{t}, ptr %cp{i}_{j}, align 4")
                continue
            out.append(f"  %qr{t} = call {vf} @llvm.roundeven.v{lanes}f32({vf} %qs{t})")
            out.append(f"  %ql{t} = call {vf} @llvm.maxnum.v{lanes}f32({vf} %qr{t}, {vf} %lof)")
            out.append(f"  %qh{t} = call {vf} @llvm.minnum.v{lanes}f32({vf} %ql{t}, {vf} %hif)")
            out.append(f"  %qi{t} = fptosi {vf} %qh{t} to {vi}")
            out.append(f"  %qz{t} = add {vi} %qi{t}, %zpv")
            out.append(f"  %qt{t} = trunc {vi} %qz{t} to <{lanes} x i8>")
            out.append(f"  store <{lanes} x i8> %qt{t}, ptr %cp{i}_{j}, align 1")
    return out


def _packed_store(kern, value) -> list[str]:
    """The packed 8-bit store (module doc) of a ymm tile: each row's vectors in pairs, 16 bytes
    per pair (an odd last vector paired with itself, 8 bytes stored)."""
    signed = kern.requant == "int8"
    pack = "@llvm.x86.sse2.packsswb.128" if signed else "@llvm.x86.sse2.packuswb.128"
    mx, mn = ("smax", "smin") if signed else ("umax", "umin")
    out = ["  %himzi = sub i32 %hi, %zp", "  %himz = sitofp i32 %himzi to float",
           "  %zp16 = trunc i32 %zp to i16", "  %lo8 = trunc i32 %lo to i8", "  %hi8 = trunc i32 %hi to i8"]
    _splat(out, "hif", "float", "%himz", 8)
    _splat(out, "zpw", "i16", "%zp16", 16)
    _splat(out, "lob", "i8", "%lo8", 16)
    _splat(out, "hib", "i8", "%hi8", 16)
    nv = kern.vectors_per_row
    for i in range(kern.mr):
        out.append(f"  %crow{i} = mul i64 {i}, %ldc64")
        for j0 in range(0, nv, 2):
            j1 = j0 + 1 if j0 + 1 < nv else j0
            t = f"{i}_{j0}"
            for j in dict.fromkeys((j0, j1)):
                u = f"{i}_{j}"
                out.append(f"  %qb{u} = add <8 x i32> {value(i, j)}, %biasv{j}")
                out.append(f"  %qf{u} = sitofp <8 x i32> %qb{u} to <8 x float>")
                out.append(f"  %qs{u} = fmul <8 x float> %qf{u}, %scv{j}")
                out.append(f"  %qh{u} = call <8 x float> @llvm.minnum.v8f32(<8 x float> %qs{u}, <8 x float> %hif)")
                out.append(f"  %qi{u} = call <8 x i32> @llvm.x86.avx.cvt.ps2dq.256(<8 x float> %qh{u})")
            out.append(f"  %qw{t} = call <16 x i16> @llvm.x86.avx2.packssdw(<8 x i32> %qi{i}_{j0}, <8 x i32> %qi{i}_{j1})")
            # packssdw interleaves the 128-bit lanes (4 of each vector in turn): back in order
            out.append(f"  %qp{t} = shufflevector <16 x i16> %qw{t}, <16 x i16> poison, <16 x i32> "
                       "<i32 0, i32 1, i32 2, i32 3, i32 8, i32 9, i32 10, i32 11, "
                       "i32 4, i32 5, i32 6, i32 7, i32 12, i32 13, i32 14, i32 15>")
            out.append(f"  %qz{t} = call <16 x i16> @llvm.sadd.sat.v16i16(<16 x i16> %qp{t}, <16 x i16> %zpw)")
            out.append(f"  %qa{t} = shufflevector <16 x i16> %qz{t}, <16 x i16> poison, <8 x i32> "
                       "<i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7>")
            out.append(f"  %qc{t} = shufflevector <16 x i16> %qz{t}, <16 x i16> poison, <8 x i32> "
                       "<i32 8, i32 9, i32 10, i32 11, i32 12, i32 13, i32 14, i32 15>")
            out.append(f"  %qk{t} = call <16 x i8> {pack}(<8 x i16> %qa{t}, <8 x i16> %qc{t})")
            out.append(f"  %ql{t} = call <16 x i8> @llvm.{mx}.v16i8(<16 x i8> %qk{t}, <16 x i8> %lob)")
            out.append(f"  %qm{t} = call <16 x i8> @llvm.{mn}.v16i8(<16 x i8> %ql{t}, <16 x i8> %hib)")
            out.append(f"  %co{t} = add i64 %crow{i}, {j0 * 8}")
            out.append(f"  %cp{t} = getelementptr inbounds i8, ptr %c, i64 %co{t}")
            if j1 != j0:
                out.append(f"  store <16 x i8> %qm{t}, ptr %cp{t}, align 1")
            else:
                out.append(f"  %qe{t} = shufflevector <16 x i8> %qm{t}, <16 x i8> poison, <8 x i32> "
                           "<i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7>")
                out.append(f"  store <8 x i8> %qe{t}, ptr %cp{t}, align 1")
    return out


def declarations(kern) -> list[str]:
    """The intrinsics the store calls."""
    if not kern.requant or kern.requant == "float32":
        return []
    if packed(kern):
        signed = kern.requant == "int8"
        pack = "@llvm.x86.sse2.packsswb.128" if signed else "@llvm.x86.sse2.packuswb.128"
        mx, mn = ("smax", "smin") if signed else ("umax", "umin")
        return ["declare <8 x float> @llvm.minnum.v8f32(<8 x float>, <8 x float>)",
                "declare <8 x i32> @llvm.x86.avx.cvt.ps2dq.256(<8 x float>)",
                "declare <16 x i16> @llvm.x86.avx2.packssdw(<8 x i32>, <8 x i32>)",
                "declare <16 x i16> @llvm.sadd.sat.v16i16(<16 x i16>, <16 x i16>)",
                f"declare <16 x i8> {pack}(<8 x i16>, <8 x i16>)",
                f"declare <16 x i8> @llvm.{mx}.v16i8(<16 x i8>, <16 x i8>)",
                f"declare <16 x i8> @llvm.{mn}.v16i8(<16 x i8>, <16 x i8>)"]
    lanes = kern.isa.lanes
    vf = vec(lanes, "float")
    return [f"declare {vf} @llvm.{f}.v{lanes}f32({vf}{f', {vf}' if f != 'roundeven' else ''})"
            for f in ("roundeven", "maxnum", "minnum")]
