"""Diagnostics: pace mismatch over entropy curves (EPPO) and the polarity audit (PAPO).

The training-time audit (:mod:`entropace.diagnostics.training_audit`, torch) is exported lazily,
so that the numpy-only diagnostics (and ``entropace report``) do not import torch.
"""

from entropace._lazy import lazy_getattr
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

_LAZY: dict[str, str] = {
    name: "training_audit"
    for name in (
        "TrainingAudit",
        "first_order_entropy_change",
        "parameter_step_norm",
        "probe_audit",
        "realised_audit",
        "realised_changes",
        "sample_states",
        "state_logits",
    )
}

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
    *sorted(_LAZY),
]

__getattr__ = lazy_getattr(__name__, _LAZY)
