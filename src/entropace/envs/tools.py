"""The tool-calling interface: families publish JSON-schema tools and take parsed tool calls.

``make(name, interface="tools")`` wraps a family's environment in :class:`ToolInterface`
(inside the usual :class:`~entropace.envs.base.TurnLimit`). The wrapped environment

* publishes :attr:`ToolInterface.tools`: the tools as JSON schemas in the format
  ``transformers``' ``apply_chat_template(tools=...)`` and OpenAI's API take
  (``{"type": "function", "function": {"name", "description", "parameters"}}``), with
  AgentBench FC's names and arguments (``execute_sql(query)``, ``bash_action(script)``, ...);
* reads each reply's tool calls (:func:`parse_tool_calls`; the formats are below), checks
  them against the schemas (:func:`validate_arguments`) and applies the call to the family's
  own dynamics (each family's ``fc.py`` maps a call onto one of its actions);
* returns the result as a *tool message*: ``info["observation_role"] = "tool"`` with
  ``info["tool_call_id"]`` and ``info["tool_name"]``; the rollout then renders the observation
  as ``{"role": "tool", ...}`` (``rollout/chat.py``). A reply without any tool call gets a
  ``user`` message (AgentBench FC does the same).

Call formats the parser reads (the whole reply, linear time, never raises):

1. Hermes / Qwen (ChatML): any number of ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
   blocks anywhere in the reply (text around them is the model's thinking). This is the
   generic format: for chat templates without tool support (SmolLM2's) the rollout puts the
   schemas and this format into the system prompt (``docs/envs/tools.md``).
2. Mistral: ``[TOOL_CALLS]`` followed by a JSON list of ``{"name", "arguments"}`` objects.
3. Llama 3.x: a reply that is one JSON object ``{"name": ..., "parameters"|"arguments": {...}}``
   (optionally after ``<|python_tag|>``).

``arguments`` may be a JSON object or a string holding one (OpenAI's wire format).

Tool errors (the family is not stepped; the observation says what was wrong and the step
counts as a parse error, ``info["parse_error"] = True``, with ``info["tool_error"]`` naming the
kind): ``too_long`` (reply over :data:`~entropace.envs.base.MAX_ACTION_CHARS`), ``no_call``,
``bad_json``, ``unknown_tool``, ``bad_arguments`` (missing / extra / mistyped arguments, or an
argument the family cannot take), ``several_calls`` (more than ``max_calls`` calls in one reply,
under ``calls_per_reply="strict"``).

Calls per reply (:data:`CALLS_PER_REPLY`; ``ToolSuite.calls_per_reply``, overridden per profile by
``ToolInterface(..., calls_per_reply=...)``):

* ``"strict"`` (the default): at most ``max_calls`` calls; more is a ``several_calls`` error
  and none of them runs;
* ``"first"``: the first well-formed call runs, the others are ignored (AgentBench FC's os,
  household and shop tasks);
* ``"all"``: every call runs, in order, each with its own tool message, until one ends the
  episode (AgentBench FC's dbbench and kg task loops: ``for tool_call in tool_calls:`` in
  ``src/server/tasks/dbbench/task.py`` line 133 and ``knowledgegraph/task.py`` line 140 at
  commit 578c5e9; dbbench returns at ``commit_final_answer``, line 216). A malformed call gets
  its error message and the next call still runs, as there. The step's observation is the
  calls' messages joined by a blank line; ``info["tool_messages"]`` holds them one by one
  (``{"role": "tool", "tool_call_id", "name", "content"}``), ``info["calls_run"]`` counts the
  calls the family ran, the reward is the sum of theirs, ``parse_error`` is set only when no
  call ran, and ``tool_error`` names the first error (None when every call ran).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from entropace.envs.base import EnvError, StepResult, action_too_long
from entropace.envs.tool_calls import (
    MAX_JSON_DEPTH,
    ParsedReply,
    ToolCall,
    format_tool_call,
    parse_tool_calls,
    shorten,
    string_parameters,
    validate_arguments,
)

__all__ = [
    "CALLS_PER_REPLY",
    "MAX_JSON_DEPTH",
    "TOOL_ERRORS",
    "MessageStyle",
    "ParsedReply",
    "ToolArgumentError",
    "ToolCall",
    "ToolInterface",
    "ToolSpec",
    "ToolSuite",
    "format_tool_call",
    "one_line",
    "parse_tool_calls",
    "string_parameters",
    "text_step",
    "tool_oracle",
    "validate_arguments",
]

#: The kinds of tool error reported in ``info["tool_error"]``.
TOOL_ERRORS: tuple[str, ...] = (
    "too_long",
    "no_call",
    "bad_json",
    "unknown_tool",
    "bad_arguments",
    "several_calls",
)


#: What the interface does with several calls in one reply (see the module docstring).
CallsPerReply = Literal["all", "first", "strict"]
CALLS_PER_REPLY: tuple[str, ...] = ("all", "first", "strict")


def check_calls_per_reply(value: object) -> CallsPerReply:
    """``value`` if it is one of :data:`CALLS_PER_REPLY`, else ``ValueError`` naming them."""
    if value not in CALLS_PER_REPLY:
        raise ValueError(f"calls_per_reply must be one of {list(CALLS_PER_REPLY)}, got {value!r}")
    return value  # type: ignore[return-value]


class ToolArgumentError(ValueError):
    """Raised by a tool's ``run`` when arguments that match the schema still cannot be applied
    (e.g. a newline inside a kg entity name); it becomes a ``bad_arguments`` tool error."""


@dataclass(frozen=True)
class ToolSpec:
    """One tool of a family.

    Attributes:
        name: the function name (AgentBench FC's where it has one).
        description: one sentence for the schema.
        parameters: JSON schema of the arguments (``type: object`` with ``properties``,
            ``required`` and ``additionalProperties: false``); supported property types:
            ``string``, ``integer``, ``number``, ``boolean``, ``array`` (with ``items``) and
            ``object``.
        run: ``run(env, arguments) -> StepResult``: applies a validated call to the family's
            (unwrapped) environment, usually ``env.step(<the family's text action>)``; raises
            :class:`ToolArgumentError` for arguments the family cannot take.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[Any, dict[str, Any]], StepResult]

    def schema(self) -> dict[str, Any]:
        """The tool in the ``apply_chat_template(tools=...)`` / OpenAI format."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True)
class MessageStyle:
    """How the observations of the tools interface are worded (the ``agentbench`` profile uses
    AgentBench FC's task texts; default: the family's own observations, unchanged).

    Attributes:
        first: ``first(env, observation) -> str``: the first user message.
        result: ``result(env, call, observation) -> str``: the tool message of a call.
        no_call: ``no_call(env) -> str``: the user message after a reply without a tool call.
    """

    first: Callable[[Any, str], str] | None = None
    result: Callable[[Any, ToolCall, str], str] | None = None
    no_call: Callable[[Any], str] | None = None


@dataclass(frozen=True)
class ToolSuite:
    """A family's tool interface (defined in the family's ``fc.py``).

    Attributes:
        tools: the tools, in the order they are shown.
        system_prompt: ``system_prompt(env, max_turns) -> str``, the task instructions for the
            tools interface (no text action syntax; the schemas reach the model through the
            chat template or the generic tools section), stating the episode's turn limit.
        to_call: ``to_call(text_action) -> ToolCall | str``: the call equivalent to one of the
            family's text actions, or a plain text reply (e.g. kg's ``Final Answer: #3``);
            used to run the family's text oracle through the tools interface.
        no_call: ``no_call(env, reply) -> StepResult | None``: what a reply without any tool
            call does (``None``: the ``no_call`` tool error); kg ends an episode on the text
            ``Final Answer: #N`` as AgentBench FC does.
        max_calls: calls allowed in one reply under ``calls_per_reply="strict"`` (1: one
            action per turn).
        calls_per_reply: ``"strict"`` (default), ``"first"`` or ``"all"``: what a reply with
            several calls does (module docstring); a profile overrides it through
            :class:`ToolInterface`'s ``calls_per_reply``.
        style: the :class:`MessageStyle` of the tools interface (e.g. os turns the task's
            "Reply `done`" into "Call `finish_action`").
        agentbench: the :class:`MessageStyle` of AgentBench FC's task (``profile="agentbench"``).
    """

    tools: tuple[ToolSpec, ...]
    system_prompt: Callable[[Any, int], str]
    to_call: Callable[[str], ToolCall | str]
    no_call: Callable[[Any, str], StepResult | None] = field(default=lambda env, reply: None)
    max_calls: int = 1
    calls_per_reply: CallsPerReply = "strict"
    style: MessageStyle = field(default_factory=MessageStyle)
    agentbench: MessageStyle = field(default_factory=MessageStyle)

    def __post_init__(self) -> None:
        check_calls_per_reply(self.calls_per_reply)

    def by_name(self) -> dict[str, ToolSpec]:
        return {t.name: t for t in self.tools}


# --------------------------------------------------------------------------------------------
# The wrapper
# --------------------------------------------------------------------------------------------


class ToolInterface:
    """A family environment seen through its tools (see the module docstring).

    Args:
        env: the family's (unwrapped) environment.
        suite: the family's :class:`ToolSuite` (from its ``fc.py``).
        style: how observations are worded (default: the family's own observations).
        calls_per_reply: ``"strict"``, ``"first"`` or ``"all"`` (module docstring); None: the
            suite's (``ToolSuite.calls_per_reply``). The ``agentbench`` profile passes its
            per-family value.

    Attributes ``name`` and ``max_turns`` are the family's; ``system_prompt`` is the suite's;
    every other attribute is delegated to ``env`` (so oracles and tests reach its state).
    ``raw_observation`` is the family's last observation before any :class:`MessageStyle`
    rewording (what the family's text oracle reads).
    """

    def __init__(
        self,
        env: Any,
        suite: ToolSuite,
        style: MessageStyle | None = None,
        calls_per_reply: CallsPerReply | None = None,
    ) -> None:
        self.env = env
        self.suite = suite
        self.style = style or MessageStyle()
        self.calls_per_reply: CallsPerReply = check_calls_per_reply(
            suite.calls_per_reply if calls_per_reply is None else calls_per_reply
        )
        self._by_name = suite.by_name()
        self.turn = 0
        self.calls_made = 0
        self.raw_observation = ""

    @property
    def name(self) -> str:
        return str(self.env.name)

    @property
    def max_turns(self) -> int:
        return int(self.env.max_turns)

    @property
    def system_prompt(self) -> str:
        return self.suite.system_prompt(self.env, self.max_turns)

    def system_prompt_for(self, max_turns: int) -> str:
        """The system prompt stating ``max_turns`` (:class:`TurnLimit` passes its own limit)."""
        return self.suite.system_prompt(self.env, int(max_turns))

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The JSON schemas (``apply_chat_template(tools=...)`` format), a fresh list."""
        return [json.loads(json.dumps(t.schema())) for t in self.suite.tools]

    def __getattr__(self, item: str) -> Any:
        if item in ("env", "suite", "style", "_by_name", "calls_per_reply"):
            raise AttributeError(item)
        return getattr(self.env, item)

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        obs, info = self.env.reset(seed)
        self.turn = 0
        self.raw_observation = obs
        info["interface"] = "tools"
        if self.style.first is not None:
            obs = self.style.first(self.env, obs)
        return obs, info

    def _error(self, kind: str, message: str, *, call_id: str = "", name: str = "") -> StepResult:
        info: dict[str, Any] = {
            "success": False,
            "parse_error": True,
            "tool_error": kind,
            "observation_role": "tool" if call_id else "user",
        }
        if call_id:
            info.update(tool_call_id=call_id, tool_name=name)
        return message, 0.0, False, False, info

    def _names(self) -> str:
        return ", ".join(t.name for t in self.suite.tools)

    def step(self, action: str) -> StepResult:
        self.turn += 1
        too_long = action_too_long(action) if isinstance(action, str) else "not text"
        if too_long is not None:
            return self._error("too_long", too_long)
        parsed = parse_tool_calls(action)
        if not parsed.calls and not parsed.errors:
            result = self.suite.no_call(self.env, action)
            if result is not None:
                obs, reward, terminated, truncated, info = result
                self.raw_observation = obs
                info.setdefault("observation_role", "user")
                return obs, reward, terminated, truncated, info
            if self.style.no_call is not None:
                return self._error("no_call", self.style.no_call(self.env))
            return self._error(
                "no_call",
                f"No tool call found in your reply. Call exactly one of the tools "
                f"({self._names()}): "
                '<tool_call>{"name": <tool name>, "arguments": {<argument>: <value>}}</tool_call>',
            )
        call_id = f"call_{self.turn}"
        if self.calls_per_reply == "all":
            return self._run_all(parsed)
        if self.calls_per_reply == "first":
            if not parsed.calls:
                return self._bad_json(parsed.errors[0], call_id)
            result = self._run_call(parsed.calls[0], call_id)
            result[4]["calls_ignored"] = len(parsed.calls) + len(parsed.errors) - 1
            return result
        n_calls = len(parsed.calls) + len(parsed.errors)
        if parsed.errors:
            return self._bad_json(parsed.errors[0], call_id)
        if n_calls > self.suite.max_calls:
            return self._error(
                "several_calls",
                f"Your reply has {n_calls} tool calls; call at most {self.suite.max_calls} "
                "tool per turn. None of them was run.",
                call_id=call_id,
            )
        return self._run_call(parsed.calls[0], call_id)

    def _bad_json(self, error: str, call_id: str) -> StepResult:
        return self._error(
            "bad_json",
            f"Your tool call could not be read: {error}. Write it as "
            '{"name": <tool name>, "arguments": {...}} in valid JSON.',
            call_id=call_id,
        )

    def _run_call(self, call: ToolCall, default_id: str) -> StepResult:
        """Check one well-formed call against its schema and apply it to the family."""
        call_id = call.id or default_id
        spec = self._by_name.get(call.name)
        if spec is None:
            return self._error(
                "unknown_tool",
                f"There is no tool {shorten(call.name)}. Tools: {self._names()}.",
                call_id=call_id,
                name=call.name[:60],
            )
        problem = validate_arguments(call.arguments, spec.parameters)
        if problem is None:
            try:
                obs, reward, terminated, truncated, info = spec.run(self.env, call.arguments)
            except ToolArgumentError as exc:
                problem = str(exc)
        if problem is not None:
            return self._error(
                "bad_arguments",
                f"Bad arguments for {spec.name}: {problem}.",
                call_id=call_id,
                name=spec.name,
            )
        info = dict(info)
        info.update(observation_role="tool", tool_call_id=call_id, tool_name=spec.name)
        info.setdefault("tool_error", None)
        self.calls_made += 1
        self.raw_observation = obs
        if self.style.result is not None:
            obs = self.style.result(self.env, call, obs)
        return obs, reward, terminated, truncated, info

    def _run_all(self, parsed: ParsedReply) -> StepResult:
        """``calls_per_reply="all"``: every call in order, until one ends the episode.

        Malformed calls (``parsed.errors``; the parser does not keep their position among the
        well-formed ones) get their error messages after the calls that ran.
        """
        results: list[StepResult] = []

        def call_id(k: int) -> str:  # the first call keeps the single-call id
            return f"call_{self.turn}" if k == 0 else f"call_{self.turn}_{k}"

        for k, call in enumerate(parsed.calls):
            results.append(self._run_call(call, call_id(k)))
            if results[-1][2] or results[-1][3]:
                break
        else:
            for k, error in enumerate(parsed.errors, start=len(parsed.calls)):
                results.append(self._bad_json(error, call_id(k)))
        messages = [
            {
                "role": "tool",
                "tool_call_id": str(r[4].get("tool_call_id", "")),
                "name": str(r[4].get("tool_name", "")),
                "content": r[0],
            }
            for r in results
        ]
        ran = [r for r in results if r[4].get("tool_error") is None]
        errors = [r[4]["tool_error"] for r in results if r[4].get("tool_error") is not None]
        last = ran[-1] if ran else results[0]
        info = dict(last[4])
        info.update(
            tool_messages=messages,
            calls_run=len(ran),
            tool_error=errors[0] if errors else None,
            parse_error=not ran,
            observation_role="tool",
        )
        if len(results) == 1:
            info.pop("tool_messages")
        obs = "\n\n".join(r[0] for r in results)
        reward = float(sum(r[1] for r in results))
        return obs, reward, results[-1][2], results[-1][3], info


def tool_oracle(oracle: Callable[[Any], Callable[[str], str]]) -> Callable[[Any], Any]:
    """The family's text oracle run through the tools interface: each text action becomes the
    equivalent tool call (``suite.to_call``), written in the generic Hermes format."""

    def build(env: Any) -> Callable[[str], str]:
        policy = oracle(env)
        interface = _interface_of(env)

        def act(observation: str) -> str:
            # the text oracle reads the family's own observation, before any rewording
            call = interface.suite.to_call(policy(interface.raw_observation))
            return call if isinstance(call, str) else format_tool_call(call)

        return act

    return build


def _interface_of(env: Any) -> ToolInterface:
    seen: Sequence[Any] = ()
    while not isinstance(env, ToolInterface):
        inner = getattr(env, "__dict__", {}).get("env")
        if inner is None or env in seen:
            raise EnvError("tool_oracle needs an environment built with interface='tools'")
        seen = (*seen, env)
        env = inner
    return env


def text_step(render: Callable[[dict[str, Any]], str]) -> Callable[[Any, dict[str, Any]], Any]:
    """A tool ``run`` that steps the family with the text action ``render(arguments)``."""

    def run(env: Any, arguments: dict[str, Any]) -> StepResult:
        return env.step(render(arguments))

    return run


_NEWLINE = re.compile(r"[\r\n\u2028\u2029\x0b\x0c\x1c\x1d\x1e\x85]")


def one_line(value: str, what: str) -> str:
    """``value`` if it has no line break (the family reads one line), else ToolArgumentError."""
    if _NEWLINE.search(value):
        raise ToolArgumentError(f"{what} must be on one line")
    return value
