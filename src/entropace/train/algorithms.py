"""Algorithms by name: a registry of recipes.

A recipe is not code: it is a named set of defaults for :class:`~entropace.train.config.
AlgorithmConfig` (advantage estimator, policy loss and its options, aggregation, clip rule,
PAPO on/off, DAPO's dynamic sampling and overlong penalty, task normalisation). The update
step (:mod:`entropace.train.update`) reads only the resolved config, so every part of a recipe
can still be overridden (``algorithm.eps_high=0.3``) and new recipes are one
:func:`register_recipe` call.

Defaults follow ``shared/docs/BASELINES.md`` and ``ALGORITHMS.md``. Two deliberate choices, so
that recipes differ only in the rule they are about:

* ``kl_beta`` is 0 in every recipe (GRPO's paper uses 0.04: ``algorithm.kl_beta=0.04``).
* DCPO's "smooth advantage standardisation across visits of a prompt" needs a prompt to be
  revisited across steps, which the trainer's seed stream never does; it uses GRPO
  advantages, with DCPO's probability-dependent bounds and per-response token mean.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from entropace.train.config import AlgorithmConfig
from entropace.train.schema import ConfigError, build_dataclass


@dataclass(frozen=True)
class Recipe:
    """A named algorithm: overrides of :class:`AlgorithmConfig` defaults.

    Attributes:
        name: registry key (``algorithm.name``).
        summary: one line for docs and ``--help``.
        reference: paper (arXiv id) or spec section.
        overrides: nested ``AlgorithmConfig`` field values (checked at registration).
    """

    name: str
    summary: str
    reference: str
    overrides: dict[str, Any] = field(default_factory=dict)


RECIPES: dict[str, Recipe] = {}


def register_recipe(recipe: Recipe) -> Recipe:
    """Add (or replace) a recipe; its overrides must be valid ``AlgorithmConfig`` fields."""
    try:
        build_dataclass(AlgorithmConfig, {**recipe.overrides, "name": recipe.name}, "algorithm")
    except ConfigError as exc:
        raise ConfigError(f"recipe {recipe.name!r}: {exc}") from exc
    RECIPES[recipe.name] = recipe
    return recipe


def get_recipe(name: str) -> Recipe:
    """The recipe ``name``; an unknown name raises :class:`ConfigError` listing the known."""
    if name not in RECIPES:
        close = difflib.get_close_matches(name, list(RECIPES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"algorithm.name: unknown algorithm {name!r}{hint}; allowed values: {sorted(RECIPES)}"
        )
    return RECIPES[name]


# Advantage estimators: name -> entropace.algos function name, fn(rewards[B], group_ids[B]) -> [B]
_ADVANTAGE_FNS: dict[str, str] = {
    "grpo": "grpo_advantages",
    "dr_grpo": "dr_grpo_advantages",
    "rloo": "rloo_advantages",
}
ADVANTAGES: tuple[str, ...] = tuple(_ADVANTAGE_FNS)


def get_advantage_fn(name: str) -> Callable[[Tensor, Tensor], Tensor]:
    """The advantage estimator ``name``: ``fn(rewards[B], group_ids[B]) -> advantages[B]``."""
    if name not in _ADVANTAGE_FNS:
        raise ConfigError(f"algorithm.advantage: unknown {name!r}; allowed values: {ADVANTAGES}")
    import entropace.algos as algos

    return getattr(algos, _ADVANTAGE_FNS[name])


_EPPO = {"clip_rule": "pacer", "agg": "token-mean"}

for _recipe in (
    Recipe("grpo", "GRPO: group-standardised advantages, PPO clip", "2402.03300",
           {"advantage": "grpo", "agg": "seq-mean-token-mean"}),
    Recipe("dr_grpo", "Dr.GRPO: unnormalised group advantages, per-sequence sum / constant",
           "2503.20783", {"advantage": "dr_grpo", "agg": "seq-mean-token-sum-norm"}),
    Recipe("dapo", "DAPO: clip-higher, token-mean, dynamic sampling, overlong penalty",
           "2503.14476", {"eps_low": 0.2, "eps_high": 0.28, "agg": "token-mean",
                          "dynamic_sampling": True, "overlong": {"enabled": True}}),
    Recipe("rloo", "RLOO: leave-one-out baseline", "2402.14740",
           {"advantage": "rloo", "agg": "token-mean"}),
    Recipe("gspo", "GSPO: sequence-level ratio clipped per sequence", "2507.18071",
           {"policy_loss": "gspo", "eps_low": 3e-4, "eps_high": 4e-4,
            "agg": "seq-mean-token-mean"}),
    Recipe("clip_cov", "Clip-Cov: drop gradients of a few high-covariance tokens", "2505.22617",
           {"policy_loss": "clip_cov", "agg": "token-mean"}),
    Recipe("kl_cov", "KL-Cov: KL penalty on the top-covariance tokens", "2505.22617",
           {"policy_loss": "kl_cov", "agg": "token-mean"}),
    Recipe("dcpo", "DCPO: probability-dependent clip bounds", "2509.02333",
           {"policy_loss": "dcpo", "eps_low": 0.16, "eps_high": 0.2,
            "agg": "seq-mean-token-mean"}),
    Recipe("bapo", "BAPO: per-step adaptive clip balancing positive/negative contributions",
           "2510.18927", {"clip_rule": "bapo", "agg": "token-mean"}),
    Recipe("ce_gppo", "CE-GPPO: gradient-preserving clip", "2509.20712",
           {"policy_loss": "ce_gppo", "agg": "token-mean"}),
    Recipe("eppo", "EPPO: per-task clip range paced by retained entropy",
           "ALGORITHMS.md section 3", dict(_EPPO)),
    Recipe("papo", "PAPO: advantages reweighted by entropy polarity",
           "ALGORITHMS.md section 4", {"papo": True, "agg": "token-mean"}),
    Recipe("eppo+papo", "EPPO pacer and PAPO reweighting together",
           "ALGORITHMS.md sections 3-4", {**_EPPO, "papo": True}),
    Recipe("eppo-global", "EPPO ablation: one global clip range (w/o task-wise clip)",
           "ALGORITHMS.md section 3", {**_EPPO, "pacer": {"task_wise": False}}),
    Recipe("eppo-notrend", "EPPO ablation: no trend constraint",
           "ALGORITHMS.md section 3", {**_EPPO, "pacer": {"trend": False}}),
    Recipe("eppo-success", "EPPO control: pacer driven by EMA success rate, not entropy",
           "ALGORITHMS.md section 3", {**_EPPO, "pacer": {"signal": "success"}}),
    Recipe("eppo-rewardvar", "EPPO control: pacer driven by reward variance, not entropy",
           "ALGORITHMS.md section 3", {**_EPPO, "pacer": {"signal": "reward_var"}}),
):  # fmt: skip
    register_recipe(_recipe)
