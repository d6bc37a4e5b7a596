"""GELU, in its erf form and its tanh form, and tanh, against `Ops` (see the package's doc for
the algorithms; coefficients fitted by scripts/fit_vmath.py)."""

from __future__ import annotations

import numpy as np

from .core import (FLT_MAX, SILU_LO, Ops, exp_reduced, exp_reduced_product, exp_ratio, times_pow2,
                   clamp_nan_through, horner, scaled_exp)

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


def gelu(o: Ops, x, near: bool = False):
    """x Phi(x) = x - E for x > 0, -E for x < 0, E = y Phi(-y) = G(y) exp(-y^2/2), y = |x|; below
    GELU_SMALL, x (0.5 + x P(x^2)). near: the form for |x| <= GELU_NEAR (no clamp, no NaN, no
    far polynomial, one power of two: the same bits)."""
    # Zeros keep the sign of x (the product's: gelu(-0) = gelu(-1e-45) = -0).
    small = o.mul(x, o.fma(x, horner(o, o.mul(x, x), GELU_P), o.c(0.5)))
    y = o.abs(x) if near else clamp_nan_through(o, o.abs(x), 0.0, GELU_TAIL)
    k = o.binade(y, GELU_SMALL, len(GELU_CENTRES) - 1)
    u = o.sub(y, o.lookup(k, GELU_CENTRES))  # exact: y is within a factor of two of its centre
    g = o.lookup(k, [row[-1] for row in GELU_G])
    for j in reversed(range(len(GELU_G[0]) - 1)):
        g = o.fma(g, u, o.lookup(k, [row[j] for row in GELU_G]))
    if not near:  # beyond the tables: G in 1 / y, hardly moved by its rounding
        g = o.select(o.gt(y, o.c(GELU_NEAR)), horner(o, o.sub(o.div(o.c(1.0), y), o.c(GELU_VMID)), GELU_FAR), g)
    t, n = exp_reduced_product(o, y, o.mul(y, o.c(-0.5)))  # exp(-y^2/2), y^2 not rounded
    m = o.fma(g, t, g)  # G (1 + t): one rounding, then powers of two (the subnormal range rounds once)
    if near:  # y <= 8: 2^n normal, the result too
        e = o.mul(m, o.pow2(n))
    else:
        n1 = o.half_int(n)
        e = times_pow2(o, m, n1, o.sub(n, n1))
    # x - E for x > 0, -E for x < 0 (-0 where E rounds to 0: the sign of x). Fenced: the product
    # that makes E is not contracted into the subtraction as an FMA.
    e = o.fence(e)
    tail = o.select(o.gt(x, o.c(0.0)), o.sub(x, e), o.neg(e))
    out = o.select(o.lt(o.abs(x), o.c(GELU_SMALL)), small, tail)
    if near:
        return out
    # -inf: NaN, as eager has it (-inf * 0). +inf: inf - 0 = inf, the limit, which PyTorch 2.13's
    # scalar and AVX2 kernels give too (its AVX-512 kernel gives NaN there).
    out = o.select(o.lt(x, o.c(-FLT_MAX)), o.c(float("nan")), out)
    return o.select(o.isnan(x), x, out)


TANH_ONE = 9.5  # |x| beyond: tanh(x) rounds to +-1 (from 9.01)


def tanh(o: Ops, x):
    """(1 - e) / (1 + e), e = exp(-2|x|) = (1 + t) 2^n, with x's sign: 1 -+ 2^n split exactly
    and t 2^n exact, so each side rounds about once; where n = 0 (|x| < 0.17) this is
    -t / (2 + t), t = expm1(-2|x|) from the polynomial: no cancellation, tanh(x) = x for tiny x."""
    y = clamp_nan_through(o, o.abs(x), 0.0, TANH_ONE)
    t, n = exp_reduced(o, o.mul(y, o.c(-2.0)))
    s = o.pow2(n)
    v = o.div(_one_plus(o, o.neg(s), o.neg(t), s), _one_plus(o, s, t, s))
    return o.select(o.isnan(x), x, o.copysign(v, x))


def _one_plus(o: Ops, a, t, s):
    """1 + a + t s for |a| <= 1: 1 + a = hi + lo exactly (Fast2Sum; fenced, not folded to 0)."""
    hi = o.add(o.c(1.0), a)
    lo = o.sub(a, o.fence(o.sub(hi, o.c(1.0))))
    return o.add(o.fma(t, s, lo), hi)


# gelu_tanh: 0.5 x (1 + tanh(z)), z = sqrt(2/pi) (x + 0.044715 x^3), is x / (1 + exp(-w)),
# w = 2z = x (A + B x^2), A and B as float32 pairs.
GT_A = 2 * np.sqrt(2 / np.pi)
GT_B = GT_A * 0.044715
GT_A_HI, GT_B_HI = float(np.float32(GT_A)), float(np.float32(GT_B))
GT_A_LO, GT_B_LO = float(np.float32(GT_A - GT_A_HI)), float(np.float32(GT_B - GT_B_HI))
GT_FAR = 8.8  # |x| up to: |w| <= 62.7 (the near form); beyond, x or x exp(w), which rounds to 0 below -10.7
GT_CLAMP = 12.0  # |x| clamped to, for w (x^3 stays finite)


def _gelu_tanh_arg(o: Ops, x):
    """w = x (A + B x^2) as hi + lo, to about 2^-40 relative: the result moves by |w| times w's
    relative error (1 ulp of w would be 16 ulp of the result at x = -4, 100 at x = -9)."""
    sh = o.mul(x, x)
    sl = o.fma(x, x, o.neg(sh))  # x^2 = sh + sl exactly
    p = o.mul(o.c(GT_B_HI), sh)
    pl = o.fma(o.c(GT_B_HI), sh, o.neg(p))  # B sh = p + pl exactly
    v = o.fence(o.add(o.c(GT_A_HI), p))  # A + p = v + vl exactly (2Sum)
    bv = o.fence(o.sub(v, o.c(GT_A_HI)))
    vl = o.add(o.sub(o.c(GT_A_HI), o.sub(v, bv)), o.sub(p, bv))
    vl = o.add(vl, o.fma(o.c(GT_B_HI), sl, o.fma(o.c(GT_B_LO), sh, o.add(pl, o.c(GT_A_LO)))))
    wh = o.fence(o.mul(x, v))
    return wh, o.fma(x, vl, o.fma(x, v, o.neg(wh)))


def gelu_tanh(o: Ops, x, near: bool = False):
    """x / (1 + exp(-w)), SiLU's quotient with the argument w = wh + wl (wl enters exp's reduction);
    x < -GT_FAR: x exp(wh) (1 + wl), x joining exp's mantissa; x > GT_FAR: x."""
    if near:
        return exp_ratio(o, x, x, None, _gelu_tanh_arg(o, x), GT_FAR)
    xc = clamp_nan_through(o, x, -GT_CLAMP, GT_CLAMP)  # -inf: restored to NaN below
    wh, wl = _gelu_tanh_arg(o, xc)
    far = scaled_exp(o, clamp_nan_through(o, wh, -SILU_LO, 0.0), o.fma(xc, wl, xc))
    y = exp_ratio(o, x, x, far, (wh, wl), GT_FAR)
    return o.select(o.lt(x, o.c(-FLT_MAX)), o.c(float("nan")), y)  # -inf * 0: NaN, as eager has it
