"""Preregistered experiments over several ``entropace compare`` grids: arms, seed blocks, and a
confirmatory family of paired tests with Holm's correction.

An experiment trains each group of arms that shares its overrides as its own grid
(``RUNS/<grid>/<algo>/seed<k>``, :mod:`entropace.report.grid`), then analyses every arm as one
grid: :func:`link_arms` links ``RUNS/all/<arm>`` to each arm's runs (symbolic links, so the
runs are not copied) for ``entropace compare --report``; :func:`complete_blocks` says which
seed blocks every arm has finished (an interrupted grid is analysed on those only); and
:func:`family_tests` runs the preregistered family: for each comparison ``(name, a, b,
alternative)`` the paired differences ``d_s = x_a(s) - x_b(s)`` over the seeds both arms have,
their mean with a Student-t interval, the paired t test's p-value in the registered direction,
and Holm's adjusted p-values over the family (:mod:`entropace.report.stats`).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from entropace.report.grid import run_state
from entropace.report.stats import MeanCI, holm, paired_difference, paired_t_pvalue

__all__ = [
    "Comparison",
    "FamilyRow",
    "complete_blocks",
    "family_table",
    "family_tests",
    "link_arms",
    "per_seed",
]

#: ``arm -> (grid directory under RUNS, algorithm directory in it)``.
Arms = Mapping[str, tuple[str, str]]


@dataclass(frozen=True)
class Comparison:
    """One member of a confirmatory family: ``a - b`` on the measure, tested ``alternative``
    (``"two-sided"``, ``"less"``: ``a < b``, ``"greater"``)."""

    name: str
    a: str
    b: str
    alternative: str = "two-sided"


@dataclass(frozen=True)
class FamilyRow:
    """A comparison's result: the paired difference (None without pairs), its p-value and the
    Holm-adjusted one (None with fewer than 2 pairs), and whether Holm's p is below alpha."""

    comparison: Comparison
    difference: MeanCI | None
    p: float | None
    holm_p: float | None
    significant: bool


def complete_blocks(
    runs: Path, arms: Arms, blocks: Sequence[Sequence[int]], steps: int
) -> list[list[int]]:
    """The seed blocks whose runs are finished (``run_state == "done"``) in every arm."""
    return [
        list(block)
        for block in blocks
        if all(
            run_state(runs / grid / algo / f"seed{seed}", steps) == "done"
            for grid, algo in arms.values()
            for seed in block
        )
    ]


def link_arms(runs: Path, arms: Arms, name: str = "all", seeds: Sequence[int] | None = None) -> Path:
    """Link every arm's runs into one grid ``RUNS/<name>``: ``<arm>`` -> the arm's algorithm
    directory, or, given ``seeds`` (the complete blocks of an unfinished grid), ``<arm>/seed<k>``
    -> those seeds' runs only; ``grid.json`` gives the arms' order. A previous ``RUNS/<name>``
    (links and a report) is replaced; ``rmtree`` does not follow the links. A missing arm is
    named on stderr and left out."""
    out = runs / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for arm, (grid, algo) in arms.items():
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
    (out / "grid.json").write_text(json.dumps({"algorithms": list(arms)}, indent=1) + "\n")
    return out


def per_seed(rows: Sequence[Mapping[str, object]], key: str) -> dict[int, float | None]:
    """``{seed: row[key]}`` of ``compare.json``'s ``measures.runs[arm]`` rows; a dotted key
    (``"half_life.lab2-hard"``) reads a nested value."""
    out: dict[int, float | None] = {}
    for row in rows:
        value: object = row
        for part in key.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        out[int(row["seed"])] = float(value) if isinstance(value, int | float) else None
    return out


def family_tests(
    values: Mapping[str, Mapping[int, float | None]],
    family: Sequence[Comparison],
    *,
    alpha: float = 0.05,
    level: float = 0.95,
) -> list[FamilyRow]:
    """The family's paired tests on ``values[arm][seed]``, Holm-corrected over its members with
    a p-value (module docstring). An arm missing from ``values`` gives a row without a test."""
    cis: dict[str, MeanCI | None] = {}
    raw: dict[str, float | None] = {}
    for c in family:
        if c.a not in values or c.b not in values:
            cis[c.name], raw[c.name] = None, None
            continue
        cis[c.name] = paired_difference(values[c.a], values[c.b], level)
        raw[c.name] = paired_t_pvalue(values[c.a], values[c.b], c.alternative)
    adjusted = holm(raw)
    return [
        FamilyRow(
            c, cis[c.name], raw[c.name], adjusted[c.name],
            adjusted[c.name] is not None and adjusted[c.name] < alpha,
        )  # fmt: skip
        for c in family
    ]


def family_table(rows: Sequence[FamilyRow], digits: int = 3) -> str:
    """The family as a markdown table: comparison, ``d = a - b`` (mean ± half-width), pairs,
    alternative, p, Holm p."""
    lines = [
        "| comparison | d = a - b (mean ± 95% t) | pairs | alternative | p | Holm p |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        c, ci = r.comparison, r.difference

        def fmt(p: float | None) -> str:
            return "n/a" if p is None else f"{p:.3g}"

        lines.append(
            f"| {c.name}: {c.a} - {c.b} | {ci.format(digits) if ci else 'n/a'} | "
            f"{ci.n if ci else 0} | {c.alternative} | {fmt(r.p)} | {fmt(r.holm_p)} |"
        )
    return "\n".join(lines)
