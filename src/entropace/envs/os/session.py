"""One long-lived bash per episode inside a bubblewrap sandbox (``OsEnv(shell="persistent")``).

Layout (host pipes in brackets)::

    host ──[ctl]──▶ supervisor (bash, PID 1 of the sandbox) ──[rep]──▶ host
    host ──[cmd]──▶ agent shell (bash, child of the supervisor) ──[out]──▶ host
                                                               └─[mark]──▶ host

* The **sandbox** is the fresh mode's, started by :mod:`entropace.envs.os.supervisor` with a
  bash **supervisor** as its PID 1, which no command can signal (the kernel drops signals to
  a namespace's init that it does not handle), so the sandbox and its files (``/work``,
  ``/tmp``, a writable ``/etc``) last until the host ends it. The supervisor starts the agent
  shell on request and writes the final tar; it lists and kills nothing itself.
* Each command is one line on the shell's stdin, after a blank one
  (:func:`~entropace.envs.os.supervisor.command_line`): parsed in a subshell first, then
  ``eval``-ed in the shell itself (``cd``, variables, functions, background jobs persist),
  stdin ``/dev/null``, output to the output pipe, and an **end marker** with the exit status
  on its own pipe, tagged with 128 fresh random bits: printing anything cannot end a command
  early.
* The **host** does all process control from ``/proc`` (:mod:`entropace.envs.os.procs`),
  which nothing in the sandbox can influence: at the time limit it SIGKILLs the processes
  started since the command began that still descend from the shell (background jobs of
  earlier commands and detached daemons survive) and interrupts a ``wait``; a shell that does
  not come back within :data:`GRACE_S` (a builtin loop, ``exec sleep``) is killed and
  replaced; one that exits (``exit``, ``kill -9 $$``) is noticed through a pidfd and replaced
  at once; a command past the output cap is killed; a fork bomb left in the background is
  killed (:meth:`ShellSession._swarm`). The observation's note says what happened.
* At the end of an episode the verifiers' reads (:meth:`ShellSession.processes` with the
  digests of the scripts processes hold open, :meth:`ShellSession.read_files`,
  :meth:`ShellSession.read_variables`, which first kills every process but the shell) come
  from the host; a replaced shell never reads what the previous one left in the command
  pipe (the supervisor discards it).
* **Teardown** (:meth:`ShellSession.close`, the end of the episode, ``reset``, garbage
  collection, interpreter exit, via :func:`weakref.finalize`,
  :func:`~entropace.envs.os.supervisor.teardown`): nothing of the sandbox survives, and
  nothing was ever written to the host's disk (memfds and tmpfs only).
"""

from __future__ import annotations

import os
import re
import secrets
import selectors
import signal
import time
import weakref
from dataclasses import dataclass

from entropace.envs.os import procs
from entropace.envs.os.sandbox import Sandbox
from entropace.envs.os.supervisor import (
    WRAPPER_ERROR,
    SessionError,
    command_line,
    decode_variables,
    eval_bug_struck,
    launch,
    teardown,
    variables_probe,
)

__all__ = ["SessionError", "ShellResult", "ShellSession"]

_RESET = (
    " in /work (the working directory, variables and functions were reset; files and "
    "background processes were kept)"
)

# What glibc prints before it aborts a process whose heap is corrupted.
_HEAP_ABORT = re.compile(
    rb"(?:free|malloc|realloc)\(\): |double free or corruption|corrupted size vs\. prev_size"
)
_SHELL_ARGV = b"bash\0--noprofile\0--norc\0-s\0"  # the agent's shell, once exec'd
_SHELL_ARGS = ("bash", "--noprofile", "--norc", "-s")
_DEAD = ("Z", "X", None)  # zombie, dead, gone: nothing left to kill
#: Seconds a timed-out command's shell gets to report after its processes were killed.
GRACE_S = 1.0
#: Seconds the supervisor gets to answer a request (start a shell, write the final tar).
SUPERVISOR_S = 10.0


@dataclass(frozen=True)
class ShellResult:
    """The outcome of one command in a persistent shell.

    Attributes:
        output: what the command (and background jobs meanwhile) wrote, at most
            ``SandboxLimits.output_bytes`` bytes (``output_total`` counts all of it).
        exit_code: the command's exit status; 137 when killed; None when its shell died or
            was restarted before it reported one.
        timed_out: the command hit the time limit.
        note: what the session did besides running it ("" when nothing), for the observation.
        restarted: the shell was replaced (its ``cd``, variables and functions are gone).
        output_total: bytes of output seen, kept or not.
        seconds: wall-clock time of the command.
    """

    output: bytes
    exit_code: int | None
    timed_out: bool
    note: str
    restarted: bool
    output_total: int
    seconds: float


class ShellSession:
    """A persistent bash in its own sandbox (see the module docstring).

    Args:
        sandbox: gives the bwrap binary, the limits and the isolation options.
        state: the initial tar: ``work/...`` and optionally ``etc/passwd``, ``etc/group``.

    Raises:
        SessionError: when the sandbox or its first shell cannot be started.
    """

    def __init__(self, sandbox: Sandbox, state: bytes) -> None:
        self.sandbox = sandbox
        self.limits = sandbox.limits
        self.tag = secrets.token_hex(8)  # names this session's processes (cmdline)
        self.shell_starts = 0
        self._closed = False
        launched = launch(sandbox, state, self.tag)
        self._proc = launched.proc
        self._ctl, self._rep = launched.ctl, launched.rep
        self._cmd, self._out, self._mark = launched.cmd, launched.out, launched.mark
        self._fds = [self._ctl, self._rep, self._cmd, self._out, self._mark]
        self._init: list[procs.ProcKey] = []  # filled once known; read by the finalizer
        self._finalizer = weakref.finalize(self, teardown, self._proc, self._fds, self._init)
        self._rep_buf = b""
        self._mark_buf = b""
        self.init_pid: int | None = None
        self.shell: procs.ProcKey | None = None
        self.shell_inner_pid = 0
        self._shell_fd: int | None = None
        try:
            self._start_shell()
        except SessionError:
            self.close()
            raise

    # -- supervisor requests ---------------------------------------------------------------

    def _request(self, op: str) -> list[str]:
        """Send ``op TAG`` to the supervisor and return the fields of its ``TAG ...`` reply."""
        tag = secrets.token_hex(16)
        try:
            os.write(self._ctl, f"{op} {tag}\n".encode())
        except OSError as exc:
            raise SessionError(f"the sandbox stopped ({exc})") from exc
        deadline = time.monotonic() + SUPERVISOR_S
        while True:
            while b"\n" in self._rep_buf:
                line, self._rep_buf = self._rep_buf.split(b"\n", 1)
                fields = line.decode("ascii", "replace").split()
                if fields and fields[0] == tag:
                    return fields[1:]
            left = deadline - time.monotonic()
            if left <= 0:
                raise SessionError(f"the sandbox did not answer {op!r} in {SUPERVISOR_S:g} s")
            if not _wait_readable(self._rep, left):
                continue
            try:
                data = os.read(self._rep, 1 << 16)
            except BlockingIOError:
                continue
            if not data:
                raise SessionError(f"the sandbox stopped (while asked to {op})")
            self._rep_buf = (self._rep_buf + data)[-(1 << 16) :]

    def _find_init(self) -> int:
        """Host PID of the sandbox's init (the supervisor): the descendant of bwrap that is
        PID 1 of its namespace."""
        deadline = time.monotonic() + SUPERVISOR_S
        while time.monotonic() < deadline:
            for key in procs.descendants(self._proc.pid):
                if procs.inner_pid(key.pid) == 1:
                    return key.pid
            if self._proc.poll() is not None:
                break
            time.sleep(0.002)
        raise SessionError("the sandbox's supervisor did not start")

    def _start_shell(self) -> str:
        """Start an agent shell; returns the previous shell's exit status ('-' if none)."""
        if self._shell_fd is not None:
            os.close(self._shell_fd)
            self._shell_fd = None
        fields = self._request("shell")
        if len(fields) != 2 or not fields[0].isdigit():
            raise SessionError(f"unexpected answer from the sandbox: {fields!r}")
        if self.init_pid is None:
            self.init_pid = self._find_init()
            key = procs.proc_key(self.init_pid)
            if key is not None:
                self._init.append(key)
        inner = int(fields[0])
        for key in procs.descendants(self.init_pid):
            if procs.inner_pid(key.pid) == inner:
                self.shell = key
                break
        else:
            raise SessionError("the new shell could not be found in /proc")
        self.shell_inner_pid = inner
        try:
            self._shell_fd = os.pidfd_open(self.shell.pid)
        except OSError as exc:
            raise SessionError(f"the new shell exited at once ({exc})") from exc
        if procs.proc_key(self.shell.pid) != self.shell:
            raise SessionError("the new shell exited at once")
        deadline = time.monotonic() + SUPERVISOR_S  # until the subshell has exec'd bash
        while procs.cmdline(self.shell.pid) != _SHELL_ARGV:
            if time.monotonic() > deadline or _wait_readable(self._shell_fd, 0.001):
                raise SessionError("the new shell did not start")
        self.shell_starts += 1
        return fields[1]

    # -- process control -------------------------------------------------------------------

    def _snapshot(self) -> set[procs.ProcKey]:
        assert self.init_pid is not None
        return set(procs.descendants(self.init_pid))

    def _kill_new(self, before: set[procs.ProcKey], *, everywhere: bool) -> int:
        """SIGKILL the processes started since ``before``: those reachable from the shell
        through new processes only, or (``everywhere``) every new process of the sandbox.
        Repeats until two passes in a row find none alive (a forking process cannot outrun
        it: every pass kills what the last one missed). Returns the number killed."""
        assert self.init_pid is not None and self.shell is not None
        total = quiet = 0
        for _ in range(1000):
            if everywhere:
                found = [k for k in procs.descendants(self.init_pid) if k not in before]
            else:
                found, stack = [], [self.shell.pid]
                while stack:
                    for child in procs.children(stack.pop()):
                        key = procs.proc_key(child)
                        if key is not None and key not in before:
                            found.append(key)
                            stack.append(child)
            alive = [k for k in found if k != self.shell and procs.state(k.pid) not in _DEAD]
            if not alive:
                quiet += 1
                if quiet >= 2:
                    break
                time.sleep(0.001)
                continue
            quiet = 0
            total += sum(procs.kill_process(k) for k in alive)
        return total

    def kill_all(self) -> None:
        """SIGKILL every process of the sandbox except its init (the supervisor), until none
        is left (zombies wait for the supervisor to reap them)."""
        assert self.init_pid is not None
        for _ in range(500):
            alive = [k for k in procs.descendants(self.init_pid) if procs.state(k.pid) not in _DEAD]
            if not alive:
                return
            for key in alive:
                procs.kill_process(key)
            time.sleep(0.001)

    def processes(self, *, settle: bool = False, digests: bool = False) -> list[procs.ProcessInfo]:
        """The sandbox's live processes as seen inside (the supervisor excluded); ``digests``:
        with the digests of the files under ``/work`` they hold open (read once, after
        settling: :func:`~entropace.envs.os.procs.file_digests`).

        ``settle``: first wait (up to 2 s) until no process has an unblocked signal pending,
        two listings 10 ms apart agree and every process is at least 50 ms old, so a process
        just killed is gone and one just forked has exec'd its program (its argv changes
        then) and opened its script (a shell opens it after the exec)."""
        assert self.init_pid is not None
        listing = procs.list_processes(self.init_pid)
        deadline = time.monotonic() + 2.0
        while settle and time.monotonic() < deadline:
            time.sleep(0.01)
            again = procs.list_processes(self.init_pid)
            forked = sum(p.argv == _SHELL_ARGS for p in again) > 1  # a subshell not yet exec'd
            young = procs.youngest_age(again) < 0.05
            quiet = not forked and not young and not procs.signals_pending(self.init_pid)
            if again == listing and quiet:
                break
            listing = again
        return procs.list_processes(self.init_pid, digests=True) if digests else listing

    def read_files(
        self, paths: tuple[str, ...], *, newer_than: float | None = None, wait_s: float = 1.0
    ) -> dict[str, procs.FileInfo | None]:
        """The sandbox's files ``paths`` as the host reads them
        (:func:`~entropace.envs.os.procs.read_file`: None for a missing or non-regular one).
        ``newer_than``: wait up to ``wait_s`` for each to exist and be modified after that
        time (a process just started writes its first heartbeat within milliseconds); None:
        read once."""
        assert self.init_pid is not None
        deadline = time.monotonic() + wait_s
        while True:
            found = {p: procs.read_file(self.init_pid, p) for p in paths}
            if newer_than is None or time.monotonic() >= deadline:
                return found
            if all(f is not None and f.mtime >= newer_than for f in found.values()):
                return found
            time.sleep(0.01)

    def restart_shell(self) -> None:
        """Kill the shell (and what it runs) and start a new one; files and other processes
        stay."""
        if self.shell is not None:
            procs.kill_process(self.shell)
            _wait_readable(self._shell_fd, GRACE_S)
        self._start_shell()

    def _shell_alive(self) -> bool:
        return self._shell_fd is not None and not _wait_readable(self._shell_fd, 0)

    # -- running commands ------------------------------------------------------------------

    def run(self, command: str) -> ShellResult:
        """Run one command in the shell (see the module docstring); never raises on a bad
        command. Raises :class:`SessionError` when the sandbox itself is gone.

        A shell that cannot parse the command's own line (an earlier command changed how it
        parses: an alias) dies on that syntax error before anything of the line ran
        (:data:`~entropace.envs.os.supervisor.WRAPPER_ERROR`): the note says the command did
        not run, bash's message about the session's text is dropped, and the next command
        runs in a new shell."""
        if self._closed:
            raise SessionError("the session is closed")
        start = time.monotonic()
        lim = self.limits
        gone = ""  # the shell ended between commands (killed by a job, or its heap corrupted)
        if not self._shell_alive():
            status = self._start_shell()
            why = f"with status {status}" if status.isdigit() else ""
            if status == "134":
                why += " (SIGABRT: its memory was corrupted)"
            gone = f"the shell had exited after the previous command {why}".rstrip()
            gone += f"; a new shell was started{_RESET}"
        crowded = self._crowded()
        before = self._snapshot()
        tag = secrets.token_hex(16)
        line = command_line(command, tag).encode("utf-8", "surrogateescape")
        out = bytearray()
        total = 0
        exit_code: int | None = None
        how = ""  # from the marker: "ran", "parse" or "corrupt"
        timed_out = flooded = flood_killed = False
        outcome = "hung"  # or "done" (its marker came) or "died" (the shell exited)
        deadline = start + lim.timeout_s
        pending = memoryview(line)
        assert self._shell_fd is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._out, selectors.EVENT_READ, "out")
            sel.register(self._mark, selectors.EVENT_READ, "mark")
            sel.register(self._shell_fd, selectors.EVENT_READ, "shell")
            sel.register(self._cmd, selectors.EVENT_WRITE, "cmd")
            while outcome == "hung":
                now = time.monotonic()
                if total > lim.output_bytes and not flooded:  # like ENOSPC in the fresh mode
                    flooded = True  # killed only when no earlier job can be the writer
                    alone = all(k == self.shell for k in before)
                    if alone and self._kill_new(before, everywhere=False):
                        flood_killed = True
                        deadline = min(deadline, now + GRACE_S)
                if now >= deadline:
                    if timed_out or flood_killed:
                        break  # no marker within the grace period either
                    timed_out = True
                    self._kill_new(before, everywhere=False)
                    # a trapped signal ends a `wait` for an earlier command's job
                    procs.kill_process(self.shell, signal.SIGUSR2)
                    deadline = now + GRACE_S
                    continue
                for key, _ in sel.select(deadline - now):
                    if key.data == "cmd":
                        pending = self._feed(pending)
                        if not pending:
                            sel.unregister(self._cmd)
                    elif key.data == "out":
                        total += self._drain(out, total)
                    elif key.data == "mark":
                        marker = self._read_marker(tag)
                        if marker is not None:
                            exit_code, how = marker
                            outcome = "done"
                    elif outcome == "hung":  # the shell's pidfd: it exited
                        outcome = "died"
            total += self._drain(out, total)
        marked = outcome == "done"
        if outcome == "done" and _HEAP_ABORT.search(out):  # glibc found a corrupted heap:
            if _wait_readable(self._shell_fd, GRACE_S):  # the shell may be aborting now
                outcome = "died"
            total += self._drain(out, total)
        note = ""
        restarted = outcome != "done" or bool(gone)
        corrupt = how == "corrupt" or (how == "ran" and eval_bug_struck(bytes(out)))
        if outcome == "done" and corrupt:
            # bash 5.2 < patch 18 corrupted its heap (see eval_bug_struck): every later parse
            # in that shell, or in a subshell it forks, may abort, so it is replaced now
            self.restart_shell()
            restarted = True
            why = "this command ran" if how == "ran" else "an earlier command left it"
            if how == "corrupt":
                exit_code = None
            note = (
                f"the shell's memory was corrupted ({why} into a bash bug: a parse that ends "
                f"inside `$(`, e.g. eval 'echo \"$('); a new shell was started{_RESET}"
            )
        elif outcome == "died":
            status = self._start_shell()
            unparsed = WRAPPER_ERROR.search(out) if status == "2" and not marked else None
            if unparsed is not None:  # bash's words about the session's own line
                del out[unparsed.start() :]
            if not marked:  # else the command's own status came first
                exit_code = int(status) if status.isdigit() else None
            why = f"the shell exited with status {status}" if status.isdigit() else "it exited"
            if status == "134":
                why += " (SIGABRT: its memory was corrupted)"
            if unparsed is not None:
                exit_code = None
                why = (
                    "this command did not run: the shell could not parse the line that runs it "
                    "(an earlier command changed how it parses, e.g. an alias) and exited"
                )
            if timed_out:  # e.g. `exec sleep 100`: the signal that ends a `wait` ended it
                why = f"killed after the {lim.timeout_s:g} s time limit; {why}"
            note = f"{why}; a new shell was started{_RESET}"
        elif outcome == "hung":
            self._kill_new(before, everywhere=False)
            self.restart_shell()
            exit_code = 137
            note = (
                f"killed after the {lim.timeout_s:g} s time limit; the shell did not recover "
                f"and was restarted{_RESET}"
            )
        elif flood_killed:
            note = f"killed: it wrote more than the {lim.output_bytes} bytes of output allowed"
        elif timed_out:
            note = f"killed after the {lim.timeout_s:g} s time limit"
        elif flooded:  # background jobs share the output pipe: the writer is not known
            note = f"output past the first {lim.output_bytes} bytes was not kept"
        if crowded:
            note = (note + "; " if note else "") + (
                f"before it ran, the sandbox held half its limit of {lim.max_processes} "
                f"processes or more, so all {crowded} background processes were killed"
            )
        if gone:
            note = gone + ("; " + note if note else "")
        swarm = self._swarm(before)
        if swarm:
            note = (note + "; " if note else "") + (
                f"the sandbox reached its limit of {lim.max_processes} processes, so the "
                f"{swarm} processes this command left running were killed"
            )
            total += self._drain(out, total)
        return ShellResult(
            bytes(out),
            exit_code,
            timed_out,
            note,
            restarted,
            total,
            time.monotonic() - start,
        )

    def _feed(self, pending: memoryview) -> memoryview:
        """Write what the shell's stdin pipe takes of ``pending``; the rest."""
        try:
            return pending[os.write(self._cmd, pending) :]
        except BlockingIOError:
            return pending
        except OSError:  # nobody reads the pipe any more: the shell's death says the rest
            return pending[len(pending) :]

    def _swarm(self, before: set[procs.ProcKey]) -> int:
        """Kill what a command left running when the sandbox is near its process limit (a
        fork bomb in the background). Sampled when the command ends, then every 5 ms while
        the number of new processes grows (a bomb doubles in about a millisecond; a
        background job or two stop growing at once), at most 10 times."""
        assert self.init_pid is not None
        limit = self.limits.max_processes
        grown = 0
        for _ in range(10):
            alive = procs.descendants(self.init_pid)
            if len(alive) >= limit // 2:
                return self._kill_new(before, everywhere=True)
            new = sum(k not in before and k != self.shell for k in alive)
            if new <= grown:
                return 0  # nothing new, or no longer growing: no fork bomb
            grown = new
            time.sleep(0.005)
        return 0

    def _crowded(self) -> int:
        """Before a command: if the sandbox holds half its process limit or more (a swarm
        that escaped :meth:`_swarm`), kill every process but the shell. Returns the number
        killed."""
        assert self.init_pid is not None
        if len(procs.descendants(self.init_pid)) < self.limits.max_processes // 2:
            return 0
        return self._kill_new({k for k in [self.shell] if k is not None}, everywhere=True)

    def _drain(self, out: bytearray, total: int) -> int:
        """Read what the output pipe holds now; keep up to ``output_bytes``. Returns bytes
        read."""
        got = 0
        cap = self.limits.output_bytes
        while True:
            try:
                data = os.read(self._out, 1 << 16)
            except BlockingIOError:
                return got
            if not data:
                return got
            got += len(data)
            room = cap - len(out)
            if room > 0:
                out += data[:room]
            if got > 1 << 22 and total + got > cap:  # keep the loop responsive
                return got

    def _read_marker(self, tag: str) -> tuple[int, str] | None:
        """Read marker lines; (exit status, how) of the line with ``tag``, else None."""
        try:
            data = os.read(self._mark, 1 << 16)
        except BlockingIOError:
            return None
        self._mark_buf = (self._mark_buf + data)[-(1 << 14) :]
        found = None
        while b"\n" in self._mark_buf:
            raw, self._mark_buf = self._mark_buf.split(b"\n", 1)
            fields = raw.decode("ascii", "replace").split()
            if len(fields) == 3 and fields[0] == tag and fields[1].isdigit():
                found = int(fields[1]), fields[2]
        return found

    # -- the end ---------------------------------------------------------------------------

    def read_variables(self, names: tuple[str, ...]) -> dict[str, str | None]:
        """The values of the shell variables ``names`` in the agent's shell (None for one that
        cannot be read: the shell is gone, or hung, or ``/tmp`` is full, or a process was
        forked while it was read), read without trusting anything the agent defined in it or
        started from it (:func:`~entropace.envs.os.supervisor.variables_probe`). Call it at the
        end of an episode: it **kills every other process of the sandbox first**.

        The probe travels on the shell's command pipe, which any process the shell forked
        can hold (a subshell inherits the descriptor bash saved it on) or reopen through
        ``/proc``: such a process could stop the shell, read the probe and its token and
        write the answer files itself (a background subshell did, for ``install_command``).
        So before the probe only the supervisor and the shell are left (and the shell is
        sent SIGCONT), and the probe counts only if no process was forked meanwhile: the
        sandbox lists no other process afterwards and the reaped children's CPU time and
        page faults of the shell and the supervisor (``/proc/<pid>/stat``) are unchanged."""
        unread: dict[str, str | None] = {name: None for name in names}
        if not names or self._closed or self.shell is None or not self._shell_alive():
            return unread
        if not self._isolate_shell():
            return unread
        assert self.init_pid is not None
        usage = procs.children_usage(self.shell.pid), procs.children_usage(self.init_pid)
        token = secrets.token_hex(8)
        pending = memoryview(variables_probe(tuple(names), token).encode())
        root = f"/proc/{self.shell.pid}/root/tmp"
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and self._shell_alive():
            if pending:
                pending = self._feed(pending)
            try:
                listing = os.listdir(root)
            except OSError:
                return unread
            if not self._alone():
                return unread  # a process was forked during the probe
            if f".entropace-{token}-done" in listing:
                after = procs.children_usage(self.shell.pid), procs.children_usage(self.init_pid)
                if not self._alone() or after != usage:
                    return unread
                return decode_variables(tuple(names), token, listing)
            time.sleep(0.002)
        return unread

    def discard_output(self) -> int:
        """Drop what the output pipe holds now (a job's last words, bash's notices of killed
        jobs), so the next command's output is its own; returns the bytes dropped. Call it
        when no process that could still write is left (after :meth:`kill_all`)."""
        return self._drain(bytearray(), self.limits.output_bytes)

    def _alone(self) -> bool:
        """Whether the shell is the only process of the sandbox besides the supervisor."""
        assert self.init_pid is not None
        return procs.descendants(self.init_pid) == [self.shell]

    def _isolate_shell(self) -> bool:
        """Kill every process of the sandbox but the supervisor and the shell, wake the shell
        (SIGCONT) and wait (up to 2 s) until the killed ones are reaped; whether only the
        two are left then."""
        assert self.init_pid is not None and self.shell is not None
        procs.kill_process(self.shell, signal.SIGCONT)
        self._kill_new({self.shell}, everywhere=True)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if self._alone() and not procs.signals_pending(self.init_pid):
                return True
            if not self._alone():
                self._kill_new({self.shell}, everywhere=True)
            time.sleep(0.002)
        return False

    def dump(self) -> bytes:
        """Stop every process, then the final tar (``work/``, ``etc/passwd``, ``etc/group``);
        ends the session. Raises :class:`SessionError` when the sandbox cannot write it or it
        exceeds ``SandboxLimits.max_stream_bytes``."""
        self.kill_all()
        tag = secrets.token_hex(16)
        self._rep_buf = b""
        while True:  # discard whatever is in the reply pipe (no process is left to write it)
            try:
                if not os.read(self._rep, 1 << 16):
                    break
            except BlockingIOError:
                break
        try:
            os.write(self._ctl, f"dump {tag}\n".encode())
        except OSError as exc:
            self.close()
            raise SessionError(f"the sandbox stopped ({exc})") from exc
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + SUPERVISOR_S
        cap = self.limits.max_stream_bytes
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SessionError("the sandbox did not write its final state in time")
                if not _wait_readable(self._rep, left):
                    continue
                try:
                    data = os.read(self._rep, 1 << 16)
                except BlockingIOError:
                    continue
                if not data:
                    break
                size += len(data)
                if size > cap:
                    raise SessionError("the final work tree is larger than the sandbox allows")
                chunks.append(data)
        finally:
            self.close()
        return b"".join(chunks)

    def close(self) -> None:
        """Tear the sandbox down (idempotent)."""
        self._closed = True
        if getattr(self, "_shell_fd", None) is not None:
            os.close(self._shell_fd)
            self._shell_fd = None
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def bwrap_pid(self) -> int:
        """Host PID of the bwrap process (its process group holds the whole sandbox)."""
        return self._proc.pid


def _wait_readable(fd: int | None, timeout: float) -> bool:
    if fd is None:
        return False
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        return bool(sel.select(max(0.0, timeout)))
