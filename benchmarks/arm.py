"""`bench arm`: static MACs per cycle of the ARM int8 code, from llvm-mca (no ARM hardware here).

For each target and core model, four hot loops, all compiled by TVM here for that target:
  tile      the micro-kernel's K loop, in the smallest module that tensorizes it
  conv      our int8 conv2d (spatial pack, tensorized on the tile): its hottest loop
  vec       baseline (b): the same conv and tiling with `vectorize` instead of `tensorize`, so
            LLVM picks the instructions (the best plain-TIR schedule we have)
  plain     baseline (a): the same int8 conv as a plain TE compute, no schedule
A last line per target covers depthwise (a 64-channel 28x28 3x3 layer, not in ResNet-50): its
vector path (channels in lanes, one vmlal.s16/smlal per 8 channels and tap) against what the
GEMM path would do with it, the tile's rate times its useful fraction (each group padded to a
tile's channels and outputs).
"conv %bound": our conv's hot loop against its own resource bound (llvm-mca's Block
RThroughput: the cycles the busiest port needs): 100% means no instruction choice or order can
make that loop faster on that model, only fewer instructions on the bottleneck port.
MAC/cycle = products per loop iteration (vector lanes counted) / llvm-mca's cycles per
iteration in steady state. It ignores everything outside the hot loop (packing, tile setup,
cache misses), so it bounds what the loop can reach, not what a layer will.
"""

from __future__ import annotations

import tvm
from tvm import te

from intrinsics.tile_module import mac_tile_module
from microkernels import ARM_ISAS, asm, mca
from microkernels.int_mac import default_mac_kernel
from schedules.conv import ConvParams, Geometry
from schedules.conv import int8 as conv2d_int8

TARGETS = {"armv7-neon": "neon", "aarch64-neon": "aarch64", "aarch64-dotprod": "aarch64dot"}
# The dot-product kernel needs an ARMv8.2 core model; cortex-a55 is the in-order one that has it.
MODELS = {"neon": ("cortex-a57",), "aarch64": ("cortex-a53", "cortex-a72"), "aarch64dot": ("cortex-a55",)}
MATTR = {"aarch64dot": "+dotprod"}
ZP_X, ZP_W = 3, -2  # any non-zero points: they must not change the hot loop


def plain_module(g, zp_x: int, zp_w: int):
    """Baseline (a): int8 in, int32 out, zero points subtracted in the sum, no schedule."""
    t, left, b, r = g.pad
    (sh, sw), (dh, dw) = g.stride, g.dilation
    oh, ow = g.out_hw
    D = te.placeholder((g.n, g.c, g.h, g.w), "int8", name="D")
    W = te.placeholder((g.o, g.cg, g.kh, g.kw), "int8", name="W")
    P = te.compute((g.n, g.c, g.h + t + b, g.w + left + r), lambda n, c, y, x: te.if_then_else(
        te.all(y >= t, y < t + g.h, x >= left, x < left + g.w), D[n, c, y - t, x - left], tvm.tirx.const(zp_x, "int8")),
        name="P")
    rc, ry, rx = te.reduce_axis((0, g.cg), "rc"), te.reduce_axis((0, g.kh), "ry"), te.reduce_axis((0, g.kw), "rx")
    out = te.compute((g.n, g.o, oh, ow), lambda n, o, y, x: te.sum(
        (P[n, o // g.og * g.cg + rc, y * sh + ry * dh, x * sw + rx * dw].astype("int32") - zp_x)
        * (W[o, rc, ry, rx].astype("int32") - zp_w), axis=[rc, ry, rx]), name="conv")
    return tvm.IRModule({"main": te.create_prim_func([D, W, out])})


def hot_loop(mod, isa):
    """The hottest loop of `mod` compiled for `isa`."""
    text = tvm.compile(mod, target=isa.target).mod.inspect_source("asm")
    return asm.hot_loop(asm.compute_function(text), isa.arch)


def mac_rate(lp, isa_name: str, cpu: str) -> float:
    """Products per cycle of `lp` in steady state on llvm-mca's model of `cpu`."""
    return asm.loop_macs(lp) / mca.cycles_per_iteration(lp, cpu, MATTR.get(isa_name, ""))


def run(layers, log) -> dict:
    result = {"rows": []}
    log("bench arm: llvm-mca steady-state MAC/cycle of each hot loop (products per iteration / cycles per iteration)")
    log(f"{'target':16} {'model':11} {'layer':34} {'tile':>6} {'conv':>6} {'vec(b)':>7} {'plain(a)':>8} {'conv/b':>7} {'conv/a':>7}"
        f" {'conv %bound':>11}")
    for target, isa_name in TARGETS.items():
        isa = ARM_ISAS[isa_name]
        kern = default_mac_kernel(isa_name)
        tile = hot_loop(mac_tile_module(kern, 16 * kern.k_step), isa)
        tile_rate = {cpu: mac_rate(tile, isa_name, cpu) for cpu in MODELS[isa_name]}
        for layer in layers:
            g = Geometry.of(ConvParams((1, layer.c, layer.h, layer.w), (layer.o, layer.c, layer.k, layer.k), layer.stride,
                                    layer.pad), block=conv2d_int8.conv_kernel(isa).nr)
            loops = {"conv": hot_loop(conv2d_int8.build(g, isa, "int8", ZP_X)[0], isa),
                     "vec": hot_loop(conv2d_int8.build(g, isa, "int8", ZP_X, tensorize=False)[0], isa),
                     "plain": hot_loop(plain_module(g, ZP_X, ZP_W), isa)}
            for cpu in MODELS[isa_name]:
                rate = {"tile": tile_rate[cpu], **{name: mac_rate(lp, isa_name, cpu) for name, lp in loops.items()}}
                cycles, bound = mca.analyze(loops["conv"], cpu, MATTR.get(isa_name, ""))
                row = {"target": target, "model": cpu, "layer": layer.label, "row": layer.row,
                       "tile_kernel": kern.name, **{f"{k}_mac_per_cycle": v for k, v in rate.items()},
                       "conv_fraction_of_bound": bound / cycles}
                result["rows"].append(row)
                log(f"{target:16} {cpu:11} {layer.row:2} {layer.label:31} {rate['tile']:6.2f} {rate['conv']:6.2f} "
                    f"{rate['vec']:7.2f} {rate['plain']:8.2f} {rate['conv'] / rate['vec']:7.2f} {rate['conv'] / rate['plain']:7.2f}"
                    f" {100 * bound / cycles:10.0f}%")
        dw_geometry = Geometry.of(ConvParams((1, 64, 28, 28), (64, 1, 3, 3), 1, 1, 1, 64), block=kern.nr)
        dw = hot_loop(conv2d_int8.build(dw_geometry, isa, "int8", ZP_X)[0], isa)
        gemm_plan = conv2d_int8.Int8Plan(dw_geometry, conv2d_int8.conv_kernel(isa), False)
        useful = 1 / (gemm_plan.cp * gemm_plan.op)  # one channel in, one out, per group
        for cpu in MODELS[isa_name]:
            rate, gemm = mac_rate(dw, isa_name, cpu), tile_rate[cpu] * useful
            result["rows"].append({"target": target, "model": cpu, "layer": "depthwise 64x28x28 k3",
                                   "depthwise_mac_per_cycle": rate, "gemm_path_useful_mac_per_cycle": gemm})
            log(f"{target:16} {cpu:11}    depthwise 64x28x28 k3 s1 p1     vector path {rate:5.2f}, "
                f"GEMM path useful {gemm:5.2f} ({useful:.3f} of its MACs)")
    return result
