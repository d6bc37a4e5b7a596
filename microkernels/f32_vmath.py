"""Vectorized float32 math for the activations: exp, sigmoid, SiLU, GELU (erf form), hardsigmoid,
hardswish, leaky ReLU, ELU, each written once against a small set of float operations (`Ops`)
and rendered by whoever evaluates it: TIR expressions in `intrinsics.f32_vmath` (the standalone
maps of the Relax pass), numpy float32 arrays here (`NumpyOps`, for developing and explaining
the algorithms); the kernels' epilogues are to render the same functions as LLVM IR. Every
operation is a correctly rounded IEEE one (FMAs explicit); the error terms of compensated steps
are fenced (`Ops.fence`), so no compiler rewrites them away.

Algorithms (coefficients fitted by scripts/fit_vmath.py, minimax in relative error):
  exp(x):  n = round(x log2 e), r = x - n ln2 (Cody-Waite, two FMAs), exp(r) = 1 + r + r^2 q(r)
           with q of degree 4 on |r| <= ln2/2 (0.05 ulp), times 2^n as two exact powers of two
           2^(n>>1) * 2^(n - n>>1), so results in the subnormal range round once, correctly.
           x is clamped to [-104, 89] first (beyond, the result is 0 or inf anyway) and a NaN
           returned as it came.
  sigmoid: 1 / (1 + exp(-x)) for |x| <= 64, the denominator (1 + t) 2^n + 1 rounded once
           (1 + 2^n split exactly into hi + lo, t 2^n exact); no cancellation on either side.
           x < -64: exp(x) alone; x > 64: 1.
  silu:    x / (1 + exp(-x)), the same denominator; x < -64: x joins exp(x)'s mantissa before
           its powers of two (one rounding near 0); x > 64: x.
  gelu:    x * Phi(x), Phi the normal CDF. |x| < 0.5: Phi = 0.5 + x P(x^2), P of degree 3. Else
           with y = |x|: E = y Phi(-y) = G(y) exp(-y^2/2) and x Phi(x) = x - E (x > 0), -E (x < 0):
           no cancellation (E <= x/2). G (y times the Mills ratio, 0.2 to 0.4) on each binade of
           [0.5, 8] a polynomial of degree 9 in y - c, its coefficients looked up by the binade
           (a permute within 128-bit lanes) and c where G is nearly a float32 (the constant term
           exact); beyond 8 (the full form only) one of degree 5 in 1/y. -y^2/2 enters exp's
           reduction unrounded (y (-y/2) - n LN2_HI in one FMA) and G joins the mantissa before
           the powers of two. y is clamped to 14.5, where x Phi(x) is x or rounds to 0. The row
           kernels test each vector: every |x| <= 8 (nearly all activations) skips the clamp,
           the 1/y polynomial and the specials. 1.6 ulp at worst (the old form, S(y) in two
           polynomials, one with a division, and two exps, reached 3.0 and cost 20% more).
  hardsigmoid: clamp(x + 3, 0, 6) / 6; hardswish: (x * clamp(x + 3, 0, 6)) / 6 (PyTorch's forms).
  leaky_relu: x < 0 ? alpha x : x; elu: x < 0 ? alpha (exp(x) - 1) : x, exp(x) - 1 = expm1 for
           small |x| by the polynomial without its 1 (no cancellation).
Bounds, measured against float64 rounded to float32 over a dense sweep of bit patterns
(tests/intrinsics/test_f32_vmath.py): ULP_BOUND. Specials follow PyTorch: NaN in, NaN out;
sigmoid(-inf) = 0, silu(-inf) = gelu(-inf) = hardswish(-inf) = NaN (-inf * 0, as eager computes),
gelu(+inf) = NaN (eager's too).
"""

from __future__ import annotations

import numpy as np

FLT_MAX = 3.4028234663852886e38
LOG2E = 1.4426950408889634
LN2_HI = 0.693145751953125  # 14 significant bits: n * LN2_HI is exact for |n| <= 2^10
LN2_LO = 1.4286067653302226e-06  # ln 2 - LN2_HI
EXP_LO, EXP_HI = -104.0, 89.0  # exp(x) rounds to 0 below, overflows above
EXP_Q = (0.4999999403953552, 0.1666652113199234, 0.04166838899254799, 0.008368710055947304, 0.0013814611593261361)  # r^0..r^4 of q(r)

GELU_SMALL = 0.5  # |x| below: the odd polynomial of Phi
GELU_NEAR = 8.0  # |x| up to: the binade tables of G (the near form); beyond, G in 1 / y
GELU_TAIL = 14.5  # |x| beyond: x Phi(x) is x, or rounds to 0
GELU_P = (0.39894226, -0.06648949, 0.009961249, -0.0011229948)  # x^0..x^6, even powers
GELU_CENTRES = (0.748998, 1.4991796, 3.0012398, 5.9996104)
GELU_G = (  # per binade: (y - GELU_CENTRES[k])^0..^9
    (0.22500399, 0.17012723, -0.11022582, 0.05754531, -0.025966205,
     0.010422549, -0.003907277, 0.002844121, -0.00018322901, -0.010217751),
    (0.30861324, 0.07043529, -0.03753146, 0.016462296, -0.006340528,
     0.002212877, -0.00071476324, 0.00022363708, -6.310264e-05, 4.319463e-06),
    (0.36456454, 0.018295467, -0.006923197, 0.002221655, -0.0006408616,
     0.00017083692, -4.2514228e-05, 1.00453335e-05, -2.5655984e-06, 5.776767e-07),
    (0.38867465, 0.0031815125, -0.0007237107, 0.0001434059, -2.6157446e-05,
     4.497304e-06, -7.220253e-07, 1.1311599e-07, -2.2184013e-08, 3.4260066e-09),
)
GELU_VMID = 0.097011074
GELU_FAR = (0.3952891, -0.07331686, -0.33844954, 0.37222645, 0.5589904, -1.9438869)  # (1/y - GELU_VMID)^0..^5

# Max error in ulp of the float64 result rounded to float32, every finite input (the tests
# measure it and fail above it).
ULP_BOUND = {"exp": 1.5, "sigmoid": 2.0, "silu": 2.0, "gelu": 2.0, "hardsigmoid": 1.5,
             "hardswish": 2.0, "leaky_relu": 1.0, "elu": 2.0}


class Ops:
    """The operations an algorithm may use; a renderer implements each for its values."""

    def c(self, v: float): ...          # a float32 constant
    def add(self, a, b): ...
    def sub(self, a, b): ...
    def mul(self, a, b): ...
    def div(self, a, b): ...
    def fma(self, a, b, c): ...         # a * b + c, rounded once
    def neg(self, a): ...
    def abs(self, a): ...
    def lt(self, a, b): ...             # ordered comparisons: false on NaN
    def gt(self, a, b): ...
    def ugt(self, a, b): ...            # a > b, or either is NaN (unordered or greater)
    def isnan(self, a): ...
    def select(self, m, a, b): ...
    def round(self, a): ...             # to nearest, ties to even
    def pow2(self, n): ...              # 2^n for a float n holding an integer in [-126, 127]
    def half_int(self, n): ...          # floor(n / 2) for a float n holding an integer, exactly
    def binade(self, a, first, top): ...  # min(e(a) - e(first), top) as an index, e the exponent
    #                                     (a >= 0, first a power of two); a below first: any index
    def lookup(self, k, values): ...    # values[k] (4 float32 constants), k a binade index

    def fence(self, a):                 # a, computed as written: no reassociation or contraction
        return a                        # across it (llvm.arithmetic.fence) where a compiler may


def horner(o: Ops, x, coefs):
    """coefs[0] + x coefs[1] + ... by FMAs, highest first."""
    acc = o.c(coefs[-1])
    for a in reversed(coefs[:-1]):
        acc = o.fma(acc, x, o.c(a))
    return acc


def clamp_nan_through(o: Ops, x, lo: float, hi: float):
    """x clamped to [lo, hi]; a NaN comes out as hi (finite: what a float-to-int conversion of
    it does is undefined), for the caller to restore."""
    x = o.select(o.lt(x, o.c(lo)), o.c(lo), x)
    return o.select(o.ugt(x, o.c(hi)), o.c(hi), x)  # one compare: a vminps on x86


def _exp_reduced(o: Ops, x):
    """(t, n) with exp(x) = (1 + t) * 2^n, x already in [EXP_LO, EXP_HI]."""
    n = o.round(o.mul(x, o.c(LOG2E)))
    r = o.fma(n, o.c(-LN2_HI), x)
    return _expm1_reduced(o, o.fma(n, o.c(-LN2_LO), r)), n


def _exp_reduced_product(o: Ops, a, b):
    """(t, n) with exp(a b) = (1 + t) * 2^n, a b in [EXP_LO, EXP_HI]: the product enters the
    reduction unrounded (a b - n LN2_HI in one FMA, |result| < 0.35: a rounding of 2^-26 at most),
    so an argument such as -y^2/2 keeps its relative accuracy where it is large."""
    n = o.round(o.mul(o.mul(a, b), o.c(LOG2E)))
    r = o.fma(a, b, o.mul(n, o.c(-LN2_HI)))  # n LN2_HI exact
    return _expm1_reduced(o, o.fma(n, o.c(-LN2_LO), r)), n


def _expm1_reduced(o: Ops, r):
    """exp(r) - 1 for |r| <= ln2/2 (a little beyond, from the reduction's rounding)."""
    return o.fma(o.mul(r, r), horner(o, r, EXP_Q), r)


def _exp_parts(o: Ops, x):
    """(t, n1, n2) with exp(x) = (1 + t) * 2^n1 * 2^n2, x already in [EXP_LO, EXP_HI]: 2^n
    as two powers that are each normal, whatever n."""
    t, n = _exp_reduced(o, x)
    n1 = o.half_int(n)
    return t, n1, o.sub(n, n1)


def scaled_exp(o: Ops, x, m=None):
    """m * exp(x) (m = 1 when None), x finite in [EXP_LO, EXP_HI]: m joins the mantissa
    (m + m t, one rounding) before the powers of two, so a product that lands in the subnormal
    range is rounded once, at the end, and not first as exp(x) and again when multiplied."""
    t, n1, n2 = _exp_parts(o, x)
    return _times_pow2(o, o.add(t, o.c(1.0)) if m is None else o.fma(m, t, m), n1, n2)


def _times_pow2(o: Ops, v, n1, n2):
    """v * 2^n1 * 2^n2, in that order (exact but for a last rounding in the subnormal range)."""
    return o.mul(o.mul(v, o.pow2(n1)), o.pow2(n2))


def exp(o: Ops, x):
    y = scaled_exp(o, clamp_nan_through(o, x, EXP_LO, EXP_HI))
    return o.select(o.isnan(x), x, y)


SILU_LO = 112.0  # |x| e^-|x| is 0 in float32 beyond
FAR = 64.0  # |x| beyond: 1 + exp(-|x|) is 1, and the numerator alone decides


def _ratio(o: Ops, x, scale, far_neg):
    """scale / (1 + exp(-x)) (scale = x: SiLU; None: 1, sigmoid) for |x| <= FAR, then the far
    sides: far_neg for x < -FAR, x (SiLU) or 1 (sigmoid) for x > FAR (far_neg None: the near
    form, every x a number within FAR: no clamp, no branch, the same bits).
    exp(-x) = (1 + t) 2^n with 2^n normal (|n| <= 93); the denominator 1 + 2^n + t 2^n is
    rounded once where it can be: 1 + 2^n = hi + lo exactly (Fast2Sum for n >= 0, exact sums
    or a negligible lo below), t 2^n is exact, so fl(fl(t 2^n + lo) + hi) rounds once for
    |n| <= 23 and adds a fraction of an ulp above. With the quotient's own rounding and t's
    error: 1.7 ulp at worst (the dense sweep), against 2.7 for the x e / (1 + e) form with its
    numerator rounded, and about half the instructions of a compensated quotient."""
    m = o.neg(x) if far_neg is None else clamp_nan_through(o, o.neg(x), -FAR, FAR)
    t, n = _exp_reduced(o, m)
    s = o.pow2(n)
    hi = o.add(o.c(1.0), s)
    lo = o.sub(o.c(1.0), o.fence(o.sub(hi, s)))  # 1 + 2^n - hi, exact (fenced: not folded to 0)
    d = o.add(o.fma(t, s, lo), hi)
    y = o.div(o.c(1.0) if scale is None else scale, d)
    if far_neg is None:
        return y
    neg = o.lt(x, o.c(0.0))
    y = o.select(o.gt(o.abs(x), o.c(FAR)), o.select(neg, far_neg, x if scale is not None else o.c(1.0)), y)
    return o.select(o.isnan(x), x, y)


def sigmoid(o: Ops, x, near: bool = False):
    if near:
        return _ratio(o, x, None, None)
    far = scaled_exp(o, clamp_nan_through(o, o.neg(o.abs(x)), EXP_LO, 0.0))
    return _ratio(o, x, None, far)


def silu(o: Ops, x, near: bool = False):
    if near:
        return _ratio(o, x, x, None)
    # x e^x rounds to -0 below -110: clamped there, the powers of two stay in range.
    xc = clamp_nan_through(o, x, -SILU_LO, SILU_LO)  # -inf: restored to NaN below
    far = scaled_exp(o, clamp_nan_through(o, o.neg(o.abs(x)), -SILU_LO, 0.0), xc)
    y = _ratio(o, x, x, far)
    return o.select(o.lt(x, o.c(-FLT_MAX)), o.c(float("nan")), y)  # -inf * 0: NaN, as eager has it


def gelu(o: Ops, x, near: bool = False):
    """x Phi(x) = x - E for x > 0, -E for x < 0, E = y Phi(-y) = G(y) exp(-y^2/2), y = |x|; below
    GELU_SMALL, x (0.5 + x P(x^2)). near: the form for |x| <= GELU_NEAR (no clamp, no NaN, no
    far polynomial, one power of two: the same bits)."""
    small = o.mul(x, o.fma(x, horner(o, o.mul(x, x), GELU_P), o.c(0.5)))
    y = o.abs(x) if near else clamp_nan_through(o, o.abs(x), 0.0, GELU_TAIL)
    k = o.binade(y, GELU_SMALL, len(GELU_CENTRES) - 1)
    u = o.sub(y, o.lookup(k, GELU_CENTRES))  # exact: y is within a factor of two of its centre
    g = o.lookup(k, [row[-1] for row in GELU_G])
    for j in reversed(range(len(GELU_G[0]) - 1)):
        g = o.fma(g, u, o.lookup(k, [row[j] for row in GELU_G]))
    if not near:  # beyond the tables: G in 1 / y, hardly moved by its rounding
        g = o.select(o.gt(y, o.c(GELU_NEAR)), horner(o, o.sub(o.div(o.c(1.0), y), o.c(GELU_VMID)), GELU_FAR), g)
    t, n = _exp_reduced_product(o, y, o.mul(y, o.c(-0.5)))  # exp(-y^2/2), y^2 not rounded
    m = o.fma(g, t, g)  # G (1 + t): one rounding, then powers of two (the subnormal range rounds once)
    if near:  # y <= 8: 2^n normal, the result too
        e = o.mul(m, o.pow2(n))
    else:
        n1 = o.half_int(n)
        e = _times_pow2(o, m, n1, o.sub(n, n1))
    # max(x, -0) - E: x - E for x > 0, -E for x < 0 (-0 where E rounds to 0, as eager has it).
    tail = o.sub(o.select(o.gt(x, o.c(-0.0)), x, o.c(-0.0)), e)
    out = o.select(o.lt(o.abs(x), o.c(GELU_SMALL)), small, tail)
    if near:
        return out
    # -inf: NaN, as eager has it (-inf * 0). +inf: inf - 0 = inf, the limit, which PyTorch 2.13's
    # scalar and AVX2 kernels give too (its AVX-512 kernel gives NaN there).
    out = o.select(o.lt(x, o.c(-FLT_MAX)), o.c(float("nan")), out)
    return o.select(o.isnan(x), x, out)


def hardsigmoid(o: Ops, x):
    return o.div(_relu6(o, o.add(x, o.c(3.0))), o.c(6.0))


def hardswish(o: Ops, x):
    # x >= 3: x itself (x * 6 / 6, which would overflow for the largest x).
    y = o.div(o.mul(x, _relu6(o, o.add(x, o.c(3.0)))), o.c(6.0))
    return o.select(o.gt(x, o.c(3.0)), x, y)


def _relu6(o: Ops, v):
    v = o.select(o.lt(v, o.c(0.0)), o.c(0.0), v)
    return o.select(o.gt(v, o.c(6.0)), o.c(6.0), v)


def leaky_relu(o: Ops, x, alpha: float = 0.01):
    return o.select(o.lt(x, o.c(0.0)), o.mul(x, o.c(alpha)), x)


def expm1_neg(o: Ops, x):
    """exp(x) - 1 for x <= 0 (a NaN through): the reduction's t where n = 0, else exp(x) - 1."""
    xc = clamp_nan_through(o, x, EXP_LO, 0.0)
    t, n1, n2 = _exp_parts(o, xc)
    big = o.sub(_times_pow2(o, o.add(t, o.c(1.0)), n1, n2), o.c(1.0))
    # |x| < ln2/2: n = 0 and t is exp(x) - 1 itself, to the polynomial's accuracy.
    y = o.select(o.lt(o.abs(x), o.c(0.3465)), t, big)
    return o.select(o.isnan(x), x, y)


def elu(o: Ops, x, alpha: float = 1.0):
    neg = o.lt(x, o.c(0.0))
    return o.select(neg, o.mul(o.c(alpha), expm1_neg(o, o.select(neg, x, o.c(0.0)))), x)


FUNCTIONS = {"exp": exp, "sigmoid": sigmoid, "silu": silu, "gelu": gelu, "hardsigmoid": hardsigmoid,
             "hardswish": hardswish, "leaky_relu": leaky_relu, "elu": elu}
PARAMETRIC = {"leaky_relu": 0.01, "elu": 1.0}  # the one parameter (alpha) and its default
# Functions with a near form: the same operations without the branch for |x| > NEAR[name] (nor
# for NaN and infinities beyond it), equal to the full form bit for bit wherever every |x| is
# within, for a renderer that can test a vector and branch (the row kernels: about a quarter
# fewer instructions, and activations beyond 64 are rare).
NEAR = {"sigmoid": FAR, "silu": FAR, "gelu": GELU_NEAR}


def evaluate(o: Ops, name: str, x, alpha: float | None = None, near: bool = False):
    """FUNCTIONS[name](x), with its alpha for the parametric ones; near: its near form (NEAR),
    valid only where |x| <= NEAR[name]."""
    if name not in FUNCTIONS:
        raise ValueError(f"no vector math for {name!r}; have {sorted(FUNCTIONS)}")
    if near:
        if name not in NEAR:
            raise ValueError(f"{name} has no near form; have {sorted(NEAR)}")
        return FUNCTIONS[name](o, x, near=True)
    if name in PARAMETRIC:
        return FUNCTIONS[name](o, x, PARAMETRIC[name] if alpha is None else float(alpha))
    if alpha is not None:
        raise ValueError(f"{name} takes no parameter, got alpha={alpha!r}")
    return FUNCTIONS[name](o, x)


class NumpyOps(Ops):
    """float32 numpy arrays, each operation rounded as the vector instruction rounds it (the
    FMA through float64, whose product is exact: double rounding of the sum is possible but
    rare enough for development; the tests measure the compiled code)."""

    def c(self, v):
        return np.float32(v)

    def add(self, a, b):
        return np.add(a, b, dtype=np.float32)

    def sub(self, a, b):
        return np.subtract(a, b, dtype=np.float32)

    def mul(self, a, b):
        return np.multiply(a, b, dtype=np.float32)

    def div(self, a, b):
        with np.errstate(all="ignore"):
            return np.divide(a, b, dtype=np.float32)

    def fma(self, a, b, c):
        with np.errstate(all="ignore"):
            return (np.float64(a) * np.float64(b) + np.float64(c)).astype(np.float32)

    def neg(self, a):
        return np.negative(a)

    def abs(self, a):
        return np.abs(a)

    def lt(self, a, b):
        return np.less(a, b)

    def gt(self, a, b):
        return np.greater(a, b)

    def ugt(self, a, b):
        return ~np.less_equal(a, b)

    def isnan(self, a):
        return np.isnan(a)

    def select(self, m, a, b):
        return np.where(m, a, b).astype(np.float32)

    def round(self, a):
        return np.rint(a).astype(np.float32)

    def pow2(self, n):
        return ((n.astype(np.int32) + 127) << 23).view(np.float32)

    def half_int(self, n):
        return (n.astype(np.int32) >> 1).astype(np.float32)

    def binade(self, a, first, top):
        k = (np.asarray(a, np.float32).view(np.int32) >> 23) - (np.float32(first).view(np.int32) >> 23)
        return np.minimum(k, top)

    def lookup(self, k, values):
        return np.asarray(values, np.float32)[k & 3]  # as vpermilps: the index's low two bits
