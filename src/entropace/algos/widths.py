"""Trust-region widths: what a policy loss's ``eps_low`` / ``eps_high`` are, and how EPPO's pace
moves them (ALGORITHMS.md section 3, "Widths").

Every policy loss with a trust region declares its :class:`TrustWidth` in the registry
(:attr:`entropace.algos.PolicyLoss.width`). The two per-row widths travel in
``LossInputs.eps_low`` / ``eps_high`` in the loss's OWN units: the PPO family's ratio bounds
``[1 - eps_low, 1 + eps_high]``, CISPO's importance-weight bounds, GMPO's log-ratio bounds,
DPPO's divergence thresholds; for a loss whose width is a pair of config options (SAPO's
temperatures ``tau_neg`` / ``tau_pos``, DRO's penalty ``beta``) per-row values override the
options. The low width acts on tokens with ``A <= 0`` (or ``A < 0``), the high width on
``A > 0``, as PPO's bounds do.

EPPO's pacer (:class:`entropace.control.EntropyPacer`) produces per-task ratio half-widths
``eps_k`` around ``eps0``. Its relative pace ``f_k = eps_k / eps0`` (``eps_high_k /
eps_high0`` for the high side: the same number) becomes a loss's width by
:func:`paced_widths`:

- ``native`` widths (ratio bounds of the PPO family: ``ppo``, ``clip_cov``, ``ce_gppo``, and
  DCPO's ``eps``): the pacer's ``eps_k`` ARE the widths (section 3 as written);
- every other width: ``w_k = w_0 f_k ** power``, with ``w_0`` the loss's own width at pace 1
  (its configured bounds or options) and ``power`` the order in which the width grows with a
  ratio half-width: 1 for a ratio or log-ratio bound and a total-variation threshold
  (``|p - p_old| = p_old |r - 1|``), 2 for a binary-KL threshold
  (``KL ~ p_old (r - 1)^2 / (2 (1 - p_old))``), -1 for SAPO's temperature (its gate's weight
  halves at ``|r - 1| = 1.763 / tau``) and DRO's penalty (its per-token optimum is
  ``log r = A / beta``).

Every width has a finite, positive range, :attr:`TrustWidth.limits` (where the loss's float32
arithmetic stays finite and the width can still bind: :mod:`entropace.algos.limits`): the
configured widths must lie in it (:meth:`TrustWidth.check`, when the config loads), and the
paced widths are clamped into it at every step (:func:`paced_widths`), so that no pace, however
long, drives a width to 0 or to infinity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from entropace.algos.limits import POSITIVE_MIN, RATIO_MAX

__all__ = ["RATIO_WIDTH", "TrustWidth", "paced_widths"]


@dataclass(frozen=True)
class TrustWidth:
    """A loss's trust-region width (module docstring).

    Attributes:
        unit: what the widths are, in words (``"ratio bound"``, ``"log-ratio bound"`` ...).
        power: ``w_k = w_0 f_k ** power`` under EPPO's pace ``f_k`` (non-native widths).
        native: the pacer's ``eps_k`` are the widths themselves (PPO family), starting at the
            pacer's ``(eps0, eps_high0)``.
        options: the config fields holding the ``(low, high)`` widths when they are options,
            not bounds (SAPO: ``("tau_neg", "tau_pos")``; DRO: ``("beta", "beta")``); None: the
            widths are bounds, defaulting to the loss's ``default_bounds``.
        low_below_one: the low width is subtracted from a ratio of 1 (``1 - eps_low``), so it
            must be ``< 1``.
        limits: ``(lo, hi)``, the finite positive range of either width (inclusive; default
            ``[1.2e-38, R]`` with ``R = e^20``, the largest ratio the losses see): a
            configured width outside it is refused, a paced one clamped into it.
    """

    unit: str
    power: float = 1.0
    native: bool = False
    options: tuple[str, str] | None = None
    low_below_one: bool = False
    limits: tuple[float, float] = (POSITIVE_MIN, RATIO_MAX)

    def __post_init__(self) -> None:
        if not (isinstance(self.power, int | float) and math.isfinite(self.power)):
            raise ValueError(f"power must be a finite number; got {self.power!r}")
        if self.native and self.options is not None:
            raise ValueError("a native (ratio-bound) width cannot live in options")
        lo, hi = self.limits
        if not (math.isfinite(hi) and 0.0 < lo <= hi):
            raise ValueError(f"limits must be 0 < lo <= hi < inf; got {self.limits}")

    @property
    def range_text(self) -> str:
        """The limits in words, e.g. ``"in [1.2e-38, 4.9e+08]"``."""
        return f"in [{self.limits[0]:.2g}, {self.limits[1]:.2g}]"

    def clamp(self, value: float, *, low: bool = False) -> float:
        """``value`` clamped into :attr:`limits` (and, for the ``low`` width of a
        ``low_below_one`` width, below 1 by float32's step there, ``2**-24``)."""
        lo, hi = self.limits
        if low and self.low_below_one:
            hi = min(hi, 1.0 - 2.0**-24)
        return min(max(float(value), lo), hi)

    def option_widths(self, config: Any) -> tuple[float, float]:
        """``(low, high)`` read from a loss config's width options."""
        if self.options is None:
            raise ValueError(f"the {self.unit} widths are bounds, not config options")
        low, high = (float(getattr(config, name)) for name in self.options)
        return low, high

    def check(self, low: Any, high: Any, where: str = "") -> None:
        """``ValueError`` unless both widths are numbers in :attr:`limits` (and ``low < 1``
        where the low width is subtracted from 1); ``where`` prefixes the message (e.g. a
        task's name). The check of a configured pair of widths (fixed, per task, at the pacer's
        start); the pacer's widths are clamped instead (:func:`paced_widths`)."""
        for name, value in (("eps_low", low), ("eps_high", high)):
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not (ok and self.limits[0] <= value <= self.limits[1]):
                raise ValueError(
                    f"{where}{name} ({self.unit}) must be a number {self.range_text}; got "
                    f"{value!r} (ALGORITHMS.md section 3, 'Widths')"
                )
        if self.low_below_one and not low < 1:
            raise ValueError(
                f"{where}eps_low must be < 1 (the lower bound is 1 - eps_low); got {low}"
            )


#: The PPO family's ratio bounds ``[1 - eps_low, 1 + eps_high]``, set by the pacer directly.
RATIO_WIDTH = TrustWidth("ratio bound", native=True, low_below_one=True)


def paced_widths(
    width: TrustWidth,
    eps: tuple[float, float],
    eps0: tuple[float, float],
    start: tuple[float, float],
) -> tuple[float, float]:
    """The loss's ``(low, high)`` widths for the pacer's per-task bounds ``eps``.

    Args:
        width: the loss's :class:`TrustWidth`.
        eps: the pacer's ``(eps_low_k, eps_high_k)`` (ratio half-widths).
        eps0: the pacer's ``(eps0, eps_high0)``, where its pace is 1.
        start: the loss's own widths at pace 1 (ignored for a native width).

    Returns:
        ``eps`` itself for a native width; else ``start_j (eps_j / eps0_j) ** power`` per side
        (its logarithm compared with the limits first: no overflow); either clamped into
        ``width.limits`` (:meth:`TrustWidth.clamp`): always finite and > 0. At
        ``eps == eps0`` this is ``start`` exactly (``start`` is within the limits).
    """
    out = []
    for side, (e, e0, w0) in enumerate(zip(eps, eps0, start, strict=True)):
        if width.native:
            w = float(e)
        elif e == e0:
            w = float(w0)
        else:  # the log first: w0 f**power itself may overflow (f = 1e-300 / 0.5, power -1)
            f = float(e) / float(e0)
            log_w = math.log(float(w0)) + width.power * math.log(f)
            lo, hi = width.limits
            w = hi if log_w >= math.log(hi) else lo if log_w <= math.log(lo) else w0 * f**width.power
        out.append(width.clamp(w, low=side == 0))
    return out[0], out[1]
