"""Plain policy-gradient losses of verl 0.9.1's registry: ``dro`` and ``gpg``.

Per token (loss minimised; ``log r_t = clamp(log pi - log pi_old, -20, 20)``):

- DRO (Richemond et al., arXiv 2405.19107; Kimi k1.5, arXiv 2501.12599; verl's ``dro``):
  ``L_t = -(A_t log pi_t - (beta / 2) (log r_t)^2)``: a policy gradient with a quadratic
  penalty on the log-ratio, a soft trust region whose per-token optimum is
  ``log r = A / beta``. Its width is ``beta`` (``beta_low`` on ``A <= 0`` tokens, ``beta_high``
  on ``A > 0``: ``LossInputs.eps_low`` / ``eps_high`` per row, else the option ``beta``);
  under EPPO a wider region is a smaller ``beta`` (:mod:`entropace.algos.widths`).
  Not A-weighted: the penalty pulls towards ``pi_old`` whatever the advantage.
- GPG (arXiv 2504.02546; verl's ``gpg``): ``L_t = -A_t log pi_t``, REINFORCE without an
  importance ratio or a trust region (no width: EPPO does not compose with it).

Both are row-local and take AReaL's behaviour weights (``w_t L_t``), as verl multiplies its
rollout-correction weights into every token's loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from entropace.algos.limits import DRO_BETA_MAX, POSITIVE_MIN
from entropace.algos.policy_losses import (
    LossInputs,
    _check_range,
    _finish,
    register_policy_loss,
)
from entropace.algos.surrogate import LossOutput, as_bound, prepare_token_inputs
from entropace.algos.widths import TrustWidth

__all__ = ["DRO_WIDTH", "DROLossConfig", "GPGLossConfig"]

#: ``beta`` in ``[1.2e-38, 1.0e29]``: a normal float32, and ``(beta / 2) (log r)^2`` summed
#: over 2**24 tokens finite (:mod:`entropace.algos.limits`).
DRO_WIDTH = TrustWidth(
    "log-ratio penalty", power=-1.0, options=("beta", "beta"),
    limits=(POSITIVE_MIN, DRO_BETA_MAX),
)  # fmt: skip


@dataclass(frozen=True)
class DROLossConfig:
    """``dro``: ``beta``, the coefficient of the quadratic log-ratio penalty (> 0). verl 0.9.1
    has no default (``policy_loss.dro_beta`` must be set); 1.0 is Tinker's (its ``dro``
    loss_fn_config default). Range ``[1.2e-38, 1.0e29]`` (:data:`DRO_WIDTH`'s limits)."""

    beta: float = 1.0

    def __post_init__(self) -> None:
        _check_range("beta", self.beta, *DRO_WIDTH.limits)


@register_policy_loss(
    "dro", config=DROLossConfig, default_bounds=None, advantage_weighted=False, row_local=True,
    decoupled=True, width=DRO_WIDTH,
)  # fmt: skip
def dro_policy_loss(inputs: LossInputs, cfg: DROLossConfig) -> LossOutput:
    """DRO's quadratic-penalty policy gradient (module docstring): ``L_t = -(A_t log pi_t -
    (beta_t / 2) (log r_t)^2)``, ``beta_t = eps_high`` where ``A_t > 0``, else ``eps_low``
    (both ``beta`` unless given per row). No flags."""
    tok = prepare_token_inputs(inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask)
    assert inputs.eps_low is not None and inputs.eps_high is not None
    beta_low = as_bound(inputs.eps_low, tok.log_ratio, "beta (eps_low)")
    beta_high = as_bound(inputs.eps_high, tok.log_ratio, "beta (eps_high)")
    adv = tok.advantages
    beta = torch.where(adv > 0, beta_high, beta_low)
    loss_mat = -(adv * tok.logprobs - 0.5 * beta * tok.log_ratio.square())
    return _finish(loss_mat, tok, torch.exp(tok.log_ratio), {}, inputs)


@dataclass(frozen=True)
class GPGLossConfig:
    """``gpg``: no options (no trust region)."""


@register_policy_loss(
    "gpg", config=GPGLossConfig, default_bounds=None, row_local=True, decoupled=True, width=None
)
def gpg_policy_loss(inputs: LossInputs, cfg: GPGLossConfig) -> LossOutput:
    """GPG (module docstring): ``L_t = -A_t log pi_t``; bounds are ignored."""
    tok = prepare_token_inputs(inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.mask)
    loss_mat = -tok.advantages * tok.logprobs
    return _finish(loss_mat, tok, torch.exp(tok.log_ratio), {}, inputs)
