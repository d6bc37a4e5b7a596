"""Vectorized float32 math for the activations: exp, sigmoid, SiLU, GELU (erf and tanh forms), tanh,
hardsigmoid, hardswish, leaky ReLU, ELU, each written once against a small set of float operations
(`Ops`, in core.py) and rendered by whoever evaluates it: LLVM IR row kernels in
microkernels/f32_vmap.py (the standalone maps of the Relax pass), numpy float32 arrays
(`NumpyOps`, numpy_ops.py, for developing and explaining the algorithms). Every
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
  tanh:    (1 - e) / (1 + e), e = exp(-2|x|) = (1 + t) 2^n, x's sign copied: 1 -+ 2^n split
           exactly, t 2^n exact, each side rounded about once; for |x| < 0.17 (n = 0) that is
           -t / (2 + t) with t = expm1(-2|x|): no cancellation, tanh(x) = x for tiny x. |x| is
           clamped to 9.5 (tanh rounds to 1 from 9.01).
  gelu_tanh: 0.5 x (1 + tanh(z)), z = sqrt(2/pi) (x + 0.044715 x^3), as x / (1 + exp(-w)),
           w = 2z: SiLU's quotient, no cancellation in the negative tail (where eager's 1 + tanh
           cancels). w = x (A + B x^2) is carried as hi + lo (exact products and a 2Sum, A and B
           as float32 pairs): the result moves by |w| times w's relative error, 100 ulp at
           x = -9 for a rounded w. x < -8.8: x exp(w), x in exp's mantissa; x > 8.8: x.
  hardsigmoid: clamp(x + 3, 0, 6) / 6; hardswish: (x * clamp(x + 3, 0, 6)) / 6 (PyTorch's forms).
  leaky_relu: x < 0 ? alpha x : x; elu: x < 0 ? alpha (exp(x) - 1) : x, exp(x) - 1 = expm1 for
           small |x| by the polynomial without its 1 (no cancellation).
Bounds, measured against float64 rounded to float32 over a dense sweep of bit patterns
(tests/intrinsics/test_f32_vmath.py): ULP_BOUND. Specials follow PyTorch: NaN in, NaN out;
sigmoid(-inf) = 0, silu(-inf) = gelu(-inf) = gelu_tanh(-inf) = hardswish(-inf) = NaN (-inf * 0,
as eager computes), gelu(+inf) = gelu_tanh(+inf) = inf, tanh(+-inf) = +-1; zeros signed as the
float64 value (tanh(-0) = -0; gelu(-0) = gelu(-1e-45) = gelu(-FLT_MAX) = -0, the sign of x Phi(x),
as PyTorch 2.13's scalar and AVX-512 kernels give; its AVX2 kernel gives +0 there).
"""

from __future__ import annotations

from .core import (EXP_HI, EXP_LO, FAR, FLT_MAX, SILU_LO, Ops, clamp_nan_through, elu, exp, hardsigmoid,
                   hardswish, horner, leaky_relu, scaled_exp, sigmoid, silu)
from .gelu import GELU_NEAR, GELU_SMALL, GELU_TAIL, GT_FAR, TANH_ONE, gelu, gelu_tanh, tanh
from .numpy_ops import NumpyOps

# Max error in ulp of the float64 result rounded to float32, every finite input (the tests
# measure it and fail above it).
ULP_BOUND = {"exp": 1.5, "sigmoid": 2.0, "silu": 2.0, "gelu": 2.0, "tanh": 2.0, "gelu_tanh": 2.0,
             "hardsigmoid": 1.5, "hardswish": 2.0, "leaky_relu": 1.0, "elu": 2.0}

FUNCTIONS = {"exp": exp, "sigmoid": sigmoid, "silu": silu, "gelu": gelu, "tanh": tanh, "gelu_tanh": gelu_tanh,
             "hardsigmoid": hardsigmoid, "hardswish": hardswish, "leaky_relu": leaky_relu, "elu": elu}
PARAMETRIC = {"leaky_relu": 0.01, "elu": 1.0}  # the one parameter (alpha) and its default
# Functions with a near form: the same operations without the branch for |x| > NEAR[name] (nor
# for NaN and infinities beyond it), equal to the full form bit for bit wherever every |x| is
# within, for a renderer that can test a vector and branch (the row kernels: about a quarter
# fewer instructions, and activations beyond 64 are rare).
NEAR = {"sigmoid": FAR, "silu": FAR, "gelu": GELU_NEAR, "gelu_tanh": GT_FAR}


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


__all__ = ["EXP_HI", "EXP_LO", "FAR", "FLT_MAX", "FUNCTIONS", "GELU_NEAR", "GELU_SMALL", "GELU_TAIL",
           "GT_FAR", "NEAR", "PARAMETRIC", "SILU_LO", "TANH_ONE", "ULP_BOUND", "NumpyOps", "Ops",
           "clamp_nan_through", "elu", "evaluate", "exp", "gelu", "gelu_tanh", "hardsigmoid", "hardswish",
           "horner", "leaky_relu", "scaled_exp", "sigmoid", "silu", "tanh"]
