"""The vector math (microkernels/f32_vmath/, rendered as LLVM IR row kernels by
microkernels/f32_vmap.py and called over tensors by intrinsics/f32_vmath.py): each function as
TVM compiles it, against float64 rounded to float32, in ulp, over a dense sweep of bit patterns
(every 509th of the 2^32), every subnormal region's neighbourhood and each algorithm's branch
points; specials as PyTorch has them; every tail length; the compile time.

Runs each x86 width the host runs: AVX2 and AVX-512 on an AVX-512 host, AVX2 only on an
AVX2-only host (the AVX-512 kernels are then compiled and their assembly checked, not run:
sweeping millions of values on the Bochs CPU would take minutes per function).
"""

import functools
import re

import numpy as np
import pytest
import torch
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special
from intrinsics import f32_vmath as iv
from microkernels import ISAS
from microkernels import f32_vmath as vm
from microkernels.f32_vmap import VmapKernel

RUNS = [isa for isa in ISAS.values() if isa.host_supports()]
NAMES = sorted(vm.FUNCTIONS)
TORCH = {
    "exp": torch.exp, "sigmoid": torch.sigmoid, "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu, "tanh": torch.tanh,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "hardsigmoid": torch.nn.functional.hardsigmoid,
    "hardswish": torch.nn.functional.hardswish, "leaky_relu": torch.nn.functional.leaky_relu,
    "elu": torch.nn.functional.elu,
}


def reference(name: str, x: np.ndarray) -> np.ndarray:
    """float64 values of the functions (scipy's expit and erfc: no cancellation)."""
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        return {
            "exp": lambda: np.exp(x),
            "sigmoid": lambda: special.expit(x),
            "silu": lambda: x * special.expit(x),
            "gelu": lambda: x * 0.5 * special.erfc(-x / np.sqrt(2)),
            "tanh": lambda: np.tanh(x),
            "gelu_tanh": lambda: x * special.expit(2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)),
            "hardsigmoid": lambda: np.clip(x + 3, 0, 6) / 6,
            "hardswish": lambda: x * np.clip(x + 3, 0, 6) / 6,
            "leaky_relu": lambda: np.where(x < 0, 0.01 * x, x),
            "elu": lambda: np.where(x < 0, np.expm1(x), x),
        }[name]()


def ulp_error(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| in units of the float32 spacing at ref (2^-149 in the subnormal range); an
    overflow to the right infinity counts 0."""
    with np.errstate(all="ignore"):
        r32 = ref.astype(np.float32)
        mag = np.abs(r32.astype(np.float64))
        exponent = np.floor(np.log2(np.maximum(mag, 2.0**-126)))
        ulp = 2.0 ** (np.maximum(exponent, -126) - 23)
        err = np.abs(got.astype(np.float64) - ref) / ulp
        return np.where(np.isinf(r32) & (got == r32), 0.0, err)


@functools.lru_cache(maxsize=None)
def compiled(name: str, shape: tuple, isa_name: str, threads: int = 2):
    isa = ISAS[isa_name]
    return tvm.compile(tvm.IRModule({"main": iv.map_func(name, shape, isa, threads)}), target=tvm.target.Target(isa.target))


def evaluate(name: str, x: np.ndarray, isa_name: str | None = None) -> np.ndarray:
    """fn(x) by the compiled map; the last vector masked (x.size any)."""
    out = tvm.runtime.tensor(np.zeros(x.shape, np.float32))
    compiled(name, x.shape, isa_name or RUNS[0].name)(tvm.runtime.tensor(x), out)
    return out.numpy()


def branch_points() -> np.ndarray:
    """2000 floats around each threshold an algorithm switches at, and around 0 and the
    subnormal boundary, of both signs."""
    points = [0.0, 2.0**-126, vm.EXP_LO, vm.EXP_HI, vm.FAR, vm.SILU_LO, vm.GELU_SMALL, vm.GELU_NEAR,
              vm.GELU_TAIL, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.3465, 88.72284, 87.33655, 103.97208]
    out = []
    for p in points:
        for s in (1.0, -1.0):
            b = np.array(s * p, np.float32).view(np.int32)
            out.append((b + np.arange(-1000, 1000, dtype=np.int32)).view(np.float32))
    x = np.concatenate(out)
    return x[np.isfinite(x)]


def dense_sweep() -> np.ndarray:
    bits = np.arange(0, 2**32, 509, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    return np.concatenate([x[np.isfinite(x)], branch_points()])


@pytest.mark.parametrize("isa", [i.name for i in RUNS])
@pytest.mark.parametrize("name", NAMES)
def test_within_the_bound_on_a_dense_sweep(name, isa):
    x = dense_sweep()
    err = ulp_error(evaluate(name, x, isa), reference(name, x))
    worst = int(np.argmax(err))
    assert err[worst] <= vm.ULP_BOUND[name], (f"{name} ({isa}): {err[worst]:.3f} ulp at x={x[worst]!r} "
                                               f"(bound {vm.ULP_BOUND[name]})")


@pytest.mark.parametrize("name", NAMES)
def test_specials_as_pytorch(name):
    big = np.finfo(np.float32).max
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, big, -big, 1e-45, -1e-45, 1e-40, -1e-40],
                 np.float32)
    got = evaluate(name, x)
    eager = TORCH[name](torch.from_numpy(x.copy())).numpy()
    if name == "gelu":  # +inf: the limit, inf, as PyTorch's scalar and AVX2 kernels give; its
        eager[x == np.inf] = np.inf  # AVX-512 kernel gives NaN (Zen 4), which we do not follow
    # NaN and inf in: what eager gives (NaN where it computes -inf * 0).
    special_in = ~np.isfinite(x)
    np.testing.assert_array_equal(got[special_in], eager[special_in])
    # Finite in: the float64 value, where eager may overflow (hardswish(FLT_MAX) = x * 6 / 6 is inf
    # there) or flush (sigmoid(-100) is 0 there, 3.7e-44 here).
    finite = ~special_in
    assert (ulp_error(got[finite], reference(name, x[finite])) <= vm.ULP_BOUND[name]).all()
    # Zeros signed as the float64 value rounded to float32 (tanh(-0) = -0, gelu(-0) = gelu(-1e-45) =
    # -0), not as eager: its signs of zero depend on the host's kernel (PyTorch 2.13's AVX2 GELU gives
    # +0 there, its AVX-512 and scalar ones -0); from NaN and inf in, eager's (sigmoid(-inf) = +0).
    want = reference(name, x[finite]).astype(np.float32)
    zero = want == 0
    np.testing.assert_array_equal(np.signbit(got[finite][zero]), np.signbit(want[zero]),
                                  err_msg=f"{name}: signs of zero, finite in")
    zero = eager[special_in] == 0
    np.testing.assert_array_equal(np.signbit(got[special_in][zero]), np.signbit(eager[special_in][zero]),
                                  err_msg=f"{name}: signs of zero, NaN or inf in")


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-30, 30, width=32), min_size=1, max_size=300), st.sampled_from(NAMES))
def test_within_the_bound_where_activations_live(values, name):
    x = np.array(values, np.float32)
    assert ulp_error(evaluate(name, x), reference(name, x)).max() <= vm.ULP_BOUND[name]


@pytest.mark.parametrize("isa", sorted(ISAS))
@pytest.mark.parametrize("name", ["exp", "sigmoid", "silu", "gelu", "tanh", "gelu_tanh", "elu"])
def test_no_libm_call_and_vector_fmas(name, isa):
    asm = compiled(name, (1024,), isa).mod.inspect_source("asm")
    for libm in ("expf", "erff", "erfcf", "exp@", "erf@"):
        assert libm not in asm, f"{name} calls {libm}"
    reg = "zmm" if ISAS[isa].lanes == 16 else "ymm"
    assert re.search(rf"\bvfn?madd\d*ps\s[^\n]*%{reg}", asm), f"{name}: no packed FMA on {reg}"
    # Code that LLVM scalarized comes out as the same arithmetic on scalars (ss).
    scalar = re.findall(r"\bv(?:add|sub|mul|div|fn?madd\d*|fn?msub\d*|rndscale|round)ss\b", asm)
    assert not scalar, f"{name}: {len(scalar)} scalar float operations, e.g. {scalar[:3]}"
    if isa == "avx512":  # 32 registers hold every value; AVX2's 16 do not hold the hoisted constants
        # too, which LLVM spills and reads as memory operands, as it would from the constant pool
        assert "rsp" not in asm.split("_compute_:")[-1], f"{name}: stack traffic (spills) in the row kernel"


def test_compensated_steps_survive_the_compiler():
    """The exact split of the sigmoid's denominator 1 + 2^n = hi + lo reaches the machine code as
    written: where 2^n >= 2^24 (x below about -16.6) lo is the 1 that hi rounded away, and with
    it folded to 0 (1 - ((1 + s) - s), as an algebraic simplifier would) the sigmoid and SiLU are
    2.4 ulp off there. The IR has no fast-math flags and the subtraction is fenced."""
    x = np.linspace(-64, -16.7, 200_001, dtype=np.float32)
    for isa in RUNS:
        for name in ("sigmoid", "silu"):
            assert ulp_error(evaluate(name, x, isa.name), reference(name, x)).max() <= vm.ULP_BOUND[name], (isa.name, name)


def test_numpy_emulation_matches_the_algorithm():
    """NumpyOps, the development renderer, agrees with the compiled code to within one ulp
    (its FMA rounds twice, through float64, where the instruction rounds once)."""
    x = dense_sweep()[::7]
    for name in NAMES:
        emulated = vm.evaluate(vm.NumpyOps(), name, x)
        got = evaluate(name, x)
        both = np.isfinite(got)
        assert (np.isnan(emulated) == np.isnan(got)).all(), name
        assert ulp_error(emulated[both], got[both].astype(np.float64)).max() <= 1.0, name


@pytest.mark.parametrize("isa", [i.name for i in RUNS])
def test_every_tail_and_chunk_writes_exactly_its_values(isa):
    """Sizes around the vector width and around the parallel chunks: every value written as the
    full vectors compute it (the masked tail too), nothing past the end (the output sits in a
    larger buffer whose guard values must survive)."""
    lanes = ISAS[isa].lanes
    rng = np.random.default_rng(1)
    sizes = [1, lanes - 1, lanes, lanes + 1, 3 * lanes + 5, iv.SERIAL + 3, 3 * iv.CHUNK + lanes + 1]
    for n in sizes:
        x = (rng.standard_normal(n) * 8).astype(np.float32)
        ref = evaluate("silu", np.concatenate([x, np.zeros(-n % lanes + lanes, np.float32)]), isa)[:n]
        np.testing.assert_array_equal(evaluate("silu", x, isa), ref, err_msg=f"n={n}")
        lib = compiled("silu", (n,), isa)
        guard = np.full(n + 2 * lanes, 7.0, np.float32)
        out = tvm.runtime.tensor(guard)
        lib(tvm.runtime.tensor(x), out._create_view((n,)))  # the first n values of the larger buffer
        got = out.numpy()
        np.testing.assert_array_equal(got[:n], ref, err_msg=f"n={n}")
        assert (got[n:] == 7.0).all(), f"n={n}: wrote past the end"


@pytest.mark.parametrize("isa", [i.name for i in RUNS])
@pytest.mark.parametrize("name", sorted(vm.NEAR))
def test_near_form_equals_the_full_form_bit_for_bit(name, isa):
    """Values within NEAR in vectors of their own take the near form; the same values beside one
    far value (or a NaN) in each vector take the full form: both give the same bits."""
    lanes = ISAS[isa].lanes
    rng = np.random.default_rng(2)
    x = rng.uniform(-vm.NEAR[name], vm.NEAR[name], (64, lanes)).astype(np.float32)
    x[:, 0] = np.float32(vm.NEAR[name])  # the bound itself is near
    mixed = x.copy()
    mixed[:, -1] = np.where(np.arange(64) % 2, np.float32(-100.0), np.float32(np.nan))
    near, full = evaluate(name, x.ravel(), isa), evaluate(name, mixed.ravel(), isa)
    np.testing.assert_array_equal(near.reshape(64, lanes)[:, :-1], full.reshape(64, lanes)[:, :-1])
    assert ulp_error(full.reshape(64, lanes)[1::2, -1], reference(name, mixed[1::2, -1])).max() <= vm.ULP_BOUND[name]
    assert np.isnan(full.reshape(64, lanes)[::2, -1]).all()


def test_chunks_give_each_thread_equal_whole_shares():
    """TVM's parallel loop gives each thread a contiguous run of ceil(calls / threads) calls:
    the values per thread must come out equal to within 1% and two vectors."""
    for n in (iv.SERIAL, 1_204_224, 3 * iv.CHUNK + 17, 10**7 + 1):
        for threads in (2, 3, 4):
            calls, per = iv.chunks(n, 16, threads)
            assert per % 16 == 0 and per <= iv.CHUNK and (calls - 1) * per < n <= calls * per
            run = -(-calls // threads)
            work = [min(n, (t + 1) * run * per) - min(n, t * run * per) for t in range(threads)]
            assert max(work) - min(work) <= max(work) / 100 + 2 * 16, (n, threads, calls, per, work)
    assert iv.chunks(iv.SERIAL - 1, 16, 2) == (1, iv.SERIAL - 1)
    assert iv.chunks(10**6, 16, 1) == (1, 10**6)


def test_compiles_in_milliseconds():
    """The functions as TIR expressions took seconds each to compile (SiLU 3.7 s: TVM's analyzer
    substitutes every let-bound step into the next); as IR they take LLVM milliseconds."""
    import time

    for name in NAMES:
        t = time.perf_counter()
        tvm.compile(tvm.IRModule({"main": iv.map_func(name, (4096 + 3,), ISAS["avx512"], 2)}),
                    target=tvm.target.Target(ISAS["avx512"].target))
        assert time.perf_counter() - t < 1.0, name


def test_unknown_names_and_parameters_are_refused():
    with pytest.raises(ValueError, match="no vector math"):
        iv.map_func("softplus", (4,), RUNS[0])
    with pytest.raises(ValueError, match="takes no parameter"):
        VmapKernel("sigmoid", RUNS[0], alpha=0.2)
    assert VmapKernel("leaky_relu", RUNS[0]).alpha == np.float32(0.01)
    assert VmapKernel("elu", RUNS[0], 0.5).name != VmapKernel("elu", RUNS[0]).name
