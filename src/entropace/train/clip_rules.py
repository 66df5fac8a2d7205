"""Clip rules: where each token's clip bounds ``[1 - eps_low, 1 + eps_high]`` come from.

A registry (``algorithm.clip_rule``) of small adapters around the controllers of
:mod:`entropace.control`, with one interface so the update step never branches on the name:

* ``on_step(signals) -> {task: (eps_low, eps_high)}``: once per training step, from that step's
  rollout statistics, BEFORE the update (EPPO's pacer updates here).
* ``on_minibatch(logprobs, old_logprobs, advantages, mask) -> (eps_low, eps_high) | None``:
  once per optimiser step when ``needs_logprobs`` (BAPO's search, from the current policy).
* ``metrics() -> {name: float}``: controller state to log (``task/<k>/pace_m``, ...).
* ``state_dict()`` / ``load_state_dict()``: JSON-serialisable, for checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from torch import Tensor

from entropace.train.config import AlgorithmConfig


@dataclass
class StepSignals:
    """Per-task statistics of one step's rollout batch (tasks present in the batch only).

    Attributes:
        task_entropy: ``h_k``, mean sampling entropy over task k's masked tokens.
        task_success: success rate of task k's episodes.
        task_reward_var: population variance of task k's episode rewards.
    """

    task_entropy: dict[str, float] = field(default_factory=dict)
    task_success: dict[str, float] = field(default_factory=dict)
    task_reward_var: dict[str, float] = field(default_factory=dict)


class ClipRule(Protocol):
    #: True when ``on_minibatch`` needs the current policy's log-probs (one extra no-grad
    #: forward pass per optimiser step).
    needs_logprobs: bool

    def on_step(self, signals: StepSignals) -> dict[str, tuple[float, float]]: ...

    def on_minibatch(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[float, float] | None: ...

    def metrics(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class FixedClip:
    """The same ``(eps_low, eps_high)`` for every task and step (PPO / GRPO / DAPO ...)."""

    needs_logprobs = False

    def __init__(self, cfg: AlgorithmConfig) -> None:
        self.eps = (float(cfg.eps_low), float(cfg.eps_high))

    def on_step(self, signals: StepSignals) -> dict[str, tuple[float, float]]:
        return {k: self.eps for k in signals.task_entropy}

    def on_minibatch(self, *args: Tensor) -> tuple[float, float] | None:
        return None

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class PacerClip:
    """EPPO: per-task bounds from :class:`entropace.control.EntropyPacer` (ALGORITHMS.md 3).

    The pacer sees ``h_k`` (or, for the ablations, the success rate / reward variance) of the
    tasks present; absent tasks keep their state and last eps.
    """

    needs_logprobs = False

    def __init__(self, cfg: AlgorithmConfig) -> None:
        from entropace.control import EntropyPacer

        self.pacer = EntropyPacer(config=cfg.pacer)

    def on_step(self, signals: StepSignals) -> dict[str, tuple[float, float]]:
        self.pacer.update(
            signals.task_entropy,
            task_success=signals.task_success,
            task_reward_var=signals.task_reward_var,
        )
        bounds = self.pacer.bounds()
        return {k: (float(bounds[k][0]), float(bounds[k][1])) for k in signals.task_entropy}

    def on_minibatch(self, *args: Tensor) -> tuple[float, float] | None:
        return None

    def metrics(self) -> dict[str, float]:
        """``task/<k>/pace_m`` (m_k), ``task/<k>/pace_z`` (z_k), ``task/<k>/pace_delta``
        (trend) and ``task/<k>/pace_ref`` (reference; absent during warmup), every task seen."""
        out: dict[str, float] = {}
        for task, snap in self.pacer.snapshot().items():
            for key in ("m", "z", "delta", "ref"):
                if snap.get(key) is not None:
                    out[f"task/{task}/pace_{key}"] = float(snap[key])
        return out

    def state_dict(self) -> dict[str, Any]:
        return self.pacer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pacer.load_state_dict(state)


class BapoClip:
    """BAPO: bounds searched once per optimiser step by
    :class:`entropace.control.BapoClipController` from the current policy's log-probs."""

    needs_logprobs = True

    def __init__(self, cfg: AlgorithmConfig) -> None:
        from entropace.control import BapoClipController

        self.ctrl = BapoClipController(config=cfg.bapo)
        self.eps = (float(cfg.eps_low), float(cfg.eps_high))

    def on_step(self, signals: StepSignals) -> dict[str, tuple[float, float]]:
        return {k: self.eps for k in signals.task_entropy}

    def on_minibatch(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[float, float] | None:
        lo, hi = self.ctrl.update(logprobs, old_logprobs, advantages, mask)
        return float(lo), float(hi)

    def metrics(self) -> dict[str, float]:
        """``bapo/c_low``, ``bapo/c_high``, ``bapo/positive_share`` of the last search."""
        return {k: float(v) for k, v in self.ctrl.metrics().items()}

    def state_dict(self) -> dict[str, Any]:
        return self.ctrl.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ctrl.load_state_dict(state)


#: ``algorithm.clip_rule`` -> constructor taking the algorithm config.
CLIP_RULES: dict[str, type] = {"fixed": FixedClip, "pacer": PacerClip, "bapo": BapoClip}


def build_clip_rule(cfg: AlgorithmConfig) -> ClipRule:
    """The clip rule ``cfg.clip_rule`` (names listed in :data:`CLIP_RULES`)."""
    if cfg.clip_rule not in CLIP_RULES:
        raise KeyError(f"unknown clip rule {cfg.clip_rule!r}; known: {sorted(CLIP_RULES)}")
    return CLIP_RULES[cfg.clip_rule](cfg)
