"""Fit the polynomials of microkernels/f32_vmath.py (minimax in relative error, by Lawson's
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


def powers(deg, times=None):
    return lambda t: np.stack([t**i for i in range(deg + 1)], 1) * (1 if times is None else times(t)[:, None])


def main():
    half_ln2 = np.log(2) / 2
    # exp(r) = 1 + r + r^2 q(r) on |r| <= ln2/2, error relative to exp(r).
    exp_q, e1 = lawson(lambda r: np.exp(r) - 1 - r, np.exp, -half_ln2, half_ln2, powers(4, lambda r: r * r))
    small, split, tail = 0.75, 2.5, 14.5
    phi = lambda x: 0.5 * special.erfc(-x / np.sqrt(2))  # noqa: E731
    # Phi(x) = 0.5 + x P(x^2) on |x| < small, fitted on the negative side (Phi smallest there).
    gelu_p, e2 = lawson(lambda s: phi(-np.sqrt(s)) - 0.5, lambda s: phi(-np.sqrt(s)), 1e-12, small * small,
                        powers(4, lambda s: -np.sqrt(s)))
    # Mills ratio S(y) = Phi(-y) exp(y^2/2): a polynomial in y on [small, split], y * S(y) a
    # polynomial in v = 1 / y on [split, tail] (one rounding in v, whose effect on S is about
    # its own size; a variable such as 4 / (4 + y) is rounded twice and amplifies it).
    mills = lambda y: 0.5 * special.erfcx(y / np.sqrt(2))  # noqa: E731
    # Centred on the interval (y - mid is exact for y >= mid / 2): in y itself the terms cancel.
    mid = (small + split) / 2
    near_f = lambda z: mills(z + mid)  # noqa: E731
    near, e3 = lawson(near_f, near_f, small - mid, split - mid, powers(10))
    vmid = (1 / tail + 1 / split) / 2
    far_f = lambda w: mills(1 / (w + vmid)) / (w + vmid)  # noqa: E731
    far, e4 = lawson(far_f, far_f, 1 / tail - vmid, 1 / split - vmid, powers(9))
    for name, c, e in (("EXP_Q", exp_q, e1), ("GELU_P", gelu_p, e2), ("GELU_NEAR", near, e3), ("GELU_FAR", far, e4)):
        print(f"{name} = ({', '.join(repr(float(np.float32(v))) for v in c)})  # {e / 2**-24:.3f} ulp")


if __name__ == "__main__":
    main()
