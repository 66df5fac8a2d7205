"""The ``os`` environment: answer questions about / change a file tree with real bash.

AgentBench-OS style (Liu et al., 2023, "AgentBench: Evaluating LLMs as Agents", the OS
interaction task): each instance generates a small file tree (logs, CSV tables, config files,
scripts, nested and hidden directories) from its seed and asks a question (``answer: ...``) or
sets a goal (``done``). With ``shell="fresh"`` (the default) every ``bash:`` command runs in a
fresh bubblewrap sandbox (:mod:`entropace.envs.os.sandbox`) against a private copy of the tree;
with ``shell="persistent"`` the episode has one long-lived bash in one sandbox
(:mod:`entropace.envs.os.session`), and the task kinds that need one (processes, users, the
``PATH``, step-by-step edits: :mod:`entropace.envs.os.tasks_shell`) are drawn too.
"""

from __future__ import annotations

import tarfile
import time
from typing import Any

from entropace.envs.base import EnvError, Policy, action_too_long, check_difficulty
from entropace.envs.os import procs
from entropace.envs.os.actions import (
    Answer,
    Bash,
    Done,
    answers_match,
    format_observation,
    observation_output,
    parse_action,
)
from entropace.envs.os.agentbench_check import agentbench_check
from entropace.envs.os.procs import ProcessInfo
from entropace.envs.os.sandbox import Sandbox, SandboxLimits
from entropace.envs.os.session import ShellSession
from entropace.envs.os.splits import ALL_TASKS, HELD_OUT, TRAIN_KINDS, draw_task, task_fingerprint
from entropace.envs.os.supervisor import SessionError
from entropace.envs.os.tasks import SystemState, Task
from entropace.envs.os.tasks_shell import DEFAULT_ETC, SHELL_KINDS, SHELL_TASKS
from entropace.envs.os.worktree import build_archive, read_etc, read_tree
from entropace.envs.splits import split_of

__all__ = ["SHELLS", "OsEnv", "oracle"]

#: The shell modes: a fresh sandbox per command, or one shell per episode.
SHELLS: tuple[str, ...] = ("fresh", "persistent")
#: How answers are judged: our lenient match, or AgentBench OS's check scripts.
SCORINGS: tuple[str, ...] = ("lenient", "agentbench")

MAX_TURNS = 10

_SYSTEM_PROMPT = """\
You are operating a Linux bash shell to solve a task. The task's files are in /work, your \
working directory. Each reply must start with exactly one of these actions:

bash: <command>
    Run <command> with bash in /work. Everything after "bash:" is the command (it may span \
several lines, or be a ```bash fenced block). You then see its output and exit code.
answer: <text>
    Give your final answer to a question. Ends the episode.
done
    Say that a task asking you to change files is finished. Ends the episode; the files are \
then checked.

Rules: every command starts in a fresh shell in /work, so files you create or change persist \
between commands but `cd`, variables and background processes do not. There is no network. \
A command is killed after {timeout:g} seconds, and only the first {chars} characters of its \
output are shown. Standard tools are available (grep, sed, awk, find, sort, cut, wc, ...).

Example:
bash: grep -c ' ERROR ' logs/app-0.log
(you see)
3
[exit code: 0]
answer: 3
"""

# The persistent shell's prompt: the same actions, its own rules (the fresh prompt above is
# kept byte for byte, so runs with the default shell stay reproducible).
_SYSTEM_PROMPT_PERSISTENT = _SYSTEM_PROMPT.replace(
    """\
done
    Say that a task asking you to change files is finished. Ends the episode; the files are \
then checked.

Rules: every command starts in a fresh shell in /work, so files you create or change persist \
between commands but `cd`, variables and background processes do not.""",
    """\
done
    Say that a task asking you to change files or the system (processes, users, ...) is \
finished (`finish` works too). Ends the episode; the files and the system are then checked.

Rules: all your commands run one after another in the same bash shell, which starts in \
/work: the working directory, variables, functions, files and background processes persist \
between commands. Commands cannot read input (stdin is empty). If a killed command leaves \
the shell hanging, or the shell exits, a new shell starts in /work.""",
).replace("(grep, sed, awk, find, sort, cut, wc, ...)", "(grep, sed, awk, find, ps, kill, ...)")

_SYNTAX_HINT = (
    "Invalid action. Start your reply with `bash: <command>`, `answer: <text>` or `done`. "
    "Example: bash: ls -la"
)


class OsEnv:
    """bash in a sandbox over a generated file tree (see the module docstring).

    Args:
        difficulty: ``easy`` / ``medium`` / ``hard`` (tree size, distractors, task kinds).
        command_timeout: seconds per command before its processes are killed.
        output_chars: characters of command output shown per observation.
        shell: ``"fresh"`` (default: a new sandbox per command; files persist, shell state
            does not) or ``"persistent"`` (one bash per episode: ``cd``, variables and
            background jobs persist too, and the system-state kinds are drawn as well).
        kinds: the task kinds to draw from (default: the difficulty's kinds for that shell);
            the persistent-shell kinds need ``shell="persistent"``.
        scoring: ``"lenient"`` (default: :func:`answers_match`) or ``"agentbench"``
            (AgentBench OS's check scripts, :mod:`entropace.envs.os.agentbench_check`).

    Raises:
        SandboxUnavailableError: when bubblewrap is missing or cannot create namespaces.
    """

    name = "os"
    max_turns = MAX_TURNS

    def __init__(
        self,
        difficulty: str = "easy",
        command_timeout: float = 5.0,
        output_chars: int = 4000,
        shell: str = "fresh",
        kinds: tuple[str, ...] | list[str] | str | None = None,
        scoring: str = "lenient",
    ) -> None:
        self.difficulty = check_difficulty(difficulty)
        if scoring not in SCORINGS:
            raise ValueError(f"scoring must be one of {list(SCORINGS)}, got {scoring!r}")
        self.scoring = scoring
        bad = isinstance(output_chars, bool) or not isinstance(output_chars, int)
        if bad or not 100 <= output_chars <= 100_000:
            raise ValueError(f"output_chars must be an int in [100, 100000], got {output_chars!r}")
        if isinstance(command_timeout, bool) or not isinstance(command_timeout, int | float):
            raise ValueError(f"command_timeout must be seconds (a number), got {command_timeout!r}")
        if shell not in SHELLS:
            raise ValueError(f"shell must be one of {list(SHELLS)}, got {shell!r}")
        self.shell = shell
        self.kinds = _check_kinds(kinds, difficulty, shell)
        self.sandbox = Sandbox(SandboxLimits(timeout_s=float(command_timeout)))
        self.output_chars = output_chars
        template = _SYSTEM_PROMPT if shell == "fresh" else _SYSTEM_PROMPT_PERSISTENT
        self.system_prompt = template.format(timeout=command_timeout, chars=output_chars)
        self.task: Task | None = None
        self.initial_state = b""
        self.state = b""
        self.session: ShellSession | None = None
        self._started: tuple[ProcessInfo, ...] = ()

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        """Generate instance ``seed``: its file tree (copied into a fresh state) and its task;
        in the persistent mode also start its shell (ending the previous episode's)."""
        self.close()
        # the seed's split picks the content pool (entropace.envs.os.splits)
        kind, tree, self.task = draw_task(int(seed), self.difficulty, self.kinds)
        if self.shell == "fresh":
            self.initial_state = self.state = build_archive(tree.files())
        else:
            etc = self.task.etc or DEFAULT_ETC
            self.initial_state = self.state = build_archive(tree.files(), etc)
            self._start_session()
        info = {
            "task": self.name,
            "seed": int(seed),
            "difficulty": self.difficulty,
            "gold": self.task.gold,
            "kind": kind,
            "split": split_of(int(seed)),
            "fingerprint": task_fingerprint(self.task),
        }
        return f"Task: {self.task.prompt}", info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one reply: run a command, or end with an answer / ``done``."""
        if self.task is None:
            raise EnvError("os: step() called before reset()")
        too_long = action_too_long(action)
        if too_long is not None:
            return too_long, 0.0, False, False, {"success": False, "parse_error": True}
        parsed = parse_action(action)
        if parsed is None:
            return _SYNTAX_HINT, 0.0, False, False, {"success": False, "parse_error": True}
        if isinstance(parsed, Bash):
            return self.step_bash(parsed.command)
        if isinstance(parsed, Answer):
            return self.step_answer(parsed.text)
        assert isinstance(parsed, Done)
        return self.step_done()

    def step_bash(self, command: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run ``command`` as it is (the ``bash:`` action without parsing; the tool interface
        calls it with ``bash_action``'s script)."""
        if self.task is None:
            raise EnvError("os: step() called before reset()")
        bad = _not_utf8(command, "command")
        if bad is not None:
            return bad, 0.0, False, False, {"success": False, "parse_error": True}
        if self.shell == "persistent":
            return self._run_persistent(command)
        return self._run(command)

    def step_answer(self, text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Answer the question with ``text`` (may span lines; ``answer:`` reads one line)."""
        task = self.task
        if task is None:
            raise EnvError("os: step() called before reset()")
        bad = _not_utf8(text, "answer")
        if bad is not None:
            return bad, 0.0, False, False, {"success": False, "parse_error": True}
        if task.is_goal:
            obs = "This task asks you to change files, not to answer: reply `done` when done."
            return obs, 0.0, False, False, {"success": False, "parse_error": False}
        if task.verify is not None:
            ok, reason = self._verify(text)
            obs = "Correct." if ok else f"Wrong answer: {reason}."
        elif self.scoring == "agentbench":
            ok = agentbench_check(task.kind, text, task.gold)
            obs = "Correct." if ok else "Wrong answer."
        else:
            ok = answers_match(text, task.gold)
            obs = "Correct." if ok else "Wrong answer."
        self.close()
        return obs, float(ok), True, False, {"success": ok, "parse_error": False}

    def step_done(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Say that a goal task is finished: check the final files (and system state)."""
        task = self.task
        if task is None:
            raise EnvError("os: step() called before reset()")
        if not task.is_goal:
            obs = "This task asks a question: reply `answer: <text>` with your answer."
            return obs, 0.0, False, False, {"success": False, "parse_error": False}
        if task.verify is not None:
            ok, reason = self._verify(None)
        else:
            assert task.check is not None
            try:
                if self.session is not None:
                    self.state = self.session.dump()
                tree = read_tree(self.state)
            except (SessionError, tarfile.TarError) as exc:
                self.close()
                obs = f"The goal is not reached: the sandbox failed ({exc})."
                return obs, 0.0, True, False, {"success": False, "parse_error": False}
            ok, reason = task.check(tree)
        self.close()
        obs = "The goal is reached." if ok else f"The goal is not reached: {reason}."
        return obs, float(ok), True, False, {"success": ok, "parse_error": False}

    def close(self) -> None:
        """End the persistent shell's sandbox, if one runs (idempotent; ``reset`` and the end
        of an episode call it, and so does garbage collection of the session)."""
        if self.session is not None:
            self.session.close()
            self.session = None

    def end_episode(self) -> None:
        """Called by :class:`~entropace.envs.base.TurnLimit` when it truncates the episode:
        the persistent shell's sandbox ends then, not at the next ``reset``."""
        self.close()

    # -- the persistent shell ----------------------------------------------------------------

    def _start_session(self) -> None:
        assert self.task is not None
        self.session = ShellSession(self.sandbox, self.initial_state)
        for command in self.task.setup:
            result = self.session.run(command)
            if result.exit_code != 0:
                self.close()
                raise RuntimeError(
                    f"os: the setup command {command!r} of {self.task.kind} failed "
                    f"({result.output[:200]!r}); this is a bug of the task generator"
                )
        self._started = tuple(self.session.processes(settle=True)) if self.task.setup else ()

    def _run_persistent(self, command: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        info: dict[str, Any] = {"success": False, "parse_error": False}
        limit = self.sandbox.limits.max_command_chars
        refused = None
        if "\x00" in command:
            refused = "the command contains a NUL byte"
        elif len(command) > limit:
            refused = f"the command is {len(command)} characters; the limit is {limit}"
        if refused is not None:
            info.update(exit_code=None, timed_out=False, restarted=False)
            return f"[{refused}]", 0.0, False, False, info
        assert self.session is not None
        try:
            result = self.session.run(command)
        except SessionError as exc:
            self.close()
            self._start_session()
            info.update(exit_code=None, timed_out=False, restarted=True)
            obs = f"[the sandbox stopped ({exc}); a new one was started from the task's files]"
            return obs, 0.0, False, False, info
        info.update(
            exit_code=result.exit_code, timed_out=result.timed_out, restarted=result.restarted
        )
        exit_code = result.exit_code if result.exit_code is not None else -1
        obs = format_observation(
            result.output, exit_code, max_chars=self.output_chars, note=result.note
        )
        return obs, 0.0, False, False, info

    def final_state(self) -> SystemState:
        """Probe, stop and read back the sandbox (ends the session): the state the
        persistent kinds are verified on. Raises :class:`SessionError` when it fails."""
        task, session = self.task, self.session
        if task is None or session is None:
            raise EnvError("os: final_state() needs a running persistent shell")
        processes = tuple(session.processes(settle=True, digests=True))
        runners = [procs.started_at(p.start) for p in processes if p.digests]  # run a /work file
        files = session.read_files(task.watch_files, newer_than=max(runners, default=None))
        now = time.time()
        variables = session.read_variables(task.live_vars)  # kills every other process first
        session.kill_all()
        session.discard_output()  # e.g. bash's notices of the jobs killed above
        fresh = tuple(_text(session.run(c)) for c in task.probe_fresh)
        self.state = session.dump()
        tree, etc = read_tree(self.state), read_etc(self.state)
        return SystemState(tree, etc, processes, self._started, variables, fresh, files, now)

    def _verify(self, answer: str | None) -> tuple[bool, str]:
        assert self.task is not None and self.task.verify is not None
        try:
            state = self.final_state()
        except (SessionError, OSError, ValueError, tarfile.TarError) as exc:
            return False, f"the sandbox's final state could not be read ({exc})"
        return self.task.verify(state, answer)

    # -- the fresh shell ---------------------------------------------------------------------

    def _run(self, command: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        result = self.sandbox.run(command, self.state)
        info: dict[str, Any] = {"success": False, "parse_error": False}
        info.update(exit_code=result.exit_code, timed_out=result.timed_out)
        if result.state is not None:
            self.state = result.state
        if result.error is not None and not result.timed_out:
            return f"[{result.error}]", 0.0, False, False, info
        note = ""
        if result.timed_out:
            limit = self.sandbox.limits.timeout_s
            note = f"killed after the {limit:g} s time limit; the command's changes were kept"
            if result.state is None:
                note = f"killed after the {limit:g} s time limit; its changes were discarded"
        exit_code = result.exit_code if result.exit_code is not None else -1
        obs = format_observation(result.output, exit_code, max_chars=self.output_chars, note=note)
        return obs, 0.0, False, False, info


def _text(result: Any) -> str:
    return bytes(result.output).decode("utf-8", "replace")


def _check_kinds(
    kinds: tuple[str, ...] | list[str] | str | None, difficulty: str, shell: str
) -> tuple[str, ...]:
    """The kinds to draw from: the default ones, or ``kinds`` validated."""
    if kinds is None:
        extra = SHELL_KINDS[difficulty] if shell == "persistent" else ()
        base = TRAIN_KINDS[difficulty]
        return base + tuple(k for k in extra if k not in base)
    names = tuple(k.strip() for k in kinds.split(",")) if isinstance(kinds, str) else tuple(kinds)
    known = sorted(k for k in ALL_TASKS if k not in HELD_OUT)
    if any(k in HELD_OUT for k in names):
        held = sorted(k for k in names if k in HELD_OUT)
        raise ValueError(
            f"the kinds {held} are held out for the test_unseen split (entropace.envs.os.splits)"
        )
    if not names or any(not isinstance(k, str) or k not in known for k in names):
        raise ValueError(f"kinds must be a non-empty list of {known}, got {kinds!r}")
    if shell == "fresh" and any(k in SHELL_TASKS for k in names):
        needs = sorted(k for k in names if k in SHELL_TASKS)
        raise ValueError(f"the kinds {needs} need shell='persistent'")
    return names


def oracle(env: Any) -> Policy:
    """Scripted solver (after ``env.reset``): runs the task's gold commands through ``step``,
    then answers with the last command's output (questions) or says ``done`` (goals)."""
    task: Task = env.task
    pending = [f"bash: {cmd}" for cmd in task.commands]

    def policy(observation: str) -> str:
        if pending:
            return pending.pop(0)
        if task.is_goal:
            return "done"
        return "answer: " + observation_output(observation).strip()

    return policy


def _not_utf8(text: str, what: str) -> str | None:
    """The parse-error observation for text that cannot be encoded as UTF-8 (a lone surrogate
    such as ``\\ud800`` from a decoder's error handler), or None. Such text cannot reach a
    shell; the episode goes on."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"Your {what} contains a character that is not valid UTF-8 "
            f"(U+{ord(text[exc.start]):04X} at position {exc.start}); it was not run."
        )
    return None
