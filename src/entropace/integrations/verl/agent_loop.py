"""entropace's environment families as a verl agent loop: ``@register("entropace")``.

A dataset row names its family and instance (see :func:`dataset_rows`)::

    {"data_source": "db", "agent_name": "entropace",
     "prompt": [{"role": "system", ...}, {"role": "user", <first observation>}],
     "extra_info": {"entropace": {"env": "db", "seed": 17,
                                  "options": '{"difficulty": "easy"}', "max_turns": null}}}

(``options``: a mapping, or its JSON text as :func:`dataset_rows` writes it, since parquet
cannot store an empty struct).

and verl's agent-loop worker calls :meth:`EntropaceAgentLoop.run` with the row's fields. The
loop builds ``entropace.envs.make(env, max_turns=..., **options)``, resets it with ``seed``,
and plays the episode with verl's own LLM servers (``server_manager.generate``), building the
token stream with verl's Continuous Token builder (no re-tokenisation of what was sampled):

    prompt_ids:    [system + first observation + assistant header]
    response_ids:  [turn 1 tokens][observation 1 as a user turn][turn 2 tokens] ...
    response_mask: [1 ... 1      ][0 ...                  0    ][1 ... 1     ] ...

so observations (and template tokens) never carry loss. The episode ends when the environment
terminates or truncates (its turn limit), or when the response budget
(``actor_rollout_ref.rollout.response_length``) is spent. ``reward_score`` is the sum of the
environment's rewards (verl then skips its reward function); ``extra_fields`` carries
``entropace_success`` (read by the entropace trainer for the success signal), the turn count
and why the episode ended.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)
from verl.utils.profiler import simple_timer

from entropace.envs import make, seeds
from entropace.integrations.verl.tool_config import instance_rows

__all__ = [
    "AGENT_NAME",
    "EntropaceAgentLoop",
    "dataset_rows",
    "episode_spec",
    "register_agent_loop",
]

logger = logging.getLogger(__name__)

AGENT_NAME = "entropace"


def episode_spec(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The ``{"env", "seed", "options", "max_turns"}`` of a dataset row (its ``extra_info``).

    Raises:
        ValueError: the row has no ``extra_info.entropace`` with ``env`` and ``seed``.
    """
    extra = kwargs.get("extra_info") or {}
    spec = extra.get("entropace") if isinstance(extra, Mapping) else None
    if not isinstance(spec, Mapping) or "env" not in spec or "seed" not in spec:
        raise ValueError(
            "an 'entropace' agent-loop row needs extra_info={'entropace': {'env': <family>, "
            "'seed': <int>, 'options': {...}}} (see entropace.integrations.verl.agent_loop."
            "dataset_rows)"
        )
    options = spec.get("options") or {}
    if isinstance(options, str):  # stored as JSON text (parquet cannot hold empty structs)
        options = json.loads(options) if options else {}
    return {
        "env": str(spec["env"]),
        "seed": int(spec["seed"]),
        "options": dict(options),
        "max_turns": None if spec.get("max_turns") is None else int(spec["max_turns"]),
    }


@register(AGENT_NAME)
class EntropaceAgentLoop(AgentLoopBase):
    """Multi-turn episodes of an entropace environment (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("tools", None)  # verl passes its tool list; our environments bring their own
        super().__init__(*args, **kwargs)
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Play one episode; returns verl's :class:`AgentLoopOutput` (ids, masks, reward)."""
        spec = episode_spec(kwargs)
        env = make(spec["env"], max_turns=spec["max_turns"], **spec["options"])
        observation, _info = env.reset(spec["seed"])
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": env.system_prompt},
            {"role": "user", "content": observation},
        ]
        metrics: dict[str, Any] = {}
        ids = await self.ct_build_initial_tokens(messages)
        prompt_len = len(ids)
        mask: list[int] = []
        logprobs: list[float] | None = None
        request_id = uuid4().hex
        reward, success, turns, observations, end = 0.0, False, 0, 0, "length"
        while len(mask) < self.response_length:
            with simple_timer("generate_sequences", metrics):
                out = await self.server_manager.generate(
                    request_id=request_id, prompt_ids=ids, sampling_params=sampling_params
                )
            budget = self.response_length - len(mask)
            new = list(out.token_ids)[:budget]
            new_lp = list(out.log_probs)[:budget] if out.log_probs else None
            if new_lp is not None and logprobs is None:
                logprobs = [0.0] * len(mask)
            merged, mask, logprobs = await self.ct_merge_assistant_token(
                ids, new, mask, logprobs, assistant_logprobs=new_lp
            )
            ids = merged.token_ids
            turns += 1
            if len(new) < len(out.token_ids):
                end = "length"  # cut by the response budget: do not act on half a turn
                break
            action = self.tokenizer.decode(new, skip_special_tokens=True)
            with simple_timer("tool_calls", metrics):
                observation, r, terminated, truncated, info = env.step(action)
            reward += float(r)
            success = success or bool(info.get("success", False))
            if terminated or truncated:
                end = "terminated" if terminated else "truncated"
                break
            previous = [*messages, {"role": "assistant", "content": action}]
            messages = [*previous, {"role": "user", "content": observation}]
            merged, ctx_mask, ctx_lp = await self.ct_merge_context_msg(
                previous, messages, ids, mask, logprobs
            )
            if len(ctx_mask) >= self.response_length:
                end = "length"  # no room to act on this observation
                break
            ids, mask, logprobs = merged.token_ids, ctx_mask, ctx_lp
            observations += 1
        response_ids = ids[prompt_len:][: self.response_length]
        mask = mask[: self.response_length]
        extra = {
            "entropace_success": float(success),
            "entropace_turns": turns,
            "entropace_end": end,
            "reward_extra_info": {"success": float(success), "turns": float(turns)},
        }
        if metrics.get("num_preempted") is None:
            metrics["num_preempted"] = -1
        return AgentLoopOutput(
            prompt_ids=ids[:prompt_len],
            response_ids=response_ids,
            response_mask=mask,
            response_logprobs=logprobs[: self.response_length] if logprobs else None,
            reward_score=reward,
            num_turns=turns + observations + 1,  # verl's count: assistant + user turns + 1
            metrics=AgentLoopMetrics(**metrics),
            extra_fields=extra,
        )


def register_agent_loop() -> list[str]:
    """The loop registers itself on import (``@register``); this returns its name."""
    return [AGENT_NAME]


def dataset_rows(
    families: Iterable[str],
    n: int,
    *,
    split: str = "train",
    offset: int = 0,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    max_turns: int | None = None,
) -> list[dict[str, Any]]:
    """verl dataset rows (one per instance) for the ``entropace`` agent loop.

    Args:
        families: environment families, e.g. ``["db", "kg", "os", "household", "shop"]``.
        n: instances per family (seeds ``entropace.envs.seeds(split, n, offset=offset)``).
        split: ``train`` or ``test`` (disjoint seed ranges).
        options: per-family options for ``entropace.envs.make`` (e.g. difficulty).
        max_turns: turn limit override (None: the family's).

    Returns:
        rows with ``data_source`` (the family: the entropace trainer's task key),
        ``agent_name``, ``prompt`` (the first turn, so verl's length filter sees it),
        ``reward_model`` and ``extra_info.entropace``.
    """
    rows = []
    for family in families:
        opts = dict((options or {}).get(family, {}))
        env = make(family, max_turns=max_turns, **opts)
        rows += instance_rows(
            family, env, seeds(split, n, offset=offset), agent_name=AGENT_NAME, split=split,
            extra_info=lambda seed, fam=family, opts=opts: {
                "entropace": {
                    "env": fam,
                    "seed": seed,
                    "options": json.dumps(opts, sort_keys=True),
                    "max_turns": max_turns,
                },
            },
        )  # fmt: skip
    return rows
