"""The cross-policy pool's members on the trainer side (``rollout.cross_policy``).

:class:`PolicyPool` keeps what :func:`entropace.rollout.collect_rollouts` needs as
``policies``: the ``k``-stale weight snapshots named by ``cross_policy.stale`` and the frozen
models named by ``cross_policy.models``. The trainer calls it in three places::

    pool = PolicyPool.build(cfg.rollout.cross_policy, load)             # once
    rollout = collect_rollouts(model, ..., policies=pool.members(model)) # each step
    pool.before_update(model)                                            # each step

Snapshots: ``before_update`` copies the current weights (about to become 1 update old) into a
ring of ``max(stale)`` model copies, so at the next rollout the ring's newest entry is the
policy 1 update behind, the one before it 2 behind, and so on. Before ``k`` updates have
happened, age ``k`` is the oldest snapshot there is (at the first step: the current weights).
Weights are copied in place into preallocated models (one ``load_state_dict`` per update), so
the pool's memory is ``max(stale)`` copies of the model. The ring is not checkpointed: a
resumed run restarts it from the resumed weights (ALGORITHMS.md section 8).
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from entropace.rollout.config import CrossPolicyConfig

__all__ = ["PolicyPool"]


def _frozen(model: Any) -> Any:
    model.eval()
    for module in model.modules():  # a deep copy shares ppo.checkpoint_* wrappers, whose
        wrapped = module.__dict__.get("forward")  # closures call the ORIGINAL module: drop them
        if getattr(wrapped, "entropace_checkpointed", False):
            del module.__dict__["forward"]
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class PolicyPool:
    """Stale snapshots and external models of cross-policy sampling (module docstring).

    Attributes:
        ages: the snapshot ages, in pool order (``cross_policy.stale``).
        external: the frozen models of ``cross_policy.models``, in pool order.
    """

    def __init__(self, ages: list[int], external: list[Any]) -> None:
        self.ages = list(ages)
        self.external = [_frozen(m) for m in external]
        self._ring: deque[Any] = deque()
        self._depth = max(self.ages, default=0)

    @classmethod
    def build(cls, cfg: CrossPolicyConfig, load: Callable[[str], Any]) -> PolicyPool | None:
        """The pool of ``cfg`` (None when cross-policy sampling is off); ``load(name)``
        returns the model ``name`` on the policy's device (the trainer's model loader)."""
        if not cfg.enabled:
            return None
        return cls(cfg.stale, [load(name) for name in cfg.models])

    def members(self, model: Any) -> list[Any]:
        """The pool after the current weights, in pool order: ``[*stale, *external]``."""
        stale = []
        for age in self.ages:
            if not self._ring:
                stale.append(model)  # no update yet: every snapshot is the current weights
            else:
                stale.append(self._ring[-min(age, len(self._ring))])
        return stale + self.external

    @torch.no_grad()
    def before_update(self, model: Any) -> None:
        """Snapshot the current weights (call right before the update)."""
        if self._depth == 0:
            return
        if len(self._ring) < self._depth:
            snapshot = _frozen(copy.deepcopy(model))
        else:
            snapshot = self._ring.popleft()
            snapshot.load_state_dict(model.state_dict())
        self._ring.append(snapshot)
