"""Cross-policy sampling (AgentRL, arXiv 2510.04206 section 3.1): which policy acts at each turn.

AgentRL draws the actions of one multi-turn trajectory from more than one model (in its runs,
the current policy and a stale rollout engine) to widen exploration. The rule here
(ALGORITHMS.md section 8): every assistant turn of every episode is generated, whole, by ONE
pool member drawn independently per (episode, turn) with probabilities ``weights``; the draw
is a pure function of ``(seed, episode index, turn)``, so a batch is reproducible and does not
depend on which other episodes are alive or on the generation order. Every generated token
keeps the index of the policy that sampled it (:attr:`RolloutBatch.behaviour_policy`) and its
log-prob under that policy (its behaviour log-prob).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["TurnChooser", "check_pool", "pool_statistics", "select_by_policy"]

_MIX = 1_000_003  # a prime: (seed, episode, turn) -> one integer seed, injectively in practice


@dataclass(frozen=True)
class TurnChooser:
    """``chooser(episode, turn) -> pool index``: an independent draw per (episode, turn).

    Attributes:
        weights: unnormalised probabilities of the pool members (index 0: the current weights).
        seed: the draws' seed (the step's rollout seed plus ``cross_policy.seed``).
    """

    weights: tuple[float, ...]
    seed: int

    def __post_init__(self) -> None:
        if not self.weights or any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
            raise ValueError(f"weights must be >= 0 and not all 0, got {self.weights!r}")

    @classmethod
    def uniform(cls, size: int, seed: int) -> TurnChooser:
        return cls(tuple([1.0] * size), seed)

    def __call__(self, episode: int, turn: int) -> int:
        rng = random.Random((self.seed * _MIX + episode) * _MIX + turn)
        return rng.choices(range(len(self.weights)), weights=self.weights)[0]


def select_by_policy(per_policy: Sequence[Tensor | None], policy: Tensor) -> Tensor:
    """Per token, the value of the policy that sampled it.

    Args:
        per_policy: for each pool index ``p``, a ``[B, L]`` tensor (or None where policy ``p``
            sampled no token).
        policy: ``[B, L]`` long, the pool index of each token's sampler, -1 where none.

    Returns:
        ``[B, L]`` float: ``per_policy[policy[b, t]][b, t]``, 0 where ``policy`` is -1.
    """
    out = torch.zeros(policy.shape, dtype=torch.float32)
    for p, values in enumerate(per_policy):
        if values is None:
            continue
        here = policy == p
        out = torch.where(here, values.detach().to("cpu", torch.float32), out)
    return out


def check_pool(models: Sequence[Any]) -> None:
    """Every pool member must share the policy's vocabulary (one tokenisation)."""
    sizes = [getattr(getattr(m, "config", None), "vocab_size", None) for m in models]
    if len(set(sizes)) > 1:
        raise ValueError(
            f"cross-policy pool: every model must share the policy's vocabulary; vocab sizes "
            f"{sizes} (pool order)"
        )


def pool_statistics(
    models: Sequence[Any], policy: Tensor, stats: Callable[[Any, Tensor], Any]
) -> tuple[Tensor, Tensor, Tensor]:
    """Each token's log-prob, entropy and sensitivity under the policy that sampled it.

    ``stats(model, rows)`` runs ``model``'s statistics pass over the batch rows ``rows``
    (returning ``logprob``, ``entropy``, ``sensitivity`` of shape ``[len(rows), L']``); each
    pool member runs over the rows where it sampled a token. Returns ``[B, L]`` float32 CPU
    tensors (:func:`select_by_policy`).
    """
    parts: list[list[Tensor | None]] = [[None] * len(models) for _ in range(3)]
    for p, model in enumerate(models):
        rows = (policy == p).any(dim=1).nonzero().flatten()
        if rows.numel() == 0:
            continue
        out = stats(model, rows)
        for j, value in enumerate((out.logprob, out.entropy, out.sensitivity)):
            full = torch.zeros(policy.shape, dtype=torch.float32)
            full[rows, : value.shape[1]] = value.detach().to("cpu", torch.float32)
            parts[j][p] = full
    logprob, entropy, sensitivity = (select_by_policy(part, policy) for part in parts)
    return logprob, entropy, sensitivity
