"""Numbers of the pace-lab grid that `entropace compare` does not tabulate (RESULTS.md).

    python experiments/pace_lab/summarize.py [experiments/pace_lab/runs] > experiments/pace_lab/summary.md

Reads every ``RUN/metrics.jsonl`` of the grid (``<algo>/seed<k>/``) and writes Markdown:

1. the lab's own requirements, per GRPO seed: lab-easy success over the first 5 and the last
   20 steps, crossovers of the EMA-0.9 per-task entropy curves and spike amplitude
   (:mod:`entropace.diagnostics.pace`, as ``entropace report`` / ``compare``), the step of each
   task's largest rise above its running minimum, and the summed ``time/step``;
2. per algorithm over seeds (mean ± 95% t half-width, :func:`entropace.report.stats.mean_ci`):
   the mean over tasks of the per-task entropy over the last 20 steps, the number of tasks
   solved (last-20 success > 0.5), and the first step at which each task's 10-step moving
   success reaches 0.5 (seeds that never do are counted, not averaged);
3. pairs of algorithms whose runs of a seed are equal (every step's entropy);
4. the polarity audit (``audit/*``, logged every ``audit.every`` steps): per run the mean over
   audited steps, then mean ± CI over seeds per algorithm.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from entropace.diagnostics.pace import crossover_count, crossover_events, max_rise, spike_amplitude
from entropace.report.stats import mean_ci, paired_difference

TASKS = ("lab-easy", "lab-mid", "lab-hard")
AUDIT_KEYS = (
    "sign_agreement",
    "sign_agreement_pos",
    "sign_agreement_neg",
    "spearman",
    "dH_pos",
    "dH_neg",
    "dH_mean",
    "first_order_rel_error",
)


def read(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def series(rows: list[dict[str, float]], key: str) -> np.ndarray:
    return np.array([float("nan") if r.get(key) is None else r[key] for r in rows], float)


def first_step(success: np.ndarray, window: int = 10, level: float = 0.5) -> int | None:
    """First step (1-based) whose trailing ``window``-step mean success is >= ``level``."""
    for s in range(window, success.size + 1):
        if success[s - window : s].mean() >= level:
            return s
    return None


def fmt(ci) -> str:  # type: ignore[no-untyped-def]
    return ci.format(3)


def main(root: Path) -> None:
    grid: dict[str, dict[int, list[dict[str, float]]]] = {}
    for metrics in sorted(root.glob("*/seed*/metrics.jsonl")):
        algo, seed = metrics.parent.parent.name, int(metrics.parent.name[4:])
        grid.setdefault(algo, {})[seed] = read(metrics)
    algos = [a for a in json.loads((root / "grid.json").read_text())["algorithms"] if a in grid]

    print(f"# Pace-lab grid: numbers beyond the compare report\n\nGrid `{root}`.\n")
    print("## 1. The lab's requirements under GRPO (per seed)\n")
    print("| seed | steps | easy success, first 5 | easy success, last 20 | crossovers "
          "| after step 20 | spike amp. | largest rise at step (easy/mid/hard) "
          "| sum time/step (s) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for seed, rows in sorted(grid.get("grpo", {}).items()):
        curves = {t: series(rows, f"task/{t}/entropy") for t in TASKS}
        easy = series(rows, "task/lab-easy/success")
        rise_at = []
        for t in TASKS:
            h = curves[t]
            rise = h - np.minimum.accumulate(h)
            rise_at.append(f"{int(np.argmax(rise)) + 1} ({max_rise(h) / h[0]:.2f})")
        print(
            f"| {seed} | {len(rows)} | {easy[:5].mean():.3f} | {easy[-20:].mean():.3f} "
            f"| {crossover_count(curves, ema=0.9)} "
            f"| {sum(e.step >= 20 for e in crossover_events(curves, ema=0.9))} "
            f"| {spike_amplitude(curves):.3f} "
            f"| {' / '.join(rise_at)} | {series(rows, 'time/step').sum():.1f} |"
        )
    print("\nCrossovers: EMA 0.9 as in the report; 'after step 20': those at 0-based index >= 20. "
          "Largest rise: step of the largest rise of the task's entropy above its running "
          "minimum, and in brackets that rise over the task's first entropy.\n")  # fmt: skip

    print("## 2. Entropy level and when tasks are learnt (per algorithm, over seeds)\n")
    print("| algorithm | entropy, last 20 (mean over tasks) | d vs grpo | tasks solved "
          "| first step at 0.5 success: easy / mid / hard (seeds reaching it) |")  # fmt: skip
    print("|---|---|---|---|---|")
    ent: dict[str, dict[int, float]] = {}
    for algo in algos:
        ent[algo], solved, firsts = {}, {}, {t: [] for t in TASKS}
        for seed, rows in grid[algo].items():
            ent[algo][seed] = float(
                np.mean([series(rows, f"task/{t}/entropy")[-20:].mean() for t in TASKS])
            )
            succ = {t: series(rows, f"task/{t}/success") for t in TASKS}
            solved[seed] = float(sum(succ[t][-20:].mean() > 0.5 for t in TASKS))
            for t in TASKS:
                firsts[t].append(first_step(succ[t]))
        n = len(grid[algo])
        first_txt = " / ".join(
            f"{fmt(mean_ci([f for f in firsts[t] if f is not None]))} "
            f"({sum(f is not None for f in firsts[t])}/{n})"
            for t in TASKS
        )
        diff = "" if algo == "grpo" else fmt(paired_difference(ent[algo], ent.get("grpo", {})))
        print(
            f"| {algo} | {fmt(mean_ci(list(ent[algo].values())))} | {diff} "
            f"| {fmt(mean_ci(list(solved.values())))} | {first_txt} |"
        )

    print("\n## 3. Runs that equal another algorithm's run of the same seed\n")
    same = []
    for i, a in enumerate(algos):
        for b in algos[i + 1 :]:
            seeds = sorted(set(grid[a]) & set(grid[b]))
            equal = [
                s for s in seeds
                if [r.get("entropy") for r in grid[a][s]] == [r.get("entropy") for r in grid[b][s]]
            ]  # fmt: skip
            if equal:
                eps_diff = sum(
                    any(r.get(f"task/{t}/eps_low") != q.get(f"task/{t}/eps_low") for t in TASKS)
                    for s in equal
                    for r, q in zip(grid[a][s], grid[b][s])
                )
                same.append(f"- {a} = {b} (every step's entropy equal) in {len(equal)}/"
                            f"{len(seeds)} seeds; their eps_low differ on {eps_diff} steps "
                            "of those runs")  # fmt: skip
    print("\n".join(same) if same else "None.")

    print("\n## 4. The polarity audit inside training (`audit/*`, mean over audited steps)\n")
    audited = [
        a for a in algos if any("audit/states" in r for rows in grid[a].values() for r in rows)
    ]
    if not audited:
        print("No audit keys in these runs (audit.every=0).")
        return
    print("| algorithm | " + " | ".join(AUDIT_KEYS) + " | audited steps |")
    print("|---|" + "---|" * (len(AUDIT_KEYS) + 1))
    for algo in audited:
        per_key = {k: [] for k in AUDIT_KEYS}
        steps = []
        for rows in grid[algo].values():
            audit_rows = [r for r in rows if "audit/states" in r]
            steps.append(len(audit_rows))
            for k in AUDIT_KEYS:
                vals = [r.get(f"audit/{k}") for r in audit_rows]
                vals = [v for v in vals if v is not None and math.isfinite(v)]
                per_key[k].append(float(np.mean(vals)) if vals else None)
        cells = " | ".join(fmt(mean_ci(per_key[k])) for k in AUDIT_KEYS)
        print(f"| {algo} | {cells} | {min(steps)}-{max(steps)} |")
    print("\nsign_agreement: share of sampled tokens with P != 0 whose realised entropy change "
          "has the sign of P (pos / neg: on the P > 0 / P < 0 tokens); spearman: rank "
          "correlation of realised dH and P; dH_pos / dH_neg: mean realised dH on those "
          "tokens; first_order_rel_error: sum |dH - dH_lin| / sum |dH| with dH_lin the "
          "first-order change along the realised logit step (docs/training.md).")  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "experiments/pace_lab/runs"))
