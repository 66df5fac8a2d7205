"""The issue-23 measures of a run and their tables in ``entropace compare``.

Per run (from its ``metrics.jsonl``):

- ``pace_spread`` (the primary pace measure): :func:`entropace.diagnostics.pace_measures.
  pace_spread` of the per-task entropy curves on the steps every task logged, from index
  ``warmup`` on: the time-averaged spread (population std over tasks) of the retained-entropy
  ratio ``m_k`` the EPPO pacer acts on, computed with the pacer's own tracker for every run;
- ``crossovers_nt``: :func:`~entropace.diagnostics.pace_measures.noise_tied_crossovers` (EMA
  0.9, tolerance ``k = 3`` noise SDs of each pair's smoothed difference, after ``warmup``);
- per task ``auc``: :func:`~entropace.diagnostics.pace_measures.success_auc` of the held-out
  greedy success ``eval/<k>/success`` (``eval.every``) over the run (``last`` = the run's last
  step), and its mean over tasks ``auc/average``;
- per task ``solve``: :func:`~entropace.diagnostics.pace_measures.time_to_solve` (threshold
  ``solve_threshold``) on the same curve, censored at the last step.

Across seeds: t intervals for the continuous measures (``pace_spread``, ``crossovers_nt``,
``auc``, time to solve with censored runs at the last step, marked), and for the binary
"solved by the end" the exact tests of :func:`entropace.report.stats.paired_solves` against the
baseline (McNemar when both arms ran the same seeds, Fisher otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from entropace.diagnostics.pace_measures import (
    noise_tied_crossovers,
    pace_spread,
    success_auc,
    time_to_solve,
)
from entropace.report.runs import RunData
from entropace.report.stats import mean_ci, paired_difference, paired_solves

__all__ = ["DEFAULTS", "RunMeasures", "measure_blocks", "measure_run"]

#: Defaults of the measures (``entropace compare`` options of the same names).
DEFAULTS: dict[str, float] = {"warmup": 20, "k": 3.0, "ema": 0.9, "solve_threshold": 0.9}
AVG = "average"


@dataclass
class RunMeasures:
    """The issue-23 measures of one run (None / empty where the run lacks the data)."""

    seed: int
    pace_spread: float | None = None
    crossovers_nt: float | None = None
    auc: dict[str, float] = field(default_factory=dict)
    solve_step: dict[str, float] = field(default_factory=dict)
    solved: dict[str, bool] = field(default_factory=dict)


def _common_entropy(run: RunData) -> dict[str, list[float]]:
    curves = {}
    for task in run.tasks:
        s = run.task_series(task, "entropy")
        if s is not None and len(s.finite()):
            curves[task] = s.finite()
    if len(curves) < 2:
        return {}
    common = sorted(set.intersection(*(set(c.steps.tolist()) for c in curves.values())))
    return {t: c.values[np.searchsorted(c.steps, common)].tolist() for t, c in curves.items()}


def measure_run(
    run: RunData, seed: int, *, warmup: int = 20, k: float = 3.0, ema: float = 0.9,
    solve_threshold: float = 0.9,
) -> RunMeasures:  # fmt: skip
    """:class:`RunMeasures` of one run (rules in the module docstring)."""
    out = RunMeasures(seed)
    curves = _common_entropy(run)
    if curves:
        out.pace_spread = pace_spread(curves, start=warmup)
        if math.isnan(out.pace_spread):
            out.pace_spread = None
        out.crossovers_nt = float(len(noise_tied_crossovers(curves, ema=ema, k=k, warmup=warmup)))
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
    if out.auc:
        out.auc[AVG] = math.fsum(out.auc.values()) / len(out.auc)
    return out


def _row(name: str, cells: Sequence[Any]) -> list[str]:
    return [name, *(c.format() for c in cells)]


def measure_blocks(
    measures: Mapping[str, Sequence[RunMeasures]],
    tasks: Sequence[str],
    baseline: str | None,
    level: float,
    options: Mapping[str, float],
) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    """The report blocks (markdown / HTML, :mod:`entropace.report.summary`) and the JSON of the
    measures over seeds, with paired differences / exact tests against ``baseline``."""
    blocks: list[tuple[Any, ...]] = []
    js: dict[str, Any] = {
        "options": dict(options),
        "runs": {a: [asdict(m) for m in runs] for a, runs in measures.items()},
    }
    pct = f"{level * 100:g}%"

    def per_seed(algo: str, get: Any) -> dict[int, float | None]:
        return {m.seed: get(m) for m in measures[algo]}

    pace_cols = {"pace_spread": lambda m: m.pace_spread, "crossovers_nt": lambda m: m.crossovers_nt}
    pace = {a: {c: mean_ci(list(per_seed(a, g).values()), level) for c, g in pace_cols.items()}
            for a in measures}  # fmt: skip
    blocks.append(("h", 2, "Pace (issue-23 measures)"))
    blocks.append(("p", (
        f"pace_spread (primary): time average from step index {int(options['warmup'])} of the "
        "spread (population std over tasks) of the retained-entropy ratio m_k the EPPO pacer "
        "acts on. crossovers_nt: order flips of the EMA-smoothed entropy curves (EMA "
        f"{options['ema']}) beyond {options['k']:g} noise SDs of the pair's smoothed difference, "
        f"after the same warm-up. Cells: mean ± {pct} t half-width over seeds."
    )))  # fmt: skip
    blocks.append(("table", ["algorithm", *pace_cols, "n"],
                   [[*_row(a, cells.values()), str(cells["pace_spread"].n)]
                    for a, cells in pace.items()]))  # fmt: skip
    js["pace"] = {a: {c: ci.to_dict() for c, ci in cells.items()} for a, cells in pace.items()}
    has_eval = any(m.auc for runs in measures.values() for m in runs)
    cols = [*tasks, AVG]
    if has_eval:
        auc = {a: {c: mean_ci(list(per_seed(a, lambda m, c=c: m.auc.get(c)).values()), level)
                   for c in cols} for a in measures}  # fmt: skip
        blocks.append(("h", 2, "Held-out success over the run (area under the curve)"))
        blocks.append(
            (
                "p",
                "Greedy success on the held-out seeds (eval.every), area under the "
                "success curve over the whole run, normalised to [0, 1].",
            )
        )
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
        blocks.append(
            (
                "p",
                "Steps to the first held-out evaluation at the threshold; a run that "
                "never reaches it counts at its last step (censored).",
            )
        )
        blocks.append(("table", ["algorithm", *tasks], solve_rows))
        js["solve"] = solve_js
    if baseline is not None and baseline in measures:
        base = baseline
        diff_rows, test_rows, diff_js, test_js = [], [], {}, {}
        for a in measures:
            if a == base:
                continue
            d = {c: paired_difference(per_seed(a, g), per_seed(base, g), level)
                 for c, g in pace_cols.items()}  # fmt: skip
            if has_eval:
                d["auc/" + AVG] = paired_difference(
                    per_seed(a, lambda m: m.auc.get(AVG)), per_seed(base, lambda m: m.auc.get(AVG)),
                    level,
                )  # fmt: skip
            diff_rows.append(_row(a, d.values()))
            diff_js[a] = {c: ci.to_dict() for c, ci in d.items()}
            if has_eval:
                tests = {t: paired_solves(per_seed(a, lambda m, t=t: m.solved.get(t)),
                                          per_seed(base, lambda m, t=t: m.solved.get(t)))
                         for t in tasks}  # fmt: skip
                test_rows.append([a, *(x.format() for x in tests.values())])
                test_js[a] = {t: vars(x) for t, x in tests.items()}
        if diff_rows:
            head = ["algorithm", *pace_cols, *(["auc/" + AVG] if has_eval else [])]
            blocks.append(("h", 3, f"Paired difference to {base} (same seed), issue-23 measures"))
            blocks.append(("table", head, diff_rows))
            js["paired_difference"] = diff_js
        if test_rows:
            blocks.append(("h", 3, f"Solved by the end: exact tests against {base}"))
            blocks.append(
                (
                    "p",
                    "Counts of seeds that solved each task (held-out success at "
                    "the threshold by the last step), McNemar's exact test on the "
                    "discordant seeds when both arms ran the same seeds, Fisher's "
                    "exact test otherwise; two-sided p-values.",
                )
            )
            blocks.append(("table", ["algorithm", *tasks], test_rows))
            js["exact_tests"] = test_js
    return blocks, js
