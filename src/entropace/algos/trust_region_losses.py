"""verl 0.9.1's trust regions beyond PPO's ratio clip, in the one policy-loss registry.

Registered here (:func:`entropace.algos.register_policy_loss`; verl's registry names in
brackets): ``cispo`` [``cispo``], ``gmpo`` [``geo_mean``], ``sapo`` [``sapo``], ``dppo_tv``
[``dppo_tv``], ``dppo_kl`` [``dppo_kl``]. Each agrees in value and gradient with verl's
``compute_policy_loss_<name>`` (``tests/integrations/test_verl_trust_regions.py``, in the verl
venv) and with a float64 loop (``tests/test_trust_region_losses.py``). Per token (``r_t =
exp(clamp(log pi - log pi_old, -20, 20))``, ``sg`` = stop-gradient, loss minimised):

- CISPO (MiniMax-M1, arXiv 2506.13585): ``L_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) A_t
  log pi_t``: the importance weight is clipped and never cut, so every token keeps a gradient.
- GMPO (arXiv 2507.20673): the geometric mean of the token ratios per sequence, each token's
  log-ratio clipped to ``[-eps_low, eps_high]`` on the side its advantage's sign makes binding:
  ``L_i = -Abar_i exp(mean_t sgn(A_t) min(sgn(A_t) log r_t, sgn(A_t) clip(log r_t)))``.
- SAPO (arXiv 2511.20347): a soft gate instead of a clip,
  ``L_t = -(4 / tau) sigmoid(tau (r_t - 1)) A_t`` with ``tau = tau_pos`` where ``A_t > 0``,
  ``tau_neg`` elsewhere; its gradient weight ``sech^2(tau (r_t - 1) / 2)`` is 1 at ``r = 1`` and
  halves at ``|r - 1| = 1.763 / tau``.
- DPPO (arXiv 2602.04879): a divergence bound instead of a ratio clip. A token keeps its
  gradient unless its probability moved past the threshold in the direction its advantage
  pushes: ``L_t = -A_t sg(min(r_t, cap)) log pi_t [valid_t]`` with, for ``p = pi(y_t)``,
  ``q = pi_old(y_t)``: Binary-TV ``valid = p - q <= eps_high`` (``A > 0``), ``p - q >= -eps_low``
  (``A <= 0``); Binary-KL ``KL = q log(q / p) + (1 - q) log((1 - q + 1e-8) / (1 - p + 1e-8))``,
  ``valid = KL <= eps_high or p <= q`` (``A > 0``), ``KL <= eps_low or p >= q`` (``A <= 0``).

Widths (``LossInputs.eps_low`` / ``eps_high``, :mod:`entropace.algos.widths`): CISPO's weight
bounds, GMPO's log-ratio bounds, DPPO's thresholds (bounds, defaults ``(0.2, 0.2)`` as verl's
``clip_ratio``); SAPO's temperatures ``(tau_neg, tau_pos)`` (options, per-row values override).

Loss values follow verl: CISPO's and DPPO's contain ``log pi`` itself (only their gradient is a
surrogate's). Flags (``LossOutput.flags``): ``clip_frac_low`` / ``clip_frac_high`` where the
width binds on the low / high side (CISPO: the weight is clipped; GMPO: the log-ratio is
clipped, gradient cut, ``A < 0`` / ``A > 0``; SAPO: the gate's gradient weight is below 1/2 on
PPO's clip side, ``A < 0, r < 1`` / ``A > 0, r > 1``, and ``gate_damped_frac`` anywhere; DPPO:
invalid tokens, ``A <= 0`` / ``A > 0``, and ``truncated_frac`` where ``r > cap``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from entropace.algos.limits import (
    F32_MAX,
    LOG_RATIO_MAX,
    POSITIVE_MIN,
    RATIO_MAX,
    SAPO_TAU_MAX,
    SAPO_TAU_MIN,
)
from entropace.algos.policy_losses import (
    LossInputs,
    _check_range,
    _finish,
    register_policy_loss,
)
from entropace.algos.surrogate import LossOutput, as_bound, finish_loss, prepare_token_inputs
from entropace.algos.widths import TrustWidth

__all__ = [
    "CISPO_WIDTH",
    "CISPOLossConfig",
    "DPPOLossConfig",
    "DPPO_KL_WIDTH",
    "DPPO_TV_WIDTH",
    "GMPOLossConfig",
    "GMPO_WIDTH",
    "SAPOLossConfig",
    "SAPO_HALF_WEIGHT",
    "SAPO_WIDTH",
    "binary_kl",
]

#: ``x`` at which SAPO's gradient weight ``sech^2(x / 2)`` is 1/2: ``2 arccosh(sqrt 2)``.
SAPO_HALF_WEIGHT = 2.0 * math.acosh(math.sqrt(2.0))

CISPO_WIDTH = TrustWidth("importance-weight bound")
# The widths' limits (:mod:`entropace.algos.limits`): a log-ratio bound above 20 and a
# total-variation threshold above 1 never bind; SAPO's temperatures keep ``tau (r - 1)`` and
# ``4 / tau`` finite; a binary-KL threshold is any normal float32.
GMPO_WIDTH = TrustWidth("log-ratio bound", limits=(POSITIVE_MIN, LOG_RATIO_MAX))
SAPO_WIDTH = TrustWidth(
    "gate temperature", power=-1.0, options=("tau_neg", "tau_pos"),
    limits=(SAPO_TAU_MIN, SAPO_TAU_MAX),
)  # fmt: skip
DPPO_TV_WIDTH = TrustWidth("total-variation threshold", limits=(POSITIVE_MIN, 1.0))
DPPO_KL_WIDTH = TrustWidth("binary-KL threshold", power=2.0, limits=(POSITIVE_MIN, F32_MAX))


def _ratio_bounds(inputs: LossInputs, ref: Tensor) -> tuple[Tensor, Tensor]:
    """``(1 - eps_low, 1 + eps_high)`` without PPO's ``eps_low < 1`` (CISPO: a lower bound
    <= 0 is no lower bound)."""
    assert inputs.eps_low is not None and inputs.eps_high is not None  # filled by PolicyLoss
    low = as_bound(inputs.eps_low, ref, "eps_low")
    high = as_bound(inputs.eps_high, ref, "eps_high")
    return 1.0 - low, 1.0 + high


# --------------------------------------------------------------------------------------------
# CISPO
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CISPOLossConfig:
    """``cispo``: no options; its width is the weight's bounds ``eps_low`` / ``eps_high``."""


@register_policy_loss(
    "cispo", config=CISPOLossConfig, default_bounds=(0.2, 0.2), row_local=True, decoupled=True,
    width=CISPO_WIDTH,
)  # fmt: skip
def cispo_policy_loss(inputs: LossInputs, cfg: CISPOLossConfig) -> LossOutput:
    """CISPO (arXiv 2506.13585; verl's ``cispo``): ``L_t = -sg(clip(r_t, 1 - eps_low,
    1 + eps_high)) A_t log pi_t``, gradient ``-clip(r_t) A_t d log pi_t`` on every token.

    ``eps_low >= 1`` leaves the weight without a lower bound (MiniMax-M1 tunes only the upper
    one; verl's example uses ``eps_low = 10``). Defaults ``0.2 / 0.2`` (verl's
    ``clip_ratio``). Flags: the weight clipped below / above. Row-local, A-weighted; takes
    behaviour weights (``w_t L_t``).
    """
    tok = prepare_token_inputs(inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask)
    lower, upper = _ratio_bounds(inputs, tok.log_ratio)
    ratio = torch.exp(tok.log_ratio)
    weight = torch.minimum(torch.maximum(ratio, lower), upper).detach()
    loss_mat = -weight * tok.advantages * tok.logprobs
    flags = {"clip_frac_low": ratio < lower, "clip_frac_high": ratio > upper}
    return _finish(loss_mat, tok, ratio, flags, inputs)


# --------------------------------------------------------------------------------------------
# GMPO
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GMPOLossConfig:
    """``gmpo``: no options; its width is the log-ratio bounds ``eps_low`` / ``eps_high``."""


@register_policy_loss(
    "gmpo", config=GMPOLossConfig, default_bounds=(0.2, 0.2), row_local=True, width=GMPO_WIDTH
)
def gmpo_policy_loss(inputs: LossInputs, cfg: GMPOLossConfig) -> LossOutput:
    """GMPO, geometric-mean policy optimisation (arXiv 2507.20673; verl's ``geo_mean``).

    Per sequence ``i`` with ``n_i`` masked tokens: ``l_t = sgn(A_t) min(sgn(A_t) log r_t,
    sgn(A_t) clip(log r_t, -eps_low, eps_high))`` (the clip binds above for ``A > 0``, below for
    ``A < 0``; ``l_t = 0`` where ``A_t = 0``), ``s_i = exp(sum_t l_t / n_i)``, ``Abar_i =
    sum_t A_t / n_i``, ``L_i = -Abar_i s_i``. Every masked token of row ``i`` carries ``L_i``
    (value and gradient), so ``agg="seq-mean-token-mean"`` gives ``mean_i L_i`` (verl's
    ``torch.mean`` over the rows, whatever its ``loss_agg_mode``; the paper's objective);
    ``token-mean`` weighs each sequence by its length. The bounds are on the LOG-ratio: the
    paper's ``(e^-0.4, e^0.4)`` is ``eps 0.4``; defaults ``0.2 / 0.2`` (verl's ``clip_ratio``).
    Flags: a token's log-ratio clipped (its gradient cut), ``A < 0`` / ``A > 0``. The ratio
    metrics are of ``s_i``. Row-local, A-weighted.
    """
    tok = prepare_token_inputs(inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask)
    assert inputs.eps_low is not None and inputs.eps_high is not None
    lo = as_bound(inputs.eps_low, tok.log_ratio, "eps_low")
    hi = as_bound(inputs.eps_high, tok.log_ratio, "eps_high")
    log_r, adv = tok.log_ratio, tok.advantages
    clipped = torch.minimum(torch.maximum(log_r, -lo), hi)
    sgn = torch.sign(adv)
    kept = sgn * torch.minimum(sgn * log_r, sgn * clipped)
    lengths = tok.weight.sum(-1).clamp_min(1.0)  # [B]
    seq_ratio = torch.exp((kept * tok.weight).sum(-1) / lengths)  # [B]
    seq_adv = (adv * tok.weight).sum(-1) / lengths
    loss_mat = (-seq_adv * seq_ratio)[:, None].expand_as(log_r)
    flags = {"clip_frac_low": (adv < 0) & (log_r < -lo), "clip_frac_high": (adv > 0) & (log_r > hi)}
    ratio = seq_ratio.detach()[:, None].expand_as(log_r)
    return finish_loss(loss_mat, tok, ratio, flags, **inputs.aggregation())


# --------------------------------------------------------------------------------------------
# SAPO
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SAPOLossConfig:
    """``sapo``: the gate temperatures of tokens with ``A > 0`` (``tau_pos``) and ``A <= 0``
    (``tau_neg``); verl 0.9.1's and the paper's defaults. Range ``[2.0e-31, 7.0e29]``
    (:data:`SAPO_WIDTH`'s limits: ``tau (r - 1)`` and the gate's ``4 / tau`` finite in
    float32)."""

    tau_pos: float = 1.0
    tau_neg: float = 1.05

    def __post_init__(self) -> None:
        for name in ("tau_pos", "tau_neg"):
            _check_range(name, getattr(self, name), *SAPO_WIDTH.limits)


@register_policy_loss(
    "sapo", config=SAPOLossConfig, default_bounds=None, row_local=True, decoupled=True,
    width=SAPO_WIDTH,
)  # fmt: skip
def sapo_policy_loss(inputs: LossInputs, cfg: SAPOLossConfig) -> LossOutput:
    """SAPO, soft adaptive policy optimisation (arXiv 2511.20347; verl's ``sapo``).

    ``L_t = -(4 / tau_t) sigmoid(tau_t (r_t - 1)) A_t``, ``tau_t = tau_pos`` where ``A_t > 0``
    else ``tau_neg``: at ``r = 1`` the gradient is the policy gradient ``-A_t d log pi_t``; it
    fades smoothly as ``r`` leaves 1 (weight ``sech^2(tau (r - 1) / 2)``), faster for a larger
    ``tau``. The temperatures are the loss's width: ``inputs.eps_low`` / ``eps_high`` given
    per row are ``(tau_neg, tau_pos)``, otherwise the options. verl aggregates SAPO with
    ``seq-mean-token-mean`` whatever its ``loss_agg_mode`` (the recipe's choice here).
    Flags: the gradient weight below 1/2 (``|r - 1| > 1.763 / tau``) with ``A < 0, r < 1``
    (``clip_frac_low``), ``A > 0, r > 1`` (``clip_frac_high``), and anywhere
    (``gate_damped_frac``). Row-local, A-weighted; takes behaviour weights.
    """
    tok = prepare_token_inputs(inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask)
    assert inputs.eps_low is not None and inputs.eps_high is not None
    tau_neg = as_bound(inputs.eps_low, tok.log_ratio, "tau_neg")
    tau_pos = as_bound(inputs.eps_high, tok.log_ratio, "tau_pos")
    adv = tok.advantages
    ratio = torch.exp(tok.log_ratio)
    tau = torch.where(adv > 0, tau_pos, tau_neg)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    loss_mat = -gate * adv
    with torch.no_grad():
        damped = (tau * (ratio - 1.0)).abs() > SAPO_HALF_WEIGHT
    flags = {
        "clip_frac_low": damped & (adv < 0) & (ratio < 1.0),
        "clip_frac_high": damped & (adv > 0) & (ratio > 1.0),
        "gate_damped_frac": damped,
    }
    return _finish(loss_mat, tok, ratio, flags, inputs)


# --------------------------------------------------------------------------------------------
# DPPO
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DPPOLossConfig:
    """``dppo_tv`` / ``dppo_kl``: ``ratio_cap``, the truncation of the detached importance
    weight ``min(r, ratio_cap)`` (verl reads its ``clip_ratio_c``: 3.0 in verl 0.9.1's actor
    config; None: no truncation). Range ``[1.2e-38, e^20]``: a normal float32, and no ratio
    is above ``e^20`` (its log is clamped to 20)."""

    ratio_cap: float | None = 3.0

    def __post_init__(self) -> None:
        if self.ratio_cap is not None:
            _check_range(
                "ratio_cap", self.ratio_cap, POSITIVE_MIN, RATIO_MAX,
                why="the ratio is at most e^20 (its log is clamped to 20); null for no cap",
            )  # fmt: skip


def binary_kl(old_logprobs: Tensor, logprobs: Tensor) -> Tensor:
    """DPPO's binary KL ``q log(q / p) + (1 - q) log((1 - q + 1e-8) / (1 - p + 1e-8))`` of the
    sampled token's Bernoulli (``q = pi_old``, ``p = pi``), as verl computes it."""
    p, q = torch.exp(logprobs), torch.exp(old_logprobs)
    return q * (old_logprobs - logprobs) + (1.0 - q) * torch.log(
        (1.0 - q + 1e-8) / (1.0 - p + 1e-8)
    )


def _dppo(inputs: LossInputs, cfg: DPPOLossConfig, kind: str) -> LossOutput:
    tok = prepare_token_inputs(inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask)
    assert inputs.eps_low is not None and inputs.eps_high is not None
    low = as_bound(inputs.eps_low, tok.log_ratio, "eps_low")
    high = as_bound(inputs.eps_high, tok.log_ratio, "eps_high")
    adv = tok.advantages
    ratio = torch.exp(tok.log_ratio)
    with torch.no_grad():
        lp = tok.logprobs.detach()
        old = torch.where(tok.mask, inputs.old_logprobs.detach().to(lp.dtype), lp.new_zeros(()))
        p, q = torch.exp(lp), torch.exp(old)
        if kind == "tv":
            up, down = p - q <= high, p - q >= -low
        else:
            kl = binary_kl(old, lp)
            up, down = (kl <= high) | (p <= q), (kl <= low) | (p >= q)
        valid = torch.where(adv > 0, up, down)
        weight = (
            ratio.detach() if cfg.ratio_cap is None else ratio.detach().clamp(max=cfg.ratio_cap)
        )
    loss_mat = -adv * weight * tok.logprobs * valid.to(adv.dtype)
    flags = {
        "clip_frac_low": ~valid & (adv <= 0),
        "clip_frac_high": ~valid & (adv > 0),
    }
    if cfg.ratio_cap is not None:
        flags["truncated_frac"] = valid & (ratio.detach() > cfg.ratio_cap)
    return _finish(loss_mat, tok, ratio, flags, inputs)


@register_policy_loss(
    "dppo_tv", config=DPPOLossConfig, default_bounds=(0.2, 0.2), row_local=True, decoupled=True,
    width=DPPO_TV_WIDTH,
)  # fmt: skip
def dppo_tv_policy_loss(inputs: LossInputs, cfg: DPPOLossConfig) -> LossOutput:
    """DPPO-Binary-TV (arXiv 2602.04879; verl's ``dppo_tv``): module docstring. The widths are
    the thresholds on ``p - q`` (low for ``A <= 0``, high for ``A > 0``); defaults ``0.2 /
    0.2`` (verl's ``clip_ratio``; the authors' script uses 0.15). Row-local, A-weighted."""
    return _dppo(inputs, cfg, "tv")


@register_policy_loss(
    "dppo_kl", config=DPPOLossConfig, default_bounds=(0.2, 0.2), row_local=True, decoupled=True,
    width=DPPO_KL_WIDTH,
)  # fmt: skip
def dppo_kl_policy_loss(inputs: LossInputs, cfg: DPPOLossConfig) -> LossOutput:
    """DPPO-Binary-KL (arXiv 2602.04879; verl's ``dppo_kl``): module docstring. The widths are
    the thresholds on the binary KL; defaults ``0.2 / 0.2`` (verl's ``clip_ratio``; the
    authors' script uses 0.05). Row-local, A-weighted."""
    return _dppo(inputs, cfg, "kl")
