"""Per arm: steps with a gradient, clip fractions over gradient-carrying tokens, last eps_k,
behaviour KL and staleness (PREREGISTRATION.md: "reported, not tested"), as a Markdown table.

    python experiments/offpolicy_lab/clip_stats.py experiments/offpolicy_lab/runs 7100 7103

Means over the seeds ``FIRST..LAST`` of each arm: the clip fractions are the means of
``clip_frac_{low,high}_active`` over the steps with ``update/trained_rows_frac > 0``; the
behaviour KL is the mean of ``rollout/behaviour_kl`` (async arms), the staleness the largest
``rollout/staleness_max``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from analyse import ARMS  # noqa: E402

TASKS = ("lab2-easy", "lab2-mid", "lab2-hard")


def numbers(rows: list[dict], key: str) -> list[float]:
    return [r[key] for r in rows if isinstance(r.get(key), int | float)]


def main() -> None:
    runs, first, last = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    print("| arm | steps with a gradient (of 200) | clip low / high, gradient-carrying tokens | "
          "eps_low easy / mid / hard, last step | behaviour KL (k3) | staleness max |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for arm, (grid, algo) in ARMS.items():
        steps, low, high, kl, stale = [], [], [], [], []
        eps: dict[str, list[float]] = {t: [] for t in TASKS}
        for seed in range(first, last + 1):
            path = runs / grid / algo / f"seed{seed}" / "metrics.jsonl"
            rows = [json.loads(x) for x in path.read_text().splitlines()]
            trained = [r for r in rows if (r.get("update/trained_rows_frac") or 0) > 0]
            steps.append(len(trained))
            low += numbers(trained, "clip_frac_low_active")
            high += numbers(trained, "clip_frac_high_active")
            for t in TASKS:
                eps[t].append(rows[-1][f"task/{t}/eps_low"])
            kl += numbers(rows, "rollout/behaviour_kl")
            stale += numbers(rows, "rollout/staleness_max")
        mean = statistics.mean
        print(
            f"| {arm} | {mean(steps):.0f} | {100 * mean(low):.1f} % / {100 * mean(high):.1f} % | "
            + " / ".join(f"{mean(v):.3f}" for v in eps.values())
            + f" | {f'{mean(kl):.2g}' if kl else '-'} | {f'{max(stale):g}' if stale else '-'} |"
        )


if __name__ == "__main__":
    main()
