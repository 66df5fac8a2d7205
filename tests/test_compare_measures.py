"""``entropace compare``'s issue-23 / issue-28 measures (report/measures.py) on hand-made grids:
the tables equal a recomputation with the diagnostics or hand-computed half-lives, pace gaps and
AUCs (with and without a step-0 evaluation), and the exact tests pair seeds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from entropace.cli import main
from entropace.diagnostics.pace_measures import noise_tied_crossovers, pace_spread, success_auc
from entropace.report import load_run
from entropace.report.compare import write_compare
from entropace.report.measures import measure_run, run_half_lives
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


# ------------------------------------------------------------------ issue 28: half-lives, AUC
N_STEPS = 20
T975_2 = 4.302653  # t_{0.975, 2}


def _linear(rate: float) -> list[float]:
    """h(s) = 1 - (s - 1) rate, floored at 0.02: the half-life is exactly 1 + 0.5 / rate."""
    return [max(1.0 - (s - 1) * rate, 0.02) for s in range(1, N_STEPS + 1)]


def _write(path: Path, rows: list[dict]) -> None:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _rows(
    entropy: dict[str, list[float]],
    evals: dict[str, dict[int, float]],
    drop: dict[str, set[int]] | None = None,
) -> list[dict]:
    """One row per step 1..N (a step-0 row first when ``evals`` has step 0, holding only the
    evaluation, as the trainer writes it); ``drop[task]``: steps where the task's entropy is
    absent."""
    rows = []
    if any(0 in ev for ev in evals.values()):
        rows.append({"step": 0, **{f"eval/{t}/success": ev[0] for t, ev in evals.items()}})
    for s in range(1, N_STEPS + 1):
        row: dict = {"step": s}
        for t, h in entropy.items():
            if s not in (drop or {}).get(t, set()):
                row[f"task/{t}/entropy"] = h[s - 1]
            row[f"task/{t}/success"] = 0.0
        row.update({f"eval/{t}/success": ev[s] for t, ev in evals.items() if s in ev})
        rows.append(row)
    return rows


# (arm, seed) -> (rate of fast, rate of slow); half-lives 1 + 0.5 / rate, slow tight seed 2
# censored at step 20 (1 + 0.5 / 0.025 = 21 > 20)
RATES = {
    ("grpo", 1): (0.1, 0.05), ("grpo", 2): (0.1, 0.05), ("grpo", 3): (0.1, 0.04),
    ("tight", 1): (0.08, 0.04), ("tight", 2): (0.08, 0.025), ("tight", 3): (0.08, 0.03125),
}  # fmt: skip
HALF = {  # (fast, slow, censored slow)
    ("grpo", 1): (6.0, 11.0, False), ("grpo", 2): (6.0, 11.0, False),
    ("grpo", 3): (6.0, 13.5, False), ("tight", 1): (7.25, 13.5, False),
    ("tight", 2): (7.25, 20.0, True), ("tight", 3): (7.25, 17.0, False),
}  # fmt: skip
EVAL_NO_STEP0 = {"fast": {10: 1.0, 20: 1.0}, "slow": {10: 0.0, 20: 1.0}}
EVAL_STEP0 = {"fast": {0: 0.0, 10: 1.0, 20: 1.0}, "slow": {0: 0.0, 10: 0.0, 20: 1.0}}


def _half_life_grid(root: Path) -> None:
    for (arm, seed), (r_fast, r_slow) in RATES.items():
        entropy = {"fast": _linear(r_fast), "slow": _linear(r_slow)}
        entropy["slow"][4] = math.nan  # logged as null at step 5
        evals = EVAL_STEP0 if arm == "tight" else EVAL_NO_STEP0
        drop = {"slow": {10, 11}} if (arm, seed) == ("grpo", 2) else None  # absent at 10, 11
        _write(root / arm / f"seed{seed}", _rows(entropy, evals, drop))
    (root / "grid.json").write_text(json.dumps({"algorithms": ["grpo", "tight"]}))


def test_half_lives_pace_gap_and_their_tables(tmp_path: Path) -> None:
    _half_life_grid(tmp_path / "g")
    md = write_compare(tmp_path / "g", baseline="grpo", measures={"warmup": 0})
    js = json.loads((tmp_path / "g" / "compare.json").read_text())["measures"]
    for (arm, seed), (fast, slow, cens) in HALF.items():
        row = next(r for r in js["runs"][arm] if r["seed"] == seed)
        assert row["half_life"] == {"fast": pytest.approx(fast, abs=1e-12),
                                    "slow": pytest.approx(slow, abs=1e-12)}  # fmt: skip
        assert row["half_life_censored"] == {"fast": False, "slow": cens}
        assert row["pace_gap"] == pytest.approx(slow - fast, abs=1e-12)
        assert row["pace_gap_censored"] is cens
    # tight: slow 13.5, 20 (censored), 17 -> mean 50.5 / 3, one censored run
    cell = js["half_life"]["tight"]["half_life/slow"]
    assert cell["mean"] == pytest.approx(50.5 / 3, abs=1e-12)
    assert (cell["n"], cell["censored"]) == (3, 1)
    assert js["half_life"]["grpo"]["pace_gap"]["censored"] == 0
    # paired pace_gap, tight - grpo per seed: 6.25 - 5, 12.75 - 5, 9.75 - 7.5 = 1.25, 7.75, 2.25
    # mean 3.75, sd sqrt((2.5^2 + 4^2 + 1.5^2) / 2) = 3.5
    d = js["paired_difference"]["tight"]["pace_gap"]
    assert d["mean"] == pytest.approx(3.75, abs=1e-12) and d["n"] == 3
    assert d["std"] == pytest.approx(3.5, abs=1e-12)
    assert d["half_width"] == pytest.approx(T975_2 * 3.5 / math.sqrt(3), abs=1e-5)
    d_fast = js["paired_difference"]["tight"]["half_life/fast"]
    assert (d_fast["mean"], d_fast["std"]) == (pytest.approx(1.25, abs=1e-12), 0.0)
    text = md.read_text()
    assert "Entropy half-lives (time to 0.5 of the start" in text
    assert "(1/3 cens.)" in text and "half_life/slow" in text and "pace_gap" in text
    assert (
        "compare_half_life.png"
        in json.loads((tmp_path / "g" / "compare.json").read_text())["figures"]
    )
    assert (tmp_path / "g" / "compare_half_life.png").stat().st_size > 0


def test_auc_with_and_without_a_step_zero_evaluation(tmp_path: Path) -> None:
    _half_life_grid(tmp_path / "g")
    md = write_compare(tmp_path / "g", baseline="grpo", measures={"warmup": 0})
    js = json.loads((tmp_path / "g" / "compare.json").read_text())["measures"]
    # grpo (no step-0 row): fast 1.0 held back to step 0 -> 1.0; slow 0 on [0, 10], ramp to 20
    # (area 5) -> 5 / 20. tight (step-0 row at 0.0): fast ramp 0 -> 1 on [0, 10] (area 5) plus
    # 10 -> 15 / 20; slow as grpo's.
    for arm, fast, slow, from0 in (("grpo", 1.0, 0.25, False), ("tight", 0.75, 0.25, True)):
        for row in js["runs"][arm]:
            want = {"fast": fast, "slow": slow, "average": (fast + slow) / 2}
            assert row["auc"] == pytest.approx(want, abs=1e-15)
            assert row["auc_from_step0"] is from0
            assert row["solve_step"] == {"fast": 10.0, "slow": 20.0}
    assert js["paired_difference"]["tight"]["auc/average"]["mean"] == pytest.approx(-0.125)
    assert "3 of the 6 evaluated runs have a step-0 evaluation" in md.read_text()
    # the step-0 row holds no entropy: half-lives start at step 1 in both arms (above)
    runs = json.loads((tmp_path / "g" / "compare.json").read_text())["runs"]
    assert {r["last_step"] for r in runs} == {N_STEPS}


def test_entropy_mean_window_and_options(tmp_path: Path) -> None:
    _half_life_grid(tmp_path / "g")
    write_compare(tmp_path / "g", baseline="grpo",
                  measures={"warmup": 0, "entropy_from": 1, "entropy_to": 2})  # fmt: skip
    js = json.loads((tmp_path / "g" / "compare.json").read_text())["measures"]
    for (arm, seed), (r_fast, r_slow) in RATES.items():
        row = next(r for r in js["runs"][arm] if r["seed"] == seed)
        # mean of h(1) = 1 and h(2) = 1 - rate
        want = {"fast": 1 - r_fast / 2, "slow": 1 - r_slow / 2}
        assert row["entropy_mean"] == pytest.approx(want, abs=1e-15)
    d = js["paired_difference"]["tight"]["entropy_mean/fast"]
    assert d["mean"] == pytest.approx(0.01, abs=1e-12)  # (0.1 - 0.08) / 2
    assert js["options"]["entropy_from"] == 1 and js["options"]["half_life_hold"] == 1
    for bad, match in (({"nope": 1}, "unknown"), ({"half_life_fraction": 1.0}, "fraction"),
                       ({"half_life_hold": -1}, "hold"),
                       ({"entropy_from": 5, "entropy_to": 1}, "empty")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            write_compare(tmp_path / "g", tmp_path / "bad", measures=bad)


def test_half_life_options_from_the_command_line(tmp_path: Path) -> None:
    _half_life_grid(tmp_path / "g")
    args = ["compare", "--report", str(tmp_path / "g"), "--half-life-fraction", "0.25",
            "--half-life-hold", "0", "--entropy-window", ":2"]  # fmt: skip
    assert main(args) == 0
    js = json.loads((tmp_path / "g" / "compare.json").read_text())["measures"]
    opts = {k: js["options"][k] for k in ("half_life_fraction", "half_life_hold", "entropy_from",
                                          "entropy_to")}  # fmt: skip
    assert opts == {"half_life_fraction": 0.25, "half_life_hold": 0, "entropy_from": None,
                    "entropy_to": 2}  # fmt: skip
    # fraction 0.25 of a linear curve: 1 + 0.75 / rate (grpo seed 1: fast 8.5, slow 16)
    row = next(r for r in js["runs"]["grpo"] if r["seed"] == 1)
    assert row["half_life"] == {"fast": pytest.approx(8.5), "slow": pytest.approx(16.0)}
    for bad in (["--entropy-window", "5:1"], ["--entropy-window", "x"],
                ["--half-life-fraction", "1.5"], ["--half-life-hold", "-1"]):  # fmt: skip
        with pytest.raises(SystemExit) as err:
            main(["compare", "--report", str(tmp_path / "g"), *bad])
        assert err.value.code == 2


def test_measure_run_on_one_run_and_a_curve_at_zero(tmp_path: Path) -> None:
    entropy = {"fast": _linear(0.1), "flat": [0.0] * N_STEPS, "slow": _linear(0.05)}
    _write(tmp_path / "r", _rows(entropy, EVAL_STEP0))
    run = load_run(tmp_path / "r")
    lives = run_half_lives(run)
    assert {t: h.step for t, h in lives.items()} == pytest.approx({"fast": 6.0, "slow": 11.0})
    m = measure_run(run, 7)
    assert m.half_life == pytest.approx({"fast": 6.0, "slow": 11.0}) and "flat" not in m.half_life
    assert m.pace_gap == pytest.approx(5.0) and m.pace_gap_censored is False
    assert m.notes == ["task flat: no entropy half-life (its entropy starts at 0)"]
    assert m.auc_from_step0 is True and m.entropy_mean["flat"] == 0.0
    one = measure_run(load_run(_one_task(tmp_path)), 1)
    assert one.half_life == {"fast": pytest.approx(6.0)} and one.pace_gap is None


def _one_task(tmp_path: Path) -> Path:
    _write(tmp_path / "one", _rows({"fast": _linear(0.1)}, {}))
    return tmp_path / "one"
