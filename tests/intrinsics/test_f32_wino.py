"""Each Winograd transform kernel through its intrinsic, against its numpy matrix form.

Runs every ISA: natively where the host executes it, on the Bochs CPU where it does not
(tests/x86_exec.py).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from intrinsics import f32_wino as iwino
from microkernels import ISAS
from microkernels import f32_wino as wino

from ..x86_exec import execute, how

RUNNABLE = list(ISAS)
CASES = [wino.kernel(isa, kind, m) for isa in RUNNABLE for kind in wino.KINDS for m in sorted(wino.POINTS)]
EPS = np.finfo(np.float32).eps


def buffers(kern, extra_rows, extra_cols, depth):
    """Shapes and offsets of a src and dst placed inside larger buffers."""
    (q, _), (p, _) = kern.shapes
    su, du = iwino.UNIT_AXIS[kern.kind]
    src = ((q + extra_rows, q + extra_cols, depth, 16), (extra_rows, extra_cols, depth - 1)) if su \
        else ((q + extra_rows, q + extra_cols, 16), (extra_rows, extra_cols))
    dst = ((p + extra_cols, p + extra_rows, depth, 16), (extra_cols, extra_rows, depth - 1)) if du \
        else ((p + extra_cols, p + extra_rows, 16), (extra_cols, extra_rows))
    return src, dst


def tile_of(a, at, n, unit):
    return a[at[0]:at[0] + n, at[1]:at[1] + n, at[2]] if unit else a[at[0]:at[0] + n, at[1]:at[1] + n]


@pytest.mark.parametrize("kern", CASES, ids=lambda k: f"{k.name}-{how(k.isa).split('-')[1]}")
@given(extra_rows=st.integers(0, 3), extra_cols=st.integers(0, 3), depth=st.integers(1, 3), seed=st.integers(0, 2**16))
@settings(max_examples=6)
def test_transform_matches_matrix_form(kern, extra_rows, extra_cols, depth, seed):
    """dst = M src M^T at the tile's place, nothing written around it. Bound: each output is
    two chained sums of q products by exact constants (B^T, A^T) or float32-rounded ones (G),
    2q + 2 roundings at most, each within u of the running |M| |src| |M^T| magnitude."""
    rng = np.random.default_rng(seed)
    (src_shape, src_at), (dst_shape, dst_at) = buffers(kern, extra_rows, extra_cols, depth)
    (q, _), (p, _) = kern.shapes
    su, du = iwino.UNIT_AXIS[kern.kind]
    src = rng.standard_normal(src_shape, dtype=np.float32)
    dst = np.full(dst_shape, 7.0, np.float32)
    src_after, got = execute(iwino.compile_tile(kern, src_shape, src_at, dst_shape, dst_at), kern.isa, [src, dst], [0, 1])
    mat = wino.as_array(kern.program_matrix)
    x = tile_of(src, src_at, q, su).astype(np.float64)
    ref = np.einsum("ik,klc,jl->ijc", mat, x, mat)
    mag = np.einsum("ik,klc,jl->ijc", np.abs(mat), np.abs(x), np.abs(mat))
    tol = (2 * q + 2) * EPS * mag + np.finfo(np.float32).tiny
    err = np.abs(tile_of(got, dst_at, p, du) - ref)
    assert (err <= tol).all(), f"worst error {err.max():.3g} vs bound {tol.flat[np.argmax(err)]:.3g}"
    outside = np.ones(dst_shape, bool)
    if du:
        outside[dst_at[0]:dst_at[0] + p, dst_at[1]:dst_at[1] + p, dst_at[2]] = False
    else:
        outside[dst_at[0]:dst_at[0] + p, dst_at[1]:dst_at[1] + p] = False
    assert (got[outside] == 7.0).all(), "the kernel wrote outside its tile"
    if kern.kind != "out":  # the output transform keeps pass 1 in src (documented)
        np.testing.assert_array_equal(src_after, src)
