"""Command line: `python -m microkernels bench gemm|conv2d|arm|accuracy|resnet50|mobilenet_v2|resnext50|model|zoo
[...]`,
`tune`, `regen-asm`, `check-tools`."""

from __future__ import annotations

import argparse
import json
import os
import sys


def _parse_size(text: str) -> tuple[int, int, int]:
    parts = [int(p) for p in text.lower().split("x")]
    if len(parts) == 1:
        parts *= 3
    if len(parts) != 3 or min(parts) < 1:
        raise argparse.ArgumentTypeError(f"size must be N or MxNxK with positive ints, got {text!r}")
    return tuple(parts)


def _parse_layer(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"a layer is CxHW with positive ints (channels x map side), got {text!r}")
    return int(parts[0]), int(parts[1])


def _parse_image(text: str) -> tuple[int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"an image shape is CxHxW with positive ints, e.g. 3x224x224, got {text!r}")
    return tuple(int(p) for p in parts)


def _add_workloads(parser) -> None:
    parser.add_argument("--workloads", default=None,
                        help="a packaged table's name (default resnet50_v1.5) or a CSV file's path")


def _add_reduce_range(parser) -> None:
    parser.add_argument("--reduce-range", action="store_true",
                        help="with --int8: quantize_static(..., reduce_range=True), 7-bit weights ([-64, 64]), what "
                             "ONNX Runtime recommends on x86 without VNNI (default: the full 8-bit range)")


def check_tools() -> int:
    """One line per tool the ARM tests and `bench arm` need; 1 if any of them fails."""
    import shutil

    from microkernels import mca
    from schedules.emulation import qemu

    failed = 0
    for arch, tc in qemu.ARCHES.items():
        problem = qemu.toolchain_problem(arch)
        failed |= problem is not None
        print(f"{arch}: {problem or f'ok ({tc.gcc} -static, run under {tc.qemu})'}")
    where = shutil.which(mca.TOOL)
    failed |= where is None
    print(f"{mca.TOOL}: {f'ok ({where})' if where else 'not found on PATH (Debian package llvm)'}")
    return int(failed)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m microkernels")
    sub = p.add_subparsers(dest="cmd", required=True)
    bench = sub.add_parser("bench", help="measure kernels and operators")
    bsub = bench.add_subparsers(dest="what", required=True)
    g = bsub.add_parser("gemm", help="FMA peak, L1 tile, matmul vs numpy")
    g.add_argument("--target", default="native", help="x86-avx512, x86-avx2 or native")
    g.add_argument("--sizes", nargs="+", type=_parse_size, default=None,
                   help="M[xNxK] sizes (default: benchmarks.gemm.SIZES, squares and conv-shaped GEMMs)")
    g.add_argument("--threads", nargs="+", type=int, default=None, help="thread counts (default: 1 and all cores)")
    g.add_argument("--repeat", type=int, default=7)
    g.add_argument("--sweep", action="store_true", help="also time every register-budget tile shape")
    g.add_argument("--breakdown", action="store_true",
                   help="also time each phase of every matmul: pack A, pack B, the tiles, the rest")
    g.add_argument("--exhaustive", action="store_true",
                   help="also time every matmul tile forced on each size, and print how far the chosen one is from "
                        "the fastest")
    g.add_argument("--int8", action="store_true",
                   help="the integer tiles instead: per integer ISA the host runs, the measured vpdpbusd (or vpmaddwd) "
                        "peak and the L1-resident tile rate (with --sweep, every budget tile)")
    g.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    g.add_argument("--plot", metavar="FILE.png", help="also draw the matmuls on a roofline and ours/numpy (the plot extra)")
    c = bsub.add_parser("conv2d", help="ResNet-50 conv layers vs PyTorch (oneDNN)")
    c.add_argument("--target", default="native", help="x86-avx512, x86-avx2 or native")
    _add_workloads(c)
    c.add_argument("--layers", nargs="+", type=int, default=None, help="only these rows of the CSV (0-based)")
    c.add_argument("--threads", nargs="+", type=int, default=None, help="thread counts (default: 1 and all cores)")
    c.add_argument("--cache", nargs="+", choices=["warm", "cold", "network"], default=["warm", "cold"],
                   help="warm: the same call again; cold: caches flushed before each call; network: flushed, then the "
                        "input read back (a layer inside a network at batch 1: what autotune and tune time)")
    c.add_argument("--algorithms", nargs="+", choices=["direct", "auto", "wino2", "wino4", "wino6"],
                   default=["direct"], help="timed side by side per layer (direct always); auto is conv2d's "
                   "default choice; Winograd F(m) only where it applies (3x3, stride 1)")
    c.add_argument("--exhaustive", action="store_true",
                   help="time direct and every Winograd tile on each layer, and print how far algorithm='auto' "
                        "(the shipped rule, or `tune`'s measurements) is from the fastest")
    c.add_argument("--path", choices=["kernel", "blocked", "nchw", "bound"], default="kernel",
                   help="what of ours is timed: the kernel on blocked TVM tensors, run_blocked on numpy, op(x, w) on "
                        "NCHW arrays, or op.bind(w) then f(x)")
    c.add_argument("--dtype", choices=["float32", "int8"], default="float32",
                   help="int8: each layer quantized (uint8 x int8 -> uint8) on our int8 conv2d beside our float32 one, "
                        "ONNX Runtime and OpenVINO on a one-layer QDQ model (target: native, x86-avx512vnni, "
                        "x86-avxvnni, x86-avx512 or x86-avx2 for the upcast)")
    c.add_argument("--reduce-range", action="store_true",
                   help="with --dtype int8: 7-bit weights ([-64, 64], as quantize_static(reduce_range=True) writes "
                        "them) for every engine, ours told so (weight_bits=7: the exact vpmaddubsw tile without VNNI)")
    c.add_argument("--layout", choices=["NCHW", "NHWC"], default="NCHW",
                   help="with --dtype int8: our layers' data and output layout (NHWC: channels-last, as the QDQ "
                        "networks run them); the peers take the NCHW QDQ model either way")
    c.add_argument("--repeat", type=int, default=7)
    c.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    c.add_argument("--plot", metavar="FILE.png", help="also draw the layers on a roofline and ours/PyTorch (the plot extra)")
    a = bsub.add_parser("arm", help="static MAC/cycle of the ARM int8 kernels and conv (llvm-mca)")
    _add_workloads(a)
    a.add_argument("--layers", nargs="+", type=int, default=[2, 10, 15], help="rows of the CSV (0-based)")
    a.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    acc = bsub.add_parser("accuracy", help="float32 error of direct and Winograd conv2d against float64")
    acc.add_argument("--target", default="native", help="x86-avx512, x86-avx2 or native")
    acc.add_argument("--channels", nargs="+", type=int, default=[16, 64, 256, 512])
    acc.add_argument("--size", type=int, default=12, help="height and width of the layer")
    acc.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    comp = bsub.add_parser("compile", help="seconds of optimize + compile per network, the compile cache off, cold, "
                                           "with its layers, and with the model cached")
    comp.add_argument("--target", default="native", help="x86-avx512, x86-avx2 or native")
    comp.add_argument("--models", nargs="+", choices=["resnet50", "mobilenet_v2", "resnext50"],
                      default=["resnet50", "mobilenet_v2"])
    comp.add_argument("--style", choices=["folded", "user"], default="folded",
                      help="folded: models/' network; user: the PyTorch module through torch.export")
    comp.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    for model, title in (("resnet50", "ResNet-50"), ("mobilenet_v2", "MobileNetV2"), ("resnext50", "ResNeXt-50 32x4d")):
        r = bsub.add_parser(model, help=f"whole {title} (Relax, our conv2d) vs PyTorch, TVM's default build, "
                                        "ONNX Runtime and OpenVINO (--peers)")
        r.add_argument("--target", default="native", help="x86-avx512, x86-avx2 or native")
        r.add_argument("--threads", nargs="+", type=int, default=None, help="thread counts (default: 1 and all cores)")
        r.add_argument("--repeat", type=int, default=10)
        r.add_argument("--style", choices=["folded", "user", "both"], default="folded",
                       help="folded: models/' network, batch norm folded by hand; user: models/torch_style.py's "
                            "PyTorch module (Conv2d + BatchNorm2d) through torch.export and TVM's torch frontend")
        r.add_argument("--peers", action="store_true",
                       help="also ONNX Runtime and OpenVINO on the module's ONNX export (pip install -e \".[peers]\")")
        r.add_argument("--batch", nargs="+", type=int, default=[1], metavar="N", help="batch sizes (default 1)")
        r.add_argument("--int8", action="store_true",
                       help="the model quantized by onnxruntime.quantization.quantize_static (QDQ, per-channel int8 "
                            "weights) from models/torch_style.py's module: ours (TVM's ONNX frontend, "
                            "schedules.relax.build) against ONNX Runtime and OpenVINO on the same QDQ model")
        _add_reduce_range(r)
        r.add_argument("--autotune", action="store_true",
                       help="also build with optimize(autotune=True) (each conv layer's plans timed on this host) and "
                            "time it beside ours on the shipped rules alone")
        r.add_argument("--default", dest="tvm_default", action=argparse.BooleanOptionalAction,
                       default=None, help="time TVM's default build of the folded module, slow to build and run "
                                          "(default: yes, no with --peers)")
        r.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
        r.add_argument("--plot", metavar="FILE.png", help="also draw each engine's time per row (the plot extra)")
    m = bsub.add_parser("model", help="any model (an ONNX file, torchvision:NAME, timm:NAME) vs ONNX Runtime, "
                                      "OpenVINO (--peers) and PyTorch eager")
    m.add_argument("source", help="an ONNX file's path, torchvision:NAME or timm:NAME (random seeded weights; "
                                  "the zoo extra: pip install -e \".[zoo]\")")
    m.add_argument("--batch", type=int, default=1, metavar="N", help="batch size (default 1)")
    m.add_argument("--shape", type=_parse_image, default=None, metavar="CxHxW",
                   help="the image's shape (default: the model's own, 3x224x224 for most)")
    m.add_argument("--first-call", action="store_true",
                   help="only build ours and time its first call, printed as one JSON line (bench zoo --first-calls)")
    m.add_argument("--plot", metavar="FILE.png", help="also draw each engine's time per thread count (the plot extra)")
    m.add_argument("--int8", action="store_true",
                   help="the model's float32 ONNX (the file, or the torch module's export) quantized by "
                        "onnxruntime.quantization.quantize_static (QDQ, per-channel int8 weights, uint8 activations, "
                        "8 seeded random images): ours against ONNX Runtime and OpenVINO on the QDQ file, as "
                        "`bench resnet50 --int8` does; always against the peers (--peers implied, the peers extra)")
    _add_reduce_range(m)
    z = bsub.add_parser("zoo", help="bench model over a list of torchvision/timm classifiers: one table, the "
                                    "geo-mean and the worst ratio")
    z.add_argument("--models", nargs="+", default=None, metavar="SOURCE",
                   help="model sources (default: benchmarks.zoo.DEFAULT, 13 classifiers of different families)")
    z.add_argument("--first-calls", action="store_true",
                   help="also each model's first call in new processes, cold (empty compile cache) and cached")
    for cmd in (m, z):
        cmd.add_argument("--target", default="native", help="x86-avx512, x86-avx2 or native")
        cmd.add_argument("--threads", nargs="+", type=int, default=None, help="thread counts (default: 1 and all cores)")
        cmd.add_argument("--repeat", type=int, default=10)
        cmd.add_argument("--peers", action="store_true",
                         help="also ONNX Runtime and OpenVINO (pip install -e \".[peers]\")")
        cmd.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    t = sub.add_parser("tune", help="measure this host for the planners (tile rates, pack cost, Winograd "
                                    "against direct) and write schedules/common/tuned.py's file")
    t.add_argument("--target", default="native", help="x86-avx512, x86-avx2 or native")
    t.add_argument("--quick", action="store_true", help="ResNet-50's four 3x3 shapes only, fewer rounds "
                                                        "(about a minute; the full grid takes a few)")
    t.add_argument("--layers", nargs="+", type=_parse_layer, default=None, metavar="CxHW",
                   help="3x3 layers to time for the Winograd choice instead of the grid, e.g. 64x56 (channels x side)")
    t.add_argument("--autotune", nargs="+", default=None, metavar="TABLE",
                   help="also autotune every layer of these workload tables (e.g. resnet50_v1.5 mobilenet_v2) at 1 "
                        "thread and all cores, as conv2d(..., autotune=True) does")
    t.add_argument("--output", metavar="FILE", default=None,
                   help="where to write (default: $TVM_MICROKERNELS_TUNE, else tuned.json in the cache folder)")
    sub.add_parser("regen-asm", help="rewrite asm_dumps/ from the current kernels")
    sub.add_parser("check-tools", help="self-check the ARM cross toolchains, qemu-user and llvm-mca")
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if getattr(args, "reduce_range", False) and not (getattr(args, "int8", False) or getattr(args, "dtype", "") == "int8"):
        p.error("--reduce-range quantizes the int8 model: add --int8 (bench conv2d: --dtype int8)")
    if getattr(args, "int8", False) and getattr(args, "first_call", False):
        p.error("--first-call times the float32 build alone: drop --int8 or --first-call")

    if args.cmd == "regen-asm":
        from intrinsics import golden as tile_golden
        from schedules import golden as conv_golden

        for path in tile_golden.regenerate() + conv_golden.regenerate():
            print(f"wrote {path}")
        return 0

    if args.cmd == "check-tools":
        return check_tools()

    def log(line):
        print(line, flush=True)

    if getattr(args, "what", None) == "arm":
        from benchmarks import arm, conv2d

        layers = conv2d.load_workloads(args.workloads or conv2d.DEFAULT_WORKLOADS)
        result = arm.run([layers[i] for i in args.layers], log)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
        return 0

    from benchmarks import host
    from schedules.common.targets import resolve, set_threads

    if getattr(args, "plot", None):
        from benchmarks import plot

        plot.require_matplotlib()  # before the run, not after minutes of timing
    log(host.describe())

    isa = resolve(args.target)
    if args.cmd == "tune":
        from pathlib import Path

        from benchmarks import conv2d, tune
        from schedules.common import tuned

        for table in args.autotune or ():
            conv2d.load_workloads(table)  # a wrong name fails now, not after the measurements
        where = Path(args.output) if args.output else None
        tune.run(isa, args.quick, log, where, args.layers)
        if args.autotune:
            if where is not None:  # the layers' entries go where the rest went
                os.environ[tuned.ENV] = str(where)
            tune.autotune_tables(isa, args.autotune, log)
        return 0
    threads = getattr(args, "threads", None) or sorted({1, os.cpu_count() or 1})

    from benchmarks import gemm

    if args.what in ("model", "zoo"):
        from benchmarks import model, zoo

        if args.what == "model" and args.first_call:
            print(model.FIRST_CALL + json.dumps(model.first_call(args.source, threads[-1], args.target)), flush=True)
            return 0
        if args.what == "model" and args.int8:
            result = model.run_int8(args.source, threads, log, args.batch, args.shape, args.repeat, args.target,
                                    args.reduce_range)
        elif args.what == "model":
            result = model.run(args.source, threads, log, args.batch, args.shape, args.peers, args.repeat, args.target)
        else:
            models = args.models or list(zoo.DEFAULT)
            result = model.run_zoo(models, threads, log, args.peers, args.repeat, args.target)
            if args.first_calls:
                result["first_calls"] = model.first_calls(models, threads[-1], log, args.target)
    elif args.what in ("resnet50", "mobilenet_v2", "resnext50"):
        from benchmarks import network

        if args.int8:
            from benchmarks import int8

            result = int8.run_network(args.what, threads, args.repeat, log, args.target,
                                      reduce_range=args.reduce_range)
        else:
            default_tvm = not args.peers if args.tvm_default is None else args.tvm_default
            result = network.run(isa, threads, args.repeat, log, default_tvm=default_tvm, model=args.what,
                                 style=args.style, peers=args.peers, batches=args.batch, autotune=args.autotune)
    elif args.what == "compile":
        from benchmarks import compile as compile_bench

        result = compile_bench.run(args.models, args.style, args.target, log)
    elif args.what == "accuracy":
        from benchmarks import accuracy

        result = accuracy.run(isa, args.channels, args.size, log)
    elif args.what == "conv2d":
        from benchmarks import conv2d

        layers = conv2d.load_workloads(args.workloads or conv2d.DEFAULT_WORKLOADS)
        if args.layers:
            layers = [layers[i] for i in args.layers]
        if args.dtype == "int8":
            from benchmarks import int8

            result = int8.run(layers, threads, args.repeat, log, args.target, args.layout, args.reduce_range)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(result, f, indent=2)
            return 0
        set_threads(1)
        peak1 = gemm.measure_peak(isa)
        log(f"ISA {isa.name}: measured FP32 FMA peak, 1 thread: {peak1:.1f} GFLOP/s")
        result = conv2d.run(isa, layers, threads, args.repeat, args.cache, peak1, log, args.algorithms, args.path,
                            args.exhaustive)
    elif args.int8:
        from microkernels import X86_INT_ISAS

        runs = [i for i in X86_INT_ISAS.values() if i.host_supports()]
        log(f"integer ISAs this host runs: {', '.join(i.name for i in runs)}"
            f" (not: {', '.join(i.name for i in X86_INT_ISAS.values() if i not in runs) or 'none'})")
        result = gemm.run_int(runs, log, args.sweep)
    else:
        result = gemm.run(isa, args.sizes or gemm.SIZES, threads, args.repeat, args.sweep, log, args.breakdown,
                          args.exhaustive)
    if args.json:
        with open(args.json, "w") as f:  # the int8 networks' op report: in the log already, not JSON
            json.dump({k: v for k, v in result.items() if k != "report"}, f, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    if getattr(args, "plot", None):
        _plot(args, result, threads, log)
    return 0


def _plot(args, result: dict, threads: list[int], log) -> None:
    from benchmarks import host, plot
    from schedules.common.targets import resolve

    title = f"{host.cpu_name()}, {result.get('isa') or resolve(args.target).name}"
    if args.what in ("conv2d", "gemm"):
        bandwidth = {t: plot.measure_bandwidth(t) for t in threads}
        for t, bw in bandwidth.items():
            log(f"read bandwidth, {t} thread(s): {bw:.1f} GB/s (the roofline's sloped line)")
        result["read_bandwidth_gbs"] = bandwidth
        if args.what == "conv2d":
            fig = plot.conv2d_figure(result, bandwidth, f"{title}: conv2d, {args.workloads or 'resnet50_v1.5'}")
        else:
            fig = plot.gemm_figure(result, bandwidth, title)
    else:
        model = result["model"] + (f", input {'x'.join(map(str, result['input']))}" if "input" in result else "")
        fig = plot.network_figure(result, f"{title}: {model}")
    plot.save(fig, args.plot)
    print(f"wrote {args.plot}", file=sys.stderr)
