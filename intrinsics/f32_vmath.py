"""The vector math of microkernels.f32_vmath as TIR expressions: the same operations, in the
same order, for standalone elementwise maps that TVM vectorizes with the rest of a nest
(vectorized, no libm call: tests/intrinsics/test_f32_vmath.py). The Relax pass legalizes
sigmoid, SiLU, GELU and exp onto them (schedules/relax/rest.py); next, the kernels' epilogues.

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
    """float32 PrimExprs, each operation's result bound to a variable of its own (`Let`):

    - the algorithms reuse their intermediates (x, n, r, e: up to a dozen times each), which
      as plain expressions TVM would copy into every use, a tree that grows with each step
      (GELU's ran to 10^5 nodes) for its simplifier and codegen to walk;
    - a Select whose branch reads a buffer is rewritten by TVM's RewriteUnsafeSelect into an
      if_then_else, which its vectorizer scalarizes: bound, a branch names a variable;
    - NaN is tested as x != x, not with TVM's isnan call, which beside the fence's call also
      made the vectorizer give up (both measured: the nest came out scalar, 10 ns a value).
    Comparisons stay inline (a bool each, cheap to repeat)."""

    def __init__(self):
        self.bindings: list[tuple[tirx.Var, tirx.PrimExpr]] = []

    def let(self, e):
        if isinstance(e, (tirx.Var, tirx.FloatImm, tirx.IntImm)):
            return e
        v = tirx.Var(f"vm{len(self.bindings)}", e.ty)
        self.bindings.append((v, e))
        return v

    def wrap(self, body):
        """body inside the bindings made so far, the first outermost."""
        for v, e in reversed(self.bindings):
            body = tirx.Let(v, e, body)
        return body

    def c(self, v):
        return tirx.const(float(v), F32)

    def add(self, a, b):
        return self.let(a + b)

    def sub(self, a, b):
        return self.let(a - b)

    def mul(self, a, b):
        return self.let(a * b)

    def div(self, a, b):
        return self.let(tirx.Div(a, b))

    def fma(self, a, b, c):
        return self.let(fma(a, b, c))

    def neg(self, a):
        return self.let(-a)

    def abs(self, a):
        return self.let(tirx.abs(a))

    def lt(self, a, b):
        return a < b

    def gt(self, a, b):
        return a > b

    def isnan(self, a):
        return tirx.NE(a, a)

    def select(self, m, a, b):
        return self.let(tirx.Select(m, a, b))

    def round(self, a):
        return self.let(tirx.round(a))

    def fence(self, a):
        return self.let(tirx.call_llvm_pure_intrin(F32, "llvm.arithmetic.fence", a))

    def pow2(self, n):
        bits = (n.astype("int32") + tirx.const(127, "int32")) << tirx.const(23, "int32")
        return self.let(tirx.reinterpret(F32, bits))

    def half_int(self, n):
        return self.let((n.astype("int32") >> tirx.const(1, "int32")).astype(F32))


def expr(name: str, x, alpha: float | None = None):
    """microkernels.f32_vmath's `name` at the float32 PrimExpr x: one expression, the bindings
    of its steps as nested `Let`s, x bound first."""
    o = TirOps()
    return o.wrap(vm.evaluate(o, name, o.let(x), alpha))


def te_map(name: str, alpha: float | None = None):
    """A TE function mapping a float32 tensor elementwise by `name`."""
    vm.evaluate(vm.NumpyOps(), name, np.zeros(1, np.float32), alpha)  # refuses a bad name or alpha now

    def compute(x: te.Tensor) -> te.Tensor:
        if x.dtype != F32:
            raise TypeError(f"the vector {name} is float32; got {x.dtype}")
        return te.compute(x.shape, lambda *i: expr(name, x(*i), alpha), name=f"mk_{name}")

    return compute
