"""Diagnostics: pace mismatch over entropy curves (EPPO) and the polarity audit (PAPO)."""

from entropace.diagnostics.pace import (
    Crossover,
    crossover_count,
    crossover_events,
    ema_smooth,
    max_rise,
    r2_log_fit,
    spike_amplitude,
    trend_r2,
)
from entropace.diagnostics.polarity_audit import average_ranks, polarity_audit, spearman

__all__ = [
    "Crossover",
    "average_ranks",
    "crossover_count",
    "crossover_events",
    "ema_smooth",
    "max_rise",
    "polarity_audit",
    "r2_log_fit",
    "spearman",
    "spike_amplitude",
    "trend_r2",
]
