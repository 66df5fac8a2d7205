"""``entropace report``: metrics.jsonl parsing, figures, and summary numbers equal to the
diagnostics functions on the same curves."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from entropace.cli import main
from entropace.diagnostics import crossover_count, spike_amplitude, trend_r2
from entropace.report import load_run, pace_diagnostics

N = 40


def curves() -> dict[str, list[float]]:
    s = np.arange(1, N + 1)
    return {
        # Falls fast with a late spike; the slow task crosses it.
        "alfworld": list(1.2 - 0.25 * np.log(s) + 0.3 * (s == 30)),
        "webshop": list(0.9 - 0.05 * np.log(s) + 0.05 * np.sin(s)),
    }


def write_run(root: Path, *, polarity: bool = True, absent: set[int] = frozenset()) -> Path:
    """A run dir whose metrics.jsonl has known curves; ``webshop`` is absent at ``absent``."""
    root.mkdir(parents=True)
    (root / "config.yaml").write_text("algo: eppo\n")
    ent = curves()
    lines = []
    for i in range(N):
        step = i + 1
        rec: dict[str, float | int | None] = {"step": step, "entropy": 1.0 - 0.01 * i}
        rec["reward"] = 0.01 * i
        rec["loss"] = None if step == 3 else 0.5 - 0.001 * i  # NaN written as null
        for task, h in ent.items():
            if task == "webshop" and step in absent:
                continue
            rec[f"task/{task}/entropy"] = h[i]
            rec[f"task/{task}/success"] = min(1.0, 0.02 * i * (2 if task == "alfworld" else 1))
            rec[f"task/{task}/eps_low"] = 0.2 + (0.05 if task == "webshop" else -0.03)
            rec[f"task/{task}/eps_high"] = 0.28
            rec[f"task/{task}/pace_z"] = 1.0 if task == "webshop" else -1.0
        if polarity:
            rec["polarity/pos_mass"] = 0.4
            rec["polarity/neg_mass"] = 0.6
            rec["polarity/w_plus"] = 1.0 + 0.01 * i
            rec["polarity/w_minus"] = 1.0 - 0.01 * i
        lines.append(json.dumps(rec))
    (root / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return root


def md_table(text: str, header_start: str) -> list[list[str]]:
    """Rows of the markdown table whose header starts with ``header_start``."""
    lines = text.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith(header_start))
    rows = []
    for ln in lines[i + 2 :]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.strip("|").split("|")])
    return rows


def test_load_run_series(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "r", absent={5, 6}))
    assert run.tasks == ["alfworld", "webshop"]
    assert run.num_records == N
    loss = run.get("loss")
    assert loss is not None and math.isnan(loss.values[2]) and len(loss.finite()) == N - 1
    web = run.task_series("webshop", "entropy")
    assert web is not None and len(web) == N - 2 and 5 not in web.steps.tolist()
    np.testing.assert_array_equal(
        run.task_series("alfworld", "entropy").values, curves()["alfworld"]
    )
    assert run.get("kl") is None


def test_load_run_tolerances_and_errors(tmp_path: Path) -> None:
    d = tmp_path / "odd"
    d.mkdir()
    (d / "metrics.jsonl").write_text(
        '{"step": 1, "loss": 1.0, "note": "hi"}\n\n{"step": 2, "loss": 2.0}\n'
        '{"step": 2, "loss": 3.0}\n{"step": 3, "lo'
    )
    run = load_run(d)
    assert run.get("loss").values.tolist() == [1.0, 3.0]
    joined = " ".join(run.notes)
    assert "truncated" in joined and "step 2 is logged more than once" in joined
    assert "non-numeric keys skipped: note" in joined
    (d / "metrics.jsonl").write_text('{"step": 1}\n{bad\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not valid JSON"):
        load_run(d)
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        load_run(tmp_path / "nowhere")


def test_cli_single_run_numbers_match_diagnostics(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "eppo_run")
    assert main(["report", str(run_dir)]) == 0
    out = run_dir / "report"
    for name in [
        "summary.md",
        "summary.html",
        "summary.json",
        "entropy.png",
        "pace.png",
        "success.png",
        "polarity.png",
        "training.png",
    ]:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert (out / "entropy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    ent = curves()
    expected = {
        "crossovers": crossover_count(ent, ema=0.9),
        "trend_r2": trend_r2(ent),
        "spike_amplitude": spike_amplitude(ent),
    }
    assert expected["crossovers"] > 0 and expected["spike_amplitude"] > 0  # curves do cross/spike
    summary = json.loads((out / "summary.json").read_text())
    got = summary["runs"]["eppo_run"]
    assert {k: got[k] for k in expected} == expected
    rows = md_table((out / "summary.md").read_text(), "| run | crossovers")
    assert rows[0][0] == "eppo_run"
    assert int(rows[0][1]) == expected["crossovers"]
    assert float(rows[0][2]) == pytest.approx(expected["trend_r2"], rel=1e-5)
    assert float(rows[0][3]) == pytest.approx(expected["spike_amplitude"], rel=1e-5)
    html = (out / "summary.html").read_text()
    assert f"<td>{expected['crossovers']}</td>" in html and 'src="entropy.png"' in html


def test_cli_several_runs_with_missing_keys(tmp_path: Path, monkeypatch) -> None:
    a = write_run(tmp_path / "a" / "run", absent={10, 11, 12})
    b = write_run(tmp_path / "b" / "run", polarity=False)
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(a), str(b), "--crossover-ema", "0"]) == 0
    out = tmp_path / "report"
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["runs"]) == ["run#1", "run#2"]  # equal names disambiguated
    # Run a: crossovers on the common steps only, no smoothing; R^2 / spike on each own series.
    ent = curves()
    keep = [i for i in range(N) if i + 1 not in {10, 11, 12}]
    common = {t: [v[i] for i in keep] for t, v in ent.items()}
    own = {"alfworld": ent["alfworld"], "webshop": common["webshop"]}
    got = summary["runs"]["run#1"]
    assert got["crossovers"] == crossover_count(common)
    assert got["trend_r2"] == trend_r2(own)
    assert got["spike_amplitude"] == spike_amplitude(own)
    assert summary["runs"]["run#2"]["crossovers"] == crossover_count(ent)
    notes = " ".join(summary["notes"])
    assert "polarity.png: run run#2 has none of its metrics" in notes
    md = (out / "summary.md").read_text()
    assert re.search(r"\| run#1 \| alfworld \|", md)


def test_report_skips_figures_without_data(tmp_path: Path) -> None:
    d = tmp_path / "bare"
    d.mkdir()
    (d / "metrics.jsonl").write_text(
        "\n".join(json.dumps({"step": s, "loss": 1.0 / s}) for s in range(1, 6)) + "\n"
    )
    assert main(["report", str(d), "--out", str(tmp_path / "o")]) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["figures"] == ["training.png"]
    assert summary["runs"]["bare"]["crossovers"] is None
    assert "entropy.png skipped: no run has its metrics" in summary["notes"]
    assert "n/a" in (tmp_path / "o" / "summary.md").read_text()


def test_cli_missing_run_is_a_clear_error(tmp_path: Path, capsys) -> None:
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_pace_diagnostics_marks_lie_at_crossover_steps(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "r"))
    diag = pace_diagnostics(run, crossover_ema=None)
    ent = curves()
    for step, y in diag.crossover_marks:
        i = step - 1
        before = np.sign(ent["alfworld"][i - 1] - ent["webshop"][i - 1])
        after = np.sign(ent["alfworld"][i] - ent["webshop"][i])
        assert before == -after != 0
        assert y == pytest.approx((ent["alfworld"][i] + ent["webshop"][i]) / 2)


def write_rows(root: Path, rows: list[dict]) -> Path:
    root.mkdir(parents=True)
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def visible(line) -> bool:
    """A Line2D shows something: two or more points joined by a line, or markers."""
    joined = len(line.get_xdata()) >= 2 and line.get_linestyle() not in ("None", "", " ")
    return joined or line.get_marker() not in (None, "None", "", " ")


def test_one_and_two_step_runs_draw_visible_points(tmp_path: Path) -> None:
    """A 1-step run (and a key finite at one step of two) is one point per series: drawn as a
    line alone it is invisible, so every panel with data must draw it with a marker."""
    from entropace.report.plots import figures, render_figure

    def row(step: int) -> dict:
        rec = {"step": step, "entropy": 1.0, "reward": 0.5, "loss": None if step == 1 else 0.3}
        for task in ("db", "kg"):
            rec |= {f"task/{task}/{k}": v for k, v in
                    {"entropy": 1.0 + step, "success": 0.5, "eps_low": 0.2, "eps_high": 0.28,
                     "pace_z": 0.1 * step}.items()}  # fmt: skip
        return rec | {"polarity/pos_mass": 0.4, "polarity/neg_mass": 0.6}

    for n in (1, 2):
        run = load_run(write_rows(tmp_path / f"r{n}", [row(s) for s in range(1, n + 1)]))
        for spec in figures(None, {}):
            if not spec.needs(run):
                continue
            fig = render_figure(spec, [run])
            for ax in fig.axes:
                lines = [ln for ln in ax.get_lines() if len(ln.get_xdata())]
                assert lines, (n, spec.filename, ax.get_title())
                for ln in lines:
                    assert visible(ln), (n, spec.filename, ax.get_title(), ln.get_label())


def test_pace_figure_of_a_fixed_clip_run(tmp_path: Path) -> None:
    """Three tasks with the same constant bounds: one pair of lines labelled with the value,
    no z-score panel, and a caption that promises none."""
    from entropace.report.plots import figures, render_figure

    def rows(lo: float, hi: float, z: bool) -> list[dict]:
        return [
            {"step": s, **{f"task/{t}/{k}": v for t in ("db", "kg", "os")
                           for k, v in {"eps_low": lo, "eps_high": hi, "entropy": 1.0 / s}.items()},
             **({f"task/{t}/pace_z": 0.1 * s for t in ("db", "kg", "os")} if z else {})}
            for s in range(1, 5)
        ]  # fmt: skip

    pace = next(f for f in figures(None, {}) if f.filename == "pace.png")
    fixed = load_run(write_rows(tmp_path / "grpo", rows(0.2, 0.28, z=False)))
    assert [p.title for p in pace.drawn([fixed])] == ["clip eps_k"]
    (ax,) = render_figure(pace, [fixed]).axes
    lines = ax.get_lines()
    assert [(ln.get_label(), ln.get_linestyle()) for ln in lines] == [
        ("all tasks (fixed 0.2 / 0.28)", "-"), ("_child1", "--"),
    ]  # fmt: skip
    assert "z-score" not in pace.caption_for([fixed])
    assert pace.caption_for([fixed]).startswith("Clip control: clip bounds per task")
    symmetric = load_run(write_rows(tmp_path / "sym", rows(0.2, 0.2, z=False)))
    (ax,) = render_figure(pace, [symmetric]).axes
    assert [ln.get_label() for ln in ax.get_lines()] == [
        "all tasks (fixed 0.2): eps_low = eps_high"
    ]
    # EPPO (bounds differ per task, z-scores logged): one pair per task, the z panel, its caption
    eppo = load_run(write_run(tmp_path / "eppo"))
    assert [p.title for p in pace.drawn([eppo])] == ["clip eps_k", "pace z-score z_k"]
    eps_ax = render_figure(pace, [eppo]).axes[0]
    assert [ln.get_label() for ln in eps_ax.get_lines()][::2] == [
        "alfworld (fixed 0.17 / 0.28)", "webshop (fixed 0.25 / 0.28)",
    ]  # fmt: skip
    assert "pace z-score" in pace.caption_for([eppo])
    # the report's caption is the one of the panels drawn
    assert main(["report", str(tmp_path / "grpo")]) == 0
    md = (tmp_path / "grpo" / "report" / "summary.md").read_text()
    caption = next(ln for ln in md.splitlines() if ln.startswith("![Clip control"))
    assert "z-score" not in caption


def test_wilcoxon_signed_rank_is_exact_against_scipy_and_brute_force() -> None:
    """Without ties: equal to SciPy's exact test; with ties: equal to a brute force over all
    2^n sign assignments of the averaged ranks (SciPy uses a normal approximation there)."""
    import itertools
    import random

    from scipy import stats as sps

    from entropace.report.stats import wilcoxon_signed_rank

    rng = random.Random(3)
    for n in (1, 5, 12, 24):
        d = [rng.gauss(-0.5, 1.0) for _ in range(n)]
        a = {s: x for s, x in enumerate(d)}
        b = {s: 0.0 for s in range(n)}
        for alt in ("two-sided", "less", "greater"):
            ref = sps.wilcoxon(d, alternative=alt, method="exact").pvalue
            assert wilcoxon_signed_rank(a, b, alt) == pytest.approx(ref, rel=1e-12)
    tied = [1.0, -1.0, 2.0, 2.0, -3.0, 0.0, 4.0, 4.0, 4.0]  # a zero, tied magnitudes
    nz = [x for x in tied if x != 0]
    ranks = sps.rankdata([abs(x) for x in nz])
    w_obs = sum(r for r, x in zip(ranks, nz) if x > 0)
    ws = [sum(r for r, sgn in zip(ranks, signs) if sgn) for signs in
          itertools.product([0, 1], repeat=len(nz))]  # fmt: skip
    lower = sum(w <= w_obs + 1e-9 for w in ws) / len(ws)
    upper = sum(w >= w_obs - 1e-9 for w in ws) / len(ws)
    a = {s: x for s, x in enumerate(tied)}
    b = {s: 0.0 for s in range(len(tied))}
    assert wilcoxon_signed_rank(a, b, "less") == pytest.approx(lower, abs=1e-15)
    assert wilcoxon_signed_rank(a, b, "greater") == pytest.approx(upper, abs=1e-15)
    assert wilcoxon_signed_rank(a, b) == pytest.approx(min(1.0, 2 * min(lower, upper)))
    assert wilcoxon_signed_rank({0: 1.0}, {0: 1.0}) is None
    assert wilcoxon_signed_rank({0: 1.0, 1: None}, {0: 0.0, 1: 2.0}, "greater") == 0.5
