"""Post-hoc analyses of the finished grid (RESULTS.md, "Post-hoc analyses"; not preregistered).

    python experiments/offpolicy_lab/posthoc.py experiments/offpolicy_lab/runs

Reads ``RUNS/all/compare.json`` (written by ``analyse.py``) and the runs' ``metrics.jsonl``:

1. per comparison on ``pace_spread``: the mean paired difference in each seed block, the SD of
   the 12 differences, and the smallest true mean difference a two-sided paired t test at 0.05
   detects with 80 % power (noncentral t, n - 1 degrees of freedom);
2. the mean per-task entropy over steps 21-200 of the three global-clip arms.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np
from scipy import optimize, stats

from entropace.report.runs import load_run

sys.path.insert(0, str(Path(__file__).resolve().parent))
from analyse import ARMS, BLOCKS  # noqa: E402

PAIRS = [
    ("grpo-eps0.1", "grpo-eps0.3"),
    ("eppo", "grpo"),
    ("eppo", "eppo-shuffled"),
    ("eppo", "eppo-success"),
    ("eppo-async2", "grpo-async2"),
    ("eppo-success", "grpo"),
]
TASKS = ("lab2-easy", "lab2-mid", "lab2-hard")
WARMUP = 20


def detectable(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest mean difference a two-sided paired t test at ``alpha`` detects with ``power``:
    the root in ``delta`` of ``P(|T| > t_crit) - power``, ``T`` noncentral t with ``n - 1``
    degrees of freedom and noncentrality ``delta / (sd / sqrt(n))``."""
    crit = stats.t.ppf(1 - alpha / 2, n - 1)

    def shortfall(delta: float) -> float:
        nc = delta / (sd / np.sqrt(n))
        return float(stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc) - power)

    # power is ~1 at noncentrality 8 (and the nct tails turn NaN far beyond it)
    return float(optimize.brentq(shortfall, 0.0, 8 * sd / np.sqrt(n)))


def main() -> None:
    runs = Path(sys.argv[1] if len(sys.argv) > 1 else "experiments/offpolicy_lab/runs")
    rows = json.loads((runs / "all" / "compare.json").read_text())["measures"]["runs"]
    pace = {arm: {r["seed"]: r["pace_spread"] for r in rs} for arm, rs in rows.items()}
    seeds = [s for block in BLOCKS for s in block]
    head = " | ".join(f"mean d, seeds {b[0]}-{b[-1]}" for b in BLOCKS)
    print(f"| comparison (`pace_spread`) | {head} | SD of d | detectable at n = {len(seeds)} "
          "| seeds with d < 0 |")  # fmt: skip
    print("|---|" + "---|" * (len(BLOCKS) + 3))
    for a, b in PAIRS:
        d = [pace[a][s] - pace[b][s] for s in seeds]
        by_block = [statistics.mean(pace[a][s] - pace[b][s] for s in blk) for blk in BLOCKS]
        sd = statistics.stdev(d)
        print(f"| {a} - {b} | " + " | ".join(f"{m:+.4f}" for m in by_block)
              + f" | {sd:.4f} | {detectable(sd, len(d)):.3f} | {sum(x < 0 for x in d)}/{len(d)} |")  # fmt: skip
    print("\n| arm | " + " | ".join(t.removeprefix("lab2-") for t in TASKS) + " |")
    print("|---|" + "---|" * len(TASKS))
    for arm in ("grpo-eps0.1", "grpo", "grpo-eps0.3"):
        grid, algo = ARMS[arm]
        means: dict[str, list[float]] = {t: [] for t in TASKS}
        for seed in seeds:
            run = load_run(runs / grid / algo / f"seed{seed}")
            for t in TASKS:
                h = run.task_series(t, "entropy").finite()
                means[t].append(float(h.values[h.steps > WARMUP].mean()))
        print(
            f"| {arm} | " + " | ".join(f"{statistics.mean(v):.2f}" for v in means.values()) + " |"
        )


if __name__ == "__main__":
    main()
