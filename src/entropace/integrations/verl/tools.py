"""entropace's tool interface as verl tools (``verl.tools.base_tool.BaseTool``, verl 0.9.1).

verl's multi-turn rollout (``ToolAgentLoop``, agent name ``tool_agent``) renders the tools of a
YAML config (``actor_rollout_ref.rollout.multi_turn.tool_config_path``) through the chat
template, parses the model's calls with its own parser (``multi_turn.format``, default
``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) and runs each call
through the tool's ``create -> execute -> release``. :class:`EntropaceTool` is one such tool:
one of a family's tools (``execute_sql``, ``bash_action``, ...; ``docs/envs/tools.md``),
backed by one entropace environment per trajectory, built as
``make(env, interface="tools", profile=..., max_turns=..., **options)`` and reset with the
row's seed (``tools_kwargs[<tool>]["create_kwargs"]["seed"]``). A call is handed to that
environment as the equivalent generic call text (``format_tool_call``), so observations,
argument checks, tool errors, rewards and the turn limit are exactly entropace's own
``interface="tools"`` path.

Lifecycles (both supported):

* direct (verl's ``BaseTool`` contract): ``create(create_kwargs=...)`` gives an instance id
  that owns one episode; every ``execute`` on it steps that episode; ``calc_reward`` is the
  episode return; ``release`` closes the environment (an ``os`` persistent shell is torn
  down).
* ``ToolAgentLoop`` 0.9.1 calls ``create`` / ``execute`` / ``release`` around *every* call and
  passes its per-trajectory ``agent_data`` to ``execute``. The episode is then keyed by that
  ``agent_data`` (through a weak reference, no attribute is added to it), shared by the
  family's tools, closed when it ends (terminated or truncated) and otherwise when the
  trajectory's ``agent_data`` is garbage-collected. Each call also writes the episode's
  ``entropace_reward``, ``entropace_success``, ``entropace_turns``, ``entropace_parse_errors``
  and ``entropace_done`` into ``agent_data.extra_fields``, which verl hands to the reward
  function as ``extra_info`` (:func:`compute_score` returns them).

:class:`EntropaceToolAgentLoop` (agent name ``entropace_tool_agent``) is ``ToolAgentLoop``
with the episode's end made explicit: it stops after the call that ends the episode (whose
observation is not appended), a final reply without a tool call goes to the environment (kg's ``Final Answer: #N`` is not a tool in AgentBench FC), ``reward_score`` is the
episode return (verl then skips its reward function), ``entropace_success`` is set for the
entropace trainer, and the environment is closed before the loop returns.

Files (:mod:`entropace.integrations.verl.tool_config`, re-exported here; it needs no verl):
:func:`write_tool_config` writes the YAML (``python -m entropace.integrations.verl.tool_config
--families db,os --out tools.yaml``); :func:`dataset_rows` the dataset rows (prompt = system
prompt + first observation, ``tools_kwargs`` and ``tool_selection`` per row).
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from pydantic import ConfigDict, PrivateAttr
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import (
    OpenAIFunctionParametersSchema,
    OpenAIFunctionPropertySchema,
    OpenAIFunctionSchema,
    OpenAIFunctionToolSchema,
    ToolResponse,
)

from entropace.envs import make
from entropace.envs.registry import tool_suite
from entropace.envs.tools import ToolCall, format_tool_call
from entropace.integrations.verl.tool_config import (
    AGENT_NAME,
    CLASS_NAME,
    dataset_rows,
    main,
    tool_config,
    write_tool_config,
)

__all__ = [
    "AGENT_NAME",
    "CLASS_NAME",
    "EntropaceTool",
    "EntropaceToolAgentLoop",
    "Episode",
    "compute_score",
    "dataset_rows",
    "main",
    "tool_config",
    "write_tool_config",
]

#: text of a call made after the episode ended (the environment is not stepped)
EPISODE_OVER = "The episode has ended; no more tool calls are run."


def _options(value: Any) -> dict[str, Any]:
    """Family options given as a mapping or as its JSON text (parquet cannot hold ``{}``)."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, Mapping):
        raise ValueError(f"entropace tool options must be a mapping, got {type(value).__name__}")
    return dict(value)


@dataclass
class Episode:
    """One entropace episode behind a trajectory's tool calls.

    Attributes:
        env: ``make(family, interface="tools", ...)`` after ``reset(seed)``; ``None`` once
            closed.
        reward: sum of the step rewards so far (the episode return).
        success / turns / parse_errors / tool_errors: as entropace's rollout counts them.
        done: the environment terminated or truncated.
    """

    family: str
    seed: int
    env: Any
    reward: float = 0.0
    success: bool = False
    turns: int = 0
    parse_errors: int = 0
    tool_errors: dict[str, int] = field(default_factory=dict)
    done: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @classmethod
    def start(cls, family: str, config: Mapping[str, Any], create: Mapping[str, Any]) -> Episode:
        """Build and reset the environment of ``family`` for the row's ``create_kwargs``."""
        if "seed" not in create:
            raise ValueError(
                f"entropace tool of family {family!r}: create_kwargs need a 'seed' "
                "(dataset rows: entropace.integrations.verl.tools.dataset_rows)"
            )
        if create.get("env", family) != family:
            raise ValueError(f"create_kwargs name env {create['env']!r}, the tool is {family!r}")
        options = {**_options(config.get("options")), **_options(create.get("options"))}
        max_turns = create.get("max_turns", config.get("max_turns"))
        env = make(
            family,
            interface="tools",
            profile=str(config.get("profile") or "default"),
            max_turns=None if max_turns is None else int(max_turns),
            **options,
        )
        env.reset(int(create["seed"]))
        return cls(family=family, seed=int(create["seed"]), env=env)

    def step(self, reply: str) -> tuple[str, float, dict[str, Any]]:
        """One environment step on ``reply`` (a call's generic text, or a reply without one)."""
        if self.done or self.env is None:
            return EPISODE_OVER, 0.0, {"episode_over": True}
        obs, reward, terminated, truncated, info = self.env.step(reply)
        self.reward += float(reward)
        self.success = self.success or bool(info.get("success", False))
        self.turns += 1
        self.parse_errors += int(bool(info.get("parse_error", False)))
        kind = info.get("tool_error")
        if kind:
            self.tool_errors[kind] = self.tool_errors.get(kind, 0) + 1
        self.done = bool(terminated or truncated)
        metrics = {
            "reward": float(reward),
            "success": bool(info.get("success", False)),
            "parse_error": bool(info.get("parse_error", False)),
            "tool_error": kind,
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "turn": self.turns,
        }
        if self.done:
            self.close()
        return obs, float(reward), metrics

    def fields(self) -> dict[str, Any]:
        """The episode's summary for ``agent_data.extra_fields`` (JSON scalars only)."""
        return {
            "entropace_env": self.family,
            "entropace_reward": self.reward,
            "entropace_success": float(self.success),
            "entropace_turns": self.turns,
            "entropace_parse_errors": self.parse_errors,
            "entropace_done": self.done,
        }

    def close(self) -> None:
        """Close the environment (frees a db private copy, tears down an os shell); idempotent."""
        env, self.env = self.env, None
        closer = getattr(env, "close", None) if env is not None else None
        if callable(closer):
            closer()


class _Property(OpenAIFunctionPropertySchema):
    model_config = ConfigDict(extra="allow")  # keeps "items" (db's answers: array of strings)


class _Parameters(OpenAIFunctionParametersSchema):
    model_config = ConfigDict(extra="allow")  # keeps "additionalProperties": false
    properties: dict[str, _Property]  # type: ignore[assignment]


class _Function(OpenAIFunctionSchema):
    parameters: _Parameters  # type: ignore[assignment]


class FullToolSchema(OpenAIFunctionToolSchema):
    """verl's tool schema that keeps the JSON-schema keys verl's models drop (``items``,
    ``additionalProperties``): ``model_dump`` returns the family's schema as entropace
    renders it (same keys, same order), so ``ToolAgentLoop`` puts the same tool text into
    the chat template as entropace's own rollout."""

    function: _Function  # type: ignore[assignment]
    _raw: dict[str, Any] = PrivateAttr(default_factory=dict)

    @classmethod
    def of(cls, schema: Mapping[str, Any]) -> FullToolSchema:
        out = cls.model_validate(schema)
        out._raw = json.loads(json.dumps(schema))
        return out

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        return json.loads(json.dumps(self._raw)) if self._raw else super().model_dump(**kwargs)


#: instance id -> (family, create_kwargs, the episode it owns once started)
_HANDLES: dict[str, tuple[str, dict[str, Any], Episode | None]] = {}
#: ToolAgentLoop's agent_data -> {family: episode} (weak: dropped with the trajectory)
_TRAJECTORIES: weakref.WeakKeyDictionary[Any, dict[str, Episode]] = weakref.WeakKeyDictionary()


async def _start(family: str, config: Mapping[str, Any], create: Mapping[str, Any]) -> Episode:
    """:meth:`Episode.start` off the event loop (an os reset starts a sandbox)."""
    return await asyncio.to_thread(Episode.start, family, config, create)


def _close_all(episodes: dict[str, Episode]) -> None:
    for episode in episodes.values():
        episode.close()


def trajectory_episodes(agent_data: Any) -> dict[str, Episode]:
    """The episodes (by family) of one ``ToolAgentLoop`` trajectory; closed when it is freed."""
    episodes = _TRAJECTORIES.get(agent_data)
    if episodes is None:
        episodes = {}
        _TRAJECTORIES[agent_data] = episodes
        weakref.finalize(agent_data, _close_all, episodes)
    return episodes


class EntropaceTool(BaseTool):
    """One tool of an entropace family (see the module docstring).

    ``config`` (the YAML entry's ``config``): ``type: native``, ``env`` (the family),
    optionally ``options`` (family options: mapping or JSON text), ``profile``
    (``default`` / ``agentbench``) and ``max_turns``. ``tool_schema``: the tool's schema as
    :func:`tool_config` writes it (``None``: taken from the family's suite by
    ``config["tool"]``).
    """

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None) -> None:
        if "env" not in config:
            raise ValueError("an entropace tool's config needs 'env' (the family name)")
        self.family = str(config["env"])
        by_name = tool_suite(self.family).by_name()
        name = tool_schema.function.name if tool_schema is not None else config.get("tool")
        if name not in by_name:
            raise ValueError(f"{self.family} has no tool {name!r}; its tools: {sorted(by_name)}")
        # the family's own schema (verl's validation of the YAML drops "items" and
        # "additionalProperties")
        super().__init__(config, FullToolSchema.of(by_name[name].schema()))

    async def create(
        self, instance_id: str | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        """A new instance id for the row's ``create_kwargs`` (``seed``, optional ``options``,
        ``max_turns``); the environment is built at the first ``execute``."""
        instance_id = instance_id or str(uuid4())
        _HANDLES[instance_id] = (self.family, dict(kwargs.get("create_kwargs") or {}), None)
        return instance_id, ToolResponse()

    async def _episode(self, instance_id: str, agent_data: Any) -> Episode:
        if instance_id not in _HANDLES:
            raise KeyError(f"unknown entropace tool instance {instance_id!r}: call create() first")
        family, create, owned = _HANDLES[instance_id]
        if agent_data is not None:  # ToolAgentLoop: the trajectory owns the episode
            episodes = trajectory_episodes(agent_data)
            if family not in episodes:
                episode = await _start(family, self.config, create)
                if episodes.setdefault(family, episode) is not episode:
                    episode.close()  # a concurrent call of the same trajectory started it first
            return episodes[family]
        if owned is None:
            owned = await _start(family, self.config, create)
            _HANDLES[instance_id] = (family, create, owned)
        return owned

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        """Run the call on the episode: ``(tool message, step reward, metrics)``."""
        agent_data = kwargs.get("agent_data")
        episode = await self._episode(instance_id, agent_data)
        reply = format_tool_call(ToolCall(self.name, dict(parameters)))
        async with episode.lock:  # one step at a time per episode, off the event loop
            obs, reward, metrics = await asyncio.to_thread(episode.step, reply)
        if agent_data is not None and isinstance(getattr(agent_data, "extra_fields", None), dict):
            agent_data.extra_fields.update(episode.fields())
        return ToolResponse(text=obs), reward, metrics

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The episode return so far (sum of the environment's rewards)."""
        return (await self._episode(instance_id, kwargs.get("agent_data"))).reward

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Forget the instance; an episode it owns (direct lifecycle) is closed."""
        _family, _create, owned = _HANDLES.pop(instance_id, ("", {}, None))
        if owned is not None:
            owned.close()


@register(AGENT_NAME)
class EntropaceToolAgentLoop(ToolAgentLoop):
    """verl's ``ToolAgentLoop`` plus the episode's end (see the module docstring)."""

    async def _handle_pending_state(self, agent_data: AgentData, sampling_params: dict) -> Any:
        self._entropace_data = agent_data
        self._entropace_final: str | None = None
        return await super()._handle_pending_state(agent_data, sampling_params)

    async def _handle_generating_state(
        self, agent_data: AgentData, sampling_params: dict, ignore_termination: bool = False
    ) -> Any:
        before = len(agent_data.messages)
        state = await super()._handle_generating_state(
            agent_data, sampling_params, ignore_termination
        )
        if state == AgentState.TERMINATED and len(agent_data.messages) > before:
            # a complete reply without tool calls (not one cut by the budget or turn limits)
            self._entropace_final = self.tokenizer.decode(
                agent_data.response_ids, skip_special_tokens=True
            )
        return state

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> Any:
        saved = (
            list(agent_data.prompt_ids),
            list(agent_data.response_mask),
            list(agent_data.response_logprobs),
            len(agent_data.messages),
            agent_data.user_turns,
        )
        state = await super()._handle_processing_tools_state(agent_data)
        episodes = trajectory_episodes(agent_data)
        if episodes and all(e.done for e in episodes.values()):
            # the episode ended on this call: stop here, after the policy's last tokens
            # (as the ``entropace`` agent loop does; the final observation carries no loss)
            agent_data.prompt_ids, agent_data.response_mask = saved[0], saved[1]
            agent_data.response_logprobs = saved[2]
            del agent_data.messages[saved[3] :]
            agent_data.user_turns = saved[4]
            return AgentState.TERMINATED
        return state

    def _family_tool(self, kwargs: Mapping[str, Any]) -> tuple[EntropaceTool, dict] | None:
        tools_kwargs = kwargs.get("tools_kwargs") or {}
        for name, tool in self.tools.items():
            # a parquet file of several families holds every family's tool names, None for
            # the other families' tools
            entry = tools_kwargs.get(name)
            if isinstance(tool, EntropaceTool) and isinstance(entry, Mapping):
                if isinstance(entry.get("create_kwargs"), Mapping):
                    return tool, dict(entry["create_kwargs"])
        return None

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        output = await super().run(sampling_params, **kwargs)
        data = self._entropace_data
        episodes = trajectory_episodes(data)
        found = self._family_tool(kwargs)
        if not episodes and found is not None and self._entropace_final is not None:
            tool, create = found  # the first reply had no call: the episode still starts
            episodes[tool.family] = await _start(tool.family, tool.config, create)
        for episode in episodes.values():
            if self._entropace_final is not None and not episode.done:
                async with episode.lock:
                    await asyncio.to_thread(episode.step, self._entropace_final)
            episode.close()
        if episodes:
            total = sum(e.reward for e in episodes.values())
            output.reward_score = total
            fields = next(iter(episodes.values())).fields()
            fields["entropace_reward"] = total
            fields["entropace_success"] = float(any(e.success for e in episodes.values()))
            output.extra_fields.update(fields)
            output.extra_fields["reward_extra_info"] = {
                "success": fields["entropace_success"],
                "turns": float(sum(e.turns for e in episodes.values())),
            }
        return output


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """verl reward function (``reward.custom_reward_function.path/name``) for the stock
    ``tool_agent`` loop: the episode return the tools recorded (0 if no tool was called).

    ``extra_info`` carries the trajectory's ``extra_fields`` (verl's reward managers merge
    ``tool_extra_fields`` into it); a reply without a call that ends the loop is not seen
    by the environment here (use the ``entropace_tool_agent`` loop for kg's final answer).
    """
    info = extra_info or {}
    return {
        "score": float(info.get("entropace_reward") or 0.0),
        "success": float(info.get("entropace_success") or 0.0),
    }


if __name__ == "__main__":
    raise SystemExit(main())
