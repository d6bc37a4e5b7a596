"""The compile cache's trust model (schedules/common/cache.py, private.py): a folder anyone else
could change is not used; nothing inside it is followed through a symlink; an entry is loaded only
when this user's HMAC key sealed it under its own key and it holds what its caller takes; eviction
deletes only the cache's own entries. Each case ends in a build that goes on and gives the right
answer. The suite runs as whatever user CI is: the "another user" cases chown to uid 65534 and
need root, which CI is (the test says so when it is not, by failing, never by skipping)."""

import hashlib
import logging
import os
import pickle
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tvm

from schedules.common import cache, private
from schedules.conv import dispatch
from schedules.conv.geometry import ConvParams

from .test_cache import LAYER, MODEL, _run, entries

OTHER = ConvParams((1, 16, 6, 6), (16, 16, 3, 3), 1, 1)
NOBODY = 65534


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "cache"))
    cache.clear_memory()
    cache._WARNED.clear()
    cache._SECRETS.clear()
    yield tmp_path / "cache"
    cache.clear_memory()
    cache._SECRETS.clear()


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = dispatch._schedule_x86
    monkeypatch.setattr(dispatch, "_schedule_x86", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    return calls


def schedule(layer=LAYER):
    return dispatch.schedule(layer, target="x86-avx2", algorithm="direct")


def fresh():
    """As a new process: only the disk has the entries."""
    cache.clear_memory()
    cache._SECRETS.clear()


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


# -- folders other users could change ---------------------------------------------------------

@pytest.mark.parametrize("level", [0, 1, 2])  # the root, <kind>, <kind>/<xx>
@pytest.mark.parametrize("change", ["mode 777", "mode 775", "mode 757", "owner"])
def test_a_folder_others_can_change_is_not_used(cache_dir, counted, caplog, level, change):
    schedule()
    entry, = entries(cache_dir, ".pkl")
    folder = [cache_dir, entry.parent.parent, entry.parent][level]
    if change == "owner":
        assert os.geteuid() == 0, "chown to another user needs root (CI runs as root)"
        os.chown(folder, NOBODY, NOBODY)
    else:
        folder.chmod(int(change.split()[1], 8))
    fresh()
    with caplog.at_level(logging.WARNING, logger="tvm_microkernels.cache"):
        s = schedule()
    assert len(counted) == 2, "an entry was loaded from an untrusted folder"
    assert "not used" in caplog.text and str(folder) in caplog.text, caplog.text
    assert s.plan.algorithm == "direct"
    # Nor is anything written there: the entry and the folder are as they were.
    assert entries(cache_dir, ".pkl") == [entry]


def test_a_folder_above_the_cache_others_can_write_is_refused(tmp_path, monkeypatch, counted, caplog):
    above = tmp_path / "shared"
    above.mkdir()
    above.chmod(0o777)  # no sticky bit: anyone could rename the cache folder away
    monkeypatch.setenv(cache.ENV_DIR, str(above / "cache"))
    fresh()
    cache._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="tvm_microkernels.cache"):
        schedule()
    assert "above the folder" in caplog.text and not files_under(above)
    above.chmod(0o1777)  # as /tmp: the sticky bit keeps others from renaming what is ours
    fresh()
    schedule()
    assert entries(above / "cache", ".pkl")


@pytest.mark.parametrize("level", [1, 2, 3])  # <kind>, <kind>/<xx>, the entry itself
def test_no_symlink_inside_the_cache_is_followed(cache_dir, tmp_path, counted, caplog, level):
    schedule()
    entry, = entries(cache_dir, ".pkl")
    target = [None, entry.parent.parent, entry.parent, entry][level]
    outside = tmp_path / "outside"
    os.rename(target, outside)  # the real thing moved out, a symlink to it in its place
    target.symlink_to(outside)
    before = {p: p.read_bytes() for p in ([outside] if outside.is_file() else files_under(outside))}
    fresh()
    with caplog.at_level(logging.WARNING, logger="tvm_microkernels.cache"):
        schedule()
        schedule(OTHER)
    assert len(counted) == 3, "an entry was read through a symlink"
    assert "symlink" in caplog.text, caplog.text
    after = {p: p.read_bytes() for p in ([outside] if outside.is_file() else files_under(outside))}
    assert after == before, "the cache wrote through a symlink"


def test_an_entry_another_user_owns_or_others_can_write_is_not_loaded(cache_dir, counted, caplog):
    schedule()
    entry, = entries(cache_dir, ".pkl")
    entry.chmod(0o666)
    fresh()
    with caplog.at_level(logging.WARNING, logger="tvm_microkernels.cache"):
        schedule()
    assert len(counted) == 2 and "written by its group or by others" in caplog.text
    assert os.geteuid() == 0, "chown to another user needs root (CI runs as root)"
    entry.chmod(0o600)
    os.chown(entry, NOBODY, NOBODY)
    fresh()
    schedule()
    assert len(counted) == 3


def test_the_key_must_be_the_users_alone(cache_dir, counted, caplog):
    schedule()
    (cache_dir / ".key").chmod(0o644)
    fresh()
    with caplog.at_level(logging.WARNING, logger="tvm_microkernels.cache"):
        schedule()
    assert len(counted) == 2 and ".key" in caplog.text


# -- planted code -------------------------------------------------------------------------------

class _Plant:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _forged(k: str, value, secret: bytes) -> bytes:
    """An entry in the cache's format, sealed with `secret`."""
    return cache._sealed(secret, k, value)


@pytest.mark.parametrize("how", ["plain pickle", "sha256 seal", "another key's HMAC"])
def test_a_planted_pickle_is_never_unpickled(cache_dir, tmp_path, counted, how):
    schedule()
    entry, = entries(cache_dir, ".pkl")
    k = entry.stem
    marker = tmp_path / "ran"
    payload = pickle.dumps(_Plant(str(marker)))
    blob = {"plain pickle": payload,
            "sha256 seal": hashlib.sha256(payload).digest() + payload,
            "another key's HMAC": _forged(k, _Plant(str(marker)), os.urandom(32))}[how]
    entry.write_bytes(blob)
    fresh()
    s = schedule()
    assert not marker.exists(), "the planted pickle ran"
    assert len(counted) == 2 and s.plan.algorithm == "direct"
    # The control: sealed with this user's own key (which only this user can read), it would run.
    fresh()
    with private.Folder.root(cache_dir) as root:
        entry.write_bytes(_forged(k, _Plant(str(marker)), cache._secret(root)))
    cache.get(k)
    assert marker.exists()


PLANTED_SO = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) { FILE *f = fopen("%s", "w"); if (f) fclose(f); }
"""


@pytest.mark.parametrize("sealed_with", ["another key", "the user's key"])
def test_a_planted_library_is_not_loaded(cache_dir, tmp_path, sealed_with):
    marker, src = tmp_path / "constructor-ran", tmp_path / "planted.c"
    src.write_text(PLANTED_SO % marker)
    k = cache.key("model", "planted")
    with private.Folder.root(cache_dir) as root:
        secret = cache._secret(root)
    folder = cache_dir / "model" / k.split("-", 1)[1][:2]
    folder.mkdir(parents=True, mode=0o700)
    lib = folder / f"{k}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    meta = {"report": [], "so_sha256": hashlib.sha256(lib.read_bytes()).hexdigest()}
    (folder / f"{k}.meta").write_bytes(_forged(k, meta, os.urandom(32) if sealed_with == "another key" else secret))
    fresh()
    loaded = cache.load_library(k)
    if sealed_with == "another key":
        assert loaded is None and not marker.exists(), "a planted library was dlopened"
        assert not lib.exists()
    else:  # the control: this user's own seal is what makes a library loadable
        assert marker.exists() and loaded is not None


# -- entries that do not belong where they are ----------------------------------------------

def test_swapped_layer_entries_are_refused(cache_dir, counted):
    want = {layer: schedule(layer) for layer in (LAYER, OTHER)}
    a, b = entries(cache_dir, ".pkl")
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)
    fresh()
    for layer in (LAYER, OTHER):
        assert schedule(layer).geometry == want[layer].geometry
    assert len(counted) == 4


def test_an_entry_names_the_key_it_was_written_for(cache_dir):
    """A whole payload of another entry, sealed anew under this entry's name with this user's
    key, is refused for naming its own key: what keeps a torch.compile graph's entry (the name
    of a model, which no type check can tell from another's) from loading another graph's model."""
    ka, kb = cache.key("graph", "a"), cache.key("graph", "b")
    cache.put(ka, "model-a")
    cache.put(kb, "model-b")
    pa = next(p for p in entries(cache_dir, ".pkl") if p.stem == ka)
    pb = next(p for p in entries(cache_dir, ".pkl") if p.stem == kb)
    payload = pa.read_bytes()[len(cache._MAGIC) + 32:]
    with private.Folder.root(cache_dir) as root:
        pb.write_bytes(cache._MAGIC + cache._mac(cache._secret(root), kb, payload) + payload)
    fresh()
    assert cache.get(ka) == "model-a" and cache.get(kb) is None and not pb.exists()


def _wrong_blobs(secret: bytes, k: str, others: list[Path]) -> list[bytes]:
    """Entries sealed with this user's own key under `k` that hold something else: values no
    caller takes, other entries' real values, other entries' whole payloads (which name their
    own keys), bytes that do not unpickle."""
    payloads = [p.read_bytes()[len(cache._MAGIC) + 32:] for p in others]
    values = [[1, 2], {"geometry": None}, "text", None, 0] + [pickle.loads(r)[1] for r in payloads]
    raw = [b"not a pickle", pickle.dumps([1, 2])[:-1]] + payloads
    return [cache._sealed(secret, k, v) for v in values] + [cache._MAGIC + cache._mac(secret, k, r) + r for r in raw]


def test_sealed_but_wrong_layer_entries_are_rebuilt(cache_dir, counted, caplog):
    """The fuzz, for the entries layers are scheduled into (a direct conv's and a fused
    inverted residual block's): each forged entry ends in a rebuild of the right layer, never
    an exception."""
    block = ((1, 16, 8, 8), (32, 16, 1, 1), (32, 1, 3, 3))
    want = {layer: schedule(layer) for layer in (LAYER, OTHER)}
    want_block = dispatch.schedule_inverted(*block, target="x86-avx2")
    with private.Folder.root(cache_dir) as root:
        secret = cache._secret(root)
    paths = entries(cache_dir, ".pkl")
    assert sorted(p.parent.parent.name for p in paths) == ["inverted", "schedule", "schedule"]
    originals = {p: p.read_bytes() for p in paths}
    for path in paths:
        for i, blob in enumerate(_wrong_blobs(secret, path.stem, [p for p in paths if p != path])):
            path.write_bytes(blob)
            fresh()
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="tvm_microkernels.cache"):
                if path.parent.parent.name == "inverted":
                    lay, _, mod, plan = dispatch.schedule_inverted(*block, target="x86-avx2")
                    assert lay == want_block[0] and plan == want_block[3], i
                    tvm.ir.assert_structural_equal(mod, want_block[2])
                else:
                    for layer, s in want.items():
                        got = schedule(layer)
                        assert got.geometry == s.geometry and got.plan == s.plan, i
            assert "rebuilding it" in caplog.text, (path.parent.parent.name, i)
            path.write_bytes(originals[path])


def test_sealed_but_wrong_model_metadata_is_rebuilt(cache_dir):
    """The fuzz, for a built model's metadata, in a process of its own each time (a library is
    dlopened): a list, a dict without the library's digest, one with the digest but a report
    that is not a list of dicts, the layer's schedule, bytes that do not unpickle."""
    first = _run(MODEL, cache_dir)
    assert first.returncode == 0, first.stderr
    meta, = entries(cache_dir, ".meta")
    lib, = entries(cache_dir, ".so")
    with private.Folder.root(cache_dir) as root:
        secret = cache._secret(root)
    k, digest = meta.stem, hashlib.sha256(lib.read_bytes()).hexdigest()
    good = meta.read_bytes()
    schedule_entry, = entries(cache_dir, ".pkl")
    forged = [cache._sealed(secret, k, v) for v in ([digest], {"report": []}, {"so_sha256": digest, "report": "x"},
                                                   {"so_sha256": digest, "report": [1]})]
    forged += _wrong_blobs(secret, k, [schedule_entry])[-2:]  # its real value, its whole payload
    forged.append(cache._MAGIC + cache._mac(secret, k, b"junk") + b"junk")
    for i, blob in enumerate(forged):
        meta.write_bytes(blob)
        run = _run(MODEL, cache_dir)
        assert run.returncode == 0, (i, run.stderr[-3000:])
        assert run.stdout == first.stdout and "rebuilding it" in run.stderr, (i, run.stdout, run.stderr[-2000:])
        meta.write_bytes(good)


# -- eviction and the size variable -----------------------------------------------------------

def test_eviction_touches_only_the_caches_own_entries(cache_dir, monkeypatch):
    monkeypatch.setenv(cache.ENV_SIZE, str(50_000 / 2**20))
    cache_dir.mkdir(mode=0o700)
    keep = {cache_dir / "tuned.json": b"{}" * 50_000, cache_dir / "notes.txt": b"mine" * 20_000,
            cache_dir / "model" / "ab" / "not-an-entry.so": b"x" * 20_000}
    for p, data in keep.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    keys = [cache.key("test", i) for i in range(4)]
    for k in keys:
        cache.put(k, bytes(30_000))
    assert all(p.read_bytes() == data for p, data in keep.items()), "eviction deleted a file not its own"
    assert (cache_dir / ".key").exists()
    fresh()
    kept = [k for k in keys if cache.get(k) is not None]
    assert kept == keys[-1:], kept  # only the entries count towards the bound, and only they go


def test_tuned_json_survives_builds_under_a_small_bound(tmp_path):
    """The issue's case: the default folder, TVM_MICROKERNELS_CACHE_MB=0.1, three builds."""
    home = tmp_path / "xdg"
    (home / "tvm-microkernels").mkdir(parents=True, mode=0o700)
    tuned_json = home / "tvm-microkernels" / "tuned.json"
    tuned_json.write_text('{"host": "measured here"}')
    script = textwrap.dedent("""
        from schedules.common import cache
        for i in range(3):
            cache.put(cache.key("test", i), bytes(60_000))
    """)
    env = {**os.environ, "XDG_CACHE_HOME": str(home), "TVM_MICROKERNELS_CACHE_MB": "0.1"}
    env.pop(cache.ENV_DIR)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert tuned_json.read_text() == '{"host": "measured here"}'
    assert len(list((home / "tvm-microkernels" / "test").rglob("*.pkl"))) == 1


@pytest.mark.parametrize("raw, bound", [("inf", float("inf")), ("1", 2**20), ("0.5", 2**19), ("", 2048 * 2**20)])
def test_the_size_variable(monkeypatch, raw, bound):
    monkeypatch.setenv(cache.ENV_SIZE, raw)
    assert cache.limit_bytes() == bound


@pytest.mark.parametrize("raw", ["abc", "nan", "-1", "-inf"])
def test_a_bad_size_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv(cache.ENV_SIZE, raw)
    with pytest.raises(ValueError, match=f"TVM_MICROKERNELS_CACHE_MB='{raw}'"):
        cache.limit_bytes()


def test_an_unbounded_cache_keeps_everything(cache_dir, monkeypatch):
    monkeypatch.setenv(cache.ENV_SIZE, "inf")
    for i in range(3):
        cache.put(cache.key("test", i), bytes(10_000))
    assert len(entries(cache_dir, ".pkl")) == 3


def test_new_folders_and_entries_are_private(cache_dir):
    schedule()
    entry, = entries(cache_dir, ".pkl")
    for p in (cache_dir, entry.parent.parent, entry.parent):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    for p in (entry, cache_dir / ".key"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
