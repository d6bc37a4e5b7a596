"""The depthwise row intrinsic: numerics of every ISA through it (native or on the Bochs CPU),
and its assembly: taps held in registers, each input column loaded once per tap row, no stack
traffic, FMAs on the ISA's register width. (Golden dumps: intrinsics.golden.dw_cases, checked
by test_asm.py.)"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from intrinsics.f32_dwconv import DwRow, compile_row
from microkernels import ISAS, Epilogue, asm
from microkernels.f32_dwconv import BLOCK, DwKernel, default_mr

from ..x86_exec import X86, X86_IDS, execute

EPS = np.finfo(np.float32).eps


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


def check_row(t: DwRow, seed: int):
    k, ep = t.kern, t.kern.epilogue
    rng = np.random.default_rng(seed)
    ah, aw = t.window
    a = rng.standard_normal((ah + 2, aw + 3, BLOCK), dtype=np.float32)
    b = rng.standard_normal((2, k.kh, k.kw, BLOCK), dtype=np.float32)
    bias = rng.standard_normal((2, BLOCK), dtype=np.float32)
    c = np.full((3, t.ow + 1, BLOCK), 7.0, np.float32)
    args = [a, b] + ([bias] if ep.bias else []) + [c]
    got, = execute(compile_row(t), k.isa, args, [len(args) - 1])
    win = a[1:1 + ah, 2:2 + aw].astype(np.float64)
    want = np.zeros((t.ow, BLOCK))
    mag = np.zeros((t.ow, BLOCK))
    for r in range(k.kh):
        for s in range(k.kw):
            cols = win[r * t.dh, s * t.dw: s * t.dw + (t.ow - 1) * t.sw + 1: t.sw]
            want += cols * b[1, r, s]
            mag += np.abs(cols * b[1, r, s])
    if ep.bias:
        want += bias[1]
        mag += np.abs(bias[1])
    if ep.act == "relu":
        want = np.maximum(want, 0)
    elif ep.act == "clip":
        want = np.clip(want, *t.clip)
    tol = (k.taps + 2) * EPS * mag + np.finfo(np.float32).tiny
    err = np.abs(got[1, 1:] - want)
    assert (err <= tol).all(), f"{k.name}: worst error {err.max():.3g}"
    outside = np.ones(got.shape, bool)
    outside[1, 1:] = False
    assert (got[outside] == 7.0).all(), "the kernel wrote outside its row"


@pytest.mark.parametrize("isa", X86, ids=X86_IDS)
def test_row_matches_numpy(isa):
    @settings(max_examples=max(8, settings.default.max_examples // 3))
    @given(rows(isa), st.integers(0, 2**32 - 1))
    def check(t, seed):
        check_row(t, seed)

    check()


ASM_CASES = [DwRow(DwKernel(isa, k, k, default_mr(isa, k, k, ep), ep), 19, sw)
             for isa in ISAS.values() for k, sw, ep in ((3, 1, Epilogue()), (3, 2, Epilogue(True, False, "clip")),
                                                         (5, 1, Epilogue()))]


@pytest.mark.parametrize("t", ASM_CASES, ids=lambda t: t.name)
def test_pixel_loop_keeps_taps_in_registers(t):
    k = t.kern
    fn = asm.compute_function(compile_row(t).mod.inspect_source("asm"))
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
