"""schedules.conv.dispatch: conv2d's arguments checked where they enter, each refusal naming the
constraint, and the family each layer goes to (conv2d's keyword options included)."""

import numpy as np
import pytest

import schedules
from schedules.conv import ConvParams, PostOps, Quantization, dispatch
from schedules.conv.grouped import GroupedConv2dOp

from ...x86_exec import HOST

GOOD = dict(data_shape=(1, 4, 8, 8), weight_shape=(8, 4, 3, 3))


@pytest.mark.parametrize("kwargs, exc, msg", [
    (dict(weight_shape=(8, 2, 3, 3)), ValueError, r"weight_shape\[1\] must be in_channels/groups = 4/1 = 4, got 2"),
    (dict(weight_shape=(8, 4, 3, 3), groups=2), ValueError, r"weight_shape\[1\] must be in_channels/groups"),
    (dict(weight_shape=(8, 1, 3, 3), groups=3), ValueError, "groups=3 must divide both the input channels"),
    (dict(weight_shape=(9, 2, 3, 3), groups=2), ValueError, "groups=2 must divide both"),
    (dict(groups=0), ValueError, "groups must be >= 1"),
    (dict(weight_shape=(8, 4, 9, 3)), ValueError, "kernel 9x3 is larger than the padded input 8x8"),
    (dict(dilation=(5, 1)), ValueError, "kernel 11x3 is larger than the padded input"),
    (dict(weight_shape=(8, 4, 11, 3), padding=1), ValueError, "kernel 11x3 is larger than the padded input 10x10"),
    (dict(padding=-1), ValueError, "padding must be >= 0"),
    (dict(padding=(0, -1)), ValueError, "padding must be >= 0"),
    (dict(padding=(0, 0, -1, 0)), ValueError, "padding must be >= 0"),
    (dict(padding=(1, 1, 1)), ValueError, r"padding must be an int, \(h, w\), \(top, left, bottom, right\), 'same' or 'valid'"),
    (dict(padding="full"), ValueError, r"padding must be .*'same' or 'valid', got 'full'"),
    (dict(padding="same", stride=2), ValueError, r"padding='same' needs stride 1, as in PyTorch; got stride \(2, 2\)"),
    (dict(padding=1.5), TypeError, "padding must be an int, .*, .same. or .valid., got 1.5"),
    (dict(stride=0), ValueError, "stride must be >= 1"),
    (dict(stride=(1, 0)), ValueError, "stride must be >= 1"),
    (dict(dilation=0), ValueError, "dilation must be >= 1"),
    (dict(stride=(1, 1, 1)), ValueError, "stride must be an int or a tuple of one or two ints"),
    (dict(stride=1.5), TypeError, "stride must be an int or a tuple of one or two ints"),
    (dict(stride=True), TypeError, "stride must be an int or a tuple of one or two ints"),
    (dict(data_shape=(1, 4, 0, 8)), ValueError, r"data_shape\[2\] must be >= 1"),
    (dict(data_shape=(1, 4, 8, 8, 1)), ValueError, r"data_shape must be \(N, C, H, W\) or, unbatched, \(C, H, W\)"),
    (dict(data_shape=(-1, 4, 8, 8)), ValueError, r"data_shape\[0\] must be >= 1"),
    (dict(dtype="int16", weight_dtype="int8"), ValueError, "int16 is the legalized, zero-point-free form"),
    (dict(dtype="float16"), ValueError, "dtype 'float16' is not supported"),
    (dict(algorithm="winograd", stride=2), ValueError, "algorithm='winograd' needs stride 1"),
    (dict(target="x86-sse"), ValueError, "unknown target 'x86-sse'"),
    (dict(target="llvm -mcpu=skylake-avx512"), ValueError, "no longer parses target strings"),
    (dict(threads=0), ValueError, "threads must be >= 1"),
    (dict(threads=1.0), TypeError, "threads must be an int"),
    (dict(threads=2**31), ValueError, "threads=2147483648 is more than 1024"),
    (dict(padding=10**9), ValueError, "output would hold .* int32 index arithmetic"),
    (dict(dtype=np.int64), ValueError, "dtype 'int64' is not supported"),
    (dict(dtype=object()), TypeError, "dtype must be a dtype name"),
])
def test_bad_arguments(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        schedules.conv2d(**{**GOOD, **kwargs})


def test_unknown_options_name_the_accepted_ones():
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) 'activaton'; it takes threads, blocking"):
        schedules.conv2d((1, 4, 8, 8), (8, 4, 3, 3), activaton="relu")


@pytest.mark.parametrize("data_shape, weight_shape, kw, family, algorithm", [
    ((1, 16, 14, 14), (16, 16, 3, 3), dict(padding=1), "WinogradConv2dOp", "winograd"),
    ((1, 16, 14, 14), (16, 16, 3, 3), dict(padding=1, algorithm="direct"), "Conv2dOp", "direct"),
    ((1, 16, 7, 7), (16, 16, 3, 3), dict(padding=1), "Conv2dOp", "direct"),
    ((1, 16, 14, 14), (32, 1, 3, 3), dict(padding=1, groups=16), "DepthwiseConv2dOp", "depthwise"),
    ((1, 32, 6, 6), (32, 4, 3, 3), dict(padding=1, groups=8), "DepthwiseConv2dOp", "grouped"),
    ((1, 32, 6, 6), (32, 4, 3, 3), dict(padding=1, groups=8, residual=True), "GroupedConv2dOp", "direct"),
    ((1, 32, 6, 6), (32, 16, 3, 3), dict(padding=1, groups=2), "Conv2dOp", "direct"),
])
def test_each_layer_goes_to_its_family(data_shape, weight_shape, kw, family, algorithm):
    s = dispatch.schedule_args(data_shape, weight_shape, target=HOST, **kw)
    cls = getattr(s.cls, "func", s.cls)  # a grouped op is a partial carrying the layer's own geometry
    assert cls.__name__ == family and s.plan.algorithm == algorithm, (s.cls, s.plan)
    assert isinstance(s.plan.reason, str) and s.plan.reason
    if cls is GroupedConv2dOp:
        assert s.plan.block_diagonal == "8 groups of 4 channels as 2 of 16" and s.geometry.groups == 2


def test_schedule_takes_the_values_conv2d_makes():
    params = ConvParams((1, 16, 8, 8), (16, 16, 3, 3), padding=1)
    s = dispatch.schedule(params, post_ops=PostOps(bias=True, activation="relu"), target=HOST, algorithm="direct")
    t = dispatch.schedule_args((1, 16, 8, 8), (16, 16, 3, 3), padding=1, target=HOST, algorithm="direct",
                               bias=True, activation="relu")
    assert s.plan == t.plan and s.post == t.post and s.geometry == t.geometry
    assert s.mod.script() == t.mod.script()
    with pytest.raises(ValueError, match="zero points and weight_dtype apply to quantized"):
        dispatch.schedule(params, quant=Quantization("float32"), target=HOST)
    with pytest.raises(ValueError, match="dtype 'float16' is not supported on x86 targets; use 'float32', or 'uint8'"):
        dispatch.schedule(params, quant=Quantization("float16"), target=HOST)
    op = dispatch.schedule(params, quant=Quantization("int8"), target=HOST)  # the x86 integer tiles
    assert op.plan.kern.isa.arch == "x86" and op.out_shape == (1, 16, 8, 8)
