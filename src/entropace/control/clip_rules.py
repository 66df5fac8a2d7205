"""Clip rules: where each token's clip bounds ``[1 - eps_low, 1 + eps_high]`` come from.

A registry (:data:`CLIP_RULES`, chosen by name: ``algorithm.clip_rule`` in our trainer, the
``algorithm=`` recipe in the TRL and verl plug-ins) of small adapters around the controllers of
this package, with one interface, so that no caller branches on the name:

* ``on_step(signals) -> {task: (eps_low, eps_high)}``: once per training step, from that step's
  rollout statistics (:class:`~entropace.control.signals.StepSignals`), BEFORE the update
  (EPPO's pacer updates here). Tasks present in ``signals`` get bounds.
* ``on_minibatch(logprobs, old_logprobs, advantages, mask) -> (eps_low, eps_high) | None``:
  once per optimiser step when ``needs_logprobs`` (BAPO's search, from the current policy).
* ``current_bounds() -> {task: (eps_low, eps_high)}``: the bounds as the rule stands, for the
  tasks it tracks (the others have ``default_bounds``).
* ``metrics(tasks) -> {name: float}``: the controller state to log for the given tasks
  (``task/<k>/pace_m``, ``task/<k>/pace_z``, ``bapo/c_low``, ...).
* ``state_dict()`` / ``load_state_dict()``: JSON-serialisable, for checkpoints.

Every rule is built from one :class:`ClipSettings` (the fixed bounds and the controllers'
validated configs) by :func:`build_clip_rule`; add one with ``@register_clip_rule("name")``.

Bounds are in the policy loss's own width units (``ClipSettings.width``,
:mod:`entropace.algos.widths`): ratio half-widths for the PPO family, GMPO's log-ratio bounds,
SAPO's temperatures ``(tau_neg, tau_pos)``, DPPO's thresholds ... The pacer maps each task's
pace to that width (:func:`entropace.algos.paced_widths`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from torch import Tensor

from entropace.algos.widths import RATIO_WIDTH, TrustWidth, paced_widths
from entropace.control._state import check_fields
from entropace.control.bapo import BapoClipController, BapoConfig
from entropace.control.pacer import EntropyPacer, PacerConfig
from entropace.control.signals import StepSignals

__all__ = [
    "CLIP_RULES",
    "BapoClip",
    "ClipRule",
    "ClipSettings",
    "FixedClip",
    "PacerClip",
    "build_clip_rule",
    "register_clip_rule",
]


@dataclass(frozen=True)
class ClipSettings:
    """What a clip rule is built from.

    Attributes:
        eps_low, eps_high: the fixed bounds (``fixed``), BAPO's bounds before its first
            search, and the widths at pace 1 of a loss whose width is not native to the pacer
            (``pacer``); in the loss's width units.
        task_bounds: ``fixed`` only: per-task bounds ``{task: (eps_low, eps_high)}`` (in the
            loss's width units) that replace ``eps_low`` / ``eps_high`` for the tasks named
            (fixed per-task trust regions, e.g. the per-task positive control of the pace lab:
            tight on one task, wide on another, in one shared policy).
        pacer: EPPO's pacer options (``pacer``).
        bapo: BAPO's search options (``bapo``).
        width: the policy loss's trust-region width (what the bounds are, how the pacer's
            pace moves them): ``eps_low`` / ``eps_high`` are in its units and, for a width not
            native to the pacer, are the widths at pace 1.
        seed: the run's seed (``pacer``: seeds the shuffled control's permutations).
    """

    eps_low: float = 0.2
    eps_high: float = 0.2
    task_bounds: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    pacer: PacerConfig = field(default_factory=PacerConfig)
    bapo: BapoConfig = field(default_factory=BapoConfig)
    width: TrustWidth = RATIO_WIDTH
    seed: int = 0

    def __post_init__(self) -> None:
        self.width.check(self.eps_low, self.eps_high)  # in the loss's units
        for task, pair in self.task_bounds.items():
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise ValueError(f"task_bounds[{task!r}] must be (eps_low, eps_high); got {pair!r}")
            self.width.check(*pair, f"task_bounds[{task!r}]: ")


class ClipRule(Protocol):
    #: ``(eps_low, eps_high)`` of a task the rule has not bounded yet (its starting bounds).
    default_bounds: tuple[float, float]
    #: True when ``on_minibatch`` needs the current policy's log-probs (one extra no-grad
    #: forward pass per optimiser step).
    needs_logprobs: bool

    def on_step(self, signals: StepSignals) -> dict[str, tuple[float, float]]: ...

    def on_minibatch(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[float, float] | None: ...

    def current_bounds(self) -> dict[str, tuple[float, float]]: ...

    def metrics(self, tasks: Iterable[str]) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Any, where: str = ...) -> None: ...


#: ``name -> constructor(settings)``.
CLIP_RULES: dict[str, Callable[[ClipSettings], ClipRule]] = {}


def register_clip_rule(name: str) -> Callable[[type], type]:
    """Class decorator adding a clip rule whose ``__init__`` takes a :class:`ClipSettings`."""

    def decorator(cls: type) -> type:
        if name in CLIP_RULES:
            raise ValueError(f"clip rule {name!r} is already registered")
        CLIP_RULES[name] = cls
        return cls

    return decorator


def build_clip_rule(name: str, settings: ClipSettings | None = None) -> ClipRule:
    """The clip rule ``name`` built from ``settings`` (defaults when None); ``KeyError``
    listing the known names otherwise."""
    if name not in CLIP_RULES:
        raise KeyError(f"unknown clip rule {name!r}; known: {sorted(CLIP_RULES)}")
    return CLIP_RULES[name](settings or ClipSettings())


class _Stateless:
    needs_logprobs = False

    def on_minibatch(self, *args: Tensor) -> tuple[float, float] | None:
        return None

    def current_bounds(self) -> dict[str, tuple[float, float]]:
        return {}

    def metrics(self, tasks: Iterable[str]) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Any, where: str = "rule") -> None:
        check_fields(state, where, ())


@register_clip_rule("fixed")
class FixedClip(_Stateless):
    """The same ``(eps_low, eps_high)`` at every step (PPO / GRPO / DAPO ...): for every task,
    or, for the tasks of ``settings.task_bounds``, that task's own pair."""

    def __init__(self, settings: ClipSettings) -> None:
        self.eps = (float(settings.eps_low), float(settings.eps_high))
        self.default_bounds = self.eps
        self.task_eps = {
            str(k): (float(lo), float(hi)) for k, (lo, hi) in settings.task_bounds.items()
        }

    def on_step(self, signals: StepSignals) -> dict[str, tuple[float, float]]:
        return {k: self.task_eps.get(k, self.eps) for k in signals.task_success}

    def current_bounds(self) -> dict[str, tuple[float, float]]:
        return dict(self.task_eps)


@register_clip_rule("pacer")
class PacerClip:
    """EPPO: per-task bounds from :class:`entropace.control.EntropyPacer` (ALGORITHMS.md 3).

    The pacer sees ``h_k`` (or, for the ablations, the success rate / reward variance) of the
    tasks present; absent tasks keep their state and last eps. A task present without any
    policy token (no entropy) gets the bounds it last had, ``eps0`` if it never had any.
    The pacer's bounds become the loss's widths by :func:`entropace.algos.paced_widths`,
    clamped at every step into the width's finite, positive limits
    (``settings.width``; ``settings.eps_low`` / ``eps_high`` are the widths at pace 1 of a
    width not native to the pacer).
    """

    needs_logprobs = False

    def __init__(self, settings: ClipSettings) -> None:
        self.pacer = EntropyPacer(config=settings.pacer, seed=settings.seed)
        self.width = settings.width
        self.start = (float(settings.eps_low), float(settings.eps_high))
        self.default_bounds = self.widths(settings.pacer.bounds0)

    def widths(self, bounds: tuple[float, float]) -> tuple[float, float]:
        """The loss's widths for the pacer's ``(eps_low_k, eps_high_k)``."""
        return paced_widths(self.width, bounds, self.pacer.config.bounds0, self.start)

    def on_step(self, signals: StepSignals) -> dict[str, tuple[float, float]]:
        self.pacer.update(
            signals.task_entropy,
            task_success=signals.task_success,
            task_reward_var=signals.task_reward_var,
        )
        current = self.current_bounds()
        default = self.default_bounds
        return {k: current.get(k, default) for k in signals.task_success}

    def on_minibatch(self, *args: Tensor) -> tuple[float, float] | None:
        return None

    def current_bounds(self) -> dict[str, tuple[float, float]]:
        return {k: self.widths(b) for k, b in self.pacer.bounds().items()}

    def metrics(self, tasks: Iterable[str]) -> dict[str, float]:
        """``task/<k>/pace_m`` (m_k), ``task/<k>/pace_z`` (z_k), ``task/<k>/pace_delta``
        (trend) and ``task/<k>/pace_ref`` (reference; absent during warmup) of ``tasks``."""
        return self.pacer.metrics(list(tasks))

    def state_dict(self) -> dict[str, Any]:
        return self.pacer.state_dict()

    def load_state_dict(self, state: Any, where: str = "rule") -> None:
        self.pacer.load_state_dict(state, where)


@register_clip_rule("bapo")
class BapoClip:
    """BAPO: bounds searched once per optimiser step by
    :class:`entropace.control.BapoClipController` from the current policy's log-probs."""

    needs_logprobs = True

    def __init__(self, settings: ClipSettings) -> None:
        self.ctrl = BapoClipController(config=settings.bapo)
        self.eps = (float(settings.eps_low), float(settings.eps_high))
        self.default_bounds = self.eps

    def on_step(self, signals: StepSignals) -> dict[str, tuple[float, float]]:
        return {k: self.eps for k in signals.task_success}

    def on_minibatch(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[float, float] | None:
        lo, hi = self.ctrl.update(logprobs, old_logprobs, advantages, mask)
        return float(lo), float(hi)

    def current_bounds(self) -> dict[str, tuple[float, float]]:
        return {}

    def metrics(self, tasks: Iterable[str]) -> dict[str, float]:
        """``bapo/c_low``, ``bapo/c_high``, ``bapo/positive_share`` of the last search."""
        return {k: float(v) for k, v in self.ctrl.metrics().items()}

    def state_dict(self) -> dict[str, Any]:
        return self.ctrl.state_dict()

    def load_state_dict(self, state: Any, where: str = "rule") -> None:
        self.ctrl.load_state_dict(state, where)
