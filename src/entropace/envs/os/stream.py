"""Decode what a sandboxed command sends back: its new work tree, its output, its exit status.

The sandbox's wrapper ends with ``tar -c -f - work .io/out .meta/rc`` on stdout. Everything in
that stream was shaped by the command (it owns ``/work``, ``/.io`` and ``/.meta`` while it
runs), so :func:`decode_stream` trusts nothing in it:

* ``.io/out`` and ``.meta/rc`` count only as **regular files**. A command may replace them by
  a symlink (to itself, to nothing, to a work file), a hard link, a FIFO or a directory;
  :mod:`tarfile` would then resolve the link inside the archive (``RecursionError`` for a
  self-link, ``KeyError`` for a missing target). The output then reads as empty, a missing or
  unreadable exit status discards the command's changes.
* Work members are copied into a fresh archive without resolving anything: only regular files
  have data; links keep their target as text.
* ``tar -c`` must have read everything (exit status 0): a file or directory its owner cannot
  read (``chmod 000 a.txt``) would otherwise silently vanish from the episode (tar skips it).
  Such a command's changes are discarded, and the message names the files.
* The new tree must **fit into /work again** when the next command copies it in: ``tar -x``
  writes every file densely, so a sparse file (``truncate -s 8M s1``) needs its full length,
  although it used no space when it was made. The tree's dense size, counted the way tmpfs
  counts (whole pages per regular file, one page per symlink target of 128 bytes or more), must
  not exceed ``work_bytes``; otherwise the command's changes are discarded with a message that
  says so, and the episode keeps its previous (restorable) state.
"""

from __future__ import annotations

import io
import resource
import tarfile
from dataclasses import dataclass

__all__ = ["RunResult", "decode_stream", "dense_bytes"]

#: tmpfs stores a symlink target of fewer bytes (NUL included) in the inode, not in a page.
_SHORT_SYMLINK = 128
_WRAPPER_FAILED = (96, 97, 98)


@dataclass(frozen=True)
class RunResult:
    """The outcome of one sandboxed command.

    Attributes:
        output: the command's stdout+stderr (as bytes, at most ``SandboxLimits.output_bytes``).
        exit_code: the shell's exit status (137 when killed by the time limit); None when the
            sandbox failed.
        timed_out: the command (or the sandbox) hit the time limit.
        state: the new work tree as a tar archive; None when the command's changes were lost
            (then ``error`` says why) and the caller keeps its previous state.
        error: why the sandbox failed, or None.
        seconds: wall-clock time of the whole sandbox run.
    """

    output: bytes
    exit_code: int | None
    timed_out: bool
    state: bytes | None
    error: str | None
    seconds: float


def dense_bytes(member: tarfile.TarInfo, page: int) -> int:
    """Bytes of tmpfs that extracting ``member`` takes: whole pages of a regular file's data,
    one page for a long symlink target, nothing for directories and hard links."""
    if member.isreg():
        return -(-member.size // page) * page
    if member.issym() and len(member.linkname.encode("utf-8", "surrogateescape")) + 1 > (
        _SHORT_SYMLINK
    ):
        return page
    return 0


def _regular_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes | None:
    """The data of ``member`` if it is a regular file (never resolves links), else None."""
    if not member.isreg():
        return None
    f = tar.extractfile(member)
    return f.read() if f is not None else b""


def _failure(message: str, seconds: float, output: bytes = b"") -> RunResult:
    return RunResult(output, None, False, None, message, seconds)


def decode_stream(
    stream: bytes, returncode: int, stderr: bytes, seconds: float, *, work_bytes: int
) -> RunResult:
    """Split the wrapper's tar stream into (new work tree, output, exit code); never raises.

    Args:
        stream: the bytes the sandbox wrote on stdout.
        returncode: bwrap's exit status (96/97/98: the wrapper itself failed).
        stderr: the first bytes of the sandbox's stderr (for the failure message).
        seconds: wall time of the run (copied into the result).
        work_bytes: size of ``/work``; a tree needing more when extracted densely is refused.
    """
    if returncode in _WRAPPER_FAILED or not stream:
        why = stderr.decode("utf-8", "replace").strip() or f"exit status {returncode}"
        return _failure(
            f"the sandbox failed ({why[:300]}); the command's changes were discarded", seconds
        )
    if returncode != 0:  # the final `exec tar -c` failed: 2 = some work files were unreadable
        why = "; ".join(stderr.decode("utf-8", "replace").strip().splitlines()[:3])[:300]
        if returncode == 2:
            msg = (
                f"the files in /work could not all be read back ({why}); every file and "
                "directory must stay readable by its owner (chmod u+r, u+rx for directories); "
                "the command's changes were discarded"
            )
        else:
            msg = f"the sandbox ended with status {returncode} ({why or 'no message'}); "
            msg += "the command's changes were discarded"
        return _failure(msg, seconds)
    output, rc_text = b"", None
    work = io.BytesIO()
    page = resource.getpagesize()
    need = 0
    try:
        with (
            tarfile.open(fileobj=io.BytesIO(stream), mode="r:") as src,
            tarfile.open(fileobj=work, mode="w", format=tarfile.GNU_FORMAT) as dst,
        ):
            for member in src:
                if member.name == ".io/out":
                    output = _regular_bytes(src, member) or b""
                elif member.name == ".meta/rc":
                    rc_text = _regular_bytes(src, member)
                elif member.name == "work" or member.name.startswith("work/"):
                    need += dense_bytes(member, page)
                    data = src.extractfile(member) if member.isreg() else None
                    dst.addfile(member, data)
    except (tarfile.TarError, ValueError, OSError, EOFError, KeyError, RecursionError) as exc:
        # Defence in depth: nothing above resolves links, so this is a truncated or corrupt
        # stream (a command cannot write into it, but a crashed tar can cut it short).
        msg = f"the sandbox returned an unreadable work tree ({type(exc).__name__}); "
        return _failure(msg + "the command's changes were discarded", seconds)
    rc = _exit_status(rc_text)
    if rc is None:
        msg = "the command killed its own shell or replaced its exit-status file; "
        return _failure(msg + "its changes were discarded", seconds, output)
    if need > work_bytes:
        mib = 1024 * 1024
        msg = (
            f"the files in /work would take {need / mib:.1f} MiB when copied back for the next "
            f"command (sparse files count at their full length), more than the "
            f"{work_bytes / mib:g} MiB of /work; the command's changes were discarded"
        )
        return _failure(msg, seconds, output)
    return RunResult(output, rc, False, work.getvalue(), None, seconds)


def _exit_status(text: bytes | None) -> int | None:
    """The wrapper's ``echo "$rc"`` line as an int (None when missing or not a small int)."""
    if text is None:
        return None
    digits = text.strip()
    if not digits.isdigit() or len(digits) > 3:
        return None
    return int(digits)
