"""The multi-turn rollout engine: many episodes advance together, one ``generate`` per turn.

Top to bottom, :func:`collect_rollouts`:

1. resets every request's environment and tokenises its first prompt (system prompt, first
   observation, assistant header) with the chat template;
2. loops over turns: ONE batched generation over every live episode, then each environment
   steps on its episode's text; episodes that end drop out, so the batch shrinks. With
   ``rollout.share_prefix`` the episodes of a group prefill their common first prompt once;
   with ``rollout.reuse_kv`` every live episode keeps its key/value cache between turns and a
   turn prefills only the new tokens (``rollout/kvcache.py``); ``generate`` sees the same ids
   and attention mask either way;
3. appends to each episode's token list the generated tokens exactly as sampled (loss mask 1)
   and the template tokens of the next observation (loss mask 0), so the trajectory is
   tokenised once and training sees the sampled tokens;
4. scores each episode (sum of step rewards, or ``abnormal_penalty`` for abnormal ends);
5. right-pads the trajectories and runs ONE no-grad forward per micro-batch of the sampling
   policy for ``old_logprobs``, ``entropy`` and ``sensitivity`` at the sampling temperature.

Cross-policy sampling (``policies``, AgentRL; :mod:`entropace.rollout.cross_policy`): a pool
``[model, *policies]`` and a per-turn chooser; each turn's live episodes are grouped by the
policy drawn for them and each group generates with its own model (an episode's key/value
cache is dropped when the next turn's policy differs: caches are per model). Step 5 then runs
each pool member over the rows it acted in, and every generated token gets the statistics of
the policy that sampled it (``RolloutBatch.behaviour_policy`` records which).
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from entropace.envs.base import TurnLimit
from entropace.rollout.batch import EpisodeRecord, RolloutBatch, info_scores
from entropace.rollout.chat import ChatLayout, Message, Tools, observation_message
from entropace.rollout.config import RolloutConfig
from entropace.rollout.cross_policy import TurnChooser, check_pool, pool_statistics
from entropace.rollout.gen_stats import GenerationRecorder, assemble_generation_stats
from entropace.rollout.generate import OOM_HINT, generate_turn, is_oom
from entropace.rollout.kvcache import (
    PrefixKV,
    batch_cache,
    batch_layout,
    kept_prefixes,
    kv_reuse_support,
    prefill_prefixes,
)
from entropace.rollout.stats import sequence_token_stats
from entropace.rollout.types import END_REASONS, RolloutRequest, RolloutResult


@dataclass
class _Episode:
    """Mutable state of one episode while it is sampled."""

    request: RolloutRequest
    env: Any
    max_turns: int
    ids: list[int]
    loss_mask: list[int]
    messages: list[Message]
    index: int = 0  # position in the request list (the cross-policy draw's key)
    policy: list[int] = field(default_factory=list)  # per token: pool index of its sampler, -1
    acting: int = 0  # pool index of the policy generating the current turn
    kv_policy: int = 0  # pool index of the model whose keys/values ``kv`` holds
    reward: float = 0.0
    success: bool = False
    turns: int = 0
    generated: int = 0
    end_reason: str | None = None
    last_stop_text: str | None = None
    kv: PrefixKV | None = None  # keys/values of ids[:kv.length] (fast path only)
    tools: Tools | None = None  # the env's tool schemas (interface="tools"), rendered each turn
    parse_errors: int = 0  # steps whose info has parse_error (tool errors included)
    tool_errors: int = 0  # steps whose info names a tool_error (interface="tools")
    scores: dict[str, float] = field(default_factory=dict)  # last info_scores of the episode
    # rollout.stats_from_generation: [n, 4] statistics of each kept turn, and of the last call
    gen_stats: list[torch.Tensor] = field(default_factory=list)
    pending_stats: torch.Tensor | None = None

    @property
    def done(self) -> bool:
        return self.end_reason is not None


def _as_request(item: RolloutRequest | Sequence[Any]) -> RolloutRequest:
    if isinstance(item, RolloutRequest):
        return item
    if isinstance(item, tuple | list) and len(item) == 4:
        return RolloutRequest(task=item[0], env=item[1], seed=int(item[2]), group_id=int(item[3]))
    raise TypeError(
        "each request must be a RolloutRequest or a (task, env_or_factory, seed, group_id) "
        f"tuple, got {item!r}"
    )


def _build_env(request: RolloutRequest) -> Any:
    env = request.env
    if isinstance(env, type) or (callable(env) and not hasattr(env, "reset")):
        env = env()  # a factory (a class counts as one)
    if not (hasattr(env, "reset") and hasattr(env, "step")):
        raise TypeError(
            f"request {request.task!r} seed {request.seed}: env must be a TextEnv or a "
            f"factory returning one, got {type(env).__name__}"
        )
    return env


def _check_step_result(result: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
    """Validate what ``env.step`` returned; raise ``TypeError``/``ValueError`` if malformed."""
    if not isinstance(result, tuple) or len(result) != 5:
        raise TypeError(f"step() must return a 5-tuple, got {type(result).__name__}")
    obs, reward, terminated, truncated, info = result
    if not isinstance(obs, str):
        raise TypeError(f"step() observation must be str, got {type(obs).__name__}")
    if not isinstance(info, dict):
        raise TypeError(f"step() info must be a dict, got {type(info).__name__}")
    reward = float(reward)
    if not math.isfinite(reward):
        raise ValueError(f"step() reward must be finite, got {reward}")
    return obs, reward, bool(terminated), bool(truncated), info


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seed torch's RNG for the block and restore the caller's RNG state afterwards."""
    if seed is None:
        yield
        return
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def _eval_mode(model: Any) -> Iterator[None]:
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


class _Engine:
    """Turn loop over a list of episodes (internal; use :func:`collect_rollouts`)."""

    def __init__(
        self,
        models: Sequence[Any],
        tokenizer: Any,
        cfg: RolloutConfig,
        chooser: Callable[[int, int], int] | None = None,
    ) -> None:
        self.models = list(models)
        self.model = model = self.models[0]
        self.chooser = chooser
        self.cfg = cfg
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        extra = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        self.chat = ChatLayout(tokenizer, extra)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else tokenizer.eos_token_id)
        self.timings = {"generation_s": 0.0, "env_s": 0.0}
        self.batch_sizes: list[int] = []
        #: token positions prefilled for generation (padding included) and served from caches
        self.kv_counts = {"prefill_tokens": 0, "cached_tokens": 0}
        self.share_prefix = cfg.share_prefix
        self.reuse_kv = cfg.reuse_kv
        if self.share_prefix or self.reuse_kv:
            reason = kv_reuse_support(model)
            if reason is not None:
                warnings.warn(
                    f"rollout.share_prefix / rollout.reuse_kv are off for this model: {reason}; "
                    "every turn re-encodes the whole history",
                    RuntimeWarning,
                    stacklevel=3,
                )
                self.share_prefix = self.reuse_kv = False

    # -- episode life cycle ------------------------------------------------------------------

    def start(self, request: RolloutRequest, index: int = 0) -> _Episode:
        env = _build_env(request)
        env_turns = getattr(env, "max_turns", None)
        if self.cfg.max_turns is None and env_turns is None:
            raise ValueError(
                f"environment {request.task!r} has no max_turns attribute; set rollout.max_turns"
            )
        max_turns = int(self.cfg.max_turns or env_turns)
        if isinstance(env, TurnLimit):
            env.max_turns = max_turns
        t0 = time.perf_counter()
        try:
            obs, _info = env.reset(request.seed)
        except Exception as exc:
            raise RuntimeError(
                f"environment {request.task!r} failed to reset with seed {request.seed}: {exc!r}"
            ) from exc
        self.timings["env_s"] += time.perf_counter() - t0
        if not isinstance(obs, str):
            raise TypeError(
                f"environment {request.task!r}: reset() observation must be str, "
                f"got {type(obs).__name__}"
            )
        system = str(getattr(env, "system_prompt", ""))
        tools = getattr(env, "tools", None)
        tools = list(tools) if isinstance(tools, list | tuple) and tools else None
        ids = self.chat.prompt_ids(system, obs, tools=tools)
        episode = _Episode(
            request=request,
            env=env,
            max_turns=max_turns,
            ids=ids,
            loss_mask=[0] * len(ids),
            messages=[{"role": "system", "content": system}, {"role": "user", "content": obs}],
            tools=tools,
            index=index,
            policy=[-1] * len(ids),
        )
        if len(ids) >= self.cfg.max_episode_tokens:
            warnings.warn(
                f"{request.task!r} seed {request.seed}: the first prompt has {len(ids)} tokens, "
                f"not below rollout.max_episode_tokens={self.cfg.max_episode_tokens}; the "
                "episode ends before the first turn",
                stacklevel=3,
            )
            episode.end_reason = "length"
        return episode

    def budget(self, ep: _Episode) -> int:
        return min(self.cfg.max_new_tokens_per_turn, self.cfg.max_episode_tokens - len(ep.ids))

    def share_prompts(self, episodes: list[_Episode]) -> None:
        """Prefill each distinct first prompt once (all but its last token, which ``generate``
        runs to get the first logits); every episode with that prompt gets a view of it."""
        t0 = time.perf_counter()
        distinct: dict[tuple[int, ...], list[_Episode]] = {}
        for ep in episodes:
            if len(ep.ids) > 1:
                distinct.setdefault(tuple(ep.ids), []).append(ep)
        prompts = list(distinct)
        try:
            kvs, positions = prefill_prefixes(
                self.model,
                [p[:-1] for p in prompts],
                pad_id=self.pad_id,
                max_batch=self.cfg.generation_batch_size or 16,
            )
        except Exception as exc:
            if is_oom(exc):
                raise RuntimeError(
                    OOM_HINT.format(what=f"prefilling {len(prompts)} shared prompts")
                ) from exc
            raise
        self.kv_counts["prefill_tokens"] += positions
        for prompt, kv in zip(prompts, kvs, strict=True):
            for ep in distinct[prompt]:
                ep.kv = kv
        self.timings["generation_s"] += time.perf_counter() - t0

    def generate_chunk(self, chunk: list[_Episode], model: Any) -> list[list[int]]:
        """One ``generate`` of ``model`` over ``chunk``; with cached prefixes only the uncached
        columns are prefilled (layout in ``rollout/kvcache.py``), and with ``reuse_kv`` every
        episode keeps the cache of the tokens it will keep."""
        lengths = [len(ep.ids) for ep in chunk]
        width = max(lengths)
        cached = [ep.kv.length if ep.kv is not None else 0 for ep in chunk]
        use_cache = self.reuse_kv or any(c > 0 for c in cached)
        budgets = [self.budget(ep) for ep in chunk]
        cache = None
        static = self.cfg.cache == "static"
        device = next(model.parameters()).device
        cursor = torch.zeros(1, dtype=torch.long, device=device) if static else None
        if use_cache:
            uncached, keep = batch_layout(lengths, cached)
            reserve = uncached + max(budgets)  # what generate appends, at most
            try:
                cache = batch_cache(
                    [ep.kv for ep in chunk], keep, width - uncached, reserve, cursor
                )
            except Exception as exc:
                if is_oom(exc):
                    what = f"building the key/value cache of {len(chunk)} episodes"
                    raise RuntimeError(OOM_HINT.format(what=what)) from exc
                raise
            self.kv_counts["cached_tokens"] += sum(keep)
            self.kv_counts["prefill_tokens"] += len(chunk) * uncached
        else:
            self.kv_counts["prefill_tokens"] += len(chunk) * width
        for ep in chunk:
            ep.kv = None  # the batch cache holds what is needed; free the old views
        recorder = (
            GenerationRecorder(self.cfg.temperature) if self.cfg.stats_from_generation else None
        )
        new = generate_turn(
            model,
            [ep.ids for ep in chunk],
            max_new_tokens=max(budgets),
            temperature=self.cfg.temperature,
            top_p=self.cfg.top_p,
            do_sample=self.cfg.do_sample,
            stop_ids=sorted(self.chat.stop_ids),
            pad_id=self.pad_id,
            cache=cache,
            recorder=recorder,
            cursor=cursor,
            static=static,
            cuda_graph=self.cfg.cuda_graph,
        )
        if recorder is not None:
            for ep, stats in zip(chunk, recorder.rows(new), strict=True):
                ep.pending_stats = stats
        if self.reuse_kv and cache is not None:
            kept = [min(len(g), b) for g, b in zip(new, budgets, strict=True)]  # as advance()
            for ep, kv in zip(chunk, kept_prefixes(cache, lengths, kept), strict=True):
                ep.kv = kv
        return new

    def generate(self, live: list[_Episode]) -> list[list[int]]:
        """One batched generate over ``live`` (split by ``generation_batch_size`` if set);
        with a policy pool, one per pool member drawn this turn, in pool order."""
        for ep in live:
            ep.acting = self.chooser(ep.index, ep.turns) if self.chooser is not None else 0
            if ep.kv is not None and ep.kv_policy != ep.acting:
                ep.kv = None  # another model's keys/values: this turn re-encodes the history
        out: dict[int, list[int]] = {}
        t0 = time.perf_counter()
        for p in sorted({ep.acting for ep in live}):
            group = [ep for ep in live if ep.acting == p]
            step = self.cfg.generation_batch_size or len(group)
            for start in range(0, len(group), step):
                chunk = group[start : start + step]
                self.batch_sizes.append(len(chunk))
                for ep, new in zip(chunk, self.generate_chunk(chunk, self.models[p]), strict=True):
                    out[id(ep)] = new
                    ep.kv_policy = p
        self.timings["generation_s"] += time.perf_counter() - t0
        return [out[id(ep)] for ep in live]

    def advance(self, ep: _Episode, new: list[int]) -> None:
        """Append one generated turn to ``ep``, step its environment, append the observation."""
        new = new[: self.budget(ep)]
        if ep.pending_stats is not None:
            ep.gen_stats.append(ep.pending_stats[: len(new)])
            ep.pending_stats = None
        stopped = bool(new) and new[-1] in self.chat.stop_ids
        ep.ids += new
        ep.loss_mask += [1] * len(new)
        ep.policy += [ep.acting] * len(new)
        ep.generated += len(new)
        ep.turns += 1
        text = self.chat.decode(new[:-1] if stopped else new)
        ep.last_stop_text = self.chat.decode(new[-1:]) if stopped else None
        ep.messages.append({"role": "assistant", "content": text})
        if not stopped and len(ep.ids) >= self.cfg.max_episode_tokens:
            ep.end_reason = "length"  # cut by the episode budget: do not act on half a turn
            return

        t0 = time.perf_counter()
        try:
            obs, reward, terminated, truncated, info = _check_step_result(ep.env.step(text))
        except Exception as exc:  # a misbehaving environment must not kill the run
            warnings.warn(
                f"environment {ep.request.task!r} (seed {ep.request.seed}) raised in step() at "
                f"turn {ep.turns}: {exc!r}; ending the episode (abnormal, reason 'env_error')",
                RuntimeWarning,
                stacklevel=2,
            )
            ep.end_reason = "env_error"
            return
        finally:
            self.timings["env_s"] += time.perf_counter() - t0
        ep.reward += reward
        ep.success = ep.success or bool(info.get("success", False))
        ep.parse_errors += bool(info.get("parse_error", False))
        ep.tool_errors += bool(info.get("tool_error"))
        ep.scores.update(info_scores(info))

        if terminated:
            ep.end_reason = "terminated"
        elif self.cfg.end_on_parse_error and info.get("parse_error", False):
            ep.end_reason = "parse_error"
        elif truncated or ep.turns >= ep.max_turns:
            ep.end_reason = "truncated_turns"
        if ep.done:
            return
        message = observation_message(obs, info if ep.tools else None)  # tool result or user
        suffix = self.chat.continuation_ids(ep.messages, message, ep.last_stop_text, tools=ep.tools)
        if len(ep.ids) + len(suffix) >= self.cfg.max_episode_tokens:
            ep.end_reason = "length"  # no room left to generate after this observation
            return
        ep.ids += suffix
        ep.loss_mask += [0] * len(suffix)
        ep.policy += [-1] * len(suffix)
        ep.messages.append(message)
        ep.last_stop_text = None

    def finish(self, ep: _Episode) -> None:
        """Close the last assistant turn with the template's tokens (loss mask 0)."""
        if ep.messages[-1]["role"] == "assistant":
            closing = self.chat.closing_ids(ep.messages, ep.last_stop_text, tools=ep.tools)
            ep.ids += closing
            ep.loss_mask += [0] * len(closing)
            ep.policy += [-1] * len(closing)

    def run(self, episodes: list[_Episode]) -> None:
        live = [ep for ep in episodes if not ep.done]
        if self.share_prefix and live:
            self.share_prompts(live)
        while live:
            for ep, new in zip(live, self.generate(live), strict=True):
                self.advance(ep, new)
                if ep.done:
                    ep.kv = None  # a finished episode leaves the batch with its cache rows
            live = [ep for ep in live if not ep.done]
        for ep in episodes:
            self.finish(ep)


def _masked(values: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``values`` as float32 on the CPU, exactly 0 outside the loss mask."""
    values = values.detach().to("cpu", torch.float32)
    return torch.where(loss_mask > 0, values, torch.zeros_like(values))


def _right_pad(rows: list[list[int]], value: int) -> torch.Tensor:
    length = max(len(r) for r in rows)
    out = torch.full((len(rows), length), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def collect_rollouts(
    model: Any,
    tokenizer: Any,
    requests: Sequence[RolloutRequest | Sequence[Any]],
    cfg: RolloutConfig | None = None,
    *,
    task_names: Sequence[str] | None = None,
    seed: int | None = None,
    policies: Sequence[Any] = (),
    chooser: Callable[[int, int], int] | None = None,
) -> RolloutResult:
    """Sample every request's episode with ``model`` and return the tokenised batch.

    Args:
        model: a Hugging Face causal LM (put in eval mode during the call, restored after).
        tokenizer: its tokenizer, with a chat template.
        requests: :class:`RolloutRequest` objects or ``(task, env_or_factory, seed, group_id)``
            tuples; one trajectory each, in this order.
        cfg: rollout options (defaults: :class:`RolloutConfig`).
        task_names: the run's task names in a fixed order (``task_ids`` index into it);
            default: the sorted distinct tasks of ``requests``.
        seed: seeds torch's RNG for the sampling (the caller's RNG state is restored
            afterwards); ``None`` uses the current global RNG.
        policies: cross-policy sampling's other pool members (pool ``[model, *policies]``,
            same tokenizer and vocabulary): each turn is generated by the member
            ``chooser(episode_index, turn)`` returns; every generated token's statistics are
            its sampler's and ``batch.behaviour_policy`` records the sampler's pool index
            (``batch.off_policy`` is set). Empty: ``model`` alone (the default).
        chooser: ``(episode_index, turn) -> pool index``; default with ``policies``: a
            :class:`~entropace.rollout.cross_policy.TurnChooser` with
            ``cfg.cross_policy.weights`` (uniform when None or not of the pool's size), seeded
            by ``seed + cfg.cross_policy.seed``.

    Returns:
        A :class:`RolloutResult`. Abnormal episodes (end reason other than ``"terminated"``)
        get reward ``cfg.abnormal_penalty``; the others the sum of their step rewards.
        ``old_logprobs``, ``entropy`` and ``sensitivity`` are zero outside ``loss_mask``.

    Raises:
        RuntimeError: out of memory (naming the options to lower), or an environment that
            fails to reset. An environment that raises in ``step`` (or returns a malformed
            result) only ends its episode (reason ``"env_error"``), with a warning.
    """
    cfg = cfg or RolloutConfig()
    reqs = [_as_request(r) for r in requests]
    if not reqs:
        raise ValueError("collect_rollouts needs at least one request")
    names = list(task_names) if task_names is not None else sorted({r.task for r in reqs})
    unknown = sorted({r.task for r in reqs} - set(names))
    if unknown:
        raise ValueError(f"request task(s) {unknown} not in task_names {names}")
    device = next(model.parameters()).device
    t_start = time.perf_counter()
    models = [model, *policies]
    check_pool(models)
    if len(models) > 1 and chooser is None:
        weights = cfg.cross_policy.weights
        if weights is None or len(weights) != len(models):
            weights = [1.0] * len(models)
        chooser = TurnChooser(tuple(weights), (seed or 0) + cfg.cross_policy.seed)

    engine = _Engine(models, tokenizer, cfg, chooser if len(models) > 1 else None)
    with contextlib.ExitStack() as stack:
        for m in {id(m): m for m in models}.values():
            stack.enter_context(_eval_mode(m))
        stack.enter_context(_seeded(seed, device))
        if cfg.autocast == "bf16":
            stack.enter_context(torch.autocast(device_type=device.type, dtype=torch.bfloat16))
        episodes = [engine.start(r, i) for i, r in enumerate(reqs)]
        engine.run(episodes)

        # Statistics of the sampling policy over the full trajectories.
        t0 = time.perf_counter()
        input_ids = _right_pad([ep.ids for ep in episodes], engine.pad_id)
        attention_mask = _right_pad([[1] * len(ep.ids) for ep in episodes], 0)
        loss_mask = _right_pad([ep.loss_mask for ep in episodes], 0).to(torch.float32)
        policy = _right_pad([ep.policy for ep in episodes], -1) if len(models) > 1 else None
        groups = torch.tensor([r.group_id for r in reqs]) if cfg.share_prefix else None
        try:
            if cfg.stats_from_generation:  # each turn's statistics come from its own sampler
                stats = assemble_generation_stats([ep.gen_stats for ep in episodes], loss_mask)
                values = (stats.logprob, stats.entropy, stats.sensitivity)
            elif policy is None:
                stats = _sampling_stats(model, input_ids, attention_mask, loss_mask, groups, cfg)
                values = (stats.logprob, stats.entropy, stats.sensitivity)
            else:
                values = pool_statistics(
                    models, policy,
                    lambda m, rows: _sampling_stats(
                        m, input_ids[rows], attention_mask[rows], loss_mask[rows],
                        groups[rows] if groups is not None else None, cfg,
                    ),
                )  # fmt: skip
        except Exception as exc:
            if is_oom(exc):
                raise RuntimeError(
                    OOM_HINT.format(what="computing the rollout statistics")
                ) from exc
            raise
        stats_s = time.perf_counter() - t0

    abnormal = [ep.end_reason != "terminated" for ep in episodes]
    rewards = [
        cfg.abnormal_penalty if bad else ep.reward
        for ep, bad in zip(episodes, abnormal, strict=True)
    ]
    records = [
        EpisodeRecord(
            task=ep.request.task,
            seed=ep.request.seed,
            messages=ep.messages,
            reward=float(r),
            success=ep.success,
            end_reason=str(ep.end_reason),
            scores=dict(ep.scores),
        )
        for ep, r in zip(episodes, rewards, strict=True)
    ]
    batch = RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        old_logprobs=_masked(values[0], loss_mask),
        entropy=_masked(values[1], loss_mask),
        sensitivity=_masked(values[2], loss_mask),
        rewards=torch.tensor(rewards, dtype=torch.float32),
        group_ids=torch.tensor([r.group_id for r in reqs], dtype=torch.long),
        task_ids=torch.tensor([names.index(r.task) for r in reqs], dtype=torch.long),
        task_names=names,
        success=torch.tensor([ep.success for ep in episodes], dtype=torch.bool),
        abnormal=torch.tensor(abnormal, dtype=torch.bool),
        num_turns=torch.tensor([ep.turns for ep in episodes], dtype=torch.long),
        episodes=records,
        behaviour_policy=policy,
        off_policy=policy is not None,
    )
    return RolloutResult(
        batch=batch,
        timings={
            "generation_s": engine.timings["generation_s"],
            "env_s": engine.timings["env_s"],
            "stats_s": stats_s,
            "total_s": time.perf_counter() - t_start,
        },
        counts=_counts(episodes, engine, int(input_ids.shape[1])),
        task_counts=_task_counts(episodes, names),
        generate_batch_sizes=list(engine.batch_sizes),
    )


def _sampling_stats(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    groups: torch.Tensor | None,
    cfg: RolloutConfig,
) -> Any:
    """One no-grad statistics pass of ``model`` over the trajectories (on its device)."""
    device = next(model.parameters()).device
    return sequence_token_stats(
        model,
        input_ids.to(device),
        attention_mask.to(device),
        temperature=cfg.temperature,
        chunk_size=cfg.stats_chunk_size,
        micro_batch_size=cfg.micro_batch_size,
        grad=False,
        loss_mask=loss_mask.to(device),
        # a group's common prompt runs once here too (same values up to round-off)
        groups=groups.to(device) if groups is not None else None,
        fused_head=cfg.fused_head,
    )


def _counts(episodes: list[_Episode], engine: _Engine, max_len: int) -> dict[str, int]:
    reasons = Counter(ep.end_reason for ep in episodes)
    counts = {
        "episodes": len(episodes),
        "generated_tokens": sum(ep.generated for ep in episodes),
        "turns": sum(ep.turns for ep in episodes),
        "generate_calls": len(engine.batch_sizes),
        "abnormal": sum(ep.end_reason != "terminated" for ep in episodes),
        "max_len": max_len,
        **engine.kv_counts,
    }
    counts.update({f"end_{reason}": reasons.get(reason, 0) for reason in END_REASONS})
    return counts


def _task_counts(episodes: list[_Episode], names: list[str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name in names:
        eps = [ep for ep in episodes if ep.request.task == name]
        if not eps:
            continue
        out[name] = {
            "episodes": len(eps),
            "successes": sum(ep.success for ep in eps),
            "abnormal": sum(ep.end_reason != "terminated" for ep in eps),
            "generated_tokens": sum(ep.generated for ep in eps),
            "turns": sum(ep.turns for ep in eps),
            "parse_errors": sum(ep.parse_errors for ep in eps),
            "tool_errors": sum(ep.tool_errors for ep in eps),
        }
    return out
