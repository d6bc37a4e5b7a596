"""schedules.emulate: ARM objects run under qemu match numpy exactly; missing tools, a broken toolchain
and bad inputs are refused with a message that names the cause."""

import re
from pathlib import Path

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import s_tir, te

from schedules.emulation import qemu as emulate

from ...arm_tools import ToolchainBroken, require_emulator

TARGETS = {
    "armv7": {"kind": "llvm", "mtriple": "armv7l-linux-gnueabihf", "mcpu": "cortex-a53",
              "mattr": ["+neon"], "mfloat-abi": "hard"},
    "aarch64": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a53", "mattr": ["+neon"]},
}
ARCHES = sorted(TARGETS)
M, N, K = 13, 37, 53  # not multiples of any vector width, so loop tails run too


def elementwise_int16():
    """C = A * B + (A >> 2), inner loop vectorized so NEON code runs."""
    A = te.placeholder((M, N), "int16", name="A")
    B = te.placeholder((M, N), "int16", name="B")
    C = te.compute((M, N), lambda i, j: A[i, j] * B[i, j] + (A[i, j] >> 2), name="C")
    sch = s_tir.Schedule(te.create_prim_func([A, B, C]))
    _, j = sch.get_loops(sch.get_sblock("C"))
    _, ji = sch.split(j, [None, 8])
    sch.vectorize(ji)
    return sch.mod


def dot_int16_int32():
    """C[i] = sum_k int32(A[i, k]) * int32(B[k])."""
    A = te.placeholder((M, K), "int16", name="A")
    B = te.placeholder((K,), "int16", name="B")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M,), lambda i: te.sum(A[i, k].astype("int32") * B[k].astype("int32"), axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([A, B, C])})


@pytest.mark.parametrize("arch", ARCHES)
def test_int16_elementwise_matches_numpy(arch, rng):
    require_emulator(arch)
    # |A*B + A>>2| <= 180*180 + 45 stays inside int16: TVM marks signed arithmetic nsw,
    # so overflow would be undefined rather than a wrap numpy could reproduce.
    a = rng.integers(-180, 181, (M, N), dtype=np.int16)
    b = rng.integers(-180, 181, (M, N), dtype=np.int16)
    a[0, :2], b[0, :2] = [-180, 180], [-180, -180]
    lib = tvm.compile(elementwise_int16(), target=TARGETS[arch])
    (c,) = emulate.run(lib, arch, [a, b, np.zeros((M, N), np.int16)], outputs=[2])
    assert c.dtype == np.int16 and c.shape == (M, N)
    np.testing.assert_array_equal(c, a * b + (a >> 2))


@pytest.mark.parametrize("arch", ARCHES)
def test_int32_reduction_matches_numpy(arch, rng):
    require_emulator(arch)
    # Full-range A, |B| <= 512: each product < 2**24, K of them stay well inside int32.
    a = rng.integers(-2**15, 2**15, (M, K), dtype=np.int16)
    b = rng.integers(-512, 513, K, dtype=np.int16)
    a[0], b[:] = -2**15, np.where(np.arange(K) % 2, 512, -512)
    lib = tvm.compile(dot_int16_int32(), target=TARGETS[arch])
    a_in, b_in = a.copy(), b.copy()
    c, a_back = emulate.run(lib, arch, [a, b, np.full(M, 7, np.int32)], outputs=[2, 0])
    assert c.dtype == np.int32 and c.shape == (M,)
    np.testing.assert_array_equal(c, a.astype(np.int64) @ b.astype(np.int64))
    np.testing.assert_array_equal(a_back, a_in)  # inputs come back untouched
    np.testing.assert_array_equal(b, b_in)  # and the caller's arrays are never written


def test_kernel_error_is_reported(rng):
    """A shape TVM's argument checks reject comes back as RuntimeError carrying TVM's message."""
    require_emulator("aarch64")
    lib = tvm.compile(dot_int16_int32(), target=TARGETS["aarch64"])
    a = np.zeros((M, K + 1), np.int16)
    with pytest.raises(RuntimeError, match="ValueError.*shape"):
        emulate.run(lib, "aarch64", [a, np.zeros(K, np.int16), np.zeros(M, np.int32)], outputs=[2])


def test_missing_tools_named_with_packages(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    for arch, (gcc, qemu, _) in emulate.ARCHES.items():
        assert emulate.missing_tools(arch) == [gcc, qemu]
        with pytest.raises(emulate.EmulatorMissingError) as err:
            emulate.require_tools(arch)
        msg = str(err.value)
        assert gcc in msg and qemu in msg
        assert ("apt-get install gcc-arm-linux-gnueabihf libc6-dev-armhf-cross qemu-user "
                "gcc-aarch64-linux-gnu libc6-dev-arm64-cross") in msg


def fake_tools(folder, arch, gcc_script, qemu_script, not_installed=()):
    """A PATH holding only shell-script stand-ins for `arch`'s cross gcc and qemu, and a
    dpkg-query that says `not_installed` are absent and everything else is installed."""
    gcc, qemu, _ = emulate.ARCHES[arch]
    absent = " ".join(not_installed)
    # called as: dpkg-query -W -f=${Status} PACKAGE
    dpkg = (f'for p in {absent}; do [ "$p" = "$3" ] && {{ printf "unknown ok not-installed"; exit 0; }}; done\n'
            'printf "install ok installed"')
    for name, body in ((gcc, gcc_script), (qemu, qemu_script), ("dpkg-query", dpkg)):
        path = folder / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(0o755)
    return f"{folder}:/bin:/usr/bin"


@pytest.mark.parametrize("arch", ARCHES)
def test_self_check_names_the_missing_c_library(arch, tmp_path, monkeypatch):
    """A cross gcc on PATH without its C library (what --no-install-recommends leaves): the
    self-check fails at once and names the library's Debian package."""
    libc = emulate.ARCHES[arch].packages[1]
    assert libc.startswith("libc6-dev-")
    gcc = "echo 'stdio.h:27:10: fatal error: bits/libc-header-start.h: No such file or directory' >&2; exit 1"
    monkeypatch.setenv("PATH", fake_tools(tmp_path, arch, gcc, "exit 0", not_installed=[libc]))
    with pytest.raises(emulate.ToolchainError) as err:
        emulate.self_check(arch)
    msg = str(err.value)
    assert f"Debian packages not installed: {libc}" in msg, msg
    assert "bits/libc-header-start.h" in msg  # the compiler's own words follow


@pytest.mark.parametrize("arch", ARCHES)
def test_self_check_runs_the_program(arch, tmp_path, monkeypatch):
    """The probe must run and print the right sum: a qemu that runs nothing fails the check."""
    gcc = 'while [ "$1" != -o ]; do shift; done; : > "$2"'  # "compiles": writes an empty output file
    monkeypatch.setenv("PATH", fake_tools(tmp_path, arch, gcc, "echo 0"))
    with pytest.raises(emulate.ToolchainError, match=re.escape("printed '0\\n', expected 385")):
        emulate.self_check(arch)
    monkeypatch.setenv("PATH", fake_tools(tmp_path, arch, gcc, "echo 385"))
    emulate.self_check(arch)  # and the same stand-ins printing the sum pass


def test_test_command_installs_every_package_emulate_names():
    """scripts/test installs by name what emulate's messages tell a user to install."""
    script = (Path(__file__).parents[3] / "scripts" / "test").read_text()
    listed = re.search(r"^packages=\((.*)\)$", script, re.M).group(1).split()
    assert set(emulate.PACKAGES) | {"llvm"} == set(listed)


def test_toolchain_error_is_not_shrunk_by_hypothesis(monkeypatch):
    """A toolchain failure inside a property test ends it after the first example, instead of
    hypothesis shrinking an error that has nothing to do with the data."""
    def broken(arch):
        raise emulate.ToolchainError("harness does not compile")

    monkeypatch.setattr(emulate, "require_tools", lambda arch: None)
    monkeypatch.setattr(emulate, "_harness_object", broken)
    examples = []

    @given(st.integers(1, 64))
    @settings(max_examples=50, database=None)
    def prop(n):
        examples.append(n)
        emulate.run(None, "aarch64", [np.zeros(n, np.int32)], outputs=[0])

    with pytest.raises(ToolchainBroken, match="harness does not compile"):
        prop()
    assert len(examples) == 1


@pytest.mark.parametrize("bad", [np.zeros(4, np.bool_), np.zeros(4, np.complex64),
                                 np.zeros(4, ">i4"), np.zeros(4, object), [1, 2, 3]])
def test_bad_dtype_refused(bad):
    with pytest.raises(TypeError):
        emulate.run(None, "aarch64", [bad], outputs=[0])


def test_non_contiguous_and_unknown_arch_refused():
    with pytest.raises(ValueError, match="C-contiguous"):
        emulate.run(None, "aarch64", [np.zeros((4, 4), np.int32).T], outputs=[0])
    with pytest.raises(ValueError, match="unknown arch"):
        emulate.missing_tools("riscv")
