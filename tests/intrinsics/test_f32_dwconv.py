"""The depthwise row intrinsic: numerics of every ISA through it (native or on the Bochs CPU),
depthwise and grouped (2, 4, 8 channels per group), and its assembly: taps held in registers,
each input column loaded once per tap row, no stack traffic, FMAs on the ISA's register width;
for groups, one tap loop of MR x G FMAs that loads its G weight vectors. (Golden dumps:
intrinsics.golden.dw_cases, checked by test_asm.py.)"""

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
    group = draw(st.sampled_from([1, 1, 2, 4, 8]))
    kh, kw = draw(st.integers(1, 7 if group == 1 else 5)), draw(st.integers(1, 7 if group == 1 else 5))
    if kh * kw == 1 and group == 1:
        kw = 2
    act = draw(st.sampled_from([None, "relu", "clip"]))
    ep = Epilogue(bias=draw(st.booleans()), act=act)
    kern = DwKernel(isa, kh, kw, draw(st.sampled_from([default_mr(isa, kh, kw, ep, group), 1, 3])), ep, group)
    return DwRow(kern, draw(st.integers(2, 40)), draw(st.integers(1, 3)), draw(st.integers(1, 2)),
                 draw(st.integers(1, 2)), (-0.5, 1.0))


@pytest.mark.parametrize("isa", X86, ids=X86_IDS)
def test_row_matches_numpy(isa):
    @settings(max_examples=max(8, settings.default.max_examples // 3))
    @given(rows(isa), st.integers(0, 2**32 - 1))
    def check(t, seed):
        DwTester(t).test(seed)

    check()


@pytest.mark.parametrize("t", [t for t in golden.dw_cases() if t.kern.group == 1], ids=lambda t: t.name)
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


@pytest.mark.parametrize("t", [t for t in golden.dw_cases() if t.kern.group > 1], ids=lambda t: t.name)
def test_grouped_tap_loop(t):
    """Per half, one loop of MR x G FMAs (a tap), on the ISA's register width. Each FMA's input
    is permuted for it (a shuffle, or on AVX2 with G = 8 a broadcast from memory), and the G
    weight vectors are loaded inside the loop, not hoisted out of the pixel loop and spilled.
    No stack traffic, except G = 8 on AVX-512, where the 8-pixel step (f32_dwconv.GROUP_MR)
    spills by design: at most one access per two FMAs."""
    k = t.kern
    fn = golden.compiled_function(t)
    reg = "zmm" if k.isa.name == "avx512" else "ymm"
    assert set(asm.vector_arithmetic(fn)) <= {reg}, asm.vector_arithmetic(fn).keys()
    step = [lp for lp in asm.fma_loops(fn) if lp.count("vfmadd") == k.mr * k.group]
    assert len(step) == k.halves, [lp.count("vfmadd") for lp in asm.fma_loops(fn)]
    fmas = k.mr * k.group
    for lp in step:
        stack = lp.stack_accesses()
        memory = [i for i in lp.body if "(" in i and i not in stack]
        permutes = [i for i in lp.body if i.split()[0].startswith(("vperm", "vshuf", "vmovs", "vbroadcast", "vunpck"))]
        assert len(permutes) >= fmas, permutes
        assert k.mr + k.group <= len(memory) <= fmas + k.group + 2, memory
        if k.isa.name == "avx512" and k.group == 8:
            assert len(stack) <= fmas // 2, stack
        else:
            assert not stack, stack
