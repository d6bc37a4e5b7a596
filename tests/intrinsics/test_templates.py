"""intrinsics.templates: the TVMScript every conv-family intrinsic and the conv schedules write
alike (the element body, the epilogue, the frame)."""

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm.script import parser
from tvm.script import tirx as T

from intrinsics.templates import element_body, epilogue_expr, f32


def test_float_literals_name_infinities():
    assert f32(6.0) == "T.float32(6.0)" and f32(-0.5) == "T.float32(-0.5)"
    assert f32(float("inf")) == 'T.float32("inf")' and f32(-np.inf) == 'T.float32("-inf")'


def test_the_epilogue_adds_bias_then_residual_then_applies_the_activation():
    assert epilogue_expr("v", "b", "r") == "v + b + r"
    assert epilogue_expr("v", act="relu") == "T.max(T.float32(0), v)"  # the bound first: NaN passes
    assert epilogue_expr("v", act="clip", clip=(-np.inf, 2.0)) == 'T.min(T.float32(2.0), T.max(T.float32("-inf"), v))'


@pytest.mark.parametrize("act, clip", [("relu", (0.0, 6.0)), ("clip", (-1.0, 2.0)), ("clip", (-np.inf, np.inf))])
def test_an_epilogue_compiles_to_what_numpy_computes(act, clip):
    """Through TVM's lowering (vectorized, as the schedules run it): NaN stays NaN, the bounds
    clamp, an infinite bound clamps nothing."""
    body = element_body("C[vi]", "A[vi]", "T.float32(1)", [], "            ", act=act, clip=clip)
    text = "\n".join(["@T.prim_func(s_tir=True)",
                      "def main(A: T.Buffer((16,), 'float32'), C: T.Buffer((16,), 'float32')):",
                      "    for i in range(16):",
                      "        with T.sblock('e'):",
                      "            vi = T.axis.remap('S', [i])", *body]) + "\n"
    sch = tvm.s_tir.Schedule(parser.parse(text, extra_vars={"T": T}))
    sch.vectorize(sch.get_loops(sch.get_sblock("e"))[0])
    lib = tvm.compile(sch.mod, target={"kind": "llvm", "mcpu": "haswell"})
    a = np.array([np.nan, -3, -0.5, 0, 0.5, 3, 7, -np.inf, np.inf] + [1] * 7, np.float32)
    c = tvm.runtime.tensor(np.zeros(16, np.float32))
    lib["main"](tvm.runtime.tensor(a), c)
    want = np.maximum(a, 0) if act == "relu" else np.clip(a, *clip)
    np.testing.assert_array_equal(c.numpy(), want)


# Conv tiles of every kind the schedules make: both x86 ISAs, one or several column groups,
# beta=0 or accumulating, each epilogue, 1x1 and 3x3, full and stem-like blocks, strides,
# dilations, and several input-channel blocks (a single block has no q loop: parsed directly).
@st.composite
def _conv_tiles(draw):
    from intrinsics import ConvTile
    from microkernels import AVX2, AVX512, Epilogue, GemmKernel

    isa = draw(st.sampled_from([AVX2, AVX512]))
    nr, groups = draw(st.sampled_from([(isa.lanes, 0), (2 * isa.lanes, 0), (2 * isa.lanes, isa.lanes)]))
    ep = draw(st.sampled_from([Epilogue(), Epilogue(bias=True, act="relu"), Epilogue(bias=True, residual=True),
                               Epilogue(bias=True, residual=True, act="clip")]))
    kern = GemmKernel(isa, draw(st.integers(2, 6)), nr, accumulate=draw(st.booleans()), batch_reduce=True,
                      epilogue=ep, col_block=groups)
    k = draw(st.sampled_from([(1, 1), (3, 3), (1, 7), (7, 1)]))
    return ConvTile(kern, draw(st.integers(2, 80)), *k, draw(st.sampled_from([16, 8, 3])), draw(st.integers(1, 2)),
                    *draw(st.sampled_from([(1, 1), (2, 2), (1, 3)])), draw(st.sampled_from([(0.0, 6.0), (-1.0, 1.5)])))


@settings(max_examples=40, deadline=None)
@given(_conv_tiles())
def test_a_specialized_conv_tile_is_what_parsing_its_own_text_gives(tile):
    """register_conv parses a tile's text once for every count of input-channel blocks and
    specializes it: each must be, structurally, the parse of the tile's own text."""
    import dataclasses

    import tvm_ffi

    from intrinsics.f32_conv import description, implementation
    from intrinsics.script import parse
    from intrinsics.templates import SYMBOL, specialized

    ir = tile.kern.llvm_ir()
    model = dataclasses.replace(tile, nb=SYMBOL)
    assert tvm_ffi.structural_equal(specialized(description(model), tile.nb), parse(description(tile)))
    assert tvm_ffi.structural_equal(specialized(implementation(model), tile.nb, kernel_ir=ir),
                                    parse(implementation(tile), kernel_ir=ir))


def test_a_text_without_the_symbol_is_refused():
    from intrinsics.templates import specialized

    with pytest.raises(ValueError, match="SYMBOL"):
        specialized("@T.prim_func(s_tir=True)\ndef f(a: T.handle):\n    T.evaluate(0)\n", 3)
