"""schedules.common.tir: the TVMScript toolkit every template is written with."""

import numpy as np
import pytest
import tvm
from hypothesis import given
from hypothesis import strategies as st

from schedules.common.tir import (
    buffer,
    ceil_div,
    ceil_to,
    header,
    padded_pack,
    parse,
    region,
)


@given(st.integers(0, 10**6), st.integers(1, 1000))
def test_ceil_div_and_ceil_to(a, b):
    assert ceil_div(a, b) == -(-a // b) == (a + b - 1) // b
    assert ceil_to(a, b) % b == 0 and a <= ceil_to(a, b) < a + b


def test_region_and_buffer_spell_whole_buffers():
    assert region((3, 1, 16)) == "0:3, 0:1, 0:16"
    assert buffer("D", [2, 3]) == "D: T.Buffer((2, 3), 'float32')"
    assert buffer("P", (4,), "int16") == "P: T.Buffer((4,), 'int16')"


def _pack_func(h, w, top, left, ph, pw):
    """A template made of the toolkit's pieces alone: pad an (h, w) image into (ph, pw)."""
    inside = f"{top} <= vr and vr < {top + h} and {left} <= vx and vx < {left + w}"
    lines = header([buffer("D", (h, w)), buffer("P", (ph, pw))])
    lines += padded_pack(4, "P", [("r", ph), ("x", pw)], inside, f"D[vr - {top}, vx - {left}]")
    return parse(lines)


@pytest.mark.parametrize("h, w, top, left, ph, pw", [(3, 4, 1, 2, 6, 7), (2, 2, 0, 0, 2, 2), (1, 5, 2, 0, 4, 5)])
def test_padded_pack_copies_inside_and_fills_outside(h, w, top, left, ph, pw):
    func = _pack_func(h, w, top, left, ph, pw)
    assert func.attrs["tirx.noalias"]  # the header's promise: operands never overlap
    lib = tvm.compile(tvm.IRModule({"main": func}), target={"kind": "llvm"})
    d = np.arange(1, h * w + 1, dtype=np.float32).reshape(h, w)
    p = tvm.runtime.tensor(np.full((ph, pw), np.nan, np.float32))
    lib["main"](tvm.runtime.tensor(d), p)
    want = np.zeros((ph, pw), np.float32)
    want[top:top + h, left:left + w] = d[:ph - top, :pw - left]
    np.testing.assert_array_equal(p.numpy(), want)


def test_padded_pack_keeps_every_loop_it_writes():
    """Unit-extent loops stay in the text (what the templates rely on to match intrinsic
    descriptions): a 1-row pack still has its row loop."""
    script = _pack_func(1, 4, 0, 0, 1, 4).script()
    assert "for r in range(1)" in script or "T.grid(1, 4)" in script, script
