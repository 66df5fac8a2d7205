"""Tests of the ``os`` family's persistent shell (``shell="persistent"``) and its task kinds.

Like ``test_os_env.py``: sandbox tests are skipped only when the ``bwrap`` binary is not
installed at all (CI installs it); a bwrap that cannot create namespaces fails them loudly.
"""

from __future__ import annotations

import gc
import hashlib
import os
import shlex
import signal
import tempfile
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entropace.envs import DIFFICULTIES, make, seeds, spec
from entropace.envs.checks import HOSTILE_ACTIONS, check_env, oracle_success_rate, run_episode
from entropace.envs.os import OsEnv, procs
from entropace.envs.os.actions import Done, observation_output, parse_action
from entropace.envs.os.sandbox import Sandbox, SandboxLimits
from entropace.envs.os.session import ShellSession
from entropace.envs.os.splits import TRAIN_KINDS
from entropace.envs.os.tasks import BY_DIFFICULTY
from entropace.envs.os.tasks_shell import SHELL_KINDS
from entropace.envs.os.worktree import FileSpec, build_archive

from .test_os_env import HAS_BWRAP

pytestmark = pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap (bwrap) is not installed")

LIMIT_S = 1.0


@pytest.fixture
def session() -> Iterator[ShellSession]:
    s = ShellSession(
        Sandbox(SandboxLimits(timeout_s=LIMIT_S)), build_archive([FileSpec("a.txt", b"hi\n")])
    )
    yield s
    s.close()


def _argvs(s: ShellSession) -> list[tuple[str, ...]]:
    return [p.argv for p in s.processes()]


def _settled_argvs(s: ShellSession, want: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """The argvs once they equal ``want`` (killed processes take a moment to go), or after 3 s."""
    deadline = time.monotonic() + 3
    while (got := _argvs(s)) != want and time.monotonic() < deadline:
        time.sleep(0.01)
    return got


def _footprint(s: ShellSession) -> tuple[str, str, int]:
    """What must be gone after the session: its PID namespace, its tag, its bwrap."""
    assert s.init_pid is not None
    return os.readlink(f"/proc/{s.init_pid}/ns/pid"), s.tag, s.bwrap_pid


def _leftovers(ns: str, tag: str, bwrap: int, exclude: frozenset[int] = frozenset()) -> list[str]:
    """Host processes still in the namespace ``ns``, or whose command line names ``tag``, or
    the bwrap process itself (not yet reaped); PIDs in ``exclude`` (a newer session's: the
    kernel reuses a freed namespace's inode number at once) do not count."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in exclude:
            continue
        try:
            link = os.readlink(f"/proc/{name}/ns/pid")
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if link == ns or tag.encode() in cmdline or int(name) == bwrap:
            found.append(f"{name}: {cmdline[:80]!r}")
    return found


def _temp_entries() -> set[str]:
    out = set()
    for d in (tempfile.gettempdir(), "/dev/shm"):
        try:
            out |= {f"{d}/{n}" for n in os.listdir(d) if "entropace" in n}
        except OSError:
            pass
    return out


def _mounts() -> str:
    with open("/proc/self/mountinfo") as f:
        return f.read()


# ----------------------------------------------------------------------------- /proc


def test_proc_keys_guard_against_reused_pids() -> None:
    import subprocess

    child = subprocess.Popen(["sleep", "30"])
    try:
        key = procs.proc_key(child.pid)
        assert key is not None and key.pid == child.pid
        assert key in procs.descendants(os.getpid())
        stale = procs.ProcKey(child.pid, key.start - 1)  # "the same PID, another process"
        assert procs.kill_process(stale) is False and child.poll() is None
        assert procs.kill_process(key) is True
        assert child.wait(timeout=5) == -signal.SIGKILL
        assert procs.kill_process(key) is False  # gone
    finally:
        child.kill()
        child.wait()


# ----------------------------------------------------------------------------- persistence


def test_state_persists_between_commands(session: ShellSession) -> None:
    steps = [
        ("cd /tmp && x=41 && export Y=ok && f() { echo fn$1; } && umask 077", b""),
        ("echo $((x + 1)) $Y; pwd; f 7; umask", b"42 ok\n/tmp\nfn7\n0077\n"),
        ("echo data > /work/new.txt; cd /work; declare -a arr=(a b)", b""),
        ("cat new.txt a.txt; echo ${arr[1]}; stat -c %a new.txt", b"data\nhi\nb\n600\n"),
        ("sleep 300 & echo started", b"started\n"),
        ("jobs -p | wc -l; kill -0 $! && echo alive", b"1\nalive\n"),
    ]
    for command, want in steps:
        r = session.run(command)
        assert (r.output, r.exit_code, r.timed_out, r.restarted, r.note) == (
            want,
            0,
            False,
            False,
            "",
        )
    assert ("sleep", "300") in _argvs(session)
    assert session.shell_starts == 1


def test_env_persistent_episode_keeps_cwd_and_variables() -> None:
    env = make("os", shell="persistent", kinds=("edit_config",))
    env.reset(0)
    assert "same bash shell" in env.system_prompt
    for action, want in [
        ("bash: cd projects && n=3", "(no output)\n[exit code: 0]"),
        ("bash: pwd; echo $n", "/work/projects\n3\n[exit code: 0]"),
    ]:
        obs, reward, terminated, truncated, info = env.step(action)
        assert (obs, reward, terminated, truncated) == (want, 0.0, False, False)
        assert info["exit_code"] == 0 and info["restarted"] is False
    env.close()


# ----------------------------------------------------------------------------- time limits


def test_timeout_kills_only_the_command(session: ShellSession) -> None:
    bg = session.run("x=5; sleep 300 & echo $!").output.strip()
    t = time.monotonic()
    r = session.run("(sleep 500 &); sleep 400 & sleep 1000")
    assert LIMIT_S <= time.monotonic() - t < LIMIT_S + 1.0
    assert (r.exit_code, r.timed_out, r.restarted) == (137, True, False)
    assert r.note == f"killed after the {LIMIT_S:g} s time limit"
    argvs = _argvs(session)
    assert ("sleep", "300") in argvs  # an earlier command's background job
    assert ("sleep", "500") in argvs  # a daemon the command detached (re-parented to init)
    assert ("sleep", "1000") not in argvs and ("sleep", "400") not in argvs
    r = session.run(f"echo $x; kill -0 {bg.decode()} && echo bg-alive")
    # (bash may first report the killed background job: "... Killed  sleep 400")
    assert r.output.endswith(b"5\nbg-alive\n") and session.shell_starts == 1


@pytest.mark.parametrize("command", ["while :; do :; done", "exec sleep 100", "exec 6>&- 8>&-"])
def test_a_hung_shell_is_replaced(session: ShellSession, command: str) -> None:
    session.run("cd /tmp; x=1; echo kept > /work/k.txt; sleep 300 &")
    r = session.run(command)
    assert r.restarted and r.timed_out
    assert r.note.startswith(f"killed after the {LIMIT_S:g} s time limit; the shell ")
    if command.startswith("exec sleep"):  # the shell is `sleep` now: SIGUSR2 ends it
        assert r.exit_code == 140 and "the shell exited with status 140" in r.note
    else:
        assert r.exit_code == 137 and "the shell did not recover" in r.note
    assert "files and background processes were kept" in r.note
    r = session.run("pwd; echo x=$x; cat k.txt")
    assert r.output == b"/work\nx=\nkept\n" and not r.restarted
    assert ("sleep", "300") in _argvs(session) and session.shell_starts == 2


@pytest.mark.parametrize(
    ("command", "status"), [("exit 3", 3), ("kill -9 $$", 137), ("exec 0<&3-", None)]
)
def test_an_exited_shell_is_replaced(
    session: ShellSession, command: str, status: int | None
) -> None:
    session.run("x=1; cd /tmp")
    r = session.run(command)
    if status is None:  # a redirection undone after the command: the shell is fine
        assert (r.restarted, r.exit_code) == (False, 1)
        return
    assert r.restarted and not r.timed_out and r.exit_code == status
    assert r.note.startswith(f"the shell exited with status {status}; a new shell was started")
    assert session.run("pwd; echo x=$x").output == b"/work\nx=\n"


def test_kill_everything_from_inside(session: ShellSession) -> None:
    shell = ("bash", "--noprofile", "--norc", "-s")
    session.run("sleep 300 & sleep 301 &")
    r = session.run("kill -9 1; kill -9 -1")  # kill(-1) spares the caller (and the init)
    assert not r.restarted and r.exit_code == 0
    assert _settled_argvs(session, [shell]) == [shell]
    session.run("sleep 302 &")
    r = session.run("sh -c 'kill -9 -1'")  # from a child: the shell goes too
    assert r.restarted and _settled_argvs(session, [shell]) == [shell]
    r = session.run("cat a.txt; ps -o pid=,args= -p 1")
    assert r.output == f"hi\n      1 /usr/bin/bash -c . /dev/fd/9 {session.tag}\n".encode()


# ----------------------------------------------------------------------------- hostile


def test_markers_printed_by_a_command_do_not_end_it(session: ShellSession) -> None:
    # every marker-looking line, on stdout and on the marker pipe itself, with made-up tags
    fake = "deadbeefdeadbeefdeadbeefdeadbeef 0"
    r = session.run(f"echo '{fake}'; echo '{fake}' >&6; sleep 0.3; echo end; exit_code=7")
    assert r.output == f"{fake}\nend\n".encode() and r.exit_code == 0 and not r.restarted


def test_closed_and_redirected_fds_and_stdin(session: ShellSession) -> None:
    assert session.run("exec >&- 2>&-; echo lost").output == b""
    assert session.run("echo back").output == b"back\n"
    assert session.run("exec 7>&-").exit_code == 0
    assert session.run("echo healed").output == b"healed\n"
    r = session.run("cat; read -r line; echo rc=$?; wc -c")
    assert (r.output, r.timed_out) == (b"rc=1\n0\n", False)  # stdin is /dev/null


@pytest.mark.parametrize(
    "broken",
    ["echo 'unclosed", 'echo "$(', "if true; then", "}", "done", "echo $((1 +", "f() {", "esac"],
)
def test_syntax_errors_leave_the_shell_intact(session: ShellSession, broken: str) -> None:
    # bash 5.2 corrupts itself on `eval 'echo "$("'` (a later command then dies with
    # "free(): invalid next size"); such text is parsed in a subshell first and never run
    session.run("cd /tmp; x=1")
    r = session.run(broken)
    assert (r.exit_code, r.restarted, r.timed_out) == (2, False, False)
    assert r.output.startswith(b"bash: ")
    assert b"syntax error" in r.output or b"unexpected EOF" in r.output
    for _ in range(2):
        r = session.run("echo $x; pwd")
        assert (r.output, r.restarted) == (b"1\n/tmp\n", False)
    assert session.shell_starts == 1


_SESSION: list[ShellSession] = []


@settings(max_examples=60, deadline=None)
@given(
    st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=300)
)
def test_any_text_round_trips_through_the_command_line(text: str) -> None:
    if not _SESSION:  # one session for all examples (hypothesis forbids function fixtures)
        _SESSION.append(ShellSession(Sandbox(SandboxLimits(timeout_s=5)), build_archive([])))
    s = _SESSION[0]
    r = s.run(f"printf %s {shlex.quote(text)}")
    assert (r.output, r.exit_code, r.restarted) == (text.encode(), 0, False)


def test_wait_for_an_earlier_job_is_interrupted(session: ShellSession) -> None:
    session.run("x=1; sleep 300 &")
    r = session.run("wait")
    assert (r.exit_code, r.timed_out, r.restarted) == (140, True, False)  # 128 + SIGUSR2
    r = session.run("echo $x; jobs | wc -l")
    assert r.output == b"1\n1\n" and session.shell_starts == 1


def test_binary_and_huge_output(session: ShellSession) -> None:
    assert session.run(r"printf 'a\0b\377\n'").output == b"a\x00b\xff\n"
    assert session.run("head -c 3000000 /dev/zero | wc -c").output == b"3000000\n"
    t = time.monotonic()
    r = session.run("yes")
    assert time.monotonic() - t < LIMIT_S  # killed at the output cap, not at the time limit
    cap = session.limits.output_bytes
    assert r.exit_code == 137 and len(r.output) == cap and r.output_total > cap
    assert r.output[:4] == b"y\ny\n" and "more than the 1048576 bytes of output" in r.note
    assert session.run("echo ok").output == b"ok\n"
    session.run("yes &")  # an earlier command's job floods the shared output pipe: with
    r = session.run("sleep 0.3; echo mine")  # background jobs around, nothing is killed
    assert (r.exit_code, r.timed_out, len(r.output)) == (0, False, cap)
    assert r.note == f"output past the first {cap} bytes was not kept"
    assert session.run("kill %1").exit_code == 0


def test_fork_bomb_is_bounded_and_cleared(session: ShellSession) -> None:
    r = session.run(":(){ :|:& };:")
    # killed when the command ends or, on a machine too loaded to see the swarm grow in
    # time, before the next command starts
    if "reached its limit of 64 processes" not in r.note:
        r = session.run("true")
        assert "held half its limit of 64 processes or more" in r.note
    r = session.run("ps -e -o pid= | wc -l")  # init, shell, ps, wc
    assert r.output == b"4\n" and r.note == ""


def test_overridden_builtins_only_hurt_the_shell(session: ShellSession) -> None:
    r = session.run("printf() { :; }; eval() { :; }")
    assert r.restarted and r.timed_out  # its own marker needs printf: the shell is replaced
    assert session.run("echo fine").output == b"fine\n"


def test_refused_commands() -> None:
    env = make("os", shell="persistent", command_timeout=LIMIT_S)
    env.reset(1)
    obs, *_, info = env.step("bash: echo \x00")
    assert obs == "[the command contains a NUL byte]" and info["exit_code"] is None
    obs, *_ = env.step("bash: " + "x" * 20_000)
    assert obs == "[the command is 20000 characters; the limit is 16000]"
    env.close()


@pytest.mark.parametrize("difficulty", ["easy", "hard"])  # the shell is the same on medium
def test_check_env_hostile_persistent(difficulty: str) -> None:
    env = make("os", difficulty=difficulty, shell="persistent", command_timeout=LIMIT_S)
    nasty = (
        "bash: :(){ :|:& };:",
        "bash: kill -9 -1",
        "bash: exit",
        "bash: exec 1>&- 2>&-",
        "bash: setsid sleep 100 & disown",
        "bash: touch /usr/x /x",
    )
    actions = HOSTILE_ACTIONS + (nasty if difficulty == "hard" else nasty[:2])
    check_env(env, seed=11, actions=actions, max_observation_chars=env.output_chars + 800)
    env.close()


# ----------------------------------------------------------------------------- teardown


def _start(env: OsEnv | object, seed: int = 0) -> tuple[str, str, int]:
    env.reset(seed)  # type: ignore[attr-defined]
    for command in ("sleep 300 &", "setsid sleep 301 &", "(sleep 302 &)", "nohup sleep 303 &"):
        env.step(f"bash: {command}")  # type: ignore[attr-defined]
    session = env.session  # type: ignore[attr-defined]
    want = {("sleep", str(n)) for n in range(300, 304)}
    deadline = time.monotonic() + 3  # `(sleep 302 &)` may still be on its way to exec
    while not want <= set(_argvs(session)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert want <= set(_argvs(session))
    return _footprint(session)


def _assert_gone(footprint: tuple[str, str, int], newer: ShellSession | None = None) -> None:
    # the sandbox's init is killed first and reaped by bwrap, which the session reaps: gone
    # at once, zombies included; the grace is for a loaded machine
    exclude = frozenset()
    if newer is not None:
        exclude = frozenset({newer.bwrap_pid, *(k.pid for k in procs.descendants(newer.bwrap_pid))})
    deadline = time.monotonic() + 2
    while _leftovers(*footprint, exclude) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _leftovers(*footprint, exclude) == []


def test_nothing_is_left_after_close_end_reset_exception_and_gc() -> None:
    temp, mounts = _temp_entries(), _mounts()
    env = make("os", shell="persistent", kinds=("count_lines",))
    fp = _start(env)
    env.close()
    _assert_gone(fp)
    fp = _start(env)
    obs, reward, terminated, *_ = env.step("answer: 0")
    assert terminated and env.session is None
    _assert_gone(fp)
    fp = _start(env)
    env.reset(1)  # a new episode ends the old sandbox
    _assert_gone(fp, newer=env.session)
    env.close()
    short = make("os", shell="persistent", max_turns=5)
    fp = _start(short)  # four steps
    *_, truncated, _ = short.step("bash: true")  # the fifth: truncated by the turn limit
    assert truncated and short.session is None
    _assert_gone(fp)

    def crash() -> None:
        e = make("os", shell="persistent")
        footprints.append(_start(e))
        raise KeyError("boom")

    footprints: list[tuple[str, str, int]] = []
    with pytest.raises(KeyError):
        crash()
    gc.collect()
    _assert_gone(footprints[0])
    env = make("os", shell="persistent")
    fp = _start(env)
    del env
    gc.collect()
    _assert_gone(fp)
    assert _temp_entries() <= temp and _mounts() == mounts  # nothing on the host's disk


def test_a_dead_sandbox_is_replaced() -> None:
    env = make("os", shell="persistent", kinds=("create_file",))
    env.reset(0)
    env.step("bash: echo x > mine.txt")
    init = env.session.init_pid
    os.killpg(env.session.bwrap_pid, signal.SIGKILL)
    deadline = time.monotonic() + 3  # --die-with-parent ends the sandbox, asynchronously
    while procs.state(init) not in (None, "Z", "X") and time.monotonic() < deadline:
        time.sleep(0.01)
    obs, *_, info = env.step("bash: ls mine.txt")
    assert obs.startswith("[the sandbox stopped (") and info["restarted"]
    obs, *_ = env.step("bash: ls mine.txt; echo $?")
    assert observation_output(obs).endswith("2")  # a fresh copy of the task's files
    env.close()


# ----------------------------------------------------------------------------- tasks


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_oracle_solves_every_persistent_kind(difficulty: str) -> None:
    env = make("os", difficulty=difficulty, shell="persistent", kinds=SHELL_KINDS[difficulty])
    failed = []
    for seed in [*seeds("train", 45), *seeds("test", 5)]:
        env.reset(seed)
        episode = run_episode(env, spec("os").oracle(env), seed)
        if not episode.success:
            failed.append((seed, env.task.kind, episode.observations[-2:]))
    assert failed == []


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_oracle_solves_the_fresh_kinds_in_the_persistent_shell(difficulty: str) -> None:
    rate = oracle_success_rate(
        "os", seeds("train", 8), difficulty=difficulty, shell="persistent",
        kinds=BY_DIFFICULTY[difficulty],
    )  # fmt: skip
    assert rate == 1.0


def _episode(env: object, seed: int, actions: list[str]) -> tuple[bool, str]:
    env.reset(seed)  # type: ignore[attr-defined]
    obs = ""
    for action in actions:
        obs, _, terminated, _, info = env.step(action)  # type: ignore[attr-defined]
        if terminated:
            return bool(info["success"]), obs
    raise AssertionError("the episode did not end")


def test_verifiers_reject_wrong_final_states() -> None:
    def env_for(kind: str, difficulty: str = "medium") -> object:
        return make("os", difficulty=difficulty, shell="persistent", kinds=(kind,),
                    command_timeout=LIMIT_S)  # fmt: skip

    env = env_for("service_pid", "easy")
    env.reset(2)
    script = next(c for c in env.task.commands).split()[1]
    assert _episode(env, 2, ["bash: echo $$", "answer: 2"])[0] is False  # not the script's PID
    ok, obs = _episode(env, 2, [f"bash: {script} >/dev/null 2>&1 & kill $!", "answer: 99"])
    assert not ok and obs == "Wrong answer: no process 99 is running."
    env.reset(2)  # the PID of the script's child (its `sleep`), not of the script
    obs, *_ = env.step(f"bash: {script} >/dev/null 2>&1 & sleep 0.3; pgrep -x sleep")
    obs, _, terminated, _, info = env.step("answer: " + observation_output(obs).strip())
    assert terminated and not info["success"] and obs.endswith(f", not {script}.")
    ok, obs = _episode(env, 2, ["bash: ps -ef", "answer: 1"])  # the supervisor is no answer
    assert not ok and obs == "Wrong answer: no process 1 is running."

    env = env_for("stop_worker", "hard")
    for seed in range(100):  # an instance whose target has a look-alike queue
        env.reset(seed)
        target = env.task.prompt.split("queue `")[1].split("`")[0]
        if any(f"--queue {target}-eu " in c for c in env.task.setup):
            break
    ok, obs = _episode(env, seed, ["bash: pkill -f worker.sh", "done"])
    assert not ok and "was stopped too" in obs
    ok, obs = _episode(env, seed, ["done"])
    assert obs == f"The goal is not reached: the worker of {target} is still running."
    ok, obs = _episode(env, seed, [f"bash: pkill -f -- '--queue {target}'", "done"])
    assert not ok and f"the worker of {target}-eu was stopped too" in obs

    env = env_for("add_user")
    for seed in range(2):
        env.reset(seed)
        right = list(env.task.commands)
        wrong_uid = [right[0].replace(":x:", ":x:9", 1), *right[1:], "done"]
        assert (
            _episode(env, seed, [f"bash: {c}" if c != "done" else c for c in wrong_uid])[0] is False
        )
        assert _episode(env, seed, [f"bash: {c}" for c in right[:2]] + ["done"])[0] is False
        assert _episode(env, seed, [f"bash: {c}" for c in right] + ["done"])[0] is True

    env = env_for("install_command", "hard")
    env.reset(1)
    right = [f"bash: {c}" for c in env.task.commands]
    no_path = [right[0], right[1], "done"]  # the script is there, the shell's PATH lacks it
    ok, obs = _episode(env, 1, no_path)
    assert not ok and "on the PATH of your shell is not found" in obs
    name = env.task.commands[1].split("/")[-1]
    bad_script = [f"bash: mkdir -p ~/bin && printf '#!/bin/sh\\necho 1\\n' > ~/bin/{name}",
                  *right[1:3], "done"]  # fmt: skip
    ok, obs = _episode(env, 1, bad_script)
    assert not ok and "on a test file" in obs
    assert _episode(env, 1, [*right, "done"])[0] is True

    env = env_for("edit_config", "easy")
    env.reset(4)
    cd, cp, sed = env.task.commands
    assert _episode(env, 4, [f"bash: {cd}", f"bash: {sed}", "done"])[0] is False  # no backup
    # the fresh shell's behaviour: every command starts in /work, so the relative edit misses
    ok, obs = _episode(env, 4, [f"bash: {cd}", f"bash: cd /work; {cp}", f"bash: {sed}", "done"])
    assert not ok and "is missing or has the wrong content" in obs
    assert _episode(env, 4, [f"bash: {c}" for c in (cd, cp, sed)] + ["done"])[0] is True


def test_instances_are_deterministic() -> None:
    for difficulty in DIFFICULTIES:
        a = make("os", difficulty=difficulty, shell="persistent", kinds=SHELL_KINDS[difficulty])
        b = make("os", difficulty=difficulty, shell="persistent", kinds=SHELL_KINDS[difficulty])
        for seed in (0, 1_000_007):
            ra, rb = a.reset(seed), b.reset(seed)
            assert ra == rb and a.initial_state == b.initial_state
            if a.task.kind == "service_pid":
                continue  # its observations show PIDs
            ea = run_episode(a, spec("os").oracle(a), seed)
            eb = run_episode(b, spec("os").oracle(b), seed)
            assert ea.observations == eb.observations and ea.success and eb.success


def test_fresh_mode_is_unchanged_and_options_are_validated() -> None:
    env = OsEnv()
    # the default kinds: the fresh-shell ones plus the kind the content splits added (issue 20)
    assert env.shell == "fresh" and env.kinds == TRAIN_KINDS["easy"]
    assert set(BY_DIFFICULTY["easy"]) < set(env.kinds)
    # the default shell's prompt is byte for byte the one before the shell option existed
    # (hash taken from the previous version of the code); instances are a function of the seed
    digest = hashlib.sha256(env.system_prompt.encode()).hexdigest()
    assert digest == "b50e9f2896733aa04fab4e5a5b4e14ee8c8d953228ee2010b684d775f0862930"
    a, b = OsEnv(difficulty="hard"), OsEnv(difficulty="hard")
    a.reset(5)
    b.reset(5)
    assert a.initial_state == b.initial_state
    assert OsEnv(difficulty="hard", shell="persistent").kinds == (
        *TRAIN_KINDS["hard"],
        "install_command",
        "stop_worker",
    )
    with pytest.raises(ValueError, match="shell must be one of"):
        OsEnv(shell="tmux")
    with pytest.raises(ValueError, match=r"need shell='persistent'"):
        OsEnv(kinds=("stop_worker",))
    with pytest.raises(ValueError, match="kinds must be a non-empty list"):
        OsEnv(kinds=("nope",))
    assert OsEnv(kinds="count_lines, create_file").kinds == ("count_lines", "create_file")
    assert parse_action("finish") == Done() == parse_action(" FINISH.")


def test_direct_entry_points_for_the_tool_interface() -> None:
    env = make("os", shell="persistent", kinds=("count_lines",))
    env.reset(0)
    obs, *_ = env.step_bash("for i in 1 2; do\n  echo $i\ndone")
    assert obs == "1\n2\n[exit code: 0]"
    env.step_bash(env.task.commands[0])
    obs, reward, terminated, _, info = env.step_answer(f"\n{env.task.gold}\n")
    assert (obs, reward, terminated, info["success"]) == ("Correct.", 1.0, True, True)
    env = make("os", shell="persistent", kinds=("create_file",))
    env.reset(0)
    obs, *_ = env.step_answer("x")
    assert obs.startswith("This task asks you to change files")
    env.step_bash(env.task.commands[0])
    obs, reward, terminated, *_ = env.step_done()
    assert (obs, reward, terminated) == ("The goal is reached.", 1.0, True)


@pytest.mark.parametrize("shell", ["fresh", "persistent"])
def test_text_that_is_not_utf8_is_a_parse_error_not_a_crash(shell: str) -> None:
    # a lone surrogate (what `errors="surrogateescape"` decoding leaves) cannot reach a shell
    env = make("os", shell=shell)
    env.reset(0)
    for action in ("bash: echo \ud800 hi", "answer: \udcff"):
        obs, reward, terminated, _, info = env.step(action)
        assert info["parse_error"] and not terminated and reward == 0.0
        assert "not valid UTF-8" in obs and "it was not run" in obs
    obs, *_ = env.step("bash: echo still-alive")
    assert "still-alive" in obs
    env.env.close()
