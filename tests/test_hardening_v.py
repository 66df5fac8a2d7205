"""Issue 37 items 4-5 (redteam-5 F11-F19): loss options that cannot train nothing, paced widths
kept finite, a run that trains nothing stops, run-directory strings escaped on the terminal
and in reports, compare's empty entropy window noted, a full disk named at a checkpoint."""

from __future__ import annotations

import errno
import json
import math
import shutil
import subprocess
import uuid
import warnings
from dataclasses import dataclass

import pytest
import torch

from entropace import algos
from entropace._text import printable
from entropace.algos import LossInputs, get_policy_loss, register_policy_loss
from entropace.algos.limits import F32_MAX, POSITIVE_MIN, RATIO_MAX
from entropace.algos.widths import RATIO_WIDTH, paced_widths
from entropace.cli import main
from entropace.control import ClipSettings, PacerConfig, build_clip_rule
from entropace.control.signals import StepSignals
from entropace.train.algorithms import algorithm_config, clip_settings
from entropace.train.checkpoint import (
    CheckpointDiskFullError,
    list_checkpoints,
    save_checkpoint,
)
from entropace.train.config import ConfigError, load_config
from entropace.train.learner import NonFiniteTrainingError
from entropace.train.trainer import train

#: The lab2 preset (a tiny model, seconds per step), quiet.
RUN = ["eval.every=0", "log.progress=false", "log.trackers=[]", "log.report=false"]

# --------------------------------------------------------------------------------------------
# item 4: option ranges (F11, F12, F14) and widths (F13), refused when the config loads
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        # F12: beta above float32's range, every optimiser step non-finite
        ("algo=dro algorithm.loss_options.beta=1e300",
         r"algorithm.loss_options: beta must be a number in \[1.2e-38, 1e\+29\]; got 1e\+300"),
        ("algo=eppo+dro algorithm.loss_options.beta=1e300", r"beta must be a number in \[1.2e-38"),
        ("algo=dro algorithm.loss_options.beta=1e-300", r"beta must be a number in \[1.2e-38"),
        # F11: crashed at step 3
        ("algo=dppo_tv algorithm.loss_options.ratio_cap=1e300",
         r"algorithm.loss_options: ratio_cap must be a number in \[1.2e-38, 4.85e\+08\]; got "
         r"1e\+300 \(the ratio is at most e\^20"),
        # F14: loss 0 and gradient 0 at every step
        ("algo=sapo algorithm.loss_options.tau_pos=1e300",
         r"algorithm.loss_options: tau_pos must be a number in \[2e-31, 7e\+29\]; got 1e\+300"),
        ("algo=sapo algorithm.loss_options.tau_neg=1e-300", r"tau_neg must be a number in \[2e-31"),
        ("algo=eppo+sapo algorithm.loss_options.tau_neg=1e-300", r"tau_neg must be a number in"),
        ("algo=grpo algorithm.advantage_options.eps=1e300",
         r"algorithm.advantage_options: eps must be a number in \(0, 1\]; got 1e\+300"),
        ("algo=grpo_passk algorithm.advantage_options.eps=1e300",
         r"algorithm.advantage_options: eps must be a number in \(0, 1\]"),
        # F13: widths the pacer drove to inf / 0
        ("algo=eppo+gmpo algorithm.eps_low=1e308 algorithm.eps_high=1e308",
         r"algorithm.eps_low \(log-ratio bound\) must be a number in \[1.2e-38, 20\]; got 1e\+308"),
        ("algo=eppo+dppo_kl algorithm.eps_low=5e-324 algorithm.eps_high=5e-324",
         r"algorithm.eps_low \(binary-KL threshold\) must be a number in \[1.2e-38, 3.4e\+38\]"),
        ("algo=eppo algorithm.pacer.eps_high0=1e300",
         r"algorithm.pacer.eps_high0 must be a finite number in \(0, 485165195.4"),
        ("algo=grpo algorithm.eps_high=1e300",
         r"algorithm.eps_high \(ratio bound\) must be a number in \[1.2e-38, 4.9e\+08\]"),
        ("algo=dppo_tv algorithm.eps_high=2", r"eps_high \(total-variation threshold\) must be a"),
        # the other options whose float32 arithmetic overflows
        ("algo=grpo algorithm.loss_options.dual_clip=1e300",
         r"dual_clip must be a number in \(1, 4.85e\+08\]"),
        ("algo=dcpo algorithm.loss_options.r_max=1e300", r"r_max must be a number in \(1, 4.85e"),
        ("algo=kl_cov algorithm.loss_options.kl_coef=1e300", r"kl_coef must be a number in \[0, 1e"),
        ("algo=ce_gppo algorithm.loss_options.beta2=1e300", r"beta2 must be a number in \[0, 4.1e"),
        ("algo=clip_cov algorithm.loss_options.cov_upper=1e300", r"cov_upper must be a number in"),
        ("algorithm.kl_beta=1e300", r"algorithm.kl_beta must be a finite number in \[0, 2e\+30\]"),
        ("algorithm.entropy_coef=1e300", r"algorithm.entropy_coef must be a finite number in \[0"),
        ("algo=dr_grpo algorithm.seq_norm=1e-300", r"algorithm.seq_norm must be a finite number >= 1"),
    ],
)  # fmt: skip
def test_options_outside_float32s_finite_range_fail_when_the_config_loads(overrides, says) -> None:
    with pytest.raises(ConfigError, match=says):  # each loaded before (issue 37, F11-F14)
        load_config("lab2", overrides.split())


@pytest.mark.parametrize(
    ("name", "options", "widths"),
    [
        ("sapo", {"tau_pos": 7e29, "tau_neg": 7e29}, None),
        ("sapo", {"tau_pos": 2e-31, "tau_neg": 2e-31}, None),
        ("dro", {"beta": 1e29}, None),
        ("dro", {"beta": 1.2e-38}, None),
        ("dppo_tv", {"ratio_cap": RATIO_MAX}, (POSITIVE_MIN, 1.0)),
        ("dppo_kl", {"ratio_cap": POSITIVE_MIN}, (F32_MAX, F32_MAX)),
        ("ppo", {"dual_clip": RATIO_MAX}, (0.999, RATIO_MAX)),
        ("dcpo", {"r_max": RATIO_MAX}, (RATIO_MAX, RATIO_MAX)),
        ("kl_cov", {"kl_coef": 1e30}, None),
        ("ce_gppo", {"beta1": 4.1e22, "beta2": 4.1e22}, (0.999, RATIO_MAX)),
        ("gmpo", {}, (20.0, 20.0)),
        ("cispo", {}, (RATIO_MAX, RATIO_MAX)),
    ],
)  # fmt: skip
def test_at_the_limits_every_loss_is_finite_in_float32(name, options, widths) -> None:
    """The stated ranges hold: at their ends, with log-ratios at the clamp (+-20) and
    advantages +-1 over 2**12 tokens each way, loss and gradient are finite in float32."""
    spec = get_policy_loss(name)
    g = torch.Generator().manual_seed(0)
    b, t = 64, 64
    old = -torch.rand(b, t, generator=g) * 5.0
    shift = torch.tensor([-20.0, -1e-3, 0.0, 1e-3, 20.0]).repeat(b * t // 5 + 1)[: b * t]
    lp = (old + shift.view(b, t)).clamp_max(0.0).requires_grad_()
    adv = torch.where(torch.arange(b) % 2 == 0, 1.0, -1.0)
    lo, hi = widths or (None, None)
    inputs = LossInputs(lp, old, adv, torch.ones(b, t), eps_low=lo, eps_high=hi, agg="token-mean",
                        generator=torch.Generator().manual_seed(1))  # fmt: skip
    out = spec(inputs, spec.make_config(options))
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(lp.grad).all()
    assert lp.grad.abs().sum() > 0  # and it still trains


def test_paced_widths_stay_finite_and_positive() -> None:
    """F13: w_0 f**power under a long pace went to inf (1e308 x 2) or exactly 0 (5e-324 x
    0.02**2); now it is clamped into the width's limits, a normal float32 > 0."""
    gmpo, kl = get_policy_loss("gmpo").width, get_policy_loss("dppo_kl").width
    assert paced_widths(gmpo, (0.99, 0.99), (0.5, 0.5), (20.0, 20.0)) == (20.0, 20.0)
    assert paced_widths(gmpo, (0.99, 0.99), (0.5, 0.5), (4.0, 4.0)) == pytest.approx((7.92, 7.92))
    low = paced_widths(kl, (0.01, 0.01), (0.5, 0.5), (POSITIVE_MIN, 1e-30))
    assert low == (POSITIVE_MIN, pytest.approx(4e-34))
    sapo = get_policy_loss("sapo").width  # power -1: a pace 1e-300 / 0.5 would overflow
    assert paced_widths(sapo, (1e-300, 1e-300), (0.5, 0.5), (1.0, 1.0)) == (7e29, 7e29)
    native = RATIO_WIDTH
    assert paced_widths(native, (1e-300, 0.3), (0.2, 0.2), (0.2, 0.2)) == (POSITIVE_MIN, 0.3)
    for w in (*low, *paced_widths(sapo, (1e-300,) * 2, (0.5,) * 2, (1.0,) * 2)):
        assert 0 < torch.tensor(w, dtype=torch.float32).item() < math.inf


def test_the_pacer_keeps_every_step_inside_the_limits() -> None:
    """Each step's widths from the pacer rule (eps_min 1e-300: a pace of 1e-300) are within
    the loss's limits; before, ``eppo+dppo_kl`` logged a width of exactly 0."""
    cfg = algorithm_config("eppo+dppo_kl", {"eps_low": 1e-37, "eps_high": 1e-37, "pacer": {
        "alpha": 0.99, "eps_min": 1e-300, "eps0": 0.5, "eps_max": 0.99, "warmup_steps": 1}})
    rule = build_clip_rule("pacer", clip_settings(cfg))
    seen = []
    for h in (1.0, 0.001, 1e-6, 1e-9, 1e-12):
        sig = StepSignals(task_entropy={"a": h, "b": 1.0}, task_success={"a": 0.5, "b": 0.5},
                          task_reward_var={"a": 0.1, "b": 0.1})  # fmt: skip
        seen += [w for pair in rule.on_step(sig).values() for w in pair]
    lo, hi = get_policy_loss("dppo_kl").width.limits
    assert all(lo <= w <= hi for w in seen) and min(seen) < 1e-37  # paced, and clamped at lo
    assert min(seen) == lo


def test_a_fixed_width_outside_the_limits_is_refused() -> None:
    with pytest.raises(ValueError, match=r"eps_low \(ratio bound\) must be a number in"):
        ClipSettings(eps_low=5e-324, eps_high=0.2)
    with pytest.raises(ValueError, match="must be a number in"):
        ClipSettings(pacer=PacerConfig(), eps_low=0.2, eps_high=1e300)


# --------------------------------------------------------------------------------------------
# item 4: a run whose every optimiser step is non-finite stops (F12's exit 0)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _NaNConfig:
    """No options."""


def _nan_loss(inputs: LossInputs, cfg: _NaNConfig) -> algos.LossOutput:
    """``ppo``'s loss times NaN: every optimiser step non-finite (what F12's beta did)."""
    out = get_policy_loss("ppo")(inputs, get_policy_loss("ppo").make_config())
    out.loss = out.loss * math.nan
    return out


@pytest.fixture
def nan_loss():
    """The NaN loss registered for one test only (a registration left behind would reach
    every test that iterates over the registry)."""
    register_policy_loss("nan_for_tests", config=_NaNConfig, default_bounds=(0.2, 0.2))(_nan_loss)
    try:
        yield "nan_for_tests"
    finally:
        del algos.POLICY_LOSSES["nan_for_tests"]


def test_a_run_that_trains_nothing_stops_with_its_state_saved(tmp_path, capsys, nan_loss) -> None:
    run = tmp_path / "run"
    over = [*RUN, "algorithm.policy_loss=nan_for_tests", "steps=6", "log.checkpoint_every=0",
            "optim.nonfinite_patience=2"]  # fmt: skip
    with pytest.raises(NonFiniteTrainingError, match=r"steps (\d+)-(\d+): every optimiser step "
                       r"had a non-finite loss or gradient and was skipped \(2 steps in a row"):
        train(load_config("lab2", over), run)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # (a step whose rewards are all equal takes zero-gradient steps: finite, not lost)
    lost = [r["step"] for r in rows if r["optimizer_steps"] and r["loss"] is None]
    last = rows[-1]["step"]
    assert last < 6 and lost[-2:] == [last - 1, last]
    assert list_checkpoints(run / "checkpoints")[-1].name == f"step_{last:08d}"
    # the CLI: one error line, exit 2, how to go on
    rc = main(["train", "--resume", str(run), "optim.nonfinite_patience=1", "steps=20"])
    err = capsys.readouterr().err
    assert rc == 2 and "(1 steps in a row" in err and f"--resume {run}" in err, err
    # 0: never stop (the old behaviour, exit 0)
    train(load_config("lab2", [*over[:-1], "steps=2", "optim.nonfinite_patience=0"]),
          tmp_path / "run0")  # fmt: skip


def test_nonfinite_patience_is_range_checked() -> None:
    with pytest.raises(ConfigError, match=r"optim.nonfinite_patience must be an integer in \[0"):
        load_config("lab2", ["optim.nonfinite_patience=-1"])
    assert load_config("lab2", []).optim.nonfinite_patience == 3


# --------------------------------------------------------------------------------------------
# item 5: strings from a run directory escaped (F16-F18)
# --------------------------------------------------------------------------------------------

ATTACK = "\x1b]0;PWNED\x07\x1b[2J\x1b[31mRED\x1b[0m\u202e"


def test_printable_escapes_control_and_bidi_characters() -> None:
    assert printable(ATTACK) == "\\x1b]0;PWNED\\x07\\x1b[2J\\x1b[31mRED\\x1b[0m\\u202e"
    assert printable("a\nb\tc\x7f\x9b") == "a\\x0ab\\x09c\\x7f\\x9b"
    assert printable("a\nb", keep="\n") == "a\nb"
    assert printable("héllo wörld / ok: 1.0") == "héllo wörld / ok: 1.0"


def _no_controls(text: str) -> bool:
    return not any(ord(c) < 0x20 and c not in "\n\r\t" or ord(c) == 0x7F for c in text)


def test_resume_of_a_received_run_prints_its_config_escaped(tmp_path, capsys) -> None:
    """F16: ``train --resume`` echoed model.name raw (window title set, screen cleared)."""
    run = tmp_path / "run"
    train(load_config("lab2", [*RUN, "steps=1"]), run)
    cfg = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(cfg.replace("name: tiny", "name: " + json.dumps(ATTACK), 1))
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "steps=2"]) == 2  # no such model
    err = capsys.readouterr().err
    assert "\\x1b]0;PWNED\\x07" in err and _no_controls(err), err


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    """A run whose metric keys carry escape sequences (F17 / F18)."""
    run = tmp_path_factory.mktemp("planted") / "run"
    train(load_config("lab2", [*RUN, "steps=2"]), run)
    path = run / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    path.write_text("".join(
        json.dumps({k.replace("lab2-mid", "mid" + ATTACK): v for k, v in r.items()}) + "\n"
        for r in rows))  # fmt: skip
    return run


def test_report_of_planted_metric_keys_holds_no_control_characters(planted_run, capfd) -> None:
    """F17: summary.html / summary.md held the raw bytes; F18: matplotlib's glyph warnings
    printed them to the terminal."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["report", str(planted_run)]) == 0
    out = capfd.readouterr()
    shown = out.out + out.err + "".join(str(w.message) for w in caught)
    assert _no_controls(shown) and "Glyph 27" not in shown
    for name in ("summary.html", "summary.md", "summary.json"):
        text = (planted_run / "report" / name).read_text(encoding="utf-8")
        assert _no_controls(text) and "\u202e" not in text, name
    assert "mid\\x1b]0;PWNED\\x07" in (planted_run / "report" / "summary.md").read_text()


# --------------------------------------------------------------------------------------------
# item 5: compare's entropy window outside the runs (F15)
# --------------------------------------------------------------------------------------------


def test_an_entropy_window_outside_the_run_is_noted() -> None:
    from entropace.report.measures import measure_run
    from entropace.report.runs import RunData, Series

    steps = torch.arange(1, 5).numpy()
    s = Series(steps, torch.tensor([1.0, 0.9, 0.8, 0.7], dtype=torch.float64).numpy())
    run = RunData(None, "r", {"task/a/entropy": s, "task/b/entropy": s}, 4)  # type: ignore[arg-type]
    inside = measure_run(run, 1, entropy_from=2, entropy_to=3)
    assert inside.entropy_mean == {"a": pytest.approx(0.85), "b": pytest.approx(0.85)}
    assert not [n for n in inside.notes if "entropy_mean" in n]
    outside = measure_run(run, 1, entropy_from=100, entropy_to=200)
    assert outside.entropy_mean == {}
    assert outside.notes[-2:] == [
        f"task {t}: no entropy_mean: no entropy logged in the logged steps 100-200 (its entropy "
        "is logged at steps 1-4)" for t in ("a", "b")
    ]


# --------------------------------------------------------------------------------------------
# item 5: a full disk during a checkpoint save (F19)
# --------------------------------------------------------------------------------------------


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 64)).sum().backward()
    opt.step()
    return model, opt


def test_a_full_disk_during_a_save_is_one_clear_error(tmp_path, monkeypatch) -> None:
    """The writer raising ENOSPC (as Python's writes do) names the full disk; the earlier
    checkpoint stays complete and the partial one is removed."""
    model, opt = _model_and_optimizer()
    root = tmp_path / "checkpoints"
    save_checkpoint(root, 1, model=model, optimizer=opt, state={"x": 1})
    before = {p.name: p.read_bytes() for p in (root / "step_00000001").iterdir()}

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(CheckpointDiskFullError, match=r"not checkpointing step 2: no space left "
                       r"on the device of .*the earlier checkpoint step_00000001 is kept"):
        save_checkpoint(root, 2, model=model, optimizer=opt, state={"x": 2})
    assert [p.name for p in root.iterdir()] == ["step_00000001"]
    assert {p.name: p.read_bytes() for p in (root / "step_00000001").iterdir()} == before


def test_another_write_error_is_not_called_a_full_disk(tmp_path, monkeypatch) -> None:
    model, opt = _model_and_optimizer()

    def broken(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(OSError, match="Input/output error") as caught:
        save_checkpoint(tmp_path / "c", 1, model=model, optimizer=opt, state={})
    assert not isinstance(caught.value, CheckpointDiskFullError)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 192 KiB tmpfs (root only: skipped where mount is not allowed)."""
    where = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(where)],
                          capture_output=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        done = subprocess.run(["umount", str(where)], capture_output=True, check=False)
        assert done.returncode == 0, done.stderr
        shutil.rmtree(where, ignore_errors=True)


def test_a_real_full_tmpfs_is_named(small_tmpfs) -> None:
    """F19 as reported: torch's writer says only "unexpected pos"; the free space says why."""
    model, opt = _model_and_optimizer()  # 16.6 KB of weights, 3x that with AdamW's moments
    root = small_tmpfs / "checkpoints"
    save_checkpoint(root, 1, model=model, optimizer=opt, state={}, keep_last=5)
    step = 2
    with pytest.raises(CheckpointDiskFullError, match="no space left on the device") as caught:
        for step in range(2, 50):
            save_checkpoint(root, step, model=model, optimizer=opt, state={}, keep_last=50)
    assert f"step {step}" in str(caught.value)
    assert [p.name for p in root.iterdir() if p.name.startswith(".tmp")] == []
    assert len(list_checkpoints(root)) == step - 1
