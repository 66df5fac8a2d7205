"""``entropace compare``'s issue-23 measures (report/measures.py) on hand-made grids: the tables
equal a recomputation with the diagnostics, and the exact tests pair seeds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from entropace.diagnostics.pace_measures import noise_tied_crossovers, pace_spread, success_auc
from entropace.report.compare import write_compare
from entropace.report.stats import mcnemar_exact


def _run(path: Path, entropy: dict[str, list[float]], evals: dict[str, dict[int, float]]) -> None:
    path.mkdir(parents=True)
    n = len(next(iter(entropy.values())))
    rows = []
    for s in range(n):
        row: dict[str, float] = {"step": s + 1}
        for t, h in entropy.items():
            row[f"task/{t}/entropy"] = h[s]
            row[f"task/{t}/success"] = 0.0
        for t, ev in evals.items():
            if s + 1 in ev:
                row[f"eval/{t}/success"] = ev[s + 1]
        rows.append(json.dumps(row))
    (path / "metrics.jsonl").write_text("\n".join(rows) + "\n")


def _grid(root: Path) -> dict[tuple[str, int], dict]:
    rng = np.random.default_rng(0)
    specs = {}
    for algo, solve_mid in (("grpo", {101: False, 102: False, 103: True}),
                            ("eppo", {101: True, 102: True, 103: True})):  # fmt: skip
        for seed, solved in solve_mid.items():
            ent = {
                "a": list(np.linspace(2.0, 0.5, 40) + rng.normal(0, 0.02, 40)),
                "b": list(np.linspace(1.0, 1.2, 40) + rng.normal(0, 0.02, 40)),
            }
            evals = {"a": {10: 0.5, 20: 1.0, 30: 1.0, 40: 1.0},
                     "b": {10: 0.0, 20: 0.25, 30: 1.0 if solved else 0.5, 40: 1.0 if solved else 0.5}}  # fmt: skip
            _run(root / algo / f"seed{seed}", ent, evals)
            specs[(algo, seed)] = {"entropy": ent, "eval": evals}
    return specs


def test_measures_tables_equal_a_recomputation(tmp_path: Path) -> None:
    specs = _grid(tmp_path / "grid")
    md = write_compare(tmp_path / "grid", tmp_path / "out", baseline="grpo")
    js = json.loads((tmp_path / "out" / "compare.json").read_text())["measures"]
    for algo in ("grpo", "eppo"):
        spreads = [pace_spread(specs[(algo, s)]["entropy"], start=20) for s in (101, 102, 103)]
        assert js["pace"][algo]["pace_spread"]["mean"] == pytest.approx(np.mean(spreads), rel=1e-12)
        cross = [len(noise_tied_crossovers(specs[(algo, s)]["entropy"], k=3.0, warmup=20))
                 for s in (101, 102, 103)]  # fmt: skip
        assert js["pace"][algo]["crossovers_nt"]["mean"] == pytest.approx(np.mean(cross))
        aucs = []
        for s in (101, 102, 103):
            ev = specs[(algo, s)]["eval"]
            per = [success_auc(list(e), list(e.values()), last=40) for e in ev.values()]
            aucs.append(sum(per) / 2)
        assert js["auc"][algo]["average"]["mean"] == pytest.approx(np.mean(aucs), rel=1e-12)
    # task b: solved by 1/3 grpo seeds and 3/3 eppo seeds -> McNemar on the 2 discordant seeds
    test = js["exact_tests"]["eppo"]["b"]
    assert (test["test"], test["solved_a"], test["solved_b"], test["only_a"], test["only_b"]) == (
        "McNemar", 3, 1, 2, 0)  # fmt: skip
    assert test["p_value"] == pytest.approx(mcnemar_exact(2, 0))
    assert (
        js["solve"]["grpo"]["b"]["solved"] == 1 and js["solve"]["eppo"]["b"]["steps"]["mean"] == 30
    )
    text = md.read_text()
    assert "pace_spread" in text and "McNemar p = 0.5" in text and "Time to solve" in text


def test_runs_without_held_out_evaluation_get_pace_measures_only(tmp_path: Path) -> None:
    for algo in ("grpo", "eppo"):
        _run(tmp_path / "g" / algo / "seed1", {"a": [1.0, 0.9, 0.8], "b": [1.0, 1.0, 1.0]}, {})
    write_compare(tmp_path / "g", baseline="grpo", measures={"warmup": 0})
    js = json.loads((tmp_path / "g" / "compare.json").read_text())["measures"]
    assert "auc" not in js and "exact_tests" not in js
    assert js["pace"]["eppo"]["pace_spread"]["n"] == 1
    assert js["options"]["warmup"] == 0
