"""schedules.common.targets: target presets, the host (its ISA, caches and thread pool), and the
argument checks every public entry point runs."""

import threading

import numpy as np
import pytest
import tvm

import microkernels
from microkernels import ARM_ISAS, ISAS
from schedules import UnsupportedHostError
from schedules.common import targets


def test_presets_name_isas():
    assert targets.resolve("x86-avx512") is ISAS["avx512"] and targets.resolve("x86-avx2") is ISAS["avx2"]
    assert targets.resolve("aarch64-dotprod") is ARM_ISAS["aarch64dot"]
    assert set(targets.PRESETS) == {"x86-avx512", "x86-avx2", "x86-avx512vnni", "x86-avxvnni", "x86-amx",
                                    "armv7-neon", "aarch64-neon", "aarch64-dotprod"}
    # The VNNI presets name the integer tiles' ISAs; the FP32 code runs at their vector width.
    vnni, avxvnni = targets.resolve("x86-avx512vnni"), targets.resolve("x86-avxvnni")
    assert (vnni.name, avxvnni.name) == ("avx512vnni", "avxvnni")
    assert targets.float_isa(vnni) is ISAS["avx512"] and targets.float_isa(avxvnni) is ISAS["avx2"]
    assert targets.int_isa("x86-avx2", ISAS["avx2"]).name == "avx2"  # the upcast, VNNI or not
    assert targets.int_isa("native", ISAS["avx512"]).host_supports()
    # AMX: its preset, a Target with its features, and "native" on a host that has it.
    amx = targets.resolve("x86-amx")
    assert amx.name == "amxint8" and targets.float_isa(amx) is ISAS["avx512"]
    assert targets.int_isa("x86-amx", amx) is amx
    assert targets.int_isa(tvm.target.Target(targets.int_target(amx)), ISAS["avx512"]) is amx
    assert (targets.int_isa("native", ISAS["avx512"]) is amx) == amx.host_supports()


@pytest.mark.parametrize("target, msg", [
    ("x86-sse", "unknown target 'x86-sse'"),
    ("llvm -mcpu=haswell", "no longer parses target strings"),
    ({"kind": "llvm"}, "target dicts are chosen for you"),
    (None, "unknown target None"),
])
def test_unknown_targets_name_the_presets(target, msg):
    with pytest.raises(ValueError, match=msg) as e:
        targets.resolve(target)
    assert "x86-avx2" in str(e.value) and "'native'" in str(e.value)



@pytest.mark.parametrize("target, isa", [
    ({"kind": "llvm", "mcpu": "znver4"}, ISAS["avx512"]), ({"kind": "llvm", "mcpu": "skylake-avx512"}, ISAS["avx512"]),
    ({"kind": "llvm", "mcpu": "haswell"}, ISAS["avx2"]), ({"kind": "llvm", "mcpu": "znver3"}, ISAS["avx2"]),
    ({"kind": "llvm", "mcpu": "haswell", "mattr": ["+avx512f"]}, ISAS["avx512"]),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a55"}, ARM_ISAS["aarch64dot"]),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a53"}, ARM_ISAS["aarch64"]),
    ({"kind": "llvm", "mtriple": "armv7l-linux-gnueabihf", "mattr": ["+neon"]}, ARM_ISAS["neon"]),
])
def test_tvm_targets_map_to_the_isa_their_cpu_allows(target, isa):
    """What TVM users hold: a tvm.target.Target, read through LLVM's feature list of its mcpu/mattr."""
    import tvm

    assert targets.resolve(tvm.target.Target(target)) is isa


def test_tvm_targets_no_kernel_serves_are_refused_by_name(monkeypatch):
    import tvm

    for target, msg in (({"kind": "llvm", "mcpu": "core2"}, "neither AVX-512 nor AVX2 with FMA"),
                        ({"kind": "c"}, "not a CPU target"),
                        ({"kind": "llvm", "mtriple": "riscv64-linux-gnu"}, "no kernels for triple 'riscv64")):
        with pytest.raises(ValueError, match=msg):
            targets.resolve(tvm.target.Target(target))
    # No CPU, no features: this host, as "native".
    monkeypatch.setattr(microkernels.isa, "host_cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert targets.resolve(tvm.target.Target({"kind": "llvm"})) is ISAS["avx2"]

def test_native_picks_the_widest_isa_the_host_runs(monkeypatch):
    monkeypatch.setattr(microkernels.isa, "host_cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert targets.resolve("native") is ISAS["avx2"]
    monkeypatch.setattr(microkernels.isa, "host_cpu_flags", lambda: frozenset({"avx2", "fma", "avx512f"}))
    assert targets.resolve("native") is ISAS["avx512"]
    monkeypatch.setattr(microkernels.isa, "host_cpu_flags", lambda: frozenset({"sse2"}))
    with pytest.raises(RuntimeError, match="neither AVX-512F nor AVX2"):
        targets.resolve("native")


def test_require_host_names_what_the_cpu_lacks_and_how_to_emulate(monkeypatch):
    monkeypatch.setattr(microkernels.isa, "host_cpu_flags", lambda: frozenset({"avx2", "fma"}))
    with pytest.raises(UnsupportedHostError, match=r"lacks avx512f.*emulate=True"):
        targets.require_host(ISAS["avx512"])
    targets.require_host(ISAS["avx2"])
    with pytest.raises(UnsupportedHostError) as e:
        targets.require_host(ARM_ISAS["neon"])
    assert "emulate=True" not in str(e.value)  # ARM code runs under qemu, not Bochs


@pytest.mark.parametrize("value, exc, msg", [
    (0, ValueError, "threads must be >= 1"), (True, TypeError, "threads must be an int"),
    (2.0, TypeError, "threads must be an int"), (targets.MAX_THREADS + 1, ValueError, "is more than 1024"),
])
def test_thread_count_refuses(value, exc, msg):
    with pytest.raises(exc, match=msg):
        targets.thread_count(value)


def test_thread_count_accepts():
    assert targets.thread_count(None) is None
    assert targets.thread_count(np.int64(3)) == 3 and type(targets.thread_count(np.int64(3))) is int


def test_set_threads_reconfigures_tvms_pool_only_on_a_change(monkeypatch):
    calls = []
    monkeypatch.setattr(targets.tvm_ffi, "get_global_func", lambda name: lambda mode, n: calls.append((name, n)))
    monkeypatch.setattr(targets, "_POOL", threading.local())
    targets.set_threads(1)
    targets.set_threads(1)
    targets.set_threads(None)  # one per core
    assert calls == [("runtime.config_threadpool", 1), ("runtime.config_threadpool", targets.os.cpu_count())]
    calls.clear()
    other = threading.Thread(target=targets.set_threads, args=(targets.os.cpu_count(),))
    other.start()
    other.join()
    assert calls == [("runtime.config_threadpool", targets.os.cpu_count())]  # its own pool, sized anew
    monkeypatch.setattr(targets, "_POOL", threading.local())  # the real pools: the next call sets them again


def test_dtype_name_takes_names_dtypes_and_scalar_types():
    assert targets.dtype_name("dtype", np.float32) == "float32" == targets.dtype_name("dtype", np.dtype("float32"))
    assert targets.dtype_name("dtype", "int8") == "int8" and targets.dtype_name("dtype", None) is None
    with pytest.raises(TypeError, match="dtype must be a dtype name"):
        targets.dtype_name("dtype", object())


def test_check_elements_names_the_buffer_over_int32():
    targets.check_elements(a=(2**15, 2**15), b=(targets.MAX_ELEMENTS,))
    with pytest.raises(ValueError, match=r"big would hold 2147483648 elements \(65536, 32768\)"):
        targets.check_elements(small=(4,), big=(2**16, 2**15))


def test_check_array_names_what_is_wrong():
    a = np.zeros((2, 3), np.float32)
    assert targets.check_array("x", a, (2, 3), "float32") is a
    with pytest.raises(TypeError, match="x must be a numpy.ndarray, got list"):
        targets.check_array("x", [[0.0]], (1, 1), "float32")
    with pytest.raises(TypeError, match="x must have dtype float32, got float64"):
        targets.check_array("x", a.astype(np.float64), (2, 3), "float32")
    with pytest.raises(ValueError, match=r"x must have shape \(3, 2\), got \(2, 3\)"):
        targets.check_array("x", a, (3, 2), "float32")
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        targets.check_array("x", a.T, (3, 2), "float32")


def test_check_emulate():
    assert targets.check_emulate(False, ARM_ISAS["neon"]) is False
    with pytest.raises(TypeError, match="emulate must be True or False"):
        targets.check_emulate(1, ISAS["avx2"])
    with pytest.raises(ValueError, match="runs under qemu already"):
        targets.check_emulate(True, ARM_ISAS["neon"])


def test_host_cache_bytes_reads_sysfs(tmp_path, monkeypatch):
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2M")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (d / name).write_text(f"{value}\n")
    monkeypatch.setattr(targets, "CACHE_DIR", tmp_path)
    targets.host_caches.cache_clear()
    try:
        assert targets.host_cache_bytes(1, 0) == 48 * 1024  # the data cache, not the instruction one
        assert targets.host_cache_bytes(2, 0) == 2 << 20
        assert targets.host_cache_bytes(3, 123) == 123  # sysfs silent: the default
    finally:
        targets.host_caches.cache_clear()

