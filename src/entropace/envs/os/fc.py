"""``os`` through tools (AgentBench FC's OS tools): ``bash_action``, ``answer_action``,
``finish_action``.

Schemas as in AgentBench FC (``configs/tasks/os.yaml``): ``bash_action(script)``,
``answer_action(answer)``, ``finish_action(thought)``, all required strings. Mapping onto the
family's actions:

* ``bash_action`` runs the script (``env.step_bash(script)`` when the environment has that
  direct entry point, else the text action ``bash: <script>``, whose parser keeps a multi-line
  script whole: it drops only surrounding whitespace and unwraps a script that is one fenced
  code block);
* ``answer_action`` and ``finish_action`` both *commit*, as in AgentBench FC's task code
  (``_extract_function``: both are the ``commit`` action): on a goal task (change the files)
  the final state is checked (``done``); on a question task the answer, or for
  ``finish_action`` the thought, is compared with the gold answer. A multi-line answer goes
  through ``env.step_answer`` when it exists; the text action reads one line, so without it a
  multi-line answer is a ``bad_arguments`` tool error rather than a silently cut answer.
"""

from __future__ import annotations

from typing import Any

from entropace.envs.base import StepResult
from entropace.envs.os.actions import Answer, Bash, Done, observation_output, parse_action
from entropace.envs.tools import (
    MessageStyle,
    ToolArgumentError,
    ToolCall,
    ToolSpec,
    ToolSuite,
    one_line,
    string_parameters,
)

SYSTEM_PROMPT = """\
You are an assistant that acts like a person operating a Linux bash shell; I play the role \
of the operating system. Your goal is to carry out the operation I ask for or to answer my \
question about the files in /work (your working directory).
Each turn, think about what to do, then call exactly one of the provided tools:
- `bash_action` runs a bash script and shows you its output ({chars} characters at most; \
scripts are stopped after {timeout:g} s). Scripts must not wait for input.
- `answer_action` gives your answer to a question: exact and precise (for example a single \
number), not a sentence. It ends the episode.
- `finish_action` says that a task asking you to change the system is done. It ends the \
episode and the system is checked.
{shell}
Always call a tool; a reply without a tool call is not executed. You have at most \
{max_turns} turns."""

_FRESH = (
    "Every script starts in a fresh shell in /work: files you change persist between calls, "
    "but `cd`, variables and background processes do not."
)
_PERSISTENT = (
    "All scripts run in one shell that lives for the whole episode: the working directory, "
    "variables, files and background jobs persist between calls."
)


def _system_prompt(env: Any, max_turns: int) -> str:
    persistent = getattr(env, "shell", "fresh") == "persistent"
    limits = getattr(getattr(env, "sandbox", None), "limits", None)
    return SYSTEM_PROMPT.format(
        chars=getattr(env, "output_chars", 4000),
        timeout=getattr(limits, "timeout_s", 5.0),
        shell=_PERSISTENT if persistent else _FRESH,
        max_turns=max_turns,
    )


def _is_goal(env: Any) -> bool:
    return bool(getattr(getattr(env, "task", None), "is_goal", False))


def _bash(env: Any, arguments: dict[str, Any]) -> StepResult:
    script = arguments["script"]
    if not script.strip():
        raise ToolArgumentError("the script is empty")
    direct = getattr(env, "step_bash", None)
    if callable(direct):
        return direct(script)
    return env.step("bash: " + script)


def _commit(env: Any, text: str) -> StepResult:
    if _is_goal(env):
        direct = getattr(env, "step_done", None)
        return direct() if callable(direct) else env.step("done")
    if not text.strip():
        raise ToolArgumentError("the answer is empty")
    direct = getattr(env, "step_answer", None)
    if callable(direct):
        return direct(text)
    return env.step("answer: " + one_line(text.strip(), "the answer"))


BASH_ACTION = ToolSpec(
    name="bash_action",
    description="Execute bash code to perform an operation in the Linux environment.",
    parameters=string_parameters(script="The bash script to be executed."),
    run=_bash,
)

FINISH_ACTION = ToolSpec(
    name="finish_action",
    description="Indicate that the task has been finished or need some additional information "
    "to be finished.",
    parameters=string_parameters(thought="The thought or reason indicating the task is finished."),
    run=lambda env, a: _commit(env, a["thought"]),
)

ANSWER_ACTION = ToolSpec(
    name="answer_action",
    description="Provide the answer to the question.",
    parameters=string_parameters(answer="The answer to the question."),
    run=lambda env, a: _commit(env, a["answer"]),
)


def to_call(action: str) -> ToolCall | str:
    """The call equivalent to a text action (``bash:``, ``answer:``, ``done``)."""
    parsed = parse_action(action)
    if isinstance(parsed, Bash):
        return ToolCall("bash_action", {"script": parsed.command})
    if isinstance(parsed, Answer):
        return ToolCall("answer_action", {"answer": parsed.text})
    if isinstance(parsed, Done):
        return ToolCall("finish_action", {"thought": "The task is done."})
    return action


def _agentbench_result(env: Any, call: ToolCall, observation: str) -> str:
    """AgentBench FC's wording of a command's output (os_interaction/task.py)."""
    if call.name != "bash_action":
        return observation
    output = observation_output(observation).rstrip("\n")
    return f"The output of the OS:\n\n{output}" if output else "The output of the OS is empty."


def _tools_first(env: Any, observation: str) -> str:
    """The task text with its text-syntax instruction in tool terms."""
    return observation.replace("Reply `done` when finished.", "Call `finish_action` when finished.")


#: The tools interface's wording: the goal tasks' "Reply `done`" names the tool instead.
STYLE = MessageStyle(first=_tools_first)

AGENTBENCH_STYLE = MessageStyle(
    first=lambda env, obs: (
        "Now, I will start a new problem in a new OS. My problem is:\n\n"
        + _tools_first(env, obs).removeprefix("Task: ")
    ),
    result=_agentbench_result,
    no_call=lambda env: "No executable tool calls found. Please call a tool instead",
)

SUITE = ToolSuite(
    tools=(BASH_ACTION, FINISH_ACTION, ANSWER_ACTION),
    system_prompt=_system_prompt,
    to_call=to_call,
    style=STYLE,
    agentbench=AGENTBENCH_STYLE,
)
