"""The report's "What happened" overview and ``entropace train``'s end screen: numbers derived by
hand from a metrics.jsonl with known values, the same on the screen and in the report; and the
figures' fixes (gaps for undefined values, overlapping tasks, y labels, EPPO's eps floor, the
entropy table's values where the figure's lines end, per-task reward)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from entropace.cli.train import end_screen
from entropace.diagnostics import crossover_count, ema_smooth, spike_amplitude, trend_r2
from entropace.report import load_run, write_report
from entropace.report.overview import AVG_STEPS, RunOverview
from entropace.report.plots import figures, render_figure
from entropace.report.summary import overview_of

N = 8
DB_H = [1.5 - 0.1 * i for i in range(N)]
KG_H = [1.0 + 0.02 * i * (-1) ** i for i in range(N)]
DB_EPS = [0.2, 0.18, 0.17, 0.16, 0.16, 0.15, 0.15, 0.16]
KG_EPS = [0.2, 0.24, 0.27, 0.29, 0.3, 0.3, 0.28, 0.27]
DB_SIGNAL = [0.0, 0.5, 0.0, 1.0, 0.5, 0.0, 0.5, 1.0]
POS = [None, 0.3, None, 0.5, 0.4, None, 0.6, 0.2]  # None: no |A| that step (null)

CONFIG = """\
algorithm:
  name: eppo+papo
  clip_rule: pacer
  pacer: {eps_min: 0.15, eps_max: 0.3, task_wise: true}
eval: {n: 16, split: test, every: 8}
"""


def rows(*, step0: bool = True) -> list[dict]:
    out: list[dict] = []
    if step0:  # the held-out evaluation before the first update
        out.append({"step": 0, "eval/db/success": 0.25, "eval/kg/success": 0.0,
                    "eval/success": 0.125})  # fmt: skip
    for i in range(N):
        step = i + 1
        rec: dict = {"step": step, "reward": 0.1 * i}
        rec |= {
            "task/db/reward": 0.1 * i, "task/kg/reward": -0.2,
            "task/db/success": 0.0, "task/kg/success": 0.0,  # db hidden under kg before
            "task/db/entropy": DB_H[i], "task/kg/entropy": KG_H[i],
            "task/db/eps_low": DB_EPS[i], "task/db/eps_high": DB_EPS[i],
            "task/kg/eps_low": KG_EPS[i], "task/kg/eps_high": KG_EPS[i],
            "task/db/signal_frac": DB_SIGNAL[i], "task/kg/signal_frac": 0.0,
            "task/db/num_episodes": 8, "task/kg/num_episodes": 8,
            "polarity/pos_mass": POS[i],
            "polarity/neg_mass": None if POS[i] is None else 1 - POS[i],
            "polarity/w_plus": 1.0 + 0.01 * i, "polarity/w_minus": 1.0 - 0.01 * i,
        }  # fmt: skip
        if DB_SIGNAL[i] > 0:  # clip fractions exist only where tokens carried gradient
            rec["task/db/clip_frac_low_active"] = 0.1 * i
            rec["task/db/clip_frac_high_active"] = 0.05
        if step == N:
            rec |= {"eval/db/success": 0.5, "eval/kg/success": 0.0, "eval/success": 0.25}
        out.append(rec)
    return out


def write(root: Path, records: list[dict], config: str | None = CONFIG) -> Path:
    root.mkdir(parents=True)
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if config is not None:
        (root / "config.yaml").write_text(config)
    return root


def test_overview_numbers_by_hand(tmp_path: Path) -> None:
    ov = overview_of(load_run(write(tmp_path / "run", rows())))
    assert (ov.algorithm, ov.first_step, ov.last_step, ov.eval_n) == ("eppo+papo", 1, N, 16)
    db, kg = ov.tasks
    assert (db.task, kg.task) == ("db", "kg")
    assert (db.eval_before, db.eval_after, db.eval_after_step) == (0.25, 0.5, N)
    assert (kg.eval_before, kg.eval_after) == (0.0, 0.0)
    rewards = [0.1 * i for i in range(N)]
    k = min(AVG_STEPS, N // 2)  # 8 steps: the first 4 and the last 4 (they do not overlap)
    assert k == 4
    assert db.reward_first == pytest.approx(np.mean(rewards[:k]))
    assert db.reward_last == pytest.approx(np.mean(rewards[-k:]))
    assert (db.entropy_first, db.entropy_last) == (DB_H[0], DB_H[-1])
    assert db.entropy_last_ema == pytest.approx(ema_smooth(DB_H, 0.9)[-1])
    assert db.retained == pytest.approx(DB_H[-1] / DB_H[0])
    assert (db.eps_low_min, db.eps_low_max) == (0.15, 0.2)
    assert (kg.eps_low_min, kg.eps_low_max) == (0.2, 0.3)
    active = [i for i in range(N) if DB_SIGNAL[i] > 0]
    assert db.clipped == pytest.approx(np.mean([0.1 * i + 0.05 for i in active]))
    assert kg.clipped is None  # no gradient-carrying token: the clip never acted
    assert (db.signal_steps, db.steps, kg.signal_steps, kg.steps) == (5, N, 0, N)
    finite = [p for p in POS if p is not None]
    assert ov.pos_mass == pytest.approx(np.mean(finite))  # undefined steps are not zeros
    assert ov.neg_mass == pytest.approx(np.mean([1 - p for p in finite]))
    assert ov.w_plus == pytest.approx((1.0, 1.0 + 0.01 * (N - 1)))
    curves = {"db": DB_H, "kg": KG_H}
    assert ov.crossovers == crossover_count(curves, ema=0.9)
    assert ov.trend_r2 == pytest.approx(trend_r2(curves))
    assert ov.spike_amplitude == pytest.approx(spike_amplitude(curves))
    # neither task's entropy falls to half its start in 8 steps: censored at the last step
    assert ov.half_life == {"db": 8.0, "kg": 8.0} and all(ov.half_life_censored.values())
    assert ov.pace_gap == 0.0
    # the JSON round trip the end screen reads
    assert RunOverview.from_dict(json.loads(json.dumps(ov.to_dict()))) == ov


def test_overview_states_half_lives_and_the_pace_gap(tmp_path: Path) -> None:
    """Half-lives as `entropace compare` computes them (interpolated, held one step, censored
    at the last step), in the overview and its pace sentence."""
    from entropace.report.overview import overview_lines

    fast, slow = [1.0, 0.8, 0.6, 0.4, 0.3], [2.0, 1.8, 1.5, 1.2, 1.1]
    records = [{"step": i + 1, "task/a/entropy": fast[i], "task/b/entropy": slow[i]}
               for i in range(5)]  # fmt: skip
    ov = overview_of(load_run(write(tmp_path / "run", records, config=None)))
    # a: 0.5 is crossed between step 3 (0.6) and step 4 (0.4): 3 + (0.6 - 0.5) / 0.2 = 3.5
    assert ov.half_life == pytest.approx({"a": 3.5, "b": 5.0})
    assert ov.half_life_censored == {"a": False, "b": True}
    assert ov.pace_gap == pytest.approx(1.5)
    pace = next(line for line in overview_lines(ov) if line.startswith("Pace mismatch"))
    assert "a 3.5, b >= 5.0, slowest - fastest 1.5 steps (a bound" in pace


def test_screen_and_report_show_the_same_numbers(tmp_path: Path) -> None:
    run_dir = write(tmp_path / "run", rows())
    summary = write_report([run_dir], run_dir / "report")
    screen = end_screen(run_dir, summary)
    md = summary.read_text()
    # the table: the same cells on the screen and in summary.md
    md_rows = [
        [c.strip() for c in ln.strip("|").split("|")]
        for ln in md.splitlines()
        if ln.startswith(("| db |", "| kg |"))
    ]
    screen_rows = [ln.split("  ") for ln in screen.splitlines() if ln.startswith(("db ", "kg "))]
    screen_rows = [[c.strip() for c in r if c.strip()] for r in screen_rows]
    assert md_rows == screen_rows
    assert md_rows[0] == ["db", "0.25 -> 0.50", "0.15 -> 0.55", "1.50 -> 0.80", "0.15 - 0.20",
                          "47.0%", "5/8"]  # fmt: skip
    assert md_rows[1] == ["kg", "0.00 -> 0.00", "-0.20 -> -0.20", "1.00 -> 0.86", "0.20 - 0.30",
                          "n/a", "0/8"]  # fmt: skip
    # the learning signal says kg got nothing though its clip range was the widest
    flat = " ".join(screen.split())
    assert "Learning signal: db. kg: no episode had a non-zero advantage in any step" in flat
    assert "though kg got the widest (eps_low up to 0.30)" in flat
    assert "Learning signal: db. kg: no episode" in md
    assert "PAPO: share of sum|A| on entropy-raising tokens (P > 0) 0.40" in flat
    # where the report is, and what to do next
    assert f"Report: {run_dir / 'report' / 'summary.html'}" in screen
    for command in (f"entropace eval {run_dir}", f"entropace report {run_dir}",
                    f"entropace train --resume {run_dir} steps={2 * N}"):  # fmt: skip
        assert command in screen
    machine = json.loads((run_dir / "report" / "summary.json").read_text())
    assert machine["runs"]["run"]["overview"]["tasks"][1]["signal_steps"] == 0
    # without a report the screen is computed from metrics.jsonl: the same table
    bare = end_screen(run_dir, None)
    assert [ln for ln in bare.splitlines() if ln.startswith(("db ", "kg "))] == [
        ln for ln in screen.splitlines() if ln.startswith(("db ", "kg "))
    ]
    assert f"make it with: entropace report {run_dir}" in bare


def test_missing_evaluations_say_not_evaluated(tmp_path: Path) -> None:
    records = [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in rows()]
    ov = overview_of(load_run(write(tmp_path / "noeval", [r for r in records if r["step"]])))
    assert ov.tasks[0].eval_before is None and ov.tasks[0].eval_after is None
    screen = end_screen(tmp_path / "noeval", None)
    assert re.search(r"^db +not evaluated +0\.15 -> 0\.55", screen, re.M)
    # evaluated at the end only: before is "not evaluated", after has its value
    ov = overview_of(load_run(write(tmp_path / "late", rows(step0=False))))
    assert (ov.tasks[0].eval_before, ov.tasks[0].eval_after) == (None, 0.5)
    assert "not evaluated -> 0.50" in end_screen(tmp_path / "late", None)
    # a run from before signal_frac existed says so instead of guessing
    old = [{k: v for k, v in r.items() if "signal_frac" not in k} for r in rows()]
    assert "Learning signal: not logged" in end_screen(write(tmp_path / "old", old), None)


def spec(name: str):
    return next(f for f in figures(0.9, {}) if f.filename == name)


def test_polarity_figure_leaves_gaps_where_masses_are_undefined(tmp_path: Path) -> None:
    run = load_run(write(tmp_path / "run", rows()))
    fig = render_figure(spec("polarity.png"), [run])
    mass = fig.axes[0]
    (pos,) = [ln for ln in mass.get_lines() if ln.get_label() == "polarity/pos_mass"]
    x, y = np.asarray(pos.get_xdata(), float), np.asarray(pos.get_ydata(), float)
    for step, value in zip(range(1, N + 1), POS):
        got = y[x == step]
        if value is None:
            assert got.size == 1 and math.isnan(got[0])  # a gap, not a 0
        else:
            assert got.tolist() == [value]
    assert not (y == 0).any()


def test_identical_task_curves_are_one_labelled_line_and_others_differ(tmp_path: Path) -> None:
    run = load_run(write(tmp_path / "run", rows()))
    fig = render_figure(spec("success.png"), [run])
    held_out, success, reward, signal = fig.axes
    labels = [ln.get_label() for ln in success.get_lines() if not ln.get_label().startswith("_")]
    assert labels == ["db = kg"]  # both at 0 everywhere: one line that names both
    lines = {ln.get_label(): ln for ln in reward.get_lines()}
    assert {"db", "kg"} <= set(lines)
    db, kg = lines["db"], lines["kg"]
    assert (db.get_color(), db.get_linestyle(), db.get_marker()) != (
        kg.get_color(), kg.get_linestyle(), kg.get_marker())  # fmt: skip
    assert db.get_linestyle() != kg.get_linestyle() and db.get_marker() != kg.get_marker()
    np.testing.assert_allclose(np.asarray(db.get_ydata(), float)[1:], [0.1 * i for i in range(N)])
    # held-out success from step 0 on; per-task learning signal
    ho = {ln.get_label(): ln for ln in held_out.get_lines()}
    assert list(ho["db"].get_xdata()) == [0, N] and list(ho["db"].get_ydata()) == [0.25, 0.5]
    sig = {ln.get_label(): ln for ln in signal.get_lines()}
    assert list(np.asarray(sig["db"].get_ydata(), float)[1:]) == DB_SIGNAL


def test_every_panel_has_a_y_label(tmp_path: Path) -> None:
    run = load_run(write(tmp_path / "run", rows()))
    for f in figures(0.9, {}):
        if not f.needs(run):
            continue
        for ax in render_figure(f, [run]).axes:
            assert ax.get_ylabel(), (f.filename, ax.get_title())


def test_pace_figure_draws_eppo_floor_and_ceiling(tmp_path: Path) -> None:
    run = load_run(write(tmp_path / "eppo", rows()))
    eps_ax = render_figure(spec("pace.png"), [run]).axes[0]
    limits = {ln.get_label(): ln.get_ydata()[0] for ln in eps_ax.get_lines()
              if ln.get_label().startswith("EPPO")}  # fmt: skip
    assert limits == {"EPPO floor eps_min = 0.15": 0.15, "EPPO ceiling eps_max = 0.3": 0.3}
    fixed = "algorithm:\n  name: grpo\n  clip_rule: fixed\n"
    run = load_run(write(tmp_path / "grpo", rows(), config=fixed))
    eps_ax = render_figure(spec("pace.png"), [run]).axes[0]
    assert not [ln for ln in eps_ax.get_lines() if ln.get_label().startswith("EPPO")]


def test_entropy_figure_ends_where_the_table_says(tmp_path: Path) -> None:
    run = load_run(write(tmp_path / "run", rows()))
    ov = overview_of(run)
    ax = render_figure(spec("entropy.png"), [run]).axes[0]
    thick = {ln.get_label(): ln for ln in ax.get_lines() if ln.get_linewidth() == 1.8}
    dots = [
        ln for ln in ax.get_lines() if ln.get_linestyle() == "None" and len(ln.get_ydata()) == 2
    ]
    for t in ov.tasks:
        assert thick[t.task].get_ydata()[-1] == pytest.approx(t.entropy_last_ema)
        assert any(list(d.get_ydata()) == [t.entropy_first, t.entropy_last] for d in dots)
    # the legend under the table gives the smoothed ends too
    legend = " ".join(end_screen(tmp_path / "run", None).split())
    assert f"db {ov.tasks[0].entropy_last_ema:.2f}, kg {ov.tasks[1].entropy_last_ema:.2f}" in legend
