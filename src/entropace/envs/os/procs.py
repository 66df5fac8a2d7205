"""The host's view of a persistent sandbox's processes, read from ``/proc`` (never from it).

A persistent shell session (:mod:`entropace.envs.os.session`) has to find, list and kill the
processes of its sandbox without asking anything inside it: a command could lie, or could have
killed or wedged whatever would answer. Every process of a sandbox descends from the sandbox's
init (the supervisor, PID 1 of the sandbox's PID namespace; orphans are re-parented to it), so
the host walks the tree from that process through ``/proc/<pid>/task/<tid>/children``.

Processes are named by a :class:`ProcKey` (host PID, start time in clock ticks since boot), so a
PID the kernel reused for another process is never mistaken for the one seen before, and
signals go through a pidfd opened and checked against the key first
(:func:`kill_process`), so they cannot hit a process that was started after the check.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from dataclasses import dataclass

from entropace._files import open_read, read_bytes

__all__ = [
    "FileInfo",
    "ProcKey",
    "ProcessInfo",
    "children",
    "children_usage",
    "cmdline",
    "descendants",
    "file_digests",
    "kill_process",
    "list_processes",
    "open_files",
    "proc_key",
    "read_file",
    "signals_pending",
    "started_at",
    "state",
    "youngest_age",
]


@dataclass(frozen=True, order=True)
class ProcKey:
    """A process as the host sees it: host PID and start time (ticks since boot)."""

    pid: int
    start: int


@dataclass(frozen=True)
class ProcessInfo:
    """One live process of a sandbox, as the agent sees it from inside.

    ``argv`` is whatever the process wrote there (``exec -a``, or a program rewriting its own
    argument memory, can make it say anything); ``exe``, ``files`` and ``start`` are the
    kernel's own record, which no process can forge: verifiers judge by those.

    Attributes:
        pid: its PID inside the sandbox (what ``ps`` and ``$!`` show there).
        ppid: its parent's PID inside the sandbox (0 for the sandbox's init).
        argv: its command line (``/proc/<pid>/cmdline`` split on NUL).
        state: the one-letter state of ``/proc/<pid>/stat`` (``R``, ``S``, ``T``, ...).
        exe: the program it runs (``/proc/<pid>/exe``, as a path inside the sandbox; for a
            script, its interpreter), "" when unreadable.
        files: the paths of the files it holds open (``/proc/<pid>/fd``; a shell running a
            script holds the script open), sorted; pipes and sockets left out.
        start: its start time (clock ticks since boot): with ``pid``, names this process and
            no later one that reuses the PID (:func:`started_at` gives the wall-clock time).
        digests: ``(path, sha256 hex)`` of the regular files under ``/work`` it holds open
            (up to 1 MiB each), read through its own descriptors: the content of the script
            a shell runs, even if the name now holds another file (listed only when asked
            for: :func:`list_processes`).
    """

    pid: int
    ppid: int
    argv: tuple[str, ...]
    state: str
    exe: str = ""
    files: tuple[str, ...] = ()
    start: int = 0
    digests: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class FileInfo:
    """A file of a sandbox read by the host (:func:`read_file`): its modification time
    (seconds since the epoch) and its first bytes."""

    mtime: float
    data: bytes


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (which may hold spaces)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    end = raw.rfind(b")")
    return raw[end + 2 :].decode("ascii", "replace").split() if end >= 0 else None


def proc_key(pid: int) -> ProcKey | None:
    """The key of host process ``pid``, or None when it no longer exists."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    return ProcKey(pid, int(fields[19]))  # field 22 of stat: starttime


def children_usage(pid: int) -> tuple[int, ...] | None:
    """What the reaped children of host process ``pid`` used: minor and major page faults
    and user and system CPU ticks (``cminflt cmajflt cutime cstime`` of its stat); None if
    it is gone. It grows whenever a child of ``pid`` is reaped, so an unchanged value says
    that no child of ``pid`` ended meanwhile (one that still lives is in ``/proc``)."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 15:
        return None
    return tuple(int(fields[i]) for i in (8, 10, 13, 14))


def state(pid: int) -> str | None:
    """The one-letter state of host process ``pid`` (``R``, ``S``, ``Z``, ...); None if gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def cmdline(pid: int) -> bytes:
    """The raw ``/proc/<pid>/cmdline`` of host process ``pid`` (b"" when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def children(pid: int) -> list[int]:
    """Host PIDs of the children of ``pid`` (of all its threads); [] when it is gone."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def descendants(root: int) -> list[ProcKey]:
    """Every live descendant of host process ``root`` (not ``root`` itself), parents first."""
    found: list[ProcKey] = []
    seen: set[int] = {root}
    stack = [root]
    while stack:
        for child in children(stack.pop()):
            if child in seen:
                continue
            seen.add(child)
            key = proc_key(child)
            if key is not None:
                found.append(key)
                stack.append(child)
    return found


def _status(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def inner_pid(pid: int) -> int | None:
    """The PID of host process ``pid`` in its innermost PID namespace (last ``NSpid``)."""
    ns = _status(pid).get("NSpid", "").split()
    return int(ns[-1]) if ns else None


def signals_pending(init: int) -> bool:
    """Whether a live process of the sandbox of ``init`` has a signal pending that it does
    not block (``SigPnd``/``ShdPnd`` of ``/proc/<pid>/status``): a process that was just sent
    SIGTERM or SIGKILL and has not acted on it yet."""
    for key in descendants(init):
        status = _status(key.pid)
        if status.get("State", "Z").startswith(("Z", "X")):
            continue
        try:
            pending = int(status.get("SigPnd", "0"), 16) | int(status.get("ShdPnd", "0"), 16)
            blocked = int(status.get("SigBlk", "0"), 16)
        except ValueError:
            continue
        if pending & ~blocked:
            return True
    return False


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def open_files(pid: int) -> tuple[str, ...]:
    """The paths of the files host process ``pid`` holds open (sorted, distinct; pipes,
    sockets and anonymous inodes left out); () when it is gone."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return ()
    paths = {_readlink(f"/proc/{pid}/fd/{fd}") for fd in fds}
    return tuple(sorted(p for p in paths if p.startswith("/")))


def started_at(start: int) -> float:
    """The wall-clock time (seconds since the epoch) of a start time in clock ticks since
    boot (:attr:`ProcessInfo.start`; truncated to a tick, 10 ms)."""
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return boot + start / os.sysconf("SC_CLK_TCK")


def file_digests(pid: int, prefix: str = "/work/") -> tuple[tuple[str, str], ...]:
    """``(path, sha256 hex)`` of the regular files under ``prefix`` that host process ``pid``
    holds open (up to 1 MiB each, read through ``/proc/<pid>/fd/N``: the file it has open,
    whatever its name holds now; a FIFO or device there is skipped, never waited on)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return ()
    out: set[tuple[str, str]] = set()
    for fd in fds:
        path = _readlink(f"/proc/{pid}/fd/{fd}")
        if not path.startswith(prefix):
            continue
        try:
            data = read_bytes(f"/proc/{pid}/fd/{fd}", limit=1 << 20, follow_symlinks=True)
        except OSError:
            continue
        out.add((path, hashlib.sha256(data).hexdigest()))
    return tuple(sorted(out))


def read_file(init: int, path: str, limit: int = 4096) -> FileInfo | None:
    """The file ``path`` (absolute, inside the sandbox whose init is host process ``init``)
    as the host reads it through ``/proc/<init>/root``: None unless it is a regular file
    (a symbolic link is not followed: it would resolve on the host), else its mtime and
    first ``limit`` bytes."""
    if not path.startswith("/") or ".." in path.split("/"):
        raise ValueError(f"not an absolute sandbox path: {path!r}")
    try:
        with open_read(f"/proc/{init}/root{path}") as f:
            return FileInfo(os.fstat(f.fileno()).st_mtime, f.read(limit))
    except OSError:
        return None


def list_processes(init: int, *, digests: bool = False) -> list[ProcessInfo]:
    """The live processes of the sandbox whose init is host process ``init`` (init excluded;
    zombies excluded), sorted by PID inside the sandbox; ``digests``: with
    :attr:`ProcessInfo.digests` (:func:`file_digests`)."""
    inner: dict[int, int] = {init: 1}
    Sums = tuple[tuple[str, str], ...]
    rows: list[tuple[int, int, tuple[str, ...], str, str, tuple[str, ...], int, Sums]] = []
    for key in descendants(init):
        status = _status(key.pid)
        ns = status.get("NSpid", "").split()
        if not ns:
            continue
        inner[key.pid] = int(ns[-1])
        state = status.get("State", "?").strip()[:1]
        if state in ("Z", "X"):
            continue
        try:
            with open(f"/proc/{key.pid}/cmdline", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        argv = tuple(a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0") if a)
        exe, files = _readlink(f"/proc/{key.pid}/exe"), open_files(key.pid)
        sums = file_digests(key.pid) if digests else ()
        rows.append(
            (int(ns[-1]), int(status.get("PPid", "0")), argv, state, exe, files, key.start, sums)
        )
    out = [
        ProcessInfo(pid, inner.get(ppid, 0), argv, st, exe, files, start, sums)
        for pid, ppid, argv, st, exe, files, start, sums in rows
    ]
    return sorted(out, key=lambda p: p.pid)


def youngest_age(processes: list[ProcessInfo]) -> float:
    """Seconds since the youngest of ``processes`` started (``inf`` for none)."""
    if not processes:
        return float("inf")
    try:
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return float("inf")
    return uptime - max(p.start for p in processes) / os.sysconf("SC_CLK_TCK")


def kill_process(key: ProcKey, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to the process ``key`` if it still is that process; True when sent."""
    try:
        fd = os.pidfd_open(key.pid)
    except OSError:
        return False
    try:
        if proc_key(key.pid) != key:  # the PID now names another process
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
