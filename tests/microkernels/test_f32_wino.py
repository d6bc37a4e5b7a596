"""Winograd matrices and factored 1-D programs: exact algebra, checked in float64 / rationals."""

from fractions import Fraction

import numpy as np
import pytest

from microkernels import NEON
from microkernels import f32_wino as wino

TILES = sorted(wino.POINTS)


def correlate_1d(d, g, m):
    return np.array([sum(g[t] * d[k + t] for t in range(3)) for k in range(m)])


@pytest.mark.parametrize("m", TILES)
def test_matrices_reproduce_1d_and_2d_correlation(m, rng):
    """A^T[(G g) * (B^T d)] is the 1-D correlation and A^T[(G g G^T) * (B^T d B)]A the 2-D one,
    to float64 rounding (the products below are exact rationals evaluated in float64)."""
    at, g, bt = (wino.as_array(x) for x in wino.matrices(m))
    alpha = m + 2
    assert at.shape == (m, alpha) and g.shape == (alpha, 3) and bt.shape == (alpha, alpha)
    for _ in range(5):
        d, w = rng.standard_normal(alpha), rng.standard_normal(3)
        np.testing.assert_allclose(at @ ((g @ w) * (bt @ d)), correlate_1d(d, w, m), rtol=0, atol=1e-12)
        d2, w2 = rng.standard_normal((alpha, alpha)), rng.standard_normal((3, 3))
        y = at @ ((g @ w2 @ g.T) * (bt @ d2 @ bt.T)) @ at.T
        ref = np.array([[(d2[i:i + 3, j:j + 3] * w2).sum() for j in range(m)] for i in range(m)])
        np.testing.assert_allclose(y, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("m", TILES)
def test_matrices_are_exact_in_rationals(m):
    """With unit vectors the identity holds exactly: sum_i A^T[k, i] G[i, t] B^T[i, k + t'] is
    1 when t = t' and 0 otherwise, in Fractions, so nothing above relies on float luck."""
    at, g, bt = wino.matrices(m)
    alpha = m + 2
    for k in range(m):
        for t in range(3):
            for j in range(alpha):
                got = sum(at[k][i] * g[i][t] * bt[i][j] for i in range(alpha))
                assert got == Fraction(int(j == k + t)), (k, t, j, got)


@pytest.mark.parametrize("m", TILES)
def test_transforms_of_the_kernels_hold_only_float32_exact_constants(m):
    """B^T and A^T are what the kernels multiply by in float32: every entry must be exactly
    representable, or the kernels would compute another transform."""
    assert wino.KINDS == ("in", "out")
    for kind in wino.KINDS:
        for row in wino.transform_matrix(kind, m):
            for v in row:
                assert Fraction(float(np.float32(v))) == v, (kind, v)


@pytest.mark.parametrize("m", TILES)
@pytest.mark.parametrize("kind", wino.KINDS)
def test_factored_program_is_the_matrix_and_cheaper(kind, m, rng):
    prog = wino.program(kind, m)
    mat = wino.as_array(wino.transform_matrix(kind, m))
    x = rng.standard_normal((mat.shape[1], 7))
    np.testing.assert_allclose(np.array(prog.run(list(x))), mat @ x, rtol=1e-13, atol=1e-13)
    assert prog.count < wino.dense_ops(kind, m), (prog.count, wino.dense_ops(kind, m))


def test_op_counts_as_stated():
    """The counts docs/design/kernels.md states per 1-D transform (factored vs dense): a change to the
    factoring shows up here first."""
    got = {(k, m): (wino.program(k, m).count, wino.dense_ops(k, m)) for k in wino.KINDS for m in TILES}
    assert got == {
        ("in", 2): (4, 16), ("out", 2): (4, 8),
        ("in", 4): (15, 36), ("out", 4): (10, 24),
        ("in", 6): (28, 64), ("out", 6): (20, 48),
    }, got


def test_bad_tile_and_kind_refused():
    with pytest.raises(ValueError, match="one of \\[2, 4, 6\\]"):
        wino.matrices(3)
    with pytest.raises(ValueError, match="kind must be one of"):
        wino.kernel("avx2", "inp", 4)
    # The weights' transform has a matrix (schedules.winograd applies it in float64) but no kernel.
    with pytest.raises(ValueError, match=r"kernel's kind must be one of \('in', 'out'\), got 'wt'"):
        wino.kernel("avx2", "wt", 4)
    with pytest.raises(ValueError, match=r"transform kind must be one of \('in', 'out', 'wt'\), got 'w'"):
        wino.transform_matrix("w", 4)
    with pytest.raises(ValueError, match="x86 kernels"):
        wino.WinoKernel(NEON, "in", 4)
