"""The episode's files as data: build the initial tar archive, read a returned one in memory.

The host never extracts an archive that a sandbox produced: :func:`read_tree` walks it with
:mod:`tarfile` and returns plain data (paths relative to ``/work``), which the verifiers
inspect.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from dataclasses import dataclass

__all__ = ["Entry", "FileSpec", "WorkTree", "build_archive", "read_etc", "read_tree"]

_UID = 1000
#: Fixed modification time of generated files (2024-03-01 00:00:00 UTC), so archives are
#: byte-for-byte deterministic.
BASE_MTIME = 1_709_251_200


@dataclass(frozen=True)
class FileSpec:
    """One generated regular file: ``path`` relative to ``/work``, its bytes and mode."""

    path: str
    content: bytes
    mode: int = 0o644
    mtime: int = BASE_MTIME


@dataclass(frozen=True)
class Entry:
    """One entry of a returned work tree.

    Attributes:
        kind: ``"file"``, ``"dir"``, ``"symlink"`` or ``"other"``.
        mode: permission bits (``0o777`` mask).
        content: the bytes of a regular file (``b""`` otherwise).
        target: a symlink's target (``""`` otherwise).
    """

    kind: str
    mode: int
    content: bytes = b""
    target: str = ""


WorkTree = dict[str, Entry]
"""Path relative to ``/work`` (e.g. ``"logs/app-0.log"``) -> entry; the root is not listed."""


def _dirs_of(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def build_archive(files: list[FileSpec], etc: dict[str, bytes] | None = None) -> bytes:
    """A tar archive (GNU format) with root ``work/`` holding ``files`` and their parent dirs,
    plus ``etc/<name>`` for each of ``etc`` (the persistent sandbox's ``/etc`` files).

    Deterministic: same files -> same bytes (fixed owner, mtimes and member order).
    """
    dirs = sorted({d for f in files for d in _dirs_of(f.path)})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in ["", *dirs]:
            info = tarfile.TarInfo(posixpath.join("work", name).rstrip("/"))
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, BASE_MTIME
            info.uid = info.gid = _UID
            tar.addfile(info)
        for f in sorted(files, key=lambda f: f.path):
            info = tarfile.TarInfo(f"work/{f.path}")
            info.size, info.mode, info.mtime = len(f.content), f.mode, f.mtime
            info.uid = info.gid = _UID
            tar.addfile(info, io.BytesIO(f.content))
        for name, content in sorted((etc or {}).items()):
            info = tarfile.TarInfo(f"etc/{name}")
            info.size, info.mode, info.mtime = len(content), 0o644, BASE_MTIME
            info.uid = info.gid = _UID
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def read_etc(archive: bytes) -> dict[str, bytes]:
    """The regular files directly under ``etc/`` in ``archive`` (name -> bytes; links and
    other kinds are left out), read in memory."""
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        for member in tar:
            name = member.name
            if name.startswith("etc/") and "/" not in name[4:] and member.isreg():
                f = tar.extractfile(member)
                out[name[4:]] = f.read() if f is not None else b""
    return out


def read_tree(archive: bytes) -> WorkTree:
    """The entries of ``archive`` under ``work/`` (read in memory, never extracted)."""
    tree: WorkTree = {}
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        for member in tar:
            name = member.name.rstrip("/")
            if not name.startswith("work/"):
                continue
            rel = name[len("work/") :]
            mode = member.mode & 0o777
            if member.isreg():
                f = tar.extractfile(member)
                tree[rel] = Entry("file", mode, f.read() if f is not None else b"")
            elif member.islnk():  # a hard link: same content as its target
                target = tree.get(member.linkname.removeprefix("work/"))
                content = target.content if target is not None else b""
                tree[rel] = Entry("file", mode, content)
            elif member.isdir():
                tree[rel] = Entry("dir", mode)
            elif member.issym():
                tree[rel] = Entry("symlink", mode, target=member.linkname)
            else:
                tree[rel] = Entry("other", mode)
    return tree
