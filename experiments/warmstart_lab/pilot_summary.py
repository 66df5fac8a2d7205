"""Summarise calibration pilots of lab v3 (not experiment runs): per task, the entropy curve at
a few steps, the half-life (first step at or below half the step-1 entropy, linear
interpolation), reward variance over time, the greedy held-out success at step 0 and at the end,
and the clip fractions.

    python experiments/warmstart_lab/pilot_summary.py RUN [RUN ...]
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from entropace.report.runs import load_run

TASKS = ("lab2-easy", "lab2-mid", "lab2-hard")


def half_life(steps: list[int], values: list[float], fraction: float = 0.5) -> float:
    target = fraction * values[0]
    for i in range(1, len(values)):
        if values[i] <= target:
            a, b = values[i - 1], values[i]
            return steps[i - 1] + (a - target) / (a - b) * (steps[i] - steps[i - 1])
    return math.inf


def summarise(run_dir: Path) -> str:
    run = load_run(run_dir)

    def curve(key: str) -> tuple[list[int], list[float]]:
        s = run.get(key)
        if s is None:
            return [], []
        return [int(x) for x in s.steps], [float(v) for v in s.values]

    out = [f"## {run_dir.name}"]
    lines = ["| task | H@1 | H@10 | H@20 | H@30 | H@45 | H@60 | half-life | var steps (of 60) | "
             "last step with var | eval@0 | eval@end | clip hi/lo active |", "|---" * 13 + "|"]
    for task in TASKS:
        ent = curve(f"task/{task}/entropy")
        std = curve(f"task/{task}/reward_std")
        ev = curve(f"eval/{task}/success")
        hi = curve(f"task/{task}/clip_frac_high_active")
        lo = curve(f"task/{task}/clip_frac_low_active")
        steps, values = ent
        at = dict(zip(steps, values))
        var_steps = [s for s, v in zip(*std) if v == v and v > 1e-6]
        hl = half_life(steps, values)
        cells = [f"{at.get(s, float('nan')):.2f}" for s in (1, 10, 20, 30, 45, 60)]
        ev_d = dict(zip(*ev))
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
        out_hi, out_lo = mean([v for v in hi[1] if v == v]), mean([v for v in lo[1] if v == v])
        lines.append(
            f"| {task} | " + " | ".join(cells) + f" | {hl:.1f} | {len(var_steps)} | "
            f"{max(var_steps) if var_steps else '-'} | {ev_d.get(0, float('nan')):.2f} | "
            f"{ev_d.get(max(ev_d) if ev_d else 0, float('nan')):.2f} | {out_hi:.3f} / {out_lo:.3f} |"
        )
    out += lines
    t = curve("time/step")[1]
    out.append(f"\nmean time/step {sum(t) / len(t):.2f} s over {len(t)} steps")
    return "\n".join(out)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(summarise(Path(arg)))
        print()
