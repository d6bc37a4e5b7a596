"""The depthwise kernel generator: names, the register budget, refusals."""

import pytest

from microkernels import AVX2, AVX512, NEON, Epilogue, TileError
from microkernels.f32_dwconv import DwKernel, default_mr


@pytest.mark.parametrize("isa, k, mr, in_regs", [
    (AVX512, 3, 8, True), (AVX512, 5, 4, True), (AVX512, 7, 4, False),
    (AVX2, 3, 4, True), (AVX2, 5, 4, False),
])
def test_default_step_and_whether_taps_stay_in_registers(isa, k, mr, in_regs):
    kern = DwKernel(isa, k, k, default_mr(isa, k, k))
    assert kern.mr == mr and kern.taps_in_registers == in_regs
    # The budget: taps + MR accumulators + 3 spare, within the register file.
    assert in_regs == (k * k + mr + 3 <= isa.vector_registers)


def test_names_say_everything():
    kern = DwKernel(AVX2, 3, 5, 4, Epilogue(bias=True, act="clip"))
    assert kern.name == "mk_f32_dwconv_3x5_4x16_avx2_bias_clip"
    assert kern.halves == 2 and DwKernel(AVX512, 3, 3, 8).halves == 1
    assert DwKernel(AVX512, 3, 3, 8, group=4).name == "mk_f32_gconv4_3x3_8x16_avx512"


@pytest.mark.parametrize("isa", [AVX512, AVX2])
@pytest.mark.parametrize("group", [2, 4, 8])
def test_grouped_steps(isa, group):
    """The grouped kernel's step comes from GROUP_MR, never holds its taps in registers, and
    its MR accumulators and MR inputs fit the register file with room for a weight."""
    from microkernels.f32_dwconv import GROUP_MR

    mr = default_mr(isa, 3, 3, Epilogue(True, False, "clip"), group)
    kern = DwKernel(isa, 3, 3, mr, group=group)
    assert mr == GROUP_MR[isa.name][group] and not kern.taps_in_registers
    assert kern.weight_vectors == 9 * group and 2 * mr + 1 <= isa.vector_registers


@pytest.mark.parametrize("args, msg", [
    ((NEON, 3, 3, 4), "x86 kernels"),
    ((AVX512, 3, 3, 32), "do not fit"),
    ((AVX512, 0, 3, 4), "KH must be a positive int"),
])
def test_refusals(args, msg):
    with pytest.raises(TileError, match=msg):
        DwKernel(*args)
    with pytest.raises(TileError, match="not a residual"):
        DwKernel(AVX512, 3, 3, 4, Epilogue(residual=True))
    with pytest.raises(TileError, match="must divide avx2's 8 lanes"):
        DwKernel(AVX2, 3, 3, 4, group=16)
    with pytest.raises(TileError, match="must divide"):
        DwKernel(AVX512, 3, 3, 4, group=3)
    with pytest.raises(TileError, match="do not fit"):
        DwKernel(AVX512, 3, 3, 16, group=4)  # 16 accumulators + 16 inputs


def test_row_step_avoids_long_single_pixel_tails():
    from microkernels.f32_dwconv import row_mr

    # 14 = 2 x 7 rather than 8 + six dependent single-pixel chains; 56 = 7 x 8.
    assert row_mr(AVX512, 3, 3, 14) == 7 and row_mr(AVX512, 3, 3, 56) == 8
    for isa in (AVX512, AVX2):
        for ow in range(2, 120):
            assert 2 <= row_mr(isa, 3, 3, ow) <= default_mr(isa, 3, 3)
