"""Folders only this user can change, held open by descriptor: what the compile cache reads,
writes and loads code from (cache.py).

The trust model is ssh's: a folder is trusted when it is a real folder (not a symlink), owned by
this user, and neither its group nor others may write to it; the folders above it must be owned
by this user or root and not writable by others either, unless the sticky bit keeps others from
renaming what is not theirs (/tmp). Inside a trusted folder every subfolder and file is opened
relative to its parent's descriptor with O_NOFOLLOW, and must pass the same test: a symlink, a
file another user owns or one anyone else may write is refused (`Untrusted`), never followed.
Whoever can write the folder as this user can run code as this user anyway; nobody else can
change what is loaded from it.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import sys
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class Untrusted(OSError):
    """A folder or file that someone other than this user could have written."""


def _owner() -> int:
    return os.geteuid()


def _check(st: os.stat_result, where: str, kind: str) -> None:
    """Refuse what is not a `kind` ("folder" or "file") of this user's that only they can write."""
    is_kind = stat.S_ISDIR(st.st_mode) if kind == "folder" else stat.S_ISREG(st.st_mode)
    if not is_kind:
        raise Untrusted(f"{where} is not a {kind} (a symlink or a special file?)")
    if st.st_uid != _owner():
        raise Untrusted(f"{where} is owned by uid {st.st_uid}, not by this user (uid {_owner()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Untrusted(f"{where} may be written by its group or by others (mode {stat.S_IMODE(st.st_mode):o})")


def _check_ancestor(path: Path) -> None:
    st = os.lstat(path)
    if st.st_uid not in (0, _owner()):
        raise Untrusted(f"{path}, above the folder, is owned by uid {st.st_uid}, not by this user or root")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise Untrusted(f"{path}, above the folder, may be written by its group or by others "
                        f"(mode {stat.S_IMODE(st.st_mode):o}, no sticky bit)")


class Folder:
    """A trusted folder held open: names inside it are opened relative to its descriptor."""

    def __init__(self, fd: int, path: Path):
        self.fd, self.path = fd, path

    @classmethod
    def root(cls, path: Path, create: bool = True) -> Folder:
        """The folder at `path` (made 0700, with its missing parents, when `create`), after checking
        it and every folder above it. The path may pass through the user's own symlinks above the
        folder (it is resolved first); the folder's descriptor is what is used from then on."""
        path = Path(path).expanduser()
        if create:
            os.makedirs(path, mode=0o700, exist_ok=True)
        real = Path(os.path.realpath(path))
        for above in real.parents:
            _check_ancestor(above)
        fd = os.open(real, _DIR)
        try:
            _check(os.fstat(fd), str(real), "folder")
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, real)

    def sub(self, name: str, create: bool = True) -> Folder:
        """The subfolder `name`, made 0700 when missing and `create`; FileNotFoundError when missing."""
        if create:
            try:
                os.mkdir(name, 0o700, dir_fd=self.fd)
            except FileExistsError:
                pass
        try:
            fd = os.open(name, _DIR, dir_fd=self.fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):  # what O_NOFOLLOW | O_DIRECTORY say of a symlink
                raise Untrusted(f"{self.path / name} is not a folder (a symlink?)") from None
            raise
        try:
            _check(os.fstat(fd), str(self.path / name), "folder")
        except BaseException:
            os.close(fd)
            raise
        return Folder(fd, self.path / name)

    def read(self, name: str) -> bytes:
        """The whole file `name`, after checking it (FileNotFoundError when there is none)."""
        try:
            fd = os.open(name, _READ, dir_fd=self.fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Untrusted(f"{self.path / name} is a symlink") from None
            raise
        with os.fdopen(fd, "rb") as f:
            _check(os.fstat(fd), str(self.path / name), "file")
            return f.read()

    def write(self, name: str, data: bytes) -> None:
        """Write a temporary file 0600 beside `name`, then rename it into place: readers in other
        processes see the old file or the whole new one, never a part."""
        tmp = self._temporary(name, data)
        try:
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            self.unlink(tmp)
            raise

    def create_once(self, name: str, data: bytes) -> bool:
        """Put `data` at `name` unless something is there already (never replaced): True if it was
        written by this call. A whole file appears at once or not at all."""
        tmp = self._temporary(name, data)
        try:
            os.link(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)
            return True
        except FileExistsError:
            return False
        finally:
            self.unlink(tmp)

    def _temporary(self, name: str, data: bytes) -> str:
        """`data` in a new file 0600 beside `name` (a hidden name of its own), which is returned."""
        tmp = f".{name}.{secrets.token_hex(6)}"
        fd = os.open(tmp, _CREATE, 0o600, dir_fd=self.fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        except BaseException:
            self.unlink(tmp)
            raise
        return tmp

    def unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass

    def touch(self, name: str) -> None:
        try:
            os.utime(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            pass

    def where(self, name: str) -> str:
        """A path to `name` that goes through this folder's descriptor (for loaders that take a
        path): on Linux no one can move the folder under it between the check and the load."""
        if sys.platform.startswith("linux"):
            return f"/proc/self/fd/{self.fd}/{name}"
        return str(self.path / name)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
