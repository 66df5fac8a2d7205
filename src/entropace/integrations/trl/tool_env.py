"""entropace's tool interface through TRL's own tool loop (``GRPOTrainer(environment_factory=...)``).

TRL 1.16's ``GRPOTrainer`` runs multi-turn tool calling itself when given an
``environment_factory``: one environment instance per rollout, whose public methods are the
tools (their schemas come from the methods' signatures and docstrings, transformers'
``get_json_schema``), whose ``reset(**row)`` returns text appended to the prompt, and whose
tool results go back to the model as ``tool`` messages through the model's chat template.
:func:`environment_factory` builds such a class for one entropace family: its methods are the
family's tools (``execute_sql(query)``, ``bash_action(script)``, ...; ``docs/envs/tools.md``)
and every call is applied to ``make(family, interface="tools", **options)`` exactly as the
entropace rollout applies it (the call is handed over as its generic ``<tool_call>`` text), so
argument checks, tool errors, observations and the turn limit are entropace's.

    from trl import GRPOConfig
    from entropace.integrations.trl.tool_env import env_tool_reward, environment_factory, tool_dataset

    trainer = GRPOTrainer(model, reward_funcs=[env_tool_reward],
                          environment_factory=environment_factory("db", profile="agentbench"),
                          train_dataset=tool_dataset("db", 64), args=GRPOConfig(...))

The reward is :func:`env_tool_reward` (a reward function, not ``get_reward``): TRL's loop ends a
rollout when a reply has no tool call, and that last reply can still end the episode (kg's
``Final Answer: #N``, which AgentBench FC does not make a tool), so the reward function hands the
rollout's last assistant text to the environment first. An episode that did not terminate
(turn limit, no final action) scores ``abnormal_penalty`` (default 0.0, AgentBench FC's).
TRL's own loop renders and parses the calls (the model's template must support tools), not
entropace's rollout; use :func:`entropace.integrations.trl.env_rollout_func` for entropace's
rollout, statistics and loss mask.
"""

from __future__ import annotations

import inspect
from typing import Any

from entropace.envs import make
from entropace.envs.tools import ToolCall, format_tool_call

__all__ = ["env_tool_reward", "environment_factory", "tool_dataset"]

_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "object": dict,
}


def _annotation(schema: dict[str, Any]) -> Any:
    if schema.get("type") == "array":
        item = _annotation(schema.get("items", {"type": "string"}))
        return list[item]  # type: ignore[valid-type]
    return _TYPES.get(str(schema.get("type")), str)


def _tool_method(name: str, description: str, parameters: dict[str, Any]) -> Any:
    """A method ``name(self, **arguments) -> str`` with the tool's signature and a Google-style
    docstring, so that transformers' ``get_json_schema`` reproduces the tool's schema."""
    props: dict[str, Any] = parameters.get("properties", {})

    def call(self: Any, **arguments: Any) -> str:
        return self._call(name, arguments)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [
        inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, annotation=_annotation(v))
        for k, v in props.items()
    ]
    call.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    call.__annotations__ = {k: _annotation(v) for k, v in props.items()} | {"return": str}
    call.__name__ = call.__qualname__ = name
    args = "\n".join(f"    {k}: {v.get('description', k)}" for k, v in props.items())
    call.__doc__ = f"{description}\n\nArgs:\n{args}\n\nReturns:\n    What the environment shows."
    return call


class _ToolEnvironment:
    """Base of the classes :func:`environment_factory` builds (one episode per ``reset``)."""

    family: str = ""
    options: dict[str, Any] = {}
    seed_column: str = "seed"
    abnormal_penalty: float = 0.0

    def __init__(self) -> None:
        self._env: Any = None
        self._reward = 0.0
        self._terminated = False
        self._done = False
        self._success = False

    def reset(self, **row: Any) -> str:
        """Start the row's instance (``row[seed_column]``); returns its first observation."""
        self._close()
        if self.seed_column not in row:
            raise KeyError(
                f"{self.family} tool environment: each dataset row needs a {self.seed_column!r} "
                f"column (see tool_dataset); got {sorted(row)}"
            )
        self._env = make(self.family, interface="tools", **self.options)
        observation, _info = self._env.reset(int(row[self.seed_column]))
        self._reward, self._terminated, self._done, self._success = 0.0, False, False, False
        return str(observation)

    def _step(self, reply: str) -> str:
        if self._env is None:
            return "The environment has not been reset."
        if self._done:
            return "The episode is over."
        observation, reward, terminated, truncated, info = self._env.step(reply)
        self._reward += float(reward)
        self._success = self._success or bool(info.get("success", False))
        self._terminated = bool(terminated)
        self._done = bool(terminated or truncated)
        if self._done:
            self._close()
        return str(observation)

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        return self._step(format_tool_call(ToolCall(name, dict(arguments))))

    def _finish(self, final_text: str) -> float:
        """The episode's reward after its last (tool-call-free) reply ``final_text``."""
        if not self._done and final_text:
            self._step(final_text)
        return self._reward if self._terminated else float(self.abnormal_penalty)

    def _close(self) -> None:
        close = getattr(self._env, "close", None)
        if callable(close):
            close()


def environment_factory(
    family: str,
    *,
    seed_column: str = "seed",
    abnormal_penalty: float = 0.0,
    **options: Any,
) -> type:
    """A TRL ``environment_factory`` (a class) for ``family``'s tools.

    Args:
        family: an entropace family with a tool interface (``db``, ``os``, ``kg``, ...).
        seed_column: the dataset column holding each row's instance seed.
        abnormal_penalty: the reward of an episode that did not terminate.
        options: passed to ``entropace.envs.make`` (``profile="agentbench"``, ``difficulty``,
            family options, ``max_turns``).
    """
    probe = make(family, interface="tools", **options)
    methods = {
        t["function"]["name"]: _tool_method(
            t["function"]["name"], t["function"]["description"], t["function"]["parameters"]
        )
        for t in probe.tools
    }
    close = getattr(probe, "close", None)
    if callable(close):
        close()
    attrs: dict[str, Any] = {
        "family": family,
        "options": dict(options),
        "seed_column": seed_column,
        "abnormal_penalty": float(abnormal_penalty),
        "system_prompt": probe.system_prompt,
        **methods,
    }
    return type(f"Entropace{family.capitalize()}Tools", (_ToolEnvironment,), attrs)


def _last_assistant_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    for message in reversed(list(completion or [])):
        if isinstance(message, dict) and message.get("role") == "assistant":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


def env_tool_reward(
    completions: list[Any], environments: list[Any] | None = None, **_: Any
) -> list[float]:
    """TRL reward function: each rollout's episode reward (its last reply goes to its
    environment first; see the module docstring)."""
    if environments is None:
        raise ValueError(
            "env_tool_reward reads the rollouts' environments; pass environment_factory="
            "environment_factory(family, ...) to GRPOTrainer"
        )
    return [
        env._finish(_last_assistant_text(c)) if isinstance(env, _ToolEnvironment) else 0.0
        for c, env in zip(completions, environments, strict=True)
    ]


def tool_dataset(family: str, n: int, *, first_seed: int = 0, **options: Any) -> Any:
    """A ``datasets.Dataset`` of ``n`` instances of ``family`` for :func:`environment_factory`:
    ``prompt`` (the tools interface's system prompt and an empty user turn, which TRL fills
    with ``reset``'s first observation) and ``seed``."""
    import datasets

    system = make(family, interface="tools", **options).system_prompt
    rows = [
        {
            "prompt": [{"role": "system", "content": system}, {"role": "user", "content": ""}],
            "seed": first_seed + i,
        }
        for i in range(n)
    ]
    return datasets.Dataset.from_list(rows)
