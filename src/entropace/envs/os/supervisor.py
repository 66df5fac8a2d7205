"""Start and end the sandbox of a persistent shell session (:mod:`entropace.envs.os.session`).

:func:`launch` starts bwrap (through the fresh mode's own isolation options,
:meth:`~entropace.envs.os.sandbox.Sandbox.bwrap_argv`, plus ``--as-pid-1``) with the
**supervisor** as the sandbox's PID 1, and returns the host's ends of five pipes;
:func:`teardown` ends it all. The supervisor script is handed over in a memfd and sourced
(``bash -c '. /dev/fd/9' TAG``), so ``ps`` inside shows a short command line, not the script.

The supervisor's fds: 0 requests from the host, 1 replies, 3 the initial tar (memfd),
4 the agent shell's command pipe, 5 the output pipe, 6 the marker pipe. Requests, one line
each: ``shell TAG`` starts an agent shell (reply ``TAG PID STATUS``, STATUS the exit status of
the previous shell or ``-``), after discarding whatever the previous shell left unread in the
command pipe; ``dump TAG`` writes the final tar on fd 1 and exits. The agent
shell gets 0 = commands, 1 = 2 = 7 = output, 6 = 8 = markers (7 and 8 are spares the command
line re-makes 7 and 6 from), ``trap -`` gives it default signal dispositions back, and the
resource limits apply to it and everything it starts.
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
import signal
import subprocess
from dataclasses import dataclass

from entropace.envs.os.procs import ProcKey, kill_process
from entropace.envs.os.sandbox import SCRATCH_FSTAB, Sandbox, _memfd

__all__ = [
    "Launched",
    "SessionError",
    "command_line",
    "decode_variables",
    "eval_bug_struck",
    "launch",
    "teardown",
    "variables_probe",
]

SUPERVISOR = r"""
exec 9<&-
trap '' HUP INT TERM ALRM USR1 USR2 PIPE TSTP TTIN TTOU WINCH
cd / || exit 97
tar -x -p --no-same-owner -f - <&3 || exit 98
exec 3<&-
sh=
while IFS=' ' read -r op tag; do
  case $op in
    shell)
      st=-
      if [ -n "$sh" ]; then
        wait "$sh"; st=$?
        # what the dead shell left unread (a probe it did not finish, text after a line it
        # died on) is discarded: a new shell never parses a previous shell's input
        n=0
        while [ "$n" -lt 64 ] && read -r -t 0 -u 4; do
          read -r -N 65536 -t 0.05 -u 4 _ || :
          n=$((n + 1))
        done
      fi
      (
        trap - HUP INT TERM ALRM USR1 USR2 PIPE TSTP TTIN TTOU WINCH
        ulimit -c 0 -u {nproc} -v {mem_kb} -f {fsize_kb} -t {cpu_s} 2>/dev/null
        cd /work || exit 97
        exec -a bash /usr/bin/bash --noprofile --norc -s
      ) <&4 >&5 2>&5 7>&5 8>&6 4<&- 5>&- &
      sh=$!
      printf '%s %s %s\n' "$tag" "$sh" "$st" ;;
    dump)
      cd / && tar -c -f - work etc/passwd etc/group 2>/dev/null
      exit 0 ;;
  esac
done
exit 0
"""

# The outer mount step's tmpfs (see sandbox.py's _FSTAB): no /.io or /.meta here, a small
# writable /etc instead (the users tasks edit /etc/passwd and /etc/group).
FSTAB = (
    """\
entropace /tmp tmpfs size=65536,nr_inodes=16,mode=0755 0 0
entropace-work /tmp/work tmpfs size={work},nr_inodes={files},mode=0755,X-mount.mkdir 0 0
"""
    + SCRATCH_FSTAB
    + """\
entropace-etc /tmp/etc tmpfs size=262144,nr_inodes=64,mode=0755,X-mount.mkdir 0 0
"""
)


class SessionError(RuntimeError):
    """The sandbox of a session could not be started or stopped working."""


@dataclass(frozen=True)
class Launched:
    """A started sandbox: the bwrap process and the host's ends of its pipes (non-blocking
    except ``ctl``): requests to the supervisor, its replies, the shell's commands, its
    output and its end markers."""

    proc: subprocess.Popen[bytes]
    ctl: int
    rep: int
    cmd: int
    out: int
    mark: int


def _park(fd: int, at_least: int) -> int:
    """A duplicate of ``fd`` numbered ``at_least`` or higher (close-on-exec; ``pass_fds``
    hands it to the child)."""
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, at_least)


def launch(sandbox: Sandbox, state: bytes, tag: str) -> Launched:
    """Start the sandbox with the supervisor as PID 1, ``state`` (a tar) unpacked into it.

    ``tag`` becomes the supervisor's ``$0`` (in its command line), so a session's sandbox
    can be found by command line; the agent's shell is plain ``bash`` (its error messages
    read ``bash: line N: ...``).

    Raises:
        SessionError: when bwrap cannot be started.
    """
    lim = sandbox.limits
    script = SUPERVISOR
    for key, value in (
        ("{nproc}", lim.max_processes),
        ("{mem_kb}", lim.memory_bytes // 1024),
        ("{fsize_kb}", lim.file_bytes // 1024),
        ("{cpu_s}", lim.cpu_seconds),
    ):
        script = script.replace(key, str(value))
    if sandbox.unshare is not None:
        etc = ["--bind", "/tmp/etc", "/etc"]
        mounts = ["--bind", "/tmp/work", "/work", "--bind", "/tmp/scratch/tmp", "/tmp"]
        fstab = FSTAB.format(work=lim.work_bytes, tmp=lim.tmp_bytes, files=lim.max_files)
        fstab_fd: int | None = _memfd(fstab.encode(), "entropace-fstab")
    else:  # bwrap's own tmpfs: bytes capped, inodes not (Sandbox warned about it)
        etc = ["--perms", "0755", "--size", "262144", "--tmpfs", "/etc"]
        mounts = ["--size", str(lim.work_bytes), "--tmpfs", "/work",
                  "--size", str(lim.tmp_bytes), "--tmpfs", "/tmp"]  # fmt: skip
        fstab_fd = None
    ctl_r, ctl_w = os.pipe()
    rep_r, rep_w = os.pipe()
    cmd_r, cmd_w = os.pipe()
    out_r, out_w = os.pipe()
    mark_r, mark_w = os.pipe()
    sources = [_memfd(state, "entropace-state"), cmd_r, out_w, mark_w]
    sources.append(_memfd(script.encode(), "entropace-supervisor"))
    seccomp_fd = sandbox.seccomp_fd()
    for fd in (fstab_fd, seccomp_fd):
        if fd is not None:
            sources.append(fd)
    # Park every fd the child needs on numbers >= 100, so the trampoline's dup2s onto 3..6
    # and 9 cannot overwrite one another, and the fstab fd keeps a number of its own.
    parked = [_park(fd, 100 + i) for i, fd in enumerate(sources)]
    for fd in sources:
        os.close(fd)
    state_p, cmd_p, out_p, mark_p, script_p = parked[:5]
    extra = iter(parked[5:])
    fstab_p = next(extra) if fstab_fd is not None else None
    seccomp_p = next(extra) if seccomp_fd is not None else None
    tail = ["/usr/bin/bash", "-c", ". /dev/fd/9", tag]
    argv = sandbox.bwrap_argv(etc, [], mounts, tail, fstab_p, seccomp_p, as_pid_1=True)
    moves = f"3<&{state_p} 4<&{cmd_p} 5>&{out_p} 6>&{mark_p} 9<&{script_p}"
    closes = f"{state_p}<&- {cmd_p}<&- {out_p}>&- {mark_p}>&- {script_p}<&-"
    trampoline = f'exec {moves} {closes}; exec "$@"'
    kwargs: dict[str, object] = {}
    if sandbox._host_uid is not None:  # as root: bwrap runs as nobody (see sandbox.py)
        kwargs = {"user": sandbox._host_uid, "group": sandbox._host_uid, "extra_groups": []}
    try:
        proc = subprocess.Popen(  # noqa: S603 - fixed argv; commands run in the sandbox
            ["/usr/bin/bash", "-c", trampoline, "entropace-trampoline", *argv],
            stdin=ctl_r,
            stdout=rep_w,
            stderr=subprocess.DEVNULL,
            pass_fds=parked,
            start_new_session=True,
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            **kwargs,  # type: ignore[arg-type]
        )
    except OSError as exc:
        for fd in (ctl_r, ctl_w, rep_r, rep_w, cmd_w, out_r, mark_r, *parked):
            os.close(fd)
        raise SessionError(f"could not start bwrap: {exc}") from exc
    for fd in (ctl_r, rep_w, *parked):
        os.close(fd)
    for fd in (rep_r, out_r, mark_r, cmd_w):
        os.set_blocking(fd, False)
    return Launched(proc, ctl_w, rep_r, cmd_w, out_r, mark_r)


#: bash's report of a syntax error in its own input (the error, then the offending text
#: quoted), as the last output of a shell that then exited with status 2 before the
#: command's end marker: the command's line itself did not parse (an alias, or a parser
#: state an earlier command left broken), so nothing of it ran. (The agent's own text is
#: parsed in a subshell first, and its errors read "bash: eval: line N" or "bash: -c: ...".)
WRAPPER_ERROR = re.compile(
    rb"(?:^|(?<=\n))bash: line \d+: syntax error[^\n]*\n(?:bash: line \d+: `[^\n]*\n?)?\Z"
)


def ansi_c_quote(text: str) -> str:
    """``text`` as one bash ANSI-C quoted word (``$'...'``) on one physical line: newlines,
    control characters, ``\\`` and ``'`` escaped (``\\n``, ``\\xHH``, ``\\\\``, ``\\'``);
    everything else, UTF-8 included, as it is."""
    out = ["$'"]
    for ch in text:
        code = ord(ch)
        if ch in "\\'":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        else:
            out.append(ch)
    out.append("'")
    return "".join(out)


def command_line(command: str, tag: str) -> str:
    """The line that runs ``command`` in the shell and reports its status with ``tag``.

    * it is **one physical line**, after a blank one: the command travels ANSI-C quoted
      (:func:`ansi_c_quote`), so a shell that dies on a line leaves nothing of it in the
      pipe, and the blank line resets the parser state that bash 5.2 leaves after an
      ``eval`` of text that ends inside a quote, a backquote or an expansion
      (``eval 'echo "${'``: the next line's first word was not read as a reserved word, so
      ``{``, ``if`` or ``for`` there was a syntax error that ended the shell);
    * fds 7 and 6 are re-made from spares if a command closed them; the checks are bare
      redirections, so no function a command defines (``:``, ``true``) runs here;
    * the USR2 trap (a comment: it does nothing) lets the host interrupt a ``wait`` builtin;
    * the command is first **parsed in a subshell** (as the body of a function that is never
      called): bash 5.2's ``eval`` of unbalanced input (``echo "$(``) can corrupt the shell's
      own parser or heap (``free(): invalid next size``), so text that does not parse never
      reaches the long-lived shell; the subshell's error message is the observation and its
      status (2, or 137 if it was killed) the command's. (One difference from plain
      ``eval``: an unterminated here-document is an error here.)
    * the marker line is ``TAG STATUS HOW``: HOW is ``ran``, ``parse`` (the text did not
      parse) or ``corrupt``: the parse check, a plain fork that parses one function
      definition, died of a signal other than the host's SIGKILL, which happens only when
      the shell it was forked from has a corrupted heap (text that parses can still reach
      the bug: ``eval 'echo "$('``; see :func:`eval_bug_struck`).
    """
    check = ansi_c_quote(f"__entropace_parse() {{\n{command}\n}}")
    return (
        "\n{ >&7; } 2>/dev/null || exec 7>&1; { >&6; } 2>/dev/null || exec 6>&8; "
        "trap '#' USR2; "
        f"if ( eval -- {check} ) </dev/null >&7 2>&7; then "
        f"eval -- {ansi_c_quote(command)} </dev/null >&7 2>&7; __entropace_rc=$? __entropace_how=ran; "
        "else __entropace_rc=$? __entropace_how=parse; case $__entropace_rc in "
        "137) ;; 12[89]|1[3-9][0-9]|2[0-9][0-9]) __entropace_how=corrupt ;; *) __entropace_rc=2 ;; "
        "esac; fi; "
        "{ >&6; } 2>/dev/null || exec 6>&8; "
        f'printf \'%s %s %s\\n\' {tag} "$__entropace_rc" "$__entropace_how" >&6\n'
    )


# What the long-lived shell prints when a parse of its own (eval, `.`, a trap; not a child
# `bash -c`, whose messages read "bash: -c: ...") hits EOF inside `$(`.
_COMSUB_EOF = re.compile(
    rb"(?m)^bash: (?!-c: )(?:[^\n]*: )?line \d+: unexpected EOF while looking for matching `\)'"
)


@functools.lru_cache(maxsize=4)
def bash_has_eval_bug(bash: str = "/usr/bin/bash") -> bool:
    """Whether ``bash`` is 5.2 before patch 18 (Debian 12 ships 5.2.15).

    There, when a parse of a string (``eval``, ``.``, a trap) hits the end of its input
    inside a command substitution (``eval 'echo "$('``), ``parse_comsub`` hands the bison
    parser an error token it has no rule for at end of input, and the parser's error
    recovery leaves it in a state where the process's *next* parses read and write outside
    their buffer (valgrind: invalid reads and writes 2 bytes before a 10-byte block the
    parser allocated, inside ``yyparse``), so the heap is corrupted and a later ``free``
    aborts (``free(): invalid next size (fast)``), in the shell or in every subshell it
    forks. Upstream's fix is bash-5.2 patch 18 ("fix for returning unknown tokens to the
    bison parser": ``yylex`` returns ``YYEOF`` after EOF and the grammar gained an
    ``error YYEOF`` rule). The sandbox runs the host's bash, so this is probed once."""
    try:
        out = subprocess.run(  # noqa: S603 - fixed argv
            [bash, "-c", 'echo "${BASH_VERSINFO[0]} ${BASH_VERSINFO[1]} ${BASH_VERSINFO[2]}"'],
            capture_output=True, text=True, timeout=10, check=False, env={},
        ).stdout.split()  # fmt: skip
        major, minor, patch = (int(x) for x in out[:3])
    except (OSError, subprocess.SubprocessError, ValueError):
        return True  # unknown: assume the bug (a needless restart costs less than a bad shell)
    return (major, minor) == (5, 2) and patch < 18


def eval_bug_struck(output: bytes, bash: str = "/usr/bin/bash") -> bool:
    """Whether a command that ran in the long-lived shell planted the heap corruption of
    :func:`bash_has_eval_bug`: its output holds the shell's own "unexpected EOF while
    looking for matching `)'" and that bash has the bug. (A command that hides the message,
    ``2>/dev/null``, is caught one step later: the next parse check dies of SIGABRT and its
    marker says ``corrupt``.)"""
    return bool(_COMSUB_EOF.search(output)) and bash_has_eval_bug(bash)


_CHUNK, _CHUNKS = 200, 20  # a value travels in up to 20 file names of 200 characters


def variables_probe(names: tuple[str, ...], token: str) -> str:
    """Lines for the agent's shell's stdin that leave the values of the shell variables
    ``names`` in the names of empty files in ``/tmp`` (``.entropace-TOKEN-NAME-NN-CHUNK``,
    ``%`` and ``/`` percent-encoded; then ``.entropace-TOKEN-done``), which the host reads
    through ``/proc/<pid>/root``.

    The lines hold only assignments (to a variable named after the fresh ``token``, so no
    ``readonly`` or nameref the agent set up can catch it), parameter expansions and
    redirections with no command word: no function, alias, builtin, ``enable``, ``hash``
    entry or ``PATH`` lookup takes part, and they are read by the shell itself, not passed
    to ``eval``. What this does not stop: a DEBUG trap with ``shopt -s extdebug`` runs before
    each of them and can skip them (then nothing is read) or imitate them."""
    var = f"__entropace_{token}"
    lines = [""]
    for name in names:
        if not name.isidentifier() or not name.isascii():
            raise ValueError(f"not a shell variable name: {name!r}")
        lines += [f"{var}=${{{name}-}}", f"{var}=${{{var}//[%]/%25}}", f"{var}=${{{var}//\\//%2F}}"]
        lines += [
            f'>"/tmp/.entropace-{token}-{name}-{i:02d}-${{{var}:{i * _CHUNK}:{_CHUNK}}}"'
            for i in range(_CHUNKS)
        ]
    lines.append(f'>"/tmp/.entropace-{token}-done"')
    return "\n".join(lines) + "\n"


def decode_variables(
    names: tuple[str, ...], token: str, listing: list[str]
) -> dict[str, str | None]:
    """The values :func:`variables_probe` left in ``listing`` (the names in ``/tmp``); None
    for a value that is incomplete (a file could not be made) or longer than 4,000
    encoded characters."""
    from urllib.parse import unquote

    prefix = f".entropace-{token}-"
    out: dict[str, str | None] = {name: None for name in names}
    if prefix + "done" not in listing:
        return out
    for name in names:
        head = f"{prefix}{name}-"
        chunks: dict[int, str] = {}
        for entry in listing:
            rest = entry[len(head) :]
            if entry.startswith(head) and rest[:2].isdigit() and rest[2:3] == "-":
                chunks[int(rest[:2])] = rest[3:]
        if sorted(chunks) != list(range(_CHUNKS)) or len(chunks[_CHUNKS - 1]) >= _CHUNK:
            continue
        out[name] = unquote("".join(chunks[i] for i in range(_CHUNKS)), errors="surrogateescape")
    return out


def teardown(proc: subprocess.Popen[bytes], fds: list[int], init: list[ProcKey]) -> None:
    """End the sandbox, reap bwrap, close the host's fds. Idempotent.

    The sandbox's init (``init``: [its key] once known) is killed first: the kernel then
    kills every process of its PID namespace, bwrap (its parent) reaps it and exits, and this
    reaps bwrap, so nothing is left, not even a zombie for the host's init to collect. Then
    (or when the init is not known) bwrap's process group is killed: ``--die-with-parent``
    ends the sandbox with it."""
    for key in init:
        kill_process(key)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - bwrap did not notice
            pass
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - a kernel that does not reap
        pass
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()
