"""Registry of policy losses: typed inputs, one validated config per loss (prime-rl's shape).

Every registered loss is a :class:`PolicyLoss` entry, called as::

    spec = get_policy_loss("ppo")
    out = spec(LossInputs(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28,
                          agg="token-mean"), spec.make_config({"dual_clip": 3.0}))

- :class:`LossInputs` holds the per-token tensors (``[B, T]``; advantages ``[B]`` or ``[B, T]``),
  the trust-region widths ``eps_low`` / ``eps_high`` in the loss's own units (floats or tensors
  broadcastable to ``[B, T]``: per task, per trajectory or per token; ``None`` means the
  loss's defaults: :attr:`PolicyLoss.default_bounds`, or its width options), the aggregation
  (:func:`entropace.algos.aggregate_loss`), an optional random generator and optional
  behaviour importance weights (AReaL's decoupled objective, :mod:`entropace.algos.decoupled`).
- Each loss has its own frozen config dataclass (``spec.config_cls``) whose ``__post_init__``
  validates the options, so a trainer can check ``loss_options`` when its config loads.
- The entry declares what a caller needs to know about the loss: its default bounds (``None``
  for a loss without a clip), its trust-region width (:class:`entropace.algos.widths.TrustWidth`:
  what ``eps_low`` / ``eps_high`` mean for it and how EPPO's pace moves them; ``None``: no
  width, the pacer cannot compose with it), whether zero advantages give exactly zero loss and
  gradient (``advantage_weighted``), whether it draws random numbers (``uses_generator``), whether
  each trajectory's loss depends on that trajectory alone (``row_local``), whether it takes
  behaviour importance weights (``decoupled``).

Registered names: ``ppo`` (GRPO, Dr.GRPO, DAPO, RLOO, BAPO, EPPO all use it, with their own
bounds / aggregation), ``gspo``, ``clip_cov``, ``kl_cov``, ``dcpo``, ``ce_gppo`` (``ppo`` and
``ce_gppo`` take AReaL's behaviour weights, ``decoupled=True``), and, in their own modules,
verl's trust regions ``cispo``, ``gmpo``, ``sapo``, ``dppo_tv``, ``dppo_kl``
(:mod:`entropace.algos.trust_region_losses`) and ``dro``, ``gpg``
(:mod:`entropace.algos.pg_losses`); add one with
``@register_policy_loss("name", config=MyConfig, default_bounds=(0.2, 0.2))``.

No loss checks for NaN/inf (a host sync per call): the trainer checks the loss once per step and
skips non-finite steps. Masked-out positions never influence the loss or the gradients.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from entropace.algos.aggregation import Count, resolve_count
from entropace.algos.limits import CE_GPPO_BETA_MAX, F32_MAX, KL_COEF_MAX, RATIO_MAX
from entropace.algos.options import build_options
from entropace.algos.surrogate import (
    LOG_RATIO_CLAMP,
    Bound,
    LossOutput,
    TokenInputs,
    apply_dual_clip,
    as_bound,
    check_dual_clip,
    clip_bounds,
    clipped_surrogate_loss,
    finish_loss,
    ppo_clip_token_loss,
    prepare_token_inputs,
)
from entropace.algos.widths import RATIO_WIDTH, TrustWidth

__all__ = [
    "POLICY_LOSSES",
    "CEGPPOLossConfig",
    "ClipCovLossConfig",
    "DCPOLossConfig",
    "GSPOLossConfig",
    "KLCovLossConfig",
    "LossInputs",
    "PPOLossConfig",
    "PolicyLoss",
    "dcpo_bounds",
    "get_policy_loss",
    "register_policy_loss",
]


@dataclass(frozen=True)
class LossInputs:
    """What every policy loss consumes.

    Attributes:
        logprobs: ``[B, T]`` ``log pi(y_t)`` under the current policy (differentiable).
        old_logprobs: ``[B, T]`` ``log pi_old(y_t)`` of the sampling policy.
        advantages: ``[B]`` (one per trajectory) or ``[B, T]``.
        mask: ``[B, T]`` 0/1 loss mask (bool or float).
        eps_low, eps_high: the loss's trust-region widths in its own units
            (:attr:`PolicyLoss.width`): ratio bounds ``[1 - eps_low, 1 + eps_high]`` for the
            PPO family, GMPO's log-ratio bounds, DPPO's divergence thresholds, SAPO's
            temperatures ``(tau_neg, tau_pos)``, DRO's penalties; floats or tensors
            broadcastable to ``[B, T]`` (0-dim, ``[B, 1]`` per trajectory / task, ``[B, T]``
            per token). ``None``: the loss's default bounds, or its width options. Ignored by
            losses without a width.
        agg, num_tokens, num_seqs, seq_norm: see :func:`entropace.algos.aggregate_loss`; pass the
            global counts of a mini-batch when accumulating over micro-batches.
        generator: random source of losses with ``uses_generator`` (Clip-Cov's token pick).
        behaviour_weights: ``[B, T]`` detached per-token weights multiplying each token's loss
            term: AReaL's decoupled objective (arXiv 2505.24298), where ``old_logprobs`` is
            then the PROXIMAL policy's and the weights ``pi_prox / pi_behav`` (0 where capped;
            :func:`entropace.algos.decoupled.behaviour_importance_weights`). ``None``: no
            weights (``old_logprobs`` is the behaviour policy's). Only losses registered with
            ``decoupled=True`` accept them.
    """

    logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    mask: Tensor
    eps_low: Bound | None = None
    eps_high: Bound | None = None
    agg: str = "token-mean"
    num_tokens: Count | None = None
    num_seqs: Count | None = None
    seq_norm: Count | None = None
    generator: torch.Generator | None = None
    behaviour_weights: Tensor | None = None

    def aggregation(self) -> dict[str, Any]:
        """The keyword arguments of :func:`entropace.algos.surrogate.finish_loss`."""
        return {
            "agg": self.agg,
            "num_tokens": self.num_tokens,
            "num_seqs": self.num_seqs,
            "seq_norm": self.seq_norm,
        }


LossFn = Callable[[LossInputs, Any], LossOutput]


@dataclass(frozen=True)
class PolicyLoss:
    """One registered policy loss.

    Attributes:
        name: registry key.
        fn: ``fn(inputs, config) -> LossOutput``; ``inputs`` has its bounds filled in.
        config_cls: the loss's frozen config dataclass (validates in ``__post_init__``).
        default_bounds: ``(eps_low, eps_high)`` when ``LossInputs`` gives none; ``None`` for a
            loss without a clip (its bounds are ignored) or whose widths are config options.
        width: the loss's :class:`~entropace.algos.widths.TrustWidth` (what its bounds mean
            and how EPPO's pace moves them); ``None``: no trust-region width (GPG, KL-Cov).
        advantage_weighted: every loss term is a multiple of ``A_t``, so all-zero advantages
            give exactly zero loss and gradient (a trainer may skip the passes).
        uses_generator: the loss draws random numbers from ``LossInputs.generator``.
        row_local: given the global counts ``num_tokens`` / ``num_seqs`` (and ``seq_norm``),
            each row's (trajectory's) loss terms and their gradients depend only on that row's
            tensors: never on the other rows of the call (no statistic, ranking or top-k across
            rows) nor on a random draw. The loss of a micro-batch is then the sum of the losses
            of its rows evaluated one by one with the same counts, so a trainer may drop rows
            that contribute nothing (all-zero advantages of an ``advantage_weighted`` loss) or
            regroup rows into other micro-batches without changing the loss or any gradient
            (``ppo.skip_inert``). Default False (the safe value: nothing is dropped); set it
            only for a loss whose code was checked (``tests/test_skip_inert.py`` checks every
            registered loss that claims it by brute force).
        decoupled: the loss accepts ``LossInputs.behaviour_weights`` (AReaL's decoupled
            objective: each token's term times its detached weight, the clip taken against
            ``old_logprobs`` = the proximal policy); with all weights 1 the loss is the plain
            one. Losses without it refuse the weights (``ppo.decoupled`` is refused at load).
    """

    name: str
    fn: LossFn
    config_cls: type
    default_bounds: tuple[float, float] | None
    advantage_weighted: bool = True
    uses_generator: bool = False
    row_local: bool = False
    decoupled: bool = False
    width: TrustWidth | None = None

    def make_config(self, options: Mapping[str, Any] | None = None) -> Any:
        """The validated config from plain options; ``ValueError`` naming the bad option."""
        return build_options(f"policy loss {self.name!r}", self.config_cls, options)

    def __call__(self, inputs: LossInputs, config: Any | None = None) -> LossOutput:
        """Compute the loss; ``config`` defaults to ``config_cls()``."""
        cfg = self.config_cls() if config is None else config
        if not isinstance(cfg, self.config_cls):
            raise TypeError(
                f"policy loss {self.name!r} takes a {self.config_cls.__name__}; "
                f"got {type(cfg).__name__}"
            )
        if inputs.behaviour_weights is not None and not self.decoupled:
            raise ValueError(
                f"policy loss {self.name!r} does not take behaviour importance weights "
                "(ppo.decoupled); losses that do: "
                f"{sorted(n for n, s in POLICY_LOSSES.items() if s.decoupled)}"
            )
        defaults = self.default_bounds
        if self.width is not None and self.width.options is not None:
            defaults = self.width.option_widths(cfg)
        if defaults is not None and (inputs.eps_low is None or inputs.eps_high is None):
            lo, hi = defaults
            inputs = dataclasses.replace(
                inputs,
                eps_low=lo if inputs.eps_low is None else inputs.eps_low,
                eps_high=hi if inputs.eps_high is None else inputs.eps_high,
            )
        return self.fn(inputs, cfg)


POLICY_LOSSES: dict[str, PolicyLoss] = {}

_RATIO = object()  # ``width`` not given: the PPO family's ratio bounds when there are bounds


def register_policy_loss(
    name: str,
    *,
    config: type,
    default_bounds: tuple[float, float] | None,
    advantage_weighted: bool = True,
    uses_generator: bool = False,
    row_local: bool = False,
    decoupled: bool = False,
    width: Any = _RATIO,
) -> Callable[[LossFn], LossFn]:
    """Decorator adding ``fn(inputs, config) -> LossOutput`` to :data:`POLICY_LOSSES`
    (the keyword arguments are the :class:`PolicyLoss` attributes; ``row_local`` and
    ``decoupled`` default to the safe False; ``width`` defaults to the PPO family's ratio
    bounds for a loss with ``default_bounds``, else to None)."""
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"policy loss {name!r}: config must be a dataclass, got {config!r}")
    if width is _RATIO:
        width = RATIO_WIDTH if default_bounds is not None else None
    if width is not None:
        fields = {f.name for f in dataclasses.fields(config)}
        if width.options is not None and not set(width.options) <= fields:
            raise ValueError(f"policy loss {name!r}: width options {width.options} not in {config}")
        if (width.options is None) != (default_bounds is not None):
            raise ValueError(
                f"policy loss {name!r}: a width is either bounds (with default_bounds) or "
                "config options (without)"
            )

    def decorator(fn: LossFn) -> LossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = PolicyLoss(
            name, fn, config, default_bounds, advantage_weighted, uses_generator, row_local,
            decoupled, width,
        )  # fmt: skip
        return fn

    return decorator


def get_policy_loss(name: str) -> PolicyLoss:
    """The registered loss ``name``; ``KeyError`` listing the known names otherwise."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise KeyError(f"unknown policy loss {name!r}; known: {sorted(POLICY_LOSSES)}") from None


# --------------------------------------------------------------------------------------------
# Config validation helpers
# --------------------------------------------------------------------------------------------


def _check_range(
    name: str, value: Any, lo: float, hi: float, *, lo_open: bool = False, why: str = ""
) -> None:
    """``ValueError`` naming ``name`` and the range unless ``value`` is a number in it (the
    ranges: :mod:`entropace.algos.limits`); ``why`` is appended."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and (lo < value if lo_open else lo <= value) and value <= hi
    if not ok:
        bracket = "(" if lo_open else "["
        note = f" ({why})" if why else ""
        raise ValueError(
            f"{name} must be a number in {bracket}{lo:.3g}, {hi:.3g}]; got {value!r}{note}"
        )


#: Why a ratio threshold stops at ``R = e^20``: no ratio is larger.
_NO_RATIO_ABOVE = "the ratio is at most e^20 (its log is clamped to 20); null for none"


def _check_dual(value: Any) -> None:
    """The dual-clip constant: null or in ``(1, e^20]`` (it binds where ``r > c``)."""
    if value is not None:
        _check_range("dual_clip", value, 1.0, RATIO_MAX, lo_open=True, why=_NO_RATIO_ABOVE)


# --------------------------------------------------------------------------------------------
# The losses
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PPOLossConfig:
    """``ppo``: ``dual_clip`` is the dual-clip constant ``c > 1`` (None disables it)."""

    dual_clip: float | None = 3.0

    def __post_init__(self) -> None:
        _check_dual(self.dual_clip)


def _behaviour_weighted(
    loss_mat: Tensor, flags: dict[str, Tensor], inputs: LossInputs, tok: TokenInputs
) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
    """Apply ``inputs.behaviour_weights`` (when given) to the per-token loss: ``w_t L_t``;
    adds the flag ``behaviour_capped_frac`` (masked-in tokens of weight 0: filtered by the cap)
    and the metric ``behaviour_weight_mean`` (mean ``w_t`` over masked tokens, the global
    token count as the other metrics)."""
    w = inputs.behaviour_weights
    if w is None:
        return loss_mat, flags, {}
    if w.shape != loss_mat.shape:
        raise ValueError(
            f"behaviour_weights must be [B, T] = {tuple(loss_mat.shape)}; got {tuple(w.shape)}"
        )
    w = torch.where(tok.mask, w.detach().to(loss_mat.dtype), loss_mat.new_zeros(()))
    flags = {**flags, "behaviour_capped_frac": tok.mask & (w == 0)}
    denom = resolve_count(inputs.num_tokens, tok.weight.sum())
    return loss_mat * w, flags, {"behaviour_weight_mean": w.sum() / denom}


def _finish(
    loss_mat: Tensor,
    tok: TokenInputs,
    ratio: Tensor,
    flags: dict[str, Tensor],
    inputs: LossInputs,
) -> LossOutput:
    """:func:`finish_loss` with the behaviour weights applied first (when given)."""
    loss_mat, flags, extra = _behaviour_weighted(loss_mat, flags, inputs, tok)
    out = finish_loss(loss_mat, tok, ratio, flags, **inputs.aggregation())
    out.metrics.update(extra)
    return out


@register_policy_loss(
    "ppo", config=PPOLossConfig, default_bounds=(0.2, 0.2), row_local=True, decoupled=True
)
def ppo_policy_loss(inputs: LossInputs, cfg: PPOLossConfig) -> LossOutput:
    """PPO clipped surrogate with dual clip; see :func:`entropace.algos.clipped_surrogate_loss`.

    Row-local: per token ``L_t`` reads only ``r_t``, ``A_t`` and that token's bounds.
    Decoupled (AReaL, arXiv 2505.24298; :mod:`entropace.algos.decoupled`): with
    ``inputs.behaviour_weights`` the ratio is taken against ``old_logprobs`` = the proximal
    policy and each token's term is multiplied by its weight ``w_t = pi_prox / pi_behav``
    (0 where capped): ``L_t = w_t max(-A r_t, -A clip(r_t))`` (then the dual clip, before the
    weight, as AReaL). All weights 1 give exactly the plain loss.

    Defaults: ``eps_low = eps_high = 0.2``, ``dual_clip = 3``. DAPO passes 0.2 / 0.28 and
    ``token-mean``; EPPO passes per-task tensors; BAPO its adaptive bounds.
    """
    if inputs.behaviour_weights is not None:
        check_dual_clip(cfg.dual_clip)
        tok = prepare_token_inputs(
            inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask
        )
        lower, upper = clip_bounds(inputs.eps_low, inputs.eps_high, tok.log_ratio)
        ratio = torch.exp(tok.log_ratio)
        loss_mat, flags = ppo_clip_token_loss(ratio, tok.advantages, lower, upper, cfg.dual_clip)
        return _finish(loss_mat, tok, ratio, flags, inputs)
    return clipped_surrogate_loss(
        inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask,
        eps_low=inputs.eps_low, eps_high=inputs.eps_high, dual_clip=cfg.dual_clip,
        **inputs.aggregation(),
    )  # fmt: skip


@dataclass(frozen=True)
class GSPOLossConfig:
    """``gspo``: dual clip off by default (the paper has none)."""

    dual_clip: float | None = None

    def __post_init__(self) -> None:
        _check_dual(self.dual_clip)


#: GSPO's bounds act on a sequence's geometric-mean ratio: the pacer scales its own bounds.
GSPO_WIDTH = TrustWidth("sequence-ratio bound", low_below_one=True)


@register_policy_loss(
    "gspo", config=GSPOLossConfig, default_bounds=(3e-4, 4e-4), row_local=True, width=GSPO_WIDTH
)
def gspo_policy_loss(inputs: LossInputs, cfg: GSPOLossConfig) -> LossOutput:
    """GSPO: the ratio is the sequence's geometric-mean ratio, clipped per sequence (arXiv 2507.18071).

    ``s_i = exp(mean_{t in y_i} log r_t)``; loss ``max(-A s_i, -A clip(s_i, 1 - eps_l, 1 + eps_h))``.
    Implemented in the paper's GSPO-token form: every token of sequence i gets the ratio
    ``s_it = sg(s_i) * pi(y_t) / sg(pi(y_t))`` (value ``s_i``), so per-token advantages are
    allowed; with a per-sequence advantage and ``agg="seq-mean-token-mean"`` (the paper's
    aggregation) value and gradient equal the sequence-level objective
    ``mean_i max(-A_i s_i, -A_i clip(s_i))``. The clip flags are those of the sequence ratio.

    The bounds act on a sequence ratio, which moves far less than a token ratio: the defaults are
    the paper's ``eps_low = 3e-4``, ``eps_high = 4e-4``. Bounds passed by the caller are used as
    they are, so a preset must not hand GSPO token-scale bounds such as 0.2 unless it means it.
    Row-local: ``s_i`` is a mean over row i's own tokens.
    """
    inputs_t = prepare_token_inputs(
        inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask
    )
    lower, upper = clip_bounds(inputs.eps_low, inputs.eps_high, inputs_t.log_ratio)
    lengths = inputs_t.weight.sum(-1).clamp_min(1.0)
    seq_log_ratio = inputs_t.log_ratio.detach().sum(-1) / lengths  # [B]
    token_log_ratio = seq_log_ratio[:, None] + inputs_t.logprobs - inputs_t.logprobs.detach()
    ratio = torch.exp(token_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    loss_mat, flags = ppo_clip_token_loss(ratio, inputs_t.advantages, lower, upper, cfg.dual_clip)
    return finish_loss(loss_mat, inputs_t, ratio, flags, **inputs.aggregation())


def _descending_rank(keys: Tensor) -> Tensor:
    """Rank of each entry of ``keys`` (any shape) in descending order, ties by flat index."""
    flat = keys.flatten()
    order = torch.argsort(flat, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(
        0, order, torch.arange(flat.numel(), device=flat.device)
    )
    return rank.view_as(keys)


def _token_covariance(inputs: TokenInputs) -> Tensor:
    """``cov_t = (log pi_t - mean log pi)(A_t - mean A)``, means over the masked tokens passed
    (Cui et al., arXiv 2505.22617). Detached ``[B, T]``; 0 where masked."""
    w = inputs.weight
    n = w.sum().clamp_min(1.0)
    lp = inputs.logprobs.detach()
    adv = inputs.advantages
    cov = (lp - (lp * w).sum() / n) * (adv - (adv * w).sum() / n)
    return cov * w


def _top_k_count(fraction: float, inputs: TokenInputs) -> Tensor:
    """``max(1, floor(fraction * N))`` with N the masked-token count, as a tensor (no sync)."""
    n = inputs.weight.sum().to(torch.float64)  # float64, as Python's int(fraction * n)
    return torch.floor(fraction * n).clamp_min(1.0)


@dataclass(frozen=True)
class ClipCovLossConfig:
    """``clip_cov``: fraction of tokens whose gradient is dropped, and the covariance window."""

    clip_ratio: float = 2e-4
    cov_lower: float = 1.0
    cov_upper: float = 5.0

    def __post_init__(self) -> None:
        _check_range("clip_ratio", self.clip_ratio, 0.0, 1.0, lo_open=True)
        for name in ("cov_lower", "cov_upper"):
            _check_range(name, getattr(self, name), -F32_MAX, F32_MAX)
        if not self.cov_lower <= self.cov_upper:
            raise ValueError(
                f"need cov_lower <= cov_upper; got {self.cov_lower} > {self.cov_upper}"
            )


@register_policy_loss(
    "clip_cov", config=ClipCovLossConfig, default_bounds=(0.2, 0.2), uses_generator=True
)
def clip_cov_policy_loss(inputs: LossInputs, cfg: ClipCovLossConfig) -> LossOutput:
    """Clip-Cov (Cui et al., "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617).

    PPO clip (no dual clip, as the reference implementation) plus: over the masked tokens passed
    (``N`` of them), ``cov_t = (log pi_t - mean log pi)(A_t - mean A)``; among tokens with
    ``cov_lower <= cov_t <= cov_upper`` whose PPO clip is not already binding, pick
    ``max(1, floor(clip_ratio * N))`` uniformly at random (``inputs.generator``) and drop their
    gradient (their loss value is kept, detached). Metric ``cov_drop_frac``: fraction of masked
    tokens dropped. Sync-free: the random pick is a rank cut on random keys.
    Not row-local: the means, the top-k count and the random pick span every row of the call.
    Defaults: ``eps 0.2 / 0.2``, ``clip_ratio 2e-4``, bounds ``[1, 5]``.
    """
    tok = prepare_token_inputs(inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask)
    lower, upper = clip_bounds(inputs.eps_low, inputs.eps_high, tok.log_ratio)
    ratio = torch.exp(tok.log_ratio)
    loss_mat, flags = ppo_clip_token_loss(ratio, tok.advantages, lower, upper, None)
    del flags["dual_clip_frac"]
    cov = _token_covariance(tok)
    already_clipped = flags["clip_frac_low"] | flags["clip_frac_high"]
    eligible = tok.mask & ~already_clipped & (cov >= cfg.cov_lower) & (cov <= cfg.cov_upper)
    generator = inputs.generator
    gen_device = generator.device if generator is not None else cov.device
    keys = torch.rand(cov.shape, generator=generator, device=gen_device).to(cov.device)
    keys = torch.where(eligible, keys, torch.full_like(keys, -1.0))
    drop = eligible & (_descending_rank(keys) < _top_k_count(cfg.clip_ratio, tok))
    loss_mat = torch.where(drop, loss_mat.detach(), loss_mat)
    flags["cov_drop_frac"] = drop
    return finish_loss(loss_mat, tok, ratio, flags, **inputs.aggregation())


@dataclass(frozen=True)
class KLCovLossConfig:
    """``kl_cov``: fraction of top-covariance tokens penalised and the penalty coefficient."""

    kl_ratio: float = 2e-3
    kl_coef: float = 1.0

    def __post_init__(self) -> None:
        _check_range("kl_ratio", self.kl_ratio, 0.0, 1.0, lo_open=True)
        _check_range("kl_coef", self.kl_coef, 0.0, KL_COEF_MAX)


@register_policy_loss(
    "kl_cov", config=KLCovLossConfig, default_bounds=None, advantage_weighted=False
)
def kl_cov_policy_loss(inputs: LossInputs, cfg: KLCovLossConfig) -> LossOutput:
    """KL-Cov (Cui et al., arXiv 2505.22617): no clip; a KL penalty on the top-covariance tokens.

    Per token ``L_t = -A_t r_t``; the ``max(1, floor(kl_ratio * N))`` masked tokens with the
    largest ``cov_t`` (as in Clip-Cov; ties broken by position) get ``+ kl_coef |log r_t|``.
    There is no clip (bounds are ignored; no clip-fraction metrics). Not advantage-weighted:
    the penalty does not depend on A. Defaults ``kl_ratio 2e-3`` (the paper's 7B value; 2e-4
    for 32B), ``kl_coef 1``. Metric ``kl_cov_frac``: fraction of masked tokens penalised.
    Not row-local: the covariance's means and the top-k span every row of the call.
    """
    tok = prepare_token_inputs(inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask)
    ratio = torch.exp(tok.log_ratio)
    cov = _token_covariance(tok)
    keys = torch.where(tok.mask, cov, torch.full_like(cov, -torch.inf))
    selected = tok.mask & (_descending_rank(keys) < _top_k_count(cfg.kl_ratio, tok))
    penalty = cfg.kl_coef * tok.log_ratio.abs()
    loss_mat = -tok.advantages * ratio + torch.where(selected, penalty, torch.zeros_like(penalty))
    return finish_loss(loss_mat, tok, ratio, {"kl_cov_frac": selected}, **inputs.aggregation())


def dcpo_bounds(
    old_logprobs: Tensor, eps_low: Bound, eps_high: Bound, r_max: float
) -> tuple[Tensor, Tensor]:
    """DCPO's ratio bounds from the old token probability ``q = exp(old_logprobs)`` (arXiv 2509.02333).

    ``lower = 0.5 + 0.5 sqrt(max(1 - 4 eps_l / q, 0))``,
    ``upper = min(0.5 + 0.5 sqrt(1 + 4 eps_h / q), r_max)``: rare tokens (small q) get a wider
    range, capped at ``r_max``. At ``q = 1`` with 0.16 / 0.2: ``[0.8, 1.171]``.
    """
    q = torch.exp(old_logprobs)
    lower = 0.5 + 0.5 * torch.sqrt(torch.clamp(1.0 - 4.0 * eps_low / q, min=0.0))
    upper = torch.clamp(0.5 + 0.5 * torch.sqrt(1.0 + 4.0 * eps_high / q), max=r_max)
    return lower, upper


@dataclass(frozen=True)
class DCPOLossConfig:
    """``dcpo``: cap ``r_max`` of the upper bound, dual clip."""

    r_max: float = 10.0
    dual_clip: float | None = 3.0

    def __post_init__(self) -> None:
        _check_range("r_max", self.r_max, 1.0, RATIO_MAX, lo_open=True, why=_NO_RATIO_ABOVE)
        _check_dual(self.dual_clip)


#: DCPO's ``eps`` (the ratio bounds at ``q = 1``), set by the pacer directly as PPO's.
DCPO_WIDTH = TrustWidth("DCPO bound parameter", native=True)


@register_policy_loss(
    "dcpo", config=DCPOLossConfig, default_bounds=(0.16, 0.2), row_local=True, width=DCPO_WIDTH
)
def dcpo_policy_loss(inputs: LossInputs, cfg: DCPOLossConfig) -> LossOutput:
    """DCPO dynamic clipping (arXiv 2509.02333): the PPO surrogate with :func:`dcpo_bounds`.

    Defaults ``eps_low 0.16``, ``eps_high 0.2``, upper bound capped at ``r_max = 10``, dual clip 3
    (verl's default, on which DCPO's implementation is built). The paper aggregates a token mean
    per response summed over responses, i.e. ``seq-mean-token-mean`` times the (constant)
    number of responses: pass ``agg="seq-mean-token-mean"``. The clip flags are those of the
    probability-dependent bounds. Row-local: a token's bounds read its own old probability.
    """
    tok = prepare_token_inputs(inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask)
    old = torch.where(tok.mask, inputs.old_logprobs.detach().to(tok.log_ratio.dtype), 0.0)
    eps_l = as_bound(inputs.eps_low, old, "eps_low")
    eps_h = as_bound(inputs.eps_high, old, "eps_high")
    lower, upper = dcpo_bounds(old, eps_l, eps_h, cfg.r_max)
    ratio = torch.exp(tok.log_ratio)
    loss_mat, flags = ppo_clip_token_loss(ratio, tok.advantages, lower, upper, cfg.dual_clip)
    return finish_loss(loss_mat, tok, ratio, flags, **inputs.aggregation())


@dataclass(frozen=True)
class CEGPPOLossConfig:
    """``ce_gppo``: gradient scales ``beta1`` (A < 0 below the bound), ``beta2`` (A > 0 above)."""

    beta1: float = 0.75
    beta2: float = 1.0
    dual_clip: float | None = 3.0

    def __post_init__(self) -> None:
        for name in ("beta1", "beta2"):
            _check_range(name, getattr(self, name), 0.0, CE_GPPO_BETA_MAX)
        _check_dual(self.dual_clip)


@register_policy_loss(
    "ce_gppo", config=CEGPPOLossConfig, default_bounds=(0.2, 0.2), row_local=True, decoupled=True
)
def ce_gppo_policy_loss(inputs: LossInputs, cfg: CEGPPOLossConfig) -> LossOutput:
    """CE-GPPO gradient-preserving clip (arXiv 2509.20712).

    Where PPO's clip binds, keep a bounded gradient instead of none (``sg`` = stop-gradient)::

        A < 0, r < 1 - eps_l:  L = -beta1 (1 - eps_l) (r / sg(r)) A   (grad -beta1 (1-eps_l) A dlog pi)
        A > 0, r > 1 + eps_h:  L = -beta2 (1 + eps_h) (r / sg(r)) A   (grad -beta2 (1+eps_h) A dlog pi)
        otherwise:             L = -A r,  then the dual clip for A < 0.

    Defaults (the authors' implementation): ``eps 0.2 / 0.2``, ``beta1 0.75``, ``beta2 1``,
    dual clip 3. Row-local: every term is per token. Decoupled as ``ppo``: with behaviour
    weights, ``w_t L_t`` with the clip against the proximal ``old_logprobs``.
    """
    tok = prepare_token_inputs(inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask)
    lower, upper = clip_bounds(inputs.eps_low, inputs.eps_high, tok.log_ratio)
    adv = tok.advantages
    ratio = torch.exp(tok.log_ratio)
    unit = ratio / ratio.detach()  # value 1, gradient d log pi
    low = (adv < 0) & (ratio < lower)
    high = (adv > 0) & (ratio > upper)
    loss_mat = -adv * ratio
    loss_mat = torch.where(low, -cfg.beta1 * lower * unit * adv, loss_mat)
    loss_mat = torch.where(high, -cfg.beta2 * upper * unit * adv, loss_mat)
    loss_mat, dual = apply_dual_clip(loss_mat, adv, cfg.dual_clip)
    flags = {"clip_frac_low": low, "clip_frac_high": high, "dual_clip_frac": dual}
    return _finish(loss_mat, tok, ratio, flags, inputs)
