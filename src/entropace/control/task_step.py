"""One training step's per-task control, the same for every engine (our trainer, TRL, verl).

:class:`TaskStep` owns the clip rule (:mod:`entropace.control.clip_rules`: EPPO's pacer, fixed
bounds, BAPO), PAPO's :class:`~entropace.control.PolarityController` and the task index. An
engine adapter calls, once per training step (one generation batch):

1. ``ids = step.task_ids(names)``: ``[B]`` long, each row's index into :attr:`TaskStep.tasks`;
2. ``sums = step.sums(entropy, mask, rewards, success, ids)``: the per-task reducible sums
   (:func:`entropace.control.task_sums`, float64 ``[7, K]``); on several processes the CALLER
   all-reduces them (SUM), so every rank takes the same decisions;
3. ``out = step.step(sums)``: the controllers advance BEFORE the update (ALGORITHMS.md 3-4):
   the clip rule from the step's :class:`~entropace.control.StepSignals` (``h_k`` ...), PAPO's
   controller from the batch mean token entropy ``Hbar = sum_k entropy_sum_k / sum_k tokens_k``
   (skipped, weights kept, when the batch has no policy token);
4. ``eps_low, eps_high = step.row_bounds(ids)``: ``[B, 1]`` float32 clip bounds of each row;
5. ``adv, masses = step.reweight(adv, sensitivity, mask)``: PAPO's
   ``A' = c w(P) A`` with ``P = A S`` (:func:`entropace.algos.polarity_reweight`; ``c`` keeps
   the GLOBAL batch's ``sum |A|`` when the caller passes its ``reduce``);
6. :attr:`TaskStep.metrics`: the step's metrics, in one naming for every engine (the plug-ins
   prefix them with ``entropace/``):

   - per task present: ``task/<k>/{success, reward, reward_std, entropy, abnormal, num_episodes,
     response_tokens, eps_low, eps_high}`` (``entropy`` NaN when the task had no policy token)
     and the clip rule's own (``task/<k>/pace_{m,z,delta,ref}``, ``bapo/...``);
   - the batch: ``entropy``, ``reward``, ``success``, ``abnormal``, ``response_tokens``;
   - PAPO: ``polarity/{w_plus, w_minus, u, rho}`` and, after :meth:`reweight`,
     ``polarity/{pos_mass, neg_mass}`` (shares of ``sum |A|`` on ``P > 0`` / ``P < 0``
     tokens, before reweighting; NaN when ``sum |A| = 0``: no share is defined) and, given
     the rows' task ids, ``task/<k>/papo_pressure = sum_k |A'| / sum_k |A|`` over task k's
     masked tokens: the batch-wide rescale keeps the total, so PAPO moves pressure between
     tasks whose branch masses differ (issue 35: favouring contraction took pressure from the
     task whose mass was mostly expanding).

State: :meth:`TaskStep.state_dict` is the one controller-state format every engine writes (our
trainer's ``state.json["controller"]``, the TRL plug-in's ``entropace_state.json``, the verl
trainer's ``entropace.json``); :meth:`TaskStep.load_state_dict` / :meth:`load_state_file`
validate it all (schema, finite values in range, the run's task names and configs) before
loading anything, and name the file in every error (:class:`StateError`).
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from entropace import algos
from entropace.control._state import StateError, check_fields, check_int, read_state_file
from entropace.control.clip_rules import CLIP_RULES, ClipRule, ClipSettings, build_clip_rule
from entropace.control.polarity_controller import PolarityConfig, PolarityController
from entropace.control.signals import StepSignals, signals_from_sums, task_sums

__all__ = ["STATE_FORMAT", "StateError", "StepOutput", "TaskStep"]

#: The ``format`` field of every controller state entropace writes.
STATE_FORMAT = "entropace.task_step"
STATE_VERSION = 1
_STATE_KEYS = ("format", "version", "recipe", "clip_rule", "tasks", "rule", "polarity")

Reduce = Callable[[Tensor], Tensor]


def _identity(t: Tensor) -> Tensor:
    return t


@dataclass
class StepOutput:
    """What :meth:`TaskStep.step` decided.

    Attributes:
        signals: the step's per-task statistics (tasks present only).
        bounds: ``{task: (eps_low, eps_high)}`` of the tasks present.
        weights: PAPO's ``(w_plus, w_minus)`` (``(1, 1)`` without PAPO).
        metrics: the step's metrics so far (see the module docstring).
    """

    signals: StepSignals
    bounds: dict[str, tuple[float, float]]
    weights: tuple[float, float]
    metrics: dict[str, float] = field(default_factory=dict)


class TaskStep:
    """The per-task step of EPPO / PAPO / the fixed-clip baselines (module docstring).

    Args:
        tasks: the run's task names in a fixed order; None: the index grows with the names
            seen (first-seen order; the verl trainer, whose tasks are the dataset's
            ``data_source`` values).
        clip_rule: a name of :data:`entropace.control.CLIP_RULES`, or a built rule.
        clip: what a named rule is built from (defaults when None).
        polarity: PAPO's config (or a built controller); None: no PAPO.
        recipe: the algorithm recipe's name, recorded in the state and checked on load.
    """

    def __init__(
        self,
        tasks: Sequence[str] | None = None,
        *,
        clip_rule: str | ClipRule = "fixed",
        clip: ClipSettings | None = None,
        polarity: PolarityConfig | PolarityController | None = None,
        recipe: str | None = None,
    ) -> None:
        if tasks is not None:
            names = [str(t) for t in tasks]
            if not names or len(set(names)) != len(names):
                raise ValueError(f"tasks must be distinct and non-empty, got {names}")
        if isinstance(clip_rule, str):
            self.rule_name = clip_rule
            self.rule: ClipRule = build_clip_rule(clip_rule, clip)
        else:
            found = [n for n, cls in CLIP_RULES.items() if type(clip_rule) is cls]
            if not found:
                raise TypeError(f"{type(clip_rule).__name__} is not a registered clip rule")
            self.rule_name, self.rule = found[0], clip_rule
        if isinstance(polarity, PolarityConfig):
            polarity = PolarityController(config=polarity)
        self.polarity: PolarityController | None = polarity
        self.recipe = recipe
        self.fixed_tasks = tasks is not None
        self.tasks: list[str] = names if tasks is not None else []
        self.metrics: dict[str, float] = {}

    # --------------------------------------------------------------------------- the index
    def task_ids(self, names: Sequence[Any], device: torch.device | str | None = None) -> Tensor:
        """``[B]`` long: each name's index into :attr:`tasks` (a growing index adds new names;
        a fixed one refuses them, listing the run's tasks)."""
        index = {t: k for k, t in enumerate(self.tasks)}
        ids = []
        for raw in names:
            name = str(raw)
            if name not in index:
                if self.fixed_tasks:
                    raise ValueError(f"task {name!r} is not among the run's tasks {self.tasks}")
                index[name] = len(self.tasks)
                self.tasks.append(name)
            ids.append(index[name])
        return torch.tensor(ids, dtype=torch.long, device=device)

    def sums(
        self,
        entropy: Tensor,
        mask: Tensor,
        rewards: Tensor,
        success: Tensor,
        task_ids: Tensor,
        abnormal: Tensor | None = None,
    ) -> Tensor:
        """:func:`entropace.control.task_sums` over this step's ``K = len(tasks)`` tasks
        (float64 ``[7, K]``; reduce across processes before :meth:`step`)."""
        return task_sums(
            entropy, mask, rewards, success, task_ids, len(self.tasks), abnormal=abnormal
        )

    # ---------------------------------------------------------------------------- the step
    @property
    def default_bounds(self) -> tuple[float, float]:
        """The bounds of a task the rule has not moved (fixed bounds; the pacer's
        ``(eps0, eps_high0)``)."""
        return tuple(map(float, self.rule.default_bounds))  # type: ignore[return-value]

    @property
    def weights(self) -> tuple[float, float]:
        """PAPO's current ``(w_plus, w_minus)``; ``(1, 1)`` without PAPO."""
        if self.polarity is None:
            return 1.0, 1.0
        return self.polarity.w_plus, self.polarity.w_minus

    def bounds(self) -> dict[str, tuple[float, float]]:
        """``{task: (eps_low, eps_high)}`` of every task of the index, as the rule stands."""
        current = self.rule.current_bounds()
        default = self.default_bounds
        return {t: tuple(map(float, current.get(t, default))) for t in self.tasks}  # type: ignore[misc]

    def step(self, sums: Tensor, *, train: bool = True, abnormal: bool = True) -> StepOutput:
        """Advance the controllers on one step's (reduced) ``sums``; returns the decisions.

        Args:
            sums: ``[7, K]`` from :meth:`sums`, summed over every process.
            train: False (an evaluation batch): the controllers do not move; the bounds are
                the current ones.
            abnormal: whether the sums' ``abnormal_sum`` row is known (else no ``abnormal``
                metric).
        """
        signals = signals_from_sums(sums, self.tasks)
        present = list(signals.task_success)
        if train:
            bounds = {k: tuple(map(float, v)) for k, v in self.rule.on_step(signals).items()}
        else:
            every = self.bounds()
            bounds = {k: every[k] for k in present}
        m: dict[str, float] = {}
        for name in present:
            p = f"task/{name}/"
            m[p + "success"] = signals.task_success[name]
            m[p + "reward"] = signals.task_reward[name]
            m[p + "reward_std"] = math.sqrt(signals.task_reward_var[name])
            m[p + "entropy"] = signals.task_entropy.get(name, math.nan)
            if abnormal:
                m[p + "abnormal"] = signals.task_abnormal[name]
            m[p + "num_episodes"] = signals.task_episodes[name]
            m[p + "response_tokens"] = signals.task_tokens[name]
            m[p + "eps_low"], m[p + "eps_high"] = bounds[name]
        total = sums.sum(dim=1).tolist()
        tokens, episodes = total[1], max(total[2], 1.0)
        h = total[0] / tokens if tokens > 0 else math.nan
        m["entropy"] = h
        m["reward"] = total[4] / episodes
        m["success"] = total[3] / episodes
        if abnormal:
            m["abnormal"] = total[6] / episodes
        m["response_tokens"] = int(round(tokens))
        m.update(self.rule.metrics(present))
        if self.polarity is not None:
            if train and math.isfinite(h):
                self.polarity.update(h)
            m.update(self.polarity.metrics())
        self.metrics = m
        return StepOutput(signals, bounds, self.weights, m)

    def row_bounds(self, task_ids: Tensor) -> tuple[Tensor, Tensor]:
        """Each row's ``eps_low [B, 1]``, ``eps_high [B, 1]`` (float32, on ``task_ids``'s
        device) from the current per-task bounds."""
        every = self.bounds()
        table = torch.tensor(
            [every[t] for t in self.tasks], dtype=torch.float32, device=task_ids.device
        ).reshape(len(self.tasks), 2)
        per_row = table[task_ids.long()]  # [B, 2]
        return per_row[:, :1].contiguous(), per_row[:, 1:].contiguous()

    def reweight(
        self,
        advantages: Tensor,
        sensitivity: Tensor,
        mask: Tensor,
        *,
        reduce: Reduce | None = None,
        world_size: int = 1,
        task_ids: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        """PAPO on this process's rows with the GLOBAL batch's rescaling factor.

        ``A_t``: per token ``[B, T]`` (tokens off the mask keep their value), or per sequence
        ``[B]`` broadcast to the masked tokens (0 elsewhere); ``P = A S``; :func:`entropace.algos.polarity_reweight` gives
        ``c w(P) A`` with ``c = sum|A| / sum|w(P) A|`` over this process's masked tokens. With
        several processes ``c`` must be the global batch's: the local result is multiplied by
        ``c_global / c_local`` (sums of ``|A|`` and ``|w A|`` reduced across processes).

        ``task_ids`` (``[B]``, indices into :attr:`tasks`): also
        ``task/<k>/papo_pressure`` for each task with ``sum_k |A| > 0`` (reduced like the
        masses).

        Returns:
            ``(A' [B, T] float32, {"polarity/pos_mass", "polarity/neg_mass", ...})`` (also
            added to :attr:`metrics`).
        """
        if self.polarity is None:
            raise RuntimeError("reweight: this TaskStep has no PAPO controller")
        reduce = reduce or _identity
        w_plus, w_minus = self.weights
        adv = advantages.to(torch.float32)
        adv_tok = adv[:, None] * mask if adv.dim() == 1 else adv  # off the mask: kept
        polarity = algos.entropy_polarity(adv_tok, sensitivity.to(adv_tok.device))
        keep = mask > 0
        one = torch.ones((), dtype=torch.float64, device=adv.device)
        weight = torch.where(
            polarity > 0, w_plus * one, torch.where(polarity < 0, w_minus * one, one)
        )
        a_abs = torch.where(keep, adv_tok.abs().double(), 0.0)
        local = torch.stack(
            [
                a_abs.sum(),
                (a_abs * (polarity > 0)).sum(),
                (a_abs * (polarity < 0)).sum(),
                (a_abs * weight).sum(),
            ]
        )
        total, pos, neg, after = reduce(local).tolist()
        out = algos.polarity_reweight(adv_tok, polarity, mask, w_plus=w_plus, w_minus=w_minus)
        if world_size > 1:
            local_total, local_after = float(local[0]), float(local[3])
            if local_after > 0 and after > 0:
                factor = (total / after) / (local_total / local_after)
                out = torch.where(keep, out * factor, out)
        masses = {
            "polarity/pos_mass": pos / total if total > 0 else math.nan,  # no |A|: undefined
            "polarity/neg_mass": neg / total if total > 0 else math.nan,
        }
        if task_ids is not None:
            k = len(self.tasks)
            rows = task_ids.to(adv.device).long()
            before = torch.zeros(k, dtype=torch.float64, device=adv.device)
            after_k = torch.zeros(k, dtype=torch.float64, device=adv.device)
            before.index_add_(0, rows, a_abs.sum(dim=1))
            after_k.index_add_(0, rows, torch.where(keep, out.abs().double(), 0.0).sum(dim=1))
            b_k, a_k = reduce(torch.stack([before, after_k])).tolist()
            for name, b, a in zip(self.tasks, b_k, a_k, strict=True):
                if b > 0:
                    masses[f"task/{name}/papo_pressure"] = a / b
        self.metrics.update(masses)
        return out, masses

    # --------------------------------------------------------------------------- the state
    def state_dict(self) -> dict[str, Any]:
        """The one JSON-serialisable controller state (see the module docstring)."""
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "recipe": self.recipe,
            "clip_rule": self.rule_name,
            "tasks": list(self.tasks),
            "rule": self.rule.state_dict(),
            "polarity": None if self.polarity is None else self.polarity.state_dict(),
        }

    def load_state_dict(self, state: Any, *, source: str = "controller state") -> None:
        """Validate ``state`` (all of it, before anything is loaded), then load it.

        Raises:
            StateError: naming ``source`` (the file) and the field: not an object, a missing
                or unknown key, another format / version / recipe / clip rule / run's task
                names, a controller config that differs, a non-finite or out-of-range value.
        """
        try:
            self._load(state)
        except StateError as exc:
            raise StateError(f"{source}: {exc}") from None
        except (TypeError, KeyError, AttributeError, IndexError, ValueError) as exc:
            raise StateError(f"{source}: malformed controller state ({exc!r})") from None

    def _load(self, state: Any) -> None:
        s = check_fields(state, "state", _STATE_KEYS)
        if s["format"] != STATE_FORMAT:
            raise StateError(f"format: expected {STATE_FORMAT!r}, got {s['format']!r:.60}")
        if check_int(s["version"], "version") != STATE_VERSION:
            raise StateError(f"version: unknown version {s['version']} (this is {STATE_VERSION})")
        if s["recipe"] != self.recipe:
            raise StateError(
                f"recipe: saved by algorithm {s['recipe']!r:.60}, this run uses {self.recipe!r}"
            )
        if s["clip_rule"] != self.rule_name:
            raise StateError(
                f"clip_rule: saved with {s['clip_rule']!r:.60}, this run uses {self.rule_name!r}"
            )
        tasks = s["tasks"]
        if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
            raise StateError(f"tasks: expected a list of task names, got {tasks!r:.60}")
        if len(set(tasks)) != len(tasks):
            raise StateError(f"tasks: duplicate task names in {tasks}")
        if self.fixed_tasks and tasks != self.tasks:
            raise StateError(
                f"tasks: saved by a run with tasks {tasks}, this run's tasks are {self.tasks}"
            )
        if not self.fixed_tasks and tasks[: len(self.tasks)] != self.tasks:
            raise StateError(f"tasks: saved {tasks} does not extend the tasks seen {self.tasks}")
        rule = copy.deepcopy(self.rule)
        rule.load_state_dict(s["rule"], "rule")
        rule_tasks = set(rule.current_bounds())
        if not rule_tasks <= set(tasks):
            raise StateError(
                f"rule: state of task(s) {sorted(rule_tasks - set(tasks))} not in tasks"
            )
        polarity = None
        if self.polarity is None:
            if s["polarity"] is not None:
                raise StateError("polarity: saved with PAPO, this run has no PAPO")
        else:
            if s["polarity"] is None:
                raise StateError("polarity: saved without PAPO, this run uses PAPO")
            polarity = copy.deepcopy(self.polarity)
            polarity.load_state_dict(s["polarity"], "polarity")
        # every check passed: load into the live objects (other holders keep their references)
        self.rule.load_state_dict(s["rule"], "rule")
        if self.polarity is not None and polarity is not None:
            self.polarity.load_state_dict(s["polarity"], "polarity")
        self.tasks = list(tasks)

    def save_state_file(self, path: str | Path) -> Path:
        """Write :meth:`state_dict` to ``path`` as JSON (atomic rename; NaN refused)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as fh:
            json.dump(self.state_dict(), fh, indent=1, allow_nan=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        return path

    def load_state_file(self, path: str | Path) -> None:
        """:meth:`load_state_dict` of the JSON in ``path`` (every error names the file)."""
        self.load_state_dict(read_state_file(path), source=str(path))
