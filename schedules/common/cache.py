"""The compile cache: scheduled layers and compiled models kept on disk, so a second process
(or a second identical layer in one model) skips TVMScript parsing, tensorize and LLVM.

Where: $TVM_MICROKERNELS_CACHE, else $XDG_CACHE_HOME/tvm-microkernels, else
~/.cache/tvm-microkernels; TVM_MICROKERNELS_CACHE=off turns every level off, the in-process one
included. Size: at most $TVM_MICROKERNELS_CACHE_MB MiB (default 2048); after each store the
least recently used entries go until it fits.

Keys are SHA-256 digests of what the result depends on, including the project's own source
(every .py and .c file of microkernels, intrinsics and schedules: a changed kernel or planner
invalidates everything it could have produced), TVM's version and this host's cache sizes and
core count (the planners read them). Entries are written to a temporary file and renamed into
place, so concurrent processes only ever see whole files; each payload carries its digest, and
one that does not match (a truncated or corrupted file) is deleted and rebuilt, never loaded.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import logging
import os
import pickle
import sys
import tempfile
from pathlib import Path

from . import files, tuned

LOG = logging.getLogger("tvm_microkernels.cache")
ENV_DIR = "TVM_MICROKERNELS_CACHE"
ENV_SIZE = "TVM_MICROKERNELS_CACHE_MB"
DEFAULT_MB = 2048
_PACKAGES = ("microkernels", "intrinsics", "schedules")
_MEMORY: dict[str, object] = {}  # this process's loads and stores, by key
_CHILDREN: list[int] = []  # put_library's exports still running


def directory() -> Path | None:
    """The cache's root, or None when TVM_MICROKERNELS_CACHE turns it off."""
    return files.from_env(ENV_DIR, files.user_folder())


def enabled() -> bool:
    return directory() is not None


def limit_bytes() -> int:
    raw = os.environ.get(ENV_SIZE, "")
    try:
        return int(float(raw) * 2**20) if raw else DEFAULT_MB * 2**20
    except ValueError:
        raise ValueError(f"{ENV_SIZE}={raw!r}: expected a size in MiB") from None


@functools.lru_cache(maxsize=None)
def code_version() -> str:
    """Digest of the packages' sources and TVM's version: part of every key."""
    import tvm

    from .targets import host_caches

    h = hashlib.sha256(f"tvm {tvm.__version__}; cores {os.cpu_count()}; caches {host_caches()}".encode())
    root = Path(__file__).resolve().parents[2]
    for pkg in _PACKAGES:
        for path in sorted((root / pkg).rglob("*")):
            if path.suffix in (".py", ".c") and path.is_file():
                h.update(str(path.relative_to(root)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()


def key(kind: str, *parts) -> str:
    """A key for `parts` (their reprs, which must name every input the result depends on), the
    sources and this host's measurements (tuned.py: the planners read them)."""
    h = hashlib.sha256(f"{kind}\0{code_version()}\0{tuned.fingerprint()}".encode())
    for p in parts:
        h.update(b"\0" + repr(p).encode())
    return f"{kind}-{h.hexdigest()[:40]}"


def _path(k: str, suffix: str) -> Path:
    kind, digest = k.split("-", 1)
    return directory() / kind / digest[:2] / f"{k}{suffix}"


def _sealed(payload: bytes) -> bytes:
    return hashlib.sha256(payload).digest() + payload


def _unsealed(blob: bytes) -> bytes | None:
    digest, payload = blob[:32], blob[32:]
    return payload if len(blob) >= 32 and hashlib.sha256(payload).digest() == digest else None


def _drop(path: Path, why: str) -> None:
    LOG.warning("cache entry %s %s; rebuilding it", path, why)
    path.unlink(missing_ok=True)


def get(k: str):
    """The object stored under `k` (this process's copy first), or None."""
    if k in _MEMORY:
        return _MEMORY[k]
    root = directory()
    if root is None:
        return None
    path = _path(k, ".pkl")
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    payload = _unsealed(blob)
    if payload is None:
        _drop(path, "does not match its digest")
        return None
    try:
        value = pickle.loads(payload)
    except Exception as e:  # a digest-valid payload an older pickle cannot read
        _drop(path, f"does not unpickle ({type(e).__name__}: {e})")
        return None
    _touch(path)
    _MEMORY[k] = value
    return value


def cached(kind: str, parts: tuple, make):
    """make(), or the value a call with the same `parts` made before (in this process or
    another); stored after making it. Just make() when the cache is off."""
    if not enabled():
        return make()
    k = key(kind, *parts)
    value = get(k)
    if value is None:
        value = make()
        put(k, value)
    return value


def put(k: str, value) -> None:
    """Keep `value` under `k`, in this process and on disk (a failure to write is logged, not
    raised: the cache must never break a build)."""
    if directory() is None:
        return
    _MEMORY[k] = value
    try:
        files.write_atomic(_path(k, ".pkl"), _sealed(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)))
        evict()
    except OSError as e:
        LOG.warning("could not write cache entry %s: %s", k, e)


def load_library(k: str):
    """A compiled module stored with put_library, checked against its digest, and its metadata:
    (module, meta) or None."""
    root = directory()
    if root is None:
        return None
    lib, meta_path = _path(k, ".so"), _path(k, ".meta")
    try:
        meta_blob, lib_bytes = meta_path.read_bytes(), lib.read_bytes()
    except OSError:
        return None
    payload = _unsealed(meta_blob)
    meta = pickle.loads(payload) if payload is not None else None
    if meta is None or meta.get("so_sha256") != hashlib.sha256(lib_bytes).hexdigest():
        _drop(meta_path, "(or its library) does not match its digest")
        lib.unlink(missing_ok=True)
        return None
    import tvm

    _touch(meta_path)
    _touch(lib)
    return tvm.runtime.load_module(str(lib)), meta


def put_library(k: str, executable, meta: dict) -> None:
    """export_library into the cache: the library first, then its metadata with the library's
    digest, so a reader that finds the metadata finds the library it describes.

    Exporting emits the model's object code again and links its constants into the library:
    2.8 s for ResNet-50's 118 MB, half of what the build itself now takes. On Linux a forked
    child does it, so the build returns at once; the child holds a copy-on-write snapshot of
    the executable, shares nothing the caller goes on to change, and writes atomically as every
    writer does. (A thread exporting while the VM ran crashed the process.) `wait()` joins the
    children, and does at exit, so a short script still leaves the entry behind."""
    if directory() is None:
        return
    if not sys.platform.startswith("linux"):
        _put_library(k, executable, meta)
        return
    _reap(block=False)
    pid = os.fork()
    if pid == 0:  # the child: export, then leave without running the parent's exit handlers
        code = 1
        try:
            _put_library(k, executable, meta)
            code = 0
        finally:
            os._exit(code)
    _CHILDREN.append(pid)


def wait() -> None:
    """Wait for the library exports this process started (put_library)."""
    _reap(block=True)


def _reap(block: bool) -> None:
    for pid in list(_CHILDREN):
        try:
            done, _ = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _CHILDREN.remove(pid)


atexit.register(wait)


def _put_library(k: str, executable, meta: dict) -> None:
    lib, meta_path = _path(k, ".so"), _path(k, ".meta")
    try:
        lib.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=lib.parent, prefix=".build-") as tmp:
            built = Path(tmp) / "lib.so"
            executable.export_library(str(built))
            data = built.read_bytes()
            os.replace(built, lib)
        files.write_atomic(meta_path, _sealed(pickle.dumps({**meta, "so_sha256": hashlib.sha256(data).hexdigest()})))
        evict()
    except Exception as e:  # the build has its executable: a failed copy is logged, not raised
        LOG.warning("could not write cache entry %s: %s", k, e)


def _touch(path: Path) -> None:
    try:
        os.utime(path)  # the eviction's "recently used"
    except OSError:
        pass


def evict() -> None:
    """Delete least recently used files until the cache fits its limit."""
    root = directory()
    if root is None or not root.exists():
        return
    files = []
    for p in root.rglob("*"):
        try:
            if p.is_file() and not p.name.startswith("."):
                st = p.stat()
                files.append((st.st_mtime, st.st_size, p))
        except OSError:
            continue  # another process evicted it
    total, limit = sum(s for _, s, _ in files), limit_bytes()
    for _, size, p in sorted(files, key=lambda f: f[0]):
        if total <= limit:
            break
        p.unlink(missing_ok=True)
        total -= size


def clear_memory() -> None:
    """Forget this process's copies (the disk keeps its own): for tests and benchmarks."""
    _MEMORY.clear()
