"""The reference / EMA-ratio tracker shared by the EPPO pacer and the PAPO polarity controller.

ALGORITHMS.md section 3: a signal ``x(s)`` (a task's mean token entropy for EPPO, the batch mean
entropy for PAPO) is turned into an EMA-smoothed retained ratio

    H^ref = mean of x over the first ``warmup_steps`` observations
    q(s)  = x(s) / H^ref
    m(s)  = beta * m(s-1) + (1 - beta) * q(s),      m = 1 at the start.

Warmup rule (our choice, the spec leaves it open for ``warmup_steps > 1``): during the first
``warmup_steps`` observations the values are only collected, ``m`` stays at 1 (the reference is
not known yet); the first EMA update is at observation ``warmup_steps + 1``. With the default
``warmup_steps = 1`` this is exactly the spec's recursion, whose first update has ``q = 1`` and
so leaves ``m = 1``.

A reference below ``REF_FLOOR = 1e-6`` (a signal that starts at 0, e.g. a reward variance when
every group fails) has nothing meaningful to be a ratio of (dividing by it would blow ``q`` up by
orders of magnitude): then ``q(s) = x(s)`` (the raw value). It is 0 while the
signal stays at 0, the same value as a ratio that lost everything, and grows when it departs.

``keep > 0`` also keeps the last ``keep`` ratios ``q`` (``recent``; the warm-up observations'
ratios are filled in when the reference completes), for a trend taken on the raw ratios rather
than on the EMA (the EPPO pacer's ``trend_source``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

REF_FLOOR = 1e-6


@dataclass
class RatioEMA:
    """State of one EMA ratio ``m`` (plain floats, JSON-serialisable via :meth:`state_dict`)."""

    beta: float
    warmup_steps: int
    count: int = 0
    warmup_values: list[float] = field(default_factory=list)
    ref: float | None = None
    m: float = 1.0
    m_prev: float = 1.0
    keep: int = 0
    recent: list[float] = field(default_factory=list)

    @property
    def ref_known(self) -> bool:
        """True from the observation that completes the reference on (``m`` is then 1 until
        the next observation updates it)."""
        return self.count >= self.warmup_steps

    def observe(self, x: float) -> None:
        """Record one observation ``x`` (finite, >= 0; checked by the caller).

        Raises:
            OverflowError: ``m`` would not be finite (the state is then left unchanged).
        """
        if self.count < self.warmup_steps:
            self.count += 1
            self.warmup_values.append(float(x))
            if self.count == self.warmup_steps:
                self.ref = math.fsum(self.warmup_values) / len(self.warmup_values)
                self._remember(*(self.ratio(v) for v in self.warmup_values))
            return
        q = self.ratio(x)
        m = self.beta * self.m + (1.0 - self.beta) * q
        if not math.isfinite(m):
            raise OverflowError(f"EMA ratio overflowed (x={x!r}, ref={self.ref!r})")
        self.count += 1
        self.m_prev, self.m = self.m, m
        self._remember(q)

    def ratio(self, x: float) -> float:
        """``q = x / H^ref`` (the raw ``x`` below ``REF_FLOOR``); the reference must be known."""
        assert self.ref is not None
        return x / self.ref if self.ref >= REF_FLOOR else float(x)

    def _remember(self, *qs: float) -> None:
        if self.keep:
            self.recent = [*self.recent, *map(float, qs)][-self.keep :]

    def state_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "warmup_values": list(self.warmup_values),
            "ref": self.ref,
            "m": self.m,
            "m_prev": self.m_prev,
            "recent": list(self.recent),
        }

    def load_state_dict(self, state: Any, where: str = "tracker") -> None:
        """Restore :meth:`state_dict` output, validated first (:class:`StateError` naming the
        field: counts, a warmup list that fits them, finite non-negative values)."""
        from entropace.control._state import (
            StateError,
            check_fields,
            check_int,
            check_number,
            check_optional_number,
        )

        s = check_fields(state, where, ("count", "warmup_values", "ref", "m", "m_prev", "recent"))
        count = check_int(s["count"], f"{where}.count")
        values = s["warmup_values"]
        if not isinstance(values, list) or len(values) != min(count, self.warmup_steps):
            raise StateError(
                f"{where}.warmup_values: expected a list of {min(count, self.warmup_steps)} "
                f"value(s) (count={count}, warmup_steps={self.warmup_steps}), got {values!r:.60}"
            )
        warm = [
            check_number(v, f"{where}.warmup_values[{i}]", lo=0.0) for i, v in enumerate(values)
        ]
        ref = check_optional_number(s["ref"], f"{where}.ref", lo=0.0)
        if (ref is None) != (count < self.warmup_steps):
            raise StateError(
                f"{where}.ref: {'missing' if ref is None else 'set'} with count={count} and "
                f"warmup_steps={self.warmup_steps}"
            )
        m = check_number(s["m"], f"{where}.m", lo=0.0)
        m_prev = check_number(s["m_prev"], f"{where}.m_prev", lo=0.0)
        recent = s["recent"]
        if not isinstance(recent, list) or len(recent) > self.keep:
            raise StateError(
                f"{where}.recent: expected a list of at most {self.keep} ratio(s), "
                f"got {recent!r:.60}"
            )
        kept = [check_number(v, f"{where}.recent[{i}]", lo=0.0) for i, v in enumerate(recent)]
        self.count, self.warmup_values, self.ref, self.m, self.m_prev = count, warm, ref, m, m_prev
        self.recent = kept


def check_beta_warmup(beta: float, warmup_steps: int) -> None:
    """Shared validation of the EMA options (clear errors naming the option)."""
    if not (isinstance(beta, int | float) and 0.0 <= beta < 1.0):
        raise ValueError(f"beta must be a float in [0, 1), got {beta!r}")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
        raise ValueError(f"warmup_steps must be an int >= 1, got {warmup_steps!r}")


def check_value(name: str, x: Any, *, lo: float = 0.0, hi: float = math.inf) -> float:
    """``float(x)`` if finite and in ``[lo, hi]``, else a ValueError naming ``name``."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a number, got {x!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name}: non-finite value {v!r}")
    if not lo <= v <= hi:
        raise ValueError(f"{name}: value {v!r} outside [{lo}, {hi}]")
    return v
