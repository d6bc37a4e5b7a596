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
  gelu:    x * Phi(x), Phi the normal CDF. |x| < 0.75: Phi = 0.5 + x P(x^2), P of degree 4.
           Else Phi(-y) = exp(-y^2/2) S(y), y = min(|x|, 14.5), with the Mills ratio S(y) a
           polynomial of degree 10 in y - 1.625 below y = 2.5 and (1/y) Q(1/y) above, Q of degree 9
           (one rounding in the variable, none amplified); y^2 is split into hi + lo by an FMA so
           exp(-y^2/2) keeps its relative accuracy far into the tail (1 + erf(x/sqrt 2), as TVM's
           legalization writes it, cancels to nothing below x = -5). Phi(x) = 1 - Phi(-x) for x > 0.
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

GELU_SMALL = 0.75  # |x| below: the odd polynomial of Phi
GELU_TAIL = 14.5  # |x| beyond: x Phi(x) is x, or rounds to 0
GELU_P = (0.3989422619342804, -0.06649015843868256, 0.00997150782495737, -0.0011793229496106505, 0.00010140813537873328)  # x^0..x^8, even powers of P
GELU_MID = (GELU_SMALL + 2.5) / 2
GELU_VMID = (1 / GELU_TAIL + 1 / 2.5) / 2
GELU_SPLIT = 2.5  # y below: S(y) a polynomial in y; above: y S(y) one in 1 / y
GELU_NEAR = (0.19502310454845428, -0.08202973008155823, 0.03086240217089653, -0.01062608603388071, 0.003398747416213155, -0.0010207935702055693, 0.0002900431281886995, -7.798630394972861e-05, 2.0250861780368723e-05, -5.679299647454172e-06, 1.327190943811729e-06)  # (y - GELU_MID)^0..^10
GELU_FAR = (0.37989288568496704, -0.14255963265895844, -0.16459514200687408, 0.39276883006095886, -0.28818628191947937, -0.39775750041007996, 1.6139920949935913, -2.3143279552459717, -1.2983978986740112, 9.508974075317383)  # (1/y - GELU_VMID)^0..^9

# Max error in ulp of the float64 result rounded to float32, every finite input (the tests
# measure it and fail above it).
# GELU misses the 2-ulp aim: the tail's S(y) and the three products after it round about
# 0.5 ulp each, and a correction of S's leading term would cost a double-float step.
ULP_BOUND = {"exp": 1.5, "sigmoid": 2.0, "silu": 2.0, "gelu": 4.0, "hardsigmoid": 1.5,
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
    r = o.fma(n, o.c(-LN2_LO), r)
    return o.fma(o.mul(r, r), horner(o, r, EXP_Q), r), n  # exp(r) - 1


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


def gelu(o: Ops, x):
    # The small branch: Phi(x) = 0.5 + x P(x^2).
    small = o.mul(x, o.fma(x, horner(o, o.mul(x, x), GELU_P), o.c(0.5)))
    # The tail: Phi(-y) = exp(-y^2 / 2) S(y), with y^2 = hi + lo exactly, hi / 2 exact, and
    # exp(-hi/2 - lo/2) = exp(-hi/2) (1 - lo/2).
    y = clamp_nan_through(o, o.abs(x), 0.0, GELU_TAIL)
    near = o.lt(y, o.c(GELU_SPLIT))
    v = o.div(o.c(1.0), y)
    s_near = horner(o, o.sub(y, o.c(GELU_MID)), GELU_NEAR)
    ys_far = horner(o, o.sub(v, o.c(GELU_VMID)), GELU_FAR)  # y S(y), hardly moved by v's rounding
    s = o.select(near, s_near, o.mul(v, ys_far))
    ys = o.select(near, o.mul(y, s_near), ys_far)
    hi = o.fence(o.mul(y, y))
    lo = o.mul(o.fma(y, y, o.neg(hi)), o.c(-0.5))
    h = o.mul(hi, o.c(-0.5))
    q = scaled_exp(o, h, o.fma(s, lo, s))  # Phi(-y)
    neg_side = scaled_exp(o, h, o.neg(o.fma(ys, lo, ys)))  # x Phi(x) = -y S(y) exp(-y^2/2), x = -y
    tail = o.select(o.lt(x, o.c(0.0)), neg_side, o.mul(x, o.sub(o.c(1.0), q)))
    out = o.select(o.lt(o.abs(x), o.c(GELU_SMALL)), small, tail)
    # -inf: NaN, as eager has it (-inf * 0). +inf: the tail's x (1 - q) = inf, the limit, which
    # PyTorch 2.13's scalar and AVX2 kernels give too (its AVX-512 kernel gives NaN there).
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
NEAR = {"sigmoid": FAR, "silu": FAR}


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
