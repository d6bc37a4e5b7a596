"""intrinsics.templates: the TVMScript every conv-family intrinsic and the conv schedules write
alike (the element body, the epilogue, the frame)."""

import numpy as np
import pytest
import tvm
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
