"""The depthwise row intrinsic: numerics of every ISA through it (native or on the Bochs CPU),
and its assembly: taps held in registers, each input column loaded once per tap row, no stack
traffic, FMAs on the ISA's register width. (Golden dumps: intrinsics.golden.dw_cases, checked
by test_asm.py.)"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from intrinsics import golden
from intrinsics.f32_dwconv import DwRow
from microkernels import Epilogue, asm
from microkernels.f32_dwconv import DwKernel, default_mr

from ..testers.f32_dwconv import DwTester
from ..x86_exec import X86, X86_IDS


@st.composite
def rows(draw, isa):
    kh, kw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    if kh * kw == 1:
        kw = 2
    act = draw(st.sampled_from([None, "relu", "clip"]))
    ep = Epilogue(bias=draw(st.booleans()), act=act)
    kern = DwKernel(isa, kh, kw, draw(st.sampled_from([default_mr(isa, kh, kw, ep), 1, 3])), ep)
    return DwRow(kern, draw(st.integers(2, 40)), draw(st.integers(1, 3)), draw(st.integers(1, 2)),
                 draw(st.integers(1, 2)), (-0.5, 1.0))


@pytest.mark.parametrize("isa", X86, ids=X86_IDS)
def test_row_matches_numpy(isa):
    @settings(max_examples=max(8, settings.default.max_examples // 3))
    @given(rows(isa), st.integers(0, 2**32 - 1))
    def check(t, seed):
        DwTester(t).test(seed)

    check()


@pytest.mark.parametrize("t", golden.dw_cases(), ids=lambda t: t.name)
def test_pixel_loop_keeps_taps_in_registers(t):
    k = t.kern
    fn = golden.compiled_function(t)
    if k.taps_in_registers:  # otherwise LLVM keeps some taps in spill slots: one L1 load each
        assert not asm.stack_accesses(fn), asm.stack_accesses(fn)
    reg = "zmm" if k.isa.name == "avx512" else "ymm"
    assert set(asm.vector_arithmetic(fn)) <= {reg}, asm.vector_arithmetic(fn).keys()
    step = [lp for lp in asm.fma_loops(fn) if lp.count("vfmadd") == k.mr * k.taps]
    assert len(step) == k.halves, [lp.count("vfmadd") for lp in asm.fma_loops(fn)]
    if not k.taps_in_registers:
        return
    # Memory operands in the MR-pixel step: each distinct input column once per tap row, the
    # MR stores, and nothing else: a weight reloaded inside the loop would add to the count.
    columns = len({m * t.sw + s * t.dw for m in range(k.mr) for s in range(k.kw)})
    for lp in step:
        assert sum("(" in ins for ins in lp.body) == k.kh * columns + k.mr, lp.body
