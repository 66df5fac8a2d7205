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
import shutil
import sys
from pathlib import Path

from entropace.report.compare import write_compare
from entropace.report.grid import run_state
from entropace.report.stats import holm, paired_difference, paired_t_pvalue

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
    ("positive control", "grpo-eps0.1", "grpo-eps0.3", "two-sided"),
    ("EPPO vs GRPO", "eppo", "grpo", "less"),
    ("EPPO vs shuffled eps", "eppo", "eppo-shuffled", "less"),
    ("EPPO vs success pacer", "eppo", "eppo-success", "two-sided"),
    ("EPPO vs GRPO, async k=2", "eppo-async2", "grpo-async2", "less"),
]


#: the preregistered seed blocks (run.sh trains every arm of a block before the next one)
BLOCKS = [list(range(start, start + 4)) for start in (7100, 7104, 7108)]
STEPS = 200


def complete_blocks(runs: Path) -> list[list[int]]:
    """The seed blocks whose runs are finished in every arm (``run_state == "done"``)."""
    return [
        block
        for block in BLOCKS
        if all(
            run_state(runs / grid / algo / f"seed{seed}", STEPS) == "done"
            for grid, algo in ARMS.values()
            for seed in block
        )
    ]


def assemble(runs: Path, seeds: list[int] | None = None) -> Path:
    """Link the arms' runs into one grid: ``RUNS/all/<arm>`` -> each arm's whole directory, or,
    given ``seeds`` (the complete blocks of an unfinished grid, as PREREGISTRATION.md
    requires), ``RUNS/interim/<arm>/seed<k>`` -> those seeds' runs only."""
    out = runs / ("all" if seeds is None else "interim")
    if out.exists():
        shutil.rmtree(out)  # links and the previous report only: rmtree does not follow links
    out.mkdir(parents=True)
    for arm, (grid, algo) in ARMS.items():
        if not (runs / grid / algo).is_dir():
            print(f"missing: {runs / grid / algo} (arm {arm})", file=sys.stderr)
            continue
        if seeds is None:
            (out / arm).symlink_to(Path("..") / grid / algo, target_is_directory=True)
            continue
        (out / arm).mkdir(parents=True)
        for seed in seeds:
            target = Path("..") / ".." / grid / algo / f"seed{seed}"
            (out / arm / f"seed{seed}").symlink_to(target, target_is_directory=True)
    (out / "grid.json").write_text(json.dumps({"algorithms": list(ARMS)}, indent=1) + "\n")
    return out


def confirmatory(all_dir: Path) -> str:
    measures = json.loads((all_dir / "compare.json").read_text())["measures"]["runs"]
    primary = {arm: {r["seed"]: r["pace_spread"] for r in rows} for arm, rows in measures.items()}
    raw: dict[str, float | None] = {}
    lines = ["| comparison | d = a - b (mean ± 95% t) | pairs | alternative | p | Holm p |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    cis = {}
    for name, a, b, alt in FAMILY:
        if a not in primary or b not in primary:
            raw[name] = None
            continue
        cis[name] = paired_difference(primary[a], primary[b])
        raw[name] = paired_t_pvalue(primary[a], primary[b], alt)
    adjusted = holm(raw)
    for name, a, b, alt in FAMILY:
        ci, p, q = cis.get(name), raw[name], adjusted[name]
        lines.append(
            f"| {name}: {a} - {b} | {ci.format(3) if ci else 'n/a'} | {ci.n if ci else 0} | "
            f"{alt} | {'n/a' if p is None else f'{p:.3g}'} | {'n/a' if q is None else f'{q:.3g}'} |"
        )

    def sig(name: str) -> bool:
        return adjusted.get(name) is not None and adjusted[name] < 0.05

    verdict = []
    if not sig("positive control"):
        verdict.append("Positive control FAILED: the global clip range does not move pace_spread "
                       "here; the EPPO comparisons are not testable in this regime.")  # fmt: skip
    else:
        verdict.append("Positive control passed: the global clip range moves pace_spread.")
        verdict.append("EPPO paces the tasks: " + ("yes" if sig("EPPO vs GRPO") else "no") + ".")
        verdict.append("The pacing is EPPO's (beats shuffled eps_k): "
                       + ("yes" if sig("EPPO vs GRPO") and sig("EPPO vs shuffled eps") else "no")
                       + ".")  # fmt: skip
        verdict.append("Off-policy (async k=2): "
                       + ("yes" if sig("EPPO vs GRPO, async k=2") else "no") + ".")  # fmt: skip
    text = ("# Confirmatory tests (PREREGISTRATION.md)\n\nPrimary measure: pace_spread. Paired "
            "t tests over seeds, Holm-corrected over the family of 5 at alpha 0.05.\n\n"
            + "\n".join(lines) + "\n\n" + "\n".join(f"- {v}" for v in verdict) + "\n")  # fmt: skip
    (all_dir / "confirmatory.md").write_text(text)
    return text


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--complete-blocks"]
    runs = Path(args[0] if args else "experiments/offpolicy_lab/runs")
    if "--complete-blocks" in sys.argv:  # an unfinished grid: its complete seed blocks only
        blocks = complete_blocks(runs)
        if not blocks:
            raise SystemExit(f"{runs}: no seed block is finished in every arm yet")
        print(f"complete seed blocks: {blocks}")
        all_dir = assemble(runs, [seed for block in blocks for seed in block])
    else:
        all_dir = assemble(runs)
    write_compare(all_dir, baseline="grpo")
    print(confirmatory(all_dir))


if __name__ == "__main__":
    main()
