"""entropace's tool interface through TRL's own tool mechanism (``environment_factory``).

TRL 1.16's ``GRPOTrainer(environment_factory=...)`` builds one environment object per rollout
(pooled, ``reset(**row)`` before each), exposes its public methods as tools (their schemas from
the type hints and docstrings, ``transformers.utils.get_json_schema``), renders them with
``apply_chat_template(tools=...)``, parses the model's calls with the tokenizer's response
schema and runs ``method(**arguments)``; the result becomes a ``tool`` message (masked out of
the loss by TRL's ``tool_mask``), and generation goes on until a reply has no call.

:func:`tool_environment` turns a family's :class:`~entropace.envs.tools.ToolSuite` into such a
class: one method per tool (``execute_sql(query)``, ``bash_action(script)``, ...; docstring
and signature from the tool's JSON schema), each backed by one entropace environment
``make(family, interface="tools", profile=..., **options)``. ``reset(seed=..., **row)`` resets it
with the row's seed and returns the first observation (TRL appends it to the prompt's last user
message, which :func:`tool_env_dataset` leaves empty). A call is handed to the environment as
the equivalent generic call text (``format_tool_call``), so the observation, argument checks,
tool errors, rewards and turn limit are entropace's own ``interface="tools"`` path.

Rewards: :func:`env_tool_reward` (a TRL reward function; it reads the ``environments`` TRL
passes to reward functions). It first hands a final reply without a call to the environment
(kg's ``Final Answer: #N`` is text in AgentBench FC, not a tool; for other families it is the
``no_call`` parse error), then returns the episode return. The classes define no
``get_reward`` (TRL would add it as a second reward source and never show it the final reply).

What TRL does its own way: calls are parsed by the tokenizer's response schema (a Qwen, Llama,
... chat template TRL knows), not entropace's parser, so a malformed call ends the rollout
instead of giving a ``bad_json`` tool error; a call to an unknown name gets TRL's
``{"error": ...}`` message without stepping the environment; TRL does not stop when the
episode ends (calls after the end get :data:`EPISODE_OVER`, reward 0).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from entropace.envs import make, seeds
from entropace.envs.registry import tool_suite
from entropace.envs.tools import ToolCall, ToolSpec, format_tool_call

__all__ = [
    "EPISODE_OVER",
    "EntropaceToolEnvironment",
    "env_tool_reward",
    "tool_env_dataset",
    "tool_environment",
    "tool_environments",
]

#: the tool message of a call made after the episode ended (the environment is not stepped)
EPISODE_OVER = "The episode has ended; no more tool calls are run."

_PY_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "object": dict,
}


def _annotation(schema: Mapping[str, Any]) -> Any:
    kind = schema.get("type")
    if kind == "array":
        items = schema.get("items")
        return list[_annotation(items)] if isinstance(items, Mapping) else list  # type: ignore[misc]
    if kind not in _PY_TYPES:
        raise ValueError(f"tool parameter type {kind!r} has no Python equivalent")
    return _PY_TYPES[kind]


def _tool_method(spec: ToolSpec) -> Any:
    """A method ``spec.name(self, <arguments>) -> str`` whose signature and Google-style
    docstring give ``transformers.utils.get_json_schema`` the tool's schema. It takes
    ``**arguments`` underneath, so missing or extra arguments reach entropace's checks (a
    ``bad_arguments`` tool error, as in entropace's own interface) instead of a TypeError."""
    props: dict[str, Any] = spec.parameters.get("properties", {})
    required = set(spec.parameters.get("required", []))

    def tool(self: EntropaceToolEnvironment, **arguments: Any) -> str:
        return self._call(spec.name, arguments)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    for name, schema in props.items():
        annotations[name] = _annotation(schema)
        default = inspect.Parameter.empty if name in required else None
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, annotation=annotations[name], default=default
            )
        )
    annotations["return"] = str
    tool.__name__ = tool.__qualname__ = spec.name
    tool.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    tool.__annotations__ = annotations
    args = "\n".join(f"    {n}: {s.get('description', n)}" for n, s in props.items())
    tool.__doc__ = (
        f"{spec.description}\n\nArgs:\n{args}\n\nReturns:\n"
        "    The result of the call (the environment's observation)."
    )
    return tool


class EntropaceToolEnvironment:
    """Base of the classes :func:`tool_environment` builds (see the module docstring).

    Class attributes (set per family): ``family``, ``options``, ``profile``, ``max_turns``,
    ``seed_column``. Public state (properties, so TRL does not take them for tools):
    :attr:`episode_reward`, :attr:`episode_success`, :attr:`episode_turns`,
    :attr:`episode_done`, :attr:`parse_errors`.
    """

    family: str = ""
    options: Mapping[str, Any] = {}
    profile: str = "default"
    max_turns: int | None = None
    seed_column: str = "seed"

    def __init__(self) -> None:
        self._env = make(
            self.family,
            interface="tools",
            profile=self.profile,
            max_turns=self.max_turns,
            **dict(self.options),
        )
        self._reset_counters()
        self._started = False

    def _reset_counters(self) -> None:
        self._reward = 0.0
        self._success = False
        self._turns = 0
        self._parse_errors = 0
        self._done = False

    def reset(self, **row: Any) -> str:
        """Reset with the row's seed (``row[seed_column]``); returns the first observation."""
        if self.seed_column not in row:
            raise ValueError(
                f"the {self.family} tool environment needs a {self.seed_column!r} column "
                "(entropace.integrations.trl.tool_env_dataset)"
            )
        observation, _info = self._env.reset(int(row[self.seed_column]))
        self._reset_counters()
        self._started = True
        return observation

    def _step(self, reply: str) -> str:
        if not self._started:
            raise RuntimeError(f"{self.family}: reset() must run before a tool call")
        if self._done:
            return EPISODE_OVER
        obs, reward, terminated, truncated, info = self._env.step(reply)
        self._reward += float(reward)
        self._success = self._success or bool(info.get("success", False))
        self._turns += 1
        self._parse_errors += int(bool(info.get("parse_error", False)))
        self._done = bool(terminated or truncated)
        if self._done:
            closer = getattr(self._env, "close", None)
            if callable(closer):
                closer()  # frees a db private copy, tears down an os persistent shell
        return obs

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        return self._step(format_tool_call(ToolCall(name, dict(arguments))))

    def _finish(self, reply: str) -> None:
        """Hand a final reply without a tool call to the environment (kg's final answer)."""
        if self._started and not self._done:
            self._step(reply)

    @property
    def episode_reward(self) -> float:
        return self._reward

    @property
    def episode_success(self) -> bool:
        return self._success

    @property
    def episode_turns(self) -> int:
        return self._turns

    @property
    def episode_done(self) -> bool:
        return self._done

    @property
    def parse_errors(self) -> int:
        return self._parse_errors


def tool_environment(
    family: str,
    *,
    options: Mapping[str, Any] | None = None,
    profile: str = "default",
    max_turns: int | None = None,
    seed_column: str = "seed",
) -> type[EntropaceToolEnvironment]:
    """The ``environment_factory`` class of ``family``: one method per tool of its suite.

    Raises:
        KeyError: the family has no tool interface. ``ValueError``: a tool name clashes with
        ``reset`` / ``get_reward`` or starts with an underscore (TRL would not expose it).
    """
    suite = tool_suite(family)
    namespace: dict[str, Any] = {
        "family": family,
        "options": dict(options or {}),
        "profile": profile,
        "max_turns": max_turns,
        "seed_column": seed_column,
        "__doc__": f"entropace's {family!r} environment through its tools, for TRL.",
    }
    for spec in suite.tools:
        if spec.name in ("reset", "get_reward") or spec.name.startswith("_"):
            raise ValueError(f"{family}: tool name {spec.name!r} cannot be a TRL tool method")
        if spec.name in namespace or hasattr(EntropaceToolEnvironment, spec.name):
            raise ValueError(f"{family}: tool name {spec.name!r} clashes with an attribute")
        namespace[spec.name] = _tool_method(spec)
    name = "".join(part.capitalize() for part in family.split("_")) + "ToolEnvironment"
    return type(name, (EntropaceToolEnvironment,), namespace)


def tool_environments(
    families: Iterable[str],
    *,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    **kwargs: Any,
) -> dict[str, type[EntropaceToolEnvironment]]:
    """``{family: class}`` for TRL's multi-environment ``environment_factory`` (each row's
    ``environment`` column selects one; :func:`tool_env_dataset` writes it)."""
    return {f: tool_environment(f, options=(options or {}).get(f), **kwargs) for f in families}


def tool_env_dataset(
    families: Iterable[str],
    instances_per_task: int,
    *,
    split: str = "train",
    offset: int = 0,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    profile: str = "default",
    max_turns: int | None = None,
) -> Any:
    """A ``datasets.Dataset`` for :func:`tool_environments`: ``prompt`` (the tools
    interface's system prompt and an empty user turn, which ``reset`` fills with the first
    observation), ``task`` and ``environment`` (the family), ``seed``."""
    import datasets

    rows = []
    for family in families:
        env = make(
            family,
            interface="tools",
            profile=profile,
            max_turns=max_turns,
            **dict((options or {}).get(family, {})),
        )
        prompt = [
            {"role": "system", "content": env.system_prompt},
            {"role": "user", "content": ""},
        ]
        for seed in seeds(split, instances_per_task, offset=offset):  # type: ignore[arg-type]
            rows.append({"prompt": prompt, "task": family, "environment": family, "seed": seed})
    return datasets.Dataset.from_list(rows)


def env_tool_reward(
    completions: list[Any], environments: list[EntropaceToolEnvironment] | None = None, **_: Any
) -> list[float | None]:
    """TRL reward function: each rollout's episode return, after its final reply.

    ``completions[i]`` is the rollout's message list; when its last assistant message has no
    tool call, its text goes to the environment first (kg's ``Final Answer: #N``). Rollouts
    whose environment is not an entropace tool environment get ``None`` (TRL ignores it).
    """
    if environments is None:
        raise ValueError(
            "env_tool_reward needs TRL's environment_factory (entropace.integrations.trl."
            "tool_environment / tool_environments)"
        )
    rewards: list[float | None] = []
    for completion, env in zip(completions, environments, strict=True):
        if not isinstance(env, EntropaceToolEnvironment):
            rewards.append(None)
            continue
        last = completion[-1] if isinstance(completion, list) and completion else None
        if isinstance(last, Mapping) and last.get("role") == "assistant":
            if not last.get("tool_calls"):
                content = last.get("content")
                env._finish(content if isinstance(content, str) else "")
        rewards.append(env.episode_reward)
    return rewards
