"""One training step's policy update, top to bottom (CleanRL style).

Given the step's :class:`~entropace.rollout.batch.RolloutBatch` (trajectories with sampling
log-probs, entropies and PAPO sensitivities at the sampling temperature), :func:`update_step`:

(0) off-policy batches only (``ppo.decoupled``, or a batch marked ``off_policy``: an
    asynchronous worker's or a cross-policy pool's tokens): ONE no-grad pass of the learner at
    update start over the batch (:func:`entropace.train.learner.proximal_statistics`); its
    entropy and sensitivities replace the recorded ones for (a)-(c), so EPPO and PAPO read the
    policy being updated (ALGORITHMS.md section 9); on-policy batches skip it (the recorded
    statistics ARE the learner's);

(a) per-task rollout statistics in one pass, then the controllers, BEFORE the update, through
    :class:`entropace.control.TaskStep` (the per-task step every engine shares): the clip rule
    (EPPO's pacer reads per-task mean entropy ``h_k`` of masked tokens) and PAPO's controller
    (batch mean entropy -> ``w_plus, w_minus``), and the rollout's metrics;
(b) advantages per trajectory (the registered estimator; DAPO's overlong penalty first), DAPO's
    dynamic-sampling filter, broadcast to masked tokens, optional AgentRL task normalisation;
    each task's share of episodes that carry gradient (``task/<k>/signal_frac``);
(c) PAPO: polarity ``P_t = A_t S_t`` from the recorded sensitivities, branch masses, then
    ``polarity_reweight`` (sum |A| preserved): :meth:`TaskStep.reweight`;
(d) per-trajectory clip bounds from the per-task bounds: :meth:`TaskStep.row_bounds`;
(e) off-policy inputs: the proximal pass (below) gives ``rollout/behaviour_kl`` (k3 of
    behaviour vs learner, mean over the kept rows' masked tokens) and, with
    ``ppo.decoupled``, the proximal log-probs the ratio is taken against and the behaviour
    weights ``pi_prox / pi_behav`` (AReaL, :mod:`entropace.algos.decoupled`). Then
    ``epochs`` x ``num_minibatches`` optimiser steps; each accumulates gradients over
    micro-batches with the mini-batch's GLOBAL token / sequence counts, so the accumulated loss
    and gradient do not depend on the micro-batch size
    (:func:`entropace.train.learner.accumulate_gradients`); a non-finite loss or gradient skips
    that optimiser step (grads zeroed, counted; :func:`entropace.train.learner.optimizer_step`).
    Inert trajectories (advantage 0 on every token) contribute exactly nothing when every loss
    term is A-weighted and the loss is row-local: with ``ppo.skip_inert`` they are left out of
    the passes (a mini-batch without an active row takes a zero-gradient step), and when every
    trajectory is inert the whole update takes zero-gradient steps;
(f) :func:`update_metrics` turns the sums of the optimiser steps into the step's metrics. Every
    loss-side metric comes from the loss's own outputs (its metrics and its per-token flags),
    over the trajectories that ran.

Returns a flat dict of metrics (the ``metrics.jsonl`` contract, timings aside).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

import entropace.algos as algos
from entropace.control import TaskStep
from entropace.rollout.batch import RolloutBatch
from entropace.train.algorithms import advantage_config
from entropace.train.config import TrainConfig
from entropace.train.learner import (
    Learner,
    MiniBatch,
    accumulate_gradients,
    combine_metric,
    current_logprobs,
    optimizer_step,
    proximal_statistics,
)

#: Loss flags logged at the top level (the others as ``loss/<name>``).
TOP_LEVEL_FLAGS = ("clip_frac_low", "clip_frac_high")


# ---------------------------------------------------------------------------------------------
# (a) statistics of the rollout batch and the controllers
# ---------------------------------------------------------------------------------------------


def task_step(learner: Learner, task_names: list[str]) -> TaskStep:
    """The :class:`entropace.control.TaskStep` over the learner's controllers (its clip rule
    and PAPO controller, which hold the state) and the run's tasks."""
    return TaskStep(
        task_names,
        clip_rule=learner.clip_rule,
        polarity=learner.polarity,
        recipe=learner.cfg.algorithm.name,
    )


# ---------------------------------------------------------------------------------------------
# (b)-(d) advantages, polarity, bounds
# ---------------------------------------------------------------------------------------------


def token_advantages(batch: RolloutBatch, cfg: TrainConfig) -> tuple[Tensor, Tensor]:
    """Per-token advantages ``[B, L]`` (0 off the loss mask) and DAPO's keep mask ``[B]``.

    ``R_i`` (+ DAPO's soft overlong penalty on the response length when enabled) ->
    estimator ``A_i`` -> ``A_i`` on each masked token (a per-token estimator such as
    REINFORCE++ gives ``A_t`` itself) -> optional task normalisation
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
    estimator = algos.get_advantage(a.advantage)
    adv = estimator(
        rewards, batch.group_ids, mask=batch.loss_mask, config=advantage_config(a)
    )  # [B], or [B, L] (per-token estimators)
    keep = (
        algos.dynamic_sampling_mask(rewards, batch.group_ids)
        if a.dynamic_sampling
        else torch.ones_like(batch.group_ids, dtype=torch.bool)
    )
    adv_tok = (adv.float()[:, None] if adv.dim() == 1 else adv.float()) * batch.loss_mask
    if a.task_norm:
        adv_tok = algos.task_normalize_advantages(adv_tok, batch.loss_mask, batch.task_ids)
    return adv_tok, keep


def signal_metrics(
    adv: Tensor, keep: Tensor, task_ids: Tensor, names: list[str]
) -> dict[str, float]:
    """``task/<k>/signal_frac``: the share of task k's episodes that carry a learning signal,
    i.e. are kept (DAPO's filter) and have a non-zero advantage on some token, from the
    advantages ``adv [B, L]``, ``keep [B]`` and ``task_ids [B]``. With group-relative
    advantages (GRPO, RLOO, ...) it is the share of episodes in groups whose rewards are not
    all equal: a task at 0 on every step got no gradient, whatever its clip range."""
    carries = (adv.ne(0).any(dim=1) & keep).double()
    ids = task_ids.long().cpu()
    episodes = torch.bincount(ids, minlength=len(names)).tolist()
    signal = torch.bincount(ids, weights=carries.cpu(), minlength=len(names)).tolist()
    return {
        f"task/{name}/signal_frac": signal[k] / episodes[k]
        for k, name in enumerate(names)
        if episodes[k]
    }


# ---------------------------------------------------------------------------------------------
# The whole update
# ---------------------------------------------------------------------------------------------


def update_step(
    learner: Learner, batch: RolloutBatch, *, generator: torch.Generator | None = None
) -> dict[str, float]:
    """Consume one rollout batch (module docstring, (a)-(f)); returns the step's metrics,
    the rollout's per-task statistics included."""
    cfg = learner.cfg
    a = cfg.algorithm
    names = batch.task_names
    mask = batch.loss_mask

    # off-policy batches: the learner's own statistics at update start (the proximal policy,
    # ALGORITHMS.md section 9) replace the recorded entropy and sensitivities for (a)-(c)
    prox = None
    if cfg.ppo.decoupled.enabled or batch.off_policy:
        prox = proximal_statistics(learner, _all_rows(batch))
        batch = dataclasses.replace(batch, entropy=prox.entropy, sensitivity=prox.sensitivity)

    # (a) per-task statistics (one pass), controllers before the update
    control = task_step(learner, names)
    sums = control.sums(batch.entropy, mask, batch.rewards, batch.success, batch.task_ids,
                        abnormal=batch.abnormal)  # fmt: skip
    decided = control.step(sums)
    bounds, metrics = decided.bounds, dict(decided.metrics)
    if batch.behaviour_policy is not None:  # cross-policy: share of tokens from other members
        others = (batch.behaviour_policy > 0) & (mask > 0)
        metrics["rollout/cross_policy_token_frac"] = float(others.sum() / mask.sum().clamp_min(1))

    # (b) advantages [B, L] (0 off the mask) and DAPO's filter
    adv, keep = token_advantages(batch, cfg)
    metrics["advantage_abs_mean"] = float((adv.abs() * mask).sum()) / max(float(mask.sum()), 1.0)
    metrics.update(signal_metrics(adv, keep, batch.task_ids, names))
    if a.dynamic_sampling:
        metrics["dapo/kept_frac"] = float(keep.float().mean())

    # (c) PAPO: polarity P = A * S (S recorded at sampling), masses before reweighting
    if control.polarity is not None:
        adv, masses = control.reweight(adv, batch.sensitivity, mask, task_ids=batch.task_ids)
        metrics.update(masses)

    # (d) per-trajectory clip bounds [B, 1] from the per-task bounds
    eps_low, eps_high = control.row_bounds(batch.task_ids)

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
        group_ids=batch.group_ids,
    )
    if learner.reference is not None and a.kl_beta > 0 and kept.numel():
        data.ref_logprobs = _reference_logprobs(learner, data)
    if prox is not None and kept.numel():
        metrics.update(off_policy_inputs(learner, data, prox.logprob, kept))

    # Every loss term is A-weighted (and there is no KL or entropy bonus): a trajectory whose
    # advantage is 0 on every token ("inert") contributes exactly 0 to the loss and gradient.
    # Every trajectory inert: the forward/backward passes are skipped and the optimiser steps
    # take zero gradients (AdamW's momentum and weight decay act exactly as after a full pass;
    # the mini-batch shuffles consume the same randomness). With ppo.skip_inert and a
    # row-local loss, the inert rows of each mini-batch are left out of its passes (its global
    # counts unchanged: the same loss and gradients; a BAPO search still sees every row).
    inert_exact = a.kl_beta == 0 and a.entropy_coef == 0 and learner.loss.advantage_weighted
    active = adv.ne(0).any(dim=1)  # [B] rows that carry gradient (NaN counts as active)
    zero_update = inert_exact and not bool(active.any()) and not learner.clip_rule.needs_logprobs
    skip_rows = inert_exact and cfg.ppo.skip_inert and learner.loss.row_local
    metrics["update/zero_advantage"] = float(zero_update)

    # (e) epochs x mini-batches of trajectories; one optimiser step per mini-batch
    learner.model.train()
    sums: dict[str, Tensor] = {}
    losses: list[float] = []
    grad_norms: list[float] = []
    searched: list[tuple[float, float]] = []
    measured = 0  # optimiser steps whose passes ran and whose metrics are summed
    rows_run = rows_total = 0
    for _epoch in range(cfg.ppo.epochs if kept.numel() else 0):
        order = kept[torch.randperm(kept.numel(), generator=generator)] if cfg.ppo.shuffle else kept
        for index in torch.tensor_split(order, min(cfg.ppo.num_minibatches, kept.numel())):
            mb = data.select(index)
            eps = None
            if learner.clip_rule.needs_logprobs:  # BAPO: search bounds per optimiser step
                eps = _minibatch_bounds(learner, mb)
                searched.append(eps)
            rows = active[index].nonzero().flatten() if skip_rows else None  # rows of mb
            if rows is not None and rows.numel() == index.numel():
                rows = None  # every row active: the plain passes
            n_run = index.numel() if rows is None else rows.numel()  # rows that run
            if zero_update:
                n_run = 0
            rows_total += index.numel()
            rows_run += n_run
            if n_run == 0:
                for p in learner.params:
                    p.grad = torch.zeros_like(p)
                out = {"loss": torch.zeros((), dtype=torch.float64)}
            else:
                out = accumulate_gradients(learner, mb, eps=eps, generator=generator, rows=rows)
            grad_norms.append(optimizer_step(learner, out["loss"]))
            losses.append(float(out["loss"]))
            # a skipped (non-finite) step's metrics are not the update's
            if n_run and math.isfinite(grad_norms[-1]):
                measured += 1
                for name, value in out.items():
                    if name != "loss":
                        _combine_into(sums, name, value)

    if grad_norms:  # training steps in a row that took no optimiser step (all non-finite)
        took_one = any(math.isfinite(g) for g in grad_norms)
        learner.lost_steps = 0 if took_one else learner.lost_steps + 1

    # (f) metrics of the update and of the controllers
    metrics["update/trained_rows_frac"] = rows_run / rows_total if rows_total else 0.0
    metrics.update(update_metrics(learner, names, losses, grad_norms, sums, measured))
    if searched:  # BAPO: the bounds used are the mean of the per-optimiser-step searches
        lo = sum(b[0] for b in searched) / len(searched)
        hi = sum(b[1] for b in searched) / len(searched)
        for name in bounds:
            metrics[f"task/{name}/eps_low"], metrics[f"task/{name}/eps_high"] = lo, hi
    if learner.clip_rule.needs_logprobs:  # BAPO's c_low ... of its last search
        metrics.update(learner.clip_rule.metrics(bounds))
    return metrics


def _all_rows(batch: RolloutBatch) -> MiniBatch:
    """The batch's rows as a :class:`MiniBatch` for the proximal pass (no advantages yet)."""
    zeros = torch.zeros(batch.size, 1, device=batch.input_ids.device)
    return MiniBatch(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask,
        loss_mask=batch.loss_mask, old_logprobs=batch.old_logprobs,
        advantages=torch.zeros_like(batch.old_logprobs), eps_low=zeros, eps_high=zeros,
        task_ids=batch.task_ids, group_ids=batch.group_ids,
    )  # fmt: skip


def off_policy_inputs(
    learner: Learner, data: MiniBatch, prox_logprobs: Tensor, kept: Tensor
) -> dict[str, float]:
    """Section (e)'s off-policy inputs from the proximal log-probs ``[B, L]`` on the rows
    ``kept``; returns ``rollout/behaviour_kl`` (k3, mean over their masked tokens). With
    ``ppo.decoupled`` it replaces, on those rows, ``data.old_logprobs`` (the behaviour
    policy's) by the proximal ones and sets ``data.behaviour_weights`` (``pi_prox /
    pi_behav``, 0 above the cap; 0 on rows left out, which never run)."""
    prox = prox_logprobs[kept]
    behav = data.old_logprobs[kept]
    mask = data.loss_mask[kept]
    k3 = algos.behaviour_kl_k3(prox, behav, mask)
    out = {"rollout/behaviour_kl": float(k3.sum() / mask.sum().clamp_min(1.0))}
    dec = learner.cfg.ppo.decoupled
    if dec.enabled:
        weights, _capped = algos.behaviour_importance_weights(
            prox, behav, mask, dec.behaviour_weight_cap
        )
        old = data.old_logprobs.clone()
        old[kept] = prox
        full = torch.zeros_like(data.old_logprobs)
        full[kept] = weights
        data.old_logprobs, data.behaviour_weights = old, full
    return out


def _combine_into(sums: dict[str, Tensor], name: str, value: Tensor) -> None:
    sums[name] = combine_metric(name, sums[name], value) if name in sums else value


def update_metrics(
    learner: Learner,
    names: list[str],
    losses: list[float],
    grad_norms: list[float],
    sums: dict[str, Tensor],
    measured: int,
) -> dict[str, float]:
    """The update's metrics from the sums of its optimiser steps (skipped steps excluded).

    ``loss`` and ``grad_norm`` are means over the optimiser steps taken (a zero-gradient step,
    whose passes were skipped, counts with 0); the loss's own metrics (``approx_kl`` at the top
    level, the others as ``loss/<name>``) and ``kl`` are means over the ``measured`` steps
    whose passes ran, or the min / max for ``*_min`` / ``*_max``; the loss's flags are pooled
    over every masked token that ran: ``clip_frac_low`` / ``clip_frac_high`` at the top level
    and per task, the others as ``loss/<name>`` and per task (a task none of whose tokens ran
    has no per-task flag metric). Beside each, ``<flag>_active``: the same fraction over the
    gradient-carrying tokens (masked, advantage != 0) that ran, which is what a clip range
    acts on (an inert token's flag never changes a gradient); ``update/active_token_frac``
    is their share of the masked tokens that ran.
    """
    out: dict[str, float] = {
        "optimizer_steps": len(losses),
        "skipped_steps": learner.skipped_steps,
        "lr": float(learner.scheduler.get_last_lr()[0]),
    }
    finite = [i for i, g in enumerate(grad_norms) if math.isfinite(g)]
    if not losses:
        return out
    if not finite:  # every optimiser step was skipped (non-finite)
        return {**out, "loss": math.nan, "grad_norm": math.nan}
    out["loss"] = sum(losses[i] for i in finite) / len(finite)
    out["grad_norm"] = sum(grad_norms[i] for i in finite) / len(finite)
    if not measured:  # zero-gradient steps only: no pass ran, no loss-side metric
        return out
    if "kl" in sums:
        out["kl"] = float(sums["kl"]) / measured
    tokens = sums["tokens"]
    active = sums["tokens_active"]
    out["update/active_token_frac"] = float(active.sum() / tokens.sum().clamp_min(1.0))
    for key, value in sums.items():
        if key.startswith("metric/"):
            name = key[len("metric/") :]
            extreme = name.endswith(("_min", "_max"))
            mean = float(value) if extreme else float(value) / measured
            out["approx_kl" if name == "approx_kl" else f"loss/{name}"] = mean
        elif key.startswith("flag/"):
            name = key[len("flag/") :]
            out[name if name in TOP_LEVEL_FLAGS else f"loss/{name}"] = float(
                value.sum() / tokens.sum().clamp_min(1.0)
            )
            for k, task in enumerate(names):
                if float(tokens[k]) > 0:
                    out[f"task/{task}/{name}"] = float(value[k] / tokens[k])
        elif key.startswith("flag_active/"):
            name = key[len("flag_active/") :]
            top = name in TOP_LEVEL_FLAGS
            out[f"{name}_active" if top else f"loss/{name}_active"] = float(
                value.sum() / active.sum().clamp_min(1.0)
            )
            for k, task in enumerate(names):
                if float(active[k]) > 0:
                    out[f"task/{task}/{name}_active"] = float(value[k] / active[k])
    return out


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
    if eps is None:
        raise RuntimeError("a clip rule with needs_logprobs must return bounds from on_minibatch")
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
