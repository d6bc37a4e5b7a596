"""Adversarial inputs to the public API, each in a process of its own, classified by outcome.

A bad input must end in a clear error (an exception type the API documents, whose message names
the constraint) and an unusual but valid one in the right answer, within seconds. Anything else
is a bug of a kind this module tells apart: an internal error (TVM's own exception, or a Python
error the API never meant to raise), a crash (the process dies on a signal), a hang (no answer
within TIMEOUT), or a wrong answer. The cases include every finding of the adversarial pass of
issue 15; a new crash found later belongs here too.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .arm_tools import require_emulator

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 120  # seconds per case: compiling is the slow part, a hang is far longer

# Exceptions the API raises on purpose (each documented where it is raised).
CLEAR = ("ValueError", "TypeError", "TileError", "UnsupportedHostError", "EmulatorMissingError")

# The case's code runs as the body of case(); it returns True (right) or False (wrong).
DRIVER = """
import json, sys, traceback
import numpy as np
def case():
{body}
try:
    verdict = "right" if case() else "wrong"
    print(json.dumps({{"outcome": verdict}}))
except Exception as err:
    internal = type(err).__module__.startswith("tvm") or type(err).__name__ not in {clear!r}
    print(json.dumps({{"outcome": "internal" if internal else "clear", "error": type(err).__name__,
                       "message": str(err)[:400], "trace": traceback.format_exc()[-1500:]}}))
"""


def classify(body: str) -> dict:
    code = DRIVER.format(body=textwrap.indent(textwrap.dedent(body), "    "), clear=CLEAR)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"outcome": "hang"}
    if proc.returncode < 0:
        return {"outcome": "crash", "signal": -proc.returncode, "stderr": proc.stderr[-1500:]}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"outcome": "crash", "returncode": proc.returncode, "stderr": proc.stderr[-1500:]}
    return json.loads(lines[-1])


# (id, code, expected outcome, a regex the clear error's message must match, or None)
CASES = [
    # issue 15, finding 2: the band planner used to iterate over 10**9 output rows
    ("conv2d-padding-1e9", """
        import schedules
        schedules.conv2d((1, 3, 8, 8), (4, 3, 3, 3), padding=10**9, target="x86-avx2")
    """, "clear", "int32 index arithmetic"),
    # finding 4: int32 index overflow deep in TVM
    ("conv2d-padding-1e5", """
        import schedules
        schedules.conv2d((1, 3, 8, 8), (4, 3, 3, 3), padding=10**5, target="x86-avx2")
    """, "clear", "int32 index arithmetic"),
    ("matmul-50000x16x50000", """
        import schedules
        schedules.matmul(50000, 16, 50000, target="x86-avx2")
    """, "clear", "A would hold 2500000000 elements"),
    ("intrinsic-k-2e31", """
        import intrinsics
        intrinsics.avx2_fma_gemm(6, 16, 2**31)
    """, "clear", "int32 index arithmetic"),
    ("threads-2e31", """
        import schedules
        schedules.conv2d((1, 8, 8, 8), (8, 8, 3, 3), padding=1, target="x86-avx2", threads=2**31)
    """, "clear", "threads=2147483648 is more than 1024"),
    ("dtype-numpy-class", """
        import schedules
        from tests import conv_reference
        x = np.random.default_rng(0).standard_normal((1, 8, 9, 9), dtype=np.float32)
        w = np.random.default_rng(1).standard_normal((8, 8, 3, 3), dtype=np.float32)
        op = schedules.conv2d(x.shape, w.shape, padding=1, dtype=np.float32, target="x86-avx2", algorithm="direct")
        return np.allclose(op(x, w), conv_reference.conv2d(x.astype(np.float64), w.astype(np.float64), padding=1),
                           rtol=1e-4, atol=1e-4)
    """, "right", None),
    ("intrinsic-numpy-ints", """
        import intrinsics
        return intrinsics.avx2_fma_gemm(np.int64(6), np.int32(16), np.int64(64)) == "mk_f32_gemm_6x16_avx2_k64"
    """, "right", None),
    # finding 3: the legalize pass rewrote a reduction whose int32 sum can wrap
    ("legalize-beyond-exact-bound", """
        from tvm import relax
        from schedules.relax_int8 import legalize_int8_conv2d
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((1, 4445, 3, 3), "uint8"))
        with bb.function("main", [x]):
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(np.zeros((4, 4445, 3, 3), np.int8)), out_dtype="int32"))
            bb.emit_func_output(y)
        legalize_int8_conv2d(128, 0)(bb.get())
    """, "clear", "exceeds 33025"),
    # Inputs that are odd but valid
    ("conv2d-one-pixel-rows", """
        import schedules
        from tests import conv_reference
        x = np.random.default_rng(0).standard_normal((2, 5, 7, 1), dtype=np.float32)
        w = np.random.default_rng(1).standard_normal((3, 5, 3, 1), dtype=np.float32)
        op = schedules.conv2d(x.shape, w.shape, padding=(1, 0), target="x86-avx2")
        ref = conv_reference.conv2d(x.astype(np.float64), w.astype(np.float64), padding=(1, 0))
        return np.allclose(op(x, w), ref, rtol=1e-4, atol=1e-4)
    """, "right", None),
    ("winograd-tiny-image", """
        import schedules
        from tests import conv_reference
        x = np.random.default_rng(0).standard_normal((1, 3, 3, 3), dtype=np.float32)
        w = np.random.default_rng(1).standard_normal((2, 3, 3, 3), dtype=np.float32)
        op = schedules.conv2d(x.shape, w.shape, algorithm="winograd", tile=6, target="x86-avx2")
        ref = conv_reference.conv2d(x.astype(np.float64), w.astype(np.float64))
        return np.allclose(op(x, w), ref, rtol=1e-4, atol=1e-4)
    """, "right", None),
    ("conv2d-nan-input", """
        import schedules
        x = np.full((1, 16, 6, 6), np.nan, np.float32)
        w = np.ones((16, 16, 3, 3), np.float32)
        return bool(np.isnan(schedules.conv2d(x.shape, w.shape, target="x86-avx2")(x, w)).all())
    """, "right", None),
    ("conv2d-fortran-order", """
        import schedules
        x = np.asfortranarray(np.zeros((1, 16, 6, 6), np.float32))
        schedules.conv2d(x.shape, (16, 16, 3, 3), target="x86-avx2")(x, np.zeros((16, 16, 3, 3), np.float32))
    """, "clear", "C-contiguous"),
    # issue 26: the int32 limit checked on each path's own buffers
    ("depthwise-blocked-input-over-int32", """
        import schedules
        schedules.conv2d((1, 17, 8200, 8200), (17, 1, 3, 3), groups=17, stride=4, target="x86-avx2")
    """, "clear", r"data would hold 2151680000 elements \(1, 2, 8200, 8200, 16\)"),
    ("depthwise-large-but-within-int32", """
        import schedules
        op = schedules.conv2d((1, 1024, 512, 512), (1024, 1, 3, 3), groups=1024, padding=1, target="x86-avx2")
        return op.plan.algorithm == "depthwise" and op.blocked_out_shape == (1, 64, 512, 512, 16)
    """, "right", None),
    ("winograd-transformed-weights-over-int32", """
        import schedules
        schedules.conv2d((1, 8192, 4, 4), (8192, 8192, 3, 3), padding=1, algorithm="winograd", tile=6,
                         target="x86-avx2")
    """, "clear", r"transformed_weight would hold 4294967296 elements"),
    ("matmul-padded-c-over-int32", """
        import schedules
        schedules.matmul(2147483, 1000, 1, target="x86-avx2")
    """, "clear", "C_padded_to_tiles would hold"),
    ("int8-packed-input-over-int32", """
        import schedules
        schedules.conv2d((1, 1, 40000, 40000), (1, 1, 3, 3), padding=1, dtype="int8", target="armv7-neon")
    """, "clear", r"packed_input would hold 6400640016 elements \(1, 1, 40002, 40002, 4\)"),
    # issue 26: arguments validated where they enter
    ("winograd-tile-numpy-int", """
        import schedules
        from tests import conv_reference
        x = np.random.default_rng(0).standard_normal((1, 16, 12, 12), dtype=np.float32)
        w = np.random.default_rng(1).standard_normal((16, 16, 3, 3), dtype=np.float32)
        op = schedules.conv2d(x.shape, w.shape, padding=1, algorithm="winograd", tile=np.int64(6), target="x86-avx2")
        ref = conv_reference.conv2d(x.astype(np.float64), w.astype(np.float64), padding=1)
        return op.plan.tile == 6 and np.allclose(op(x, w), ref, rtol=1e-3, atol=1e-3)
    """, "right", None),
    ("winograd-tile-float", """
        import schedules
        schedules.conv2d((1, 16, 12, 12), (16, 16, 3, 3), padding=1, algorithm="winograd", tile=4.0,
                         target="x86-avx2")
    """, "clear", "tile must be an int, got float"),
    ("conv-blocking-string", """
        import schedules
        schedules.ConvBlocking(l2_bytes="1M")
    """, "clear", "l2_bytes must be an int, got str"),
    ("matmul-blocking-not-a-blocking", """
        import schedules
        schedules.matmul(8, 16, 8, target="x86-avx2", blocking=256)
    """, "clear", "blocking must be a schedules.Blocking"),
    ("winograd-on-arm", """
        import schedules
        schedules.conv2d((1, 8, 8, 8), (8, 8, 3, 3), dtype="uint8", target="armv7-neon", algorithm="winograd")
    """, "clear", "x86 float32 path"),
]


@pytest.mark.parametrize("name, body, expected, message", CASES, ids=[c[0] for c in CASES])
def test_adversarial_input(name, body, expected, message):
    got = classify(body)
    assert got["outcome"] == expected, f"{name}: {got}"
    if message:
        import re

        assert re.search(message, got["message"]), f"{name}: {got['message']}"


def test_arm_op_shared_by_threads():
    """Issue 15, finding 1: one ARM op called from three Python threads at once, with no warm-up
    call, used to die (double free in write_to_file, or a race creating the work folder)."""
    require_emulator("armv7")
    got = classify("""
        import threading
        import schedules
        from tests import conv_reference
        op = schedules.conv2d((1, 6, 5, 7), (10, 6, 3, 3), padding=1, dtype="uint8", target="armv7-neon",
                              input_zero_point=128)
        rng = np.random.default_rng(0)
        x = rng.integers(0, 256, (1, 6, 5, 7), dtype=np.uint8)
        w = rng.integers(-128, 128, (10, 6, 3, 3), dtype=np.int8)
        want = conv_reference.qconv2d(x, w, 128, 0, padding=1)
        results = []
        def loop():
            for _ in range(4):
                results.append(np.array_equal(op(x, w), want))
        threads = [threading.Thread(target=loop) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return len(results) == 12 and all(results)
    """)
    assert got["outcome"] == "right", got


def test_classifier_tells_outcomes_apart():
    """The classifier itself, on cases whose outcome is known: otherwise a broken driver would
    turn every case into the same verdict."""
    assert classify("return True")["outcome"] == "right"
    assert classify("return False")["outcome"] == "wrong"
    assert classify("raise ValueError('x must be 1')")["outcome"] == "clear"
    assert classify("raise KeyError('x')")["outcome"] == "internal"
    assert classify("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")["outcome"] == "crash"


def test_ci_profile_reports_failures_without_shrinking():
    """Issue 15: shrinking a compile-per-example failure took minutes; the CI profile reports
    the first failing example as found, the dev profile keeps shrinking."""
    from hypothesis import Phase, settings

    assert Phase.shrink not in settings.get_profile("ci").phases
    assert Phase.shrink in settings.get_profile("dev").phases
