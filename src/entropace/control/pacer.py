"""EPPO's entropy pacer: a per-task PPO clip range paced by each task's retained entropy.

Reference: Hu et al., "Entropy Pacing Policy Optimization for Multi-Task Agentic Reinforcement
Learning" (arXiv 2607.07178), as formulated in ``docs/ALGORITHMS.md`` section 3.

Per training step ``s`` and task ``k`` present in the step's rollout batch:

    q_k(s)   = h_k(s) / H_k^ref                           (H_k^ref: mean of the first
                                                            ``warmup_steps`` observed h_k)
    m_k(s)   = beta m_k(s-1) + (1 - beta) q_k(s)          (m_k = 1 at the start)
    z_k      = (m_k - mean_j m_j) / (std_j m_j + 1e-8)    (j over the present, warmed-up tasks;
                                                            population std; z = 0 if < 2 tasks)
    eps_k    = eps0 (1 + alpha tanh z_k)
    delta_k  = max(0, qbar_k(s) - qbar_k(s-W)) / qbar_k(s-W)   (trend constraint, if ``trend``;
                                                            qbar: mean q_k of W observations)
    eps_k   <- eps_k / (1 + delta_k)
    eps_k   <- clip(eps_k, eps_min, eps_max)

The clip bounds of task k's tokens are ``[1 - eps_k, 1 + eps_high_k]`` with ``eps_high_k = eps_k``
(symmetric) or ``eps_k * eps_high0 / eps0`` (asymmetric variant, ``eps_high0`` given).

Conventions the spec leaves open (ours, tested):

- Warmup: during a task's first ``warmup_steps`` observations its reference is being collected
  and ``m_k`` stays 1. Until the observation that completes the reference, the task gets
  ``eps_k = eps0`` exactly, ``z_k = delta_k = 0``, and it is not part of the cohort over which
  the z-scores are computed. From that observation on (the first one with the default
  ``warmup_steps = 1``, as in ALGORITHMS.md's recursion, whose first update has ``q = 1`` and
  leaves ``m = 1``) it is in the cohort with ``m_k = 1``, also when it first appears after the
  other tasks: a task that starts late is paced against the others at once.
- A task absent from a step keeps its state and its last ``eps_k`` (it is neither updated nor part
  of that step's cohort).
- The trend's denominator is floored at 1e-8.
- ``trend_source`` (ALGORITHMS.md section 3, "Trend constraint"): what ``delta_k`` compares.
  ``"window"`` (default): the mean ``q_k`` of the last ``trend_window`` observations against the
  mean of the ``trend_window`` before them (0 until ``2 W`` ratios are known);
  ``"step"``: ``q_k(s)`` against ``q_k(s-1)`` (``W = 1``); ``"ema"`` (the form before issue 23):
  ``m_k(s)`` against ``m_k(s-1)``, which an EMA of weight ``1 - beta`` keeps below
  ``(1 - beta) |q_k - m_k| / m_k`` per step (about 1e-3 on the lab: inert).

Ablations (EPPO paper Table 4 and the control its review asks for):

- ``task_wise=False`` ("w/o task-wise clip"): the paper's baseline is GRPO's global fixed clip,
  so every task gets ``eps0`` (and ``eps_high0``) every step. ``m``, ``z`` and ``delta`` are still
  tracked and logged, so the run shows the pace mismatch the clip is not reacting to.
- ``trend=False`` ("w/o trend constraint"): ``delta_k`` is computed and logged, not applied.
- ``shuffle=True`` (the shuffled-eps control of issue 23): after the bounds are computed, the
  step's ``eps_k`` are permuted across the present tasks, by a permutation seeded by the run's
  seed and the step count (``EntropyPacer(seed=...)``; issue 35: seeded by the step alone, every
  seed of an experiment got the same schedule, so the control did not vary by seed). The set of
  clip ranges is EPPO's, their assignment to tasks is random: a per-task effect that survives it
  is not EPPO's pacing.
- ``signal``: what drives the pacer in the slot of ``h_k``:

  * ``"entropy"`` (EPPO): ``x_k = h_k``, the mean sampling entropy of task k's tokens.
  * ``"success"``: ``x_k = 1 - success_k``, the task's failure rate. Success rises as a task is
    learnt while entropy falls; the failure rate falls like entropy does, so the pacer keeps its
    meaning: the task furthest ahead of the cohort (relative to where it started) gets the
    tighter trust region, the lagging one the looser one. The EMA ``m_k`` makes it the "EMA
    success rate" control; ``q_k`` is the failure rate relative to the task's starting failure
    rate (the raw failure rate if that was below 1e-6: the task started solved).
  * ``"reward_var"``: ``x_k`` = the task's reward variance in the batch (high while the task
    still separates good from bad episodes, 0 once it is solved or hopeless), used like entropy.

  The present tasks of a step are the keys of the dict that drives the signal. A reference
  below 1e-6 makes ``q_k`` the raw value ``x_k`` (see :mod:`entropace.control._ratio`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from entropace.control._ratio import RatioEMA, check_beta_warmup, check_value
from entropace.control._state import (
    StateError,
    check_config,
    check_fields,
    check_int,
    check_number,
    check_optional_number,
)

__all__ = ["EntropyPacer", "PacerConfig", "SIGNALS", "TREND_SOURCES"]

Z_EPS = 1e-8
M_FLOOR = 1e-8


@dataclass(frozen=True)
class _Signal:
    """How one driving signal enters the pacer: which ``update`` argument, and its transform."""

    argument: str  # the ``update`` keyword that carries it
    upper: float  # largest valid input value
    transform: Callable[[float], float]  # input value -> x_k, the value in the slot of h_k


#: The signals the pacer can be driven by (``signal=`` option).
SIGNALS: dict[str, _Signal] = {
    "entropy": _Signal("task_entropy", math.inf, lambda h: h),
    "success": _Signal("task_success", 1.0, lambda success: 1.0 - success),
    "reward_var": _Signal("task_reward_var", math.inf, lambda var: var),
}
_UPPER = {s.argument: s.upper for s in SIGNALS.values()}
#: What the trend constraint's delta compares (``trend_source=``).
TREND_SOURCES = ("window", "step", "ema")


@dataclass(frozen=True)
class PacerConfig:
    """Validated options of :class:`EntropyPacer` (defaults: EPPO paper / ALGORITHMS.md)."""

    eps0: float = 0.2
    alpha: float = 0.4
    beta: float = 0.95
    eps_min: float = 0.15
    eps_max: float = 0.30
    warmup_steps: int = 1
    trend: bool = True
    trend_source: Literal["window", "step", "ema"] = "window"
    trend_window: int = 5
    task_wise: bool = True
    shuffle: bool = False
    signal: Literal["entropy", "success", "reward_var"] = "entropy"
    eps_high0: float | None = None

    def __post_init__(self) -> None:
        for name in ("eps0", "eps_min", "eps_max"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and 0.0 < v < 1.0):
                raise ValueError(f"{name} must be a float in (0, 1), got {v!r}")
        if not self.eps_min <= self.eps0 <= self.eps_max:
            raise ValueError(
                f"need eps_min <= eps0 <= eps_max, got eps_min={self.eps_min}, "
                f"eps0={self.eps0}, eps_max={self.eps_max}"
            )
        if not (isinstance(self.alpha, int | float) and 0.0 <= self.alpha < 1.0):
            raise ValueError(f"alpha must be a float in [0, 1), got {self.alpha!r}")
        check_beta_warmup(self.beta, self.warmup_steps)
        for name in ("trend", "task_wise", "shuffle"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.trend_source not in TREND_SOURCES:
            raise ValueError(
                f"unknown trend_source {self.trend_source!r}; allowed values: "
                + ", ".join(TREND_SOURCES)
            )
        w = self.trend_window
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= 1000:
            raise ValueError(f"trend_window must be an int in [1, 1000], got {w!r}")
        if self.signal not in SIGNALS:
            raise ValueError(
                f"unknown signal {self.signal!r}; allowed values: {', '.join(sorted(SIGNALS))}"
            )
        if self.eps_high0 is not None and not (
            isinstance(self.eps_high0, int | float) and 0.0 < self.eps_high0
        ):
            raise ValueError(f"eps_high0 must be None or a float > 0, got {self.eps_high0!r}")

    @property
    def bounds0(self) -> tuple[float, float]:
        """``(eps_low, eps_high)`` of a task before the pacer moves it: ``(eps0, eps_high0)``,
        ``eps_high0`` defaulting to ``eps0`` (the one place this default is resolved)."""
        return (self.eps0, self.eps0 if self.eps_high0 is None else self.eps_high0)


@dataclass
class _TaskState:
    tracker: RatioEMA
    eps: float
    z: float = 0.0
    delta: float = 0.0
    last_input: float | None = None


class EntropyPacer:
    """EPPO's task-wise clip controller (see the module docstring for the formulas).

    Example::

        pacer = EntropyPacer()
        eps = pacer.update({"alfworld": 0.91, "db": 1.40})   # {task: eps_k}, once per step
        lo_hi = pacer.bounds()                                # {task: (eps_low, eps_high)}
    """

    def __init__(
        self, config: PacerConfig | None = None, *, seed: int = 0, **options: Any
    ) -> None:
        """Build from a validated ``config`` or from its fields as keyword options. ``seed``
        (the run's seed) seeds the permutations of ``shuffle=True`` with the step count."""
        if config is not None and options:
            raise ValueError("pass either config= or keyword options, not both")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.config = config if config is not None else PacerConfig(**options)
        self.seed = seed
        self._tasks: dict[str, _TaskState] = {}
        self.steps = 0

    # ----------------------------------------------------------------------------------- update
    def update(
        self,
        task_entropy: Mapping[str, float],
        *,
        task_success: Mapping[str, float] | None = None,
        task_reward_var: Mapping[str, float] | None = None,
    ) -> dict[str, float]:
        """Advance one training step; return ``{task: eps_k}`` for the tasks present.

        Args:
            task_entropy: ``{task: h_k}``, mean sampling entropy of the task's masked tokens.
            task_success: ``{task: success rate in [0, 1]}`` (needed for ``signal="success"``).
            task_reward_var: ``{task: reward variance >= 0}`` (for ``signal="reward_var"``).

        Raises:
            ValueError: a NaN/inf/out-of-range value (naming the task), or the signal's input
                missing.
        """
        cfg = self.config
        inputs = {
            "task_entropy": task_entropy,
            "task_success": task_success,
            "task_reward_var": task_reward_var,
        }
        for arg, values in inputs.items():
            if values is not None:
                for task, v in values.items():
                    check_value(f"{arg}[{task!r}]", v, hi=_UPPER[arg])
        sig = SIGNALS[cfg.signal]
        driving = inputs[sig.argument]
        if driving is None:
            raise ValueError(f"signal={cfg.signal!r} needs the {sig.argument}= argument")

        backup = self.state_dict()  # restored if a task's ratio overflows mid-step
        self.steps += 1
        present = list(driving)
        for task in present:
            state = self._tasks.get(task)
            if state is None:
                state = _TaskState(self._tracker(), eps=cfg.eps0)
                self._tasks[task] = state
            x = sig.transform(float(driving[task]))
            try:
                state.tracker.observe(x)
            except OverflowError as err:
                self.load_state_dict(backup)
                raise ValueError(f"{sig.argument}[{task!r}]: {err}") from None
            state.last_input = x

        # Pace z-score over the present tasks whose reference is known (population std).
        cohort = [t for t in present if self._tasks[t].tracker.ref_known]
        ms = [self._tasks[t].tracker.m for t in cohort]
        if len(cohort) >= 2:
            mean = math.fsum(ms) / len(ms)
            scale = max(abs(m - mean) for m in ms)  # scaled so that huge m cannot overflow
            dev2 = math.fsum(((m - mean) / scale) ** 2 for m in ms) if scale > 0 else 0.0
            std = scale * math.sqrt(dev2 / len(ms))
        for task in present:
            state = self._tasks[task]
            tr = state.tracker
            if not tr.ref_known:
                state.eps, state.z, state.delta = cfg.eps0, 0.0, 0.0
                continue
            state.z = (tr.m - mean) / (std + Z_EPS) if len(cohort) >= 2 else 0.0
            state.delta = self._delta(tr)
            if not cfg.task_wise:
                state.eps = cfg.eps0
                continue
            eps = cfg.eps0 * (1.0 + cfg.alpha * math.tanh(state.z))
            if cfg.trend:
                eps = eps / (1.0 + state.delta)
            state.eps = min(max(eps, cfg.eps_min), cfg.eps_max)
        if cfg.shuffle:
            self._shuffle(present)
        return {task: self._tasks[task].eps for task in present}

    def _shuffle(self, present: list[str]) -> None:
        """The shuffled-eps control: permute this step's ``eps_k`` across the present tasks
        (a permutation seeded by the run's seed and the step count: it varies by seed, and a
        resumed run draws the same ones)."""
        order = sorted(present)
        values = [self._tasks[t].eps for t in order]
        random.Random(f"entropace-pacer-shuffle:{self.seed}:{self.steps}").shuffle(values)
        for task, eps in zip(order, values):
            self._tasks[task].eps = eps

    def _tracker(self) -> RatioEMA:
        cfg = self.config
        keep = 0 if cfg.trend_source == "ema" else 2 * self._window()
        return RatioEMA(cfg.beta, cfg.warmup_steps, keep=keep)

    def _window(self) -> int:
        return 1 if self.config.trend_source == "step" else self.config.trend_window

    def _delta(self, tr: RatioEMA) -> float:
        """The trend term ``delta_k`` of a warmed-up task (see the module docstring)."""
        if self.config.trend_source == "ema":
            return max(0.0, tr.m - tr.m_prev) / max(tr.m_prev, M_FLOOR)
        w = self._window()
        if len(tr.recent) < 2 * w:
            return 0.0
        now = math.fsum(tr.recent[-w:]) / w
        before = math.fsum(tr.recent[-2 * w : -w]) / w
        return max(0.0, now - before) / max(before, M_FLOOR)

    # ---------------------------------------------------------------------------------- queries
    @property
    def tasks(self) -> list[str]:
        """Every task seen so far, in first-seen order."""
        return list(self._tasks)

    def eps(self) -> dict[str, float]:
        """``{task: eps_k}``, the last value of every task seen (absent ones keep theirs)."""
        return {t: s.eps for t, s in self._tasks.items()}

    def eps_high(self) -> dict[str, float]:
        """``{task: eps_high_k}``: ``eps_k``, or ``eps_k * eps_high0 / eps0`` if asymmetric."""
        cfg = self.config
        scale = cfg.bounds0[1] / cfg.eps0
        return {t: s.eps * scale for t, s in self._tasks.items()}

    def bounds(self) -> dict[str, tuple[float, float]]:
        """``{task: (eps_low, eps_high)}``; token ratios are clipped to ``[1-lo, 1+hi]``."""
        high = self.eps_high()
        return {t: (s.eps, high[t]) for t, s in self._tasks.items()}

    def snapshot(self) -> dict[str, dict[str, float | None]]:
        """Per task: ``eps_low, eps_high, m, z, delta, ref, input`` (for logging)."""
        high = self.eps_high()
        return {
            t: {
                "eps_low": s.eps,
                "eps_high": high[t],
                "m": s.tracker.m,
                "z": s.z,
                "delta": s.delta,
                "ref": s.tracker.ref,
                "input": s.last_input,
            }
            for t, s in self._tasks.items()
        }

    def metrics(self, tasks: list[str] | None = None) -> dict[str, float]:
        """Flat ``metrics.jsonl`` keys ``task/<k>/pace_m`` (m_k), ``pace_z`` (z_k),
        ``pace_delta`` (the trend term) and ``pace_ref`` (the reference; absent until known)
        for ``tasks`` (default: every task seen). The bounds themselves are logged by the
        caller from the bounds it used (``task/<k>/eps_low``, ``task/<k>/eps_high``)."""
        out: dict[str, float] = {}
        for t, snap in self.snapshot().items():
            if tasks is not None and t not in tasks:
                continue
            for key in ("m", "z", "delta", "ref"):
                if snap[key] is not None:
                    out[f"task/{t}/pace_{key}"] = float(snap[key])  # type: ignore[arg-type]
        return out

    # ------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (config, step count, per-task trackers and outputs)."""
        return {
            "config": asdict(self.config),
            "steps": self.steps,
            "tasks": {
                t: {
                    "tracker": s.tracker.state_dict(),
                    "eps": s.eps,
                    "z": s.z,
                    "delta": s.delta,
                    "last_input": s.last_input,
                }
                for t, s in self._tasks.items()
            },
        }

    def load_state_dict(self, state: Any, where: str = "pacer") -> None:
        """Restore :meth:`state_dict` output, validated first: the config must equal this
        pacer's; every task's ``eps`` in ``[eps_min, eps_max]`` (``eps0`` without task-wise
        pacing), ``z`` finite, ``delta >= 0``, its tracker consistent; ``steps`` an int >= 0.
        A :class:`StateError` naming the field otherwise, and nothing is loaded."""
        cfg = self.config
        s = check_fields(state, where, ("config", "steps", "tasks"))
        check_config("EntropyPacer", asdict(cfg), s["config"], f"{where}.config")
        steps = check_int(s["steps"], f"{where}.steps")
        saved = s["tasks"]
        if not isinstance(saved, Mapping):
            raise StateError(
                f"{where}.tasks: expected an object {{task: state}}, got {saved!r:.60}"
            )
        lo, hi = (cfg.eps_min, cfg.eps_max) if cfg.task_wise else (cfg.eps0, cfg.eps0)
        tasks: dict[str, _TaskState] = {}
        for t, entry in saved.items():
            at = f"{where}.tasks[{t!r}]"
            e = check_fields(entry, at, ("tracker", "eps", "z", "delta", "last_input"))
            tracker = self._tracker()
            tracker.load_state_dict(e["tracker"], f"{at}.tracker")
            tasks[str(t)] = _TaskState(
                tracker,
                eps=check_number(e["eps"], f"{at}.eps", lo=lo, hi=hi),
                z=check_number(e["z"], f"{at}.z"),
                delta=check_number(e["delta"], f"{at}.delta", lo=0.0),
                last_input=check_optional_number(e["last_input"], f"{at}.last_input", lo=0.0),
            )
        self._tasks = tasks
        self.steps = steps
