"""The LayerNorm row kernel's parameters and IR (no TVM): names, refusals, the masked tail."""

import pytest

from microkernels import AVX2, AVX512, TileError
from microkernels.f32_layernorm import LayerNormKernel


def test_name_says_channels_isa_and_eps():
    assert LayerNormKernel(AVX2, 96, 1e-6).name == "mk_f32_layernorm_c96_avx2_e358637bd"
    assert LayerNormKernel(AVX512, 768).name == "mk_f32_layernorm_c768_avx512_e3727c5ac"  # eps 1e-5


@pytest.mark.parametrize("kwargs, msg", [
    ({"c": 0}, "c must be a positive int"), ({"c": 2.5}, "c must be a positive int"),
    ({"c": True}, "c must be a positive int"), ({"c": 8, "eps": -1.0}, "eps must be a finite float >= 0"),
    ({"c": 8, "eps": float("nan")}, "eps must be a finite float >= 0"),
    ({"c": 8, "eps": 1e39}, "eps must be a finite float >= 0"),  # inf in float32
])
def test_refuses(kwargs, msg):
    with pytest.raises(TileError, match=msg):
        LayerNormKernel(AVX2, **kwargs)


@pytest.mark.parametrize("c, loops, masked", [(96, 3, False), (100, 3, True), (5, 0, True), (8, 3, False)])
def test_passes_and_tail(c, loops, masked):
    """Three passes over whole vectors (none when C is under one vector), a masked vector for
    C's tail only where C is not a multiple of the lanes, and a correctly rounded 1/sqrt."""
    ir = LayerNormKernel(AVX2, c).llvm_ir()
    assert sum(line.endswith("_done:") for line in ir.splitlines()) == loops
    assert ("@llvm.masked.load" in ir.split("declare")[0]) == masked
    assert "@llvm.sqrt.f32" in ir and "rsqrt" not in ir
