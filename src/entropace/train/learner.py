"""The learner and one optimiser step: the machinery :func:`entropace.train.update.update_step`
loops over.

- :class:`Learner`: the model, optimiser, scheduler, controllers, loss and config the update uses.
- :class:`MiniBatch`: the per-token tensors of a set of trajectories.
- :func:`accumulate_gradients`: one mini-batch's loss, back-propagated in micro-batches with the
  mini-batch's global counts (so the result does not depend on the micro-batch size).
- :func:`optimizer_step`: grad-norm clipping and AdamW + scheduler, skipping non-finite steps.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

import entropace.algos as algos
from entropace.algos.aggregation import loss_counts
from entropace.control import ClipRule
from entropace.rollout import sequence_token_stats
from entropace.train.config import TrainConfig
from entropace.train.micro_batches import (
    group_micro_batches,
    shared_prefix_lengths,
    token_micro_batches,
)
from entropace.train.recompute import checkpoint_mlps, checkpoint_norms

#: ``reference(input_ids[b, L], attention_mask[b, L]) -> logprobs[b, L]`` of the frozen
#: reference policy, token-aligned like the batch.
ReferenceFn = Callable[[Tensor, Tensor], Tensor]

logger = logging.getLogger(__name__)


class NonFiniteTrainingError(RuntimeError):
    """``optim.nonfinite_patience`` training steps in a row took no optimiser step: every
    loss or gradient was non-finite (the run's state is saved before it is raised)."""


@dataclass
class Learner:
    """Everything the update mutates or reads besides the batch.

    Attributes:
        model: the policy (a causal LM).
        optimizer, scheduler: AdamW and its LR scheduler (stepped per optimiser step).
        clip_rule: from :func:`entropace.control.build_clip_rule`.
        polarity: :class:`entropace.control.PolarityController` when PAPO is on, else None.
        reference: frozen reference log-probs when ``algorithm.kl_beta > 0``, else None.
        cfg: the resolved run config.
        loss: the registered policy loss ``algorithm.policy_loss``.
        loss_config: its validated config (from ``algorithm.loss_options``).
        skipped_steps: cumulative optimiser steps skipped for non-finite loss/gradients.
        lost_steps: training steps in a row (the latest ones) whose every optimiser step was
            skipped; 0 after a step that took one (not saved: a resumed run counts anew).
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    clip_rule: ClipRule
    polarity: Any | None
    reference: ReferenceFn | None
    cfg: TrainConfig
    loss: algos.PolicyLoss
    loss_config: Any
    skipped_steps: int = 0
    lost_steps: int = 0
    params: list[torch.nn.Parameter] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.params:
            self.params = [p for p in self.model.parameters() if p.requires_grad]
        if self.cfg.ppo.checkpoint_mlp:
            checkpoint_mlps(self.model)
        if self.cfg.ppo.checkpoint_norms:
            checkpoint_norms(self.model)


# ---------------------------------------------------------------------------------------------
# one optimiser step: gradient accumulation over micro-batches
# ---------------------------------------------------------------------------------------------


@dataclass
class MiniBatch:
    """The per-token tensors an optimiser step needs, for a set of trajectories.

    Shapes: ``[b, L]`` except ``eps_low``/``eps_high`` ``[b, 1]``, ``task_ids`` and
    ``group_ids`` ``[b]``. ``old_logprobs`` is the policy the ratio is taken against: the
    behaviour policy's (recorded at sampling), or with ``ppo.decoupled`` the proximal one
    (the learner at update start), ``behaviour_weights`` then holding ``pi_prox / pi_behav``
    (:func:`entropace.algos.behaviour_importance_weights`).
    """

    input_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    eps_low: Tensor
    eps_high: Tensor
    task_ids: Tensor
    group_ids: Tensor | None = None
    ref_logprobs: Tensor | None = None
    behaviour_weights: Tensor | None = None

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


def update_autocast(cfg: TrainConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """The update's autocast context: ``torch.autocast(device, bfloat16)`` for
    ``ppo.autocast=bf16`` (fp32 master weights and gradients), a no-op for ``none``."""
    if cfg.ppo.autocast == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def current_logprobs(
    model: torch.nn.Module, mb: MiniBatch, cfg: TrainConfig, *, grad: bool
) -> tuple[Tensor, Tensor]:
    """``log pi(token_t | prefix)`` and entropy ``[b, L]`` at the sampling temperature
    (under ``ppo.autocast``)."""
    stats = _token_stats(model, mb, cfg, grad=grad)
    return stats.logprob, stats.entropy


@dataclass
class ProximalStats:
    """The learner's statistics at update start (the proximal policy), ``[B, L]`` float32,
    0 where masked: ``logprob``, ``entropy``, ``sensitivity`` (PAPO's ``S = t2 - t1``)."""

    logprob: Tensor
    entropy: Tensor
    sensitivity: Tensor


def proximal_statistics(learner: Learner, data: MiniBatch) -> ProximalStats:
    """One no-grad pass of the learner's current weights over every row of ``data``, in the
    micro-batches of :func:`plan_micro_batches` and the update's mode and autocast (so the
    log-probs are those the first optimiser step's forward computes). At update start this is
    the proximal policy of ``ppo.decoupled``, the learner side of ``rollout/behaviour_kl``, and
    the policy whose entropy and sensitivities EPPO and PAPO read on off-policy batches
    (ALGORITHMS.md section 9)."""
    out = [torch.zeros_like(data.old_logprobs, dtype=torch.float32) for _ in range(3)]
    with torch.no_grad():
        for index in plan_micro_batches(data, learner.cfg):
            micro = data.select(index)
            stats = _token_stats(learner.model, micro, learner.cfg, grad=False)
            rows = index.to(out[0].device)
            for full, value in zip(out, (stats.logprob, stats.entropy, stats.sensitivity)):
                full[rows, : value.shape[1]] = value.float() * micro.loss_mask
    return ProximalStats(*out)


def proximal_logprobs(learner: Learner, data: MiniBatch) -> Tensor:
    """``log pi_prox(y_t)`` ``[B, L]``: :func:`proximal_statistics`' log-probs."""
    return proximal_statistics(learner, data).logprob


def _token_stats(model: torch.nn.Module, mb: MiniBatch, cfg: TrainConfig, *, grad: bool) -> Any:
    with update_autocast(cfg, mb.input_ids.device):
        return sequence_token_stats(
            model,
            mb.input_ids,
            mb.attention_mask,
            temperature=cfg.rollout.temperature,
            chunk_size=cfg.rollout.stats_chunk_size,
            micro_batch_size=None,
            grad=grad,
            loss_mask=mb.loss_mask,
            groups=mb.group_ids if cfg.ppo.share_prefix else None,
            fused_head=cfg.ppo.fused_head,
        )


def combine_metric(name: str, a: Tensor, b: Tensor) -> Tensor:
    """Accumulate a metric over micro-batches / optimiser steps: ``*_min`` / ``*_max``
    metrics (e.g. ``ratio_min``) by min / max, everything else (sums with global counts) by +."""
    if name.endswith("_min"):
        return torch.minimum(a, b)
    if name.endswith("_max"):
        return torch.maximum(a, b)
    return a + b


def _add(total: dict[str, Tensor], name: str, value: Tensor) -> None:
    value = value.detach().double()
    total[name] = combine_metric(name, total[name], value) if name in total else value


def accumulate_gradients(
    learner: Learner,
    mb: MiniBatch,
    *,
    eps: tuple[float, float] | None = None,
    generator: torch.Generator | None = None,
    rows: Tensor | None = None,
) -> dict[str, Tensor]:
    """Backpropagate the loss of mini-batch ``mb`` in micro-batches (no optimiser step).

    The loss of each micro-batch is aggregated with the mini-batch's global counts
    (``num_tokens`` = masked tokens, ``num_seqs`` = trajectories), so the sum over
    micro-batches equals the whole mini-batch's loss for every aggregation mode, and so do
    the accumulated gradients::

        loss = policy_loss(...) + kl_beta * agg(k3(pi, pi_ref)) - entropy_coef * agg(H)

    Args:
        eps: one ``(eps_low, eps_high)`` for every token (BAPO), else ``mb``'s per-token bounds.
        rows: indices of the rows of ``mb`` that run (default: all of them); the caller
            guarantees that the others contribute exactly 0 to the loss and the gradient (a
            ``row_local``, ``advantage_weighted`` loss, all-zero advantages, no KL or entropy
            term; ``ppo.skip_inert``). The counts stay those of the whole ``mb``, so the loss and
            the gradients are those of all rows.

    Returns detached sums over micro-batches: ``loss``, ``kl``, the loss's own metrics as
    ``metric/<name>`` and, per task (``[K]`` vectors indexed by task id), the counts of each of
    the loss's flags as ``flag/<name>`` and of masked tokens as ``tokens``, and over the
    gradient-carrying tokens (advantage != 0) as ``flag_active/<name>`` and ``tokens_active``.
    Flags, tokens and
    metrics cover the rows that ran: the loss's metrics (means with the global token count,
    :class:`entropace.algos.LossOutput`) are rescaled to means over the tokens that ran,
    ``* num_tokens / ran_tokens`` (the ``*_min`` / ``*_max`` extremes as they are).
    """
    cfg = learner.cfg
    a = cfg.algorithm
    num_tokens, num_seqs = loss_counts(mb.loss_mask)  # global over the mini-batch
    counts = {"num_tokens": num_tokens, "num_seqs": num_seqs}
    seq_norm = a.seq_norm if a.seq_norm is not None else float(cfg.rollout.max_episode_tokens)
    k = len(cfg.tasks.names)
    total: dict[str, Tensor] = {}
    run = mb if rows is None else mb.select(rows)  # the rows that run forward/backward
    for index in plan_micro_batches(run, cfg):
        micro = run.select(index)
        logprobs, entropy = current_logprobs(learner.model, micro, cfg, grad=True)
        inputs = algos.LossInputs(
            logprobs, micro.old_logprobs, micro.advantages, micro.loss_mask,
            eps_low=micro.eps_low if eps is None else eps[0],
            eps_high=micro.eps_high if eps is None else eps[1],
            agg=a.agg, seq_norm=seq_norm, generator=generator,
            behaviour_weights=micro.behaviour_weights, **counts,
        )  # fmt: skip
        out = learner.loss(inputs, learner.loss_config)
        loss = out.loss
        if learner.reference is not None and a.kl_beta > 0:
            kl = algos.aggregate_loss(
                algos.kl_k3(logprobs, micro.ref_logprobs), micro.loss_mask, a.agg,
                seq_norm=seq_norm, **counts,
            )  # fmt: skip
            loss = loss + a.kl_beta * kl
            _add(total, "kl", kl)
        if a.entropy_coef > 0:
            ent = algos.aggregate_loss(entropy, micro.loss_mask, a.agg, seq_norm=seq_norm, **counts)
            loss = loss - a.entropy_coef * ent
        loss.backward()
        _add(total, "loss", loss)
        for name, value in out.metrics.items():
            if name not in out.flags:  # flag fractions are pooled from the flags below
                _add(total, f"metric/{name}", value)
        tokens = micro.loss_mask > 0
        active = tokens & (micro.advantages != 0)  # gradient-carrying tokens
        _add(total, "tokens", torch.bincount(micro.task_ids, tokens.sum(1).double(), minlength=k))
        _add(total, "tokens_active", torch.bincount(micro.task_ids, active.sum(1).double(), k))
        for name, flag in out.flags.items():
            per_task = torch.bincount(micro.task_ids, flag.sum(1).double(), minlength=k)
            _add(total, f"flag/{name}", per_task)
            per_task = torch.bincount(micro.task_ids, (flag & active).sum(1).double(), k)
            _add(total, f"flag_active/{name}", per_task)
    if rows is not None:  # the loss's metrics as means over the tokens that ran
        scale = num_tokens.double() / loss_counts(run.loss_mask)[0].double().clamp_min(1.0)
        for name in total:
            if name.startswith("metric/") and not name.endswith(("_min", "_max")):
                total[name] = total[name] * scale
    return total


def plan_micro_batches(mb: MiniBatch, cfg: TrainConfig) -> list[Tensor]:
    """The micro-batches of ``mb`` (row indices; :mod:`entropace.train.micro_batches`): at most
    ``ppo.micro_batch_size`` rows, group-mates together with ``ppo.share_prefix`` (so that
    they share their prompt), and at most ``ppo.micro_batch_tokens`` positions when set. Any
    partition gives the same loss: every micro-batch uses the mini-batch's global counts."""
    size, budget = cfg.ppo.micro_batch_size, cfg.ppo.micro_batch_tokens
    share = cfg.ppo.share_prefix and mb.group_ids is not None
    rows = torch.arange(mb.input_ids.shape[0])
    if budget is not None:
        groups = mb.group_ids.cpu() if mb.group_ids is not None else rows
        ids, attn = mb.input_ids.cpu(), mb.attention_mask.cpu()
        prefixes = shared_prefix_lengths(ids, attn, groups) if share else torch.zeros_like(rows)
        return token_micro_batches(
            groups, attn.sum(dim=1), prefixes, max_rows=size, max_tokens=budget, share=share
        )
    if share:
        return group_micro_batches(mb.group_ids.cpu(), size)
    return list(torch.split(rows, size))


def _grads_finite(params: list[torch.nn.Parameter]) -> bool:
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return True
    return bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())


def optimizer_step(learner: Learner, loss: Tensor) -> float:
    """Clip the gradient norm and step AdamW + scheduler, unless the loss or a gradient is
    non-finite: then zero the gradients, count the skip and return NaN."""
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
