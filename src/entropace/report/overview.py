"""What a run did, per task, in numbers a newcomer can read.

One computation, :func:`run_overview`, feeds both places a person looks first: the screen
``entropace train`` prints when it ends (:func:`format_screen`) and the "What happened" section
at the top of the report (``RUN/report/summary.{md,html,json}``, :func:`overview_blocks`). The
screen is rendered from the ``overview`` the report wrote into ``summary.json``
(:func:`RunOverview.from_dict`), so the two show the same numbers.

Per task (``task/<k>/...`` and ``eval/<k>/...`` keys of ``metrics.jsonl``):

- held-out success before and after: ``eval/<k>/success`` (greedy, the first ``eval.n`` seeds
  of ``eval.split``) at step 0 (the evaluation before the first update) and at the last
  evaluated step; "not evaluated" where the run has no such row;
- reward: the mean of ``task/<k>/reward`` (the rollouts' episode reward) over the first and
  over the last :data:`AVG_STEPS` steps the task was in the batch (half of them each when it
  was in fewer than twice as many);
- entropy at the start and the end: ``task/<k>/entropy`` (mean sampling entropy of the task's
  policy tokens, nats) at its first and last logged step (the raw curve of ``entropy.png``,
  whose ends are marked there), and where the EMA-smoothed curve of the figure ends: the
  pace diagnostics' ``first_entropy``, ``last_entropy``, ``last_entropy_ema``;
- ``eps_low``: the smallest and largest clip bound the task got (EPPO moves it per task);
- clipped: the mean over steps of ``task/<k>/clip_frac_low_active + clip_frac_high_active``,
  the share of the task's gradient-carrying tokens whose ratio the clip bound (the plain
  ``clip_frac_*`` over all tokens for runs without the ``_active`` keys);
- learning signal: the steps with ``task/<k>/signal_frac > 0`` (some episode had a non-zero
  advantage, i.e. some group's rewards differed), of the steps the task was in the batch. A
  task with none got no gradient: its clip range changed nothing.

For the run: PAPO's mean branch masses (``polarity/pos_mass``, ``neg_mass`` over the steps
where they are defined) and its weights' range; the pace diagnostics of
:func:`entropace.report.summary.pace_diagnostics` (crossovers, trend R^2, spike amplitude) and
each task's retained entropy (last / first), the ratio EPPO's pacer compares across tasks.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from entropace.diagnostics.pace_measures import pace_gap
from entropace.report.measures import run_half_lives
from entropace.report.runs import RunData


class PaceNumbers(Protocol):
    """What the overview reads of :class:`entropace.report.summary.PaceDiagnostics` (a
    protocol, so that this module does not import the report that renders it)."""

    crossovers: int | None
    trend_r2: float | None
    spike_amplitude: float | None
    per_task: dict[str, dict[str, float | None]]


__all__ = [
    "AVG_STEPS",
    "RunOverview",
    "TaskOverview",
    "format_screen",
    "overview_blocks",
    "overview_lines",
    "overview_table",
    "run_config",
    "run_overview",
]

#: Steps averaged for a task's reward at the start and at the end of a run.
AVG_STEPS = 5


def run_config(run_dir: str | Path) -> dict[str, Any]:
    """``RUN/config.yaml`` as a plain dict (``yaml.safe_load``: nothing in it runs), or ``{}``
    when it is missing or unreadable (a report also reads bare ``metrics.jsonl`` folders)."""
    import yaml

    path = Path(run_dir) / "config.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _section(config: dict[str, Any], *path: str) -> dict[str, Any]:
    for key in path:
        value = config.get(key) if isinstance(config, dict) else None
        config = value if isinstance(value, dict) else {}
    return config


@dataclass
class TaskOverview:
    """One task's line of the overview (None: the run does not have the data)."""

    task: str
    eval_before: float | None = None
    eval_after: float | None = None
    eval_after_step: int | None = None
    reward_first: float | None = None
    reward_last: float | None = None
    entropy_first: float | None = None
    entropy_last: float | None = None
    entropy_last_ema: float | None = None
    eps_low_min: float | None = None
    eps_low_max: float | None = None
    clipped: float | None = None
    signal_steps: int | None = None
    steps: int = 0

    @property
    def retained(self) -> float | None:
        """Entropy kept: last / first (raw), None without a positive first value."""
        if self.entropy_first is None or self.entropy_last is None or self.entropy_first <= 0:
            return None
        return self.entropy_last / self.entropy_first


@dataclass
class RunOverview:
    """The overview of one run (:func:`run_overview`)."""

    run: str
    path: str
    algorithm: str | None = None
    first_step: int | None = None
    last_step: int | None = None
    eval_n: int | None = None
    eval_split: str | None = None
    ema: float | None = None
    tasks: list[TaskOverview] = field(default_factory=list)
    pos_mass: float | None = None
    neg_mass: float | None = None
    w_plus: tuple[float, float] | None = None
    w_minus: tuple[float, float] | None = None
    crossovers: int | None = None
    trend_r2: float | None = None
    spike_amplitude: float | None = None
    half_life: dict[str, float] = field(default_factory=dict)
    half_life_censored: dict[str, bool] = field(default_factory=dict)
    pace_gap: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``summary.json``'s ``overview``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunOverview:
        """The inverse of :meth:`to_dict` (e.g. read back from ``summary.json``)."""
        data = dict(data)
        data["tasks"] = [TaskOverview(**t) for t in data.get("tasks", [])]
        for key in ("w_plus", "w_minus"):
            if data.get(key) is not None:
                data[key] = tuple(data[key])
        return cls(**data)


def _finite(run: RunData, key: str) -> tuple[np.ndarray, np.ndarray]:
    s = run.get(key)
    if s is None:
        return np.zeros(0, np.int64), np.zeros(0)
    f = s.finite()
    return f.steps, f.values


def _task(run: RunData, task: str, pace: dict[str, float | None]) -> TaskOverview:
    out = TaskOverview(task)
    out.entropy_first = pace.get("first_entropy")
    out.entropy_last = pace.get("last_entropy")
    out.entropy_last_ema = pace.get("last_entropy_ema")
    p = f"task/{task}/"
    steps, success = _finite(run, f"eval/{task}/success")
    if steps.size and steps[0] == 0:
        out.eval_before = float(success[0])
    if steps.size and steps[-1] > 0:
        out.eval_after, out.eval_after_step = float(success[-1]), int(steps[-1])
    _, reward = _finite(run, p + "reward")
    if reward.size:
        k = min(AVG_STEPS, max(1, reward.size // 2))  # a short run: halves that do not overlap
        out.reward_first = float(reward[:k].mean())
        out.reward_last = float(reward[-k:].mean())
    _, eps = _finite(run, p + "eps_low")
    if eps.size:
        out.eps_low_min, out.eps_low_max = float(eps.min()), float(eps.max())
    out.clipped = _clipped(run, p)
    present = [run.task_series(task, k) for k in ("num_episodes", "reward", "entropy")]
    out.steps = max((len(s) for s in present if s is not None), default=0)
    _, signal = _finite(run, p + "signal_frac")
    if signal.size:
        out.signal_steps = int(np.count_nonzero(signal > 0))
    return out


def _clipped(run: RunData, prefix: str) -> float | None:
    """Mean over steps of the clipped share (low + high), gradient-carrying tokens first."""
    for suffix in ("_active", ""):
        lo_steps, lo = _finite(run, f"{prefix}clip_frac_low{suffix}")
        hi_steps, hi = _finite(run, f"{prefix}clip_frac_high{suffix}")
        common, i, j = np.intersect1d(lo_steps, hi_steps, return_indices=True)
        if common.size:
            return float(np.mean(lo[i] + hi[j]))
    return None


def _mean(run: RunData, key: str) -> float | None:
    _, values = _finite(run, key)
    return float(values.mean()) if values.size else None


def _range(run: RunData, key: str) -> tuple[float, float] | None:
    _, values = _finite(run, key)
    return (float(values.min()), float(values.max())) if values.size else None


def run_overview(run: RunData, diagnostics: PaceNumbers, *, ema: float | None) -> RunOverview:
    """The :class:`RunOverview` of ``run`` (rules in the module docstring); ``diagnostics``
    are the run's :func:`~entropace.report.summary.pace_diagnostics` with EMA ``ema``."""
    config = run_config(run.path)
    train_steps = run.steps[run.steps > 0]
    evaluation = _section(config, "eval")
    n = evaluation.get("n")
    out = RunOverview(
        run=run.name,
        path=str(run.path),
        algorithm=_section(config, "algorithm").get("name"),
        first_step=int(train_steps[0]) if train_steps.size else None,
        last_step=int(train_steps[-1]) if train_steps.size else None,
        eval_n=n if isinstance(n, int) else None,
        eval_split=evaluation.get("split") if isinstance(evaluation.get("split"), str) else None,
        ema=ema,
        tasks=[_task(run, task, diagnostics.per_task.get(task, {})) for task in run.tasks],
        pos_mass=_mean(run, "polarity/pos_mass"),
        neg_mass=_mean(run, "polarity/neg_mass"),
        w_plus=_range(run, "polarity/w_plus"),
        w_minus=_range(run, "polarity/w_minus"),
        crossovers=diagnostics.crossovers,
        trend_r2=diagnostics.trend_r2,
        spike_amplitude=diagnostics.spike_amplitude,
    )
    lives = run_half_lives(run)  # entropace compare's half_life / pace_gap, the same definition
    out.half_life = {task: float(h.step) for task, h in lives.items()}
    out.half_life_censored = {task: bool(h.censored) for task, h in lives.items()}
    out.pace_gap = float(pace_gap(lives)) if len(lives) >= 2 else None
    return out


# ----------------------------------------------------------------------------- rendering
def _num(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def _arrow(a: float | None, b: float | None, digits: int = 2) -> str:
    if a is None and b is None:
        return "n/a"
    return f"{_num(a, digits)} -> {_num(b, digits)}"


def _eval_cell(t: TaskOverview, last_step: int | None) -> str:
    if t.eval_before is None and t.eval_after is None:
        return "not evaluated"
    before = _num(t.eval_before) if t.eval_before is not None else "not evaluated"
    after = _num(t.eval_after) if t.eval_after is not None else "not evaluated"
    at = f" (step {t.eval_after_step})" if t.eval_after_step not in (None, last_step) else ""
    return f"{before} -> {after}{at}"


def _eps_cell(t: TaskOverview) -> str:
    if t.eps_low_min is None or t.eps_low_max is None:
        return "n/a"
    if t.eps_low_min == t.eps_low_max:
        return f"{_num(t.eps_low_min)} (fixed)"
    return f"{_num(t.eps_low_min)} - {_num(t.eps_low_max)}"


def _signal_cell(t: TaskOverview) -> str:
    if t.signal_steps is None:
        return "not logged"
    return f"{t.signal_steps}/{t.steps}"


#: The overview table's columns (terminal and report): a name and what it spans.
TABLE_HEAD = (
    ("task", ""),
    ("held-out success", "step 0 -> end"),
    ("reward", "start -> end"),
    ("entropy", "start -> end"),
    ("eps_low", "min - max"),
    ("clipped", ""),
    ("signal", "steps"),
)


def overview_table(ov: RunOverview) -> tuple[list[tuple[str, str]], list[list[str]]]:
    """``(head, rows)`` of the per-task table, every cell formatted (the same strings on the
    screen and in the report); each column's head is ``(name, span)``."""
    rows = []
    for t in ov.tasks:
        clipped = "n/a" if t.clipped is None else f"{100 * t.clipped:.1f}%"
        rows.append([
            t.task,
            _eval_cell(t, ov.last_step),
            _arrow(t.reward_first, t.reward_last),
            _arrow(t.entropy_first, t.entropy_last),
            _eps_cell(t),
            clipped,
            _signal_cell(t),
        ])  # fmt: skip
    return list(TABLE_HEAD), rows


def _legend(ov: RunOverview) -> str:
    if all(t.eval_before is None and t.eval_after is None for t in ov.tasks):
        held_out = "Held-out success: not evaluated in this run (eval.every; entropace eval)."
    else:
        seeds = f"the first {ov.eval_n} {ov.eval_split or 'test'}" if ov.eval_n else "held-out"
        held_out = (
            f"Held-out success: greedy, on {seeds} seeds per task (eval/<task>/success; step 0 "
            "is before the first update)."
        )
    ema = f"EMA {ov.ema}" if ov.ema is not None else "no smoothing"
    ends = ", ".join(f"{t.task} {_num(t.entropy_last_ema)}" for t in ov.tasks)
    return (
        f"{held_out} Reward: mean over the rollouts of the first and of the last {AVG_STEPS} "
        "steps (half the steps each in a shorter run). Entropy: mean sampling entropy of the "
        "task's tokens (nats) at its first and last step (entropy.png's thin line and dots; "
        f"its thick {ema} line ends at: {ends}). eps_low: the clip range the task got. "
        "Clipped: share of the task's gradient-carrying tokens whose ratio the clip bound, "
        "mean over steps. Steps with signal: steps where some episode of the task had a "
        "non-zero advantage (some group's rewards differed), of the steps it was in the batch."
    )


def overview_lines(ov: RunOverview) -> list[str]:
    """The sentences under the table: learning signal, pace mismatch, PAPO."""
    lines = []
    known = [t for t in ov.tasks if t.signal_steps is not None]
    if known:
        signal = [t.task for t in known if t.signal_steps]
        silent = [t for t in known if not t.signal_steps]
        text = "Learning signal: " + (", ".join(signal) if signal else "no task") + "."
        paced = [t for t in known if t.eps_low_max is not None]
        top = max(paced, key=lambda t: t.eps_low_max or 0.0, default=None)
        if silent:
            names = ", ".join(t.task for t in silent)
            they = "it" if len(silent) == 1 else "they"
            text += (
                f" {names}: no episode had a non-zero advantage in any step (every group's "
                f"rewards were equal), so {they} got no gradient and the clip range acted on "
                "nothing"
            )
            if top in silent and len({t.eps_low_max for t in paced}) > 1:
                text += (
                    f", though {top.task} got the widest (eps_low up to {_num(top.eps_low_max)})"
                )
            text += "."
        lines.append(text)
    else:
        lines.append("Learning signal: not logged (task/<k>/signal_frac; the run predates it).")
    kept = [(t.task, t.retained) for t in ov.tasks if t.retained is not None]
    pace = "Pace mismatch: "
    if kept:
        kept.sort(key=lambda x: x[1])
        pace += "entropy kept (end / start): " + ", ".join(
            f"{task} {100 * r:.0f}%" for task, r in kept
        )
        pace += "; "
    if ov.half_life:
        lives = sorted(ov.half_life.items(), key=lambda x: x[1])
        pace += "entropy half-life (the step where it first fell to half its start): " + ", ".join(
            f"{task} {'>= ' if ov.half_life_censored.get(task) else ''}{step:.1f}"
            for task, step in lives
        )
        if ov.pace_gap is not None:
            bound = (
                " (a bound: a task never got there)" if any(ov.half_life_censored.values()) else ""
            )
            pace += f", slowest - fastest {ov.pace_gap:.1f} steps{bound}"
        pace += "; "
    ema = f"EMA {ov.ema}" if ov.ema is not None else "unsmoothed"
    pace += (
        f"crossovers of the {ema} entropy curves: {_fmt_int(ov.crossovers)}, trend R^2 "
        f"{_num(ov.trend_r2)}, spike amplitude {_num(ov.spike_amplitude)} "
        "(ALGORITHMS.md section 5)."
    )
    lines.append(pace)
    if ov.pos_mass is not None or ov.neg_mass is not None:
        papo = (
            f"PAPO: share of sum|A| on entropy-raising tokens (P > 0) {_num(ov.pos_mass)}, "
            f"on entropy-lowering ones (P < 0) {_num(ov.neg_mass)} (mean over steps with a "
            "non-zero advantage)"
        )
        if ov.w_plus is not None and ov.w_minus is not None:
            papo += (
                f"; weights w+ {_num(ov.w_plus[0])} - {_num(ov.w_plus[1])}, "
                f"w- {_num(ov.w_minus[0])} - {_num(ov.w_minus[1])}"
            )
        lines.append(papo + ".")
    return lines


def _fmt_int(v: int | None) -> str:
    return "n/a" if v is None else str(v)


def _steps(ov: RunOverview) -> str:
    if ov.last_step is None:
        return "no steps"
    if ov.first_step == ov.last_step:
        return f"step {ov.last_step}"
    return f"steps {ov.first_step}-{ov.last_step}"


def overview_blocks(ov: RunOverview) -> list[tuple[Any, ...]]:
    """The report's "What happened" blocks (rendered to markdown and HTML by the report)."""
    head, rows = overview_table(ov)
    steps = _steps(ov)
    algo = f", {ov.algorithm}" if ov.algorithm else ""
    return [
        ("h", 2, f"What happened: {ov.run} ({steps}{algo})"),
        ("table", [f"{name} ({span})" if span else name for name, span in head], rows),
        ("p", _legend(ov)),
        ("ul", overview_lines(ov)),
    ]


def _text_table(head: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]]) -> list[str]:
    names, spans = [h[0] for h in head], [h[1] for h in head]
    widths = [max(len(c) for c in col) for col in zip(names, spans, *rows, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*r).rstrip() for r in (names, spans, *rows)]


def format_screen(ov: RunOverview, *, report_dir: Path | None, figures: Sequence[str] = ()) -> str:
    """The end-of-run screen of ``entropace train``: the overview table, its legend, the
    sentences, where the report is and what to do next."""
    import textwrap

    head, rows = overview_table(ov)
    algo = f", {ov.algorithm}" if ov.algorithm else ""
    out = [f"What happened in {ov.path} ({_steps(ov)}{algo}):", ""]
    out += _text_table(head, rows)
    out.append("")
    wrap = textwrap.TextWrapper(width=100, subsequent_indent="  ")
    out += wrap.wrap(_legend(ov))
    for line in overview_lines(ov):
        out += wrap.wrap(line)
    out.append("")
    run = ov.path
    if report_dir is not None:
        out.append(f"Report: {report_dir / 'summary.html'} (and summary.md)")
        if figures:
            out.append(f"Figures in {report_dir}: {', '.join(figures)}")
    else:
        out.append(f"No report written; make it with: entropace report {run}")
    tasks = ",".join(t.task for t in ov.tasks)
    out += [
        "Next:",
        f"  entropace eval {run} --tasks {tasks} --n 20   # held-out success of the last "
        "checkpoint (cost: entropace eval --help)",
        f"  entropace report {run} OTHER_RUN   # figures of several runs side by side",
        f"  entropace train --resume {run} steps={2 * (ov.last_step or 1)}   # continue this run",
    ]
    return "\n".join(out)
