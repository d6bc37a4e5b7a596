"""intrinsics.beta0: the zero fills that tensorize leaves in front of a beta=0 tile, removed."""

import pytest
import tvm
from tvm import te

from intrinsics.beta0 import drop_dead_inits


def test_drop_dead_inits_names_unknown_blocks():
    A = te.placeholder((4,), name="A")
    k = te.reduce_axis((0, 4), name="k")
    mod = tvm.IRModule({"main": te.create_prim_func([A, te.compute((1,), lambda i: te.sum(A[k], axis=k), name="S")])})
    with pytest.raises(ValueError, match=r"no blocks named \['nope'\]"):
        drop_dead_inits(mod, ["nope"])
    assert "T.init" not in drop_dead_inits(mod, ["S"]).script() and "T.init" in mod.script()
