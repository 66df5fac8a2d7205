"""``entropace compare --report DIR``: algorithms over seeds, with t confidence intervals.

Input: the grid layout ``DIR/<algo>/seed<k>/metrics.jsonl`` (:mod:`entropace.report.grid`).
Per run (one seed), from its ``metrics.jsonl`` (:func:`entropace.report.load_run`):

- final success of task k: mean of its last ``K = min(last_k, n_k)`` finite values of
  ``task/<k>/success`` (``n_k`` the task's logged steps); the average: mean over the run's tasks;
- pace diagnostics: :func:`entropace.report.pace_diagnostics` (crossovers of the EMA-smoothed
  per-task entropy curves, trend R^2 of ``h_k`` vs ``log s``, spike amplitude), the same
  numbers ``entropace report`` prints for that run;
- eps_k: the last finite ``task/<k>/eps_low`` / ``eps_high`` (the clip range of the last step);
- polarity (PAPO): the mean over steps of ``polarity/pos_mass`` and ``polarity/w_plus``;
- the pace and held-out success measures of :mod:`entropace.report.measures` (``pace_spread``,
  noise-tied crossovers, entropy half-lives and ``pace_gap``, mean entropy per task, success
  AUC, time to solve, exact tests on solve counts), drawn in ``compare_half_life.png``.

Over the seeds of an algorithm each number becomes ``mean ± half-width`` of the two-sided
``level`` Student-t interval (:func:`entropace.report.stats.mean_ci`, n - 1 dof; one seed gives
no interval). An algorithm's paired difference to the baseline pairs runs by seed:
``d_s = x_s(algo) - x_s(baseline)`` over the seeds both have, then the same interval of ``d``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from entropace._files import read_text, write_atomic
from entropace.report.compare_plots import draw_band_figure, draw_half_life_figure
from entropace.report.grid import GRID_FILE
from entropace.report.measures import measure_blocks, measure_run, resolve_options
from entropace.report.runs import RunData, load_run
from entropace.report.stats import MeanCI, mean_ci, paired_difference
from entropace.report.summary import (
    DEFAULT_CROSSOVER_EMA,
    Block,
    _html,
    _markdown,
    pace_diagnostics,
)

__all__ = [
    "AVERAGE",
    "PACE_METRICS",
    "RunSummary",
    "discover_grid",
    "summarise_run",
    "write_compare",
]

AVERAGE = "average"
PACE_METRICS = ("crossovers", "trend_r2", "spike_amplitude")
_PACE_TITLES = {
    "crossovers": "crossovers",
    "trend_r2": "trend R^2",
    "spike_amplitude": "spike amp.",
}
_SEED_DIR = re.compile(r"^seed(\d+)$")


@dataclass
class RunSummary:
    """The numbers of one run that the comparison aggregates (None: not in the run)."""

    algo: str
    seed: int
    path: str
    last_step: int | None
    success: dict[str, float] = field(default_factory=dict)  # task -> final success
    success_k: dict[str, int] = field(default_factory=dict)  # task -> values averaged
    avg_success: float | None = None
    crossovers: float | None = None
    trend_r2: float | None = None
    spike_amplitude: float | None = None
    eps_low: dict[str, float] = field(default_factory=dict)
    eps_high: dict[str, float] = field(default_factory=dict)
    pos_mass: float | None = None
    w_plus: float | None = None
    notes: list[str] = field(default_factory=list)


def _finite(run: RunData, key: str) -> np.ndarray:
    s = run.get(key)
    return s.finite().values if s is not None else np.zeros(0)


def summarise_run(
    run: RunData, algo: str, seed: int, *, last_k: int = 5,
    crossover_ema: float | None = DEFAULT_CROSSOVER_EMA,
) -> RunSummary:  # fmt: skip
    """:class:`RunSummary` of one run (rules in the module docstring)."""
    if last_k < 1:
        raise ValueError(f"--last-k must be >= 1, got {last_k}")
    steps = run.steps
    out = RunSummary(algo, seed, str(run.path), int(steps[-1]) if steps.size else None)
    out.notes = list(run.notes)
    for task in run.tasks:
        succ = _finite(run, f"task/{task}/success")
        if succ.size:
            tail = succ[-last_k:]
            out.success[task], out.success_k[task] = float(tail.mean()), int(tail.size)
        for name, target in (("eps_low", out.eps_low), ("eps_high", out.eps_high)):
            eps = _finite(run, f"task/{task}/{name}")
            if eps.size:
                target[task] = float(eps[-1])
    if out.success:
        out.avg_success = math.fsum(out.success.values()) / len(out.success)
    diag = pace_diagnostics(run, crossover_ema=crossover_ema)
    out.crossovers = None if diag.crossovers is None else float(diag.crossovers)
    out.trend_r2, out.spike_amplitude = diag.trend_r2, diag.spike_amplitude
    for key, attr in (("polarity/pos_mass", "pos_mass"), ("polarity/w_plus", "w_plus")):
        vals = _finite(run, key)
        if vals.size:
            setattr(out, attr, float(vals.mean()))
    return out


def discover_grid(root: Path) -> dict[str, dict[int, Path]]:
    """``{algo: {seed: run_dir}}`` of every ``root/<algo>/seed<k>/metrics.jsonl``.

    Algorithms are ordered as in ``root/grid.json`` when present, the others after them
    alphabetically; seeds ascending.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such directory")
    found: dict[str, dict[int, Path]] = {}
    for algo_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for seed_dir in algo_dir.iterdir():
            m = _SEED_DIR.match(seed_dir.name)
            if m and (seed_dir / "metrics.jsonl").is_file():
                found.setdefault(algo_dir.name, {})[int(m.group(1))] = seed_dir
    order: list[str] = []
    manifest = root / GRID_FILE
    if manifest.is_file():
        order = [a for a in _manifest_algorithms(manifest) if a in found]
    order += sorted(a for a in found if a not in order)
    return {a: dict(sorted(found[a].items())) for a in order}


def _manifest_algorithms(path: Path) -> list[str]:
    """The ``algorithms`` list of a grid's ``grid.json`` (a ``ValueError`` naming the file
    when it is not one)."""
    try:
        data = json.loads(read_text(path, limit=16 << 20))
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{path}: not a grid manifest ({str(exc)[:200]})") from None
    algos = data.get("algorithms", []) if isinstance(data, dict) else None
    if not isinstance(algos, list) or not all(isinstance(a, str) for a in algos):
        raise ValueError(f"{path}: 'algorithms' must be a list of names")
    return algos


# --------------------------------------------------------------------------- aggregation
Table = dict[str, dict[str, MeanCI]]  # algo -> column -> interval


def _ci_table(
    summaries: dict[str, list[RunSummary]], columns: Sequence[str], get: Any, level: float
) -> Table:
    return {
        algo: {c: mean_ci([get(r, c) for r in runs], level) for c in columns}
        for algo, runs in summaries.items()
    }


def _diff_table(
    summaries: dict[str, list[RunSummary]], baseline: str, columns: Sequence[str], get: Any,
    level: float,
) -> Table:  # fmt: skip
    base = {r.seed: r for r in summaries[baseline]}
    out: Table = {}
    for algo, runs in summaries.items():
        if algo == baseline:
            continue
        mine = {r.seed: r for r in runs}
        out[algo] = {
            c: paired_difference(
                {s: get(r, c) for s, r in mine.items()},
                {s: get(r, c) for s, r in base.items()},
                level,
            )
            for c in columns
        }
    return out


def _success(r: RunSummary, c: str) -> float | None:
    return r.avg_success if c == AVERAGE else r.success.get(c)


def _md_rows(table: Table, columns: Sequence[str], with_n: bool = True) -> list[list[str]]:
    rows = []
    for algo, cells in table.items():
        n = max((ci.n for ci in cells.values()), default=0)
        rows.append([algo, *(cells[c].format() for c in columns), *([str(n)] if with_n else [])])
    return rows


def _json_table(table: Table) -> dict[str, dict[str, dict[str, Any]]]:
    return {a: {c: ci.to_dict() for c, ci in cells.items()} for a, cells in table.items()}


def write_compare(
    root: str | Path,
    out_dir: str | Path | None = None,
    *,
    baseline: str | None = "grpo",
    last_k: int = 5,
    level: float = 0.95,
    crossover_ema: float | None = DEFAULT_CROSSOVER_EMA,
    measures: Mapping[str, float] | None = None,
) -> Path:
    """Write ``compare.md`` / ``compare.html`` / ``compare.json`` and PNGs for the grid in
    ``root`` into ``out_dir`` (default ``root``); returns the path of ``compare.md``.

    ``measures``: options of the issue-23 / issue-28 measures (the keyword arguments of
    :func:`entropace.report.measures.measure_run`, defaults
    :data:`entropace.report.measures.DEFAULTS`: ``warmup``, ``k``, ``ema``,
    ``solve_threshold``, ``half_life_fraction``, ``half_life_hold``, ``entropy_from``,
    ``entropy_to``).

    ``baseline``: the algorithm the paired differences are against; if it is not in the grid
    (or None) the difference tables are left out with a note.

    Raises:
        FileNotFoundError: ``root`` holds no ``<algo>/seed<k>/metrics.jsonl``; ValueError: a
            malformed ``metrics.jsonl`` (from :func:`load_run`), a bad ``last_k`` / ``level``,
            an unknown or bad measure option.
    """
    root = Path(root)
    out = Path(out_dir) if out_dir is not None else root
    grid = discover_grid(root)
    if not grid:
        raise FileNotFoundError(
            f"{root}: no runs (expected {root}/<algo>/seed<k>/metrics.jsonl, as "
            "entropace compare --out writes)"
        )
    mean_ci([0.0, 1.0], level)  # validates level before any work
    m_opts = resolve_options(measures)
    data = {a: {s: load_run(p) for s, p in seeds.items()} for a, seeds in grid.items()}
    summaries = {
        a: [summarise_run(r, a, s, last_k=last_k, crossover_ema=crossover_ema)
            for s, r in runs.items()]
        for a, runs in data.items()
    }  # fmt: skip
    tasks = sorted({t for runs in data.values() for r in runs.values() for t in r.tasks})
    per_run = {
        a: [measure_run(r, s, **m_opts) for s, r in runs.items()] for a, runs in data.items()
    }
    notes: list[str] = []
    if baseline is not None and baseline not in grid:
        notes.append(f"baseline {baseline!r} is not in the grid: no paired differences")
        baseline = None
    single = [a for a, runs in summaries.items() if len(runs) == 1]
    if single:
        notes.append(
            "one seed only (no confidence interval, cells show the value and n=1): "
            + ", ".join(single)
        )
    for a, runs in summaries.items():
        for r in runs:
            notes += [f"{a}/seed{r.seed}: {n}" for n in r.notes]
    for a, m_runs in per_run.items():
        for m in m_runs:
            notes += [f"{a}/seed{m.seed}: {n}" for n in m.notes]
    short = [min(r.success_k.values()) for runs in summaries.values() for r in runs
             if r.success_k and min(r.success_k.values()) < last_k]  # fmt: skip
    if short:
        notes.append(
            f"final success is the mean of fewer than {last_k} steps in {len(short)} runs "
            f"(the runs are shorter; fewest: {min(short)})"
        )
    last_steps = {r.last_step for runs in summaries.values() for r in runs}
    if len(last_steps) > 1:
        notes.append(f"runs end at different steps {sorted(s for s in last_steps if s)}")

    cols = [*tasks, AVERAGE]
    success = _ci_table(summaries, cols, _success, level)
    pace = _ci_table(summaries, PACE_METRICS, lambda r, c: getattr(r, c), level)
    eps_lo = _ci_table(summaries, tasks, lambda r, c: r.eps_low.get(c), level)
    eps_hi = _ci_table(summaries, tasks, lambda r, c: r.eps_high.get(c), level)
    pol = _ci_table(summaries, ("pos_mass", "w_plus"), lambda r, c: getattr(r, c), level)
    eps_lo = {a: c for a, c in eps_lo.items() if any(ci.n for ci in c.values())}
    eps_hi = {a: c for a, c in eps_hi.items() if any(ci.n for ci in c.values())}
    pol = {a: c for a, c in pol.items() if any(ci.n for ci in c.values())}
    diffs: dict[str, Table] = {}
    if baseline is not None and len(grid) > 1:
        diffs["success"] = _diff_table(summaries, baseline, cols, _success, level)
        diffs["pace"] = _diff_table(
            summaries, baseline, PACE_METRICS, lambda r, c: getattr(r, c), level
        )

    pct = f"{level * 100:g}%"
    ema_txt = f"EMA {crossover_ema}" if crossover_ema is not None else "no smoothing"
    blocks: list[Block] = [("h", 1, "entropace compare")]
    blocks.append(
        ("p", f"Grid {root}: {len(grid)} algorithms, tasks {', '.join(tasks) or '-'}. Cells: "
              f"mean ± half-width of the {pct} Student-t confidence interval over seeds (n - 1 "
              "degrees of freedom; n is the number of seeds).")
    )  # fmt: skip
    blocks.append(("h", 2, f"Final success (mean of the last {last_k} steps)"))
    blocks.append(("table", ["algorithm", *cols, "n"], _md_rows(success, cols)))
    if "success" in diffs:
        blocks.append(("h", 3, f"Paired difference to {baseline} (same seed)"))
        blocks.append(
            ("p", f"d = algorithm - {baseline} per seed, over the seeds both ran; an interval "
                  "that excludes 0 is a difference at that level.")
        )  # fmt: skip
        blocks.append(("table", ["algorithm", *cols, "pairs"], _md_rows(diffs["success"], cols)))
    blocks.append(("h", 2, "Pace diagnostics"))
    blocks.append(
        ("p", f"Per run as in entropace report (crossovers of the per-task entropy curves, "
              f"{ema_txt}; trend R^2 of h_k vs log s, mean over tasks; spike amplitude: largest "
              "rise above the running minimum over the first entropy, mean over tasks).")
    )  # fmt: skip
    heads = [_PACE_TITLES[m] for m in PACE_METRICS]
    blocks.append(("table", ["algorithm", *heads, "n"], _md_rows(pace, PACE_METRICS)))
    if "pace" in diffs:
        blocks.append(("h", 3, f"Paired difference to {baseline}"))
        blocks.append(
            ("table", ["algorithm", *heads, "pairs"], _md_rows(diffs["pace"], PACE_METRICS))
        )
    m_blocks, m_json = measure_blocks(
        per_run, tasks, baseline if baseline in grid else None, level, m_opts
    )
    blocks += m_blocks
    if eps_lo or eps_hi:
        blocks.append(("h", 2, "Clip range eps_k (last step)"))
        for name, table in (("eps_low", eps_lo), ("eps_high", eps_hi)):
            if table:
                blocks.append(("p", f"{name} per task."))
                blocks.append(("table", ["algorithm", *tasks, "n"], _md_rows(table, tasks)))
    if pol:
        blocks.append(("h", 2, "Polarity (PAPO)"))
        blocks.append(
            ("p", "Mean over steps of the share of sum|A| on P > 0 tokens (pos_mass, before "
                  "reweighting) and of the positive-branch weight w_plus.")
        )  # fmt: skip
        blocks.append(
            (
                "table",
                ["algorithm", "pos_mass", "w_plus", "n"],
                _md_rows(pol, ("pos_mass", "w_plus")),
            )
        )

    out.mkdir(parents=True, exist_ok=True)
    blocks.append(("h", 2, "Figures"))
    figures = []
    for field_name, fname, what in (
        ("entropy", "compare_entropy.png", "entropy h_k"),
        ("success", "compare_success.png", "success rate"),
    ):
        drawn = draw_band_figure(data, tasks, field_name, out / fname, level=level, label=what)
        if drawn:
            figures.append(fname)
            caption = (
                f"Per-task {what}: mean over seeds (line) and {pct} t band (shaded), on the "
                "steps every seed of the algorithm logged."
            )
            blocks.append(("img", fname, caption))
    fname = "compare_half_life.png"
    frac = float(m_opts["half_life_fraction"])
    if draw_half_life_figure(per_run, tasks, out / fname, level=level, fraction=frac):
        figures.append(fname)
        caption = (
            f"Entropy half-life per task (time to {frac:g} of the start) and pace_gap per "
            f"algorithm: one dot per seed (open: censored at the run's last step), squares the "
            f"mean over seeds with its {pct} t interval."
        )
        blocks.append(("img", fname, caption))
    blocks.append(("h", 2, "Runs"))
    blocks.append(
        ("table", ["algorithm", "seeds", "last steps"],
         [[a, ", ".join(str(r.seed) for r in runs),
           ", ".join(str(r.last_step) for r in runs)] for a, runs in summaries.items()])
    )  # fmt: skip
    if notes:
        blocks.append(("h", 2, "Notes"))
        blocks.append(("ul", notes))

    md = write_atomic(out / "compare.md", _markdown(blocks))
    write_atomic(out / "compare.html", _html(blocks, "entropace compare"))
    machine = {
        "root": str(root),
        "level": level,
        "last_k": last_k,
        "crossover_ema": crossover_ema,
        "baseline": baseline,
        "algorithms": list(grid),
        "tasks": tasks,
        "success": _json_table(success),
        "pace": _json_table(pace),
        "paired_difference": {k: _json_table(v) for k, v in diffs.items()},
        "eps_low": _json_table(eps_lo),
        "eps_high": _json_table(eps_hi),
        "polarity": _json_table(pol),
        "measures": m_json,
        "runs": [asdict(r) for runs in summaries.values() for r in runs],
        "figures": figures,
        "notes": notes,
    }
    write_atomic(out / "compare.json", json.dumps(machine, indent=2) + "\n")
    return md
