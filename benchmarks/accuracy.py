"""`bench accuracy`: float32 error of conv2d against a float64 reference, direct and Winograd.

Unit-normal data and weights, one 3x3 stride-1 layer (padding 1) per input-channel count C;
the output channels equal C. Printed per algorithm: the largest absolute error relative to the
largest output (max |y - ref| / max |ref|) and the mean relative error over outputs of at least
1% of that largest one (mean |y - ref| / |ref|), which is what a user of the activations sees.
"""

from __future__ import annotations

import numpy as np

import schedules
from microkernels import Isa

ALGORITHMS = (("direct", None), ("winograd", 2), ("winograd", 4), ("winograd", 6))


def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Plain float64 3x3 conv, padding 1."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd))
    for r in range(3):
        for s in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, r:r + h, s:s + wd], w[:, :, r, s])
    return out


def run(isa: Isa, channels, size: int, log) -> dict:
    rng = np.random.default_rng(0)
    names = [a if t is None else f"F({t}x{t})" for a, t in ALGORITHMS]
    log(f"float32 error against float64, unit-normal data and weights, {size}x{size} 3x3 s1 p1, O = C ({isa.name})")
    log(f"  {'C':>4s} " + " ".join(f"{n + ' max':>15s} {n + ' mean':>15s}" for n in names))
    rows = []
    for c in channels:
        x = rng.standard_normal((1, c, size, size), dtype=np.float32)
        w = rng.standard_normal((c, c, 3, 3), dtype=np.float32)
        ref = reference(x, w)
        big = np.abs(ref).max()
        mask = np.abs(ref) >= 0.01 * big
        row = {"channels": c}
        cells = []
        for name, (algo, tile) in zip(names, ALGORITHMS):
            op = schedules.conv2d(x.shape, w.shape, padding=1, algorithm=algo, tile=tile, target=f"x86-{isa.name}")
            err = np.abs(op(x, w) - ref)
            row[name] = {"max_rel": float(err.max() / big), "mean_rel": float((err[mask] / np.abs(ref[mask])).mean())}
            cells.append(f"{row[name]['max_rel']:15.2e} {row[name]['mean_rel']:15.2e}")
        log(f"  {c:4d} " + " ".join(cells))
        rows.append(row)
    return {"isa": isa.name, "size": size, "rows": rows}
