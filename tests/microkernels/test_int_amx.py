"""Kernel level, no TVM: the AMX tiles' register budget, names, shapes and the IR they generate
(which tile registers each instruction names, the configuration's bytes, where ldtilecfg is)."""

import re

import pytest

from microkernels import AMX_INT8, TileError
from microkernels.int_amx import AmxGemmKernel, amx_tiles


def _fits(a, b, rows):
    """The budget restated: A*B tiles of C, A of A, B of B, out of eight registers of 16 rows."""
    return a * b + a + b <= 8 and 1 <= rows <= 16 and a * rows >= 2


@pytest.mark.parametrize("a", [1, 2, 3])
@pytest.mark.parametrize("b", [1, 2, 3])
def test_budget_is_enforced_exactly(a, b):
    for rows in range(1, 19):
        if _fits(a, b, rows):
            kern = AmxGemmKernel(rows, a, b)
            assert (kern.mr, kern.nr) == (a * rows, 16 * b)
        else:
            with pytest.raises(TileError, match=r"tile registers|at most 16 rows|MR = a_tiles \* rows"):
                AmxGemmKernel(rows, a, b)
    assert all(_fits(b_, c_, r) for r, b_, c_ in amx_tiles())


def test_name_and_operands_say_what_the_kernel_is():
    kern = AmxGemmKernel(14, 2, 2)
    assert kern.name == "mk_u8s8_brgemm_28x32_amxint8"
    assert (kern.a_dtype, kern.b_dtype, kern.c_dtype, kern.group, kern.k_step) == ("uint8", "int8", "int32", 4, 64)
    assert kern.batch_reduce and kern.accumulate and kern.isa is AMX_INT8
    assert AmxGemmKernel(14, 2, 2, accumulate=False).name == "mk_u8s8_brgemm_28x32_amxint8_beta0"
    assert {"+amx-tile", "+amx-int8", "+avx512vnni"} <= set(AMX_INT8.target["mattr"])
    assert {"amx_tile", "amx_int8"} <= set(AMX_INT8.host_flags)


def _function(ir: str, name: str) -> str:
    start = ir.index(f"define internal void @{name}(")
    return ir[start: ir.index("\n}", start)]


@pytest.mark.parametrize("accumulate", [True, False])
@pytest.mark.parametrize("rows, a, b", [(16, 2, 2), (7, 1, 3), (5, 2, 1), (16, 3, 1)])
def test_k_step_names_every_tile_once(rows, a, b, accumulate):
    """Per 64-deep step: one tileloadd per A and B tile, A*B tdpbusd, each C tile fed by every
    pair (i, j) once; C tiles loaded (beta=0: zeroed, never loaded) before the loop and stored
    after it; no configuration in the kernel itself (it is the caller's, once per run of calls)."""
    kern = AmxGemmKernel(rows, a, b, accumulate=accumulate)
    body = _function(kern.llvm_ir(), kern.name)
    loop = body[body.index("sk:"):]
    loop = loop[: loop.index("br label %hk")]
    dots = re.findall(r"tdpbusd\(i8 (\d+), i8 (\d+), i8 (\d+)\)", loop)
    c_tiles, a_tiles, b_tiles = range(a * b), range(a * b, a * b + a), range(a * b + a, a * b + a + b)
    assert sorted((int(c), int(x), int(y)) for c, x, y in dots) == sorted(
        (i * b + j, a_tiles[i], b_tiles[j]) for i in range(a) for j in range(b))
    loads = [int(t) for t in re.findall(r"tileloadd64\(i8 (\d+)", loop)]
    assert sorted(loads) == list(a_tiles) + list(b_tiles)
    outside = body.replace(loop, "")
    c_loads = sorted(int(t) for t in re.findall(r"tileloadd64\(i8 (\d+)", outside))
    c_zeros = sorted(int(t) for t in re.findall(r"tilezero\(i8 (\d+)", outside))
    assert (c_loads, c_zeros) == ((list(c_tiles), []) if accumulate else ([], list(c_tiles)))
    assert sorted(int(t) for t in re.findall(r"tilestored64\(i8 (\d+)", outside)) == list(c_tiles)
    assert "ldtilecfg" not in body and "tilerelease" not in body


@pytest.mark.parametrize("rows, a, b", [(16, 2, 2), (7, 1, 3)])
def test_configuration_bytes(rows, a, b):
    """Palette 1; C and A tiles `rows` rows of 64 bytes, B tiles 16 rows (64 k in groups of 4) of
    64 bytes; every other byte zero (unused registers unconfigured)."""
    kern = AmxGemmKernel(rows, a, b)
    cfg = _function(kern.llvm_ir(), kern.config_symbol)
    assert "call void @llvm.x86.ldtilecfg(ptr %cfg)" in cfg and "memset" in cfg and "store i8 1, ptr %cfg" in cfg
    colsb = {int(t): int(v) for v, t in re.findall(r"store i16 (\d+), ptr %cb(\d+)", cfg)}
    nrows = {int(t): int(v) for v, t in re.findall(r"store i8 (\d+), ptr %rw(\d+)", cfg)}
    offsets = {int(t): int(o) for t, o in re.findall(r"%cb(\d+) = getelementptr inbounds i8, ptr %cfg, i64 (\d+)", cfg)}
    n = a * b + a + b
    assert colsb == {t: 64 for t in range(n)}
    assert nrows == {t: (16 if t >= a * b + a else rows) for t in range(n)}
    assert offsets == {t: 16 + 2 * t for t in range(n)}
    assert "tilerelease" in _function(kern.llvm_ir(), kern.release_symbol)
