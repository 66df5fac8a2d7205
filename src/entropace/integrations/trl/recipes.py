"""Which entropace algorithm recipes TRL's ``GRPOTrainer`` can run, and how they map onto it.

TRL 1.16's loss is one clamp-based PPO surrogate,
``-min(r A, clamp(r, 1 - epsilon_low, 1 + epsilon_high) A)`` with ``r`` per token
(``importance_sampling_level="token"``) or per sequence (``"sequence"``), aggregated by
``loss_type`` (``grpo``: per-sequence token mean; ``dapo``: token mean over the global batch;
``dr_grpo``: per-sequence token sum / ``max_completion_length``), with group advantages
``(R - mean_g) / (std_g + 1e-4)`` (``scale_rewards="group"``) or ``R - mean_g`` (``"none"``).
:class:`~entropace.integrations.trl.EntropaceGRPOTrainer` adds per-completion clip bounds
(EPPO), ``(B, T)`` advantages (PAPO) and replaced advantages (RLOO); a recipe is runnable when
it needs nothing more. :func:`resolve_recipe` turns a recipe name into the ``GRPOConfig``
fields it sets plus the controllers the trainer runs.

Recipes that cannot run, and why, are listed in :data:`UNSUPPORTED`. TRL's own options stay
TRL's: the KL coefficient (``beta``), the entropy bonus, and PPO's dual clip, which is
``GRPOConfig(delta=...)`` (TRL caps ``r`` at ``delta``, which only binds for ``A < 0``: the
dual-clip rule). entropace's ``ppo`` loss uses a dual clip of 3 by default; TRL's ``delta`` is
off by default and the recipes leave it as the user set it.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from entropace.algos import get_policy_loss
from entropace.algos.widths import RATIO_WIDTH, TrustWidth
from entropace.control import PacerConfig, PolarityConfig

logger = logging.getLogger(__name__)

__all__ = [
    "REQUIRES",
    "SUPPORTED",
    "UNSUPPORTED",
    "TRLRecipe",
    "apply_recipe",
    "overlong_reward",
    "resolve_recipe",
]

#: Recipe name -> the ``GRPOConfig`` fields it needs (what the algorithm IS in TRL). Every other
#: field stays the user's: ``algorithm="grpo"`` is TRL's GRPO as the ``GRPOConfig`` says (its
#: ``loss_type`` included), ``papo`` and the eppo recipes keep the user's aggregation. A needed
#: field left at TRL's default is set (logged, and listed in ``trainer.entropace_changes``); one
#: the user set to another value is refused, naming it (:func:`apply_recipe`).
REQUIRES: dict[str, tuple[str, ...]] = {
    "grpo": (),
    "dr_grpo": ("loss_type", "scale_rewards"),
    "dapo": ("loss_type", "epsilon", "epsilon_high"),
    "rloo": (),  # the advantages are replaced by leave-one-out ones
    "gspo": ("importance_sampling_level", "epsilon", "epsilon_high"),
    "eppo": ("epsilon", "epsilon_high"),  # the pacer's (eps0, eps_high0)
    "eppo-global": ("epsilon", "epsilon_high"),
    "eppo-notrend": ("epsilon", "epsilon_high"),
    "eppo-success": ("epsilon", "epsilon_high"),
    "eppo-rewardvar": ("epsilon", "epsilon_high"),
    "eppo-shuffled": ("epsilon", "epsilon_high"),
    "papo": (),
    "eppo+papo": ("epsilon", "epsilon_high"),
}
#: Recipe names :class:`EntropaceGRPOTrainer` runs.
SUPPORTED: tuple[str, ...] = tuple(REQUIRES)

#: Recipe name -> why TRL's loss cannot express it.
UNSUPPORTED: dict[str, str] = {
    "clip_cov": (
        "Clip-Cov drops the gradient of a random subset of the batch's highest-covariance "
        "tokens; TRL's clamp surrogate has no per-token gradient selection"
    ),
    "kl_cov": (
        "KL-Cov adds a KL penalty on the batch's highest-covariance tokens; TRL's loss has no "
        "per-token penalty term besides its global k3 KL to a reference model"
    ),
    "dcpo": (
        "DCPO's bounds depend on each token's old probability and its advantages are smoothed "
        "across visits of a prompt; TRL's clamp receives per-sequence bounds here and "
        "computes plain group advantages"
    ),
    "ce_gppo": (
        "CE-GPPO keeps a scaled gradient on clipped tokens; TRL's min(r A, clamp(r) A) zeroes it"
    ),
    "bapo": (
        "BAPO searches its bounds once per optimiser step from the current policy's log-probs "
        "(an extra no-grad pass); TRL's loop has no hook between the optimiser steps of one "
        "generation batch"
    ),
}
_LOSS_WHY: dict[str, str] = {
    "cispo": (
        "CISPO clips the importance weight to [1 - eps_low, 1 + eps_high] and keeps every "
        "token's gradient; TRL's loss_type='cispo' caps it at epsilon_high (an absolute cap) and "
        "this integration's per-completion bounds feed TRL's PPO clamp only"
    ),
    "gmpo": "GMPO's geometric-mean sequence ratio with per-token log-ratio clipping is not a TRL "
    "loss type",
    "sapo": (
        "EPPO's per-task temperatures would have to reach TRL's sapo gate; this integration "
        "passes per-completion bounds to TRL's PPO clamp only (a fixed-temperature SAPO is TRL's "
        "own GRPOConfig(loss_type='sapo'))"
    ),
    "dppo_tv": "DPPO's divergence mask (total variation of the sampled token) is not a TRL "
    "loss type",
    "dppo_kl": "DPPO's divergence mask (binary KL of the sampled token) is not a TRL loss type",
    "dro": "DRO's quadratic log-ratio penalty is not a TRL loss type",
    "gpg": "GPG's ratio-free REINFORCE loss and batch-rescaled advantages are not TRL's",
}
_ADVANTAGE_WHY = (
    "advantages that TRL's GRPOTrainer does not compute (this integration replaces TRL's "
    "group advantages with RLOO's only)"
)
UNSUPPORTED.update(
    {name: why for name, why in _LOSS_WHY.items()}
    | {f"eppo+{name}": why for name, why in _LOSS_WHY.items() if name != "gpg"}
    | {
        name: f"{name}: {_ADVANTAGE_WHY}"
        for name in ("reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo", "grpo_passk")
    }
)

_LOSS_TYPE: dict[str, str] = {
    "token-mean": "dapo",
    "seq-mean-token-mean": "grpo",
    "seq-mean-token-sum-norm": "dr_grpo",
}
_SCALE_REWARDS: dict[str, str] = {"grpo": "group", "dr_grpo": "none", "rloo": "none"}
_IS_LEVEL: dict[str, str] = {"ppo": "token", "gspo": "sequence"}


@dataclass(frozen=True)
class TRLRecipe:
    """A recipe resolved for TRL.

    Attributes:
        name: the recipe name.
        trl_args: the ``GRPOConfig`` fields the recipe needs (:data:`REQUIRES`) and their
            values (``loss_type``, ``scale_rewards``, ``epsilon``, ``epsilon_high``,
            ``importance_sampling_level``); every other field is the user's.
        pacer: EPPO's pacer config (per-task clip bounds), or None (fixed bounds).
        polarity: PAPO's controller config, or None (no reweighting).
        advantage: ``"rloo"`` when the trainer replaces TRL's advantages, else None.
        overlong: DAPO's soft overlong penalty ``(max_len, cache_len)`` added as a reward
            function, or None.
        notes: where the TRL run differs from entropace's own trainer (shown as warnings).
        width: the policy loss's trust-region width (the pacer sets PPO's ratio bounds itself
            and scales GSPO's own sequence bounds: ALGORITHMS.md section 3, "Widths").
    """

    name: str
    trl_args: dict[str, Any]
    pacer: PacerConfig | None = None
    polarity: PolarityConfig | None = None
    advantage: str | None = None
    overlong: tuple[int, int] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    width: TrustWidth = RATIO_WIDTH

    @property
    def needs_stats(self) -> bool:
        """True when the trainer runs its no-grad statistics pass (EPPO or PAPO on)."""
        return self.pacer is not None or self.polarity is not None


def _algorithm_config(name: str, overrides: Mapping[str, Any]) -> Any:
    """The validated ``AlgorithmConfig`` of recipe ``name`` with ``overrides`` applied."""
    from entropace.train.algorithms import algorithm_config

    return algorithm_config(name, dict(overrides))


def _bounds(a: Any) -> tuple[float, float]:
    """The recipe's fixed ``(eps_low, eps_high)``; ``None`` means the policy loss's defaults."""
    from entropace.train.algorithms import effective_bounds

    return effective_bounds(a)


def _merge_controller(
    kind: str, recipe_cfg: Any, user: Any, cls: type, recipe_fields: Mapping[str, Any]
) -> Any:
    """The controller config: the user's instance or mapping over the recipe's.

    An instance replaces the recipe's config, but must keep the fields that define the recipe
    (e.g. ``trend=False`` for ``eppo-notrend``)."""
    if user is None:
        return recipe_cfg
    if isinstance(user, cls):
        for key, value in recipe_fields.items():
            if getattr(user, key) != value:
                raise ValueError(
                    f"{kind}={user!r} sets {key}={getattr(user, key)!r}, but the algorithm "
                    f"defines {key}={value!r}; pick another algorithm or drop {key}"
                )
        return user
    if isinstance(user, Mapping):
        return dataclasses.replace(recipe_cfg, **dict(user))
    raise TypeError(f"{kind} must be a {cls.__name__}, a mapping of its fields or None")


def resolve_recipe(
    name: str,
    *,
    pacer: PacerConfig | Mapping[str, Any] | None = None,
    polarity: PolarityConfig | Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    max_completion_length: int = 256,
) -> TRLRecipe:
    """Resolve recipe ``name`` for TRL.

    Args:
        name: one of :data:`SUPPORTED`.
        pacer, polarity: the controllers' configs (our dataclasses, or mappings of their
            fields merged over the recipe's); only used by recipes that run them.
        overrides: further ``AlgorithmConfig`` fields (e.g. ``{"eps_high": 0.28}``).
        max_completion_length: TRL's ``max_completion_length`` (the overlong penalty's
            ``max_len``).

    Raises:
        ValueError: an unknown or unsupported recipe (with the reason), or an override TRL
            cannot honour.
    """
    if name in UNSUPPORTED:
        raise ValueError(
            f"algorithm {name!r} cannot run inside TRL's GRPOTrainer: {UNSUPPORTED[name]}. "
            f"Supported: {', '.join(SUPPORTED)} (or use entropace's own trainer)"
        )
    if name not in SUPPORTED:
        raise ValueError(f"unknown algorithm {name!r}; supported in TRL: {', '.join(SUPPORTED)}")
    overrides = dict(overrides or {})
    for key in ("pacer", "polarity"):
        if key in overrides:
            raise ValueError(f"pass {key}= to the trainer, not inside algorithm overrides")
    a = _algorithm_config(name, overrides)
    if a.policy_loss not in _IS_LEVEL:
        raise ValueError(
            f"algorithm {name!r}: policy_loss {a.policy_loss!r} is not TRL's clamp surrogate "
            f"(supported: {sorted(_IS_LEVEL)})"
        )
    if a.clip_rule not in ("fixed", "pacer"):
        raise ValueError(f"algorithm {name!r}: clip_rule {a.clip_rule!r}: {UNSUPPORTED['bapo']}")
    if a.agg not in _LOSS_TYPE:
        raise ValueError(f"algorithm {name!r}: aggregation {a.agg!r} has no TRL loss_type")
    if a.advantage not in _SCALE_REWARDS:
        raise ValueError(f"algorithm {name!r}: advantage {a.advantage!r} is not supported")
    if a.task_norm:
        raise ValueError(
            "task_norm (AgentRL task normalisation) is not supported in TRL: it needs per-task "
            "token statistics of the global batch inside TRL's advantage computation"
        )
    for key, hint in (("kl_beta", "GRPOConfig(beta=...)"), ("entropy_coef", "GRPOConfig")):
        if getattr(a, key):
            raise ValueError(f"{key} is TRL's own option in this integration: set it in {hint}")
    if a.agg == "seq-mean-token-sum-norm" and a.seq_norm not in (None, max_completion_length):
        raise ValueError(
            f"dr_grpo's seq_norm={a.seq_norm} must equal max_completion_length "
            f"({max_completion_length}) in TRL"
        )
    if a.loss_options:
        raise ValueError(
            f"loss_options {dict(a.loss_options)} have no TRL equivalent here; PPO's dual clip "
            "is TRL's GRPOConfig(delta=...)"
        )
    eps_low, eps_high = _bounds(a)
    width = get_policy_loss(a.policy_loss).width or RATIO_WIDTH
    mapped = {
        "loss_type": _LOSS_TYPE[a.agg],
        "scale_rewards": _SCALE_REWARDS[a.advantage],
        "epsilon": float(eps_low),
        "epsilon_high": float(eps_high),
        "importance_sampling_level": _IS_LEVEL[a.policy_loss],
    }
    notes: list[str] = []
    if a.dynamic_sampling:
        notes.append(
            "DAPO's dynamic sampling is not available in TRL: groups with equal rewards stay in "
            "the batch with zero advantage (zero gradient; they still count in the token mean)"
        )
    overlong = None
    if a.overlong.enabled:
        max_len = int(max_completion_length)
        overlong = (max_len, max(1, min(int(a.overlong.cache_len), max_len // 4)))
    recipe_pacer = recipe_polarity = None
    if a.clip_rule == "pacer":
        from entropace.train.algorithms import get_recipe

        fields = dict(get_recipe(name).identity().get("pacer", {}))
        recipe_pacer = _merge_controller("pacer", a.pacer, pacer, PacerConfig, fields)
        if width.native:  # the pacer's own range; otherwise the loss's (GSPO's) own bounds
            mapped["epsilon"], mapped["epsilon_high"] = recipe_pacer.bounds0
    elif pacer is not None:
        raise ValueError(f"algorithm {name!r} has no pacer; pacer= applies to the eppo recipes")
    if a.papo:
        recipe_polarity = _merge_controller("polarity", a.polarity, polarity, PolarityConfig, {})
    elif polarity is not None:
        raise ValueError(f"algorithm {name!r} has no PAPO; polarity= applies to papo, eppo+papo")
    return TRLRecipe(
        name=name,
        trl_args={key: mapped[key] for key in REQUIRES[name]},
        pacer=recipe_pacer,
        polarity=recipe_polarity,
        advantage="rloo" if a.advantage == "rloo" else None,
        overlong=overlong,
        notes=tuple(notes),
        width=width,
    )


def apply_recipe(args: Any, recipe: TRLRecipe) -> list[tuple[str, Any, Any]]:
    """Make ``args`` (a ``GRPOConfig``) hold the fields the recipe needs; return the changes.

    A needed field (:data:`REQUIRES`) already at the recipe's value is left alone; one at TRL's
    default is set (logged at INFO; returned as ``(field, old, new)``); one the user set to
    another value is refused with a ValueError naming it (``epsilon_high=None`` counts as
    ``epsilon``, as in TRL). Every other field is the user's, untouched. The recipe's notes (where
    a TRL run differs from entropace's trainer) are shown as warnings.
    """
    defaults = type(args).__dataclass_fields__
    changes: list[tuple[str, Any, Any]] = []
    for key, value in recipe.trl_args.items():
        current = getattr(args, key)
        effective = args.epsilon if key == "epsilon_high" and current is None else current
        if effective == value:
            continue
        if current != defaults[key].default:
            hint = (
                "; the pacer sets the clip range: pass pacer={'eps0': ...} (and 'eps_high0') "
                "instead"
                if recipe.pacer is not None and key in ("epsilon", "epsilon_high")
                else f"; drop {key} from the GRPOConfig (the algorithm sets it) or pick another "
                "algorithm"
            )
            raise ValueError(
                f"algorithm={recipe.name!r} needs GRPOConfig.{key}={value!r}, but the GRPOConfig "
                f"sets {key}={current!r}{hint}"
            )
        setattr(args, key, value)
        changes.append((key, current, value))
    if changes:
        logger.info(
            "algorithm=%r set %s",
            recipe.name,
            ", ".join(f"GRPOConfig.{k}={new!r} (TRL's default {old!r})" for k, old, new in changes),
        )
    for note in recipe.notes:
        warnings.warn(f"algorithm={recipe.name!r}: {note}", stacklevel=3)
    return changes


def overlong_reward(max_len: int, cache_len: int) -> Callable[..., list[float]]:
    """DAPO's soft overlong penalty (:func:`entropace.algos.overlong_penalty`) as a TRL reward
    function of the completion lengths."""
    import torch

    from entropace.algos import overlong_penalty

    def entropace_overlong(completion_ids: list[list[int]], **_: Any) -> list[float]:
        lengths = torch.tensor([len(ids) for ids in completion_ids], dtype=torch.float32)
        return overlong_penalty(lengths, max_len=max_len, cache_len=cache_len).tolist()

    return entropace_overlong
