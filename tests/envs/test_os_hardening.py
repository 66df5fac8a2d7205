"""Issue 21 (items 1-5): the ``os`` sandbox's ``/dev`` and memory outside its caps, the
persistent shell corrupted by ``eval``, and reward hacks through the agent's own shell.

Each test reproduces an attack that worked before the fix. Sandbox tests are skipped only
when ``bwrap`` is not installed at all (CI installs it).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from entropace.envs import make
from entropace.envs.os.actions import observation_output
from entropace.envs.os.sandbox import Sandbox, SandboxLimits, empty_state, require_bwrap
from entropace.envs.os.seccomp import filter_program
from entropace.envs.os.session import ShellSession
from entropace.envs.os.supervisor import bash_has_eval_bug, eval_bug_struck
from entropace.envs.os.worktree import build_archive

from .test_os_env import HAS_BWRAP

pytestmark = pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap (bwrap) is not installed")
HAS_PYTHON = shutil.which("python3", path="/usr/bin:/bin") is not None
MiB = 1024 * 1024


def _shmem_kib() -> int:
    """The host's Shmem (/proc/meminfo), KiB: tmpfs pages, memfds and shared memory."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1])
    raise AssertionError("no Shmem line in /proc/meminfo")


def _boxes() -> list[tuple[str, Sandbox]]:
    """The default sandbox and the bwrap-only fallback (no inode-capped outer mounts)."""
    bwrap, host_uid = require_bwrap()
    default = Sandbox(SandboxLimits(timeout_s=10))
    fallback = Sandbox(SandboxLimits(timeout_s=10), bwrap=bwrap, host_uid=host_uid, unshare=None)
    return [("default", default), ("fallback", fallback)]


class _Runner:
    """One interface over both shell modes: ``run(command) -> output``."""

    def __init__(self, box: Sandbox, shell: str) -> None:
        self.box, self.shell = box, shell
        self.session = ShellSession(box, build_archive([])) if shell == "persistent" else None

    def run(self, command: str) -> str:
        if self.session is not None:
            return self.session.run(command).output.decode()
        return self.box.run(command, empty_state()).output.decode()

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


@pytest.fixture(params=["fresh", "persistent"])
def runners(request: pytest.FixtureRequest) -> Iterator[list[_Runner]]:
    made = [_Runner(box, request.param) for _, box in _boxes()]
    yield made
    for r in made:
        r.close()


# ------------------------------------------------------------------ item 1: /dev, /dev/shm


def test_dev_is_read_only_but_its_devices_work(runners: list[_Runner]) -> None:
    for r in runners:
        out = r.run(
            "touch /dev/x 2>&1 | grep -c 'Read-only file system'; "
            "for p in /dev/y /dev/pts/x /dev/fd/x; do { : > $p; } 2>/dev/null && echo wrote $p; done; "
            "mkdir /dev/d 2>/dev/null && echo made /dev/d; ln -s /work /dev/l 2>/dev/null "
            "&& echo linked; echo quiet > /dev/null && echo null-ok; "
            "head -c 5 /dev/zero | wc -c; head -c 7 /dev/urandom | wc -c; "
            "ls /dev | tr '\\n' ' '"
        )
        assert "wrote" not in out and "made" not in out and "linked" not in out, (r.shell, out)
        assert out.startswith("1\nnull-ok\n5\n7\n"), (r.shell, out)
        assert all(d in out for d in ("null", "zero", "urandom", "random", "shm", "fd", "tty"))


def test_dev_shm_shares_the_tmp_caps(runners: list[_Runner]) -> None:
    # before: /dev/shm was a tmpfs sized from the host (100 x 8 MiB fitted)
    for r in runners:
        cap = r.box.limits.tmp_bytes
        out = r.run(
            f"head -c {cap + 4096} /dev/zero > /dev/shm/big 2>/dev/null; echo shm=$?; "
            f"ls -l /dev/shm/big | awk '{{print $5}}'; "
            "echo x > /tmp/small 2>/dev/null; echo tmp=$?; df -k /tmp /dev/shm | tail -n 2"
        )
        lines = out.splitlines()
        assert lines[0] == "shm=1" and int(lines[1]) <= cap, (r.shell, out)
        if r.box.unshare is not None:  # one tmpfs: a full /dev/shm leaves /tmp no room
            assert lines[2] == "tmp=1", (r.shell, out)
        else:  # the fallback: its own tmpfs, capped at tmp_bytes
            assert lines[2] == "tmp=0", (r.shell, out)
        sizes = {int(line.split()[1]) for line in lines[3:5]}
        assert sizes == {cap // 1024}, (r.shell, out)


# ----------------------------------------------------------- item 2: memfds, shared memory

_MEMFD_ATTACK = r"""
import ctypes, mmap, os, sys
made = errs = 0
for _ in range(int(sys.argv[1])):
    try:
        fd = os.memfd_create("x")
        os.write(fd, b"\1" * (8 << 20))
        made += 1
    except OSError as exc:
        errs += 1
        err = exc.errno
libc = ctypes.CDLL(None, use_errno=True)
seg = libc.shmget(0, 8 << 20, 0o1600)
print(f"memfds={made} errors={errs} shmget={seg} errno={ctypes.get_errno()}", flush=True)
"""


@pytest.mark.skipif(not HAS_PYTHON, reason="python3 is not installed in /usr/bin")
def test_memfd_and_sysv_shm_are_refused_and_host_shmem_stays_flat() -> None:
    # before: 128 memfds of 8 MiB held by a background process added 1 GiB of host Shmem
    code = _MEMFD_ATTACK.replace("'", "'\\''")
    for name, box in _boxes():
        out = box.run(f"python3 -c '{code}' 8", empty_state()).output.decode()
        assert out == "memfds=0 errors=8 shmget=-1 errno=1\n", (name, out)
        session = ShellSession(box, build_archive([]))
        try:
            base = _shmem_kib()
            r = session.run(
                f"(python3 -c '{code}' 24; sleep 30) > /work/log 2>&1 & "
                "for d in $(seq 100); do head -c 3M /dev/zero > /dev/shm/f$d 2>/dev/null; done; "
                "for _ in $(seq 300); do [ -s /work/log ] && break; sleep 0.02; done; cat /work/log"
            )
            grown = _shmem_kib() - base
            assert r.output.decode() == "memfds=0 errors=24 shmget=-1 errno=1\n", (name, r)
            # the attack would hold 24 x 8 + 100 x 3 MiB; the caps allow 4 MiB of /tmp
            assert grown < 64 * 1024, (name, grown)
        finally:
            session.close()


def test_the_seccomp_program_is_well_formed() -> None:
    import struct

    prog = filter_program("x86_64")
    assert prog is not None and len(prog) % 8 == 0
    insns = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    deny = len(insns) - 1
    assert insns[-1] == (0x06, 0, 0, 0x00050001) and insns[-2] == (0x06, 0, 0, 0x7FFF0000)
    assert insns[1][:2] == (0x15, 0) and 2 + insns[1][2] == deny  # another arch: deny
    blocked = set()
    for i, (code, jt, jf, k) in enumerate(insns[3:-2], start=3):
        assert code == (0x35 if k == 0x40000000 else 0x15)  # x32 numbers: >=; others: ==
        assert jf == 0 and i + 1 + jt == deny
        blocked.add(k)
    assert blocked == {0x40000000, 319, 29, 447}
    assert filter_program("aarch64") is not None and filter_program("mips") is None


# -------------------------------------------------- item 3: eval corrupting the shell


@pytest.fixture
def session() -> Iterator[ShellSession]:
    s = ShellSession(Sandbox(SandboxLimits(timeout_s=2)), build_archive([]))
    yield s
    s.close()


# ---------------------------------------------------------- items 4, 5 and the audit


def _env(kind: str, difficulty: str) -> object:
    return make("os", difficulty=difficulty, shell="persistent", kinds=(kind,),
                command_timeout=2.0)  # fmt: skip


def _play(env: object, seed: int, actions: list[str]) -> tuple[float, str]:
    env.reset(seed)  # type: ignore[attr-defined]
    obs = ""
    for action in actions:
        obs, reward, terminated, _, _ = env.step(action)  # type: ignore[attr-defined]
        if terminated:
            return reward, obs
    raise AssertionError("the episode did not end")


def _wait_for(predicate: object, seconds: float = 3.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)


#: Redefinitions that change what the agent's shell would say about itself, none of which
#: solves anything: functions and aliases for the tools a checker might ask, disabled
#: builtins, a forged ``hash`` entry, exported functions.
_REDEFINE = (
    "command() { echo /work/bin/$2; }; type() { echo /work/bin/$1; }; "
    "which() { echo /work/bin/$1; }; ps() { echo 1; }; pgrep() { echo 1; }; "
    "cat() { :; }; grep() { :; }; awk() { :; }; tail() { :; }; "
    "export -f command type which ps pgrep cat grep awk tail; "
    "shopt -s expand_aliases; alias kill=: ls=: test=:; enable -n kill test; "
    "hash -p /usr/bin/true ls"
)


def test_install_command_is_judged_by_the_real_path() -> None:
    # issue 21 item 4: hard seed 7 paid 1.0 with PATH unchanged after `command() { ...; }`
    # (the content splits of issue 20 moved that instance: the kind is fixed by `kinds`)
    env = make("os", difficulty="hard", shell="persistent", command_timeout=2.0,
               kinds=("install_command",))  # fmt: skip
    env.reset(7)
    assert env.task.kind == "install_command"
    mk, chmod, export, use = env.task.commands
    name = chmod.split("/")[-1]
    hacks = [
        f"command() {{ echo /work/bin/{name}; }}",
        f"shopt -s expand_aliases; alias command='echo /work/bin/{name}; :'",
        f"hash -p /work/bin/{name} {name}",
        f'{name}() {{ /work/bin/{name} "$@"; }}; export -f {name}',
        _REDEFINE.replace("$2", name).replace("$1", name),
        "export -n PATH; env PATH=/work/bin:$PATH true",  # PATH of a child, not the shell's
        "PATH=/tmp/bin:$PATH:/work/bin",  # an entry the host cannot see comes first
    ]
    for hack in hacks:
        reward, obs = _play(env, 7, [f"bash: {mk}", f"bash: {chmod}", f"bash: {hack}", "done"])
        assert reward == 0.0 and "on the PATH of your shell is" in obs, (hack, obs)
    reward, _ = _play(env, 7, [f"bash: {c}" for c in (mk, chmod, export, use)] + ["done"])
    assert reward == 1.0
    # PATH as the shell reads it, however it was written (tilde, dots, exported or not)
    for right in ("PATH=~/bin:$PATH", "PATH=/work/./bin/:$PATH", "export -n PATH; PATH=/work/bin"):
        reward, obs = _play(env, 7, [f"bash: {mk}", f"bash: {chmod}", f"bash: {right}", "done"])
        assert reward == 1.0, (right, obs)
    env.close()


def test_service_pid_needs_the_script_to_run() -> None:
    # issue 21 item 5: the PID of `tail -f scripts/X.sh` paid 1.0 (matched by an argument)
    env = _env("service_pid", "easy")
    env.reset(3)
    script = env.task.commands[0].split()[1]
    hacks = [
        f"tail -f {script} >/dev/null 2>&1 & echo $!",
        f"bash -c 'sleep 100; :' {script} & echo $!",  # a shell whose argv names the script
        f"(exec -a {script} sleep 100) & echo $!",
        f"bash -c 'exec -a /bin/bash tail -f {script}' >/dev/null 2>&1 & echo $!",
        f"{_REDEFINE}; /usr/bin/tail -f {script} >/dev/null 2>&1 & echo $!",
    ]
    for hack in hacks:
        env.reset(3)
        obs, *_ = env.step(f"bash: {hack}")
        pid = observation_output(obs).strip().splitlines()[-1]
        reward, obs = _play_on(env, [f"answer: {pid}"])
        assert reward == 0.0 and obs.startswith("Wrong answer: process "), (hack, obs)
    env.reset(3)
    obs, *_ = env.step(f"bash: {env.task.commands[0]}")
    assert _play_on(env, ["answer: " + observation_output(obs).strip()])[0] == 1.0
    env.reset(3)  # `sh script` (dash) runs it too
    obs, *_ = env.step(f"bash: sh {script} >/dev/null 2>&1 & echo $!")
    assert _play_on(env, ["answer: " + observation_output(obs).strip()])[0] == 1.0
    env.close()


def _play_on(env: object, actions: list[str]) -> tuple[float, str]:
    """Like :func:`_play` without the reset."""
    obs, reward = "", 0.0
    for action in actions:
        obs, reward, terminated, _, _ = env.step(action)  # type: ignore[attr-defined]
        if terminated:
            return reward, obs
    raise AssertionError("the episode did not end")


def test_stop_worker_needs_the_original_workers() -> None:
    env = make("os", difficulty="hard", shell="persistent", command_timeout=2.0,
               kinds=("stop_worker",))  # fmt: skip
    env.reset(3)
    assert env.task.kind == "stop_worker"
    target = env.task.prompt.split("queue `")[1].split("`")[0]
    queues = [c.split("--queue ")[1].split()[0] for c in env.task.setup[0].split("nohup")[1:]]
    others = [q for q in queues if q != target]
    fakes = " ".join(f"bash -c 'sleep 100; :' services/worker.sh --queue {q} &" for q in others)
    again = " ".join(f"nohup services/worker.sh --queue {q} >/dev/null 2>&1 &" for q in others)
    hacks = [
        f"pkill -f worker.sh; {fakes} true",  # look-alike command lines
        f"pkill -f worker.sh; {again} true",  # new workers: the others were stopped too
        f"{_REDEFINE}; pkill -f worker.sh",
    ]
    for hack in hacks:
        reward, obs = _play(env, 3, [f"bash: {hack}", "bash: sleep 0.2", "done"])
        assert reward == 0.0 and "was stopped too" in obs, (hack, obs)
    assert _play(env, 3, [f"bash: {c}" for c in env.task.commands] + ["done"])[0] == 1.0
    env.close()


@pytest.mark.parametrize(("kind", "difficulty", "seed"), [("add_user", "medium", 1),
                                                         ("edit_config", "easy", 16)])  # fmt: skip
def test_file_checkers_ignore_the_shell(kind: str, difficulty: str, seed: int) -> None:
    # judged on the files read back after every process stopped: redefinitions change nothing
    env = make("os", difficulty=difficulty, shell="persistent", command_timeout=2.0,
               kinds=(kind,))  # fmt: skip
    env.reset(seed)
    assert env.task.kind == kind
    reward, _ = _play(env, seed, [f"bash: {_REDEFINE}", "done"])
    assert reward == 0.0
    solve = [f"bash: {c}" for c in env.task.commands]
    assert _play(env, seed, [*solve, "done"])[0] == 1.0
    assert _play(env, seed, [f"bash: {_REDEFINE}", *solve, "done"])[0] == 1.0
    env.close()


_ABORTED = (b"free(): ", b"malloc(): ", b"Aborted", b"corrupted")


@pytest.mark.parametrize(
    "first",
    [
        "eval 'echo \"$('",  # the command: the message is shown
        "eval 'echo \"$(' 2>/dev/null",  # ... and hidden
        "{ eval 'echo \"$('; } 2>/dev/null; echo after",
        "exec 2>/dev/null; eval 'echo $('",
        "trap 'echo \"$(' USR1; kill -USR1 $$",
        "printf '%s\\n' 'echo \"$(' > /tmp/s; . /tmp/s",
    ],
)
def test_eval_cannot_leave_a_corrupted_shell(session: ShellSession, first: str) -> None:
    # issue 21 item 3: after eval 'echo "$(' bash 5.2.15 printed `free(): invalid next size`
    # at the next command, or `Aborted` for every later one, with no restart note
    session.run("x=1")
    results = [session.run(first)]
    for want in (b"one\n", b"two x\n", b"3\n", b"four\n", b"five\n"):
        command = {b"two x\n": "echo two $(echo x)", b"3\n": "for i in 1 2 3; do a=$(echo $i); "
                   "done; echo $a"}.get(want, f"echo {want.decode().strip()}")  # fmt: skip
        results.append(r := session.run(command))
        if not r.output.startswith(want):  # it did not run: its parse check found the heap
            assert r.restarted and "memory was corrupted" in r.note, (first, command, r)
            results.append(r := session.run(command))  # corrupted; the new shell runs it
        assert r.output.startswith(want), (first, command, r)
    for r in results:  # a sign of a corrupted heap always comes with a restart and a note
        if any(sign in r.output for sign in _ABORTED):
            assert r.restarted and ("corrupted" in r.note or "exited" in r.note), (first, r)
    assert session.run("echo done").output == b"done\n"
    # the shell's own message (eval, trap: "bash: ...: unexpected EOF ...") is seen: at once
    if bash_has_eval_bug() and first.startswith(("eval", "trap")) and "null" not in first:
        assert results[0].restarted and "memory was corrupted" in results[0].note, results[0]
    else:  # no corrupted shell is kept: x=1 lives on only where no restart was needed
        assert any(r.restarted for r in results) or session.run("echo $x").output == b"1\n"


@pytest.mark.parametrize(
    ("version", "affected"),
    [("5 2 15", True), ("5 2 17", True), ("5 2 18", False), ("5 3 0", False), ("5 1 16", False),
     ("oops", True)],
)  # fmt: skip
def test_the_bash_bug_is_known_by_version(tmp_path: Path, version: str, affected: bool) -> None:
    # fixed upstream in bash-5.2 patch 18; 5.2 is the release that made `$(` parsing call the
    # parser recursively (NEWS, bash-5.2 item c)
    fake = tmp_path / f"bash-{version.replace(' ', '.')}"
    fake.write_text(f"#!/bin/sh\necho '{version}'\n")
    fake.chmod(0o755)
    assert bash_has_eval_bug(str(fake)) is affected
    message = b"bash: eval: line 7: unexpected EOF while looking for matching `)'\n"
    assert eval_bug_struck(message, str(fake)) is affected
    child = b"bash: -c: line 1: unexpected EOF while looking for matching `)'\n"
    assert not eval_bug_struck(child, str(fake))  # a child `bash -c`: not this shell's heap
