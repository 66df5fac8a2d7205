"""Where a loss's arithmetic stays finite: the ranges of the loss and estimator options.

The policy losses compute in float32 (the log-probs are float32 under bf16 autocast too:
:mod:`entropace.algos.token_stats`; bfloat16 has float32's exponent range, so a value finite
in float32 is finite in bfloat16). An option is accepted when, for every ratio the losses can
see (``log r`` clamped to ``[-20, 20]``, so ``r <= R = e^20 ~ 4.85e8``) and per unit advantage:

- the option itself is a normal float32 number (``>= F32_TINY ~ 1.18e-38``: a smaller one
  rounds to 0 or a subnormal, e.g. ``5e-324 -> 0``, a width of exactly 0) and at most
  ``F32_MAX ~ 3.40e38`` (a larger one is ``inf``: ``1e300 -> inf``, and ``0 * inf`` is NaN);
- every per-token term it scales stays finite when summed over the most tokens one loss call
  sums (:data:`SUM_TOKENS` = 2**24, a micro-batch's ``ppo.micro_batch_tokens`` maximum): each
  term at most ``F32_MAX / 2**24 ~ 2.03e31``;
- a bound beyond which nothing can bind (a ratio bound above ``R``, a log-ratio bound above
  20, a total-variation threshold above 1) is refused: null (or a smaller value) says the
  same without a number float32 cannot hold.

The derived bounds (rounded inwards to two significant digits; docs/BASELINES.md lists them):

=========================  ==================================  ===============================
option                      range                               why
=========================  ==================================  ===============================
SAPO ``tau_pos/tau_neg``    ``[2.0e-31, 7.0e29]``               ``tau (R - 1) <= F32_MAX``;
                                                                ``(4 / tau) 2**24 <= F32_MAX``
DRO ``beta``                ``[1.2e-38, 1.0e29]``               ``(beta / 2) 20**2 2**24 <= F32_MAX``
DPPO ``ratio_cap``          ``[1.2e-38, R]`` or null            ``min(r, cap)``; above ``R``: no cap
PPO ``dual_clip``           ``(1, R]`` or null                  binds where ``r > c``
DCPO ``r_max``              ``(1, R]``                          caps the upper ratio bound
KL-Cov ``kl_coef``          ``[0, 1.0e30]``                     ``coef |log r| 2**24 <= F32_MAX``
CE-GPPO ``beta1/beta2``     ``[0, 4.1e22]``                     ``beta (1 + R) 2**24 <= F32_MAX``
Clip-Cov ``cov_*``          ``[-F32_MAX, F32_MAX]``             compared with float32 values
``algorithm.kl_beta``       ``[0, 2.0e30]``                     ``beta KL``, the k3 KL <= 10
``algorithm.entropy_coef``  ``[0, 9.4e29]``                     ``coef H``, ``H <= ln 2**31``
``algorithm.seq_norm``      ``>= 1``                            a token count, the divisor
=========================  ==================================  ===============================

The trust-region widths' own limits are on each loss's :class:`entropace.algos.TrustWidth`.
"""

from __future__ import annotations

import math

__all__ = [
    "CE_GPPO_BETA_MAX",
    "DRO_BETA_MAX",
    "F32_MAX",
    "F32_TINY",
    "ENTROPY_COEF_MAX",
    "KL_BETA_MAX",
    "KL_COEF_MAX",
    "LOG_RATIO_MAX",
    "POSITIVE_MIN",
    "RATIO_MAX",
    "SAPO_TAU_MAX",
    "SAPO_TAU_MIN",
    "SUM_TOKENS",
    "TERM_MAX",
    "round_in",
]

#: float32's largest finite value and smallest normal one (``torch.finfo(torch.float32)``).
F32_MAX = 3.4028234663852886e38
F32_TINY = 1.1754943508222875e-38
#: Most tokens one loss call sums (``ppo.micro_batch_tokens``' maximum, 2**24).
SUM_TOKENS = 2**24
#: The largest per-token term whose sum over :data:`SUM_TOKENS` tokens is finite in float32.
TERM_MAX = F32_MAX / SUM_TOKENS
#: The log-ratio clamp of every loss (``surrogate.LOG_RATIO_CLAMP``) and the largest ratio.
LOG_RATIO_MAX = 20.0
RATIO_MAX = math.exp(LOG_RATIO_MAX)


def round_in(value: float, *, up: bool) -> float:
    """``value`` rounded to two significant digits towards the inside of a range (``up``
    for a lower bound), so that the stated bound is itself inside."""
    exp = math.floor(math.log10(value)) - 1
    scaled = value / 10.0**exp
    digits = math.ceil(scaled) if up else math.floor(scaled)
    return float(f"{digits}e{exp}")


#: The smallest width or positive option accepted: ``F32_TINY`` rounded up, 1.2e-38.
POSITIVE_MIN = round_in(F32_TINY, up=True)
#: SAPO's gate ``(4 / tau) sigmoid(tau (r - 1))``: ``tau (R - 1)`` finite; ``4 / tau`` a term.
SAPO_TAU_MAX = round_in(F32_MAX / (RATIO_MAX - 1.0), up=False)
SAPO_TAU_MIN = round_in(4.0 / TERM_MAX, up=True)
#: DRO's penalty ``(beta / 2) (log r)^2 <= 200 beta`` a term.
DRO_BETA_MAX = round_in(TERM_MAX / (0.5 * LOG_RATIO_MAX**2), up=False)
#: KL-Cov's penalty ``kl_coef |log r| <= 20 kl_coef`` a term.
KL_COEF_MAX = round_in(TERM_MAX / LOG_RATIO_MAX, up=False)
#: The reference KL's coefficient: the k3 KL is clamped to 10 per token (``algos.kl``).
KL_BETA_MAX = round_in(TERM_MAX / 10.0, up=False)
#: The entropy bonus's coefficient: a token's entropy is at most ``ln V``, ``V <= 2**31``.
ENTROPY_COEF_MAX = round_in(TERM_MAX / math.log(2.0**31), up=False)
#: CE-GPPO's ``beta (1 + eps_high) A``, ``1 + eps_high <= 1 + R`` (the ratio bound's limit).
CE_GPPO_BETA_MAX = round_in(TERM_MAX / (1.0 + RATIO_MAX), up=False)
