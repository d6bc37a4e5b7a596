"""Each Winograd transform kernel through its intrinsic, against its numpy matrix form.

Runs every ISA: natively where the host executes it, on the Bochs CPU where it does not
(tests/x86_exec.py).
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from intrinsics import golden

from ..testers.f32_wino import WinoTester
from ..x86_exec import how

CASES = golden.wino_cases()  # every kind, tile and ISA


@pytest.mark.parametrize("kern", CASES, ids=lambda k: f"{k.name}-{how(k.isa).split('-')[1]}")
@given(extra_rows=st.integers(0, 3), extra_cols=st.integers(0, 3), depth=st.integers(1, 3), seed=st.integers(0, 2**16))
@settings(max_examples=6)
def test_transform_matches_matrix_form(kern, extra_rows, extra_cols, depth, seed):
    """dst = M src M^T at the tile's place, within the rounding bound WinoTester states, nothing
    written around it, src kept (but by the output transform)."""
    WinoTester(kern, extra_rows, extra_cols, depth).test(seed)
