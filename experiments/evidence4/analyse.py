"""Evidence IV's preregistered analysis (PREREGISTRATION.md), frozen with it.

    python experiments/evidence4/analyse.py [--set grid] [--out experiments/evidence4/results]

Reads the archived runs (``data/<set>/<arm>/seed<k>/{config.yaml, metrics.jsonl.gz}``, written
by ``grid.py``), lays them out as one ``entropace compare`` grid (decompressed into a temporary
directory: ``<arm>/seed<k>``) and writes into ``OUT``:

1. ``compare.md`` / ``compare.json`` and figures: every table of ``entropace compare`` with the
   preregistered measure options (:data:`MEASURES`), paired against ``grpo``;
2. ``confirmatory.md``: the family on the primary measure ``pace_gap`` (paired t tests in the
   registered directions, Holm over the family at alpha 0.05) and the decision rule;
3. ``robustness.md``: the same family under the preregistered checks, each Holm-corrected over
   the family: the Wilcoxon signed-rank test (exact) instead of the t test; the pace gap at
   half-life fractions 0.4 and 0.6; and the mean-entropy gap (per run: the largest minus the
   smallest task's mean retained entropy over steps 1-40, ``mean_s h_k(s) / h_k(1)``);
4. ``descriptive.md``: the secondary measures: per-task half-lives, held-out AUC (average and
   per task, paired differences with t intervals), solve counts (McNemar), the realised pacer
   dose per arm (run-mean ``eps_low`` per task and the spread hard - easy), clip fractions, and
   PAPO's weights over steps 1-10 and over the run.

Only the seeds both arms of a comparison have enter it (the tables say how many).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import arms as A  # noqa: E402

from entropace.report.compare import write_compare  # noqa: E402
from entropace.report.experiment import family_table, family_tests, per_seed  # noqa: E402
from entropace.report.runs import load_run  # noqa: E402
from entropace.report.stats import (  # noqa: E402
    holm,
    paired_difference,
    paired_solves,
    wilcoxon_signed_rank,
)

#: the measures' options (entropace.report.measures.DEFAULTS otherwise), as Evidence III
MEASURES = {"warmup": 1, "half_life_fraction": 0.5, "half_life_hold": 1,
            "entropy_from": 1, "entropy_to": A.STEPS}  # fmt: skip


def materialise(data: Path, root: Path, arms: list[str]) -> dict[str, list[int]]:
    """``data/<arm>/seed<k>`` (gzipped metrics) -> ``root/<arm>/seed<k>`` (a run directory)."""
    seeds: dict[str, list[int]] = {}
    for arm in arms:
        for d in sorted((data / arm).glob("seed*")):
            if not (d / "metrics.jsonl.gz").exists():
                continue
            dest = root / arm / d.name
            dest.mkdir(parents=True)
            shutil.copyfile(d / "config.yaml", dest / "config.yaml")
            with gzip.open(d / "metrics.jsonl.gz", "rb") as src, open(dest / "metrics.jsonl", "wb") as dst:
                shutil.copyfileobj(src, dst)
            seeds.setdefault(arm, []).append(int(d.name[4:]))
    present = [a for a in arms if a in seeds]
    (root / "grid.json").write_text(json.dumps({"algorithms": present}) + "\n")
    return seeds


def compare_rows(root: Path, out: Path, fraction: float) -> dict[str, list[dict]]:
    """``compare.json``'s per-run measure rows at half-life fraction ``fraction``."""
    write_compare(root, out, baseline="grpo", measures={**MEASURES, "half_life_fraction": fraction})
    return json.loads((out / "compare.json").read_text())["measures"]["runs"]


def _series(run_dir: Path, key: str) -> list[float]:
    s = load_run(run_dir).get(key)
    return [float(v) for v in s.values if v is not None and math.isfinite(float(v))] if s else []


def _series_by_step(run_dir: Path, key: str) -> dict[int, float]:
    s = load_run(run_dir).get(key)
    return {int(a): float(b) for a, b in zip(s.steps, s.values)} if s is not None else {}


def mean_entropy_gap(run_dir: Path) -> float | None:
    """Largest minus smallest task's mean over steps 1..STEPS of ``h_k(s) / h_k(1)``."""
    ratios = []
    for t in A.TASKS:
        h = _series_by_step(run_dir, f"task/{t}/entropy")
        if not h.get(1):
            return None
        ratios.append(statistics.fmean(h[s] / h[1] for s in h if 1 <= s <= A.STEPS))
    return max(ratios) - min(ratios)


def _mean(xs: list[float | None]) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.fmean(xs) if xs else math.nan


def confirmatory(rows: dict[str, list[dict]]) -> tuple[str, dict[str, bool]]:
    primary = {arm: per_seed(r, "pace_gap") for arm, r in rows.items()}
    results = family_tests(primary, A.FAMILY)
    sig = {r.comparison.name: r.significant for r in results}
    censored = {arm: sum(bool(x.get("pace_gap_censored")) for x in r) for arm, r in rows.items()}
    secondary = family_tests(primary, A.SECONDARY)
    lines = ["| comparison | d = a - b (mean ± 95% t) | pairs | alternative | t p | Wilcoxon p |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in secondary:
        c, ci = r.comparison, r.difference
        w = wilcoxon_signed_rank(primary.get(c.a, {}), primary.get(c.b, {}), c.alternative)
        lines.append(f"| {c.name}: {c.a} - {c.b} | {ci.format(3) if ci else 'n/a'} | "
                     f"{ci.n if ci else 0} | {c.alternative} | "
                     f"{'n/a' if r.p is None else f'{r.p:.3g}'} | "
                     f"{'n/a' if w is None else f'{w:.3g}'} |")  # fmt: skip
    text = ("# Evidence IV: confirmatory tests (PREREGISTRATION.md)\n\nPrimary measure: `pace_gap` "
            "(steps; the slowest task's entropy half-life minus the fastest's, per run). Paired "
            f"t tests over seeds, Holm-corrected over the family of {len(A.FAMILY)} at alpha "
            "0.05.\n\n" + family_table(results) + "\n\nRuns with a censored half-life per arm: "
            + ", ".join(f"{a} {n}" for a, n in censored.items()) + ".\n\n"
            + "\n".join(f"- {line}" for line in A.decisions(sig))
            + "\n\n## Secondary comparisons (preregistered, not corrected: exploratory)\n\n"
            + "\n".join(lines) + "\n")  # fmt: skip
    return text, sig


def robustness(rows: dict[float, dict[str, list[dict]]], gaps: dict[str, dict[int, float | None]]) -> str:
    """The family under each preregistered check, Holm over the family for each."""
    checks: dict[str, dict[str, float | None]] = {}
    primary = {arm: per_seed(r, "pace_gap") for arm, r in rows[0.5].items()}
    checks["Wilcoxon (pace_gap, fraction 0.5)"] = {
        c.name: wilcoxon_signed_rank(primary.get(c.a, {}), primary.get(c.b, {}), c.alternative)
        for c in A.FAMILY
    }
    for fraction in (0.4, 0.6):
        values = {arm: per_seed(r, "pace_gap") for arm, r in rows[fraction].items()}
        checks[f"t test, pace_gap at fraction {fraction}"] = {
            r.comparison.name: r.p for r in family_tests(values, A.FAMILY)
        }
    checks["t test, mean-entropy gap"] = {
        r.comparison.name: r.p for r in family_tests(gaps, A.FAMILY)
    }
    names = [c.name for c in A.FAMILY]
    out = ["# Evidence IV: robustness checks (preregistered)\n",
           "Holm-adjusted p-values over the family, per check (raw p in brackets); the "
           "registered directions.\n", "| comparison | " + " | ".join(checks) + " |",
           "|---|" + "---|" * len(checks)]  # fmt: skip
    adjusted = {k: holm(v) for k, v in checks.items()}
    for n in names:
        cells = []
        for k in checks:
            p, hp = checks[k].get(n), adjusted[k].get(n)
            cells.append("n/a" if p is None else f"{hp:.3g} ({p:.3g})")
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def descriptive(root: Path, rows: dict[str, list[dict]]) -> str:
    out = ["# Evidence IV: secondary and descriptive measures (preregistered, not tested)\n"]
    keys = [*(f"half_life.{t}" for t in A.TASKS), "auc.average", *(f"auc.{t}" for t in A.TASKS)]
    out.append("## Paired differences a - b (mean ± 95% t, pairs)\n")
    out.append("| a - b | pace_gap | " + " | ".join(keys) + " |")
    out.append("|---|---|" + "---|" * len(keys))
    for a, b in A.DESCRIBED:
        if a not in rows or b not in rows:
            continue
        cells = []
        for key in ("pace_gap", *keys):
            ci = paired_difference(per_seed(rows[a], key), per_seed(rows[b], key))
            cells.append(f"{ci.format(2)} ({ci.n})" if ci.n else "n/a")
        out.append(f"| {a} - {b} | " + " | ".join(cells) + " |")
    out.append("\n## Solved by the end (greedy held-out >= 0.9), seeds a vs b, McNemar exact\n")
    out.append("| a - b | " + " | ".join(A.TASKS) + " |")
    out.append("|---|" + "---|" * len(A.TASKS))
    for a, b in A.DESCRIBED:
        if a not in rows or b not in rows:
            continue
        cells = []
        for t in A.TASKS:
            solved = [{s: v is not None and v >= 0.5 for s, v in per_seed(rows[arm], f"solved.{t}").items()}
                      for arm in (a, b)]  # fmt: skip
            cells.append(paired_solves(*solved).format())
        out.append(f"| {a} - {b} | " + " | ".join(cells) + " |")
    out.append("\n## Per arm (means over seeds): pace gap, half-lives, realised pacer dose, clip "
               "fractions over gradient-carrying tokens (high / low)\n")  # fmt: skip
    head = ["arm", "seeds", "pace_gap", *(f"half-life {t}" for t in A.TASKS),
            *(f"eps_low {t}" for t in A.TASKS), "dose (hard - easy)",
            *(f"clip {t}" for t in A.TASKS)]  # fmt: skip
    out.append("| " + " | ".join(head) + " |")
    out.append("|---" * len(head) + "|")
    for arm, r in rows.items():
        dirs = sorted((root / arm).glob("seed*"))
        eps = {t: [_mean(_series(d, f"task/{t}/eps_low")) for d in dirs] for t in A.TASKS}
        spread = [h - e for h, e in zip(eps[A.TASKS[-1]], eps[A.TASKS[0]], strict=True)]
        cells = [arm, str(len(r)), f"{_mean([x['pace_gap'] for x in r]):.2f}"]
        cells += [f"{_mean([x['half_life'].get(t) for x in r]):.2f}" for t in A.TASKS]
        cells += [f"{_mean(eps[t]):.3f}" for t in A.TASKS]
        cells.append(f"{_mean(spread):.3f}")
        for t in A.TASKS:
            hi = _mean([_mean(_series(d, f"task/{t}/clip_frac_high_active")) for d in dirs])
            lo = _mean([_mean(_series(d, f"task/{t}/clip_frac_low_active")) for d in dirs])
            cells.append(f"{hi:.3f} / {lo:.3f}")
        out.append("| " + " | ".join(cells) + " |")
    out.append("\n## PAPO's branch weights and masses (mean over seeds)\n")
    out.append("| arm | w_plus steps 1-10 | w_plus run | u steps 1-10 | first step with u > 0 "
               "(median) | pos_mass run | neg_mass run |")  # fmt: skip
    out.append("|---|---|---|---|---|---|---|")
    for arm in rows:
        dirs = sorted((root / arm).glob("seed*"))
        if not dirs or not _series(dirs[0], "polarity/w_plus"):
            continue
        w10 = [_mean(_series(d, "polarity/w_plus")[:10]) for d in dirs]
        u10 = [_mean(_series(d, "polarity/u")[:10]) for d in dirs]
        first = [next((i + 1 for i, u in enumerate(_series(d, "polarity/u")) if u > 0), math.inf)
                 for d in dirs]  # fmt: skip
        cells = [f"{_mean(w10):.2f}", f"{_mean([_mean(_series(d, 'polarity/w_plus')) for d in dirs]):.2f}",
                 f"{_mean(u10):+.2f}", f"{statistics.median(first)}",
                 *(f"{_mean([_mean(_series(d, f'polarity/{k}')) for d in dirs]):.3f}"
                   for k in ("pos_mass", "neg_mass"))]  # fmt: skip
        out.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", default="grid")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    arms = [a.name for a in (A.GRID_ARMS if args.set == "grid" else A.PILOT_ARMS)]
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        seeds = materialise(HERE / "data" / args.set, root, arms)
        print("runs per arm: " + ", ".join(f"{a} {len(s)}" for a, s in seeds.items()))
        rows = {f: compare_rows(root, Path(tmp) / f"cmp{f}", f) for f in (0.4, 0.6)}
        rows[0.5] = compare_rows(root, args.out, 0.5)
        gaps = {arm: {s: mean_entropy_gap(root / arm / f"seed{s}") for s in ss}
                for arm, ss in seeds.items()}  # fmt: skip
        text, _ = confirmatory(rows[0.5])
        (args.out / "confirmatory.md").write_text(text)
        (args.out / "robustness.md").write_text(robustness(rows, gaps))
        (args.out / "descriptive.md").write_text(descriptive(root, rows[0.5]))
        # compare.md links its figures and runs by path: point them at the archive
        print(text)
        print((args.out / "robustness.md").read_text())


if __name__ == "__main__":
    main()
