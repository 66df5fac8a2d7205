"""Opening files that someone else may have made: never block on them, never write through a link.

Run directories are shared and downloaded (tar keeps symbolic links, FIFOs and device
nodes), and the ``os`` environment's host reads files that the sandbox's processes made. Every
reader and writer of such a file goes through this module (the checkpoint's files,
``config.yaml``, ``state.json``, ``metrics.jsonl``, the lock, the report's and ``eval``'s
outputs; the ``os`` checkers' reads through ``/proc``):

* **Reading**: :func:`open_fd` opens with ``O_NONBLOCK`` (a FIFO or a device cannot make the
  open wait) and ``O_NOFOLLOW`` (unless ``follow_symlinks``), then ``fstat``-s the descriptor
  and refuses anything but a regular file with :class:`UnsafeFileError`, naming the path and
  what it is. A size limit (``limit``) refuses a file larger than its reader expects before
  it is read; :func:`read_text` names the file in a UTF-8 error.
* **Writing in place** (:func:`open_append`, the lock): the same open, with ``O_CREAT``: a
  symbolic link at the name is refused, never followed, so nothing outside the directory is
  appended to or truncated.
* **Writing a whole file** (:func:`atomic_write`, :func:`write_atomic`): into a new temporary
  sibling (``O_CREAT | O_EXCL | O_NOFOLLOW``), renamed over the name: whatever was at the
  name (a symbolic link included) is replaced, never written through, and a reader never
  sees half a file.
* **Directories written into** (:func:`make_dir`): created if missing, refused if the name is
  a symbolic link.

Only the last component of a path is checked: the directory a user names (``--run-dir``,
``--out``) may itself be a link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = [
    "UnsafeFileError",
    "atomic_write",
    "make_dir",
    "open_append",
    "open_fd",
    "open_read",
    "read_bytes",
    "read_text",
    "regular_path",
    "write_atomic",
]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


class UnsafeFileError(OSError):
    """A file that is not what its reader or writer may open: not a regular file (a FIFO, a
    device, a socket, a directory), a symbolic link where none is followed, or larger than the
    reader's limit. The message names the path and the reason."""


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_fd(
    path: str | os.PathLike[str],
    flags: int = os.O_RDONLY,
    mode: int = 0o644,
    *,
    follow_symlinks: bool = False,
) -> int:
    """``os.open(path, flags)`` that never blocks and never leaves a non-regular file open.

    Adds ``O_NONBLOCK`` (cleared again once the file is known to be regular), ``O_CLOEXEC``
    and, unless ``follow_symlinks``, ``O_NOFOLLOW``. Returns the descriptor of a regular file.

    Raises:
        UnsafeFileError: the path is a symbolic link (not followed) or not a regular file.
        OSError: any other failure (``FileNotFoundError``, ``PermissionError``, ...).
    """
    extra = os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags | extra, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks and os.path.islink(path):
            raise UnsafeFileError(
                f"{os.fspath(path)}: is a symbolic link; refused (not followed)"
            ) from None
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened for writing without reader
            try:
                what = _kind(os.stat(path, follow_symlinks=follow_symlinks).st_mode)
            except OSError:
                what = "not a regular file"
            raise UnsafeFileError(f"{os.fspath(path)}: is {what}; refused") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFileError(
                f"{os.fspath(path)}: is {_kind(info.st_mode)}, not a regular file; refused"
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_read(path: str | os.PathLike[str], *, follow_symlinks: bool = False) -> IO[bytes]:
    """A binary file object of the regular file ``path`` (:func:`open_fd`)."""
    return os.fdopen(open_fd(path, follow_symlinks=follow_symlinks), "rb")


def read_bytes(
    path: str | os.PathLike[str], *, limit: int | None = None, follow_symlinks: bool = False
) -> bytes:
    """The content of the regular file ``path``; ``limit``: refuse one of more bytes (checked
    before reading, and again while reading a file that grows)."""
    with open_read(path, follow_symlinks=follow_symlinks) as f:
        if limit is not None:
            size = os.fstat(f.fileno()).st_size
            data = f.read(limit + 1) if size <= limit else b""
            if size > limit or len(data) > limit:
                raise UnsafeFileError(
                    f"{os.fspath(path)}: is {max(size, len(data)):,} bytes or more; at most "
                    f"{limit:,} expected; refused"
                )
            return data
        return f.read()


def read_text(
    path: str | os.PathLike[str], *, limit: int | None = None, follow_symlinks: bool = False
) -> str:
    """:func:`read_bytes` decoded as UTF-8; a ``ValueError`` naming the file and the offset
    when it is not UTF-8."""
    data = read_bytes(path, limit=limit, follow_symlinks=follow_symlinks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{os.fspath(path)}: not UTF-8 text (byte {exc.start}: {exc.reason})"
        ) from None


@contextlib.contextmanager
def regular_path(path: str | os.PathLike[str], *, follow_symlinks: bool = False) -> Iterator[str]:
    """A path for a library that opens files by name (safetensors), naming the regular file
    ``path`` as it was checked: ``/proc/self/fd/N`` of the checked descriptor (the same file
    even if the name is replaced meanwhile), or ``path`` itself where ``/proc`` is missing."""
    fd = open_fd(path, follow_symlinks=follow_symlinks)
    try:
        proc = f"/proc/self/fd/{fd}"
        yield proc if os.path.exists(proc) else os.fspath(path)
    finally:
        os.close(fd)


def open_append(path: str | os.PathLike[str], *, encoding: str = "utf-8") -> IO[str]:
    """``open(path, "a")`` that refuses a symbolic link or a non-regular file at ``path``."""
    fd = open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "a", encoding=encoding)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], *, fsync: bool = False) -> Iterator[IO[bytes]]:
    """Write ``path`` whole: yields a binary file object of a new temporary sibling, renamed
    over ``path`` when the block ends without error (removed otherwise). Whatever was at
    ``path``, a symbolic link included, is replaced, never written through. ``fsync``: flush
    the data to disk before the rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, fsync: bool = False) -> Path:
    """Write ``data`` (``str`` as UTF-8) to ``path`` with :func:`atomic_write`; returns it."""
    with atomic_write(path, fsync=fsync) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def make_dir(path: str | os.PathLike[str]) -> Path:
    """Create the directory ``path`` (and its parents) if missing; refuse it when the name is
    a symbolic link or something else than a directory (:class:`UnsafeFileError`)."""
    path = Path(path)
    if path.is_symlink():
        raise UnsafeFileError(f"{path}: is a symbolic link; refused (not followed)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UnsafeFileError(
            f"{path}: is {_kind(path.lstat().st_mode)}, not a directory; refused"
        ) from None
    return path
