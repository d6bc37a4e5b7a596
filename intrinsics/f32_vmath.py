"""The vector math of microkernels.f32_vmath as TIR expressions: the same operations, in the
same order, for standalone elementwise maps that TVM vectorizes with the rest of a nest
(vectorized, no libm call: tests/intrinsics/test_f32_vmath.py). Next: the Relax pass's
legalization of sigmoid, SiLU, GELU and exp onto them, and the kernels' epilogues.

`expr(name, x)` is the PrimExpr of the function at x (float32); `te_map(name)` a TE function
of one tensor for `relax.BlockBuilder.call_te`.
"""

from __future__ import annotations

import numpy as np
from tvm import te, tirx
from tvm.tirx.op import fma

from microkernels import f32_vmath as vm

F32 = "float32"


class TirOps(vm.Ops):
    """float32 PrimExprs (scalars, which TVM widens when the loop is vectorized)."""

    def c(self, v):
        return tirx.const(float(v), F32)

    def add(self, a, b):
        return a + b

    def sub(self, a, b):
        return a - b

    def mul(self, a, b):
        return a * b

    def div(self, a, b):
        return tirx.Div(a, b)

    def fma(self, a, b, c):
        return fma(a, b, c)

    def neg(self, a):
        return -a

    def abs(self, a):
        return tirx.abs(a)

    def lt(self, a, b):
        return a < b

    def gt(self, a, b):
        return a > b

    def isnan(self, a):
        return tirx.isnan(a)

    def select(self, m, a, b):
        return tirx.Select(m, a, b)

    def round(self, a):
        return tirx.round(a)

    def fence(self, a):
        return tirx.call_llvm_pure_intrin(F32, "llvm.arithmetic.fence", a)

    def pow2(self, n):
        bits = (n.astype("int32") + tirx.const(127, "int32")) << tirx.const(23, "int32")
        return tirx.reinterpret(F32, bits)

    def half_int(self, n):
        return (n.astype("int32") >> tirx.const(1, "int32")).astype(F32)


def expr(name: str, x, alpha: float | None = None):
    """microkernels.f32_vmath's `name` at the float32 PrimExpr x."""
    return vm.evaluate(TirOps(), name, x, alpha)


def te_map(name: str, alpha: float | None = None):
    """A TE function mapping a float32 tensor elementwise by `name`."""
    vm.evaluate(vm.NumpyOps(), name, np.zeros(1, np.float32), alpha)  # refuses a bad name or alpha now

    def compute(x: te.Tensor) -> te.Tensor:
        if x.dtype != F32:
            raise TypeError(f"the vector {name} is float32; got {x.dtype}")
        return te.compute(x.shape, lambda *i: expr(name, x(*i), alpha), name=f"mk_{name}")

    return compute
