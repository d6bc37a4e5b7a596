"""schedules.relax_int8: the graph-level int8 -> int16 conv2d legalization.

What the pass writes (an int16 conv2d of x - zp_x and the constant w - zp_w), that the result
compiles for llvm and is bit-exact against a numpy int64 quantized conv, what it must leave alone,
and the zero points it refuses.
"""

import re

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from schedules.relax import legalize_int8_conv2d

from ... import conv_reference

LLVM = tvm.target.Target({"kind": "llvm"})
DATA_SHAPE = (1, 8, 10, 10)
CONV2D = tvm.ir.Op.get("relax.nn.conv2d")
INFO = {"int8": np.iinfo(np.int8), "uint8": np.iinfo(np.uint8)}


def ref_qconv2d(x, w, zp_x, zp_w, strides=1, padding=0, dilation=1, groups=1):
    """out[n, o, y, x] = sum (x - zp_x) * (w - zp_w) in int64; NCHW data, OIHW weights."""
    return conv_reference.qconv2d(x, w, zp_x, zp_w, strides, padding, dilation, groups)


def _random(rng, shape, dtype):
    return rng.integers(INFO[dtype].min, INFO[dtype].max, shape, endpoint=True).astype(dtype)


def conv_module(data_dtype="int8", weight=None, weight_dtype="int8", out_dtype="int32", groups=1,
                data_shape=DATA_SHAPE, **attrs):
    """main(x) = conv2d(x, W); W a constant, or a second parameter `w` of weight_dtype if weight
    is None (16 output channels, 3x3)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(data_shape, data_dtype))
    params = [x]
    if weight is None:
        w = relax.Var("w", relax.TensorType((16, data_shape[1] // groups, 3, 3), weight_dtype))
        params.append(w)
    else:
        w = relax.const(weight)
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, groups=groups, out_dtype=out_dtype, **attrs))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def conv_calls(mod):
    calls = []

    def visit(e):
        if isinstance(e, tvm.ir.Call) and isinstance(e.op, tvm.ir.Op) and e.op.same_as(CONV2D):
            calls.append(e)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return calls


def ops_used(mod):
    names = []

    def visit(e):
        if isinstance(e, tvm.ir.Call) and isinstance(e.op, tvm.ir.Op):
            names.append(e.op.name)

    relax.analysis.post_order_visit(mod["main"], visit)
    return names


def _calls(mod, op_name):
    found = []
    relax.analysis.post_order_visit(
        mod["main"],
        lambda e: found.append(e) if isinstance(e, tvm.ir.Call) and isinstance(e.op, tvm.ir.Op)
        and e.op.name == op_name else None,
    )
    return found


def run(mod, *args):
    vm = relax.VirtualMachine(tvm.compile(mod, target=LLVM), tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()


# --- (a) what the pass writes ---------------------------------------------------------------


@pytest.mark.parametrize("data_dtype, zp_x, zp_w", [("int8", -7, 5), ("uint8", 128, -128), ("int8", 0, 0)])
def test_rewrites_to_int16_conv(rng, data_dtype, zp_x, zp_w):
    w = _random(rng, (16, 8, 3, 3), "int8")
    attrs = dict(strides=(2, 1), padding=(1, 0, 2, 1), dilation=(1, 2))
    mod = conv_module(data_dtype, w, **attrs)
    (before,) = conv_calls(mod)

    pass_ = legalize_int8_conv2d(zp_x, zp_w)
    assert isinstance(pass_, tvm.ir.transform.Pass)
    new = pass_(mod)
    relax.analysis.well_formed(new)  # raises on the first violation

    (conv,) = conv_calls(new)
    data, weight = conv.args
    assert str(data.ty.dtype) == "int16" and isinstance(data, relax.Var)  # normal form kept
    assert isinstance(weight, tvm.ir.GenericConst)
    assert str(weight.ty.dtype) == "int16"
    np.testing.assert_array_equal(weight.value.numpy(), w.astype(np.int64) - zp_w)
    assert weight.value.numpy().dtype == np.int16
    for name in ("strides", "padding", "dilation", "groups", "data_layout", "kernel_layout", "out_layout"):
        assert str(getattr(conv.attrs, name)) == str(getattr(before.attrs, name)), name
    assert str(conv.attrs.out_dtype) == "int32"
    assert str(new["main"].ret_ty) == str(mod["main"].ret_ty)
    assert new["main"].params[0].same_as(mod["main"].params[0])  # the interface is untouched

    ops = ops_used(new)
    assert ops.count("relax.astype") == 1
    # the data's zero point is subtracted in the graph; a zero one costs no op
    assert ops.count("relax.subtract") == (1 if zp_x else 0)
    if zp_x:
        (sub,) = _calls(new, "relax.subtract")
        assert str(sub.args[1].ty.dtype) == "int16" and int(sub.args[1].value.numpy()) == zp_x

    # idempotent: nothing 8-bit is left to match
    tvm.ir.assert_structural_equal(pass_(new), new)


def test_rewrites_every_matching_conv_only(rng):
    """Two chained int8 convs (the second on a requantized result) and a float one in one function:
    both int8 ones become int16, the float one stays."""
    w1, w2 = _random(rng, (8, 8, 3, 3), "int8"), _random(rng, (8, 8, 1, 1), "int8")
    wf = rng.standard_normal((4, 8, 3, 3)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(DATA_SHAPE, "int8"))
    f = relax.Var("f", relax.TensorType(DATA_SHAPE, "float32"))
    with bb.function("main", [x, f]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(w1), padding=1, out_dtype="int32"))
            y8 = bb.emit(relax.op.astype(relax.op.clip(y, -128, 127), "int8"))
            z = bb.emit(relax.op.nn.conv2d(y8, relax.const(w2), out_dtype="int32"))
            g = bb.emit(relax.op.nn.conv2d(f, relax.const(wf)))
            out = bb.emit_output(relax.Tuple([z, g]))
        bb.emit_func_output(out)
    new = legalize_int8_conv2d(3, -2)(bb.get())
    relax.analysis.well_formed(new)
    dtypes = sorted(str(c.args[0].ty.dtype) for c in conv_calls(new))
    assert dtypes == ["float32", "int16", "int16"]


# --- (b) compiled for llvm, bit-exact -------------------------------------------------------

CASES = [
    # data dtype, weight dtype, zp_x, zp_w, conv attrs
    # extreme zero points: |x - zp_x| and |w - zp_w| reach 255, products 65025 overflow int16
    ("int8", "int8", -128, 127, dict(strides=1, padding=1)),
    ("uint8", "int8", 255, -128, dict(strides=2, padding=(0, 1, 2, 1))),
    ("uint8", "int8", 128, -3, dict(strides=(2, 1), padding=1, groups=2)),
    ("int8", "int8", 0, 9, dict(strides=1, padding=2, dilation=2, groups=2)),
    ("int8", "uint8", 17, 200, dict(strides=(1, 2), padding=(1, 0))),
]


@pytest.mark.parametrize("data_dtype, weight_dtype, zp_x, zp_w, attrs", CASES)
def test_legalized_runs_bit_exact(rng, data_dtype, weight_dtype, zp_x, zp_w, attrs):
    groups = attrs.get("groups", 1)
    w = _random(rng, (16, DATA_SHAPE[1] // groups, 3, 3), weight_dtype)
    x = _random(rng, DATA_SHAPE, data_dtype)
    mod = legalize_int8_conv2d(zp_x, zp_w)(conv_module(data_dtype, w, **attrs))
    got = run(mod, x)
    ref = ref_qconv2d(x, w, zp_x, zp_w, **attrs)
    assert got.dtype == np.int32 and got.shape == ref.shape
    assert np.abs(ref).max() > 2**15  # the sums need int32; products exceed int16 too
    np.testing.assert_array_equal(got, ref)


def test_unlegalized_conv_is_plain_sum(rng):
    """Relax's own int8 conv2d with out_dtype int32 is sum x * w (no zero points): the pass changes
    the function's result on purpose, and with both zero points 0 it does not change it."""
    w = _random(rng, (16, 8, 3, 3), "int8")
    x = _random(rng, DATA_SHAPE, "int8")
    attrs = dict(strides=2, padding=1)
    mod = conv_module("int8", w, **attrs)
    plain = run(mod, x)
    np.testing.assert_array_equal(plain, ref_qconv2d(x, w, 0, 0, **attrs))
    np.testing.assert_array_equal(run(legalize_int8_conv2d(0, 0)(mod), x), plain)


def test_nhwc_layout(rng):
    """The rewrite is elementwise, so any layout works: NHWC data, HWIO weights."""
    zp_x, zp_w = 100, -50
    w = _random(rng, (16, 8, 3, 3), "int8")  # OIHW
    x = _random(rng, DATA_SHAPE, "uint8")  # NCHW
    attrs = dict(strides=2, padding=1)
    mod = conv_module("uint8", np.ascontiguousarray(w.transpose(2, 3, 1, 0)), data_shape=(1, 10, 10, 8),
                      data_layout="NHWC", kernel_layout="HWIO", **attrs)
    got = run(legalize_int8_conv2d(zp_x, zp_w)(mod), np.ascontiguousarray(x.transpose(0, 2, 3, 1)))
    np.testing.assert_array_equal(got, ref_qconv2d(x, w, zp_x, zp_w, **attrs).transpose(0, 2, 3, 1))


@pytest.mark.parametrize("zp_w", [-3, 0])
def test_parameter_weight_is_widened_in_the_graph(rng, zp_w):
    """A weight that is a function input keeps its zero point: it is widened in the graph (it
    used to be left alone, which computed sum x * w and dropped both zero points silently)."""
    zp_x = 7
    w = _random(rng, (16, 8, 3, 3), "int8")
    x = _random(rng, DATA_SHAPE, "int8")
    mod = legalize_int8_conv2d(zp_x, zp_w)(conv_module("int8", None, padding=1))
    (conv,) = conv_calls(mod)
    assert str(conv.args[1].ty.dtype) == "int16"
    np.testing.assert_array_equal(run(mod, x, w), ref_qconv2d(x, w, zp_x, zp_w, padding=1))


def test_reduction_beyond_the_exact_bound_refused(rng):
    """C*KH*KW = 4445*9 = 40005 > 33025: the int32 sum could wrap, so the pass refuses the conv
    rather than rewrite it (it used to, and wrapped by 2**32) or leave it without zero points."""
    c = 4445
    w = np.zeros((4, c, 3, 3), np.int8)
    mod = conv_module("uint8", w, data_shape=(1, c, 3, 3))
    with pytest.raises(ValueError, match=r"4445\*3\*3 = 40005 exceeds 33025"):
        legalize_int8_conv2d(128, 0)(mod)
    ok = conv_module("uint8", w[:, :3669], data_shape=(1, 3669, 3, 3))  # 33021: within the bound
    assert len(conv_calls(legalize_int8_conv2d(128, 0)(ok))) == 1


# --- (c) what it leaves alone ---------------------------------------------------------------


UNCHANGED = {
    "float32": lambda rng: conv_module("float32", rng.standard_normal((16, 8, 3, 3)).astype("float32"),
                                       out_dtype="float32", padding=1),
    "out_dtype int16": lambda rng: conv_module("int8", _random(rng, (16, 8, 3, 3), "int8"), out_dtype="int16"),
    "out_dtype unset (int8)": lambda rng: conv_module("int8", _random(rng, (16, 8, 3, 3), "int8"), out_dtype=None),
    "int16 data": lambda rng: conv_module("int16", _random(rng, (16, 8, 3, 3), "int8").astype("int16")),
}


@pytest.mark.parametrize("case", list(UNCHANGED))
def test_non_matching_left_alone(rng, case):
    mod = UNCHANGED[case](rng)
    new = legalize_int8_conv2d(5, 5)(mod)
    tvm.ir.assert_structural_equal(new, mod)  # raises with the first difference
    assert tvm_ffi.structural_equal(new, mod)


# --- (d) refused zero points ----------------------------------------------------------------


@pytest.mark.parametrize("which", ["input", "weight"])
@pytest.mark.parametrize("zp", [-129, 256, 1000])
def test_zero_point_outside_every_8bit_range(which, zp):
    kwargs = {"input_zero_point": 0, "weight_zero_point": 0, f"{which}_zero_point": zp}
    with pytest.raises(ValueError, match=re.escape(f"{which}_zero_point={zp}")) as err:
        legalize_int8_conv2d(**kwargs)
    assert "int8 takes [-128, 127]" in str(err.value) and "uint8 takes [0, 255]" in str(err.value)


@pytest.mark.parametrize("zp", [1.0, True, "3", None])
def test_zero_point_not_an_int(zp):
    with pytest.raises(TypeError, match="input_zero_point must be an int"):
        legalize_int8_conv2d(zp, 0)


@pytest.mark.parametrize("data_dtype, weight_dtype, zp_x, zp_w, message", [
    ("uint8", "int8", -1, 0, "input_zero_point=-1 is out of range for uint8: must lie in [0, 255]"),
    ("int8", "int8", 128, 0, "input_zero_point=128 is out of range for int8: must lie in [-128, 127]"),
    ("int8", "int8", 0, 255, "weight_zero_point=255 is out of range for int8: must lie in [-128, 127]"),
    ("int8", "uint8", 0, -128, "weight_zero_point=-128 is out of range for uint8: must lie in [0, 255]"),
])
def test_zero_point_outside_the_conv_dtype(rng, data_dtype, weight_dtype, zp_x, zp_w, message):
    mod = conv_module(data_dtype, _random(rng, (16, 8, 3, 3), weight_dtype))
    pass_ = legalize_int8_conv2d(zp_x, zp_w)  # fits some 8-bit dtype: accepted here
    with pytest.raises(ValueError, match=re.escape(message)):
        pass_(mod)


def test_numpy_int_zero_points_accepted(rng):
    w = _random(rng, (16, 8, 3, 3), "int8")
    new = legalize_int8_conv2d(np.int8(-3), np.int64(4))(conv_module("int8", w))
    (conv,) = conv_calls(new)
    np.testing.assert_array_equal(conv.args[1].value.numpy(), w.astype(np.int16) - 4)
