"""The multi-turn rollout engine and the batch it hands to the update.

* :func:`collect_rollouts` - sample episodes with a model, one batched ``generate`` per turn.
* :class:`RolloutConfig`, :class:`RolloutRequest`, :class:`RolloutResult`.
* :class:`RolloutBatch` - the agreed contract with the update (``rollout/batch.py``).
* :func:`sequence_token_stats` - per-token log-prob / entropy / PAPO terms of trajectories.
"""

from __future__ import annotations

from entropace._lazy import lazy_getattr

_EXPORTS: dict[str, str] = {
    "EpisodeRecord": "batch",
    "RolloutBatch": "batch",
    "RolloutConfig": "config",
    "RolloutRequest": "types",
    "RolloutResult": "types",
    "END_REASONS": "types",
    "collect_rollouts": "engine",
    "ChatLayout": "chat",
    "sequence_token_stats": "stats",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS)
