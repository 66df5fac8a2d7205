"""Task kinds that need the persistent shell (``OsEnv(shell="persistent")``).

AgentBench-OS asks about and changes *system state* that outlives one command: running
processes, users and groups, commands installed on the ``PATH``, edits done step by step from
a working directory. These kinds are judged on the **final state of the sandbox**
(:class:`SystemState`: the work tree, ``/etc/passwd`` and ``/etc/group``, the live processes
as seen inside, and the outputs of probe commands run by the environment at the end), like
AgentBench's check scripts, which run in the task's container after the agent finished.

========================= =================================================================
``service_pid`` (easy)    start ``scripts/<name>.sh`` in the background, answer its PID; the
                          PID must belong to a live shell process running that script (its
                          program and open files, read from ``/proc``, not just its argv)
``edit_config`` (easy)    in ``projects/<a>/<b>/``: back up ``app.conf``, change one setting
                          (the oracle does it in three turns from that directory)
``stop_worker`` (medium,  several ``services/worker.sh --queue Q`` run (started before the
hard)                     first turn); stop the one of one queue, keep the others (hard:
                          more workers and look-alike queue names); the other queues' original
                          worker processes (PID and start time) must still run
``add_user`` (medium)     edit ``/etc/passwd`` and ``/etc/group`` (writable here): a new user
                          with the next free uid, its own group, and a membership
``install_command``       write ``~/bin/<name>``, put ``~/bin`` on this shell's ``PATH``, use
(hard)                    it; checked by resolving ``<name>`` over the shell's ``PATH`` value
                          on the host (not by asking the shell) and by running the script on
                          hidden files in a new shell
========================= =================================================================

No verifier asks the agent's shell anything: a ``command -v``, ``type`` or ``ps`` run there
could be a function, an alias, a disabled builtin or a ``hash`` entry the agent defined (the
``install_command`` hack that paid 1.0 with ``command() { echo /work/bin/NAME; }``). They read
the final files after every process was stopped, the processes from ``/proc`` on the host,
variables through redirections alone, and run hidden tests in a new shell.

Each generator is ``(rng, tree) -> Task`` like :mod:`entropace.envs.os.tasks`; all values come
from ``rng``, so a seed fixes the instance. The oracle's commands are gold shell commands run
through ``step`` (cross-checking the verifiers against real bash).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import random
import shlex

from entropace.envs.os.procs import ProcessInfo, started_at
from entropace.envs.os.sandbox import _GROUP, _PASSWD
from entropace.envs.os.tasks import SystemState, Task, TaskFn
from entropace.envs.os.tree import LEVELS, USERS, WORDS, Tree

__all__ = ["DEFAULT_ETC", "SHELL_KINDS", "SHELL_TASKS"]

#: ``/etc`` of the persistent sandbox for kinds without their own: the fresh sandbox's files.
DEFAULT_ETC: dict[str, bytes] = {"passwd": _PASSWD, "group": _GROUP}


SHELL_TASKS: dict[str, TaskFn] = {}


def _task(fn: TaskFn) -> TaskFn:
    SHELL_TASKS[fn.__name__] = fn
    return fn


#: The interpreters a script of these tasks may run under (``/proc/<pid>/exe`` basenames).
SHELLS = ("bash", "dash", "sh")


def _names(p: ProcessInfo, script: str, *args: str) -> bool:
    """Whether ``p`` is a shell whose command line names the script ``script`` (by path
    ending) followed by exactly ``args``: what ``ps`` shows of a process running it."""
    if posixpath.basename(p.exe) not in SHELLS:
        return False
    for i, arg in enumerate(p.argv):
        if arg == script or arg.endswith("/" + script):
            return tuple(p.argv[i + 1 :]) == args
    return False


def _runs(p: ProcessInfo, script: str, *args: str, content: bytes | None = None) -> bool:
    """Whether ``p`` runs the script ``/work/<script>`` with exactly ``args`` after it.

    Judged by the kernel's record, not by the command line alone (which any process can make
    say anything: ``tail -f scripts/x.sh`` or ``exec -a`` name the script without running
    it): the program must be a shell (``/proc/<pid>/exe``) that holds the script open (a
    shell keeps the script it runs open: bash on fd 255, dash on fd 10), and its command
    line must name the script (by path ending) followed by exactly ``args`` (:func:`_names`).
    ``content``: and the file it holds open must have that content (read through its own
    descriptor, :attr:`ProcessInfo.digests`): the task's script, not one written over it."""
    path = f"/work/{script}"
    if path not in p.files or not _names(p, script, *args):
        return False
    return content is None or dict(p.digests).get(path) == hashlib.sha256(content).hexdigest()


# ----------------------------------------------------------------------------- processes


@_task
def service_pid(rng: random.Random, tree: Tree) -> Task:
    name = f"{rng.choice(WORDS)}-{rng.choice(('beat', 'watch', 'sync', 'agent'))}"
    script = f"scripts/{name}.sh"
    period = rng.randint(3, 9)
    beat = f"/tmp/{name}.beat"
    content = (
        f"#!/bin/bash\n# {name}: records a heartbeat every {period} s\n"
        f"while true; do date +%s > {beat}; sleep {period}; done\n"
    )
    tree.scripts[f"{name}.sh"] = (content, 0o755)
    prompt = (
        f"Start the script {script} in the background so that it keeps running after your "
        "command returns, then answer with the PID of the process running it (it must still "
        "be running when you answer). Answer with a number."
    )

    def verify(state: SystemState, answer: str | None) -> tuple[bool, str]:
        text = (answer or "").strip()
        if not text.isdigit():
            return False, f"the answer {text[:40]!r} is not a PID"
        for p in state.processes:
            if p.pid == int(text):
                if p.state == "T":
                    return False, f"process {text} is stopped"
                if not _runs(p, script):
                    return False, f"process {text} runs {' '.join(p.argv)[:80]!r}, not {script}"
                if not _runs(p, script, content=content.encode()):
                    return False, f"process {text} runs a {script} that is not the task's script"
                return _beats(state, beat, p, period)
        return False, f"no process {text} is running"

    cmd = f"nohup {script} >/dev/null 2>&1 & echo $!"
    return Task(
        "service_pid", prompt, f"the PID of a running {script}", (cmd,), verify=verify,
        watch_files=(beat,),
    )  # fmt: skip


#: Seconds a heartbeat may be late beyond its period (a loaded machine delays ``sleep``).
BEAT_SLACK_S = 5.0
#: How much earlier than the process's recorded start a heartbeat may seem written (the
#: start is truncated to a 10 ms clock tick; file times use a coarse clock).
BEAT_SKEW_S = 0.05


def _beats(state: SystemState, beat: str, p: ProcessInfo, period: int) -> tuple[bool, str]:
    """Whether the heartbeat file ``beat`` shows that ``p`` runs the heartbeat loop: written
    since ``p`` started and within its period (plus :data:`BEAT_SLACK_S`) of the end. A
    process that holds the script open without running it (``bash -c 'exec 255<X.sh;
    sleep 100' X.sh``), or runs something else restored into the file after it started,
    writes none."""
    info = state.files.get(beat)
    if info is None:
        return False, f"process {p.pid} never wrote the heartbeat {beat}"
    if info.mtime < started_at(p.start) - BEAT_SKEW_S:
        return False, f"process {p.pid} has not written the heartbeat {beat} since it started"
    age = state.time - info.mtime
    if age > period + BEAT_SLACK_S:
        return False, f"the heartbeat {beat} is {age:.0f} s old: process {p.pid} does not run it"
    return True, "ok"


def _queues(rng: random.Random, n: int, decoys: bool) -> list[str]:
    names = rng.sample(("billing", "email", "reports", "thumbnails", "search", "audit"), n)
    if decoys:  # look-alike names: a prefix match on the target would stop these too
        names.append(names[0] + "-eu")
    return names


@_task
def stop_worker(rng: random.Random, tree: Tree) -> Task:
    hard = tree.difficulty == "hard"
    queues = _queues(rng, rng.randint(4, 5) if hard else rng.randint(2, 3), hard)
    rng.shuffle(queues)
    target = rng.choice([q for q in queues if not q.endswith("-eu")])
    tree.extra["services/worker.sh"] = (
        "#!/bin/bash\n# usage: worker.sh --queue NAME\nwhile true; do sleep 7; done\n",
        0o755,
    )
    start = "".join(f"nohup services/worker.sh --queue {q} >/dev/null 2>&1 & " for q in queues)
    wait = (  # until every worker has exec'd its script (pkill could miss one otherwise)
        f"for _ in $(seq 500); do [ \"$(pgrep -fc 'services/worker[.]sh --queue')\" -ge "
        f"{len(queues)} ] && exit 0; sleep 0.01; done; exit 1"
    )
    setup = (f"{start}( {wait} )",)
    prompt = (
        "Worker processes are running, one per queue: each runs `services/worker.sh --queue "
        f"NAME` (see their command lines, e.g. with `ps -ef`). Stop the worker of the queue "
        f"`{target}` and leave every other worker running.\nReply `done` when finished."
    )

    def verify(state: SystemState, answer: str | None) -> tuple[bool, str]:
        del answer
        live = {(p.pid, p.start) for p in state.processes if p.state != "T"}
        for q in queues:
            # the workers started before the first turn, not look-alikes started since
            original = [p for p in state.started if _runs(p, "services/worker.sh", "--queue", q)]
            if not original:  # pragma: no cover - the setup checked that every worker runs
                return False, f"the worker of {q} did not start (a bug of the task)"
            if q == target:
                # stopped means the original worker is gone (its PID and start time), and no
                # shell names the worker of the target: judged by identity, so renaming or
                # deleting worker.sh (which hides it from the open-files test) stops nothing
                again = [
                    p for p in state.processes
                    if (p.pid, p.start) in live and _names(p, "services/worker.sh", "--queue", q)
                ]  # fmt: skip
                if again or any((p.pid, p.start) in live for p in original):
                    return False, f"the worker of {q} is still running"
            elif not any((p.pid, p.start) in live for p in original):
                return False, f"the worker of {q} was stopped too"
        return True, "ok"

    cmd = f"pkill -f -- {shlex.quote(f'worker.sh --queue {target}$')}"
    gold = f"only the worker of {target} stopped"
    return Task("stop_worker", prompt, gold, (cmd,), setup=setup, verify=verify, goal=True)


# ----------------------------------------------------------------------------- users


def _etc_files(rng: random.Random) -> tuple[list[list[str]], list[list[str]]]:
    """Generated ``/etc/passwd`` and ``/etc/group`` rows (fields split on ':')."""
    names = rng.sample(USERS, rng.randint(3, 7))
    passwd = [["root", "x", "0", "0", "root", "/root", "/usr/sbin/nologin"],
              ["user", "x", "1000", "1000", "user", "/work", "/bin/bash"]]  # fmt: skip
    group = [["root", "x", "0", ""], ["user", "x", "1000", ""]]
    uid = 1000
    for name in names:
        uid += rng.randint(1, 40)
        shell = rng.choice(("/bin/bash", "/bin/bash", "/usr/sbin/nologin"))
        passwd.append([name, "x", str(uid), str(uid), name.title(), f"/home/{name}", shell])
        group.append([name, "x", str(uid), ""])
    for k, shared in enumerate(rng.sample(("developers", "ops", "staff", "backup"), 2)):
        members = rng.sample(names, rng.randint(1, min(3, len(names))))
        group.append([shared, "x", str(2000 + 10 * k), ",".join(members)])
    order = passwd[:2] + rng.sample(passwd[2:], len(passwd) - 2)  # not sorted by uid
    return order, group


def _render(rows: list[list[str]]) -> bytes:
    return "".join(":".join(r) + "\n" for r in rows).encode()


@_task
def add_user(rng: random.Random, tree: Tree) -> Task:
    del tree
    passwd, group = _etc_files(rng)
    taken = {r[0] for r in passwd}
    name = rng.choice([u for u in USERS if u not in taken])
    shared = rng.choice([g for g in group if int(g[2]) >= 2000])
    uid = max(int(r[2]) for r in passwd) + 1
    prompt = (
        f"Register a new user `{name}` on this system by editing /etc/passwd and /etc/group "
        "(there is no useradd here; both files are writable): its uid is one more than the "
        f"largest uid in /etc/passwd, its primary group is a new group `{name}` whose gid "
        f"equals that uid, its home is /home/{name}, its shell /bin/bash, the password field "
        f"`x` and the comment field empty. Also add {name} to the existing group "
        f"`{shared[0]}`, keeping its other members.\nReply `done` when finished."
    )
    new_user = [name, "x", str(uid), str(uid), "", f"/home/{name}", "/bin/bash"]
    new_group = [name, "x", str(uid), ""]

    def verify(state: SystemState, answer: str | None) -> tuple[bool, str]:
        del answer
        got_p = [line.split(":") for line in _lines(state.etc.get("passwd", b""))]
        got_g = [line.split(":") for line in _lines(state.etc.get("group", b""))]
        if sorted(got_p) != sorted([*passwd, new_user]):
            return False, f"/etc/passwd should hold the old entries and {':'.join(new_user)}"
        want_g = {r[0]: r for r in [*group, new_group]}
        if sorted(r[0] for r in got_g) != sorted(want_g):
            return False, "/etc/group should hold the old groups and the new one"
        for row in got_g:
            want = want_g[row[0]]
            members = [m for m in want[3].split(",") if m]
            if row[0] == shared[0]:
                members.append(name)
            if len(row) != 4 or row[:3] != want[:3]:
                return False, f"the group line of {row[0]} is wrong"
            if sorted(m for m in row[3].split(",") if m) != sorted(members):
                return False, f"the members of group {row[0]} are wrong"
        return True, "ok"

    sed = (
        f"s/^({shared[0]}:[^:]*:[0-9]+:)(.+)$/\\1\\2,{name}/; "
        f"s/^({shared[0]}:[^:]*:[0-9]+:)$/\\1{name}/"
    )
    commands = (
        f"echo {shlex.quote(':'.join(new_user))} >> /etc/passwd",
        f"echo {shlex.quote(':'.join(new_group))} >> /etc/group",
        f"sed -i -E {shlex.quote(sed)} /etc/group",
    )
    etc = {"passwd": _render(passwd), "group": _render(group)}
    gold = f"{':'.join(new_user)}; {name} in {shared[0]}"
    return Task("add_user", prompt, gold, commands, verify=verify, goal=True, etc=etc)


def _lines(data: bytes) -> list[str]:
    return [line for line in data.decode("utf-8", "replace").splitlines() if line.strip()]


# ----------------------------------------------------------------------------- PATH


@_task
def install_command(rng: random.Random, tree: Tree) -> Task:
    name = f"{rng.choice(WORDS)}-count"
    level = rng.choice(LEVELS)
    log = rng.choice(sorted(tree.logs))
    prompt = (
        f"Install a command `{name}`: an executable script ~/bin/{name} (~ is /work) such "
        f"that `{name} LEVEL FILE` prints only the number of lines of the log FILE whose "
        "level (the third field) is LEVEL. Add ~/bin to the PATH of this shell so that "
        f"`{name}` runs without a path in your later commands, and leave it there; then use "
        f"it once on logs/{log} with level {level}. It is also tested on other log files."
        "\nReply `done` when finished."
    )
    probes, expected = [], []
    for _ in range(2):
        lines = [
            f"2024-01-0{rng.randint(1, 9)} 0{rng.randint(0, 9)}:00:00 "
            f"{rng.choice(LEVELS)} {rng.choice(WORDS)}: {rng.choice(WORDS)} {k}"
            for k in range(rng.randint(3, 9))
        ]
        want = rng.choice(LEVELS)
        expected.append(str(sum(line.split(" ")[2] == want for line in lines)))
        body = " ".join(shlex.quote(line) for line in lines)
        probes.append(f"printf '%s\\n' {body} > /tmp/.probe && /work/bin/{name} {want} /tmp/.probe")
    script = '#!/bin/bash\nawk -v l="$1" \'$3 == l\' "$2" | wc -l\n'

    def verify(state: SystemState, answer: str | None) -> tuple[bool, str]:
        del answer
        entry = state.tree.get(f"bin/{name}")
        if entry is None or entry.kind != "file" or not entry.mode & 0o100:
            return False, f"~/bin/{name} is not an executable file"
        found = _resolve(state, name)
        if found != f"/work/bin/{name}":
            path = state.variables.get("PATH")
            shown = "could not be read" if path is None else f"is {path[:120]!r}"
            return False, f"`{name}` on the PATH of your shell is {found}; its PATH {shown}"
        for got, want in zip(state.fresh, expected, strict=True):
            if got.strip() != want:
                return False, f"{name} printed {got.strip()[:40]!r} on a test file, not {want}"
        return True, "ok"

    commands = (
        f"mkdir -p ~/bin && printf %s {shlex.quote(script)} > ~/bin/{name}",
        f"chmod +x ~/bin/{name}",
        'export PATH="$HOME/bin:$PATH"',
        f"{name} {level} logs/{log}",
    )
    return Task(
        "install_command",
        prompt,
        f"~/bin/{name} on PATH counting lines of a level",
        commands,
        verify=verify,
        goal=True,
        live_vars=("PATH", "HOME"),
        probe_fresh=tuple(probes),
    )


def _resolve(state: SystemState, name: str) -> str:
    """Where the agent's shell finds the command ``name`` by its ``PATH`` (read through
    :attr:`SystemState.variables`, not by asking the shell: ``command -v``, ``type`` and
    ``which`` can be functions there, and ``hash`` or an alias can answer instead): the path
    of the first executable regular file ``DIR/name`` over the ``PATH`` entries, looked up
    in the final work tree for ``/work`` and on the host's ``/usr`` (bound read-only into the
    sandbox) for the system directories. A description instead when that cannot be
    decided: an entry the host cannot see (``/tmp``, a relative one, a symlink in ``/work``)
    before any match counts as a miss, so nothing unchecked can pass."""
    path, home = state.variables.get("PATH"), state.variables.get("HOME")
    if path is None:
        return "unknown"
    for entry in path.split(":"):
        if entry == "~" or entry.startswith("~/"):
            entry = (home or "~") + entry[1:]
        if not entry.startswith("/"):
            return f"unknown (the entry {entry[:40]!r} is relative)"
        where = posixpath.normpath(posixpath.join(entry, name))
        if where.startswith("/work/"):
            rel = where[len("/work/") :]
            parts = rel.split("/")
            links = [e for i in range(1, len(parts) + 1) if (e := state.tree.get("/".join(parts[:i])))
                     and e.kind == "symlink"]  # fmt: skip
            if links:
                return f"unknown (a symlink on the way to {where[:60]!r})"
            entry_ = state.tree.get(rel)
            if entry_ is not None and entry_.kind == "file" and entry_.mode & 0o100:
                return where
            continue
        host = _SYSTEM_DIRS.get(posixpath.dirname(where))
        if host is None:
            return f"unknown (the host cannot see {posixpath.dirname(where)[:60]!r})"
        candidate = posixpath.join(host, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return where
    return "not found"


# The sandbox's system directories and where they are on the host (/bin -> usr/bin, ...).
_SYSTEM_DIRS = {
    d: d if d.startswith("/usr") else "/usr" + d
    for d in ("/usr/local/bin", "/usr/local/sbin", "/usr/bin", "/usr/sbin", "/bin", "/sbin")
}


# ----------------------------------------------------------------------------- edits


@_task
def edit_config(rng: random.Random, tree: Tree) -> Task:
    projects = rng.sample(WORDS, 3)
    sub = rng.choice(("deploy", "service", "runtime"))
    files: dict[str, str] = {}
    for p in projects:
        lines = [
            f"# {p} settings",
            f"host = {rng.choice(WORDS)}.internal",
            f"port = {rng.randint(1024, 9999)}",
            f"workers = {rng.randint(1, 16)}",
            f"log_level = {rng.choice(('debug', 'info', 'warning'))}",
        ]
        files[f"projects/{p}/{sub}/app.conf"] = "\n".join(lines) + "\n"
    tree.other.update(files)
    target = projects[0]
    path = f"projects/{target}/{sub}/app.conf"
    port = str(rng.randint(10000, 65000))
    original = files[path]
    edited = "".join(
        f"port = {port}\n" if line.startswith("port = ") else line + "\n"
        for line in original.splitlines()
    )
    prompt = (
        f"In the directory projects/{target}/{sub}, first save a copy of app.conf as "
        f"app.conf.bak, then change the value of `port` in app.conf to {port} (keep every "
        "other line as it is).\nReply `done` when finished."
    )

    def verify(state: SystemState, answer: str | None) -> tuple[bool, str]:
        del answer
        want = {**{p: c.encode() for p, c in files.items()}, path: edited.encode()}
        want[path + ".bak"] = original.encode()
        for p, content in want.items():
            entry = state.tree.get(p)
            if entry is None or entry.kind != "file" or entry.content != content:
                return False, f"{p} is missing or has the wrong content"
        return True, "ok"

    commands = (
        f"cd projects/{target}/{sub}",
        "cp app.conf app.conf.bak",
        f"sed -i 's/^port = .*/port = {port}/' app.conf",
    )
    gold = f"{path}: port = {port}, backup app.conf.bak"
    return Task("edit_config", prompt, gold, commands, verify=verify, goal=True)


SHELL_KINDS: dict[str, tuple[str, ...]] = {
    "easy": ("service_pid", "edit_config"),
    "medium": ("stop_worker", "add_user"),
    "hard": ("install_command", "stop_worker"),
}
"""The persistent-shell kinds each difficulty adds to the fresh-shell kinds."""
