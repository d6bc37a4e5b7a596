"""Fit the polynomials of microkernels/f32_vmath/ (minimax in relative error, by Lawson's
iteratively reweighted least squares on Chebyshev points) and print them as the module spells
them. Needs scipy (the test extra has it). Run: python scripts/fit_vmath.py
"""

from __future__ import annotations

import numpy as np
from scipy import special


def lawson(target, scale, lo, hi, basis, iters=80, points=6000):
    """Coefficients c minimizing max |basis(t) @ c - target(t)| / scale(t) over [lo, hi]."""
    t = np.cos(np.linspace(0, np.pi, points)) * (hi - lo) / 2 + (hi + lo) / 2
    y, s, b = target(t), scale(t), basis(t)
    w = np.full(points, 1 / points)
    for _ in range(iters):
        r = np.sqrt(w)
        c, *_ = np.linalg.lstsq(b / s[:, None] * r[:, None], y / s * r, rcond=None)
        err = np.abs((b @ c - y) / s)
        w = w * err
        w /= w.sum()
    return c, err.max()


def powers(deg, times=None, first=0):
    return lambda t: np.stack([t**i for i in range(first, deg + 1)], 1) * (1 if times is None else times(t)[:, None])


def f32(v) -> str:
    """v rounded to float32, in the fewest digits that read back as that float32."""
    return str(np.float32(v))


def float32_ulp(v):
    return 2.0 ** (np.floor(np.log2(np.abs(v))) - 23)


def rounded_fit(target, lo, hi, deg):
    """Coefficients of a polynomial of degree deg in u for target(u) on [lo, hi], each rounded
    to float32 in turn with the higher ones refitted to absorb its rounding; and the max error
    in ulp of target."""
    fixed = []
    for k in range(deg + 1):
        rest = lambda u: target(u) - sum(c * u**i for i, c in enumerate(fixed))  # noqa: E731, B023
        c, _ = lawson(rest, target, lo, hi, powers(deg, first=k))
        fixed.append(float(np.float32(c[0])))
    u = np.linspace(lo, hi, 20001)
    return fixed, (np.abs(sum(c * u**i for i, c in enumerate(fixed)) - target(u)) / float32_ulp(target(u))).max()


def representable_centre(f, lo, hi):
    """The float32 near the middle of [lo, hi] where f is nearest a float32: a polynomial
    centred there has a constant term that rounds by almost nothing."""
    mid = np.float32((lo + hi) / 2)
    cand = (mid.view(np.int32) + np.arange(-20000, 20000, dtype=np.int32)).view(np.float32).astype(np.float64)
    v = f(cand)
    off = np.abs(v - v.astype(np.float32)) / float32_ulp(v) + np.abs(cand - float(mid)) / (hi - lo) * 1e-3
    return float(cand[int(np.argmin(off))])


def main():
    half_ln2 = np.log(2) / 2
    # exp(r) = 1 + r + r^2 q(r) on |r| <= ln2/2, error relative to exp(r).
    exp_q, e1 = lawson(lambda r: np.exp(r) - 1 - r, np.exp, -half_ln2, half_ln2, powers(4, lambda r: r * r))
    print(f"EXP_Q = ({', '.join(f32(v) for v in exp_q)})  # {e1 / 2**-24:.3f} ulp")
    small, near, tail = 0.5, 8.0, 14.5
    phi = lambda x: 0.5 * special.erfc(-x / np.sqrt(2))  # noqa: E731
    # Phi(x) = 0.5 + x P(x^2) on |x| < small, fitted on the negative side (Phi smallest there).
    gelu_p, e2 = lawson(lambda s: phi(-np.sqrt(s)) - 0.5, lambda s: phi(-np.sqrt(s)), 1e-12, small * small,
                        powers(3, lambda s: -np.sqrt(s)))
    print(f"GELU_P = ({', '.join(f32(v) for v in gelu_p)})  # {e2 / 2**-24:.3f} ulp")
    # G(y) = y Phi(-y) exp(y^2/2) (y times the Mills ratio: from 0.2 at y = 0.5 to 1/sqrt(2 pi)):
    # on each binade of [small, near] a polynomial of degree 9 in y - c, c a float32 near the
    # middle where G is nearly a float32 (y - c is exact, the constant term rounds by nothing).
    g = lambda y: y * 0.5 * special.erfcx(y / np.sqrt(2))  # noqa: E731
    edges = [0.5, 1.0, 2.0, 4.0, near]
    centres, rows, worst = [], [], 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        c = representable_centre(g, lo, hi)
        row, e = rounded_fit(lambda u: g(u + c), lo - c, hi - c, 9)  # noqa: B023
        centres.append(c)
        rows.append(row)
        worst = max(worst, e)
    print(f"GELU_CENTRES = ({', '.join(f32(c) for c in centres)})")
    print(f"GELU_G = (  # {worst:.3f} ulp")
    for row in rows:
        text = [f32(v) for v in row]
        print(f"    ({', '.join(text[:5])},\n     {', '.join(text[5:])}),")
    print(")")
    # Beyond near (the full form only), G as a polynomial in v = 1/y (one rounding in v, whose
    # effect on G is a few percent of its size).
    vmid = representable_centre(lambda v: g(1 / v), 1 / tail, 1 / near)
    far, e4 = rounded_fit(lambda w: g(1 / (w + vmid)), 1 / tail - vmid, 1 / near - vmid, 5)
    print(f"GELU_VMID = {f32(vmid)}")
    print(f"GELU_FAR = ({', '.join(f32(v) for v in far)})  # {e4:.3f} ulp")


if __name__ == "__main__":
    main()
