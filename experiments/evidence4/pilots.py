"""The calibration pilots' table (PREREGISTRATION.md, "Dose" and "PAPO"), from the archive.

    python experiments/evidence4/pilots.py [pilots|papo-pilots ...]

Per pilot arm and seed: the realised pacer dose (run mean of ``eps_low`` of the hard task minus
the easy task's, and of the largest minus the smallest), each task's entropy half-life and the
pace gap (``entropace compare``'s measures with analyse.MEASURES), and the difference of the
pace gap from the pilot GRPO run of the same seed in the same regime (``grpo``, or
``grpo-async2`` for an asynchronous arm).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import analyse  # noqa: E402
import arms as A  # noqa: E402

from entropace.report.experiment import per_seed  # noqa: E402


def table(sets: list[str]) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        names: list[str] = []
        for which in sets:
            arms = A.PILOT_ARMS if which == "pilots" else A.PAPO_PILOT_ARMS
            present = [a.name for a in arms if a.name not in names]
            analyse.materialise(HERE / "data" / which, root, present)
            names += present
        (root / "grid.json").write_text(json.dumps({"algorithms": names}) + "\n")
        rows = analyse.compare_rows(root, Path(tmp) / "cmp", 0.5)
        refs = {k: per_seed(rows[k], "pace_gap") for k in ("grpo", "grpo-async2") if k in rows}
        out = ["| arm | seed | spread hard - easy | max - min | eps_low easy / mid / hard | "
               "half-life easy / mid / hard | pace_gap | - GRPO's |", "|---" * 8 + "|"]  # fmt: skip
        summary = []
        for arm in names:
            diffs, spreads = [], []
            grpo = refs.get("grpo-async2" if arm.endswith("-async2") else "grpo", {})
            for r in rows.get(arm, []):
                d = root / arm / f"seed{r['seed']}"
                eps = {t: analyse._series_by_step(d, f"task/{t}/eps_low") for t in A.TASKS}
                steps = sorted(eps[A.TASKS[0]])
                spread = statistics.fmean(eps[A.TASKS[-1]][s] - eps[A.TASKS[0]][s] for s in steps)
                mm = statistics.fmean(max(eps[t][s] for t in A.TASKS) - min(eps[t][s] for t in A.TASKS)
                                      for s in steps)  # fmt: skip
                means = " / ".join(f"{statistics.fmean(eps[t].values()):.3f}" for t in A.TASKS)
                hl = " / ".join(f"{r['half_life'][t]:.1f}" for t in A.TASKS)
                diff = r["pace_gap"] - grpo[r["seed"]] if grpo.get(r["seed"]) is not None else None
                diffs.append(diff)
                spreads.append(spread)
                out.append(f"| {arm} | {r['seed']} | {spread:.3f} | {mm:.3f} | {means} | {hl} | "
                           f"{r['pace_gap']:.2f} | {'' if diff is None else f'{diff:+.2f}'} |")  # fmt: skip
            ok = [x for x in diffs if x is not None]
            summary.append(f"| {arm} | {statistics.fmean(spreads):.3f} | {min(spreads):.3f} | "
                           f"{statistics.fmean(ok):+.2f} | "
                           f"{statistics.stdev(ok) if len(ok) > 1 else float('nan'):.2f} |")  # fmt: skip
        out += ["", "| arm | mean spread | smallest spread | pace_gap - GRPO's (mean) | (SD) |",
                "|---|---|---|---|---|", *summary]  # fmt: skip
        return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(table(sys.argv[1:] or ["pilots"]))
