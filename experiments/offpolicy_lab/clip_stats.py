"""Per arm: steps with a gradient, clip fractions over gradient-carrying tokens, last eps_k,
behaviour KL and staleness (PREREGISTRATION.md: "reported, not tested"), as a Markdown table.

    python experiments/offpolicy_lab/clip_stats.py experiments/offpolicy_lab/runs 7100 7103

Means over the seeds ``FIRST..LAST`` of each arm: the clip fractions are the means of
``clip_frac_{low,high}_active`` over the steps with ``update/trained_rows_frac > 0``; the
behaviour KL is the mean of ``rollout/behaviour_kl`` (async arms), the staleness the largest
``rollout/staleness_max``.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

from entropace.report.runs import RunData, load_run

sys.path.insert(0, str(Path(__file__).resolve().parent))
from analyse import ARMS  # noqa: E402

TASKS = ("lab2-easy", "lab2-mid", "lab2-hard")


def values(run: RunData, key: str, steps: np.ndarray | None = None) -> list[float]:
    """The finite values of ``key`` (on ``steps`` only, if given); [] if the run lacks it."""
    series = run.get(key)
    if series is None:
        return []
    series = series.finite()
    keep = np.ones(len(series), bool) if steps is None else np.isin(series.steps, steps)
    return series.values[keep].tolist()


def main() -> None:
    runs, first, last = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    print("| arm | steps with a gradient (of 200) | clip low / high, gradient-carrying tokens | "
          "eps_low easy / mid / hard, last step | behaviour KL (k3) | staleness max |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for arm, (grid, algo) in ARMS.items():
        steps, low, high, kl, stale = [], [], [], [], []
        eps: dict[str, list[float]] = {t: [] for t in TASKS}
        for seed in range(first, last + 1):
            run = load_run(runs / grid / algo / f"seed{seed}")
            frac = run.get("update/trained_rows_frac")
            trained = np.zeros(0, np.int64) if frac is None else frac.steps[frac.values > 0]
            steps.append(trained.size)
            low += values(run, "clip_frac_low_active", trained)
            high += values(run, "clip_frac_high_active", trained)
            for t in TASKS:
                eps[t].append(run.task_series(t, "eps_low").values[-1])
            kl += values(run, "rollout/behaviour_kl")
            stale += values(run, "rollout/staleness_max")
        mean = statistics.mean
        print(
            f"| {arm} | {mean(steps):.0f} | {100 * mean(low):.1f} % / {100 * mean(high):.1f} % | "
            + " / ".join(f"{mean(v):.3f}" for v in eps.values())
            + f" | {f'{mean(kl):.2g}' if kl else '-'} | {f'{max(stale):g}' if stale else '-'} |"
        )


if __name__ == "__main__":
    main()
