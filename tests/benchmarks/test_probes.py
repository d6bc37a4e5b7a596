"""The bench's probes measure what they claim: the load+FMA peak kernel computes its chains and
loads each multiplier inside its loop, and the depthwise hot-loop probe cannot run faster than
that bound (it did, 4.5x, while LLVM hoisted a short row's FMAs out of the probe's loop)."""

import numpy as np
import pytest

from benchmarks.conv2d import dw_loop_gflops, load_workloads
from benchmarks.gemm import compile_peak, measure_peak
from microkernels import X86_INT_ISAS, FmaPeakKernel, asm
from microkernels.f32_fma_peak import SLOTS
from microkernels.int_dot_peak import DotPeakKernel
from microkernels.isa import best_host_isa

from ..x86_exec import X86, X86_IDS, compile_target, execute, how


@pytest.mark.parametrize("isa", X86, ids=X86_IDS)
def test_load_peak_kernel_uses_a_fresh_multiplier_each_iteration(isa):
    kern, iters = FmaPeakKernel(isa, loads=True), 11
    lanes, chains = isa.lanes, kern.chains
    rng = np.random.default_rng(1)
    io = rng.uniform(0.5, 1.0, kern.io_floats).astype(np.float32)
    got, = execute(compile_peak(kern, iters), isa, [io], [0])
    ad = io[lanes:2 * lanes].astype(np.float64)
    y = io[2 * lanes:(2 + chains) * lanes].reshape(chains, lanes).astype(np.float64)
    mult = io[(2 + chains) * lanes:].reshape(SLOTS, chains, lanes).astype(np.float64)
    for it in range(iters):
        y = y * mult[it % SLOTS] + ad
    np.testing.assert_allclose(got[2 * lanes:(2 + chains) * lanes].reshape(chains, lanes), y, rtol=1e-5)


@pytest.mark.parametrize("isa", X86, ids=lambda isa: isa.name)
def test_load_peak_loop_is_one_memory_operand_fma_per_chain(isa):
    kern = FmaPeakKernel(isa, loads=True)
    fn = compile_peak(kern, 100).mod.inspect_source("asm")  # no parallel loop: one function
    loops = asm.fma_loops(fn)
    assert len(loops) == 1, [lp.body for lp in loops]
    fmas = [ins for ins in loops[0].body if ins.startswith("vfmadd")]
    assert len(fmas) == kern.chains and all("(" in ins for ins in fmas), fmas
    reg = "zmm" if isa.name == "avx512" else "ymm"
    assert all(f"%{reg}" in ins for ins in fmas), fmas


def test_depthwise_loop_probe_is_not_faster_than_its_bound():
    """Short rows (7 pixels: one unrolled step) and long ones. A probe that measured nothing ran
    at 450% of the bound; the ceiling is 2.5x. The bound (one memory-operand FMA per chain) is
    not a hard one: on the Xeon model 207 it measured 113 GFLOP/s and the 32x112x112 loop, which
    reuses each loaded row across taps, 172-219 (1.5-1.9x); 1.5x failed there. Noise slows either
    measurement: where the probe looks too fast, the bound is measured again and the best counts."""
    isa = best_host_isa()

    def peak() -> float:
        return max(measure_peak(isa, loads=True) for _ in range(3))

    bound = peak()
    layers = [layer for layer in load_workloads("mobilenet_v2") if layer.kind == "depthwise"]
    for layer in (layers[-1], layers[-2], layers[0]):  # 960x7x7 s1, 576x14x14 s2 (7 wide), 32x112x112
        g = dw_loop_gflops(isa, layer, calls=500, repeat=3)
        if g >= 2.5 * bound:
            bound = max(bound, peak(), peak())
        assert 0 < g < 2.5 * bound, f"{layer.label}: {g:.0f} GFLOP/s against a bound of {bound:.0f}"


@pytest.mark.parametrize("isa", X86_INT_ISAS.values(), ids=how)
def test_integer_peak_kernel_computes_its_chains(isa):
    """Each chain is y <- y + dot(m, ad) (vpdpbusd: 4 u8 x s8 products per lane) or
    y <- pmaddwd(y as int16 pairs, m) + ad: what the loop computes, so nothing was hoisted."""
    kern, iters = DotPeakKernel(isa), 5
    lanes, chains = isa.lanes, kern.chains
    rng = np.random.default_rng(2)
    io = rng.integers(-3, 4, kern.io_words).astype(np.int32)
    got, = execute(compile_peak(kern, iters, compile_target(isa)), isa, [io], [0])
    y = io[2 * lanes:].reshape(chains, lanes).astype(np.int64)
    if kern.op == "u8s8":
        m = io[:lanes].view(np.uint8).reshape(lanes, 4).astype(np.int64)
        ad = io[lanes:2 * lanes].view(np.int8).reshape(lanes, 4).astype(np.int64)
        for _ in range(iters):
            y = (y + (m * ad).sum(axis=1)) & 0xFFFFFFFF
    else:
        m = io[:lanes].view(np.int16).reshape(lanes, 2).astype(np.int64)
        ad = io[lanes:2 * lanes].astype(np.int64)
        for _ in range(iters):
            pairs = y.astype(np.uint32).view(np.int16).reshape(chains, lanes, 2).astype(np.int64)
            y = ((pairs * m).sum(axis=2) + ad) & 0xFFFFFFFF
    want = y.astype(np.uint32).view(np.int32)
    assert np.array_equal(got[2 * lanes:].reshape(chains, lanes), want)


@pytest.mark.parametrize("isa", X86_INT_ISAS.values(), ids=lambda isa: isa.name)
def test_integer_peak_loop_is_one_instruction_per_chain(isa):
    kern = DotPeakKernel(isa)
    fn = compile_peak(kern, 100).mod.inspect_source("asm")
    loops = [lp for lp in asm.single_block_loops(fn) if any("vpdpbusd" in i or "vpmaddwd" in i for i in lp.body)]
    assert len(loops) == 1
    mul = "vpdpbusd" if kern.op == "u8s8" else "vpmaddwd"
    body = [i.removeprefix("{vex} ") for i in loops[0].body]
    # LLVM may unroll the loop (it does, twice, for AVX-VNNI's 12 chains): whole iterations only.
    n = sum(i.startswith(mul) for i in body)
    assert n and n % kern.chains == 0, n
    assert sum(i.startswith("vpaddd") for i in body) == (n if kern.op == "s16" else 0)
    assert not [i for i in body if i.startswith(("vmov", "vpbroadcast"))], body
    assert not loops[0].stack_accesses()


@pytest.mark.parametrize("isa", [X86_INT_ISAS["avx2"], X86_INT_ISAS["avx512"]], ids=how)
def test_pairs_peak_kernel_computes_its_chains(isa):
    """The pairs probe: y <- pmaddwd(pmaddubsw(y as bytes, m), ones) + ad per chain, vpmaddubsw's
    int16 pair sums saturating as the instruction does; small values keep them in range here."""
    kern, iters = DotPeakKernel(isa, pairs=True), 5
    lanes, chains = isa.lanes, kern.chains
    rng = np.random.default_rng(3)
    io = rng.integers(-3, 4, kern.io_words).astype(np.int32)
    io[:lanes] = rng.integers(0, 2**31, lanes) & 0x03030303  # m: small signed bytes
    got, = execute(compile_peak(kern, iters, compile_target(isa)), isa, [io], [0])
    y = io[2 * lanes:].reshape(chains, lanes).astype(np.int64)
    m = io[:lanes].view(np.int8).reshape(lanes, 4).astype(np.int64)
    ad = io[lanes:2 * lanes].astype(np.int64)
    for _ in range(iters):
        b = y.astype(np.uint32).view(np.uint8).reshape(chains, lanes, 2, 2).astype(np.int64)
        w = np.clip((b * m.reshape(lanes, 2, 2)).sum(axis=3), -32768, 32767)
        y = (w.sum(axis=2) + ad) & 0xFFFFFFFF
    want = y.astype(np.uint32).view(np.int32)
    assert np.array_equal(got[2 * lanes:].reshape(chains, lanes), want)


@pytest.mark.parametrize("isa", [X86_INT_ISAS["avx2"], X86_INT_ISAS["avx512"]], ids=lambda isa: isa.name)
def test_pairs_peak_loop_is_three_instructions_per_chain(isa):
    kern = DotPeakKernel(isa, pairs=True)
    assert kern.name == f"mk_u8s7_dotpeak_{kern.chains}_{isa.name}"
    fn = compile_peak(kern, 100).mod.inspect_source("asm")
    loops = [lp for lp in asm.single_block_loops(fn) if any("vpmaddubsw" in i for i in lp.body)]
    assert len(loops) == 1
    body = [i.removeprefix("{vex} ") for i in loops[0].body]
    n = sum(i.startswith("vpmaddubsw") for i in body)
    assert n and n % kern.chains == 0, n
    assert sum(i.startswith("vpmaddwd") for i in body) == n == sum(i.startswith("vpaddd") for i in body)
    assert not [i for i in body if i.startswith(("vmov", "vpbroadcast"))], body
    assert not loops[0].stack_accesses()
