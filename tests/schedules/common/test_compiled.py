"""schedules.common.compiled: how operands reach a compiled module (without a copy where TVM
allows it) and the alignment its declarations promise."""

import numpy as np
import pytest
import tvm
from tvm import te

from schedules.common.compiled import (
    check_operand,
    declare_user_aligned,
    operand,
    user_operand,
)
from schedules.common.layouts import aligned_empty

from ...conftest import unaligned


def _same_memory(t: tvm.runtime.Tensor, a: np.ndarray) -> bool:
    """Whether writing through the TVM tensor changes the numpy array."""
    before = a.copy()
    t.copyfrom(np.full(a.shape, 7, a.dtype))
    changed = np.all(a == 7)
    a[...] = before
    return bool(changed)


def test_operand_shares_aligned_memory_and_copies_the_rest():
    a = aligned_empty((4, 16))
    a[...] = 1
    assert _same_memory(operand(a), a)
    u = unaligned(np.ones((4, 16), np.float32))
    assert not _same_memory(operand(u), u)  # TVM's import refuses it: one aligned copy
    t = tvm.runtime.tensor(a)
    assert operand(t) is t and user_operand(t) is t


def test_user_operand_shares_memory_at_any_alignment():
    u = unaligned(np.ones((3, 5), np.float32))
    assert _same_memory(user_operand(u), u)


def test_check_operand_takes_tvm_tensors_and_numpy_arrays():
    t = tvm.runtime.tensor(np.zeros((2, 3), np.float32))
    assert check_operand("x", t, (2, 3), "float32") is t
    with pytest.raises(ValueError, match=r"x must have shape \(3, 2\) and dtype float32, got a TVM tensor of \(2, 3\)"):
        check_operand("x", t, (3, 2), "float32")
    with pytest.raises(TypeError, match="x must have dtype int8"):
        check_operand("x", np.zeros((2, 3), np.float32), (2, 3), "int8")


def test_declare_user_aligned_relaxes_only_the_named_parameters():
    a = te.placeholder((8,), name="a")
    b = te.compute((8,), lambda i: a[i] * 2, name="b")
    func = te.create_prim_func([a, b])
    sig = next(line for line in declare_user_aligned(func, ["a"]).script().splitlines() if line.startswith("def main"))
    assert 'a: T.Buffer((8,), "float32", align=4)' in sig and 'b: T.Buffer((8,), "float32")' in sig, sig
    with pytest.raises(RuntimeError, match="parameter c not found"):
        declare_user_aligned(func, ["c"])
