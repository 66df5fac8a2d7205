"""The driver-side EPPO / PAPO step logic on a verl batch (plain tensors, no Ray, no workers).

:class:`EntropaceHook` is the verl adapter of :class:`entropace.control.TaskStep` (the per-task
step our own trainer and the TRL plug-in drive too) and is called twice per training step by the
entropace trainer (:mod:`entropace.integrations.verl.trainer`), on padded ``DataProto`` batches:

1. :meth:`EntropaceHook.on_old_log_prob`, after verl's old-log-prob pass (``batch["entropy"]``,
   the sampling policy's per-token entropy at the rollout temperature, ``[B, T]``;
   ``batch["response_mask"]``; ``non_tensor_batch["data_source"]``, the task of each row):
   per-task sums (:func:`entropace.control.task_sums`) give the step's
   :class:`~entropace.control.StepSignals` (``h_k``, success, reward variance), the clip rule
   (EPPO's pacer) turns them into per-task bounds, and each response token of task ``k`` gets
   ``entropace_eps_low = eps_low_k``, ``entropace_eps_high = eps_high_k`` (``[B, T]``). PAPO's
   controller advances with the batch mean token entropy ``Hbar(s)``.
2. :meth:`EntropaceHook.on_advantages`, after verl's advantage estimator (``batch["advantages"]``
   ``[B, T]`` and ``batch["entropace_sensitivity"]``, ``S = t2 - t1`` of each response token
   from :mod:`entropace.integrations.verl.engine`): ``P = A S``, then
   ``A' = polarity_reweight(A, P, mask, w_plus, w_minus)`` (``docs/ALGORITHMS.md`` section 4).

Episode reward: ``sum_t token_level_scores`` (``rm_scores``) when present, else 0. Success: the
non-tensor field ``entropace_success`` when present (the entropace agent loop writes it), else
``reward > 0``.

Metrics: the TaskStep's (:mod:`entropace.control.task_step`), prefixed ``entropace/``: the same
names as entropace's trainer and the TRL plug-in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from entropace.control import ClipSettings, TaskStep
from entropace.integrations.verl.losses import BOUND_FIELDS, OPTIONS_FIELD, VERL_LOSS_MODES

__all__ = [
    "LOSS_RECIPES",
    "PREFIX",
    "SENSITIVITY_FIELD",
    "EntropaceHook",
    "HookSettings",
    "settings_from_config",
]

PREFIX = "entropace/"
#: Response-aligned batch field with PAPO's sensitivity ``S = t2 - t1`` of each token.
SENSITIVITY_FIELD = "entropace_sensitivity"
SUCCESS_FIELD = "entropace_success"
#: verl ``policy_loss.loss_mode`` -> the entropace recipe it runs (``entropace.algorithm``
#: overrides it, e.g. ``eppo-notrend``).
LOSS_RECIPES: dict[str, str] = {mode: spec.recipe for mode, spec in VERL_LOSS_MODES.items()}


@dataclass(frozen=True)
class HookSettings:
    """What the hook does, resolved from the verl config.

    Attributes:
        recipe: the entropace algorithm recipe (``eppo``, ``papo``, ``eppo+papo``, ...).
        clip_rule: ``pacer`` (per-task bounds written to the batch) or ``fixed`` (verl's own).
        papo: reweight the advantages by entropy polarity.
        clip: the rule's settings (``eps_low``/``eps_high`` = the widths verl's actor config
            gives the loss: its clip ratios, SAPO's ``tau_neg`` / ``tau_pos``, DRO's
            ``dro_beta``; the pacer's start for a width not native to it).
        polarity: PAPO controller config (used when ``papo``).
        loss_options: the policy loss's own options (validated), sent with the batch.
    """

    recipe: str
    clip_rule: str
    papo: bool
    clip: ClipSettings
    polarity: Any
    loss_options: Mapping[str, Any]


def _plain(value: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, DictConfig | ListConfig):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf comes with verl
        pass
    return value


def settings_from_config(config: Any) -> HookSettings:
    """Resolve :class:`HookSettings` from a verl trainer config (DictConfig or mapping).

    Reads ``actor_rollout_ref.actor.policy_loss.loss_mode`` (one of :data:`LOSS_RECIPES`),
    the loss's widths from the actor config (``clip_ratio{,_low,_high}``; SAPO's ``tau_neg`` /
    ``tau_pos``; DRO's ``policy_loss.dro_beta``) and the optional ``entropace`` section:
    ``algorithm`` (a recipe name) and ``options`` (nested overrides of the recipe, e.g.
    ``{"pacer": {"alpha": 0.5}, "polarity": {"lam": 0.3}}``), validated by
    :func:`entropace.train.algorithms.algorithm_config`, and ``seed`` (the run's seed, which
    seeds the shuffled-pacer control's permutations; default verl's ``data.seed``, 0 when that
    is null).

    Raises:
        ValueError: a loss_mode the entropace trainer does not drive, or a clip rule that needs
            the current policy every optimiser step (``bapo``: not available inside verl).
    """
    from entropace.train import algorithms

    actor = config["actor_rollout_ref"]["actor"]
    loss_mode = actor["policy_loss"]["loss_mode"]
    section = _plain(config.get("entropace", None) or {})
    if loss_mode not in LOSS_RECIPES:
        raise ValueError(
            f"trainer.v1.trainer_mode=entropace needs actor_rollout_ref.actor.policy_loss."
            f"loss_mode in {sorted(LOSS_RECIPES)}; got {loss_mode!r}"
        )
    recipe = section.get("algorithm") or LOSS_RECIPES[loss_mode]
    a = algorithms.algorithm_config(recipe, dict(section.get("options") or {}))
    mode = VERL_LOSS_MODES[loss_mode]
    if a.policy_loss != mode.loss:
        raise ValueError(
            f"entropace.algorithm={recipe!r} trains with policy loss {a.policy_loss!r}, but "
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r} runs "
            f"{mode.loss!r}; pick a matching loss_mode"
        )
    if a.clip_rule not in ("fixed", "pacer"):
        raise ValueError(
            f"entropace.algorithm={recipe!r} uses clip rule {a.clip_rule!r}, which needs the "
            "current policy at every optimiser step; the verl plug-in supports 'fixed' and "
            "'pacer'"
        )
    low, high = mode.widths(actor)
    width = algorithms.clip_settings(a).width  # the loss's (the PPO family's if it has none)
    seed = section.get("seed")
    if seed is None:  # verl's data.seed may be null (its default config)
        seed = _plain(config.get("data", None) or {}).get("seed")
    seed = 0 if seed is None else seed
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"entropace.seed (or data.seed) must be an int, got {seed!r}")
    settings = ClipSettings(
        eps_low=low, eps_high=high, pacer=a.pacer, bapo=a.bapo, width=width, seed=seed
    )
    bounds = (settings.eps_low, settings.eps_high)
    if a.clip_rule == "pacer" and width.native and bounds != a.pacer.bounds0:
        raise ValueError(
            f"entropace.algorithm={recipe!r} paces the clip range from pacer.eps0 / eps_high0 "
            f"{a.pacer.bounds0}, but actor_rollout_ref.actor.clip_ratio_low / clip_ratio_high "
            f"are ({settings.eps_low}, {settings.eps_high}); set the pacer's with "
            "entropace.options.pacer.eps0 (and eps_high0), or make the clip ratios equal to them"
        )
    return HookSettings(
        recipe=recipe,
        clip_rule=a.clip_rule,
        papo=bool(a.papo),
        clip=settings,
        polarity=a.polarity,
        loss_options={k: v for k, v in dict(a.loss_options).items() if k != "dual_clip"},
    )


class EntropaceHook:
    """The verl adapter of :class:`entropace.control.TaskStep` (see the module docstring)."""

    def __init__(self, settings: HookSettings) -> None:
        self.settings = settings
        self.step = TaskStep(
            None,  # the tasks are the data_source values, indexed as they first appear
            clip_rule=settings.clip_rule,
            clip=settings.clip,
            polarity=settings.polarity if settings.papo else None,
            recipe=settings.recipe,
        )
        self.metrics: dict[str, float] = {}

    @property
    def rule(self) -> Any:
        """The clip rule (EPPO's pacer, or fixed bounds)."""
        return self.step.rule

    @property
    def polarity(self) -> Any:
        """PAPO's controller (None without PAPO)."""
        return self.step.polarity

    @property
    def tasks(self) -> list[str]:
        """Every task seen, in first-seen order."""
        return self.step.tasks

    @property
    def writes_bounds(self) -> bool:
        """True when per-token bounds go into the batch (the pacer); False keeps verl's."""
        return self.settings.clip_rule != "fixed"

    @property
    def needs_sensitivity(self) -> bool:
        """True when the old-log-prob pass must also return ``S = t2 - t1`` (PAPO)."""
        return self.polarity is not None

    # ------------------------------------------------------------------------------- step 1
    def on_old_log_prob(self, data: Any, valid: Sequence[bool] | None = None) -> dict[str, float]:
        """Pace the clip range from this step's rollout and attach the per-token bounds.

        Args:
            data: a ``DataProto`` with ``batch["entropy"]`` and ``batch["response_mask"]``
                (``[B, T]``), ``non_tensor_batch["data_source"]`` (``[B]``); optional
                ``batch["token_level_scores"]`` / ``batch["rm_scores"]`` (``[B, T]``) and
                ``non_tensor_batch["entropace_success"]``.
            valid: ``[B]``, False on rows that are not episodes (verl's synthetic padding
                samples, which copy a real row's fields): they enter no statistic.

        Returns:
            the step's metrics so far, prefixed (also kept, unprefixed, in :attr:`metrics`).
            When the rule is the pacer, ``data.batch`` gains :data:`BOUND_FIELDS` (``[B, T]``,
            float32).
        """
        batch = data.batch
        entropy, mask = batch["entropy"], batch["response_mask"]
        if "data_source" not in data.non_tensor_batch:
            raise ValueError(
                "the entropace trainer needs each row's task in non_tensor_batch['data_source'] "
                "(the dataset's data_source column)"
            )
        task_ids = self.step.task_ids(list(data.non_tensor_batch["data_source"]))
        scores = None
        for key in ("token_level_scores", "rm_scores"):
            if key in batch.keys():
                scores = batch[key]
                break
        b = entropy.shape[0]
        rewards = (
            torch.zeros(b, dtype=torch.float64)
            if scores is None
            else scores.to(torch.float64).sum(-1).cpu()
        )
        if SUCCESS_FIELD in data.non_tensor_batch:
            success = torch.as_tensor(
                np.asarray(data.non_tensor_batch[SUCCESS_FIELD], dtype=np.float64)
            )
        else:
            success = (rewards > 0).to(torch.float64)
        rows = torch.arange(b)
        if valid is not None:
            keep = torch.as_tensor(np.asarray(valid, dtype=bool))
            if keep.shape != (b,):
                raise ValueError(
                    f"valid must have one entry per row ({b}); got {tuple(keep.shape)}"
                )
            rows = rows[keep]
        sums = self.step.sums(
            entropy.detach().cpu()[rows],
            mask.detach().cpu()[rows],
            rewards[rows],
            success[rows],
            task_ids[rows],
        )
        self.step.step(sums, abnormal=False)
        if self.writes_bounds:
            low, high = self.step.row_bounds(task_ids)  # [B, 1]
            shape = mask.shape
            batch[BOUND_FIELDS[0]] = low.expand(shape).contiguous().to(mask.device)
            batch[BOUND_FIELDS[1]] = high.expand(shape).contiguous().to(mask.device)
        self.metrics = self.step.metrics
        return self.prefixed(self.metrics)

    # ------------------------------------------------------------------------------- step 2
    def on_advantages(self, data: Any) -> dict[str, float]:
        """PAPO: reweight ``batch["advantages"]`` in place by entropy polarity
        (:meth:`entropace.control.TaskStep.reweight`).

        Args:
            data: a ``DataProto`` with ``batch["advantages"]``, ``batch["response_mask"]`` and
                ``batch["entropace_sensitivity"]`` (``[B, T]``).

        Returns:
            ``entropace/polarity/{pos_mass,neg_mass}`` (shares of ``sum |A|`` on ``P > 0`` /
            ``P < 0`` tokens, before reweighting). Nothing happens without PAPO.
        """
        if self.polarity is None:
            return {}
        batch = data.batch
        if SENSITIVITY_FIELD not in batch.keys():
            raise ValueError(
                f"PAPO needs batch[{SENSITIVITY_FIELD!r}] (S = t2 - t1 of each response token) "
                "from the old-log-prob pass; use the entropace trainer with an FSDP engine "
                "(entropace.integrations.verl.engine)"
            )
        adv, mask = batch["advantages"], batch["response_mask"]
        sens = batch[SENSITIVITY_FIELD].to(adv.device, adv.dtype)
        out, masses = self.step.reweight(adv, sens, mask)
        batch["advantages"] = out.to(adv.dtype)
        self.metrics = self.step.metrics
        return self.prefixed(masses)

    # ---------------------------------------------------------------------------- utilities
    @property
    def loss_options(self) -> dict[str, Any]:
        """Non-tensor batch entry sending the loss's options to the workers (``{}``: none)."""
        opts = dict(self.settings.loss_options)
        return {OPTIONS_FIELD: opts} if opts else {}

    @staticmethod
    def prefixed(metrics: Mapping[str, float]) -> dict[str, float]:
        return {f"{PREFIX}{k}": float(v) for k, v in metrics.items()}

    def state_dict(self) -> dict[str, Any]:
        """The controllers' state (:meth:`entropace.control.TaskStep.state_dict`), saved next
        to verl's checkpoint."""
        return self.step.state_dict()

    def load_state_dict(self, state: Any, source: str = "entropace verl state") -> None:
        """Restore :meth:`state_dict` output, validated (a
        :class:`~entropace.control.StateError` naming ``source`` otherwise)."""
        self.step.load_state_dict(state, source=source)

    def load_state_file(self, path: str) -> None:
        """:meth:`load_state_dict` of the JSON file ``path`` (errors name it)."""
        self.step.load_state_file(path)
