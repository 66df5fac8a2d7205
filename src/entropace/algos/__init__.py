"""Pure tensor functions: token statistics, entropy polarity, advantages, policy losses.

No config objects, no I/O, no host syncs in hot paths. Every later part of entropace (the
trainer, the TRL and verl plug-ins) calls these; their names are the public API.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> submodule that defines it
_EXPORTS: dict[str, str] = {
    "TokenStats": "token_stats",
    "token_stats": "token_stats",
    "entropy_polarity": "polarity",
    "polarity_reweight": "polarity",
    "grpo_advantages": "advantages",
    "dr_grpo_advantages": "advantages",
    "rloo_advantages": "advantages",
    "task_normalize_advantages": "advantages",
    "AGG_MODES": "aggregation",
    "aggregate_loss": "aggregation",
    "loss_counts": "aggregation",
    "check_mask": "aggregation",
    "LossOutput": "surrogate",
    "clipped_surrogate_loss": "surrogate",
    "kl_k3": "kl",
    "get_policy_loss": "policy_losses",
    "register_policy_loss": "policy_losses",
    "POLICY_LOSSES": "policy_losses",
    "PolicyLossFn": "policy_losses",
    "dcpo_bounds": "policy_losses",
    "dynamic_sampling_mask": "dapo",
    "overlong_penalty": "dapo",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = importlib.import_module(f"entropace.algos.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'entropace.algos' has no attribute {name!r}")
