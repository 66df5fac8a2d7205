"""Issue 29 (red team round 4), the persistent shell: a parse that breaks the shell's parser,
text left in the command pipe, and checkers fooled by what the agent started (the PATH probe
read by a background subshell, a replaced heartbeat script, a renamed worker script)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entropace.envs import make
from entropace.envs.os import procs
from entropace.envs.os.actions import observation_output
from entropace.envs.os.sandbox import Sandbox, SandboxLimits
from entropace.envs.os.session import ShellSession
from entropace.envs.os.supervisor import ansi_c_quote
from entropace.envs.os.worktree import build_archive

from .test_os_env import HAS_BWRAP
from .test_os_hardening import _play_on as _play  # steps to the episode's end, no reset

pytestmark = pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap (bwrap) is not installed")


@pytest.fixture(scope="module")
def session() -> Iterator[ShellSession]:
    s = ShellSession(Sandbox(SandboxLimits(timeout_s=2)), build_archive([]))
    yield s
    s.close()


# ---------------------------------------------------------- item 1: a broken parser state


@pytest.mark.parametrize(
    "broken",
    ["eval 'echo \"`'", "eval 'echo \"${'", "eval 'echo \"$['", "eval 'echo \"'",
     "eval 'echo `' 2>/dev/null"],
)  # fmt: skip
def test_an_eval_that_ends_inside_a_quote_leaves_a_working_shell(
    session: ShellSession, broken: str
) -> None:
    # bash 5.2 then read the next line's first word as a plain word: `{` (the session's own
    # line started with it) was a syntax error that ended the shell, and the rest of the
    # multi-line command was read by each new shell, one step late, for the whole episode
    session.run("cd /tmp && x=5")
    first = session.run(broken)
    assert not first.restarted and first.exit_code in (0, 2), first
    for command, want in (("{ echo $x; pwd; }", b"5\n/tmp\n"),
                          ("if true; then echo ok; fi", b"ok\n"),
                          ("for i in a b; do echo $i; done", b"a\nb\n")):  # fmt: skip
        r = session.run(command)
        assert (r.output, r.exit_code, r.restarted, r.note) == (want, 0, False, ""), (broken, r)


def test_the_issues_edit_config_oracle_after_a_broken_eval() -> None:
    # edit_config easy seed 16: its oracle scored 0.0 after `eval 'echo "`'`, 1.0 without
    env = make("os", difficulty="easy", shell="persistent", command_timeout=2.0,
               kinds=("edit_config",))  # fmt: skip
    env.reset(16)
    solve = [f"bash: {c}" for c in env.task.commands]
    assert _play(env, ["bash: eval 'echo \"`'", *solve, "done"])[0] == 1.0
    env.close()


def test_a_line_the_shell_cannot_parse_is_named_and_the_next_runs(session: ShellSession) -> None:
    # an alias that breaks the session's own line: the shell dies on bash's syntax error
    # before anything of the line ran; the note says so, and the session's text is not shown
    session.run("shopt -s expand_aliases; alias trap=fi")
    r = session.run("echo hi")
    assert r.restarted and r.exit_code is None and r.output == b"", r
    assert r.note.startswith("this command did not run: the shell could not parse"), r.note
    assert session.run("echo hi").output == b"hi\n"


def test_a_new_shell_never_reads_what_the_previous_one_left(session: ShellSession) -> None:
    # text left unread in the command pipe by a shell that died (a probe it did not finish,
    # the rest of a command) used to be the next shell's first input
    assert session.shell is not None
    procs.kill_process(session.shell, signal.SIGSTOP)
    os.write(session._cmd, b"echo LEFTOVER; touch /work/leftover\n")
    procs.kill_process(session.shell)
    deadline = time.monotonic() + 5
    while procs.state(session.shell.pid) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.005)
    r = session.run("echo next")
    assert r.restarted and r.output == b"next\n", r
    assert session.run("ls /work; echo end").output == b"end\n"


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40))
def test_ansi_c_quote_is_one_line_and_reads_back(text: str) -> None:
    word = ansi_c_quote(text)
    assert "\n" not in word and "\r" not in word
    out = subprocess.run(["bash", "--norc", "-c", f"printf %s {word}"], capture_output=True,
                         check=True).stdout  # fmt: skip
    assert out.decode() == text


# ------------------------------------------- item 2: the PATH probe and the agent's processes

#: The red team's attack: a background subshell stops the shell, reads the probe's lines from
#: the command pipe (fd 10, inherited), and writes the answer files with a forged PATH.
STEAL = (
    "( sleep 0.5; kill -STOP $$; buf=; while IFS= read -r -u 10 l; do buf+=\"$l\"$'\\n'; "
    '[[ $l == *-done\\" ]] && break; done; [[ $buf =~ entropace-([0-9a-f]+)-done ]]; '
    "t=${BASH_REMATCH[1]}; for n in PATH HOME; do [ $n = PATH ] && v=%2Fwork%2Fbin:%2Fusr%2Fbin"
    ":%2Fbin || v=%2Fwork; for i in 00 01 02 03 04 05 06 07 08 09 10 11 12 13 14 15 16 17 18 "
    '19; do [ $i = 00 ] && c=$v || c=; : > "/tmp/.entropace-$t-$n-$i-$c"; done; done; '
    ': > "/tmp/.entropace-$t-done"; kill -CONT $$ ) >/dev/null 2>&1 &'
)


def test_the_path_probe_is_read_with_no_other_process_left() -> None:
    env = make("os", difficulty="hard", shell="persistent", command_timeout=2.0,
               kinds=("install_command",))  # fmt: skip
    env.reset(7)
    mk, chmod, export, use = (f"bash: {c}" for c in env.task.commands)
    attacks = {
        STEAL: "its PATH is '/usr/local/bin:/usr/bin:/bin'",  # the real PATH, read after
        STEAL.replace(") >/dev/null 2>&1 &", ") >/dev/null 2>&1 & disown"): "its PATH is '/usr",
        # a CHLD trap forks again when the others are killed: the probe is not trusted
        "sleep 50 & trap '( sleep 0.2; kill -STOP $$ ) &' CHLD": "PATH could not be read",
    }
    for attack, says in attacks.items():
        env.reset(7)
        for action in (mk, chmod, f"bash: {attack}"):
            env.step(action)
        time.sleep(1.0)  # the time a policy takes to reply: the subshell now waits on fd 10
        reward, obs = _play(env, ["done"])
        assert reward == 0.0 and says in obs, (attack, obs)
    env.reset(7)  # background jobs do not stop the real solution
    jobs = "bash: sleep 30 & (sleep 40; echo x) & disown"
    assert _play(env, [mk, chmod, jobs, export, use, "done"]) == (1.0, "The goal is reached.")
    env.close()


# ------------------------------------ item 3 and the audit: scripts judged by what they are


def test_service_pid_needs_the_tasks_script_and_its_heartbeat() -> None:
    env = make("os", difficulty="easy", shell="persistent", command_timeout=2.0,
               kinds=("service_pid",))  # fmt: skip
    env.reset(3)
    s = env.task.commands[0].split()[1]
    loop = "printf '#!/bin/bash\\nwhile :; do sleep 100; done\\n'"
    attacks = {  # each answers the PID of the process it started
        # the issue's: the file overwritten by a loop, then started
        f"{loop} > {s}; nohup {s} >/dev/null 2>&1 & echo $!": "not the task's script",
        # ... and the task's text written back while it runs (same file: same content)
        f"cp {s} /tmp/o; {loop} > {s}; nohup {s} >/dev/null 2>&1 & p=$!; sleep 0.3; "
        f"cat /tmp/o > {s}; echo $p": "never wrote the heartbeat",
        # a shell that holds the script open without running it (a known limit before)
        f"nohup bash -c 'exec 255<{s}; sleep 100; :' {s} >/dev/null 2>&1 & echo $!":
            "never wrote the heartbeat",
    }  # fmt: skip
    for attack, says in attacks.items():
        env.reset(3)
        obs, *_ = env.step(f"bash: {attack}")
        pid = observation_output(obs).strip().splitlines()[-1]
        reward, obs = _play(env, [f"answer: {pid}"])
        assert reward == 0.0 and says in obs, (attack, obs)
    env.reset(3)
    obs, *_ = env.step(f"bash: {env.task.commands[0]}")
    assert _play(env, ["answer: " + observation_output(obs).strip()])[0] == 1.0
    env.close()


def test_stop_worker_is_not_fooled_by_a_renamed_script() -> None:
    # renaming or deleting worker.sh hid every worker from the open-files test: reward 1.0
    # with no worker stopped
    env = make("os", difficulty="medium", shell="persistent", command_timeout=2.0,
               kinds=("stop_worker",))  # fmt: skip
    for hide in ("mv services/worker.sh services/w.sh", "rm services/worker.sh"):
        env.reset(0)
        reward, obs = _play(env, [f"bash: {hide}", "done"])
        assert reward == 0.0 and "is still running" in obs, (hide, obs)
    env.reset(0)
    solve = [f"bash: {c}" for c in env.task.commands]
    hide = "bash: mv services/worker.sh services/w.sh"
    assert _play(env, [hide, *solve, "done"]) == (1.0, "The goal is reached.")
    env.close()
