"""FP32 Winograd F(m x m, 3 x 3) transforms: matrices, factored 1-D programs, one IR generator.

Matrices (Cook-Toom, exact rationals). For alpha = m + 2 points, alpha - 1 finite ones p_i and
infinity, the correlation y[k] = sum_t g[t] d[k + t] (k < m, t < 3) is
    y = A^T [(G g) * (B^T d)]
with A^T[k, i] = p_i^k (column infinity: e_{m-1}), G[i] = [1, p_i, p_i^2] / N_i (row infinity:
e_2), N_i = prod_{j != i} (p_i - p_j), and B^T[i] = the coefficients of prod_{j != i}(x - p_j)
(row infinity: of prod_j (x - p_j)). The 1/N_i sit in G, applied to the weights ahead of time,
so B^T and A^T hold small dyadic numbers that float32 represents exactly.

Points: F(2): 0, +-1. F(4): 0, +-1, +-2. F(6): 0, +-1, +-2, +-1/2 (Lavin and Gray's F(6x6)
class; 0, +-1, +-2, +-3 grows B^T's and A^T's entries and costs accuracy). Every set is
symmetric, which is what lets the 1-D transforms below share work between +p and -p.

The 2-D transform of a q x q tile is Y = M X M^T, done as a 1-D transform down each column
(pass 1), a transpose, and the same 1-D transform along each row (pass 2). With the 16 channels
of an NCHW16c block in the vector lanes, a tile element is a vector and the transpose is only a
change of which element pass 2 loads: no shuffle is ever executed.

1-D programs: y = M x, written as vector adds, subtracts, multiplies and FMAs by constants.
Rows of M for the points +p and -p differ only in the sign of their odd-power columns, so
E = sum of the even-column terms and O = the odd-column ones give both outputs as E + O and
E - O; for A^T the same holds for columns, so pairs are summed and differenced first.
Coefficients 1 and -1 cost an add or a subtract, 0 nothing. `Program.ops` counts the result;
`dense_ops` what a plain matrix-vector product would cost (q operations per output).

Kernels, one per (kind, m, ISA):
    void mk_f32_wino_<in|out>_<m>x3_<isa>(ptr src, i32 src_row, i32 src_col,
                                        ptr dst, i32 dst_row, i32 dst_col)
Element (i, j) of a tile is 16 floats (the channel block) at ptr + i*row + j*col (strides in
floats). `in`: V = B^T d B (alpha x alpha from alpha x alpha); `out`: Y = A^T M A (m x m from
alpha x alpha). The weights' U = G g G^T has no kernel: it runs once per layer, ahead of time,
where float64 numpy is fast enough and more accurate (from F(4) on, G holds 1/6, 1/12, ...,
which float32 does not represent). Pass 1's result is kept in whichever operand is at least as
large (dst for in, src for out, which the output transform therefore overwrites): no scratch,
no stack. On AVX2 the 16 lanes are done as two halves of 8, one after the other, so a 1-D
transform's values fit in the 16 ymm registers.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .isa import ISAS, Isa

R = 3  # kernel size: every transform here is for 3x3 filters
BLOCK = 16  # channels per tile element: one NCHW16c block
KINDS = ("in", "out")  # transforms with a kernel; "wt" (G) is only a matrix, applied ahead of time
POINTS = {
    2: (0, 1, -1),
    4: (0, 1, -1, 2, -2),
    6: (0, 1, -1, 2, -2, Fraction(1, 2), Fraction(-1, 2)),
}


def _poly_mul(a: list, b: list) -> list:
    out = [Fraction(0)] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            out[i + j] += x * y
    return out


def _poly_from_roots(roots) -> list:
    """Coefficients, lowest degree first, of prod (x - r)."""
    p = [Fraction(1)]
    for r in roots:
        p = _poly_mul(p, [Fraction(-r), Fraction(1)])
    return p


@functools.lru_cache(maxsize=None)
def matrices(m: int) -> tuple[list, list, list]:
    """(A^T: m x alpha, G: alpha x 3, B^T: alpha x alpha) as lists of Fractions."""
    if m not in POINTS:
        raise ValueError(f"Winograd output tile m must be one of {sorted(POINTS)}, got {m!r}")
    pts = [Fraction(p) for p in POINTS[m]]
    alpha = m + R - 1
    assert len(pts) == alpha - 1
    at = [[p ** k for p in pts] + [Fraction(int(k == m - 1))] for k in range(m)]
    g, bt = [], []
    for i, p in enumerate(pts):
        others = pts[:i] + pts[i + 1:]
        n_i = Fraction(1)
        for q in others:
            n_i *= p - q
        # (G g)_i (B^T d)_i is unchanged when both rows change sign: keep G's leading 1/N_i
        # positive, so no row of either is all negative (which would cost a negation).
        s = 1 if n_i > 0 else -1
        g.append([s * p ** t / n_i for t in range(R)])
        bt.append([s * c for c in _poly_from_roots(others)] + [Fraction(0)])
    g.append([Fraction(int(t == R - 1)) for t in range(R)])
    bt.append(_poly_from_roots(pts))
    return at, g, bt


def as_array(mat: list, dtype=np.float64) -> np.ndarray:
    return np.array([[float(x) for x in row] for row in mat], dtype=dtype)


def transform_matrix(kind: str, m: int) -> list:
    """The M of Y = M X M^T for a transform kind."""
    at, g, bt = matrices(m)
    mats = {"in": bt, "out": at, "wt": g}
    if kind not in mats:
        raise ValueError(f"transform kind must be one of {tuple(mats)}, got {kind!r}")
    return mats[kind]


# --- 1-D programs -------------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    """dst = a + b | a - b | a * c | a * c + b (c a constant)."""
    code: str  # "add", "sub", "mul", "fma"
    dst: str
    a: str
    b: str | None = None
    c: Fraction | None = None


@dataclass(frozen=True)
class Program:
    """y_i = outputs[i] after running ops on inputs x0..x{q-1} (an output may name an input)."""
    q: int
    ops: tuple
    outputs: tuple

    @property
    def count(self) -> int:
        return len(self.ops)

    def run(self, x: list) -> list:
        """Evaluate on numbers or numpy arrays: the reference the generated IR must match."""
        env = {f"x{j}": v for j, v in enumerate(x)}
        for op in self.ops:
            a = env[op.a]
            if op.code == "add":
                env[op.dst] = a + env[op.b]
            elif op.code == "sub":
                env[op.dst] = a - env[op.b]
            elif op.code == "mul":
                env[op.dst] = a * _const(op.c, a)
            else:
                env[op.dst] = a * _const(op.c, a) + env[op.b]
        return [env[o] for o in self.outputs]


def _const(c: Fraction, like):
    return np.float32(c) if isinstance(like, np.ndarray) and like.dtype == np.float32 else float(c)


class _Builder:
    def __init__(self):
        self.ops, self.n = [], 0

    def emit(self, code, a, b=None, c=None) -> str:
        self.n += 1
        dst = f"t{self.n}"
        self.ops.append(Op(code, dst, a, b, c))
        return dst

    def lincomb(self, terms) -> tuple[str | None, int]:
        """sum c*v over terms as (value, sign): the value is sign * the sum, so a sum whose
        every coefficient is negative costs no negation; (None, 0) for an empty sum."""
        terms = [(Fraction(c), v) for c, v in terms if c != 0]
        if not terms:
            return None, 0
        sign = 1 if any(c > 0 for c, _ in terms) else -1
        terms = [(c * sign, v) for c, v in terms]
        # Start from a coefficient-1 term when there is one: it costs no operation.
        terms.sort(key=lambda t: t[0] != 1)
        c0, acc = terms[0]
        if c0 != 1:
            acc = self.emit("mul", acc, c=c0)
        for c, v in terms[1:]:
            if c == 1:
                acc = self.emit("add", acc, v)
            elif c == -1:
                acc = self.emit("sub", acc, v)
            else:
                acc = self.emit("fma", v, acc, c)
        return acc, sign

    def positive(self, value) -> str:
        """A (value, sign) pair as a plain value; a negative one costs a negation (x * -1)."""
        v, sign = value
        return v if sign == 1 else self.emit("mul", v, c=Fraction(-1))

    def combine(self, e, o, sign_o: int) -> str:
        """e + sign_o * o for signed values (value, sign); e or o may be empty."""
        (ev, es), (ov, os_) = e, o
        os_ *= sign_o
        if ev is None:
            return self.positive((ov, os_))
        if ov is None:
            return self.positive((ev, es))
        if es == 1:
            return self.emit("add" if os_ == 1 else "sub", ev, ov)
        if os_ == 1:
            return self.emit("sub", ov, ev)
        return self.positive((self.emit("add", ev, ov), -1))


def _row_pairs(mat) -> dict:
    """{row a: (row b, s)} where mat[b][j] == s * (-1)^j * mat[a][j] for every j, s = +-1."""
    pairs, used = {}, set()
    for a in range(len(mat)):
        for b in range(a + 1, len(mat)):
            if a in used or b in used:
                continue
            for s in (1, -1):
                if any(x != 0 for x in mat[a]) and all(mat[b][j] == s * (-1) ** j * mat[a][j] for j in range(len(mat[a]))):
                    if any(mat[a][j] != 0 for j in range(1, len(mat[a]), 2)):  # an odd part to share
                        pairs[a] = (b, s)
                        used |= {a, b}
                    break
    return pairs


def _row_program(mat) -> Program:
    q = len(mat[0])
    bld, out = _Builder(), {}
    pairs = _row_pairs(mat)
    paired = {b for b, _ in pairs.values()}
    for a, row in enumerate(mat):
        if a in paired:
            continue
        if a in pairs:
            b, s = pairs[a]
            e = bld.lincomb([(row[j], f"x{j}") for j in range(0, q, 2)])
            o = bld.lincomb([(row[j], f"x{j}") for j in range(1, q, 2)])
            out[a] = bld.combine(e, o, 1)
            # row b = s * (E - O)
            out[b] = bld.combine(e, o, -1) if s == 1 else bld.combine(o, e, -1)
        else:
            out[a] = bld.positive(bld.lincomb([(row[j], f"x{j}") for j in range(q)]))
    return Program(q, tuple(bld.ops), tuple(out[i] for i in range(len(mat))))


def _column_program(mat) -> Program:
    """Pairs of columns (the A^T form): x_a + s x_b and x_a - s x_b first, then each output."""
    t = [list(col) for col in zip(*mat)]
    pairs = _row_pairs(t)
    bld = _Builder()
    sums = {}
    for a, (b, s) in pairs.items():
        sums[a] = (bld.emit("add" if s == 1 else "sub", f"x{a}", f"x{b}"),
                   bld.emit("sub" if s == 1 else "add", f"x{a}", f"x{b}"))
    paired = {b for b, _ in pairs.values()}
    outs = []
    for k, row in enumerate(mat):
        terms = []
        for j, c in enumerate(row):
            if j in paired:
                continue
            if j in pairs:
                terms.append((c, sums[j][k % 2]))
            else:
                terms.append((c, f"x{j}"))
        outs.append(bld.positive(bld.lincomb(terms)))
    return Program(len(mat[0]), tuple(bld.ops), tuple(outs))


@functools.lru_cache(maxsize=None)
def program(kind: str, m: int) -> Program:
    """The cheapest factored 1-D program for a transform (row or column pairing)."""
    mat = transform_matrix(kind, m)
    return min((_row_program(mat), _column_program(mat)), key=lambda p: p.count)


def dense_ops(kind: str, m: int) -> int:
    """A plain p x q matrix-vector product: one multiply and q - 1 FMAs per output."""
    mat = transform_matrix(kind, m)
    return len(mat) * len(mat[0])


# --- kernels ------------------------------------------------------------------------------

@dataclass(frozen=True)
class WinoKernel:
    isa: Isa
    kind: str  # one of KINDS
    m: int

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"a transform kernel's kind must be one of {KINDS}, got {self.kind!r}")
        matrices(self.m)
        if BLOCK % self.isa.lanes or self.isa.arch != "x86":
            raise ValueError(f"Winograd transforms are x86 kernels over a {BLOCK}-channel block, not {self.isa.name}")

    @property
    def alpha(self) -> int:
        return self.m + R - 1

    @property
    def name(self) -> str:
        return f"mk_f32_wino_{self.kind}_{self.m}x{R}_{self.isa.name}"

    @property
    def shapes(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """(src tile, dst tile) sizes in elements of 16 channels."""
        a, m = self.alpha, self.m
        return {"in": ((a, a), (a, a)), "out": ((a, a), (m, m))}[self.kind]

    @property
    def program_matrix(self) -> list:
        """M of Y = M X M^T (Fractions)."""
        return transform_matrix(self.kind, self.m)

    @property
    def program(self) -> Program:
        return program(self.kind, self.m)

    @property
    def vector_ops(self) -> int:
        """Arithmetic vector instructions per call: both passes, every lane chunk."""
        (q, _), (p, _) = self.shapes
        return (q + p) * self.program.count * (BLOCK // self.isa.lanes)

    @property
    def dense_vector_ops(self) -> int:
        (q, _), (p, _) = self.shapes
        return (q + p) * dense_ops(self.kind, self.m) * (BLOCK // self.isa.lanes)

    def llvm_ir(self) -> str:
        return _generate(self)


def _float_hex(c: Fraction) -> str:
    """LLVM's spelling of a float constant: the double that float32 rounds `c` to."""
    return f"0x{struct.unpack('<Q', struct.pack('<d', float(np.float32(c))))[0]:016X}"


def _generate(kern: WinoKernel) -> str:
    lanes, vt = kern.isa.lanes, kern.isa.vector_type
    (q, _), (p, _) = kern.shapes
    prog = kern.program
    scratch = "dst" if p >= q else "src"
    fma = f"@llvm.fma.v{lanes}f32"
    out = [
        f"define internal void @{kern.name}(ptr noalias %src, i32 %src_row, i32 %src_col,"
        f" ptr noalias %dst, i32 %dst_row, i32 %dst_col) alwaysinline {{",
        "entry:",
    ]
    for v in ("src_row", "src_col", "dst_row", "dst_col"):
        out.append(f"  %{v}64 = sext i32 %{v} to i64")
    counter = iter(range(10 ** 9))

    def splat(c: Fraction) -> str:
        return "<" + ", ".join([f"float {_float_hex(c)}"] * lanes) + ">"

    def ptr(buf: str, line: str, line_stride: str, idx: int, idx_stride: str, chunk: int) -> str:
        n = next(counter)
        out.extend([f"  %lo{n} = mul i64 {line}, %{buf}_{line_stride}64",
                f"  %io{n} = mul i64 {idx}, %{buf}_{idx_stride}64",
                f"  %o{n} = add i64 %lo{n}, %io{n}",
                f"  %oo{n} = add i64 %o{n}, {chunk * lanes}",
                f"  %p{n} = getelementptr inbounds float, ptr %{buf}, i64 %oo{n}"])
        return f"%p{n}"

    def transform(values: list[str]) -> list[str]:
        """The 1-D program on SSA values; returns the output values."""
        env = {f"x{j}": v for j, v in enumerate(values)}
        for op in prog.ops:
            name = f"%v{next(counter)}"
            a = env[op.a]
            if op.code == "add":
                out.append(f"  {name} = fadd {vt} {a}, {env[op.b]}")
            elif op.code == "sub":
                out.append(f"  {name} = fsub {vt} {a}, {env[op.b]}")
            elif op.code == "mul":
                out.append(f"  {name} = fmul {vt} {a}, {splat(op.c)}")
            else:
                out.append(f"  {name} = call {vt} {fma}({vt} {a}, {vt} {splat(op.c)}, {vt} {env[op.b]})")
            env[op.dst] = name
        return [env[o] for o in prog.outputs]

    prev = "entry"

    def pass_loop(count: int, src: str, src_line: str, src_idx: str, dst: str, dst_line: str, dst_idx: str,
                  chunk: int) -> None:
        """for line < count: the 1-D transform of src's line into dst's line. A loop, not
        unrolled: straight-line passes let LLVM forward pass 1's stores into pass 2 and keep a
        whole tile live in registers, which spills."""
        nonlocal prev
        n = next(counter)
        out.append(f"  br label %loop{n}")
        out.extend([f"loop{n}:", f"  %line{n} = phi i64 [0, %{prev}], [%next{n}, %loop{n}]"])
        xs = []
        for i in range(q):
            pp = ptr(src, f"%line{n}", src_line, i, src_idx, chunk)
            xs.append(f"%x{n}_{i}")
            out.append(f"  %x{n}_{i} = load {vt}, ptr {pp}, align 4")
        for i, y in enumerate(transform(xs)):
            out.append(f"  store {vt} {y}, ptr {ptr(dst, f'%line{n}', dst_line, i, dst_idx, chunk)}, align 4")
        out.extend([f"  %next{n} = add nuw nsw i64 %line{n}, 1",
                f"  %more{n} = icmp ult i64 %next{n}, {count}",
                f"  br i1 %more{n}, label %loop{n}, label %done{n}, !llvm.loop !0",
                f"done{n}:"])
        prev = f"done{n}"

    for chunk in range(BLOCK // lanes):
        # pass 1: down each column j of src into column j of the scratch
        pass_loop(q, "src", "col", "row", scratch, "col", "row", chunk)
        # pass 2: along each row i of the scratch into row i of dst: the transpose is free
        pass_loop(p, scratch, "row", "col", "dst", "row", "col", chunk)
    out += ["  ret void", "}", f"declare {vt} {fma}({vt}, {vt}, {vt})",
            "!0 = distinct !{!0, !1, !2}",
            '!1 = !{!"llvm.loop.unroll.disable"}',
            '!2 = !{!"llvm.loop.vectorize.enable", i1 false}', ""]
    return "\n".join(out)


def kernel(isa_name: str, kind: str, m: int) -> WinoKernel:
    return WinoKernel(ISAS[isa_name], kind, m)
