"""PAPO's phase controller: branch weights for entropy-expanding vs contracting token updates.

Reference: ``docs/ALGORITHMS.md`` section 4 (PAPO, entropy polarity). Once per training step,
from the batch mean token entropy ``Hbar(s)`` of the rollout:

    rho(s) = m(s),  m(s) = beta m(s-1) + (1 - beta) Hbar(s) / Hbar_ref   (m = 1 at the start,
                                                                          Hbar_ref = mean of the
                                                                          first warmup_steps)
    g(s)   = rho(s) - rho(s-1)                                           (0 at the first step)
    u      = tanh(kappa (rho_target - rho) - kappa_slope g)              in (-1, 1)
    w_plus = 1 + lam u,   w_minus = 1 - lam u                            in [1 - lam, 1 + lam]

``u > 0`` (entropy below target, or falling) favours the entropy-expanding branch ``P > 0``.
The EMA, reference and warmup rules are EPPO's (see :mod:`entropace.control._ratio`), with
PAPO's own EMA weight ``beta = 0.5`` (ALGORITHMS.md section 4: with EPPO's 0.95 the phase
signal lagged a collapse that halved the entropy in 5 steps, and PAPO favoured contraction
throughout it; issue 35). During
warmup ``rho = 1`` and ``g = 0``, so ``u = tanh(kappa (rho_target - 1))``: with
``rho_target = 0.6`` and ``kappa = 4``, ``u = -0.92`` (``w_plus = 0.54``, ``w_minus = 1.46``):
entropy is at its reference, above target, and contraction is strongly favoured until the
phase signal has fallen towards the target.

The weights are applied by :func:`entropace.algos.polarity_reweight` to the advantages, before any
policy loss sees them (``A' = w_plus A`` where ``P > 0``, ``w_minus A`` where ``P < 0``, then a
rescale that keeps ``sum |A'| = sum |A|``); PAPO has no loss of its own, and this object only
holds the phase state.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from entropace.control._ratio import RatioEMA, check_beta_warmup, check_value
from entropace.control._state import check_config, check_fields, check_int, check_number

__all__ = ["PolarityConfig", "PolarityController"]


@dataclass(frozen=True)
class PolarityConfig:
    """Validated options of :class:`PolarityController` (defaults: ALGORITHMS.md section 4)."""

    rho_target: float = 0.6
    kappa: float = 4.0
    kappa_slope: float = 20.0
    lam: float = 0.5
    beta: float = 0.5  # not EPPO's 0.95: the phase must see a fast collapse (issue 35)
    warmup_steps: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.rho_target, int | float) and self.rho_target > 0):
            raise ValueError(f"rho_target must be a float > 0, got {self.rho_target!r}")
        for name in ("kappa", "kappa_slope"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite float >= 0, got {v!r}")
        if not (isinstance(self.lam, int | float) and 0.0 <= self.lam <= 1.0):
            raise ValueError(f"lam must be a float in [0, 1], got {self.lam!r}")
        check_beta_warmup(self.beta, self.warmup_steps)


class PolarityController:
    """PAPO's branch-weight controller (formulas in the module docstring).

    Attributes (after each :meth:`update`): ``rho``, ``g``, ``u``, ``w_plus``, ``w_minus``.
    """

    def __init__(self, config: PolarityConfig | None = None, **options: Any) -> None:
        """Build from a validated ``config`` or from its fields as keyword options."""
        if config is not None and options:
            raise ValueError("pass either config= or keyword options, not both")
        self.config = config if config is not None else PolarityConfig(**options)
        self._tracker = RatioEMA(self.config.beta, self.config.warmup_steps)
        self.rho = 1.0
        self.g = 0.0
        self.u = self._phase(self.rho, self.g)
        self.steps = 0

    def _phase(self, rho: float, g: float) -> float:
        cfg = self.config
        return math.tanh(cfg.kappa * (cfg.rho_target - rho) - cfg.kappa_slope * g)

    @property
    def w_plus(self) -> float:
        return 1.0 + self.config.lam * self.u

    @property
    def w_minus(self) -> float:
        return 1.0 - self.config.lam * self.u

    def update(self, batch_entropy: float) -> tuple[float, float]:
        """Advance one step with the batch mean token entropy; return ``(w_plus, w_minus)``.

        Raises:
            ValueError: ``batch_entropy`` NaN, infinite or negative.
        """
        h = check_value("batch_entropy", batch_entropy)
        self._tracker.observe(h)
        self.steps += 1
        rho = self._tracker.m
        self.g = rho - self.rho
        self.rho = rho
        self.u = self._phase(self.rho, self.g)
        return self.w_plus, self.w_minus

    @property
    def ref(self) -> float | None:
        """``Hbar_ref`` (None during warmup)."""
        return self._tracker.ref

    def metrics(self) -> dict[str, float]:
        """Flat ``metrics.jsonl`` keys ``polarity/{w_plus,w_minus,u,rho}``."""
        return {
            "polarity/w_plus": self.w_plus,
            "polarity/w_minus": self.w_minus,
            "polarity/u": self.u,
            "polarity/rho": self.rho,
        }

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state."""
        return {
            "config": asdict(self.config),
            "tracker": self._tracker.state_dict(),
            "rho": self.rho,
            "g": self.g,
            "u": self.u,
            "steps": self.steps,
        }

    def load_state_dict(self, state: Any, where: str = "polarity") -> None:
        """Restore :meth:`state_dict` output, validated first: the config must equal this
        controller's, ``rho >= 0``, ``g`` finite, ``u`` in ``[-1, 1]`` (so ``w_plus, w_minus``
        stay in ``[1 - lam, 1 + lam]``), ``steps`` an int >= 0; a :class:`StateError` naming
        the field otherwise, and nothing is loaded."""
        s = check_fields(state, where, ("config", "tracker", "rho", "g", "u", "steps"))
        check_config("PolarityController", asdict(self.config), s["config"], f"{where}.config")
        tracker = RatioEMA(self.config.beta, self.config.warmup_steps)
        tracker.load_state_dict(s["tracker"], f"{where}.tracker")
        rho = check_number(s["rho"], f"{where}.rho", lo=0.0)
        g = check_number(s["g"], f"{where}.g")
        u = check_number(s["u"], f"{where}.u", lo=-1.0, hi=1.0)
        steps = check_int(s["steps"], f"{where}.steps")
        self._tracker, self.rho, self.g, self.u, self.steps = tracker, rho, g, u, steps
