"""The issue-23 / issue-28 measures of a run and their tables in ``entropace compare``.

Per run (from its ``metrics.jsonl``):

- ``pace_spread`` (the issue-23 pace measure): :func:`entropace.diagnostics.pace_measures.
  pace_spread` of the per-task entropy curves on the steps every task logged, from index
  ``warmup`` on: the time-averaged spread (population std over tasks) of the retained-entropy
  ratio ``m_k`` the EPPO pacer acts on, computed with the pacer's own tracker for every run;
- ``crossovers_nt``: :func:`~entropace.diagnostics.pace_measures.noise_tied_crossovers` (EMA
  0.9, tolerance ``k = 3`` noise SDs of each pair's smoothed difference, after ``warmup``);
- per task ``half_life`` (issue 28): :func:`~entropace.diagnostics.pace_measures.half_life` of
  ``task/<k>/entropy`` on the task's own logged steps: the step at which the curve first falls
  to ``half_life_fraction`` (0.5) of its value at the first logged step, the crossing holding
  for the next ``half_life_hold`` (1) logged steps, linearly interpolated between the last step
  above the target and the first at or below it; right-censored at the curve's last step
  (``half_life_censored``);
- ``pace_gap``: :func:`~entropace.diagnostics.pace_measures.pace_gap`, the slowest task's
  half-life minus the fastest's, in steps (``pace_gap_censored`` when any of the run's
  half-lives is censored: the gap is then a bound, not a value);
- per task ``entropy_mean``: :func:`~entropace.diagnostics.pace_measures.window_mean` of
  ``task/<k>/entropy`` over the logged steps ``entropy_from <= s <= entropy_to`` (None: the
  whole run);
- per task ``auc``: :func:`~entropace.diagnostics.pace_measures.success_auc` of the held-out
  greedy success ``eval/<k>/success`` (``eval.every``) over the run (``last`` = the run's last
  step), starting from the evaluation at step 0 when the run has one (before the first training
  step), otherwise from the first evaluation held back to step 0 (``auc_from_step0`` says
  which); and its mean over tasks ``auc/average``;
- per task ``solve``: :func:`~entropace.diagnostics.pace_measures.time_to_solve` (threshold
  ``solve_threshold``) on the same curve, censored at the last step (an evaluation at step 0 at
  the threshold solves at step 0).

Across seeds: t intervals for the continuous measures (``pace_spread``, ``crossovers_nt``,
``half_life/<k>`` and ``pace_gap`` with censored runs at their censoring step, counted,
``entropy_mean/<k>``, ``auc``, time to solve with censored runs at the last step, marked) and
their paired differences to the baseline per seed; for the binary "solved by the end" the exact
tests of :func:`entropace.report.stats.paired_solves` against the baseline (McNemar when both
arms ran the same seeds, Fisher otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from entropace.diagnostics.pace_measures import (
    HalfLife,
    half_life,
    noise_tied_crossovers,
    pace_gap,
    pace_spread,
    success_auc,
    time_to_solve,
    window_mean,
)
from entropace.report.runs import RunData, Series
from entropace.report.stats import MeanCI, mean_ci, paired_difference, paired_solves

__all__ = [
    "DEFAULTS",
    "RunMeasures",
    "entropy_curves",
    "measure_blocks",
    "measure_run",
    "resolve_options",
    "run_half_lives",
]

#: Defaults of the measures (the keyword arguments of :func:`measure_run`; ``entropace
#: compare``'s ``--half-life-fraction``, ``--half-life-hold`` and ``--entropy-window`` set the
#: last four).
DEFAULTS: dict[str, float | None] = {
    "warmup": 20,
    "k": 3.0,
    "ema": 0.9,
    "solve_threshold": 0.9,
    "half_life_fraction": 0.5,
    "half_life_hold": 1,
    "entropy_from": None,
    "entropy_to": None,
}
AVG = "average"


@dataclass
class RunMeasures:
    """The measures of one run (None / empty where the run lacks the data).

    Per-task dicts are keyed by task name; ``half_life[k]`` is in steps and
    ``half_life_censored[k]`` says whether task k never reached the target (then
    ``half_life[k]`` is the curve's last step).
    """

    seed: int
    pace_spread: float | None = None
    crossovers_nt: float | None = None
    auc: dict[str, float] = field(default_factory=dict)
    solve_step: dict[str, float] = field(default_factory=dict)
    solved: dict[str, bool] = field(default_factory=dict)
    half_life: dict[str, float] = field(default_factory=dict)
    half_life_censored: dict[str, bool] = field(default_factory=dict)
    pace_gap: float | None = None
    pace_gap_censored: bool | None = None
    entropy_mean: dict[str, float] = field(default_factory=dict)
    auc_from_step0: bool | None = None
    notes: list[str] = field(default_factory=list)


def resolve_options(options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """:data:`DEFAULTS` updated with ``options``, checked before any run is read.

    Raises:
        ValueError: an unknown option, ``half_life_fraction`` outside (0, 1), a
            ``half_life_hold`` or ``warmup`` that is not an int >= 0, ``entropy_from >
            entropy_to``.
    """
    unknown = sorted(set(options or {}) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown measure options {unknown} (known: {sorted(DEFAULTS)})")
    opts = {**DEFAULTS, **(options or {})}
    if not 0.0 < float(opts["half_life_fraction"]) < 1.0:
        raise ValueError(
            f"half_life_fraction must be in (0, 1), got {opts['half_life_fraction']!r}"
        )
    for name in ("half_life_hold", "warmup"):
        v = opts[name]
        if isinstance(v, bool) or not float(v).is_integer() or v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        opts[name] = int(v)
    lo, hi = opts["entropy_from"], opts["entropy_to"]
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"entropy window {lo}..{hi} is empty (from > to)")
    return opts


def entropy_curves(run: RunData) -> dict[str, Series]:
    """``{task: finite task/<k>/entropy series}`` of the tasks that logged a finite entropy."""
    out = {}
    for task in run.tasks:
        s = run.task_series(task, "entropy")
        if s is not None and len(s.finite()):
            out[task] = s.finite()
    return out


def _common_entropy(curves: Mapping[str, Series]) -> dict[str, list[float]]:
    if len(curves) < 2:
        return {}
    common = sorted(set.intersection(*(set(c.steps.tolist()) for c in curves.values())))
    return {t: c.values[np.searchsorted(c.steps, common)].tolist() for t, c in curves.items()}


def run_half_lives(
    run: RunData, *, fraction: float = 0.5, hold: int = 1, notes: list[str] | None = None
) -> dict[str, HalfLife]:
    """``{task: HalfLife}`` of each task's ``task/<k>/entropy`` on its own logged steps
    (:func:`entropace.diagnostics.pace_measures.half_life`); a task whose curve starts at 0 has
    none and is left out (with a line in ``notes`` when given)."""
    out = {}
    for task, c in entropy_curves(run).items():
        if not c.values[0] > 0.0:
            if notes is not None:
                notes.append(
                    f"task {task}: no entropy half-life (its entropy starts at {c.values[0]:g})"
                )
            continue
        out[task] = half_life(c.values, c.steps, fraction=fraction, hold=hold)
    return out


def measure_run(
    run: RunData, seed: int, *, warmup: int = 20, k: float = 3.0, ema: float = 0.9,
    solve_threshold: float = 0.9, half_life_fraction: float = 0.5, half_life_hold: int = 1,
    entropy_from: float | None = None, entropy_to: float | None = None,
) -> RunMeasures:  # fmt: skip
    """:class:`RunMeasures` of one run (rules in the module docstring)."""
    out = RunMeasures(seed)
    per_task = entropy_curves(run)
    curves = _common_entropy(per_task)
    if curves:
        out.pace_spread = pace_spread(curves, start=int(warmup))
        if math.isnan(out.pace_spread):
            out.pace_spread = None
        out.crossovers_nt = float(len(noise_tied_crossovers(curves, ema=ema, k=k, warmup=warmup)))
    lives = run_half_lives(
        run, fraction=half_life_fraction, hold=int(half_life_hold), notes=out.notes
    )
    out.half_life = {t: h.step for t, h in lives.items()}
    out.half_life_censored = {t: h.censored for t, h in lives.items()}
    if len(lives) >= 2:
        out.pace_gap = pace_gap(lives)
        out.pace_gap_censored = any(h.censored for h in lives.values())
    for task, c in per_task.items():
        mean = window_mean(c.values, c.steps, first=entropy_from, last=entropy_to)
        if math.isfinite(mean):
            out.entropy_mean[task] = mean
        else:  # a window outside the run: said, not dropped silently
            window = _window_text({"entropy_from": entropy_from, "entropy_to": entropy_to})
            out.notes.append(
                f"task {task}: no entropy_mean: no entropy logged in {window} (its entropy is "
                f"logged at steps {int(c.steps[0])}-{int(c.steps[-1])})"
            )
    steps = run.steps
    last = float(steps[-1]) if steps.size else 0.0
    for task in run.tasks:
        s = run.get(f"eval/{task}/success")
        if s is None or not len(s.finite()) or last <= 0:
            continue
        f = s.finite()
        out.auc[task] = success_auc(f.steps, f.values, last=last)
        solve = time_to_solve(f.steps, f.values, last=last, threshold=solve_threshold)
        out.solve_step[task], out.solved[task] = solve.step, not solve.censored
        out.auc_from_step0 = bool(out.auc_from_step0) or int(f.steps[0]) == 0
    if out.auc:
        out.auc[AVG] = math.fsum(out.auc.values()) / len(out.auc)
    return out


def _row(name: str, cells: Sequence[Any]) -> list[str]:
    return [name, *(c.format() for c in cells)]


Getter = Callable[[RunMeasures], "float | None"]


def _pace_time_cols(tasks: Sequence[str]) -> dict[str, tuple[Getter, Getter]]:
    """``{column: (value, censored)}`` getters of the half-life columns and ``pace_gap``."""
    cols: dict[str, tuple[Getter, Getter]] = {
        f"half_life/{t}": (
            lambda m, t=t: m.half_life.get(t),
            lambda m, t=t: m.half_life_censored.get(t),
        )
        for t in tasks
    }
    cols["pace_gap"] = (lambda m: m.pace_gap, lambda m: m.pace_gap_censored)
    return cols


def _window_text(options: Mapping[str, Any]) -> str:
    lo, hi = options.get("entropy_from"), options.get("entropy_to")
    if lo is None and hi is None:
        return "the whole run"
    if hi is None:
        return f"the logged steps from {lo:g} on"
    if lo is None:
        return f"the logged steps up to {hi:g}"
    return f"the logged steps {lo:g}-{hi:g}"


def measure_blocks(
    measures: Mapping[str, Sequence[RunMeasures]],
    tasks: Sequence[str],
    baseline: str | None,
    level: float,
    options: Mapping[str, Any],
) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    """The report blocks (markdown / HTML, :mod:`entropace.report.summary`) and the JSON of the
    measures over seeds, with paired differences / exact tests against ``baseline``.

    JSON (``compare.json["measures"]``): ``options``; ``runs[arm]``: one :class:`RunMeasures`
    dict per seed; ``pace[arm]``, ``half_life[arm]`` (columns ``half_life/<task>`` and
    ``pace_gap``, each interval with ``censored``: the runs counted at their censoring step),
    ``entropy_mean[arm]`` (``entropy_mean/<task>``), ``auc[arm]``, ``solve[arm]``: intervals over
    seeds; ``paired_difference[arm]``: every continuous column's paired interval against the
    baseline; ``exact_tests[arm][task]``.
    """
    blocks: list[tuple[Any, ...]] = []
    js: dict[str, Any] = {
        "options": dict(options),
        "runs": {a: [asdict(m) for m in runs] for a, runs in measures.items()},
    }
    pct = f"{level * 100:g}%"

    def per_seed(algo: str, get: Getter) -> dict[int, float | None]:
        return {m.seed: get(m) for m in measures[algo]}

    def ci_of(algo: str, get: Getter) -> MeanCI:
        return mean_ci(list(per_seed(algo, get).values()), level)

    pace_cols: dict[str, Getter] = {
        "pace_spread": lambda m: m.pace_spread,
        "crossovers_nt": lambda m: m.crossovers_nt,
    }
    pace = {a: {c: ci_of(a, g) for c, g in pace_cols.items()} for a in measures}
    blocks.append(("h", 2, "Pace (issue-23 measures)"))
    blocks.append(("p", (
        f"pace_spread: time average from step index {int(options['warmup'])} of the "
        "spread (population std over tasks) of the retained-entropy ratio m_k the EPPO pacer "
        "acts on. crossovers_nt: order flips of the EMA-smoothed entropy curves (EMA "
        f"{options['ema']}) beyond {options['k']:g} noise SDs of the pair's smoothed difference, "
        f"after the same warm-up. Cells: mean ± {pct} t half-width over seeds."
    )))  # fmt: skip
    blocks.append(("table", ["algorithm", *pace_cols, "n"],
                   [[*_row(a, cells.values()), str(cells["pace_spread"].n)]
                    for a, cells in pace.items()]))  # fmt: skip
    js["pace"] = {a: {c: ci.to_dict() for c, ci in cells.items()} for a, cells in pace.items()}

    time_cols = _pace_time_cols(tasks)
    has_hl = any(m.half_life for runs in measures.values() for m in runs)
    if has_hl:
        frac, hold = float(options["half_life_fraction"]), int(options["half_life_hold"])
        hold_text = (
            "the raw first crossing (no hold)"
            if hold == 0
            else f"the crossing must hold for the next {hold} logged step{'s' if hold > 1 else ''}"
            f" (a shorter dip does not count)"
        )
        hl_rows, hl_js = [], {}
        for a in measures:
            cells, row = {}, [a]
            for c, (get, cens) in time_cols.items():
                ci = ci_of(a, get)
                n_cens = sum(bool(cens(m)) for m in measures[a] if get(m) is not None)
                cells[c] = {**ci.to_dict(), "censored": n_cens}
                row.append(ci.format() + (f" ({n_cens}/{ci.n} cens.)" if n_cens else ""))
            hl_rows.append([*row, str(max(c["n"] for c in cells.values()))])
            hl_js[a] = cells
        blocks.append(("h", 2, f"Entropy half-lives (time to {frac:g} of the start, issue 28)"))
        blocks.append(("p", (
            f"half_life/<task>: the step at which task/<task>/entropy first falls to {frac:g} "
            "of its value at the first logged step, linearly interpolated between the last "
            f"logged step above that target and the first at or below it; {hold_text}. A curve "
            "that never falls that far is right-censored at its last step: counted there, and the "
            "cell says how many of its runs were censored. pace_gap: the slowest task's "
            "half-life minus the fastest's in the same run (a bound when a half-life in that run "
            f"is censored). Cells: mean ± {pct} t half-width over seeds, in steps."
        )))  # fmt: skip
        blocks.append(("table", ["algorithm", *time_cols, "n"], hl_rows))
        js["half_life"] = hl_js

    em_cols: dict[str, Getter] = {
        f"entropy_mean/{t}": (lambda m, t=t: m.entropy_mean.get(t)) for t in tasks
    }
    has_em = any(m.entropy_mean for runs in measures.values() for m in runs)
    if has_em:
        em = {a: {c: ci_of(a, g) for c, g in em_cols.items()} for a in measures}
        blocks.append(("h", 3, "Mean entropy per task"))
        blocks.append(("p", (
            f"entropy_mean/<task>: mean of task/<task>/entropy over {_window_text(options)} "
            f"(nats per token). Cells: mean ± {pct} t half-width over seeds."
        )))  # fmt: skip
        blocks.append(
            ("table", ["algorithm", *em_cols], [_row(a, c.values()) for a, c in em.items()])
        )
        js["entropy_mean"] = {
            a: {c: ci.to_dict() for c, ci in cells.items()} for a, cells in em.items()
        }

    has_eval = any(m.auc for runs in measures.values() for m in runs)
    cols = [*tasks, AVG]
    if has_eval:
        auc = {a: {c: ci_of(a, lambda m, c=c: m.auc.get(c)) for c in cols} for a in measures}
        evaluated = [m for runs in measures.values() for m in runs if m.auc]
        from0 = sum(bool(m.auc_from_step0) for m in evaluated)
        blocks.append(("h", 2, "Held-out success over the run (area under the curve)"))
        blocks.append(("p", (
            "Greedy success on the held-out seeds (eval.every), area under the success curve "
            "over the whole run, normalised to [0, 1]: from the evaluation at step 0 (before "
            "the first update) when the run has one, otherwise from the first evaluation held "
            f"back to step 0. {from0} of the {len(evaluated)} evaluated runs have a step-0 "
            "evaluation."
        )))  # fmt: skip
        blocks.append(
            ("table", ["algorithm", *cols], [_row(a, c.values()) for a, c in auc.items()])
        )
        js["auc"] = {a: {c: ci.to_dict() for c, ci in cells.items()} for a, cells in auc.items()}
        solve_rows, solve_js = [], {}
        for a in measures:
            cells = []
            for t in tasks:
                steps = [m.solve_step.get(t) for m in measures[a]]
                n_solved = sum(m.solved.get(t, False) for m in measures[a])
                n = sum(t in m.solved for m in measures[a])
                ci = mean_ci(steps, level)
                cells.append(f"{n_solved}/{n} solved; steps {ci.format()}")
                solve_js.setdefault(a, {})[t] = {"solved": n_solved, "n": n, "steps": ci.to_dict()}
            solve_rows.append([a, *cells])
        blocks.append(("h", 3, f"Time to solve (success >= {options['solve_threshold']:g})"))
        blocks.append(("p", (
            "Steps to the first held-out evaluation at the threshold (0: already at step 0); "
            "a run that never reaches it counts at its last step (censored)."
        )))  # fmt: skip
        blocks.append(("table", ["algorithm", *tasks], solve_rows))
        js["solve"] = solve_js
    if baseline is not None and baseline in measures:
        blocks += _against_baseline(
            measures, tasks, baseline, level, js,
            pace_cols=pace_cols,
            time_cols={c: g for c, (g, _) in time_cols.items()} if has_hl else {},
            em_cols=em_cols if has_em else {},
            has_eval=has_eval,
        )  # fmt: skip
    return blocks, js


def _against_baseline(
    measures: Mapping[str, Sequence[RunMeasures]],
    tasks: Sequence[str],
    base: str,
    level: float,
    js: dict[str, Any],
    *,
    pace_cols: Mapping[str, Getter],
    time_cols: Mapping[str, Getter],
    em_cols: Mapping[str, Getter],
    has_eval: bool,
) -> list[tuple[Any, ...]]:
    """Paired differences (per seed) of every continuous column and exact tests on the solve
    counts against ``base``; fills ``js["paired_difference"]`` / ``js["exact_tests"]``."""

    def per_seed(algo: str, get: Getter) -> dict[int, float | None]:
        return {m.seed: get(m) for m in measures[algo]}

    groups: dict[str, Mapping[str, Getter]] = {"pace": dict(pace_cols)}
    if has_eval:
        groups["pace"] = {**pace_cols, "auc/" + AVG: lambda m: m.auc.get(AVG)}
    groups["half_life"], groups["entropy_mean"] = time_cols, em_cols
    diffs: dict[str, dict[str, dict[str, MeanCI]]] = {g: {} for g in groups}
    tests: dict[str, dict[str, Any]] = {}
    for a in measures:
        if a == base:
            continue
        for g, cols in groups.items():
            diffs[g][a] = {c: paired_difference(per_seed(a, get), per_seed(base, get), level)
                           for c, get in cols.items()}  # fmt: skip
        if has_eval:
            tests[a] = {t: paired_solves(per_seed(a, lambda m, t=t: m.solved.get(t)),
                                         per_seed(base, lambda m, t=t: m.solved.get(t)))
                        for t in tasks}  # fmt: skip
    blocks: list[tuple[Any, ...]] = []
    if not any(diffs["pace"].values()):
        return blocks
    js["paired_difference"] = {
        a: {c: ci.to_dict() for g in groups for c, ci in diffs[g][a].items()} for a in diffs["pace"]
    }
    titles = {
        "pace": "issue-23 measures",
        "half_life": "entropy half-lives and pace_gap (steps)",
        "entropy_mean": "mean entropy per task",
    }
    for g, cols in groups.items():
        if not cols:
            continue
        blocks.append(("h", 3, f"Paired difference to {base} (same seed), {titles[g]}"))
        blocks.append(("table", ["algorithm", *cols, "pairs"],
                       [[*_row(a, cells.values()), str(max(ci.n for ci in cells.values()))]
                        for a, cells in diffs[g].items()]))  # fmt: skip
    if tests:
        blocks.append(("h", 3, f"Solved by the end: exact tests against {base}"))
        blocks.append(("p", (
            "Counts of seeds that solved each task (held-out success at the threshold by the "
            "last step), McNemar's exact test on the discordant seeds when both arms ran the "
            "same seeds, Fisher's exact test otherwise; two-sided p-values."
        )))  # fmt: skip
        rows = [[a, *(x.format() for x in t.values())] for a, t in tests.items()]
        blocks.append(("table", ["algorithm", *tasks], rows))
        js["exact_tests"] = {a: {t: vars(x) for t, x in per.items()} for a, per in tests.items()}
    return blocks
