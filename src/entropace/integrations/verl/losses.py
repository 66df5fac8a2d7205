"""entropace's policy losses registered in verl's policy-loss registry.

verl 0.9.1 calls a registered policy loss (``verl.trainer.ppo.core_algos.register_policy_loss``)
from ``verl.workers.utils.losses.ppo_loss`` as::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
       rollout_is_weights) -> (loss, metrics)

with ``[B, T]`` response tensors (``T`` = the micro-batch's longest response), the actor's
``ActorConfig`` as ``config`` and verl's global-batch counts in ``config.global_batch_info``.
Registered names (``actor_rollout_ref.actor.policy_loss.loss_mode``):

- ``eppo``, ``papo``, ``eppo_papo``: the PPO clipped surrogate with dual clip
  (``docs/ALGORITHMS.md`` section 1), i.e. ``entropace.algos`` loss ``ppo``. EPPO's task-wise
  bounds and PAPO's reweighted advantages are computed by the driver
  (:mod:`entropace.integrations.verl.trainer`); the loss only reads them from the batch. The three
  names differ in what the entropace trainer does before the update (pace the clip range, reweight
  the advantages, or both), not in the loss.
- ``dcpo`` (arXiv 2509.02333) and ``ce_gppo`` (arXiv 2509.20712): verl 0.9.1 has neither.
- ``eppo_cispo``, ``eppo_gmpo``, ``eppo_sapo``, ``eppo_dppo_tv``, ``eppo_dppo_kl``, ``eppo_dro``:
  verl's ``cispo``, ``geo_mean``, ``sapo``, ``dppo_tv``, ``dppo_kl``, ``dro`` (entropace's
  :mod:`entropace.algos.trust_region_losses` / :mod:`~entropace.algos.pg_losses`, equal to
  verl's) with the widths EPPO's pacer sets per task (recipe ``eppo+<name>``).

Widths (:mod:`entropace.algos.widths`): when the batch carries per-token widths
(``entropace_eps_low`` / ``entropace_eps_high``, written by the entropace trainer, made current
by :class:`EntropaceLossFn`), token ``t`` gets them (the PPO family's clip range
``[1 - eps_low_t, 1 + eps_high_t]``; GMPO's log-ratio bounds, DPPO's thresholds, SAPO's
``(tau_neg, tau_pos)``, DRO's ``beta`` in their own units); otherwise every token gets verl's
own: ``config.clip_ratio_low`` / ``config.clip_ratio_high`` (each falling back to
``config.clip_ratio``), SAPO's ``config.tau_neg`` / ``config.tau_pos``, DRO's
``config.policy_loss.dro_beta``, and each loss equals verl's (``eppo`` is exactly ``vanilla``).
Dual clip (PPO family) and DPPO's importance-weight cap: ``config.clip_ratio_c`` (DPPO: read
as verl does, ``config.get("clip_ratio_c", 20.0)``). SAPO and GMPO aggregate as verl fixes
them: ``seq-mean-token-mean`` (verl's GMPO takes a plain mean over the micro-batch's rows,
ignoring its global counts; ours divides by verl's ``global_batch_size``, so it is the same
on one micro-batch without fully masked rows and invariant to micro-batching otherwise).

Aggregation: every verl mode is a per-row-weighted sum of the token losses, so the loss is our
loss with LOCAL counts (whose metrics are then local means, as verl's metric reduction expects)
times one scalar that turns the local normaliser into verl's global one (``dp_size``,
``batch_num_tokens``, ``global_batch_size``, ``loss_scale_factor``); see :func:`verl_agg_factor`.

Rollout-correction weights ``w_t >= 0`` (verl multiplies the token losses by them) are folded into
the advantages where the token loss is positively homogeneous in ``A`` (``L(w A) = w L(A)`` for
``w >= 0``: the clip flags depend only on the sign of ``A``): the PPO family, CISPO, SAPO, DPPO.
DRO (whose penalty does not scale with ``A``) takes them as behaviour weights (``w_t L_t``,
verl's product); GMPO refuses them (verl folds them into its sequence ratio by a geometric mean,
a form of its own).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from entropace import algos

__all__ = [
    "BOUND_FIELDS",
    "LOSS_NAMES",
    "VERL_LOSS_MODES",
    "EntropaceLossFn",
    "TokenBounds",
    "VerlLossMode",
    "current_bounds",
    "policy_loss",
    "register_losses",
    "token_bounds",
    "verl_agg_factor",
]

#: Batch fields (response-aligned, like ``advantages``) carrying the per-token clip bounds.
BOUND_FIELDS: tuple[str, str] = ("entropace_eps_low", "entropace_eps_high")
#: Non-tensor batch field with the loss's own options (``{"r_max": 10.0}`` for DCPO, ...).
OPTIONS_FIELD = "entropace_loss_options"


def _config_bounds(config: Any) -> tuple[float, float]:
    clip = config.get("clip_ratio", 0.2)
    low = config.get("clip_ratio_low", None)
    high = config.get("clip_ratio_high", None)
    return float(clip if low is None else low), float(clip if high is None else high)


def _sapo_widths(config: Any) -> tuple[float, float]:
    return float(config.get("tau_neg", 1.05)), float(config.get("tau_pos", 1.0))


def _dro_widths(config: Any) -> tuple[float, float]:
    policy_loss = config.get("policy_loss", None)
    beta = None if policy_loss is None else policy_loss.get("dro_beta", None)
    if beta is None or not float(beta) > 0:  # as verl
        raise ValueError("policy_loss.dro_beta must be a positive value when using DRO")
    return float(beta), float(beta)


def _dual_clip(config: Any) -> dict[str, Any]:
    return {"dual_clip": float(config.get("clip_ratio_c", 3.0))}


def _ratio_cap(config: Any) -> dict[str, Any]:
    return {"ratio_cap": float(config.get("clip_ratio_c", 20.0))}  # verl's dppo default


def _no_options(config: Any) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class VerlLossMode:
    """One entropace ``loss_mode`` in verl: which entropace loss and recipe it runs and how it
    reads verl's actor config.

    Attributes:
        loss: the ``entropace.algos`` policy loss.
        recipe: the recipe the entropace trainer runs for it (``entropace.algorithm`` may name
            another with the same loss).
        widths: ``config -> (low, high)``: the widths verl's config gives every token.
        options: ``config -> {option: value}``: the loss options verl's config sets (they win
            over the recipe's).
        agg: the aggregation verl fixes for the loss (None: ``loss_agg_mode``).
        weights: how rollout-correction weights enter: ``"fold"`` into the advantages,
            ``"behaviour"`` (``w_t L_t``), ``"refuse"``.
    """

    loss: str
    recipe: str
    widths: Callable[[Any], tuple[float, float]] = _config_bounds
    options: Callable[[Any], dict[str, Any]] = _no_options
    agg: str | None = None
    weights: str = "fold"


#: verl loss_mode -> :class:`VerlLossMode` (the one table of the verl losses).
VERL_LOSS_MODES: dict[str, VerlLossMode] = {
    "eppo": VerlLossMode("ppo", "eppo", options=_dual_clip),
    "papo": VerlLossMode("ppo", "papo", options=_dual_clip),
    "eppo_papo": VerlLossMode("ppo", "eppo+papo", options=_dual_clip),
    "dcpo": VerlLossMode("dcpo", "dcpo", options=_dual_clip),
    "ce_gppo": VerlLossMode("ce_gppo", "ce_gppo", options=_dual_clip),
    "eppo_cispo": VerlLossMode("cispo", "eppo+cispo"),
    "eppo_gmpo": VerlLossMode("gmpo", "eppo+gmpo", agg="seq-mean-token-mean", weights="refuse"),
    "eppo_sapo": VerlLossMode("sapo", "eppo+sapo", widths=_sapo_widths,
                              agg="seq-mean-token-mean"),
    "eppo_dppo_tv": VerlLossMode("dppo_tv", "eppo+dppo_tv", options=_ratio_cap),
    "eppo_dppo_kl": VerlLossMode("dppo_kl", "eppo+dppo_kl", options=_ratio_cap),
    "eppo_dro": VerlLossMode("dro", "eppo+dro", widths=_dro_widths, weights="behaviour"),
}  # fmt: skip

#: verl loss_mode -> entropace.algos policy loss.
LOSS_NAMES: dict[str, str] = {mode: spec.loss for mode, spec in VERL_LOSS_MODES.items()}


@dataclass(frozen=True)
class TokenBounds:
    """Per-token clip bounds of one micro-batch, ``[B, T]`` each, and the loss options."""

    eps_low: Tensor | None
    eps_high: Tensor | None
    options: Mapping[str, Any]


_CURRENT: contextvars.ContextVar[TokenBounds | None] = contextvars.ContextVar(
    "entropace_verl_bounds", default=None
)


def current_bounds() -> TokenBounds | None:
    """The bounds made current by :func:`token_bounds` (None outside it)."""
    return _CURRENT.get()


@contextmanager
def token_bounds(bounds: TokenBounds | None) -> Iterator[None]:
    """Make ``bounds`` current for the policy losses called inside the block."""
    token = _CURRENT.set(bounds)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def _count(value: Any) -> float | None:
    if value is None:
        return None
    return float(value.item() if isinstance(value, Tensor) else value)


def verl_agg_factor(
    loss_agg_mode: str, mask: Tensor, info: Mapping[str, Any]
) -> tuple[str, float | None, Tensor]:
    """How verl's aggregation ``loss_agg_mode`` maps onto ours, with local counts.

    Args:
        loss_agg_mode: one of verl's five modes.
        mask: ``[B, T]`` response mask of the micro-batch.
        info: ``config.global_batch_info`` (``dp_size``, ``batch_num_tokens``,
            ``global_batch_size``, ``loss_scale_factor``; absent or None = local).

    Returns:
        ``(agg, seq_norm, factor)``: verl's loss equals ``factor`` times our loss aggregated
        with ``agg`` / ``seq_norm`` over the local counts. With ``n`` masked tokens, ``s``
        sequences holding one (ours divide by ``max(n, 1)`` / ``max(s, 1)``) and ``dp`` ranks:

        - ``token-mean``: ``sum / N * dp`` -> ``max(n, 1) dp / N`` (``N`` = global tokens, or n)
        - ``token-sum``: ``sum * dp`` -> ``max(n, 1) dp``
        - ``seq-mean-token-mean`` / ``-token-sum`` / ``-token-sum-norm``: ``max(s, 1) dp / S``
          (``S`` = global sequences, or s); ``-token-sum`` is ``-token-sum-norm`` with norm 1,
          ``-token-sum-norm`` divides by ``loss_scale_factor`` (default ``T``, as verl).

    Raises:
        ValueError: an unknown mode, or ``dp_size > 1`` without the global count (as verl).
    """
    m = mask.to(torch.float64)
    n = m.sum()
    s = (m.sum(-1) > 0).to(torch.float64).sum()
    dp = _count(info.get("dp_size")) or 1.0
    if loss_agg_mode in ("token-mean", "token-sum"):
        local = n.clamp_min(1.0)
        if loss_agg_mode == "token-sum":
            return "token-mean", None, local * dp
        total = _count(info.get("batch_num_tokens"))
        if total is None:
            if dp > 1:
                raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
            total_t = n
        else:
            total_t = n.new_tensor(total)
        return "token-mean", None, local * dp / total_t.clamp_min(1e-30)
    seq_modes = {
        "seq-mean-token-mean": ("seq-mean-token-mean", None),
        "seq-mean-token-sum": ("seq-mean-token-sum-norm", 1.0),
        "seq-mean-token-sum-norm": (
            "seq-mean-token-sum-norm",
            _count(info.get("loss_scale_factor")) or float(mask.shape[-1]),
        ),
    }
    if loss_agg_mode not in seq_modes:
        raise ValueError(
            f"unknown loss_agg_mode {loss_agg_mode!r}; verl's modes: token-mean, token-sum, "
            f"{', '.join(seq_modes)}"
        )
    agg, seq_norm = seq_modes[loss_agg_mode]
    total = _count(info.get("global_batch_size"))
    if total is None:
        if dp > 1:
            raise ValueError("global_batch_size is required when dp_size > 1")
        total_t = s
    else:
        total_t = s.new_tensor(total)
    return agg, seq_norm, s.clamp_min(1.0) * dp / total_t.clamp_min(1e-30)


def _check_bound(t: Tensor, ref: Tensor, name: str) -> Tensor:
    if tuple(t.shape) != tuple(ref.shape):
        raise ValueError(
            f"{name}: per-token bounds of shape {tuple(t.shape)} do not match the response "
            f"tensors {tuple(ref.shape)}; they must be stored response-aligned like 'advantages'"
        )
    return t.to(device=ref.device, dtype=ref.dtype)


def _local_metrics(
    log_ratio: Tensor, mask: Tensor, flags: Mapping[str, Tensor]
) -> dict[str, float]:
    """verl's ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/pg_clipfrac_lower`` as local means.

    From the loss's own flags (where its width binds, whatever its bounds): ``pg_clipfrac`` is
    ``clip_frac_low | clip_frac_high`` (verl's PPO: ``-A clip(r) > -A r``; its CISPO: the weight
    clipped; its DPPO: invalid tokens), ``pg_clipfrac_lower`` the dual clip (verl: ``A < 0`` and
    the PPO term above ``-c A``) or DPPO's truncated weight, ``ppo_kl`` the mean of
    ``log pi_old - log pi``. verl reports 0 for SAPO's and GMPO's counts its own way; ours are
    the loss's flags (:mod:`entropace.algos.trust_region_losses`).
    """
    with torch.no_grad():
        m = mask.to(log_ratio.dtype)
        denom = m.sum().clamp_min(1.0)
        none = torch.zeros_like(mask, dtype=torch.bool)
        clipped = flags.get("clip_frac_low", none) | flags.get("clip_frac_high", none)
        dual = flags.get("dual_clip_frac", none) | flags.get("truncated_frac", none)
        return {
            "actor/pg_clipfrac": float((clipped.to(m.dtype) * m).sum() / denom),
            "actor/ppo_kl": float((-log_ratio * m).sum() / denom),
            "actor/pg_clipfrac_lower": float((dual.to(m.dtype) * m).sum() / denom),
        }


def run_entropace_loss(
    name: str,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float | Tensor,
    eps_high: float | Tensor,
    agg: str,
    seq_norm: float | None,
    options: Mapping[str, Any],
    behaviour_weights: Tensor | None = None,
) -> Any:
    """Call ``entropace.algos`` loss ``name`` (local counts) with its validated options."""
    spec = algos.get_policy_loss(name)
    inputs = algos.LossInputs(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        eps_low=eps_low,
        eps_high=eps_high,
        agg=agg,
        seq_norm=seq_norm,
        behaviour_weights=behaviour_weights,
    )
    return spec(inputs, spec.make_config(dict(options)))


def policy_loss(
    name: str,
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    """The verl-facing loss ``name`` (a key of :data:`VERL_LOSS_MODES`); see the module docstring.

    Returns:
        ``(loss, metrics)``: the 0-dim loss to back-propagate and float metrics (verl's names
        plus ``entropace/<metric>`` from our loss: ``clip_frac_low``, ``clip_frac_high``,
        ``dual_clip_frac``, ``ratio_mean``, ``approx_kl``, ... and ``eps_low_mean`` /
        ``eps_high_mean``).
    """
    if config is None:
        raise ValueError(f"policy loss {name!r}: verl passes the actor config; got None")
    if name not in VERL_LOSS_MODES:
        raise KeyError(f"unknown entropace verl loss {name!r}; known: {sorted(VERL_LOSS_MODES)}")
    mode = VERL_LOSS_MODES[name]
    mask = response_mask.bool()
    current = current_bounds()
    eps_low: float | Tensor
    eps_high: float | Tensor
    eps_low, eps_high = mode.widths(config)
    options: dict[str, Any] = {}
    if current is not None:
        if current.eps_low is not None:
            eps_low = _check_bound(current.eps_low, log_prob, "entropace_eps_low")
        if current.eps_high is not None:
            eps_high = _check_bound(current.eps_high, log_prob, "entropace_eps_high")
        options = dict(current.options)
    adv, weights = advantages, None
    if rollout_is_weights is not None:
        if mode.weights == "refuse":
            raise ValueError(
                f"policy loss {name!r} does not take verl's rollout-correction weights (verl's "
                "geo_mean folds them into its sequence ratio by a geometric mean); turn "
                "algorithm.rollout_correction off or use another loss_mode"
            )
        if mode.weights == "fold":
            adv = advantages * rollout_is_weights
        else:
            weights = rollout_is_weights.to(log_prob.dtype) * mask
    info = getattr(config, "global_batch_info", None) or {}
    agg, seq_norm, factor = verl_agg_factor(mode.agg or loss_agg_mode, mask, info)
    out = run_entropace_loss(
        mode.loss,
        log_prob,
        old_log_prob,
        adv,
        mask,
        eps_low=eps_low,
        eps_high=eps_high,
        agg=agg,
        seq_norm=seq_norm,
        options={**options, **mode.options(config)},
        behaviour_weights=weights,
    )
    loss = out.loss * factor.to(out.loss.dtype)
    log_ratio = torch.where(mask, log_prob.detach() - old_log_prob.detach(), 0.0).clamp(-20, 20)
    low_t = torch.as_tensor(eps_low, dtype=log_ratio.dtype, device=log_ratio.device)
    high_t = torch.as_tensor(eps_high, dtype=log_ratio.dtype, device=log_ratio.device)
    metrics: dict[str, Any] = _local_metrics(log_ratio, mask, out.flags)
    m = mask.to(log_ratio.dtype)
    denom = m.sum().clamp_min(1.0)
    metrics["entropace/eps_low_mean"] = float((low_t.expand_as(m) * m).sum() / denom)
    metrics["entropace/eps_high_mean"] = float((high_t.expand_as(m) * m).sum() / denom)
    for key, value in out.metrics.items():
        if key not in ("ratio_min", "ratio_max"):
            metrics[f"entropace/{key}"] = float(value)
    return loss, metrics


def _make(name: str) -> Callable[..., tuple[Tensor, dict[str, Any]]]:
    def loss_fn(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        return policy_loss(
            name,
            old_log_prob,
            log_prob,
            advantages,
            response_mask,
            loss_agg_mode,
            config,
            rollout_is_weights,
        )

    loss_fn.__name__ = f"entropace_{name}_policy_loss"
    loss_fn.__qualname__ = loss_fn.__name__
    loss_fn.__doc__ = f"entropace's {name!r} policy loss for verl (see {__name__})."
    return loss_fn


#: The registered functions, by verl loss_mode.
VERL_LOSSES: dict[str, Callable[..., tuple[Tensor, dict[str, Any]]]] = {
    name: _make(name) for name in VERL_LOSS_MODES
}


def register_losses() -> list[str]:
    """Register every loss of :data:`VERL_LOSS_MODES` with verl; returns the names registered.

    A name verl already has (a future verl that ships its own ``dcpo``, say) is left to verl.
    """
    from verl.trainer.ppo import core_algos

    registered = []
    for name, fn in VERL_LOSSES.items():
        existing = core_algos.POLICY_LOSS_REGISTRY.get(name)
        if existing is not None and existing is not fn:
            if getattr(existing, "__module__", "") != __name__:
                continue
        core_algos.register_policy_loss(name)(fn)
        registered.append(name)
    return registered


# ---------------------------------------------------------------------------------------------
# The actor's loss function: reads the per-token bounds from the batch, then runs verl's own
# ppo_loss (entropy bonus, KL loss, metrics) with those bounds current.
# ---------------------------------------------------------------------------------------------


def _padded(data: Any, name: str) -> Tensor | None:
    if name not in data.keys():
        return None
    value = data[name]
    if getattr(value, "is_nested", False):
        return value.to_padded_tensor(0.0)
    return value


class EntropaceLossFn:
    """Wraps the actor's loss function (verl's ``ppo_loss`` partial) in the training worker.

    Called by the engine as ``loss_fn(model_output=..., data=..., dp_group=...)`` per micro-batch.
    If the micro-batch holds :data:`BOUND_FIELDS` (response-aligned nested tensors, as the
    entropace trainer writes them), they are padded like verl pads ``old_log_probs`` and made
    current for the policy loss; then the wrapped function runs unchanged.
    """

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.inner = inner

    def bounds_of(self, data: Any) -> TokenBounds | None:
        """The :class:`TokenBounds` of micro-batch ``data`` (a TensorDict), or None."""
        low = _padded(data, BOUND_FIELDS[0])
        high = _padded(data, BOUND_FIELDS[1])
        options: Mapping[str, Any] = {}
        if OPTIONS_FIELD in data.keys():
            from verl.utils import tensordict_utils as tu

            options = tu.get_non_tensor_data(data=data, key=OPTIONS_FIELD, default={}) or {}
        if low is None and high is None and not options:
            return None
        return TokenBounds(eps_low=low, eps_high=high, options=dict(options))

    def __call__(self, model_output: Any, data: Any, dp_group: Any = None) -> Any:
        with token_bounds(self.bounds_of(data)):
            return self.inner(model_output=model_output, data=data, dp_group=dp_group)
