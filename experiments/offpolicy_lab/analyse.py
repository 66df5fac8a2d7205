"""Assemble the preregistered arms into one grid and run the confirmatory tests.

    python experiments/offpolicy_lab/analyse.py experiments/offpolicy_lab/runs
    python experiments/offpolicy_lab/analyse.py experiments/offpolicy_lab/runs --complete-blocks

With ``--complete-blocks`` (a grid not yet finished) step 1 links, under ``RUNS/interim``, only
the runs of the seed blocks finished in every arm, and steps 2-3 run on those.

1. ``RUNS/all/<arm>/seed<k>`` become symbolic links to the runs of the separate grids
   (``ARMS``), with ``RUNS/all/grid.json`` giving the arms' order;
2. ``entropace compare --report RUNS/all --baseline grpo`` (every table, paired differences to
   GRPO, the issue-23 measures with exact tests);
3. the confirmatory family of PREREGISTRATION.md on the primary measure ``pace_spread``:
   paired t tests (direction as registered), Holm-corrected, written to
   ``RUNS/all/confirmatory.md`` with the decision rule applied.
"""

from __future__ import annotations

import json
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

#: arm -> (grid directory under RUNS, algorithm directory in it)
ARMS = {
    "grpo-eps0.1": ("eps0.1", "grpo"),
    "grpo": ("main", "grpo"),
    "grpo-eps0.3": ("eps0.3", "grpo"),
    "eppo": ("main", "eppo"),
    "eppo-success": ("main", "eppo-success"),
    "eppo-shuffled": ("main", "eppo-shuffled"),
    "papo": ("papo", "papo"),
    "eppo+papo": ("papo", "eppo+papo"),
    "grpo-async2": ("async2", "grpo"),
    "eppo-async2": ("async2", "eppo"),
}
#: the confirmatory family: (name, arm a, arm b, alternative for a - b)
FAMILY = [
    Comparison("positive control", "grpo-eps0.1", "grpo-eps0.3", "two-sided"),
    Comparison("EPPO vs GRPO", "eppo", "grpo", "less"),
    Comparison("EPPO vs shuffled eps", "eppo", "eppo-shuffled", "less"),
    Comparison("EPPO vs success pacer", "eppo", "eppo-success", "two-sided"),
    Comparison("EPPO vs GRPO, async k=2", "eppo-async2", "grpo-async2", "less"),
]


#: the preregistered seed blocks (run.sh trains every arm of a block before the next one)
BLOCKS = [list(range(start, start + 4)) for start in (7100, 7104, 7108)]
STEPS = 200


def confirmatory(all_dir: Path) -> str:
    measures = json.loads((all_dir / "compare.json").read_text())["measures"]["runs"]
    primary = {arm: per_seed(rows, "pace_spread") for arm, rows in measures.items()}
    rows = family_tests(primary, FAMILY)
    sig = {r.comparison.name: r.significant for r in rows}

    verdict = []
    if not sig["positive control"]:
        verdict.append("Positive control FAILED: the global clip range does not move pace_spread "
                       "here; the EPPO comparisons are not testable in this regime.")  # fmt: skip
    else:
        verdict.append("Positive control passed: the global clip range moves pace_spread.")
        verdict.append("EPPO paces the tasks: " + ("yes" if sig["EPPO vs GRPO"] else "no") + ".")
        verdict.append("The pacing is EPPO's (beats shuffled eps_k): "
                       + ("yes" if sig["EPPO vs GRPO"] and sig["EPPO vs shuffled eps"] else "no")
                       + ".")  # fmt: skip
        verdict.append("Off-policy (async k=2): "
                       + ("yes" if sig["EPPO vs GRPO, async k=2"] else "no") + ".")  # fmt: skip
    text = ("# Confirmatory tests (PREREGISTRATION.md)\n\nPrimary measure: pace_spread. Paired "
            "t tests over seeds, Holm-corrected over the family of 5 at alpha 0.05.\n\n"
            + family_table(rows) + "\n\n" + "\n".join(f"- {v}" for v in verdict) + "\n")  # fmt: skip
    (all_dir / "confirmatory.md").write_text(text)
    return text


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--complete-blocks"]
    runs = Path(args[0] if args else "experiments/offpolicy_lab/runs")
    if "--complete-blocks" in sys.argv:  # an unfinished grid: its complete seed blocks only
        blocks = complete_blocks(runs, ARMS, BLOCKS, STEPS)
        if not blocks:
            raise SystemExit(f"{runs}: no seed block is finished in every arm yet")
        print(f"complete seed blocks: {blocks}")
        all_dir = link_arms(runs, ARMS, "interim", [seed for block in blocks for seed in block])
    else:
        all_dir = link_arms(runs, ARMS)
    write_compare(all_dir, baseline="grpo")
    print(confirmatory(all_dir))


if __name__ == "__main__":
    main()
