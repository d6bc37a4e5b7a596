"""Channel counts padded to whole blocks before ConvertLayout (schedules/relax/channels.py): odd
channel counts run blocked from conv to conv with no layout transform between, through the ops
that treat channels one by one (hardswish's chain, a squeeze-and-excitation's pool, gate and
scale, residual adds, depthwise convs), and every other use reads the real channels."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax

from schedules import relax as mkrelax
from schedules.relax.channels import pad_channels

from .test_conv2d import HOST, call_tirs, calls, close, convs, lowered, run


def _w(rng, *shape):
    return relax.const((rng.standard_normal(shape) * 0.3).astype(np.float32))


def _hardswish(bb, x):
    """x * clip(x + 3, 0, 6) / 6, as the torch frontend writes it."""
    g = bb.emit(relax.op.clip(bb.emit(relax.op.add(x, relax.const(np.float32(3)))), 0.0, 6.0))
    return bb.emit(relax.op.multiply(x, bb.emit(relax.op.divide(g, relax.const(np.float32(6))))))


def _mobile_block(c: int, e: int, r: int, seed: int = 0):
    """MobileNetV3's block on odd counts: 1x1 conv c -> e + bias, hardswish, depthwise 3x3 + bias,
    squeeze-and-excitation (adaptive pool, 1x1 e -> r, ReLU, 1x1 r -> e, hardsigmoid as clip/6,
    times the map), 1x1 e -> c + bias, residual add, then a conv to 16 channels at the end."""
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, 12, 12), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(x, _w(rng, e, c, 1, 1))), _w(rng, 1, e, 1, 1)))
            y = _hardswish(bb, y)
            y = bb.emit(relax.op.nn.conv2d(y, _w(rng, e, 1, 3, 3), padding=1, groups=e))
            y = bb.emit(relax.op.add(y, _w(rng, 1, e, 1, 1)))
            p = bb.emit(relax.op.nn.adaptive_avg_pool2d(y, (1, 1)))
            s = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(p, _w(rng, r, e, 1, 1)))))
            s = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(s, _w(rng, e, r, 1, 1))), relax.const(np.float32(3))))
            s = bb.emit(relax.op.divide(bb.emit(relax.op.clip(s, 0.0, 6.0)), relax.const(np.float32(6))))
            y = bb.emit(relax.op.multiply(y, s))
            y = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(y, _w(rng, c, e, 1, 1))), _w(rng, 1, c, 1, 1)))
            y = bb.emit(relax.op.add(y, x))
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(y, _w(rng, 16, c, 3, 3), padding=1)))
        bb.emit_func_output(out)
    return bb.get(), rng.standard_normal((1, c, 12, 12)).astype(np.float32)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=st.integers(1, 130), e=st.integers(1, 130), r=st.integers(1, 40))
def test_odd_channel_counts_run_blocked_from_conv_to_conv(c, e, r):
    """Any channel counts: every conv ours, and no layout transform but the model's input and
    output (where the input's channels are not whole blocks, its residual use takes a padded
    copy of its own, blocked: the first conv reads the input blocked to its own channel count);
    values as TVM's own build."""
    mod, xv = _mobile_block(c, e, r)
    report = []
    opt = mkrelax.optimize(mod, HOST, report=report, lower=False)
    assert [r["runs_on"] for r in convs(report)] == ["ours"] * 6, report
    assert calls(opt, "relax.layout_transform") == (2 if c % 16 == 0 else 3)
    assert calls(opt, "relax.strided_slice") == 0
    close(run(lowered(opt), xv), run(mod, xv))


def test_mobilenet_v3_channel_counts_before_the_pass():
    """The 40/120/40 block of MobileNetV3 took 12 transforms and slices before the padding (its
    depthwise conv and the SE in NCHW, slices after every conv); the pass alone pads every conv's
    outputs to 48 and 128 and the depthwise groups with them."""
    mod, _ = _mobile_block(40, 120, 32)
    padded = pad_channels(mod, 16)
    shapes = {tuple(int(d) for d in b.value.ty.shape.values)
              for blk in padded["main"].body.blocks for b in blk.bindings
              if isinstance(b.value, relax.Call) and b.value.op.name == "relax.nn.conv2d"}
    assert shapes == {(1, 128, 12, 12), (1, 32, 1, 1), (1, 128, 1, 1), (1, 48, 12, 12), (1, 16, 12, 12)}
    depthwise = [b.value for blk in padded["main"].body.blocks for b in blk.bindings
                 if isinstance(b.value, relax.Call) and b.value.op.name == "relax.nn.conv2d" and int(b.value.attrs.groups) > 1]
    assert [int(d.attrs.groups) for d in depthwise] == [128]


def _conv_then(op: str, c: int = 40):
    """conv 16 -> c (padded to 48) followed by `op` on its output, then a conv c -> 16."""
    rng = np.random.default_rng(3)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 6, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, _w(rng, c, 16, 1, 1)))
            if op == "exp":
                z = bb.emit(relax.op.exp(y))
            elif op == "divide_by_itself":  # 0 / 0 in the padding channels, were they carried
                z = bb.emit(relax.op.divide(y, y))
            elif op == "reshape":
                z = bb.emit(relax.op.reshape(bb.emit(relax.op.reshape(y, (1, c * 36))), (1, c, 6, 6)))
            elif op == "concat":
                z = bb.emit(relax.op.concat([y, y], axis=1))
            else:
                raise ValueError(op)
            k = exprs_channels(z)
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(z, _w(rng, 16, k, 3, 3), padding=1)))
        bb.emit_func_output(out)
    return bb.get(), rng.standard_normal((1, 16, 6, 6)).astype(np.float32)


def exprs_channels(expr) -> int:
    return int(expr.ty.shape.values[1])


@pytest.mark.parametrize("op", ["exp", "divide_by_itself", "reshape", "concat"])
def test_other_uses_read_the_real_channels(op):
    """An op not known to keep the padding finite and per channel reads a slice of the real
    channels (exp of act(0) could overflow; x / x is 0 / 0 there: NaN in the padding would
    reach the next conv through its zero weights, 0 * NaN); the results equal TVM's."""
    mod, xv = _conv_then(op)
    padded = pad_channels(mod, 16)
    assert calls(padded, "relax.strided_slice") == 1
    opt = mkrelax.optimize(mod, HOST, lower=False)
    got, want = run(lowered(opt), xv), run(mod, xv)
    assert np.isfinite(got).all()
    close(got, want)


def test_a_result_keeps_its_channel_count():
    """A conv on 5 output channels that is the function's result (no tuple around it, as the
    ONNX importer writes it): padded inside, sliced back for the caller."""
    rng = np.random.default_rng(4)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 5, 5), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(x, _w(rng, 5, 8, 3, 3), padding=1))
        bb.emit_func_output(out)
    mod = bb.get()
    xv = rng.standard_normal((1, 8, 5, 5)).astype(np.float32)
    opt = mkrelax.optimize(mod, HOST, lower=False)
    got = run(lowered(opt), xv)
    assert got.shape == (1, 5, 5, 5)
    close(got, run(mod, xv))


@pytest.mark.parametrize("c, cg", [(104, 8), (40, 4), (24, 8), (72, 24)], ids=["regnety_104", "resnext_40", "g8_24", "regnetx_72"])
def test_grouped_convs_take_the_padding_as_whole_groups(c, cg):
    """RegNetY's block on 104 channels (13 groups of 8): the 8 padding channels are a 14th group
    of zero filters, so the grouped conv, its squeeze-and-excitation and the 1x1 convs around it
    run blocked with no transform between them. Groups of 24 (RegNetX's) on 72 channels cannot
    take 8 padding channels as a group: the grouped conv reads the real channels (a slice) and
    runs on its own padded-group path. Values as TVM's own build."""
    rng = np.random.default_rng(7)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 14, 14), "float32"))
    groups = c // cg
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, _w(rng, c, 16, 1, 1)))))
            y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(y, _w(rng, c, cg, 3, 3), padding=1, groups=groups))))
            s = bb.emit(relax.op.mean(y, axis=[2, 3], keepdims=True))
            s = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(s, _w(rng, 6, c, 1, 1)))))
            s = bb.emit(relax.op.sigmoid(bb.emit(relax.op.nn.conv2d(s, _w(rng, c, 6, 1, 1)))))
            y = bb.emit(relax.op.multiply(y, s))
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(y, _w(rng, 16, c, 1, 1))))
        bb.emit_func_output(out)
    mod = bb.get()
    xv = rng.standard_normal((1, 16, 14, 14)).astype(np.float32)
    padded = pad_channels(mod, 16)
    grouped = [int(b.value.attrs.groups) for blk in padded["main"].body.blocks for b in blk.bindings
               if isinstance(b.value, relax.Call) and b.value.op.name == "relax.nn.conv2d" and int(b.value.attrs.groups) > 1]
    whole = (16 - c % 16) % cg == 0
    assert grouped == [(c + (16 - c % 16) % 16) // cg if whole else groups]
    report = []
    opt = mkrelax.optimize(mod, HOST, report=report, lower=False)
    assert [r["runs_on"] for r in convs(report)] == ["ours"] * 5, report
    # Groups of 24: the slice of the padded map reaches the grouped conv's own layout in one
    # scheduled copy from the blocked tensor (conv2d._sliced_blocked: no transform before it);
    # its output, 72 channels unpadded, takes the squeeze-and-excitation to NCHW and back (3
    # transforms more: left, a note in docs/results.md).
    assert calls(opt, "relax.layout_transform") == (2 if whole else 5)
    assert calls(opt, "relax.strided_slice") == (0 if whole else 1)
    regroups = [n for n in call_tirs(opt) if n.startswith("mk_regroup")]
    assert len(regroups) == (0 if whole or cg % 16 == 0 or 16 % cg == 0 else 1), call_tirs(opt)
    close(run(lowered(opt), xv), run(mod, xv))


@pytest.mark.parametrize("cg", [24, 32])
def test_wide_groups_on_whole_block_maps_stay_blocked(cg):
    """Groups of 24 on 96 channels (RegNetY-1.6GF's on 336): ConvertLayout blocks the grouped
    conv (pipeline._desired_layouts), so its squeeze-and-excitation, the multiply and the
    residual add run blocked; each grouped conv reads and writes the graph's blocked tensors
    through one scheduled copy each way into its own group layout (8-channel blocks on AVX2,
    16 on AVX-512: this covers the host's). Two layout transforms are left, at the model's
    edges; before, six. Groups of whole blocks (32, ResNeXt-50's last stage) take the plain
    blocked layout with no copy at all. Values as TVM's own build."""
    rng = np.random.default_rng(3)
    c = 96
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32, 10, 10), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y0 = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, _w(rng, c, 32, 1, 1)))))
            y = bb.emit(relax.op.nn.conv2d(y0, _w(rng, c, cg, 3, 3), padding=1, groups=c // cg))
            y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(y, _w(rng, 1, c, 1, 1)))))
            s = bb.emit(relax.op.mean(y, axis=[2, 3], keepdims=True))
            s = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(s, _w(rng, 8, c, 1, 1)))))
            s = bb.emit(relax.op.sigmoid(bb.emit(relax.op.nn.conv2d(s, _w(rng, c, 8, 1, 1)))))
            y = bb.emit(relax.op.multiply(y, s))
            y = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(y, _w(rng, c, cg, 3, 3), padding=1, groups=c // cg)), y0))
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(y, _w(rng, 16, c, 1, 1))))
        bb.emit_func_output(out)
    mod = bb.get()
    xv = rng.standard_normal((1, 32, 10, 10)).astype(np.float32)
    report = []
    opt = mkrelax.optimize(mod, HOST, report=report, lower=False)
    assert [r["runs_on"] for r in convs(report)] == ["ours"] * 6, report
    assert [r["post_ops"] for r in convs(report)][4] == "residual", report
    assert calls(opt, "relax.layout_transform") == 2, calls(opt, "relax.layout_transform")
    copies = [n for n in call_tirs(opt) if n.startswith(("mk_regroup", "mk_ungroup"))]
    # in and out of each grouped conv of 24, and the residual in
    assert len(copies) == (5 if cg == 24 else 0), copies
    close(run(lowered(opt), xv), run(mod, xv))
