"""`bench conv2d --dtype int8`: each layer quantized (uint8 activations with a zero point, per-channel
int8 weights, int32 bias, requantized uint8 output) on our int8 conv2d, beside our own float32
conv2d of the same layer and the int8 engines people deploy with: ONNX Runtime and OpenVINO, both
on one QDQ ONNX model of the layer (DequantizeLinear -> Conv -> QuantizeLinear, uint8 in and out),
which they fuse into their int8 convolution (ONNX Runtime's QLinearConv, OpenVINO's oneDNN int8).

Every engine runs the same quantized weights; outputs are compared with the model's own
definition (ONNX Runtime running DequantizeLinear, a float32 Conv and QuantizeLinear, its
optimizations off): the largest difference in quantization steps, ours ("max diff") and the
peers' ("ORT/OV diff"). Times are the median seconds per call on the NCHW arrays with the weights
packed beforehand (our `bind`), warm caches, engines taking turns per layer, in ROUNDS rounds of
turns, each engine's better median kept (as `run_network` does): a burst of load from another
tenant of the host then costs one engine one round, not the layer's ratio.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np

import schedules
from schedules.common.targets import float_isa, int_isa, resolve, set_threads

from . import network, peers
from .turns import take_turns
from .zoo import first_input

# The quantization of the bench's layers: activations uint8 around a zero point, weights int8
# per output channel (symmetric, as onnxruntime.quantization writes them), output uint8.
SX, ZX, SY, ZY = 0.02, 128, 0.05, 128
ROUNDS = 2  # rounds of turns per layer and per network (module doc, turns.take_turns)
# The tile column's note of a layer run in another form (Int8Plan.form): integer Winograd, pairs of values.
FORM_TAGS = {"winograd": " wino", "paired": " pair"}


def quantized_layer(layer, seed: int = 0, reduce_range: bool = False) -> dict:
    """Random uint8 data, int8 weights with per-channel scales (7-bit, [-64, 64], with
    reduce_range: as quantize_static(reduce_range=True) writes them), an int32 bias at scale sx * sw."""
    rng = np.random.default_rng(seed)
    (n, c, h, w), w_shape = layer.shapes
    sw = (rng.uniform(0.5, 1.5, w_shape[0]) / np.sqrt(w_shape[1] * w_shape[2] * w_shape[3]) / 64).astype(np.float32)
    top = 64 if reduce_range else 127
    if reduce_range:
        sw = sw * np.float32(2)  # the same real weights on half the steps
    return {"x": rng.integers(0, 256, (n, c, h, w)).astype(np.uint8),
            "w": rng.integers(-top, top + 1, w_shape).astype(np.int8),
            "bias": rng.integers(-2000, 2000, w_shape[0]).astype(np.int32), "sw": sw}


def qdq_model(layer, q: dict, path: str) -> str:
    """The layer as the QDQ graph a quantizer writes: x uint8 -> DequantizeLinear -> Conv (weights
    and bias through their own DequantizeLinear) -> QuantizeLinear -> y uint8."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    (n, c, h, w), w_shape = layer.shapes
    oh, ow = ((d + 2 * layer.pad - layer.k) // layer.stride + 1 for d in (h, w))
    inits = [
        numpy_helper.from_array(np.array(SX, np.float32), "sx"), numpy_helper.from_array(np.array(ZX, np.uint8), "zx"),
        numpy_helper.from_array(q["w"], "wq"), numpy_helper.from_array(q["sw"], "sw"),
        numpy_helper.from_array(np.zeros(w_shape[0], np.int8), "zw"),
        numpy_helper.from_array(q["bias"], "bq"), numpy_helper.from_array((np.float32(SX) * q["sw"]).astype(np.float32), "sb"),
        numpy_helper.from_array(np.zeros(w_shape[0], np.int32), "zb"),
        numpy_helper.from_array(np.array(SY, np.float32), "sy"), numpy_helper.from_array(np.array(ZY, np.uint8), "zy"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
        helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wf"], axis=0),
        helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bf"], axis=0),
        helper.make_node("Conv", ["xf", "wf", "bf"], ["yf"], kernel_shape=[layer.k, layer.k],
                         strides=[layer.stride] * 2, pads=[layer.pad] * 4, group=layer.groups),
        helper.make_node("QuantizeLinear", ["yf", "sy", "zy"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "qconv", [helper.make_tensor_value_info("x", TensorProto.UINT8, [n, c, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [n, w_shape[0], oh, ow])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def ours(layer, q: dict, target: str, threads: int, layout: str = "NCHW", weight_bits: int = 8):
    """Our op and its bound call on the layer's data (channels-last data with layout NHWC);
    weight_bits=7: 7-bit weights, the vpmaddubsw tile where the ISA lacks VNNI."""
    (n, c, h, w), w_shape = layer.shapes
    shape = (n, h, w, c) if layout == "NHWC" else (n, c, h, w)
    op = schedules.conv2d(shape, w_shape, **layer.kwargs, dtype="uint8", target=target, threads=threads,
                          input_zero_point=ZX, output_dtype="uint8", input_scale=SX, weight_scale=q["sw"],
                          output_scale=SY, output_zero_point=ZY, bias=True, data_layout=layout,
                          weight_bits=weight_bits)
    return op, op.bind(q["w"], q["bias"])


def run(layers, thread_counts, repeat: int, log, target: str = "native", layout: str = "NCHW",
        reduce_range: bool = False) -> dict:
    """reduce_range: 7-bit weights ([-64, 64]) for every engine, ours told so (weight_bits=7)."""
    isa = int_isa(target, resolve(target))
    fisa = float_isa(resolve(target))  # our float32 conv2d at the same vector width
    weights = "7-bit ([-64, 64], reduce_range)" if reduce_range else "8-bit ([-127, 127])"
    log(f"int8 conv2d on {isa.name} ({layout} data and output), float32 on {fisa.name} (NCHW); quantization: x uint8 "
        f"(scale {SX}, zero point {ZX}), weights int8 {weights} per channel, y uint8 (scale {SY}, zero point {ZY}); "
        "warm caches, weights packed beforehand")
    skipped = [why for why in map(peers.missing, peers.NEEDS) if why]
    for why in skipped:
        log(why)
    out = {"isa": isa.name, "weight_bits": 7 if reduce_range else 8, "layers": []}
    tmp = tempfile.TemporaryDirectory(prefix="mk-int8-")
    try:
        for threads in thread_counts:
            log(f"  {threads} thread(s):")
            log(f"    {'layer':34s} {'tile':28s} {'int8 ms':>8s} {'f32 ms':>8s} {'f32/int8':>8s} {'ORT ms':>8s} "
                f"{'OV ms':>8s} {'int8/best':>9s} {'max diff':>8s} {'ORT/OV diff':>11s}")
            rows = []
            for i, layer in enumerate(layers):
                q = quantized_layer(layer, seed=i, reduce_range=reduce_range)
                op, f = ours(layer, q, target, threads, layout, 7 if reduce_range else 8)
                x = q["x"] if layout == "NCHW" else np.ascontiguousarray(q["x"].transpose(0, 2, 3, 1))
                turns = {"int8": lambda f=f, x=x: f(x)}
                number = max(1, int(2e-3 / max(_quick(turns["int8"]), 1e-6)))
                fop = schedules.conv2d(*layer.shapes, **layer.kwargs, target=f"x86-{fisa.name}", threads=threads)
                ff = fop.bind(np.random.default_rng(i).standard_normal(layer.weight_shape).astype(np.float32))
                xf = q["x"].astype(np.float32)
                turns["f32"] = lambda ff=ff, xf=xf: ff(xf)
                engines = {}
                if not skipped:
                    path = qdq_model(layer, q, os.path.join(tmp.name, f"layer{i}.onnx"))
                    engines["ORT"] = peers.onnx_runtime(path, q["x"], threads)
                    engines["OV"] = peers.openvino(path, q["x"], threads)
                    for name, e in engines.items():
                        turns[name] = e.run
                secs = take_turns(turns, threads, number, repeat, 0.3, ("int8", "f32"), ROUNDS)
                got = f(x).astype(np.int32)
                if layout == "NHWC":
                    got = got.transpose(0, 3, 1, 2)
                diff, peer_diff = None, {}
                if engines:
                    # the QDQ graph as written (ONNX Runtime, no fusions): the model's own definition, which
                    # the fused int8 kernels may miss (without VNNI, vpmaddubsw saturates 16-bit pair sums)
                    want = peers.onnx_runtime(path, q["x"], 1, optimize=False).run().astype(np.int32)
                    diff = int(np.abs(got - want).max())
                    peer_diff = {k: int(np.abs(e.run().astype(np.int32) - want).max()) for k, e in engines.items()}
                best = min((secs[n] for n in engines), default=None)
                ms = {k: 1e3 * v for k, v in secs.items()}
                tile = op.plan.kern.name + FORM_TAGS.get(op.plan.form, "")
                log(f"    {layer.label:34s} {tile:28s} {ms['int8']:8.3f} {ms['f32']:8.3f} "
                    f"{secs['f32'] / secs['int8']:8.2f} "
                    + (f"{ms['ORT']:8.3f} {ms['OV']:8.3f} {secs['int8'] / best:9.2f} {diff:8d} "
                       f"{peer_diff['ORT']:>5d}/{peer_diff['OV']:<5d}" if engines else ""))
                rows.append({"layer": layer.label, "threads": threads, "count": layer.count, "kernel": op.plan.kern.name,
                             "form": op.plan.form, "seconds": secs, "max_diff_steps": diff, "peer_diff_steps": peer_diff})
            _summary(rows, log)
            out["layers"] += rows
    finally:
        tmp.cleanup()
    return out


def _quick(call) -> float:
    import time

    call()
    t = time.perf_counter()
    call()
    return time.perf_counter() - t


def _summary(rows: list[dict], log) -> None:
    """Weighted totals (each layer times its count in the network) and the per-layer ratios."""
    tot = {k: sum(r["seconds"][k] * r["count"] for r in rows) for k in rows[0]["seconds"]}
    ratios = [r["seconds"]["f32"] / r["seconds"]["int8"] for r in rows]
    line = (f"    weighted total: int8 {1e3 * tot['int8']:.2f} ms, f32 {1e3 * tot['f32']:.2f} ms "
            f"(f32/int8 {tot['f32'] / tot['int8']:.2f}; per layer min {min(ratios):.2f}, "
            f"geo-mean {float(np.exp(np.mean(np.log(ratios)))):.2f})")
    if "ORT" in tot:
        best = min(tot["ORT"], tot["OV"])
        line += (f"; ORT {1e3 * tot['ORT']:.2f} ms, OV {1e3 * tot['OV']:.2f} ms, int8/best peer "
                 f"{tot['int8'] / best:.2f}")
    log(line)


# ---------------------------------------------------------------------------------------------
# Whole networks: `bench resnet50 --int8 [--reduce-range]`, and `bench model SOURCE --int8` (model.run_int8)


# What quantize's QDQ models hold, as the log line says it; reduce_range: 7-bit weights, as ONNX Runtime
# recommends on x86 without VNNI, where u8 x s8 pair sums then fit vpmaddubsw's 16 bits unsaturated.
QUANTIZATION = {False: "per-channel int8 weights (default: 8-bit, [-127, 127]), uint8 activations",
                True: "per-channel int8 weights (reduce_range: 7-bit, [-64, 64]), uint8 activations"}


def quantize(fp32: str, path: str, shape: tuple, reduce_range: bool = False, calibration: int = 8,
             seed: int = 0) -> str:
    """The float32 ONNX model at `fp32` quantized by onnxruntime.quantization.quantize_static into
    `path`: QDQ format, per-channel int8 weights (7-bit with reduce_range), uint8 activations,
    calibrated on `calibration` random seeded inputs of `shape` fed to the model's first input."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    name = first_input(onnx.load(fp32, load_external_data=False)).name
    rng = np.random.default_rng(seed)
    batches = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(calibration)])

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(batches, None)

    quantize_static(fp32, path, Reader(), quant_format=QuantFormat.QDQ, per_channel=True, reduce_range=reduce_range,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return path


def qdq_network(name: str, path: str, reduce_range: bool = False, seed: int = 0) -> tuple[str, tuple]:
    """The PyTorch module as a user writes it (models/torch_style.py, BatchNorm kept), exported to
    ONNX beside `path`, then quantized into `path` (quantize). Returns (path, the input shape)."""
    from models import torch_style

    shape = (1, 3, 224, 224)
    fp32 = peers.export(torch_style.build(name, seed), shape, os.path.join(os.path.dirname(path), "fp32.onnx"))
    return quantize(fp32, path, shape, reduce_range, seed=seed), shape


def run_network(name: str, thread_counts, repeat: int, log, target: str = "native", samples: int = 100,
                reduce_range: bool = False, make=None) -> dict:
    """Ours (the QDQ model through tvm.relax.frontend.onnx and schedules.relax.build) against ONNX
    Runtime and OpenVINO on the same QDQ model: latency per thread count, engines taking turns,
    and the outputs compared on `samples` random images (largest difference, top-1 agreement).
    make(path, reduce_range) writes the QDQ model to path and returns (path, input shape); by
    default qdq_network of the torch_style network `name` (bench model: its SOURCE, model.run_int8)."""
    import onnx
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    from schedules.relax import build

    for why in (w for w in map(peers.missing, peers.NEEDS) if w):
        raise RuntimeError(why)
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)  # not a warning per unused initializer the quantizer left
    tmp = tempfile.TemporaryDirectory(prefix="mk-int8-net-")
    out = {"model": name, "rows": [], "quantization": {"reduce_range": reduce_range, "weight_bits": 7 if reduce_range
                                                        else 8, "description": QUANTIZATION[reduce_range]}}
    make = make or (lambda path, reduce_range: qdq_network(name, path, reduce_range))
    try:
        path, shape = make(os.path.join(tmp.name, "qdq.onnx"), reduce_range)
        model = onnx.load(path)
        mod = from_onnx(model, shape_dict={first_input(model).name: shape}, keep_params_in_input=False)
        report: list = []
        vm = relax.VirtualMachine(build(mod, target, report=report), tvm.cpu())
        convs = [r for r in report if r.get("op") in ("qconv2d", "qdense")]
        ours_n = sum(r["runs_on"] == "ours" for r in convs)
        log(f"{name}, QDQ (quantize_static: {QUANTIZATION[reduce_range]}): {ours_n} of {len(convs)} "
            f"quantized convs and fully connected layers on our int8 conv2d")
        for r in convs:
            if r["runs_on"] != "ours":
                log(f"  left to TVM: {r['data']} {r['weight']}: {r['reason']}")
        rest = [r for r in report if r.get("op") not in ("qconv2d", "qdense") and r.get("runs_on") == "tvm"]
        log(f"  other ops left on TVM's default lowering: {len(rest)}"
            + (f" ({', '.join(sorted({r['op'] for r in rest}))})" if rest else ""))
        rng = np.random.default_rng(1)
        x = rng.standard_normal(shape).astype(np.float32)
        crashed = peers.crashes("OpenVINO", path, shape)  # OpenVINO 2026.4 segfaults on some QDQ models
        if crashed:
            log(f"  {crashed}")
            out["skipped"] = [crashed]
        for threads in thread_counts:
            set_threads(threads)
            engines = {"ORT": peers.onnx_runtime(path, x, threads)}
            if not crashed:
                engines["OV"] = peers.openvino(path, x, threads)
            xt = tvm.runtime.tensor(x)
            turns = {"ours": lambda xt=xt: vm["main"](xt), **{k: e.run for k, e in engines.items()}}
            secs = take_turns(turns, threads, 3, repeat, 0.5, ("ours",), ROUNDS)
            best = min(secs[k] for k in engines)
            log(f"  {threads} thread(s): ours {1e3 * secs['ours']:.2f} ms, "
                + ", ".join(f"{k} {1e3 * secs[k]:.2f} ms" for k in engines)
                + f"; ours/best peer {secs['ours'] / best:.2f}")
            row = {"threads": threads, "seconds": secs, "ms": {k: 1e3 * v for k, v in secs.items()}}
            time.sleep(0.5)
            network.log_breakdown(network.profile(vm, xt), row, log)
            out["rows"].append(row)
        found = _agreement(vm, path, shape, samples, with_openvino=not crashed)
        log(f"  outputs on {samples} random images (top-1 agreement, largest logit difference); reference: the "
            "QDQ graph as written, run by ORT with its optimizations off:")
        log("    " + "; ".join(f"{a} vs {b} {v['agree']}/{samples}, {v['diff']:.4f}" for (a, b), v in found.items()))
        out.update({"top1_agreement": found["ours", "ORT"]["agree"], "samples": samples,
                    "max_abs_diff": found["ours", "ORT"]["diff"],
                    "agreement": {f"{a} vs {b}": v for (a, b), v in found.items()}, "report": report})
    finally:
        tmp.cleanup()
    return out


def _agreement(vm, path: str, shape: tuple, samples: int, with_openvino: bool = True) -> dict:
    """Top-1 agreement and largest logit difference on `samples` random images: ours against
    ONNX Runtime's int8 session ("ORT") and against ORT running the graph as written,
    optimizations off ("reference": DequantizeLinear, float Conv, QuantizeLinear); and each
    peer's int8 session against that reference ("ORT vs reference", "OV vs reference"). They
    differ where a peer's int8 kernel is not exact: without VNNI, ORT's and oneDNN's u8s8
    (vpmaddubsw) saturates 16-bit pair sums."""
    import tvm

    x = np.zeros(shape, np.float32)  # the engines read this array at each run
    engines = {"ORT": peers.onnx_runtime(path, x, 1).run, "reference": peers.onnx_runtime(path, x, 1, optimize=False).run}
    pairs = [("ours", "ORT"), ("ours", "reference"), ("ORT", "reference")]
    if with_openvino:
        engines["OV"] = peers.openvino(path, x, 1).run
        pairs.append(("OV", "reference"))
    rng = np.random.default_rng(2)
    found = {p: {"agree": 0, "diff": 0.0} for p in pairs}
    for _ in range(samples):
        x[...] = rng.standard_normal(shape)
        got = vm["main"](tvm.runtime.tensor(x))
        outs = {"ours": (got if hasattr(got, "numpy") else got[0]).numpy(), **{k: run() for k, run in engines.items()}}
        for a, b in pairs:
            found[a, b]["agree"] += int(outs[a].argmax() == outs[b].argmax())
            found[a, b]["diff"] = max(found[a, b]["diff"], float(np.abs(outs[a] - outs[b]).max()))
    return found
