"""The compile cache (schedules/common/cache.py): a scheduled layer or a built model comes back
from disk in this process and in others; any change of key misses; a corrupt entry is rebuilt,
never loaded; concurrent writers leave a whole entry; the size bound evicts the oldest; "off"
writes nothing. The suite runs with the cache off (conftest); these tests turn it on in a
folder of their own."""

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tvm

from schedules.common import cache
from schedules.conv import dispatch
from schedules.conv.geometry import ConvParams, PostOps

ROOT = Path(__file__).resolve().parents[3]
LAYER = ConvParams((1, 16, 8, 8), (16, 16, 3, 3), 1, 1)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "cache"))
    cache.clear_memory()
    yield tmp_path / "cache"
    cache.clear_memory()


@pytest.fixture
def counted(monkeypatch):
    """How many times the x86 scheduler itself ran (not the cache)."""
    calls = []
    real = dispatch._schedule_x86

    def count(*a, **k):
        calls.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(dispatch, "_schedule_x86", count)
    return calls


def entries(root: Path, suffix: str) -> list[Path]:
    return sorted(p for p in root.rglob(f"*{suffix}") if not p.name.startswith("."))


def test_a_layer_comes_back_from_disk(cache_dir, counted):
    first = dispatch.schedule(LAYER, target="x86-avx2", algorithm="direct")
    assert len(counted) == 1 and len(entries(cache_dir, ".pkl")) == 1
    cache.clear_memory()  # as a new process: only the disk has it
    again = dispatch.schedule(LAYER, target="x86-avx2", algorithm="direct")
    assert len(counted) == 1
    tvm.ir.assert_structural_equal(first.mod, again.mod)
    assert again.plan == first.plan and again.geometry == first.geometry
    dispatch.schedule(LAYER, target="x86-avx2", algorithm="direct")  # this process's copy
    assert len(counted) == 1


@pytest.mark.parametrize("change", [
    dict(post_ops=PostOps(True, False, "relu")), dict(target="x86-avx512"), dict(threads=1),
    dict(algorithm="winograd"), dict(conv=ConvParams((1, 16, 8, 8), (16, 16, 3, 3), 1, 2)),
])
def test_any_change_of_key_misses(cache_dir, counted, change):
    base = dict(conv=LAYER, target="x86-avx2", algorithm="direct")
    dispatch.schedule(base.pop("conv"), **base)
    kw = {**dict(conv=LAYER, target="x86-avx2", algorithm="direct"), **change}
    dispatch.schedule(kw.pop("conv"), **kw)
    assert len(counted) == 2


def test_changed_sources_miss(cache_dir, counted, monkeypatch):
    dispatch.schedule(LAYER, target="x86-avx2", algorithm="direct")
    cache.clear_memory()
    monkeypatch.setattr(cache, "code_version", lambda: "another version of the kernels")
    dispatch.schedule(LAYER, target="x86-avx2", algorithm="direct")
    assert len(counted) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_a_corrupt_entry_is_rebuilt(cache_dir, counted, damage, caplog):
    dispatch.schedule(LAYER, target="x86-avx2", algorithm="direct")
    path, = entries(cache_dir, ".pkl")
    blob = bytearray(path.read_bytes())
    if damage == "truncate":
        blob = blob[: len(blob) // 2]
    elif damage == "flip":
        blob[len(blob) // 2] ^= 0xFF
    else:
        blob = bytearray(b"not a cache entry")
    path.write_bytes(bytes(blob))
    cache.clear_memory()
    with caplog.at_level(logging.WARNING, logger="tvm_microkernels.cache"):
        s = dispatch.schedule(LAYER, target="x86-avx2", algorithm="direct")
    assert len(counted) == 2 and "rebuilding it" in caplog.text
    assert s.plan.algorithm == "direct"
    cache.clear_memory()
    assert cache.get(cache.key("schedule", "unrelated")) is None
    # The rebuilt entry is whole again: read back without scheduling.
    dispatch.schedule(LAYER, target="x86-avx2", algorithm="direct")
    assert len(counted) == 2


def test_the_size_bound_evicts_the_least_recently_used(cache_dir, monkeypatch):
    monkeypatch.setenv(cache.ENV_SIZE, str(100_000 / 2**20))  # about 100 KB
    keys = [cache.key("test", i) for i in range(6)]
    for i, k in enumerate(keys):
        cache.put(k, bytes(30_000))
        if i == 2:
            cache.clear_memory()
            assert cache.get(keys[0]) is not None  # used again: now newer than keys[1]
            os.utime(next(cache_dir.rglob(f"{keys[0]}.pkl")), (1e9, 1e9 + 3))  # (the filesystem's clock is coarse)
            for j, kk in enumerate(keys[1:3]):
                os.utime(next(cache_dir.rglob(f"{kk}.pkl")), (1e9, 1e9 + j))
    cache.clear_memory()
    kept = [k for k in keys if cache.get(k) is not None]
    assert sum(p.stat().st_size for p in entries(cache_dir, ".pkl")) <= 100_000
    assert kept[-1] == keys[-1] and keys[1] not in kept, kept


def test_off_writes_nothing(tmp_path, monkeypatch, counted):
    monkeypatch.setenv(cache.ENV_DIR, "off")
    cache.clear_memory()
    assert cache.directory() is None
    dispatch.schedule(LAYER, target="x86-avx2", algorithm="direct")
    dispatch.schedule(LAYER, target="x86-avx2", algorithm="direct")
    assert len(counted) == 2  # no in-process copy either


def _run(script: str, cache_root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, cache.ENV_DIR: str(cache_root), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_concurrent_writers_leave_whole_entries(cache_dir):
    """Two processes write the same keys at once while reading them back: every read is
    either nothing yet or the whole value."""
    script = """
        from schedules.common import cache
        keys = [cache.key("race", i) for i in range(8)]
        for rnd in range(25):
            for i, k in enumerate(keys):
                cache.put(k, bytes([i]) * 200_000)
                cache.clear_memory()
                got = cache.get(k)
                assert got is None or got == bytes([i]) * 200_000, (rnd, i, None if got is None else len(got))
        print("ok")
    """
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT,
                              env={**os.environ, cache.ENV_DIR: str(cache_dir), "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 and o.strip() == "ok" for p, (o, _) in zip(procs, outs)), outs
    cache.clear_memory()
    for i in range(8):
        assert cache.get(cache.key("race", i)) == bytes([i]) * 200_000
    # No temporary file left behind (.key is the user's HMAC key, one for the folder).
    assert [p.name for p in cache_dir.rglob(".*") if p.is_file()] == [".key"]


MODEL = """
    import json, logging, sys
    import numpy as np, tvm
    from tvm import relax
    from schedules import relax as mkrelax
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    rng = np.random.default_rng(0)
    w = relax.const(rng.standard_normal((16, 16, 3, 3)).astype(np.float32))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 10, 10), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, w, padding=1)))))
        bb.emit_func_output(y)
    report = []
    ex = mkrelax.build(bb.get(), "x86-avx2", report=report)
    xv = rng.standard_normal((1, 16, 10, 10)).astype(np.float32)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(xv)).numpy()
    print(json.dumps({"sum": float(np.abs(out).sum()), "ours": sum(r["runs_on"] == "ours" and r.get("op", "conv2d") == "conv2d" for r in report)}))
"""


def test_a_model_built_by_one_process_loads_in_another(cache_dir):
    first = _run(MODEL, cache_dir)
    assert first.returncode == 0, first.stderr
    assert "loaded from the compile cache" not in first.stderr
    second = _run(MODEL, cache_dir)
    assert second.returncode == 0, second.stderr
    assert "model loaded from the compile cache" in second.stderr, second.stderr
    assert second.stdout == first.stdout and '"ours": 1' in first.stdout, (first.stdout, second.stdout)
    # A damaged library fails its digest: rebuilt, and the answer is the same.
    lib, = entries(cache_dir, ".so")
    blob = bytearray(lib.read_bytes())
    blob[len(blob) // 3] ^= 0xFF
    lib.write_bytes(bytes(blob))
    third = _run(MODEL, cache_dir)
    assert third.returncode == 0 and third.stdout == first.stdout, third.stderr
    assert "rebuilding it" in third.stderr and "loaded from the compile cache" not in third.stderr


def test_damage_that_still_unpickles_is_caught_by_the_digest(cache_dir):
    """A flipped byte inside the data (where pickle itself would not notice) is not loaded."""
    k = cache.key("test", "data")
    cache.put(k, bytes(100_000))
    path, = entries(cache_dir, ".pkl")
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))
    cache.clear_memory()
    assert cache.get(k) is None and not path.exists()


def test_ctrl_c_while_a_library_is_exported_leaves_a_whole_entry(cache_dir):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) once the forked
    exporter of a built model exists: the program ends in KeyboardInterrupt, the exporter (and
    the linker it runs) ignore it and finish, the exit joins them, and the next process loads
    the entry. Before, the exporter died with the program's interrupt and left no entry."""
    from ...interrupting import interrupt_once_forked

    script = textwrap.dedent(MODEL) + "\nimport time\ntime.sleep(120)\n"
    ending = interrupt_once_forked(script, env={cache.ENV_DIR: str(cache_dir), "TVM_MICROKERNELS_JOBS": "1",
                                                "PYTHONPATH": str(ROOT)}, group=True)
    assert ending.last_exception == "KeyboardInterrupt", ending.stderr[-3000:]
    assert ending.left == [], ending.left
    assert len(entries(cache_dir, ".so")) == 1 and len(entries(cache_dir, ".meta")) == 1
    again = _run(MODEL, cache_dir)
    assert again.returncode == 0 and "model loaded from the compile cache" in again.stderr, again.stderr[-3000:]
