"""Constant layout transforms folded in numpy (schedules/relax/fold.py) give TVM's own result
bit for bit: blocked data and weights, padding, transposes; and what it cannot evaluate is left
for FoldConstant."""

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.ir import GenericConst

from schedules.relax import exprs
from schedules.relax.fold import fold_layout_transforms

MAPS = {
    "NCHWxc": (4, lambda b: (lambda n, c, h, w: (n, c // b, h, w, c % b))),
    "OIHWxiyo": (4, lambda b: (lambda o, i, h, w: (o // b, i // b, h, w, i % b, o % b))),
    "transpose": (3, lambda b: (lambda a, c, d: (d, a, c))),
}


def module(value, index_map, pad):
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        y = bb.emit(relax.op.layout_transform(relax.const(value), index_map=index_map, pad_value=pad))
        bb.emit_func_output(y)
    return bb.get()


def run(mod):
    ex = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    return relax.VirtualMachine(ex, tvm.cpu())["main"]().numpy()


@settings(max_examples=12)
@given(st.sampled_from(sorted(MAPS)), st.sampled_from([2, 4, 16]), st.integers(1, 40), st.integers(1, 5),
       st.sampled_from([None, 0.0, -1.5]), st.integers(0, 2**32 - 1))
def test_folded_transform_equals_tvms(kind, block, channels, size, pad, seed):
    rank, make = MAPS[kind]
    shape = {4: (channels, channels + 3, size, size), 3: (channels, size, 3)}[rank]
    if pad is None and kind in ("NCHWxc", "OIHWxiyo") and any(d % block for d in shape[:2]):
        pad = 0.0  # TVM needs a pad value where the blocks do not divide
    value = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    mod = module(value, make(block), pad)
    folded = fold_layout_transforms(mod)
    body = folded["main"].body
    assert isinstance(body.body if not body.blocks else body.blocks[0].bindings[0].value, GenericConst)
    np.testing.assert_array_equal(run(folded), run(mod))


def test_what_it_cannot_evaluate_is_left_alone():
    value = np.ones((4, 4), np.float32)
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        y = bb.emit(relax.op.layout_transform(x, index_map=lambda a, b: (b, a)))  # not a constant
        z = bb.emit(relax.op.layout_transform(relax.const(value), index_map=lambda a, b: (b, a)))
        bb.emit_func_output(relax.op.add(y, z))
    folded = fold_layout_transforms(bb.get())
    values = [b.value for b in folded["main"].body.blocks[0].bindings]
    assert exprs.is_call(values[0], tvm.ir.Op.get("relax.layout_transform"))
    assert isinstance(values[1], GenericConst)


def test_a_torch_max_pool_runs_blocked_between_convs():
    """torch.export's max_pool2d_with_indices arrives as (pool, constant)[0]: read through, the
    stem's pool runs blocked and the model keeps only its two edge layout transforms, as the
    hand-built models do; the output still matches PyTorch."""
    torch = pytest.importorskip("torch", reason="PyTorch is in the test extra")
    from benchmarks.network import import_torch
    from schedules import relax as mkrelax

    from .test_conv2d import HOST, calls, close, lowered, run

    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                          nn.Conv2d(32, 32, 3, 1, 1), nn.BatchNorm2d(32), nn.ReLU()).eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 24, 24)).astype(np.float32)
    mod = import_torch(model, x)
    body = mod["main"].body.blocks[0].bindings
    assert any(isinstance(b.value, relax.TupleGetItem) and isinstance(b.value.tuple_value, relax.Var) for b in body)
    opt = mkrelax.optimize(mod, HOST, lower=False)
    assert calls(opt, "relax.layout_transform") == 2
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    close(run(lowered(opt), x), want)
