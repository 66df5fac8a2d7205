"""The ``os`` environment: answer questions about / change a file tree with real bash.

AgentBench-OS style (Liu et al., 2023, "AgentBench: Evaluating LLMs as Agents", the OS
interaction task): each instance generates a small file tree (logs, CSV tables, config files,
scripts, nested and hidden directories) from its seed and asks a question (``answer: ...``) or
sets a goal (``done``); every ``bash:`` command runs in a fresh bubblewrap sandbox
(:mod:`entropace.envs.os.sandbox`) against a private copy of the tree.
"""

from __future__ import annotations

import random
from typing import Any

from entropace.envs.base import EnvError, Policy, action_too_long, check_difficulty
from entropace.envs.os.actions import (
    Answer,
    Bash,
    Done,
    answers_match,
    format_observation,
    observation_output,
    parse_action,
)
from entropace.envs.os.sandbox import Sandbox, SandboxLimits
from entropace.envs.os.tasks import BY_DIFFICULTY, TASKS, Task
from entropace.envs.os.tree import generate_tree
from entropace.envs.os.worktree import build_archive, read_tree

__all__ = ["OsEnv", "oracle"]

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

_SYNTAX_HINT = (
    "Invalid action. Start your reply with `bash: <command>`, `answer: <text>` or `done`. "
    "Example: bash: ls -la"
)


class OsEnv:
    """bash in a sandbox over a generated file tree (see the module docstring).

    Args:
        difficulty: ``easy`` / ``medium`` / ``hard`` (tree size, distractors, task kinds).
        command_timeout: seconds per command before its whole process tree is killed.
        output_chars: characters of command output shown per observation.

    Raises:
        SandboxUnavailableError: when bubblewrap is missing or cannot create namespaces.
    """

    name = "os"
    max_turns = MAX_TURNS

    def __init__(
        self, difficulty: str = "easy", command_timeout: float = 5.0, output_chars: int = 4000
    ) -> None:
        self.difficulty = check_difficulty(difficulty)
        bad = isinstance(output_chars, bool) or not isinstance(output_chars, int)
        if bad or not 100 <= output_chars <= 100_000:
            raise ValueError(f"output_chars must be an int in [100, 100000], got {output_chars!r}")
        if isinstance(command_timeout, bool) or not isinstance(command_timeout, int | float):
            raise ValueError(f"command_timeout must be seconds (a number), got {command_timeout!r}")
        self.sandbox = Sandbox(SandboxLimits(timeout_s=float(command_timeout)))
        self.output_chars = output_chars
        self.system_prompt = _SYSTEM_PROMPT.format(timeout=command_timeout, chars=output_chars)
        self.task: Task | None = None
        self.initial_state = b""
        self.state = b""

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        """Generate instance ``seed``: its file tree (copied into a fresh state) and its task."""
        rng = random.Random(f"entropace.os/{self.difficulty}/{int(seed)}")
        kind = rng.choice(BY_DIFFICULTY[self.difficulty])
        tree = generate_tree(rng, self.difficulty)
        self.task = TASKS[kind](rng, tree)  # may adjust the tree (ties, modes) before rendering
        self.initial_state = self.state = build_archive(tree.files())
        info = {
            "task": self.name,
            "seed": int(seed),
            "difficulty": self.difficulty,
            "gold": self.task.gold,
            "kind": kind,
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
            return self._run(parsed.command)
        if isinstance(parsed, Answer):
            if self.task.is_goal:
                obs = "This task asks you to change files, not to answer: reply `done` when done."
                return obs, 0.0, False, False, {"success": False, "parse_error": False}
            ok = answers_match(parsed.text, self.task.gold)
            obs = "Correct." if ok else "Wrong answer."
            return obs, float(ok), True, False, {"success": ok, "parse_error": False}
        assert isinstance(parsed, Done)
        if not self.task.is_goal:
            obs = "This task asks a question: reply `answer: <text>` with your answer."
            return obs, 0.0, False, False, {"success": False, "parse_error": False}
        assert self.task.check is not None
        ok, reason = self.task.check(read_tree(self.state))
        obs = "The goal is reached." if ok else f"The goal is not reached: {reason}."
        return obs, float(ok), True, False, {"success": ok, "parse_error": False}

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
