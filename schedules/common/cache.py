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
place, so concurrent processes only ever see whole files.

Trust: entries are unpickled and libraries dlopened, so the cache only uses a folder that only
this user can change (private.py: owner, mode, no symlinks inside, each file opened through its
verified folder); any other folder is warned about once and the build goes on without it. Each
entry is sealed with an HMAC-SHA256 under a key of this user's (`.key` in the folder, 0600)
over the entry's own key and its payload, and its payload names that key again: a damaged
entry, one written under another name, one whose library does not match its metadata, or one
holding what its caller cannot take is deleted and rebuilt, never loaded.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import hmac
import logging
import math
import os
import pickle
import re
import secrets
import shutil
import signal
import stat
import sys
from pathlib import Path

from intrinsics import interrupts

from . import files, tuned
from .private import Folder

LOG = logging.getLogger("tvm_microkernels.cache")
ENV_DIR = "TVM_MICROKERNELS_CACHE"
ENV_SIZE = "TVM_MICROKERNELS_CACHE_MB"
DEFAULT_MB = 2048
_PACKAGES = ("microkernels", "intrinsics", "schedules")
_MEMORY: dict[str, object] = {}  # this process's loads and stores, by key
_CHILDREN: list[int] = []  # put_library's exports still running
_WARNED: set[str] = set()
_SECRETS: dict[str, bytes] = {}  # the user's HMAC key, by cache folder
_KEY_FILE, _KEY_BYTES = ".key", 32
_MAGIC = b"tvm-microkernels cache entry 2\n"
_ENTRY = re.compile(r"(?P<kind>[A-Za-z0-9_]+)-(?P<digest>[0-9a-f]{40})\.(?:pkl|so|meta)")


def directory() -> Path | None:
    """The cache's root, or None when TVM_MICROKERNELS_CACHE turns it off."""
    return files.from_env(ENV_DIR, files.user_folder())


def enabled() -> bool:
    return directory() is not None


def limit_bytes() -> float:
    """The size bound in bytes: TVM_MICROKERNELS_CACHE_MB MiB (`inf`: no bound)."""
    raw = os.environ.get(ENV_SIZE, "")
    try:
        mib = float(raw) if raw else DEFAULT_MB
    except ValueError:
        mib = math.nan
    if math.isnan(mib) or mib < 0:
        raise ValueError(f"{ENV_SIZE}={raw!r}: expected a size in MiB, 0 or more (or inf for no bound)")
    return mib * 2**20


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


def is_key(value, kind: str) -> bool:
    """Whether `value` is a key of `kind` as key() makes them (an entry naming another entry)."""
    return isinstance(value, str) and re.fullmatch(rf"{re.escape(kind)}-[0-9a-f]{{40}}", value) is not None


def _warn_once(what: str, message: str, *args) -> None:
    if what not in _WARNED:
        _WARNED.add(what)
        LOG.warning(message, *args)


@contextlib.contextmanager
def _folder(k: str | None = None, create: bool = True):
    """The cache's folder (or, given a key, the folder of its entries: <kind>/<first two hex
    digits>), opened and checked, with this user's HMAC key: (Folder, secret), or None when
    the cache is off, missing and not `create`d, or untrusted (warned once)."""
    root = directory()
    if root is None:
        yield None
        return
    with contextlib.ExitStack() as stack:
        try:
            if not create and not root.exists():
                raise FileNotFoundError(root)
            folder = stack.enter_context(Folder.root(root, create))
            secret = _secret(folder)
            if k is not None:
                kind, digest = k.split("-", 1)
                folder = stack.enter_context(stack.enter_context(folder.sub(kind, create)).sub(digest[:2], create))
        except FileNotFoundError:
            folder = None
        except OSError as e:
            _warn_once(f"{root} {e}", "the compile cache folder is not used, builds go on without it: %s", e)
            folder = None
        yield None if folder is None else (folder, secret)


def _secret(root: Folder) -> bytes:
    """This user's HMAC key, kept 0600 in the cache's folder (made on first use)."""
    if root.path.as_posix() not in _SECRETS:
        root.create_once(_KEY_FILE, secrets.token_bytes(_KEY_BYTES))
        data = root.read(_KEY_FILE)
        mode = os.stat(_KEY_FILE, dir_fd=root.fd, follow_symlinks=False).st_mode
        if len(data) != _KEY_BYTES or mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise PermissionError(f"{root.path / _KEY_FILE} is not a {_KEY_BYTES}-byte key only this user "
                                  f"can read (mode {stat.S_IMODE(mode):o})")
        _SECRETS[root.path.as_posix()] = data
    return _SECRETS[root.path.as_posix()]


def _mac(secret: bytes, k: str, payload: bytes) -> bytes:
    return hmac.new(secret, k.encode() + b"\0" + payload, hashlib.sha256).digest()


def _sealed(secret: bytes, k: str, value) -> bytes:
    """An entry: the format's mark, the HMAC of (key, payload), the payload: (key, value) pickled."""
    payload = pickle.dumps((k, value), protocol=pickle.HIGHEST_PROTOCOL)
    return _MAGIC + _mac(secret, k, payload) + payload


def _opened(secret: bytes, k: str, blob: bytes, valid=None):
    """(True, value) for an entry sealed under `k` by this user holding what `valid` accepts,
    else (False, why). Nothing is unpickled before its HMAC is checked."""
    n = len(_MAGIC) + 32
    if len(blob) < n or not blob.startswith(_MAGIC):
        return False, "is not a cache entry of this version"
    payload = blob[n:]
    if not hmac.compare_digest(blob[len(_MAGIC):n], _mac(secret, k, payload)):
        return False, "does not match its HMAC (damaged, written under another name, or not by this user)"
    try:
        written_for, value = pickle.loads(payload)
    except Exception as e:
        return False, f"does not unpickle ({type(e).__name__}: {e})"
    if written_for != k:
        return False, f"was written for another key ({written_for!r})"
    if valid is not None and not valid(value):
        return False, f"holds a {type(value).__name__}, not what its caller takes"
    return True, value


def _drop(folder: Folder, name: str, why: str) -> None:
    LOG.warning("cache entry %s %s; rebuilding it", folder.path / name, why)
    folder.unlink(name)


def _read(folder: Folder, *names: str) -> list[bytes] | None:
    """The files' contents, or None when one is missing or refused (a refusal warned once)."""
    try:
        return [folder.read(n) for n in names]
    except FileNotFoundError:
        return None
    except OSError as e:
        _warn_once(f"{folder.path} {e}", "cache entry not used: %s", e)
        return None


def get(k: str, valid=None):
    """The object stored under `k` (this process's copy first), or None; one that `valid` (a
    predicate, when given) rejects is dropped and None returned, so the caller remakes it."""
    if k in _MEMORY and (valid is None or valid(_MEMORY[k])):
        return _MEMORY[k]
    name = f"{k}.pkl"
    with _folder(k, create=False) as found:
        if found is None:
            return None
        folder, secret = found
        blobs = _read(folder, name)
        if blobs is None:
            return None
        ok, value = _opened(secret, k, blobs[0], valid)
        if not ok:
            _drop(folder, name, value)
            return None
        folder.touch(name)
    _MEMORY[k] = value
    return value


def cached(kind: str, parts: tuple, make, valid=None):
    """make(), or the value a call with the same `parts` made before (in this process or
    another); stored after making it. Just make() when the cache is off. `valid`: a predicate
    the value must pass (what make() returns), checked on every entry read from disk."""
    if not enabled():
        return make()
    k = key(kind, *parts)
    value = get(k, valid)
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
    with _folder(k) as found:
        if found is None:
            return
        folder, secret = found
        try:
            folder.write(f"{k}.pkl", _sealed(secret, k, value))
        except OSError as e:
            LOG.warning("could not write cache entry %s: %s", k, e)
            return
    evict()


def _valid_meta(meta) -> bool:
    return (isinstance(meta, dict) and isinstance(meta.get("so_sha256"), str)
            and isinstance(meta.get("report"), list) and all(isinstance(r, dict) for r in meta["report"]))


def load_library(k: str):
    """A compiled module stored with put_library, checked against its metadata, and that
    metadata: (module, meta) or None."""
    lib, meta_name = f"{k}.so", f"{k}.meta"
    with _folder(k, create=False) as found:
        if found is None:
            return None
        folder, secret = found
        blobs = _read(folder, meta_name, lib)
        if blobs is None:
            return None
        meta_blob, lib_bytes = blobs
        ok, meta = _opened(secret, k, meta_blob, _valid_meta)
        if ok and meta["so_sha256"] != hashlib.sha256(lib_bytes).hexdigest():
            ok, meta = False, "does not describe the library beside it"
        if not ok:
            _drop(folder, meta_name, meta)
            folder.unlink(lib)
            return None
        import tvm

        folder.touch(meta_name)
        folder.touch(lib)
        try:  # through the checked folder's descriptor: only this user can change the file
            return tvm.runtime.load_module(folder.where(lib)), meta
        except Exception as e:  # this user's own entry, sealed, yet not a module TVM loads
            _drop(folder, meta_name, f"names a library TVM does not load ({type(e).__name__}: {e})")
            folder.unlink(lib)
            return None


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
    with interrupts.deferred():  # an interrupt here would leave a child no one reaps
        pid = os.fork()
        if pid == 0:  # the child: export, then leave without running the parent's exit handlers
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's; the export completes
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
    with _folder(k) as found:
        if found is None:
            return
        folder, secret = found
        build = f".build-{secrets.token_hex(6)}"
        try:
            os.mkdir(build, 0o700, dir_fd=folder.fd)
            try:  # by path (the linker is another process), inside folders only this user can write
                built = folder.path / build / "lib.so"
                executable.export_library(str(built))
                data = built.read_bytes()
                os.replace(f"{build}/lib.so", f"{k}.so", src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
            finally:
                shutil.rmtree(folder.path / build, ignore_errors=True)
            folder.write(f"{k}.meta", _sealed(secret, k, {**meta, "so_sha256": hashlib.sha256(data).hexdigest()}))
        except Exception as e:  # the build has its executable: a failed copy is logged, not raised
            LOG.warning("could not write cache entry %s: %s", k, e)
            return
    evict()


def evict() -> None:
    """Delete the least recently used entries until the cache fits its limit. Only the cache's
    own entries (<kind>/<2 hex digits>/<kind>-<40 hex digits>.pkl|.so|.meta, regular files)
    count and go: anything else in the folder (tuned.json, the key) is left alone."""
    limit = limit_bytes()
    with _folder(create=False) as found:
        if found is None:
            return
        root = found[0]
        entries = []
        for where, _, names, fd in os.fwalk(".", dir_fd=root.fd, follow_symlinks=False):
            for name in names:
                m = _ENTRY.fullmatch(name)
                if not m or Path(where).parts != (m["kind"], m["digest"][:2]):
                    continue
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue  # another process evicted it
                if stat.S_ISREG(st.st_mode):
                    entries.append((st.st_mtime, st.st_size, m["kind"], m["digest"][:2], name))
        total = sum(e[1] for e in entries)
        for _, size, kind, shard, name in sorted(entries):
            if total <= limit:
                break
            try:  # through the checked folders again, never a path that could have become a symlink
                with root.sub(kind, create=False) as k, k.sub(shard, create=False) as folder:
                    folder.unlink(name)
            except OSError:
                continue
            total -= size


def clear_memory() -> None:
    """Forget this process's copies (the disk keeps its own): for tests and benchmarks."""
    _MEMORY.clear()
