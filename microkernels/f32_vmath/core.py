"""The shared steps of the vector math (exp and its reductions, the sigmoid family's quotient,
the piecewise-linear activations) and the operations they are written against (`Ops`)."""

from __future__ import annotations

FLT_MAX = 3.4028234663852886e38
LOG2E = 1.4426950408889634
LN2_HI = 0.693145751953125  # 14 significant bits: n * LN2_HI is exact for |n| <= 2^10
LN2_LO = 1.4286067653302226e-06  # ln 2 - LN2_HI
EXP_LO, EXP_HI = -104.0, 89.0  # exp(x) rounds to 0 below, overflows above
EXP_Q = (0.4999999403953552, 0.1666652113199234, 0.04166838899254799, 0.008368710055947304, 0.0013814611593261361)  # r^0..r^4 of q(r)


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
    def copysign(self, a, b): ...       # |a| with the sign of b

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


def exp_reduced(o: Ops, x, lo=None):
    """(t, n) with exp(x + lo) = (1 + t) * 2^n, x already in [EXP_LO, EXP_HI] (lo: None, or a
    correction below an ulp of x, added to the reduced argument)."""
    n = o.round(o.mul(x, o.c(LOG2E)))
    r = o.fma(n, o.c(-LN2_LO), o.fma(n, o.c(-LN2_HI), x))
    return _expm1_reduced(o, r if lo is None else o.add(r, lo)), n


def exp_reduced_product(o: Ops, a, b):
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
    t, n = exp_reduced(o, x)
    n1 = o.half_int(n)
    return t, n1, o.sub(n, n1)


def scaled_exp(o: Ops, x, m=None):
    """m * exp(x) (m = 1 when None), x finite in [EXP_LO, EXP_HI]: m joins the mantissa
    (m + m t, one rounding) before the powers of two, so a product that lands in the subnormal
    range is rounded once, at the end, and not first as exp(x) and again when multiplied."""
    t, n1, n2 = _exp_parts(o, x)
    return times_pow2(o, o.add(t, o.c(1.0)) if m is None else o.fma(m, t, m), n1, n2)


def times_pow2(o: Ops, v, n1, n2):
    """v * 2^n1 * 2^n2, in that order (exact but for a last rounding in the subnormal range)."""
    return o.mul(o.mul(v, o.pow2(n1)), o.pow2(n2))


def exp(o: Ops, x):
    y = scaled_exp(o, clamp_nan_through(o, x, EXP_LO, EXP_HI))
    return o.select(o.isnan(x), x, y)


SILU_LO = 112.0  # |x| e^-|x| is 0 in float32 beyond
FAR = 64.0  # |x| beyond: 1 + exp(-|x|) is 1, and the numerator alone decides


def exp_ratio(o: Ops, x, scale, far_neg, arg=None, far=FAR):
    """scale / (1 + exp(-a)) (scale = x: SiLU; None: 1, sigmoid), a = x or arg = (hi, lo), for
    |x| <= far, then the far sides: far_neg for x < -far, x (SiLU) or 1 (sigmoid) for x > far
    (far_neg None: the near form, every x a number within far: no clamp, no branch, the same
    bits); |a| <= FAR wherever |x| <= far.
    exp(-x) = (1 + t) 2^n with 2^n normal (|n| <= 93); the denominator 1 + 2^n + t 2^n is
    rounded once where it can be: 1 + 2^n = hi + lo exactly (Fast2Sum for n >= 0, exact sums
    or a negligible lo below), t 2^n is exact, so fl(fl(t 2^n + lo) + hi) rounds once for
    |n| <= 23 and adds a fraction of an ulp above. With the quotient's own rounding and t's
    error: 1.7 ulp at worst (the dense sweep), against 2.7 for the x e / (1 + e) form with its
    numerator rounded, and about half the instructions of a compensated quotient."""
    a, a_lo = (x, None) if arg is None else arg
    m = o.neg(a) if far_neg is None else clamp_nan_through(o, o.neg(a), -FAR, FAR)
    t, n = exp_reduced(o, m, None if a_lo is None else o.neg(a_lo))
    s = o.pow2(n)
    hi = o.add(o.c(1.0), s)
    lo = o.sub(o.c(1.0), o.fence(o.sub(hi, s)))  # 1 + 2^n - hi, exact (fenced: not folded to 0)
    d = o.add(o.fma(t, s, lo), hi)
    y = o.div(o.c(1.0) if scale is None else scale, d)
    if far_neg is None:
        return y
    neg = o.lt(x, o.c(0.0))
    y = o.select(o.gt(o.abs(x), o.c(far)), o.select(neg, far_neg, x if scale is not None else o.c(1.0)), y)
    return o.select(o.isnan(x), x, y)


def sigmoid(o: Ops, x, near: bool = False):
    if near:
        return exp_ratio(o, x, None, None)
    far = scaled_exp(o, clamp_nan_through(o, o.neg(o.abs(x)), EXP_LO, 0.0))
    return exp_ratio(o, x, None, far)


def silu(o: Ops, x, near: bool = False):
    if near:
        return exp_ratio(o, x, x, None)
    # x e^x rounds to -0 below -110: clamped there, the powers of two stay in range.
    xc = clamp_nan_through(o, x, -SILU_LO, SILU_LO)  # -inf: restored to NaN below
    far = scaled_exp(o, clamp_nan_through(o, o.neg(o.abs(x)), -SILU_LO, 0.0), xc)
    y = exp_ratio(o, x, x, far)
    return o.select(o.lt(x, o.c(-FLT_MAX)), o.c(float("nan")), y)  # -inf * 0: NaN, as eager has it


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
    big = o.sub(times_pow2(o, o.add(t, o.c(1.0)), n1, n2), o.c(1.0))
    # |x| < ln2/2: n = 0 and t is exp(x) - 1 itself, to the polynomial's accuracy.
    y = o.select(o.lt(o.abs(x), o.c(0.3465)), t, big)
    return o.select(o.isnan(x), x, y)


def elu(o: Ops, x, alpha: float = 1.0):
    neg = o.lt(x, o.c(0.0))
    return o.select(neg, o.mul(o.c(alpha), expm1_neg(o, o.select(neg, x, o.c(0.0)))), x)
