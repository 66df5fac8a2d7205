"""``write_report``: figures plus ``summary.md`` / ``summary.html`` / ``summary.json`` for runs.

The pace diagnostics (ALGORITHMS.md section 5) of each run are computed on its per-task entropy
curves ``task/<k>/entropy``:

- crossovers: :func:`entropace.diagnostics.crossover_count` on the steps where every task of the
  run has a finite entropy (pairs need a common time axis), EMA-smoothed with ``crossover_ema``;
- trend R^2: :func:`entropace.diagnostics.trend_r2` over the tasks with >= 2 finite values, each
  on its own observed series (``s = 1..n`` counts that task's observations);
- spike amplitude: :func:`entropace.diagnostics.spike_amplitude` over the tasks whose first finite
  value is > 0, each relative to that first value.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from entropace._files import write_atomic
from entropace.diagnostics import (
    crossover_events,
    ema_smooth,
    max_rise,
    r2_log_fit,
    spike_amplitude,
    trend_r2,
)
from entropace.report.overview import overview_blocks, run_overview
from entropace.report.plots import draw_figure, figures
from entropace.report.runs import RunData, load_run

__all__ = [
    "DEFAULT_CROSSOVER_EMA",
    "PaceDiagnostics",
    "audit_summary",
    "overview_of",
    "pace_diagnostics",
    "write_report",
]

DEFAULT_CROSSOVER_EMA = 0.9


@dataclass
class PaceDiagnostics:
    """Pace-mismatch numbers of one run (None where there is not enough data)."""

    crossovers: int | None
    trend_r2: float | None
    spike_amplitude: float | None
    crossover_marks: list[tuple[int, float]] = field(default_factory=list)  # (step, y) for plots
    per_task: dict[str, dict[str, float | None]] = field(default_factory=dict)
    common_steps: int = 0


def entropy_curves(run: RunData) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{task: (steps, values)}`` of the finite ``task/<k>/entropy`` values."""
    out = {}
    for task in run.tasks:
        s = run.task_series(task, "entropy")
        if s is not None and len(s.finite()):
            f = s.finite()
            out[task] = (f.steps, f.values)
    return out


def pace_diagnostics(run: RunData, *, crossover_ema: float | None = DEFAULT_CROSSOVER_EMA):
    """:class:`PaceDiagnostics` of ``run`` (rules in the module docstring)."""
    curves = entropy_curves(run)
    diag = PaceDiagnostics(None, None, None)
    if not curves:
        return diag
    common = sorted(set.intersection(*(set(s.tolist()) for s, _ in curves.values())))
    diag.common_steps = len(common)
    if common:
        aligned = {t: v[np.searchsorted(s, common)].tolist() for t, (s, v) in curves.items()}
        events = crossover_events(aligned, ema=crossover_ema)
        diag.crossovers = len(events)
        smooth = {
            t: ema_smooth(v, crossover_ema) if crossover_ema is not None else np.asarray(v)
            for t, v in aligned.items()
        }
        diag.crossover_marks = [
            (common[e.step], float((smooth[e.upper][e.step] + smooth[e.lower][e.step]) / 2))
            for e in events
        ]
    fit = {t: v.tolist() for t, (_, v) in curves.items() if v.size >= 2}
    if fit:
        diag.trend_r2 = trend_r2(fit)
    spiky = {t: v.tolist() for t, (_, v) in curves.items() if v[0] > 0}
    if spiky:
        diag.spike_amplitude = spike_amplitude(spiky)
    for t, (_, v) in curves.items():
        smooth = ema_smooth(v, crossover_ema) if crossover_ema is not None else v
        diag.per_task[t] = {
            "trend_r2": r2_log_fit(v, task=t) if v.size >= 2 else None,
            "spike": max_rise(v, task=t) / v[0] if v[0] > 0 else None,
            "first_entropy": float(v[0]),
            "last_entropy": float(v[-1]),
            "last_entropy_ema": float(smooth[-1]),  # where entropy.png's thick line ends
        }
    return diag


def overview_of(run: RunData, *, crossover_ema: float | None = DEFAULT_CROSSOVER_EMA):
    """The run's :class:`~entropace.report.overview.RunOverview` (the report's "What happened"
    and ``entropace train``'s end screen) on its :func:`pace_diagnostics`."""
    diag = pace_diagnostics(run, crossover_ema=crossover_ema)
    return run_overview(run, diag, ema=crossover_ema)


# ----------------------------------------------------------------------- document rendering
# The summary is a list of blocks rendered twice (markdown and HTML), so it is written once.
Block = tuple[Any, ...]


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:.6g}"
    return str(v)


def _md_table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


_MARKDOWN: dict[str, Callable[..., str]] = {
    "h": lambda level, text: "#" * level + " " + text,
    "p": lambda text: text,
    "ul": lambda items: "\n".join(f"- {item}" for item in items),
    "table": _md_table,
    "img": lambda src, caption: f"![{caption}]({src})\n\n*{caption}*",
}


def _html_table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    e = html.escape
    lines = ["<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"]
    lines += ["<tr>" + "".join(f"<td>{e(_fmt(c))}</td>" for c in r) + "</tr>" for r in rows]
    return "\n".join(lines) + "\n</table>"


_HTML: dict[str, Callable[..., str]] = {
    "h": lambda level, text: f"<h{level}>{html.escape(text)}</h{level}>",
    "p": lambda text: f"<p>{html.escape(text)}</p>",
    "ul": lambda items: "<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in items) + "</ul>",
    "table": _html_table,
    "img": lambda src, caption: (
        f'<figure><img src="{html.escape(src)}" alt="{html.escape(caption)}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    ),
}

_HTML_HEAD = (
    '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{title}</title>\n'
    "<style>body{{font-family:sans-serif;max-width:1400px;margin:auto}}"
    "table{{border-collapse:collapse}}td,th{{border:1px solid #999;padding:2px 8px;"
    "text-align:right}}img{{max-width:100%}}</style></head><body>"
)


def _markdown(blocks: Sequence[Block]) -> str:
    return "\n\n".join(_MARKDOWN[kind](*rest) for kind, *rest in blocks) + "\n"


def _html(blocks: Sequence[Block], title: str) -> str:
    body = [_HTML[kind](*rest) for kind, *rest in blocks]
    head = _HTML_HEAD.format(title=html.escape(title))
    return "\n".join([head, *body, "</body></html>"]) + "\n"


def _unique_names(runs: list[RunData]) -> None:
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.name] = seen.get(run.name, 0) + 1
    for i, run in enumerate(runs):
        if seen[run.name] > 1:
            run.name = f"{run.name}#{i + 1}"


def _last_mean(run: RunData, key: str, n: int = 5) -> float | None:
    s = run.get(key)
    if s is None or not len(s.finite()):
        return None
    return float(np.mean(s.finite().values[-n:]))


#: ``audit/*`` keys averaged over a run's audited steps in the summary (column, key).
AUDIT_COLUMNS = (
    ("sign agreement", "audit/sign_agreement"),
    ("Spearman", "audit/spearman"),
    ("dH (P>0)", "audit/dH_pos"),
    ("dH (P<0)", "audit/dH_neg"),
    ("probe dH+", "audit/probe_dH_pos"),
    ("probe dH-", "audit/probe_dH_neg"),
)


def audit_summary(run: RunData) -> dict[str, float | int | None] | None:
    """The polarity audit of a run (``audit.every``), or None if it has no audited step.

    ``audited``: steps with an audit; each :data:`AUDIT_COLUMNS` key: mean over the audited
    steps where it is finite; ``first_order_rel_error``: median of
    ``audit/first_order_rel_error``; ``error_exponent``: least-squares slope of
    ``log first_order_error`` against ``log logit_step_norm`` over the audited steps (about 2
    where the first-order term dominates; None with fewer than 3 usable steps).
    """
    states = run.get("audit/states")
    if states is None or not len(states):
        return None
    out: dict[str, float | int | None] = {"audited": len(states)}
    for _, key in AUDIT_COLUMNS:
        s = run.get(key)
        f = s.finite() if s is not None else None
        out[key] = float(np.mean(f.values)) if f is not None and len(f) else None
    rel = run.get("audit/first_order_rel_error")
    rel_f = rel.finite() if rel is not None else None
    out["first_order_rel_error"] = float(np.median(rel_f.values)) if rel_f else None
    x, y = run.get("audit/logit_step_norm"), run.get("audit/first_order_error")
    out["error_exponent"] = None
    if x is not None and y is not None:
        _, ix, iy = np.intersect1d(x.steps, y.steps, return_indices=True)
        lx, ly = x.values[ix], y.values[iy]
        keep = np.isfinite(lx) & np.isfinite(ly) & (lx > 0) & (ly > 0)
        lx, ly = np.log(lx[keep]), np.log(ly[keep])
        if lx.size >= 3 and np.ptp(lx) > 0:
            out["error_exponent"] = float(np.polyfit(lx, ly, 1)[0])
    return out


def write_report(
    runs: Sequence[str | Path],
    out_dir: str | Path,
    *,
    crossover_ema: float | None = DEFAULT_CROSSOVER_EMA,
) -> Path:
    """Write figures and ``summary.{md,html,json}`` comparing ``runs`` into ``out_dir``.

    Returns the path of ``summary.md``. Runs are columns of every figure, in the given order.
    Missing keys are tolerated: a figure no run has data for is skipped with a note.

    Raises:
        ValueError: no runs; FileNotFoundError / ValueError from :func:`load_run`.
    """
    if not runs:
        raise ValueError("write_report needs at least one run directory")
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # pragma: no cover - matplotlib is in the [train] extra
        raise ImportError(
            "entropace report needs matplotlib: pip install 'entropace[train]'"
        ) from None
    data = [load_run(r) for r in runs]
    _unique_names(data)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    diags = {run.name: pace_diagnostics(run, crossover_ema=crossover_ema) for run in data}

    ema_txt = f"EMA {crossover_ema}" if crossover_ema is not None else "no smoothing"
    overviews = {
        n: run_overview(r, diags[n], ema=crossover_ema) for n, r in ((r.name, r) for r in data)
    }
    blocks: list[Block] = [("h", 1, "entropace report")]
    for ov in overviews.values():  # what a newcomer reads first (also train's end screen)
        blocks += overview_blocks(ov)
    blocks.append(("h", 2, "Runs"))
    blocks.append(
        (
            "table",
            ["run", "path", "records", "first step", "last step", "tasks"],
            [
                [
                    r.name,
                    str(r.path),
                    r.num_records,
                    int(r.steps[0]) if r.steps.size else None,
                    int(r.steps[-1]) if r.steps.size else None,
                    ", ".join(r.tasks) or "-",
                ]
                for r in data
            ],
        )
    )
    blocks.append(("h", 2, "Pace diagnostics"))
    blocks.append(
        (
            "p",
            f"Over the per-task entropy curves (ALGORITHMS.md section 5). Crossovers: order flips "
            f"of pairs of curves ({ema_txt}) on the steps every task has; trend R^2: mean over "
            "tasks of R^2 of h_k vs log(s); spike amplitude: mean over tasks of the largest rise "
            "above the running minimum, relative to the task's first entropy.",
        )
    )
    blocks.append(
        (
            "table",
            ["run", "crossovers", "trend R^2", "spike amplitude", "common steps"],
            [
                [n, d.crossovers, d.trend_r2, d.spike_amplitude, d.common_steps]
                for n, d in diags.items()
            ],
        )
    )
    task_rows = []
    for run in data:
        for task in run.tasks:
            pt = diags[run.name].per_task.get(task, {})
            task_rows.append(
                [
                    run.name,
                    task,
                    pt.get("trend_r2"),
                    pt.get("spike"),
                    pt.get("last_entropy"),
                    pt.get("last_entropy_ema"),
                    _last_mean(run, f"task/{task}/success"),
                    _last_mean(run, f"task/{task}/eps_low", 1),
                ]
            )
    if task_rows:
        blocks.append(("h", 3, "Per task"))
        blocks.append(
            (
                "p",
                "last entropy: the raw value at the task's last step (where entropy.png's "
                f"thin line ends) and the {ema_txt} value (where its thick line ends); success: "
                "mean of the rollouts' success over the last 5 logged steps; eps_low: last "
                "value.",
            )
        )
        blocks.append(
            (
                "table",
                [
                    "run",
                    "task",
                    "trend R^2",
                    "spike",
                    "last entropy",
                    "last entropy (smoothed)",
                    "success",
                    "eps_low",
                ],  # fmt: skip
                task_rows,
            )
        )

    audits = {run.name: audit_summary(run) for run in data}
    if any(a is not None for a in audits.values()):
        blocks.append(("h", 2, "Polarity audit"))
        blocks.append(
            (
                "p",
                "audit.every (ALGORITHMS.md section 4): means over the audited steps of the "
                "token-level sign agreement and Spearman correlation of the predicted polarity P "
                "and the realised entropy change dH (P != 0 tokens; 0.5 is chance), the mean "
                "realised dH on each branch, the probe's mean dH after one step on each branch; "
                "first-order error: median |dH - dH_lin| / |dH|, and its exponent against the "
                "logit step size (2 where the first-order term dominates).",
            )
        )
        head = ["run", "audited steps", *(c for c, _ in AUDIT_COLUMNS)]
        head += ["first-order rel. error", "error exponent"]
        audit_rows = [
            [n, a["audited"], *(a[k] for _, k in AUDIT_COLUMNS)]
            + [a["first_order_rel_error"], a["error_exponent"]]
            for n, a in audits.items()
            if a is not None
        ]
        blocks.append(("table", head, audit_rows))

    notes: list[str] = [f"{r.name}: {n}" for r in data for n in r.notes]
    marks = {n: d.crossover_marks for n, d in diags.items()}
    blocks.append(("h", 2, "Figures"))
    written: list[str] = []
    for spec in figures(crossover_ema, marks):
        with_data = [r for r in data if spec.needs(r)]
        if not with_data:
            notes.append(f"{spec.filename} skipped: no run has its metrics")
            continue
        for r in data:
            if r not in with_data:
                notes.append(f"{spec.filename}: run {r.name} has none of its metrics")
        draw_figure(spec, data, out / spec.filename)
        written.append(spec.filename)
        blocks.append(("img", spec.filename, spec.caption_for(data)))
    if notes:
        blocks.append(("h", 2, "Notes"))
        blocks.append(("ul", notes))

    summary = write_atomic(out / "summary.md", _markdown(blocks))
    write_atomic(out / "summary.html", _html(blocks, "entropace report"))
    machine = {
        "crossover_ema": crossover_ema,
        "runs": {
            n: {
                "path": str(r.path),
                "crossovers": diags[n].crossovers,
                "trend_r2": diags[n].trend_r2,
                "spike_amplitude": diags[n].spike_amplitude,
                "per_task": diags[n].per_task,
                "audit": audits[n],
                "overview": overviews[n].to_dict(),
            }
            for n, r in ((r.name, r) for r in data)
        },
        "figures": written,
        "notes": notes,
    }
    write_atomic(out / "summary.json", json.dumps(machine, indent=2) + "\n")
    return summary
