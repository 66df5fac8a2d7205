"""BAPO's adaptive clip bounds: balance positive and negative contributions per optimiser step.

Reference: Xi et al., "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced
Policy Optimization with Adaptive Clipping" (arXiv 2510.18927); ``docs/BASELINES.md`` row BAPO.

The clipped surrogate with ratio bounds ``[c_low, c_high]`` (``r = pi / pi_old``) is
``L_t = max(-A_t r_t, -A_t clip(r_t, c_low, c_high))``. A token's gradient is switched off by the
clip exactly when ``A_t > 0, r_t > c_high`` or ``A_t < 0, r_t < c_low``; every other token
contributes ``|A_t| r_t`` to the size of the objective's gradient. The **positive share** is

    rho(c_low, c_high) = P / (P + N),
    P = sum_{t: A_t > 0, r_t <= c_high} A_t r_t,     N = sum_{t: A_t < 0, r_t >= c_low} |A_t| r_t,

over masked tokens (``A_t = 0`` tokens count in neither; ``rho = 1`` when ``P + N = 0``: nothing
to rebalance). Raising ``c_high`` lets more positive tokens in; raising ``c_low`` shuts out more
negative ones with a low ratio; both raise ``rho``.

Search (BASELINES.md): start each optimiser step from ``c_low = 0.6, c_high = 1.2``; while
``rho < rho0 = 0.4``: raise ``c_high`` by 0.05 if it is below its cap 3.0, else raise ``c_low``
by 0.02 (cap 0.9). Stop as soon as ``rho >= rho0`` or both bounds are at their caps. The path of
candidate bounds is fixed, so all candidates are evaluated at once: each token's ratio is
bucketed between the (about 50) candidate bounds, ``|A| r`` is summed per bucket, and prefix sums
of the buckets give ``P`` and ``N`` for every candidate (no sort of the tokens); the first
candidate that meets the target is taken (two ``.item()`` calls).
Candidate bounds are ``c0 + i * step`` (capped, rounded to 10 decimals), not repeated additions.

Note: the public verl recipe of BAPO measures the contributions with the clipped *values*
``A * clip(r)`` instead of gating by the clip's gradient switch; we follow the paper's
definition above, under which raising ``c_low`` does reduce the negative contribution.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from entropace.algos.surrogate import LOG_RATIO_CLAMP
from entropace.control._state import (
    check_config,
    check_fields,
    check_int,
    check_number,
    check_optional_number,
)

__all__ = ["BapoClipController", "BapoConfig", "positive_share"]


@dataclass(frozen=True)
class BapoConfig:
    """Validated options of :class:`BapoClipController` (defaults: BAPO paper)."""

    c_low0: float = 0.6
    c_high0: float = 1.2
    c_low_max: float = 0.9
    c_high_max: float = 3.0
    step_low: float = 0.02
    step_high: float = 0.05
    rho0: float = 0.4

    def __post_init__(self) -> None:
        if not 0.0 < self.c_low0 <= self.c_low_max < 1.0:
            raise ValueError(
                f"need 0 < c_low0 <= c_low_max < 1, got c_low0={self.c_low0}, "
                f"c_low_max={self.c_low_max}"
            )
        if not 1.0 < self.c_high0 <= self.c_high_max:
            raise ValueError(
                f"need 1 < c_high0 <= c_high_max, got c_high0={self.c_high0}, "
                f"c_high_max={self.c_high_max}"
            )
        for name in ("step_low", "step_high"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.rho0 <= 1.0:
            raise ValueError(f"rho0 must be in [0, 1], got {self.rho0!r}")

    def candidates(self) -> tuple[list[float], list[float]]:
        """The search path: ``(c_low_k, c_high_k)`` for k = 0, 1, ... (start first)."""

        def ladder(c0: float, cap: float, step: float) -> list[float]:
            n = math.ceil((cap - c0) / step - 1e-9)
            return [round(min(c0 + i * step, cap), 10) for i in range(n + 1)]

        highs = ladder(self.c_high0, self.c_high_max, self.step_high)
        lows = ladder(self.c_low0, self.c_low_max, self.step_low)
        c_low = [lows[0]] * len(highs) + lows[1:]
        c_high = highs + [highs[-1]] * (len(lows) - 1)
        return c_low, c_high


def _check_inputs(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor):
    shape = logprobs.shape
    for name, t in (("old_logprobs", old_logprobs), ("advantages", advantages), ("mask", mask)):
        if t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, logprobs {tuple(shape)}")
    sel = mask.detach().reshape(-1) != 0
    lp = logprobs.detach().reshape(-1)[sel].double()
    old = old_logprobs.detach().reshape(-1)[sel].double()
    adv = advantages.detach().reshape(-1)[sel].double()
    if not bool(torch.isfinite(torch.stack([lp, old, adv])).all()):
        raise ValueError("BAPO: NaN or inf in logprobs, old_logprobs or advantages (masked)")
    ratio = torch.exp((lp - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return ratio, adv


def positive_share(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    c_low: Tensor | float,
    c_high: Tensor | float,
) -> Tensor:
    """``rho(c_low, c_high)`` of the module docstring for each candidate pair.

    Args:
        logprobs, old_logprobs, advantages, mask: same shape, e.g. ``[B, L]``.
        c_low, c_high: ``[K]`` candidate ratio bounds (or scalars).

    Returns:
        ``[K]`` float64 shares in [0, 1].
    """
    ratio, adv = _check_inputs(logprobs, old_logprobs, advantages, mask)
    c_low_t = torch.as_tensor(c_low, dtype=torch.float64).reshape(-1)
    c_high_t = torch.as_tensor(c_high, dtype=torch.float64).reshape(-1)

    contrib = adv.abs() * ratio  # |A_t| r_t, the size of an unclipped token's gradient
    pos, neg = adv > 0, adv < 0

    # Bucket each ratio between the sorted distinct candidate bounds (K of them, K << tokens),
    # sum |A| r per bucket, and take prefix sums: no sort of the tokens is needed.
    highs, high_idx = torch.unique(c_high_t, sorted=True, return_inverse=True)
    bucket = torch.bucketize(ratio[pos], highs, right=False)  # r <= highs[i]  <=>  bucket <= i
    below_high = torch.bincount(bucket, contrib[pos], minlength=highs.numel() + 1).cumsum(0)
    p = below_high[high_idx]  # P(c_high) = sum over A > 0, r <= c_high
    lows, low_idx = torch.unique(c_low_t, sorted=True, return_inverse=True)
    bucket = torch.bucketize(ratio[neg], lows, right=True)  # r < lows[i]  <=>  bucket <= i
    below_low = torch.bincount(bucket, contrib[neg], minlength=lows.numel() + 1).cumsum(0)
    n = contrib[neg].sum() - below_low[low_idx]  # N(c_low) = sum over A < 0, r >= c_low
    total = p + n
    return torch.where(total > 0, p / total.clamp_min(1e-300), torch.ones_like(total))


class BapoClipController:
    """Per-optimiser-step BAPO bound search (see the module docstring).

    Call :meth:`update` on each mini-batch before its loss, with the current policy's log-probs
    (detached is fine), and pass the returned ``(eps_low, eps_high)`` to the clipped surrogate.
    """

    def __init__(self, config: BapoConfig | None = None, **options: Any) -> None:
        """Build from a validated ``config`` or from its fields as keyword options."""
        if config is not None and options:
            raise ValueError("pass either config= or keyword options, not both")
        self.config = config if config is not None else BapoConfig(**options)
        self._c_low, self._c_high = self.config.candidates()
        self.c_low = self.config.c_low0
        self.c_high = self.config.c_high0
        self.share = float("nan")
        self.steps = 0
        self.met_at_start = 0  # steps where the start bounds already met rho0
        self.not_met = 0  # steps that ended at both caps without meeting rho0

    def update(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[float, float]:
        """Search the bounds for this batch; return ``(eps_low, eps_high)``.

        ``eps_low = 1 - c_low`` and ``eps_high = c_high - 1`` (rounded to 12 decimals), so that the ratio is clipped to
        ``[1 - eps_low, 1 + eps_high] = [c_low, c_high]``.
        """
        shares = positive_share(logprobs, old_logprobs, advantages, mask, self._c_low, self._c_high)
        met = shares >= self.config.rho0
        k = int(torch.argmax(met.to(torch.int8)).item()) if bool(met.any()) else len(shares) - 1
        self.c_low, self.c_high = self._c_low[k], self._c_high[k]
        self.share = float(shares[k].item())
        self.steps += 1
        self.met_at_start += int(k == 0 and self.share >= self.config.rho0)
        self.not_met += int(self.share < self.config.rho0)
        return self.eps_low, self.eps_high

    @property
    def eps_low(self) -> float:
        return round(1.0 - self.c_low, 12)

    @property
    def eps_high(self) -> float:
        return round(self.c_high - 1.0, 12)

    def metrics(self) -> dict[str, float]:
        return {
            "bapo/c_low": self.c_low,
            "bapo/c_high": self.c_high,
            "bapo/positive_share": self.share,
        }

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable: config, last bounds and share, counters."""
        return {
            "config": asdict(self.config),
            "c_low": self.c_low,
            "c_high": self.c_high,
            "share": None if math.isnan(self.share) else self.share,
            "steps": self.steps,
            "met_at_start": self.met_at_start,
            "not_met": self.not_met,
        }

    def load_state_dict(self, state: Any, where: str = "bapo") -> None:
        """Restore :meth:`state_dict` output, validated first (config equal; ``c_low`` in
        ``[c_low0, c_low_max]``, ``c_high`` in ``[c_high0, c_high_max]``, ``share`` None or in
        ``[0, 1]``, counters ints >= 0); a :class:`StateError` naming the field otherwise."""
        cfg = self.config
        keys = ("config", "c_low", "c_high", "share", "steps", "met_at_start", "not_met")
        s = check_fields(state, where, keys)
        check_config("BapoClipController", asdict(cfg), s["config"], f"{where}.config")
        c_low = check_number(s["c_low"], f"{where}.c_low", lo=cfg.c_low0, hi=cfg.c_low_max)
        c_high = check_number(s["c_high"], f"{where}.c_high", lo=cfg.c_high0, hi=cfg.c_high_max)
        share = check_optional_number(s["share"], f"{where}.share", lo=0.0, hi=1.0)
        steps = check_int(s["steps"], f"{where}.steps")
        met = check_int(s["met_at_start"], f"{where}.met_at_start", hi=steps)
        not_met = check_int(s["not_met"], f"{where}.not_met", hi=steps)
        self.c_low, self.c_high = c_low, c_high
        self.share = float("nan") if share is None else share
        self.steps, self.met_at_start, self.not_met = steps, met, not_met
