import os

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings

from intrinsics import script

# "ci": few examples, fixed seed, so a CI run is repeatable and fits its time budget; the first
# failing example is reported as found, not shrunk (each example of a compiling test takes
# seconds, so shrinking turned a 30 s failure into minutes).
# "dev": HYPOTHESIS_PROFILE=dev for a longer, randomized local search, with shrinking.
settings.register_profile(
    "ci", max_examples=40, derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
)
# Every setting spelled out: a profile inherits the one loaded when it is registered, and under
# CI=true hypothesis loads its own "ci" profile first, which the one above then replaces.
settings.register_profile("dev", max_examples=150, deadline=None, derandomize=False, phases=list(Phase),
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The compile cache off for the suite (and the subprocesses it starts): a test that patches a
# planner in-process must not get a schedule cached before the patch, and a run must not read
# or fill the user's cache. tests/schedules/common/test_cache.py turns it on in a folder of its own.
os.environ["TVM_MICROKERNELS_CACHE"] = "off"
# Likewise the host's measurements (`python -m microkernels tune`): the suite tests the shipped
# defaults; tests/schedules/common/test_tuned.py writes measurements of its own.
os.environ["TVM_MICROKERNELS_TUNE"] = "off"

# Every parsed template checked for well-formed TIR, which builds skip for speed (intrinsics.script).
script.CHECK_WELL_FORMED = True


def f32_tolerance(a, b, c0=None):
    """Elementwise bound for float32 C = C0 + A @ B against an exact (float64) reference.

    A length-K FMA chain plus the initial C adds K+1 terms; each rounding costs at most
    u = eps/2 relative, so |error| <= (K+1) * u * sum|terms|. We allow eps (2u) per term.
    """
    k = a.shape[1]
    mag = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    if c0 is not None:
        mag = mag + np.abs(c0)
    return (k + 1) * np.finfo(np.float32).eps * mag + np.finfo(np.float32).tiny


def assert_close_f32(got, a, b, c0=None):
    ref = a.astype(np.float64) @ b.astype(np.float64)
    if c0 is not None:
        ref = ref + c0
    err = np.abs(got - ref)
    tol = f32_tolerance(a, b, c0)
    bad = err > tol
    assert not bad.any(), f"{bad.sum()} elements off; worst error {err.max():.3g} vs its bound {tol.flat[np.argmax(err)]:.3g}"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True, scope="session")
def _toolchain_errors_fail_fast():
    """Turn emulate.ToolchainError, raised inside any test, into arm_tools.ToolchainBroken."""
    from schedules.emulation import qemu as emulate

    from .arm_tools import ToolchainBroken

    real = emulate.run

    def run(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        except emulate.ToolchainError as err:
            raise ToolchainBroken(f"{type(err).__name__}: {err}") from err

    emulate.run = run
    yield
    emulate.run = real


class Spy:
    """Stands in for op.lib and records the data address of every argument it is given."""

    def __init__(self, lib):
        self.lib, self.seen = lib, []

    def __call__(self, *args):
        self.seen.append([a.data_ptr() for a in args])
        return self.lib(*args)

    def __getitem__(self, name):  # the op calls the entry function it looks up
        entry = self.lib[name]

        def record(*args):
            self.seen.append([a.data_ptr() for a in args])
            return entry(*args)

        return record

    def __getattr__(self, name):
        return getattr(self.lib, name)


def unaligned(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of `a` whose data starts 4 bytes past a 64-byte boundary."""
    from schedules.common.layouts import aligned_empty, is_aligned

    raw = aligned_empty((a.size + 16,))
    v = raw[1:1 + a.size].reshape(a.shape)
    v[...] = a
    assert not is_aligned(v)
    return v
