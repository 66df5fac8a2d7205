"""Assemble the preregistered arms of Evidence III into one grid and run the confirmatory tests.

    python experiments/warmstart_lab/analyse.py experiments/warmstart_lab/runs
    python experiments/warmstart_lab/analyse.py experiments/warmstart_lab/runs --complete-blocks

With ``--complete-blocks`` (a grid not yet finished) step 1 links, under ``RUNS/interim``, only
the runs of the seed blocks finished in every arm, and steps 2-4 run on those.

1. ``RUNS/all/<arm>`` become symbolic links to the runs of the separate grids (``ARMS``);
2. ``entropace compare --report`` over every arm with the preregistered measure options
   (``MEASURES``), paired differences against GRPO: ``RUNS/all/compare.{md,json}`` and figures;
3. the confirmatory family of PREREGISTRATION.md on the primary measure ``pace_gap``: paired t
   tests (directions as registered), Holm-corrected over the 7 members, the decision rule
   applied: ``RUNS/all/confirmatory.md``;
4. the preregistered descriptive tables (``RUNS/all/descriptive.md``): the per-task and the
   contrasts' paired differences of half-lives, mean entropies, held-out AUC and time to
   solve, solve counts; clip fractions per arm and task; EPPO's eps_k; PAPO's branch masses
   and weights; the asynchronous arms' staleness and behaviour KL.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from entropace.report.compare import write_compare
from entropace.report.experiment import (
    Comparison,
    complete_blocks,
    family_table,
    family_tests,
    link_arms,
    per_seed,
)
from entropace.report.runs import load_run
from entropace.report.stats import paired_difference, paired_solves

#: arm -> (grid directory under RUNS, algorithm directory in it)
ARMS = {
    "grpo": ("main", "grpo"),
    "grpo-eps0.1": ("eps0.1", "grpo"),
    "grpo-eps0.4": ("eps0.4", "grpo"),
    "grpo-eh0.1": ("eh0.1", "grpo"),
    "grpo-eh0.4": ("eh0.4", "grpo"),
    "fast-tight": ("fast-tight", "grpo"),
    "fast-wide": ("fast-wide", "grpo"),
    "eppo": ("main", "eppo"),
    "eppo-shuffled": ("main", "eppo-shuffled"),
    "eppo-success": ("main", "eppo-success"),
    "papo": ("papo", "papo"),
    "eppo+papo": ("papo", "eppo+papo"),
    "grpo-async2": ("async2", "grpo"),
    "eppo-async2": ("async2", "eppo"),
}
#: the confirmatory family on pace_gap (PREREGISTRATION.md)
FAMILY = [
    Comparison("C1 global clip", "grpo-eps0.1", "grpo-eps0.4", "two-sided"),
    Comparison("C2 upper bound alone", "grpo-eh0.1", "grpo-eh0.4", "two-sided"),
    Comparison("C3 per-task clip", "fast-tight", "fast-wide", "two-sided"),
    Comparison("H1 EPPO vs GRPO", "eppo", "grpo", "less"),
    Comparison("H2 EPPO vs shuffled eps_k", "eppo", "eppo-shuffled", "less"),
    Comparison("H3 EPPO vs success pacer", "eppo", "eppo-success", "two-sided"),
    Comparison("H4 EPPO vs GRPO, async k=2", "eppo-async2", "grpo-async2", "less"),
]
#: the measures' options (entropace.report.measures.DEFAULTS otherwise)
MEASURES = {"warmup": 1, "half_life_fraction": 0.5, "half_life_hold": 1,
            "entropy_from": 1, "entropy_to": 40}  # fmt: skip
TASKS = ("lab2-easy", "lab2-mid", "lab2-hard")
#: the preregistered seed blocks (run.sh trains every arm of a block before the next one)
BLOCKS = [list(range(start, start + 4)) for start in (7300, 7304, 7308)]
STEPS = 40


def decisions(sig: dict[str, bool]) -> list[str]:
    """The preregistered decision rule, applied."""
    out = []
    if not (sig["C1 global clip"] or sig["C2 upper bound alone"]):
        out.append("Global positive controls FAILED: the clip range does not move the pace gap "
                   "here; nothing below is testable.")  # fmt: skip
        return out
    out.append("Global positive control passed: the clip range moves the pace gap "
               f"(C1 {'yes' if sig['C1 global clip'] else 'no'}, "
               f"C2 {'yes' if sig['C2 upper bound alone'] else 'no'}).")  # fmt: skip
    if not sig["C3 per-task clip"]:
        out.append("Per-task positive control FAILED: per-task clip ranges in one shared policy "
                   "do not move the pace gap here, so no per-task pacer can; the EPPO "
                   "comparisons are not testable.")  # fmt: skip
        return out
    out.append("Per-task positive control passed: per-task clip ranges move the pace gap.")
    out.append("EPPO lowers the pace gap against GRPO: " + ("yes" if sig["H1 EPPO vs GRPO"] else "no") + ".")
    out.append("The pacing is EPPO's entropy signal (beats shuffled eps_k): "
               + ("yes" if sig["H1 EPPO vs GRPO"] and sig["H2 EPPO vs shuffled eps_k"] else "no")
               + ".")  # fmt: skip
    out.append("EPPO differs from the success-driven pacer: "
               + ("yes" if sig["H3 EPPO vs success pacer"] else "no") + ".")  # fmt: skip
    out.append("Off-policy (async k=2), EPPO lowers the pace gap against GRPO: "
               + ("yes" if sig["H4 EPPO vs GRPO, async k=2"] else "no") + ".")  # fmt: skip
    return out


def confirmatory(all_dir: Path) -> str:
    runs = json.loads((all_dir / "compare.json").read_text())["measures"]["runs"]
    primary = {arm: per_seed(rows, "pace_gap") for arm, rows in runs.items()}
    rows = family_tests(primary, FAMILY)
    sig = {r.comparison.name: r.significant for r in rows}
    censored = {arm: sum(bool(r.get("pace_gap_censored")) for r in rs) for arm, rs in runs.items()}
    text = (
        "# Confirmatory tests (PREREGISTRATION.md)\n\nPrimary measure: `pace_gap` (steps; the "
        "slowest task's entropy half-life minus the fastest's, per run). Paired t tests over "
        "seeds, Holm-corrected over the family of 7 at alpha 0.05.\n\n" + family_table(rows)
        + "\n\nRuns with a censored half-life (pace_gap a bound) per arm: "
        + ", ".join(f"{a} {n}" for a, n in censored.items()) + ".\n\n"
        + "\n".join(f"- {v}" for v in decisions(sig)) + "\n"
    )  # fmt: skip
    (all_dir / "confirmatory.md").write_text(text)
    return text


def _mean(values: list[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def _series_mean(run_dir: Path, key: str) -> float:
    s = load_run(run_dir).get(key)
    return _mean([float(v) for v in s.values]) if s is not None else math.nan


def _solve_steps(rows: list[dict], task: str) -> dict[int, float | None]:
    """Each seed's time to solve ``task`` (``solve_step``), :data:`STEPS` when never solved."""
    steps = per_seed(rows, f"solve_step.{task}")
    return {s: (v if v is not None and math.isfinite(v) else float(STEPS)) for s, v in steps.items()}


def descriptive(all_dir: Path) -> str:
    """The preregistered descriptive tables (module docstring, step 4)."""
    runs = json.loads((all_dir / "compare.json").read_text())["measures"]["runs"]
    out = ["# Descriptive tables (preregistered, not tested)\n"]
    pairs = [(c.a, c.b) for c in FAMILY] + [("eppo-success", "grpo"), ("papo", "grpo"),
                                            ("eppo+papo", "eppo"), ("grpo-async2", "grpo")]  # fmt: skip
    keys = [*(f"half_life.{t}" for t in TASKS), *(f"entropy_mean.{t}" for t in TASKS),
            "pace_spread", "crossovers_nt", "auc.average", *(f"auc.{t}" for t in TASKS)]  # fmt: skip
    out.append("## Paired differences a - b (mean ± 95% t, n)\n")
    pairs = [(a, b) for a, b in pairs if a in runs and b in runs]
    out.append("| a - b | " + " | ".join(keys) + " |")
    out.append("|---|" + "---|" * len(keys))
    for a, b in pairs:
        cells = []
        for key in keys:
            ci = paired_difference(per_seed(runs[a], key), per_seed(runs[b], key))
            cells.append(f"{ci.format(2)} ({ci.n})" if ci.n else "n/a")
        out.append(f"| {a} - {b} | " + " | ".join(cells) + " |")
    out.append("\n## Held-out success: time to solve and solved by the end, per task\n")
    out.append("Time to solve: the first evaluation at >= 0.9 greedy success, an unsolved run "
               f"counted as {STEPS} (censored); paired difference a - b (mean ± 95% t). Solved "
               "by the end: seeds solved in a vs in b, McNemar's exact test on the discordant "
               "seeds.\n")  # fmt: skip
    out.append("| a - b | " + " | ".join(f"time to solve {t} | solved {t}" for t in TASKS) + " |")
    out.append("|---|" + "---|---|" * len(TASKS))
    for a, b in pairs:
        cells = []
        for t in TASKS:
            steps = [_solve_steps(runs[arm], t) for arm in (a, b)]
            ci = paired_difference(*steps)
            cells.append(f"{ci.format(2)} ({ci.n})" if ci.n else "n/a")
            solved = [{s: v is not None and v >= 0.5 for s, v in per_seed(runs[arm], f"solved.{t}").items()}
                      for arm in (a, b)]  # fmt: skip
            cells.append(paired_solves(*solved).format())
        out.append(f"| {a} - {b} | " + " | ".join(cells) + " |")
    out.append("\n## Per arm: half-lives (mean over seeds), solved by the end (seeds), clip "
               "fractions over gradient-carrying tokens (high / low, run mean), eps_k (run mean)\n")  # fmt: skip
    head = ["arm", *(f"half-life {t}" for t in TASKS), *(f"solved {t}" for t in TASKS),
            *(f"clip {t}" for t in TASKS), *(f"eps_low {t}" for t in TASKS)]  # fmt: skip
    out.append("| " + " | ".join(head) + " |")
    out.append("|---" * len(head) + "|")
    for arm, rows in runs.items():
        dirs = sorted((all_dir / arm).glob("seed*"))
        cells = [arm]
        cells += [f"{_mean([r['half_life'].get(t) for r in rows]):.1f}" for t in TASKS]
        cells += [f"{sum(bool(r['solved'].get(t)) for r in rows)}/{len(rows)}" for t in TASKS]
        for t in TASKS:
            hi = _mean([_series_mean(d, f"task/{t}/clip_frac_high_active") for d in dirs])
            lo = _mean([_series_mean(d, f"task/{t}/clip_frac_low_active") for d in dirs])
            cells.append(f"{hi:.3f} / {lo:.3f}")
        cells += [f"{_mean([_series_mean(d, f'task/{t}/eps_low') for d in dirs]):.3f}" for t in TASKS]
        out.append("| " + " | ".join(cells) + " |")
    out.append("\n## PAPO: branch masses and weights (run means, mean over seeds)\n")
    out.append("| arm | polarity/pos_mass | polarity/neg_mass | polarity/w_plus | polarity/w_minus | polarity/u |")
    out.append("|---|---|---|---|---|---|")
    for arm in ("papo", "eppo+papo"):
        dirs = sorted((all_dir / arm).glob("seed*"))
        if not dirs:
            continue
        cells = [f"{_mean([_series_mean(d, f'polarity/{k}') for d in dirs]):.3f}"
                 for k in ("pos_mass", "neg_mass", "w_plus", "w_minus", "u")]  # fmt: skip
        out.append(f"| {arm} | " + " | ".join(cells) + " |")
    out.append("\n## Asynchronous arms (run means, mean over seeds)\n")
    out.append("| arm | rollout/behaviour_kl | rollout/staleness_mean |")
    out.append("|---|---|---|")
    for arm in ("grpo-async2", "eppo-async2"):
        dirs = sorted((all_dir / arm).glob("seed*"))
        if dirs:
            kl = _mean([_series_mean(d, "rollout/behaviour_kl") for d in dirs])
            st = _mean([_series_mean(d, "rollout/staleness_mean") for d in dirs])
            out.append(f"| {arm} | {kl:.4f} | {st:.2f} |")
    text = "\n".join(out) + "\n"
    (all_dir / "descriptive.md").write_text(text)
    return text


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--complete-blocks"]
    runs = Path(args[0] if args else "experiments/warmstart_lab/runs")
    if "--complete-blocks" in sys.argv:  # an unfinished grid: its complete seed blocks only
        blocks = complete_blocks(runs, ARMS, BLOCKS, STEPS)
        if not blocks:
            raise SystemExit(f"{runs}: no seed block is finished in every arm yet")
        print(f"complete seed blocks: {blocks}")
        all_dir = link_arms(runs, ARMS, "interim", [s for block in blocks for s in block])
    else:
        all_dir = link_arms(runs, ARMS)
    write_compare(all_dir, baseline="grpo", measures=MEASURES)
    print(confirmatory(all_dir))
    print(descriptive(all_dir))


if __name__ == "__main__":
    main()
