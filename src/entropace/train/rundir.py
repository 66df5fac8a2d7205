"""One process per run directory: an exclusive lock held for the run's whole life.

:func:`lock_run_dir` takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``DIR/.entropace-lock`` and
writes the holder into it (pid, host, start time, command line). A second process that tries
the same directory (``entropace train``, ``--resume``, ``--overwrite``, a ``compare`` grid or
one of its runs) gets :class:`RunDirLocked` at once, naming the holder; nothing of the first
run is touched. The kernel drops the lock when the holder's file descriptor closes, which
includes the process dying (``kill -9``, OOM kill, a crash): the lock file it leaves holds only
stale text, and the next ``--resume`` takes the lock normally. The file itself is never
deleted (unlinking a lock file lets two processes hold locks on two different files). It is
opened without following a symbolic link and only as a regular file with no other hard link
(:mod:`entropace._files`): a planted link never makes a run truncate a file elsewhere.

``flock`` is advisory and local: it guards against our own processes, not against other
programs writing into the directory, and it does not work across hosts on filesystems whose
``flock`` is node-local (some NFS setups): one run directory is for one machine.

:func:`prepare_run_dir` is what the trainer calls: lock, then refuse a second run into a
directory that holds one (or move the old run aside with ``overwrite``), check that the
directory is writable and remove the temporaries of an interrupted checkpoint save.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import secrets
import shlex
import socket
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from entropace._files import UnsafeFileError, open_fd, read_text
from entropace.train.checkpoint import clean_stale_temporaries, latest_checkpoint

__all__ = [
    "LOCK_FILE",
    "RUN_FILES",
    "check_run_dir",
    "RunDirError",
    "RunDirLock",
    "RunDirLocked",
    "lock_run_dir",
    "prepare_run_dir",
    "read_holder",
]

logger = logging.getLogger(__name__)

#: The lock file inside a locked directory.
LOCK_FILE = ".entropace-lock"
#: The most of a lock file :func:`read_holder` reads (the holder's JSON is a few hundred bytes).
LOCK_BYTES = 64 << 10

#: What marks a directory as holding a run.
RUN_FILES = ("config.yaml", "metrics.jsonl", "checkpoints")


class RunDirError(FileExistsError):
    """The run directory already holds a run (or cannot be written)."""


class RunDirLocked(RunDirError):
    """Another process holds the directory's lock; ``holder`` is what it wrote (may be {})."""

    def __init__(self, message: str, holder: dict[str, Any]) -> None:
        super().__init__(message)
        self.holder = holder


class RunDirLock:
    """A held lock (:func:`lock_run_dir`); ``release()`` or leaving the ``with`` block frees
    it (so does the process ending, however it ends)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Free the lock; the holder text is cleared (the file stays: module docstring)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def __enter__(self) -> RunDirLock:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __del__(self) -> None:  # a lock dropped without release(): free it with the object
        try:
            self.release()
        except Exception:  # noqa: BLE001 (interpreter shutdown: the kernel frees it anyway)
            pass


def read_holder(directory: str | Path) -> dict[str, Any]:
    """What the lock file of ``directory`` says about its (last) holder; {} if unreadable (or
    not a regular file, or over 64 KiB)."""
    try:
        data = json.loads(read_text(Path(directory) / LOCK_FILE, limit=LOCK_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another process (it has not recorded itself yet)"
    pid, host = holder.get("pid", "?"), holder.get("host", "?")
    return (
        f"pid {pid} on {host}, running `{holder.get('command', '?')}` since "
        f"{holder.get('started', '?')}"
    )


def lock_run_dir(directory: str | Path, *, what: str = "run directory") -> RunDirLock:
    """Create ``directory`` if needed and take its exclusive lock, without waiting.

    Raises:
        RunDirLocked: another process holds it (the message names the holder: pid, host,
            command, since when).
        RunDirError: the directory cannot be created or its lock file written.
    """
    directory = Path(directory)
    path = directory / LOCK_FILE
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = open_fd(path, os.O_RDWR | os.O_CREAT)  # a symlink or FIFO there is refused
    except UnsafeFileError as exc:
        raise RunDirError(
            f"{exc}; the lock file of a {what} must be a regular file (remove it: it holds "
            "only the last holder's pid)"
        ) from None
    except OSError as exc:
        raise RunDirError(f"{directory}: the {what} is not writable ({exc})") from None
    if os.fstat(fd).st_nlink != 1:  # a hard link: truncating it would change another name
        os.close(fd)
        raise RunDirError(
            f"{path}: the lock file has other hard links; refused (remove it, it holds only "
            "the last holder's pid)"
        )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunDirError(f"{path}: cannot lock the {what} ({exc})") from None
        holder = {}
        for _ in range(20):  # the holder writes itself right after locking
            holder = read_holder(directory)
            if holder:
                break
            time.sleep(0.025)
        raise RunDirLocked(
            f"{directory}: the {what} is in use by {_describe(holder)}; one process per "
            f"directory: wait for it to finish or stop it (kill {holder.get('pid', '<pid>')}), "
            "then resume",
            holder,
        ) from None
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": shlex.join(getattr(sys, "orig_argv", sys.argv)),
    }
    data = (json.dumps(holder) + "\n").encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    except OSError as exc:
        os.close(fd)
        raise RunDirError(f"{directory}: the {what} is not writable ({exc})") from None
    return RunDirLock(path, fd)


def _move_aside(run_dir: Path) -> Path:
    """Move the run in ``run_dir`` (every entry but the lock file) to ``RUN.old-<time>``."""
    aside = run_dir.with_name(f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
    n = 0
    while aside.exists():
        n += 1
        aside = aside.with_name(f"{aside.name.split('~')[0]}~{n}")
    aside.mkdir()
    for entry in sorted(run_dir.iterdir()):
        if entry.name != LOCK_FILE:
            entry.rename(aside / entry.name)
    return aside


def check_run_dir(run_dir: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse a new run into a directory that holds one unless ``overwrite``
    (:class:`RunDirError`), and a resume without a checkpoint (``FileNotFoundError``); changes
    nothing (the CLI calls it before announcing the run, :func:`prepare_run_dir` again under
    the lock)."""
    run_dir = Path(run_dir)
    if not resume and not overwrite and any((run_dir / f).exists() for f in RUN_FILES):
        raise RunDirError(
            f"{run_dir} already holds a run: continue it with --resume {run_dir}, or pass "
            "--overwrite to move it aside and start a new one"
        )
    if resume and latest_checkpoint(run_dir / "checkpoints") is None:
        raise FileNotFoundError(f"--resume: no checkpoint under {run_dir / 'checkpoints'}")


def prepare_run_dir(run_dir: Path, *, resume: bool, overwrite: bool) -> RunDirLock:
    """Lock ``run_dir`` for this process (:func:`lock_run_dir`) and return the lock, which the
    caller holds for the run's whole life. A run directory holds one run: a new run into one
    that has a run is refused (unless ``overwrite``, which moves the old run aside to
    ``RUN.old-<time>``; nothing is deleted); the directory must be writable; temporaries of
    a killed checkpoint save are removed."""
    run_dir = Path(run_dir)
    lock = lock_run_dir(run_dir)
    try:
        check_run_dir(run_dir, resume=resume, overwrite=overwrite)
        if not resume and any((run_dir / f).exists() for f in RUN_FILES):
            aside = _move_aside(run_dir)
            logger.warning("moved the previous run in %s aside to %s", run_dir, aside)
        try:  # a new file (O_EXCL: a planted name is never written through)
            probe = run_dir / f".write-test-{os.getpid()}-{secrets.token_hex(4)}"
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
            probe.unlink()
        except OSError as exc:
            raise RunDirError(f"{run_dir}: the run directory is not writable ({exc})") from None
        for stale in clean_stale_temporaries(run_dir / "checkpoints"):
            logger.warning("removed %s, left by a checkpoint save that was interrupted", stale)
    except BaseException:
        lock.release()
        raise
    return lock
