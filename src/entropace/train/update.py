"""One training step's policy update, top to bottom (CleanRL style).

Given the step's :class:`~entropace.rollout.batch.RolloutBatch` (trajectories with sampling
log-probs, entropies and PAPO sensitivities at the sampling temperature):

(a) controllers, BEFORE the update, from this step's rollout statistics: the clip rule (EPPO's
    pacer reads per-task mean entropy ``h_k`` of masked tokens) and PAPO's controller (batch
    mean entropy -> ``w_plus, w_minus``);
(b) advantages per trajectory (GRPO / Dr.GRPO / RLOO; DAPO's overlong penalty first), DAPO's
    dynamic-sampling filter, broadcast to masked tokens, optional AgentRL task normalisation;
(c) PAPO: polarity ``P_t = A_t S_t`` from the recorded sensitivities, branch masses, then
    ``polarity_reweight`` (sum |A| preserved);
(d) per-token clip bounds from the per-task bounds;
(e) ``epochs`` x ``num_minibatches`` optimiser steps; each accumulates gradients over
    micro-batches with the mini-batch's GLOBAL token / sequence counts, so the accumulated loss
    and gradient do not depend on the micro-batch size. Current log-probs come from
    :func:`entropace.rollout.sequence_token_stats` (``grad=True``); optional k3 KL to a frozen
    reference and entropy bonus; grad-norm clipping; AdamW + scheduler;
(f) a non-finite loss or gradient skips that optimiser step (grads zeroed, counted).

Returns a flat dict of metrics (the ``metrics.jsonl`` contract, minus rollout-only keys).
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

import entropace.algos as algos
from entropace.algos.aggregation import loss_counts
from entropace.rollout import sequence_token_stats
from entropace.rollout.batch import RolloutBatch
from entropace.train.algorithms import get_advantage_fn
from entropace.train.clip_rules import ClipRule, StepSignals
from entropace.train.config import TrainConfig

#: ``reference(input_ids[b, L], attention_mask[b, L]) -> logprobs[b, L]`` of the frozen
#: reference policy, token-aligned like the batch.
ReferenceFn = Callable[[Tensor, Tensor], Tensor]

logger = logging.getLogger(__name__)

#: Policy losses whose value is A-weighted on every token (zero advantages -> zero loss and
#: gradient). KL-Cov is not: its penalty ``|log r|`` does not depend on A.
A_WEIGHTED_LOSSES: frozenset[str] = frozenset({"ppo", "gspo", "clip_cov", "dcpo", "ce_gppo"})


@dataclass
class Learner:
    """Everything the update mutates or reads besides the batch.

    Attributes:
        model: the policy (a causal LM).
        optimizer, scheduler: AdamW and its LR scheduler (stepped per optimiser step).
        clip_rule: from :func:`entropace.train.clip_rules.build_clip_rule`.
        polarity: :class:`entropace.control.PolarityController` when PAPO is on, else None.
        reference: frozen reference log-probs when ``algorithm.kl_beta > 0``, else None.
        cfg: the resolved run config.
        skipped_steps: cumulative optimiser steps skipped for non-finite loss/gradients.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    clip_rule: ClipRule
    polarity: Any | None
    reference: ReferenceFn | None
    cfg: TrainConfig
    skipped_steps: int = 0
    params: list[torch.nn.Parameter] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.params:
            self.params = [p for p in self.model.parameters() if p.requires_grad]


# ---------------------------------------------------------------------------------------------
# (a) statistics of the rollout batch
# ---------------------------------------------------------------------------------------------


def _masked_mean(x: Tensor, mask: Tensor) -> float:
    n = float(mask.sum())
    return float((x * mask).sum()) / n if n > 0 else math.nan


def step_signals(batch: RolloutBatch) -> StepSignals:
    """Per-task ``h_k`` (mean entropy of masked tokens), success rate and reward variance,
    for the tasks present in the batch (tasks without any response token get no entropy)."""
    sig = StepSignals()
    for k, name in enumerate(batch.task_names):
        sel = batch.task_ids == k
        if not bool(sel.any()):
            continue
        mask = batch.loss_mask[sel]
        if float(mask.sum()) > 0:
            sig.task_entropy[name] = _masked_mean(batch.entropy[sel], mask)
        rewards = batch.rewards[sel].double()
        sig.task_success[name] = float(batch.success[sel].double().mean())
        sig.task_reward_var[name] = float(rewards.var(unbiased=False)) if rewards.numel() else 0.0
    return sig


def rollout_metrics(batch: RolloutBatch) -> dict[str, float]:
    """Rollout-side metrics: per task and global success, reward, entropy, abnormal ends,
    episode and response-token counts."""
    out: dict[str, float] = {}
    mask = batch.loss_mask
    for k, name in enumerate(batch.task_names):
        sel = batch.task_ids == k
        if not bool(sel.any()):
            continue
        p = f"task/{name}/"
        out[p + "success"] = float(batch.success[sel].float().mean())
        out[p + "reward"] = float(batch.rewards[sel].double().mean())
        out[p + "entropy"] = _masked_mean(batch.entropy[sel], mask[sel])
        out[p + "abnormal"] = float(batch.abnormal[sel].float().mean())
        out[p + "num_episodes"] = int(sel.sum())
        out[p + "response_tokens"] = int(mask[sel].sum())
    out["entropy"] = _masked_mean(batch.entropy, mask)
    out["reward"] = float(batch.rewards.double().mean())
    out["success"] = float(batch.success.float().mean())
    out["abnormal"] = float(batch.abnormal.float().mean())
    out["response_tokens"] = int(mask.sum())
    return out


# ---------------------------------------------------------------------------------------------
# (b)-(d) advantages, polarity, bounds
# ---------------------------------------------------------------------------------------------


def token_advantages(batch: RolloutBatch, cfg: TrainConfig) -> tuple[Tensor, Tensor]:
    """Per-token advantages ``[B, L]`` (0 off the loss mask) and DAPO's keep mask ``[B]``.

    ``R_i`` (+ DAPO's soft overlong penalty on the response length when enabled) ->
    estimator ``A_i`` -> ``A_i`` on each masked token -> optional task normalisation
    (AgentRL 2510.04206). The keep mask is all True unless ``dynamic_sampling``
    (DAPO 2503.14476: drop groups whose rewards are all equal).
    """
    a = cfg.algorithm
    rewards = batch.rewards.float()
    if a.overlong.enabled:
        lengths = batch.loss_mask.sum(dim=1)
        rewards = rewards + algos.overlong_penalty(
            lengths, max_len=a.overlong.max_len, cache_len=a.overlong.cache_len
        ).to(rewards.dtype)
    adv = get_advantage_fn(a.advantage)(rewards, batch.group_ids)  # [B]
    keep = (
        algos.dynamic_sampling_mask(rewards, batch.group_ids)
        if a.dynamic_sampling
        else torch.ones_like(batch.group_ids, dtype=torch.bool)
    )
    adv_tok = adv.float()[:, None] * batch.loss_mask  # [B, L]
    if a.task_norm:
        adv_tok = algos.task_normalize_advantages(adv_tok, batch.loss_mask, batch.task_ids)
    return adv_tok, keep


def polarity_masses(polarity: Tensor, advantages: Tensor, mask: Tensor) -> tuple[float, float]:
    """Shares of ``sum |A|`` over masked tokens that sit on ``P > 0`` / ``P < 0`` tokens."""
    w = advantages.abs() * mask
    total = float(w.sum())
    if total == 0:
        return 0.0, 0.0
    return float((w * (polarity > 0)).sum()) / total, float((w * (polarity < 0)).sum()) / total


def token_bounds(
    batch: RolloutBatch, bounds: dict[str, tuple[float, float]], default: tuple[float, float]
) -> tuple[Tensor, Tensor]:
    """Per-trajectory clip bounds ``eps_low[B, 1]``, ``eps_high[B, 1]`` (broadcast over
    tokens) from per-task bounds; tasks without bounds get ``default``."""
    table = torch.tensor(
        [bounds.get(k, default) for k in batch.task_names],
        dtype=torch.float32,
        device=batch.task_ids.device,
    )
    per_traj = table[batch.task_ids]  # [B, 2]
    return per_traj[:, :1].contiguous(), per_traj[:, 1:].contiguous()


# ---------------------------------------------------------------------------------------------
# (e) one optimiser step: gradient accumulation over micro-batches
# ---------------------------------------------------------------------------------------------


@dataclass
class MiniBatch:
    """The per-token tensors an optimiser step needs, for a set of trajectories.

    Shapes: ``[b, L]`` except ``eps_low``/``eps_high`` ``[b, 1]`` and ``task_ids`` ``[b]``.
    """

    input_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    eps_low: Tensor
    eps_high: Tensor
    task_ids: Tensor
    ref_logprobs: Tensor | None = None

    def select(self, index: Tensor) -> MiniBatch:
        """Rows ``index``, trimmed to their longest real sequence (right padding)."""
        index = index.to(self.input_ids.device)
        length = max(int(self.attention_mask[index].sum(dim=1).max()), 1)
        out = {}
        for name, value in vars(self).items():
            if value is None:
                out[name] = None
            elif value.dim() == 2 and value.shape[1] == self.input_ids.shape[1]:
                out[name] = value[index, :length]
            else:
                out[name] = value[index]
        return MiniBatch(**out)


def current_logprobs(
    model: torch.nn.Module, mb: MiniBatch, cfg: TrainConfig, *, grad: bool
) -> tuple[Tensor, Tensor]:
    """``log pi(token_t | prefix)`` and entropy ``[b, L]`` at the sampling temperature."""
    stats = sequence_token_stats(
        model,
        mb.input_ids,
        mb.attention_mask,
        temperature=cfg.rollout.temperature,
        chunk_size=cfg.rollout.stats_chunk_size,
        micro_batch_size=None,
        grad=grad,
        loss_mask=mb.loss_mask,
    )
    return stats.logprob, stats.entropy


def accumulate_gradients(
    learner: Learner,
    mb: MiniBatch,
    *,
    eps: tuple[float, float] | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """Backpropagate the loss of mini-batch ``mb`` in micro-batches (no optimiser step).

    The loss of each micro-batch is aggregated with the mini-batch's global counts
    (``num_tokens`` = masked tokens, ``num_seqs`` = trajectories), so the sum over
    micro-batches equals the whole mini-batch's loss for every aggregation mode, and so do
    the accumulated gradients::

        loss = policy_loss(...) + kl_beta * agg(k3(pi, pi_ref)) - entropy_coef * agg(H)

    Args:
        eps: one ``(eps_low, eps_high)`` for every token (BAPO), else ``mb``'s per-token bounds.

    Returns detached sums over micro-batches: ``loss``, ``kl``, the loss's own metrics under
    ``loss/<name>``, and per-task clip counts ``clip_low``/``clip_high``/``tokens`` (``[K]``
    vectors indexed by task id) for the clip-fraction metrics.
    """
    cfg = learner.cfg
    a = cfg.algorithm
    loss_fn = algos.get_policy_loss(a.policy_loss)
    num_tokens, num_seqs = loss_counts(mb.loss_mask)  # global over the mini-batch
    counts = {"num_tokens": num_tokens, "num_seqs": num_seqs}
    seq_norm = a.seq_norm if a.seq_norm is not None else float(cfg.rollout.max_episode_tokens)
    options = dict(a.loss_options)
    if generator is not None and "generator" in inspect.signature(loss_fn).parameters:
        options.setdefault("generator", generator)  # Clip-Cov's random token pick

    total: dict[str, Tensor] = {}

    def add(name: str, value: Tensor) -> None:
        value = value.detach().double()
        total[name] = _combine(name, total[name], value) if name in total else value

    rows = torch.arange(mb.input_ids.shape[0])
    for index in torch.split(rows, cfg.ppo.micro_batch_size):
        micro = mb.select(index)
        eps_low = micro.eps_low if eps is None else eps[0]
        eps_high = micro.eps_high if eps is None else eps[1]
        logprobs, entropy = current_logprobs(learner.model, micro, cfg, grad=True)
        out = loss_fn(
            logprobs,
            micro.old_logprobs,
            micro.advantages,
            micro.loss_mask,
            eps_low=eps_low,
            eps_high=eps_high,
            agg=a.agg,
            seq_norm=seq_norm,
            **counts,
            **options,
        )
        loss = out.loss
        if learner.reference is not None and a.kl_beta > 0:
            kl = algos.aggregate_loss(
                algos.kl_k3(logprobs, micro.ref_logprobs),
                micro.loss_mask,
                a.agg,
                seq_norm=seq_norm,
                **counts,
            )
            loss = loss + a.kl_beta * kl
            add("kl", kl)
        if a.entropy_coef > 0:
            ent = algos.aggregate_loss(entropy, micro.loss_mask, a.agg, seq_norm=seq_norm, **counts)
            loss = loss - a.entropy_coef * ent
        loss.backward()
        add("loss", loss)
        for name, value in out.metrics.items():
            add(f"loss/{name}", value)

        # Token-level clip indicators at the bounds used (per task, for the metrics):
        # low = A < 0 and r < 1 - eps_low; high = A > 0 and r > 1 + eps_high.
        with torch.no_grad():
            ratio = torch.exp((logprobs.detach() - micro.old_logprobs).clamp(-20, 20))
            m = micro.loss_mask > 0
            low = m & (micro.advantages < 0) & (ratio < 1 - torch.as_tensor(eps_low))
            high = m & (micro.advantages > 0) & (ratio > 1 + torch.as_tensor(eps_high))
            k = len(cfg.tasks.names)
            add("clip_low", torch.bincount(micro.task_ids, low.sum(1).double(), minlength=k))
            add("clip_high", torch.bincount(micro.task_ids, high.sum(1).double(), minlength=k))
            add("tokens", torch.bincount(micro.task_ids, m.sum(1).double(), minlength=k))
            add("approx_kl_sum", (algos.kl_k3(logprobs.detach(), micro.old_logprobs) * m).sum())
    return total


def _combine(name: str, a: Tensor, b: Tensor) -> Tensor:
    """Accumulate a metric over micro-batches / optimiser steps: ``*_min`` / ``*_max``
    metrics (e.g. ``ratio_min``) by min / max, everything else (sums with global counts) by +."""
    if name.endswith("_min"):
        return torch.minimum(a, b)
    if name.endswith("_max"):
        return torch.maximum(a, b)
    return a + b


def _grads_finite(params: list[torch.nn.Parameter]) -> bool:
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return True
    return bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())


def optimizer_step(learner: Learner, loss: Tensor) -> float:
    """Clip the gradient norm and step AdamW + scheduler, unless the loss or a gradient is
    non-finite: then zero the gradients, count the skip and return NaN (section (f))."""
    cfg = learner.cfg
    finite = bool(torch.isfinite(loss)) and _grads_finite(learner.params)
    if finite:
        norm = torch.nn.utils.clip_grad_norm_(learner.params, cfg.optim.max_grad_norm)
        finite = bool(torch.isfinite(norm))
    if not finite:
        learner.optimizer.zero_grad(set_to_none=True)
        learner.skipped_steps += 1
        logger.warning(
            "non-finite loss or gradient: optimiser step skipped (%d skipped so far)",
            learner.skipped_steps,
        )
        return math.nan
    learner.optimizer.step()
    learner.scheduler.step()
    learner.optimizer.zero_grad(set_to_none=True)
    return float(norm)


# ---------------------------------------------------------------------------------------------
# The whole update
# ---------------------------------------------------------------------------------------------


def update_step(
    learner: Learner, batch: RolloutBatch, *, generator: torch.Generator | None = None
) -> dict[str, float]:
    """Consume one rollout batch: (a) controllers, (b) advantages, (c) PAPO, (d) bounds,
    (e) mini-batches x epochs, (f) non-finite skips. Returns the step's metrics."""
    cfg = learner.cfg
    a = cfg.algorithm
    names = batch.task_names
    metrics: dict[str, float] = {}
    mask = batch.loss_mask

    # (a) controllers, from this step's rollout statistics, before the update
    signals = step_signals(batch)
    bounds = learner.clip_rule.on_step(signals)
    w_plus = w_minus = 1.0
    if learner.polarity is not None:
        w_plus, w_minus = learner.polarity.update(_masked_mean(batch.entropy, mask))
        metrics["polarity/w_plus"] = float(w_plus)
        metrics["polarity/w_minus"] = float(w_minus)
        metrics["polarity/u"] = float(learner.polarity.u)
        metrics["polarity/rho"] = float(learner.polarity.rho)

    # (b) advantages [B, L] (0 off the mask) and DAPO's filter
    adv, keep = token_advantages(batch, cfg)
    metrics["advantage_abs_mean"] = _masked_mean(adv.abs(), mask)
    if a.dynamic_sampling:
        metrics["dapo/kept_frac"] = float(keep.float().mean())

    # (c) PAPO: polarity P = A * S (S recorded at sampling), masses before reweighting
    if learner.polarity is not None:
        polarity = algos.entropy_polarity(adv, batch.sensitivity)
        pos, neg = polarity_masses(polarity, adv, mask)
        metrics["polarity/pos_mass"] = pos
        metrics["polarity/neg_mass"] = neg
        adv = algos.polarity_reweight(adv, polarity, mask, w_plus=w_plus, w_minus=w_minus)

    # (d) per-token clip bounds from the per-task bounds
    default = (a.eps_low, a.eps_high)
    eps_low, eps_high = token_bounds(batch, bounds, default)
    for k, name in enumerate(names):
        if bool((batch.task_ids == k).any()):
            lo, hi = bounds.get(name, default)
            metrics[f"task/{name}/eps_low"] = float(lo)
            metrics[f"task/{name}/eps_high"] = float(hi)

    kept = keep.nonzero().flatten()
    data = MiniBatch(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        loss_mask=mask,
        old_logprobs=batch.old_logprobs,
        advantages=adv,
        eps_low=eps_low,
        eps_high=eps_high,
        task_ids=batch.task_ids,
    )
    if learner.reference is not None and a.kl_beta > 0 and kept.numel():
        data.ref_logprobs = _reference_logprobs(learner, data)

    # Every loss term is A-weighted (and there is no KL, entropy bonus or KL-Cov penalty) and
    # every advantage is 0: the gradient is exactly 0, so the forward/backward passes are
    # skipped and the optimiser steps take zero gradients (AdamW's momentum and weight decay
    # act exactly as after a full pass; the mini-batch shuffles consume the same randomness).
    zero_update = (
        not bool(adv.abs().sum() > 0)
        and a.kl_beta == 0
        and a.entropy_coef == 0
        and a.policy_loss in A_WEIGHTED_LOSSES
        and not learner.clip_rule.needs_logprobs
    )
    metrics["update/zero_advantage"] = float(zero_update)

    # (e) epochs x mini-batches of trajectories; one optimiser step per mini-batch
    learner.model.train()
    sums: dict[str, Tensor] = {}
    grad_norms: list[float] = []
    losses: list[float] = []
    bapo_bounds: list[tuple[float, float]] = []
    for _epoch in range(cfg.ppo.epochs if kept.numel() else 0):
        order = kept[torch.randperm(kept.numel(), generator=generator)] if cfg.ppo.shuffle else kept
        for index in torch.tensor_split(order, min(cfg.ppo.num_minibatches, kept.numel())):
            mb = data.select(index)
            eps = None
            if learner.clip_rule.needs_logprobs:  # BAPO: search bounds per optimiser step
                eps = _minibatch_bounds(learner, mb)
                bapo_bounds.append(eps)
            if zero_update:
                for p in learner.params:
                    p.grad = torch.zeros_like(p)
                out = {"loss": torch.zeros((), dtype=torch.float64)}
            else:
                out = accumulate_gradients(learner, mb, eps=eps, generator=generator)
            grad_norms.append(optimizer_step(learner, out["loss"]))
            losses.append(float(out["loss"]))
            if not math.isfinite(grad_norms[-1]):
                continue  # a skipped step's metrics are not the update's
            for name, value in out.items():
                if name != "loss":
                    sums[name] = _combine(name, sums[name], value) if name in sums else value

    # (f) metrics of the update: means over the optimiser steps taken (skipped ones excluded)
    steps = len(losses)
    metrics["optimizer_steps"] = steps
    metrics["skipped_steps"] = learner.skipped_steps
    metrics["lr"] = float(learner.scheduler.get_last_lr()[0])
    if steps and zero_update:
        metrics["loss"] = metrics["grad_norm"] = 0.0
    elif steps and not sums:  # every optimiser step was skipped (non-finite)
        metrics["loss"] = metrics["grad_norm"] = math.nan
    if steps and sums:
        finite_losses = [x for x in losses if math.isfinite(x)]
        finite_norms = [x for x in grad_norms if math.isfinite(x)]
        metrics["loss"] = sum(finite_losses) / len(finite_losses) if finite_losses else math.nan
        metrics["grad_norm"] = sum(finite_norms) / len(finite_norms) if finite_norms else math.nan
        tokens = sums["tokens"]
        n_tok = float(tokens.sum())
        metrics["clip_frac_low"] = float(sums["clip_low"].sum()) / max(n_tok, 1.0)
        metrics["clip_frac_high"] = float(sums["clip_high"].sum()) / max(n_tok, 1.0)
        metrics["approx_kl"] = float(sums["approx_kl_sum"]) / max(n_tok, 1.0)
        for k, name in enumerate(names):
            if float(tokens[k]) > 0:
                metrics[f"task/{name}/clip_frac_low"] = float(sums["clip_low"][k] / tokens[k])
                metrics[f"task/{name}/clip_frac_high"] = float(sums["clip_high"][k] / tokens[k])
        finite_steps = len(finite_norms)
        if "kl" in sums:
            metrics["kl"] = float(sums["kl"]) / finite_steps
        for name, value in sums.items():  # the loss's own metrics: means over optimiser steps
            if name.startswith("loss/") and value.numel() == 1:
                extreme = name.endswith(("_min", "_max"))
                metrics[name] = float(value) if extreme else float(value) / finite_steps
    present = {f"task/{k}/" for k in signals.task_success}
    for key, value in learner.clip_rule.metrics().items():  # pacer m_k, z_k; BAPO's c_low ...
        if not key.startswith("task/") or key[: key.index("/", 5) + 1] in present:
            metrics[key] = value
    if bapo_bounds:
        lo = sum(b[0] for b in bapo_bounds) / len(bapo_bounds)
        hi = sum(b[1] for b in bapo_bounds) / len(bapo_bounds)
        for name in names:
            if f"task/{name}/eps_low" in metrics:
                metrics[f"task/{name}/eps_low"] = lo
                metrics[f"task/{name}/eps_high"] = hi
    return metrics


def _minibatch_bounds(learner: Learner, mb: MiniBatch) -> tuple[float, float]:
    """BAPO-style rules search bounds from the current policy: one no-grad pass over the
    mini-batch, then ``clip_rule.on_minibatch``."""
    parts = []
    rows = torch.arange(mb.input_ids.shape[0])
    with torch.no_grad():
        for index in torch.split(rows, learner.cfg.ppo.micro_batch_size):
            micro = mb.select(index)
            lp, _ = current_logprobs(learner.model, micro, learner.cfg, grad=False)
            full = mb.old_logprobs.new_zeros(len(index), mb.input_ids.shape[1])
            full[:, : lp.shape[1]] = lp
            parts.append(full)
    logprobs = torch.cat(parts)
    eps = learner.clip_rule.on_minibatch(logprobs, mb.old_logprobs, mb.advantages, mb.loss_mask)
    assert eps is not None, "a clip rule with needs_logprobs must return bounds"
    return eps


def _reference_logprobs(learner: Learner, data: MiniBatch) -> Tensor:
    """Reference log-probs ``[B, L]`` for the whole batch, in micro-batches, no grad."""
    assert learner.reference is not None
    out = torch.zeros_like(data.old_logprobs)
    rows = torch.arange(data.input_ids.shape[0])
    with torch.no_grad():
        for index in torch.split(rows, learner.cfg.ppo.micro_batch_size):
            micro = data.select(index)
            lp = learner.reference(micro.input_ids, micro.attention_mask)
            out[index, : lp.shape[1]] = lp.float()
    return out
