"""``entropace compare``: t intervals against hand computations, paired differences, the grid's
resume rules, and a 2 algorithms x 2 seeds x 3 steps grid on the tiny model end to end."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from entropace.cli import main
from entropace.diagnostics.pace_measures import half_life
from entropace.envs.toy import register_letter_envs
from entropace.report import grid as grid_module
from entropace.report import load_run, pace_diagnostics
from entropace.report.compare import write_compare
from entropace.report.stats import mean_ci, paired_difference, t_cdf, t_quantile
from entropace.train import trainer as trainer_module
from entropace.train.metrics_log import read_metrics

# t_{0.975, df} from the standard tables (e.g. NIST/SEMATECH e-Handbook, table 1.4.2.7.)
T975 = {1: 12.706205, 2: 4.302653, 3: 3.182446, 4: 2.776445, 5: 2.570582, 10: 2.228139,
        30: 2.042272, 100: 1.983972}  # fmt: skip


# ----------------------------------------------------------------------------- statistics
def test_t_quantile_matches_tables_and_closed_forms() -> None:
    for df, t in T975.items():
        assert t_quantile(0.975, df) == pytest.approx(t, abs=2e-6), df
    assert t_quantile(0.95, 5) == pytest.approx(2.015048, abs=2e-6)
    assert t_quantile(0.995, 3) == pytest.approx(5.840909, abs=2e-6)
    for p in (0.6, 0.9, 0.975, 0.999):
        # df = 1 is the Cauchy distribution: tan(pi (p - 1/2)); df = 2: (2p-1) / sqrt(2p(1-p))
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)
        assert t_quantile(p, 2) == pytest.approx(
            (2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-10
        )
        assert t_quantile(1 - p, 7) == pytest.approx(-t_quantile(p, 7), rel=1e-12)
        assert t_cdf(t_quantile(p, 7), 7) == pytest.approx(p, abs=1e-12)
    assert t_quantile(0.5, 4) == 0.0 and t_cdf(0.0, 4) == 0.5
    # large df tends to the normal quantile 1.959964
    assert t_quantile(0.975, 1e6) == pytest.approx(1.959964, abs=1e-5)
    with pytest.raises(ValueError, match="p must be"):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile(0.9, 0)


def test_mean_ci_by_hand() -> None:
    ci = mean_ci([1, 2, 3, 4])
    s = math.sqrt((1.5**2 + 0.5**2 + 0.5**2 + 1.5**2) / 3)  # 1.290994
    assert ci.mean == 2.5 and ci.n == 4 and ci.std == pytest.approx(1.290994, abs=1e-6)
    assert ci.half_width == pytest.approx(3.182446 * s / 2, abs=1e-6)
    assert ci.half_width == pytest.approx(2.054260, abs=1e-6)
    assert (ci.low, ci.high) == pytest.approx((2.5 - 2.054260, 2.5 + 2.054260), abs=1e-6)
    assert ci.format() == "2.5 ± 2.1"
    # 90%: t_{0.95,3} = 2.353363
    assert mean_ci([1, 2, 3, 4], 0.9).half_width == pytest.approx(2.353363 * s / 2, abs=1e-6)
    one = mean_ci([0.7, None, math.nan])  # None / NaN dropped: one sample, no interval
    assert (one.mean, one.half_width, one.n) == (0.7, None, 1)
    assert one.format() == "0.7 (n=1)"
    same = mean_ci([0.2, 0.2, 0.2])  # 0.2 * 3 / 3 != 0.2 in floats; the spread is exactly 0
    assert (same.mean, same.half_width, same.std, same.format()) == (0.2, 0.0, 0.0, "0.2 ± 0")
    none = mean_ci([])
    assert (none.mean, none.n, none.format()) == (None, 0, "n/a")


def test_paired_difference_by_hand() -> None:
    a = {0: 0.5, 1: 0.7, 2: 0.9, 5: 0.1}  # seed 5: no partner
    b = {0: 0.4, 1: 0.4, 2: 0.6, 3: 1.0, 4: None}
    d = paired_difference(a, b)  # d = [0.1, 0.3, 0.3]
    mean = 0.7 / 3
    s = math.sqrt(((0.1 - mean) ** 2 + 2 * (0.3 - mean) ** 2) / 2)  # 0.115470
    assert d.n == 3 and d.mean == pytest.approx(mean, abs=1e-12)
    assert d.half_width == pytest.approx(4.302653 * s / math.sqrt(3), abs=1e-6)
    assert d.half_width == pytest.approx(0.286843, abs=1e-6)


# ---------------------------------------------------------------- report on known curves
def _write_run(path: Path, success: dict[str, list[float]], entropy: dict[str, list[float]],
               polarity: float | None = None) -> None:  # fmt: skip
    path.mkdir(parents=True)
    n = len(next(iter(success.values())))
    rows = []
    for i in range(n):
        rec: dict[str, float | int] = {"step": i + 1}
        for t in success:
            rec[f"task/{t}/success"] = success[t][i]
            rec[f"task/{t}/entropy"] = entropy[t][i]
            rec[f"task/{t}/eps_low"] = 0.2 + 0.01 * i
        if polarity is not None:
            rec["polarity/pos_mass"] = polarity
            rec["polarity/w_plus"] = 1.0 + 0.1 * i
        rows.append(json.dumps(rec))
    (path / "metrics.jsonl").write_text("\n".join(rows) + "\n")


def test_report_numbers_by_hand(tmp_path: Path) -> None:
    root = tmp_path / "grid"
    s = np.arange(1, 9)
    ent = {"a": list(1.0 - 0.1 * np.log(s)), "b": list(0.5 + 0.05 * np.sin(s))}
    # grpo: success of a is 0 for 3 steps then x; the last 5 steps average to x
    for seed, (xa, xb) in enumerate([(0.2, 0.6), (0.4, 0.8)]):
        _write_run(root / "grpo" / f"seed{seed}", {"a": [0, 0, 0] + [xa] * 5, "b": [xb] * 8}, ent)
    for seed, (xa, xb) in enumerate([(0.5, 0.6), (0.9, 1.0)]):
        _write_run(root / "eppo" / f"seed{seed}", {"a": [xa] * 8, "b": [xb] * 8}, ent, 0.25)
    _write_run(root / "papo" / "seed0", {"a": [1.0] * 8, "b": [0.0] * 8}, ent)
    (root / "logs").mkdir()  # ignored

    md = write_compare(root, baseline="grpo")
    out = json.loads((root / "compare.json").read_text())
    assert out["algorithms"] == ["eppo", "grpo", "papo"] and out["tasks"] == ["a", "b"]
    t1 = T975[1]
    g = out["success"]["grpo"]
    assert g["a"]["mean"] == pytest.approx(0.3)
    # n=2: half-width = t_{.975,1} * |x1 - x2| / sqrt(2) / sqrt(2) = t * |x1 - x2| / 2
    assert g["a"]["half_width"] == pytest.approx(t1 * 0.2 / 2, abs=1e-5)
    assert g["average"]["mean"] == pytest.approx(0.5)  # per seed (0.4, 0.6)
    assert g["average"]["half_width"] == pytest.approx(t1 * 0.2 / 2, abs=1e-5)
    assert out["success"]["papo"]["average"] == {
        "mean": 0.5, "half_width": None, "low": None, "high": None, "n": 1, "std": None,
        "level": 0.95,
    }  # fmt: skip
    # paired: eppo - grpo on the average: seed 0: 0.55 - 0.4, seed 1: 0.95 - 0.6
    d = out["paired_difference"]["success"]["eppo"]["average"]
    assert d["mean"] == pytest.approx((0.15 + 0.35) / 2)
    assert d["half_width"] == pytest.approx(t1 * 0.2 / 2, abs=1e-5)
    assert "grpo" not in out["paired_difference"]["success"]
    # pace numbers: those of entropace report per run (all runs have the same curves here)
    diag = pace_diagnostics(load_run(root / "grpo" / "seed0"))
    p = out["pace"]["eppo"]
    assert p["crossovers"]["mean"] == diag.crossovers and p["crossovers"]["half_width"] == 0.0
    assert p["trend_r2"]["mean"] == pytest.approx(diag.trend_r2)
    assert p["spike_amplitude"]["mean"] == pytest.approx(diag.spike_amplitude)
    assert out["eps_low"]["grpo"]["a"]["mean"] == pytest.approx(0.27)
    assert list(out["polarity"]) == ["eppo"]
    assert out["polarity"]["eppo"]["pos_mass"]["mean"] == pytest.approx(0.25)
    assert out["polarity"]["eppo"]["w_plus"]["mean"] == pytest.approx(1.35)

    text = md.read_text()
    row = next(ln for ln in text.splitlines() if ln.startswith("| grpo |"))
    h = f"{t1 * 0.2 / 2:.2g}"  # 1.3
    assert row == f"| grpo | 0.3 ± {h} | 0.7 ± {h} | 0.5 ± {h} | 2 |"
    assert "| papo | 1 (n=1) | 0 (n=1) | 0.5 (n=1) | 1 |" in text
    assert "one seed only" in text and "Paired difference to grpo" in text
    assert (root / "compare.html").read_text().startswith("<!DOCTYPE html>")
    assert (root / "compare_entropy.png").stat().st_size > 1000
    assert (root / "compare_success.png").stat().st_size > 1000

    write_compare(root, baseline="nope")  # no such baseline: no differences, a note
    out = json.loads((root / "compare.json").read_text())
    assert out["paired_difference"] == {} and "not in the grid" in out["notes"][0]
    assert main(["compare", "--report", str(tmp_path / "empty-nothing")]) == 2


# ------------------------------------------------------------------------ grid resume rules
def _checkpoint(run: Path, step: int) -> None:
    ck = run / "checkpoints" / f"step_{step:08d}"
    ck.mkdir(parents=True)
    (ck / "state.json").write_text("{}")


def test_run_state(tmp_path: Path) -> None:
    assert grid_module.run_state(tmp_path / "none", 3) == "fresh"
    (tmp_path / "stale").mkdir()
    (tmp_path / "stale" / "config.yaml").write_text("seed: 0\n")
    assert grid_module.run_state(tmp_path / "stale", 3) == "stale"
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(f'{{"step": {i}}}\n' for i in (1, 2)))
    _checkpoint(run, 2)
    assert grid_module.run_state(run, 3) == "partial"  # interrupted after step 2
    assert grid_module.run_state(run, 2) == "done"
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    assert grid_module.run_state(run, 2) == "partial"  # checkpoint ahead of the log


def test_train_commands_and_subprocess_pool(tmp_path: Path, monkeypatch) -> None:
    runs = grid_module.plan_grid("quick", ["grpo", "eppo"], [0], ["steps=2"], tmp_path)
    assert [(r.algo, r.seed, r.cfg.algorithm.name, r.cfg.seed) for r in runs] == [
        ("grpo", 0, "grpo", 0), ("eppo", 0, "eppo", 0),
    ]  # fmt: skip
    r = runs[0]
    base = [sys.executable, "-m", "entropace.cli", "train"]
    ov = ["steps=2", "algo=grpo", "seed=0"]
    assert grid_module.train_command(r, "quick", "fresh") == [
        *base, "--preset", "quick", *ov, "--run-dir", str(r.run_dir), "--no-report",
    ]  # fmt: skip
    assert grid_module.train_command(r, "quick", "stale")[-1] == "--overwrite"
    assert grid_module.train_command(r, "quick", "partial") == [
        *base, "--resume", str(r.run_dir), *ov, "--no-report",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="the grid sets seed"):
        grid_module.plan_grid("quick", ["grpo"], [0], ["seed=3"], tmp_path)

    # the pool: one child fails, one succeeds without finishing its run (reported stopped)
    def fake_command(run, preset, state):
        code = 3 if run.algo == "grpo" else 0
        return [sys.executable, "-c", f"print('child {run.algo}'); raise SystemExit({code})"]

    monkeypatch.setattr(grid_module, "train_command", fake_command)
    outcomes = grid_module.run_grid(runs, "quick", tmp_path, jobs=2)
    assert [(o.algo, o.action, o.status) for o in outcomes] == [
        ("grpo", "started", "failed"), ("eppo", "started", "stopped"),
    ]  # fmt: skip
    assert "exit code 3: child grpo; see " in outcomes[0].error  # the log's last line: why
    assert (tmp_path / "logs" / "grpo-seed0.log").read_text() == "child grpo\n"


# --------------------------------------------------------------- the grid on the tiny model
register_letter_envs("cmp_letter", "cmp_letter2")

#: the quick preset's LoRA adapter, warm start and evaluations are for SmolLM2; these tests run
#: its other settings on the tiny model
NO_WARM_START = ["model.lora=false", "warm_start.source=none", "eval.every=0"]
OVERRIDES = [
    "model=tiny", *NO_WARM_START, "tasks=cmp_letter,cmp_letter2", "steps=3", "P=1", "G=3",
    "rollout.max_new_tokens_per_turn=6", "rollout.max_episode_tokens=96",
    "rollout.temperature=1.0", "optim.lr=3e-3", "ppo.epochs=1", "ppo.num_minibatches=1",
    "ppo.micro_batch_size=3", "log.checkpoint_every=1", "log.keep_last=2",
    "log.progress=false", "log.tensorboard=false", "log.report=false",
]  # fmt: skip
ALGOS = "grpo,eppo+papo"


def _compare(out: Path, *extra: str) -> int:
    return main(["compare", "--preset", "quick", "--algos", ALGOS, "--seeds", "2",
                 *OVERRIDES, *extra, "--out", str(out)])  # fmt: skip


def _untimed(run: Path) -> list[dict]:
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "tokens_per_s", "memory/"))}
        for r in read_metrics(run)
    ]


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path_factory.mktemp("cmp") / "grid"
        assert _compare(out) == 0
    finally:
        torch.set_num_threads(previous)
    return out


def _same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        ra.keys() == rb.keys()
        and all(ra[k] == rb[k] or (math.isnan(ra[k]) and math.isnan(rb[k])) for k in ra)
        for ra, rb in zip(a, b)
    )


def test_grid_end_to_end(grid: Path) -> None:
    out = json.loads((grid / "compare.json").read_text())
    assert out["algorithms"] == ["grpo", "eppo+papo"]
    assert out["tasks"] == ["cmp_letter", "cmp_letter2"]
    assert json.loads((grid / "grid.json").read_text())["seeds"] == [0, 1]
    for algo in ("grpo", "eppo+papo"):
        for seed in (0, 1):
            rows = read_metrics(grid / algo / f"seed{seed}")
            assert [r["step"] for r in rows] == [1, 2, 3]
    # the table equals a recomputation from metrics.jsonl (3 steps < k=5: all 3 averaged)
    for algo in ("grpo", "eppo+papo"):
        per_seed = []
        for seed in (0, 1):
            rows = read_metrics(grid / algo / f"seed{seed}")
            per_task = [np.mean([r[f"task/{t}/success"] for r in rows]) for t in out["tasks"]]
            per_seed.append(float(np.mean(per_task)))
        avg = out["success"][algo]["average"]
        assert avg["mean"] == pytest.approx(np.mean(per_seed), abs=1e-12)
        assert avg["half_width"] == pytest.approx(
            T975[1] * abs(per_seed[0] - per_seed[1]) / 2, abs=1e-5
        )
    base = [r for r in out["runs"] if r["algo"] == "grpo"]
    mine = [r for r in out["runs"] if r["algo"] == "eppo+papo"]
    diffs = [m["avg_success"] - b["avg_success"] for m, b in zip(mine, base)]
    d = out["paired_difference"]["success"]["eppo+papo"]["average"]
    assert d["mean"] == pytest.approx(np.mean(diffs), abs=1e-12)
    assert set(out["eps_low"]) == {"grpo", "eppo+papo"} and list(out["polarity"]) == ["eppo+papo"]
    assert out["figures"] == ["compare_entropy.png", "compare_success.png", "compare_half_life.png"]
    assert "fewer than 5 steps in 4 runs" in "\n".join(out["notes"])
    # the half-lives of the trainer's own entropy curves (issue 28), as the diagnostics give them
    for algo in ("grpo", "eppo+papo"):
        for row in out["measures"]["runs"][algo]:
            rows = read_metrics(grid / algo / f"seed{row['seed']}")
            for t in out["tasks"]:
                ref = half_life([r[f"task/{t}/entropy"] for r in rows], [r["step"] for r in rows])
                assert row["half_life"][t] == ref.step
                assert row["half_life_censored"][t] is ref.censored
            assert row["pace_gap"] == pytest.approx(
                abs(row["half_life"][out["tasks"][0]] - row["half_life"][out["tasks"][1]])
            )


def test_second_invocation_skips_finished_runs(grid: Path, monkeypatch, capsys) -> None:
    metrics = sorted(grid.glob("*/seed*/metrics.jsonl"))
    assert len(metrics) == 4
    before = {p: p.stat().st_mtime_ns for p in metrics}

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(trainer_module, "train", no_training)
    assert _compare(grid) == 0
    assert {p: p.stat().st_mtime_ns for p in metrics} == before
    assert "WARNING" not in capsys.readouterr().err
    # asked again with another learning rate: still skipped, with a warning naming the change
    assert _compare(grid, "optim.lr=0.001") == 0
    err = capsys.readouterr().err
    assert err.count("WARNING: finished under another config: optim.lr: 0.003 -> 0.001") == 4
    assert {p: p.stat().st_mtime_ns for p in metrics} == before


def test_interrupted_run_is_resumed_and_missing_run_started(
    grid: Path, tmp_path: Path, monkeypatch
) -> None:
    import torch

    copy = tmp_path / "grid"
    shutil.copytree(grid, copy)
    # grpo seed 0 "killed" after step 2: its step-3 checkpoint and log line are gone
    shutil.rmtree(copy / "grpo" / "seed0" / "checkpoints" / "step_00000003")
    lines = (copy / "grpo" / "seed0" / "metrics.jsonl").read_text().splitlines()
    (copy / "grpo" / "seed0" / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")
    shutil.rmtree(copy / "eppo+papo" / "seed1")  # never started
    shutil.rmtree(copy / "eppo+papo" / "seed0" / "checkpoints")  # killed before a checkpoint
    calls = []
    real = trainer_module.train

    def spy(cfg, run_dir, **kwargs):
        calls.append((Path(run_dir).relative_to(copy).as_posix(), kwargs))
        return real(cfg, run_dir, **kwargs)

    monkeypatch.setattr(trainer_module, "train", spy)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert _compare(copy) == 0
    finally:
        torch.set_num_threads(previous)
    assert calls == [
        ("grpo/seed0", {"resume": True, "overwrite": False}),
        ("eppo+papo/seed0", {"resume": False, "overwrite": True}),
        ("eppo+papo/seed1", {"resume": False, "overwrite": False}),
    ]
    # the stale run was moved aside (not deleted), and the report ignores it
    aside = [p.name for p in (copy / "eppo+papo").iterdir() if p.name.startswith("seed0.old-")]
    assert len(aside) == 1 and (copy / "eppo+papo" / aside[0] / "metrics.jsonl").is_file()
    # all continue exactly: the same metrics as the uninterrupted grid
    for run in ("grpo/seed0", "eppo+papo/seed0", "eppo+papo/seed1"):
        assert _same(_untimed(copy / run), _untimed(grid / run)), run
    a = json.loads((grid / "compare.json").read_text())["success"]
    b = json.loads((copy / "compare.json").read_text())["success"]
    assert a == b


def test_cli_errors(tmp_path: Path, capsys) -> None:
    assert main(["compare", "--preset", "quick", "--out", str(tmp_path)]) == 2
    assert "needs --algos" in capsys.readouterr().err
    code = main(["compare", "--preset", "quick", "--algos", "grpo,nosuch", "--out", str(tmp_path)])
    assert code == 2 and "nosuch" in capsys.readouterr().err
    assert not (tmp_path / "grpo").exists()  # nothing trained before the grid was checked
    assert main(["compare", "--report", str(tmp_path), "--algos", "grpo"]) == 2


def test_jobs_train_in_subprocesses_like_in_process(tmp_path: Path, capsys, monkeypatch) -> None:
    """``--jobs 2``: two ``python -m entropace.cli train`` children (a built-in environment:
    the children do not see this file's test environments); a run equals the in-process one."""
    import torch

    from entropace.envs import specs
    from entropace.train.config import load_config

    if "reasoning" not in specs():
        pytest.skip("the reasoning environment needs entropace[envs]")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the children's threads, as in this process
    ov = ["model=tiny", *NO_WARM_START, "tasks=reasoning", "steps=2", "P=1", "G=2",
          "rollout.max_new_tokens_per_turn=6", "ppo.micro_batch_size=2",
          "log.tensorboard=false", "log.progress=false"]  # fmt: skip
    out = tmp_path / "grid"
    argv = ["compare", "--preset", "quick", "--algos", "grpo", "--seeds", "2", *ov,
            "--out", str(out), "--jobs", "2"]  # fmt: skip
    assert main(argv) == 0
    for seed in (0, 1):
        assert [r["step"] for r in read_metrics(out / "grpo" / f"seed{seed}")] == [1, 2]
        assert "done:" in (out / "logs" / f"grpo-seed{seed}.log").read_text()
    logs = {p: p.read_text() for p in (out / "logs").iterdir()}
    capsys.readouterr()
    assert main(argv) == 0  # again: both skipped, no child started
    assert capsys.readouterr().err.count("skipped") == 2
    assert {p: p.read_text() for p in (out / "logs").iterdir()} == logs

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = load_config("quick", [*ov, "algo=grpo", "seed=1"])
        trainer_module.train(cfg, tmp_path / "inproc")
    finally:
        torch.set_num_threads(previous)
    assert _same(_untimed(tmp_path / "inproc"), _untimed(out / "grpo" / "seed1"))


# ------------------------------------------------ issue 21: --out, exit status, one process
def test_out_must_be_a_directory_of_its_own(grid: Path, tmp_path: Path, capsys) -> None:
    """Items 6 and 15: a file, a path under a file and a run directory are refused, naming
    the path; nothing is written into them (before: FileExistsError / NotADirectoryError
    tracebacks, and a grid written silently into a run)."""
    blocker = tmp_path / "file"
    blocker.write_text("keep")
    run = tmp_path / "run"
    shutil.copytree(grid / "grpo" / "seed0", run)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    for out, says in (
        (blocker, f"--out {blocker} is a file"),
        (blocker / "sub", f"--out {blocker / 'sub'} is under {blocker}, which is a file"),
        (run, f"--out {run} is a run directory (it holds config.yaml, metrics.jsonl, checkpoints)"),
    ):
        assert _compare(out) == 2
        assert says in capsys.readouterr().err
    assert blocker.read_text() == "keep"
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    assert main(["compare", "--report", str(blocker)]) == 2  # not a traceback either
    assert "entropace compare: error:" in capsys.readouterr().err


def test_a_second_compare_on_one_out_fails_naming_the_first(grid: Path, capsys) -> None:
    """Item 7: the grid directory is locked by the compare process for the whole grid."""
    import os

    from entropace.train.rundir import lock_run_dir

    with lock_run_dir(grid, what="grid directory"):
        assert _compare(grid) == 2
    err = capsys.readouterr().err
    assert f"the grid directory is in use by pid {os.getpid()} on " in err
    assert _compare(grid) == 0  # free again: every run is done, skipped


def test_a_stopped_grid_exits_non_zero(tmp_path: Path, monkeypatch, capsys) -> None:
    """Item 15: Ctrl-C during an in-process grid (the trainer checkpoints the step and
    stops; the other runs are not started) exits 130, not 0, and says how to continue."""
    import os
    import signal

    import torch

    real = trainer_module.update_step

    def ctrl_c_once(*args, **kwargs):
        monkeypatch.setattr(trainer_module, "update_step", real)
        os.kill(os.getpid(), signal.SIGINT)  # what the terminal sends; handled by the trainer
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "update_step", ctrl_c_once)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert _compare(tmp_path / "grid") == 130
    finally:
        torch.set_num_threads(previous)
    err = capsys.readouterr().err
    assert "grpo seed 0: started, stopped" in err and "4 runs stopped or not started" in err
    assert [r["step"] for r in read_metrics(tmp_path / "grid" / "grpo" / "seed0")] == [1]
