"""schedules.conv.plans: the typed plans and the band arithmetic the planners share."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedules.conv.plans import (
    DepthwisePlan,
    DirectPlan,
    WinogradPlan,
    largest_divisor,
)


@given(st.integers(1, 400), st.integers(1, 400))
def test_largest_divisor_is_the_largest_that_fits(n, limit):
    d = largest_divisor(n, lambda d: d <= limit)
    fitting = [k for k in range(1, n + 1) if n % k == 0 and k <= limit]
    assert d == max(fitting)  # 1 always fits here


def test_largest_divisor_is_none_when_nothing_fits():
    assert largest_divisor(12, lambda d: False) is None
    assert largest_divisor(12, lambda d: d % 5 == 0) is None
    assert largest_divisor(12, lambda d: d % 4 == 0) == 12


def _direct(**kw):
    return DirectPlan("direct", "algorithm='direct'", mr=8, output_blocks=1, band_rows=7, band_parallel=True,
                      segments=[(0, 3, 8)], **kw)


def test_a_plan_reads_as_the_mapping_it_was():
    p = _direct()
    assert p.algorithm == p["algorithm"] == "direct" and p["segments"] == [(0, 3, 8)]
    assert p.get("tile") is None and p.get("tile", 4) == 4
    assert "block_diagonal" not in p and "band_rows" in p  # an optional field that does not apply
    with pytest.raises(KeyError):
        p["tile"]
    with pytest.raises(KeyError):
        p["block_diagonal"]
    grouped = _direct(block_diagonal="8 groups of 4 channels as 2 of 16")
    assert grouped["block_diagonal"].startswith("8 groups")


def test_as_dict_is_every_field_that_applies():
    p = WinogradPlan("winograd", "r", tile=4, band_tile_rows=2, band_parallel=False, block_parallel=True,
                     tiles_per_band=8, bands=2, mr=8, weight_bytes=1024)
    assert p.as_dict() == {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}
    d = DepthwisePlan("depthwise", "r", band_rows=3, multiplier=1, kernel=None)
    assert "kernel" not in d.as_dict()


def test_plans_are_values():
    p = _direct()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.band_rows = 1
    assert dataclasses.replace(p, band_rows=1).band_rows == 1 and p.band_rows == 7


@given(st.integers(1, 5000))
def test_divisors_are_every_divisor_in_order(n):
    from schedules.conv.plans import divisors

    assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


def test_divisors_of_a_tall_map_take_no_time():
    """A map of 2**30 rows (valid as NCHW) must not be walked row by row to plan its bands."""
    import time

    from schedules.conv.plans import divisors

    start = time.perf_counter()
    assert divisors(2**30)[-3:] == [2**28, 2**29, 2**30]
    assert time.perf_counter() - start < 0.5
