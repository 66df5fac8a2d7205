"""entropace.control.TaskStep: the per-task step every engine adapter runs, and its state.

- the step equals the standalone controllers fed hand-computed statistics (bounds, row bounds,
  PAPO weights and reweighting, the metric names);
- evaluation batches move nothing; a growing index adds tasks in first-seen order;
- the one controller-state format round-trips exactly, and the validated loader refuses every
  attack of issues 21 (items 8-9) with an error naming the file, leaving the state untouched.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import entropace.algos as algos
from entropace.control import (
    ClipSettings,
    EntropyPacer,
    PacerConfig,
    PolarityConfig,
    PolarityController,
    StateError,
    TaskStep,
)

TASKS = ["db", "os", "kg"]


def batch(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    ids = torch.tensor([0, 0, 1, 1, 2, 2])
    pace = torch.tensor([0.6, 0.6, 0.95, 0.95, 0.8, 0.8]) ** step
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    mask[:, 0] = 1
    entropy = (0.5 + torch.rand(6, 5, generator=g)) * pace[:, None]
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.0])
    return {"entropy": entropy, "mask": mask, "rewards": rewards, "ids": ids}


def eppo_papo(**kw: Any) -> TaskStep:
    return TaskStep(
        TASKS,
        clip_rule="pacer",
        clip=ClipSettings(pacer=PacerConfig(**kw)),
        polarity=PolarityConfig(),
        recipe="eppo+papo",
    )


def run(step: TaskStep, steps: int) -> None:
    for s in range(steps):
        b = batch(s)
        step.step(step.sums(b["entropy"], b["mask"], b["rewards"], b["rewards"] >= 1, b["ids"]))


def test_step_equals_standalone_controllers() -> None:
    ts = eppo_papo()
    pacer, pol = EntropyPacer(), PolarityController()
    for s in range(3):
        b = batch(s)
        out = ts.step(ts.sums(b["entropy"], b["mask"], b["rewards"], b["rewards"] >= 1, b["ids"]))
        h = {}
        for k, name in enumerate(TASKS):
            rows = b["ids"] == k
            h[name] = float((b["entropy"][rows] * b["mask"][rows]).sum() / b["mask"][rows].sum())
        pacer.update(h)
        w = pol.update(float((b["entropy"] * b["mask"]).sum() / b["mask"].sum()))
        for name, (lo, hi) in pacer.bounds().items():
            assert out.bounds[name] == pytest.approx((lo, hi), rel=1e-5)
        assert out.weights == pytest.approx(w)
        for name in TASKS:
            assert out.metrics[f"task/{name}/eps_low"] == pytest.approx(pacer.bounds()[name][0])
            assert out.metrics[f"task/{name}/entropy"] == pytest.approx(h[name], rel=1e-6)
            assert out.metrics[f"task/{name}/pace_m"] == pytest.approx(pacer.snapshot()[name]["m"])
        assert out.metrics["polarity/u"] == pytest.approx(pol.u)
        low, high = ts.row_bounds(b["ids"])
        assert low.shape == (6, 1) and high.shape == (6, 1)
        expected = [pacer.bounds()[TASKS[int(i)]][0] for i in b["ids"]]
        assert low.flatten().tolist() == pytest.approx(expected)
    assert ts.bounds()["db"][0] < ts.bounds()["os"][0]  # the faster-collapsing task is tighter


def test_reweight_equals_polarity_reweight_and_masses_a_loop() -> None:
    ts = eppo_papo()
    run(ts, 2)
    g = torch.Generator().manual_seed(5)
    adv = torch.randn(6, generator=g)
    sens = torch.randn(6, 5, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    out, masses = ts.reweight(adv, sens, mask)
    adv_tok = adv[:, None] * mask
    pol = adv_tok * sens
    w_plus, w_minus = ts.weights
    expected = algos.polarity_reweight(adv_tok, pol, mask, w_plus=w_plus, w_minus=w_minus)
    torch.testing.assert_close(out, expected)
    total = sum(abs(float(adv_tok[i, t])) for i in range(6) for t in range(5) if mask[i, t])
    pos = sum(
        abs(float(adv_tok[i, t]))
        for i in range(6)
        for t in range(5)
        if mask[i, t] and pol[i, t] > 0
    )
    assert masses["polarity/pos_mass"] == pytest.approx(pos / total)
    assert ts.metrics["polarity/neg_mass"] == masses["polarity/neg_mass"]

    # two "processes" with a SUM reduce give the one-process result on the whole batch
    def local_sums(rows: slice) -> torch.Tensor:
        captured: list[torch.Tensor] = []
        copy.deepcopy(ts).reweight(
            adv[rows], sens[rows], mask[rows], reduce=lambda x: captured.append(x) or x
        )
        return captured[0]

    halves = (slice(0, 3), slice(3, 6))
    parts = []
    for rows, other in ((halves[0], halves[1]), (halves[1], halves[0])):
        theirs = local_sums(other)
        parts.append(
            copy.deepcopy(ts).reweight(
                adv[rows], sens[rows], mask[rows], reduce=lambda x, t=theirs: x + t, world_size=2
            )[0]
        )
    torch.testing.assert_close(torch.cat(parts), out, rtol=1e-5, atol=1e-6)


def test_papo_pressure_per_task_is_a_loop_over_the_reweighted_advantages() -> None:
    """task/<k>/papo_pressure = sum_k |A'| / sum_k |A| over task k's masked tokens (issue 35:
    the batch-wide rescale keeps the total, so pressure moves between tasks); its |A|-weighted
    mean over the tasks is 1; a task without |A| gets none."""
    ts = eppo_papo()
    run(ts, 2)
    g = torch.Generator().manual_seed(7)
    adv = torch.randn(6, generator=g)
    adv[4:] = 0.0  # rows 4-5: the last task has no advantage
    sens = torch.randn(6, 5, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    ids = torch.tensor([0, 0, 1, 1, 2, 2])
    out, masses = ts.reweight(adv, sens, mask, task_ids=ids)
    totals = {}
    for k, name in enumerate(ts.tasks[:2]):
        before = sum(abs(float(adv[i])) * float(mask[i, t]) for i in range(6) for t in range(5)
                     if int(ids[i]) == k)  # fmt: skip
        after = sum(abs(float(out[i, t])) for i in range(6) for t in range(5)
                    if int(ids[i]) == k and mask[i, t])  # fmt: skip
        assert masses[f"task/{name}/papo_pressure"] == pytest.approx(after / before, rel=1e-6)
        totals[name] = (before, after)
    assert f"task/{ts.tasks[2]}/papo_pressure" not in masses
    assert sum(a for _, a in totals.values()) == pytest.approx(sum(b for b, _ in totals.values()))
    assert ts.metrics[f"task/{ts.tasks[0]}/papo_pressure"] != 1.0  # pressure moved


def test_masses_are_undefined_without_any_advantage() -> None:
    """No token with a non-zero advantage: no share of sum|A| exists, so the masses are NaN
    (logged as null, drawn as a gap), not 0 (which reads as "no mass on either branch");
    the advantages stay 0."""
    ts = eppo_papo()
    run(ts, 2)
    g = torch.Generator().manual_seed(5)
    sens = torch.randn(6, 5, generator=g)
    mask = torch.ones(6, 5)
    out, masses = ts.reweight(torch.zeros(6), sens, mask)
    assert torch.equal(out, torch.zeros(6, 5))
    assert math.isnan(masses["polarity/pos_mass"]) and math.isnan(masses["polarity/neg_mass"])
    assert math.isnan(ts.metrics["polarity/pos_mass"])


def test_evaluation_moves_nothing_and_a_growing_index() -> None:
    ts = eppo_papo()
    run(ts, 2)
    before = json.dumps(ts.state_dict())
    b = batch(5)
    out = ts.step(
        ts.sums(b["entropy"], b["mask"], b["rewards"], b["rewards"] >= 1, b["ids"]), train=False
    )
    assert json.dumps(ts.state_dict()) == before
    assert out.bounds == ts.bounds()  # the current bounds, unchanged
    grow = TaskStep(None, clip_rule="fixed", clip=ClipSettings(eps_low=0.1, eps_high=0.3))
    assert grow.task_ids(["x", "y", "x"]).tolist() == [0, 1, 0]
    assert grow.task_ids(["z"]).tolist() == [2] and grow.tasks == ["x", "y", "z"]
    assert grow.row_bounds(torch.tensor([2, 0]))[1].flatten().tolist() == pytest.approx([0.3, 0.3])
    with pytest.raises(ValueError, match="not among the run's tasks"):
        ts.task_ids(["shop"])


def test_no_tokens_keeps_papo_weights() -> None:
    ts = eppo_papo()
    run(ts, 2)
    w = ts.weights
    b = batch(2)
    ts.step(ts.sums(b["entropy"], b["mask"] * 0, b["rewards"], b["rewards"] >= 1, b["ids"]))
    assert ts.weights == w and math.isnan(ts.metrics["entropy"])


def test_state_round_trip_resumes_exactly(tmp_path: Path) -> None:
    a = eppo_papo(warmup_steps=2)
    run(a, 3)
    path = a.save_state_file(tmp_path / "state.json")
    b = eppo_papo(warmup_steps=2)
    b.load_state_file(path)
    assert b.state_dict() == a.state_dict()
    for ts in (a, b):
        bt = batch(3)
        ts.step(ts.sums(bt["entropy"], bt["mask"], bt["rewards"], bt["rewards"] >= 1, bt["ids"]))
    assert a.state_dict() == b.state_dict() and a.metrics == b.metrics


# --------------------------------------------------------------------------------------------
# The validated loader: every attack of issue 21 items 8-9 (TRL's and verl's files are this
# format), an error naming the file, the state untouched
# --------------------------------------------------------------------------------------------


def _saved() -> dict[str, Any]:
    ts = eppo_papo()
    run(ts, 3)
    return json.loads(json.dumps(ts.state_dict()))


def _set(state: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    state = copy.deepcopy(state)
    *parents, last = path.split(".")
    node = state
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return state


_DELETE = object()

TEXT_ATTACKS = {
    "bad JSON": ('{"format": ', "not valid JSON"),
    "empty": ("", "empty"),
    "whitespace": ("  \n", "empty"),
    "list": ("[]", "expected an object, got list"),
    "deep": ("[" * 100_000 + "]" * 100_000, "nested too deeply|not valid JSON"),
}

FIELD_ATTACKS = {
    "missing key": ("rule", _DELETE, r"missing key\(s\) \['rule'\]"),
    "unknown key (verl's old weights)": (
        "weights",
        [500001.0, 1.0],
        r"unknown key\(s\) \['weights'\]",
    ),
    "eps NaN": ("rule.tasks.db.eps", float("nan"), r"rule.tasks\['db'\].eps: non-finite"),
    "eps -5": ("rule.tasks.db.eps", -5.0, r"rule.tasks\['db'\].eps: value -5.0 outside"),
    "eps above eps_max": ("rule.tasks.os.eps", 0.31, r"outside \[0.15, 0.3\]"),
    "u = 500000 (w+ = 250001)": ("polarity.u", 500000.0, r"polarity.u: value 500000.0 outside"),
    "u inf": ("polarity.u", float("inf"), r"polarity.u: non-finite"),
    "rho NaN": ("polarity.rho", float("nan"), r"polarity.rho: non-finite"),
    "steps -5": ("polarity.steps", -5, r"polarity.steps: value -5 outside"),
    "pacer steps 1.5": ("rule.steps", 1.5, r"rule.steps: expected an integer"),
    "tasks 'abc'": ("tasks", "abc", r"tasks: expected a list of task names"),
    "another run's tasks": ("tasks", ["alfworld", "webshop", "kg"], r"saved by a run with tasks"),
    "duplicate tasks": ("tasks", ["db", "db", "kg"], "duplicate"),
    "tracker m inf": ("rule.tasks.kg.tracker.m", float("inf"), r"tracker.m: non-finite"),
    "warmup values one element too many": (
        "polarity.tracker.warmup_values",
        [1.0, 2.0],
        r"warmup_values: expected a list of 1",
    ),
    "ref missing after warmup": ("rule.tasks.db.tracker.ref", None, r"tracker.ref: missing"),
    "pacer config changed": ("rule.config.alpha", 0.9, r"config mismatch on alpha"),
    "other recipe": ("recipe", "eppo", r"saved by algorithm 'eppo'"),
    "other clip rule": ("clip_rule", "fixed", r"saved with 'fixed'"),
    "other format": ("format", "trl", r"format: expected"),
    "version 2": ("version", 2, r"unknown version 2"),
    "rule state not an object": ("rule", [1], r"rule: expected an object"),
    "task state of a task not in tasks": ("rule.tasks.shop", None, r"expected an object"),
    "bool as a number": ("rule.tasks.db.z", True, r"z: expected a number"),
    "no PAPO state": ("polarity", None, r"saved without PAPO"),
}


@pytest.mark.parametrize("name", sorted(TEXT_ATTACKS))
def test_malformed_files_are_refused_naming_the_file(tmp_path: Path, name: str) -> None:
    text, message = TEXT_ATTACKS[name]
    path = tmp_path / "entropace_state.json"
    path.write_text(text)
    ts = eppo_papo()
    run(ts, 1)
    before = ts.state_dict()
    with pytest.raises(StateError, match=message) as err:
        ts.load_state_file(path)
    assert str(err.value).startswith(str(path))
    assert ts.state_dict() == before


@pytest.mark.parametrize("name", sorted(FIELD_ATTACKS))
def test_bad_states_are_refused_naming_the_file_and_field(tmp_path: Path, name: str) -> None:
    field, value, message = FIELD_ATTACKS[name]
    path = tmp_path / "entropace.json"
    path.write_text(json.dumps(_set(_saved(), field, value)))
    ts = eppo_papo()
    run(ts, 1)
    before = ts.state_dict()
    with pytest.raises(StateError, match=message) as err:
        ts.load_state_file(path)
    assert str(err.value).startswith(f"{path}: ")
    assert ts.state_dict() == before  # nothing was loaded
    assert isinstance(err.value, ValueError)


def test_a_growing_index_checks_its_tasks_too(tmp_path: Path) -> None:
    saved = TaskStep(None, clip_rule="pacer", polarity=PolarityConfig())
    b = batch(0)
    saved.task_ids(["x", "y", "x", "y", "z", "z"])
    saved.step(saved.sums(b["entropy"], b["mask"], b["rewards"], b["rewards"] >= 1, b["ids"]))
    state = saved.state_dict()
    fresh = TaskStep(None, clip_rule="pacer", polarity=PolarityConfig())
    fresh.load_state_dict(state)
    assert fresh.tasks == ["x", "y", "z"]
    for bad, message in (("abc", "list of task names"), (["x", "x"], "duplicate")):
        with pytest.raises(StateError, match=message):
            TaskStep(None, clip_rule="pacer", polarity=PolarityConfig()).load_state_dict(
                {**state, "tasks": bad}, source="verl.json"
            )
    with pytest.raises(StateError, match=r"verl.json: rule: state of task\(s\) \['z'\]"):
        TaskStep(None, clip_rule="pacer", polarity=PolarityConfig()).load_state_dict(
            {**state, "tasks": ["x", "y"]}, source="verl.json"
        )


def test_save_refuses_non_finite_values(tmp_path: Path) -> None:
    ts = eppo_papo()
    run(ts, 1)
    ts.polarity.u = float("nan")  # a bug elsewhere must not reach the file
    with pytest.raises(ValueError):
        ts.save_state_file(tmp_path / "s.json")
    assert not (tmp_path / "s.json").exists()


def test_our_trainer_resume_validates_the_controller_state(tmp_path: Path) -> None:
    """Our trainer's checkpoint holds the same format (``state.json["controller"]``); a resume
    from a tampered one is a CheckpointError naming the file and field, before any step."""
    from entropace.envs.toy import register_letter_envs
    from entropace.train.checkpoint import CheckpointError
    from entropace.train.config import load_config
    from entropace.train.trainer import train

    register_letter_envs("letter", "letter2")
    overrides = [
        "model=tiny", "tasks=letter,letter2", "steps=1", "algo=eppo+papo", "P=1", "G=2",
        "rollout.max_new_tokens_per_turn=4", "rollout.max_episode_tokens=64",
        "ppo.epochs=1", "ppo.num_minibatches=1", "log.progress=false", "log.tensorboard=false",
    ]  # fmt: skip
    run_dir = tmp_path / "run"
    train(load_config(None, overrides), run_dir)
    state_file = next((run_dir / "checkpoints").iterdir()) / "state.json"
    saved = json.loads(state_file.read_text())
    controller = saved["controller"]
    assert controller["format"] == "entropace.task_step"
    assert controller["tasks"] == ["letter", "letter2"] and controller["recipe"] == "eppo+papo"
    assert "clip_rule" not in saved and "polarity" not in saved  # one format, one key
    resumed = load_config(None, [*overrides, "steps=2"])
    for field, value, message in (
        ("tasks", ["db", "os"], "saved by a run with tasks"),
        ("polarity.u", 7.0, r"polarity.u: value 7.0 outside"),
    ):
        tampered = {**saved, "controller": _set(controller, field, value)}
        state_file.write_text(json.dumps(tampered))
        with pytest.raises(CheckpointError, match=message) as err:
            train(resumed, run_dir, resume=True)
        assert str(state_file) in str(err.value)
    state_file.write_text(json.dumps(saved))
    assert train(resumed, run_dir, resume=True).last_step == 2


def test_fixed_per_task_bounds_reach_every_row_and_metric() -> None:
    """``algorithm.task_bounds``: the tasks named get their own fixed pair, the others the
    global one; the rows' bounds and the ``task/<k>/eps_*`` metrics say so at every step."""
    from entropace.control import ClipSettings

    clip = ClipSettings(eps_low=0.2, eps_high=0.3, task_bounds={"a": (0.1, 0.1), "c": (0.4, 0.5)})
    step = TaskStep(["a", "b", "c"], clip_rule="fixed", clip=clip)
    ids = step.task_ids(["c", "a", "b", "a"])
    ones = torch.ones(4, 2)
    for _ in range(2):  # fixed: the same at every step
        out = step.step(step.sums(ones, ones, torch.tensor([1.0, 0, 1, 0]), torch.ones(4), ids))
        lo, hi = step.row_bounds(ids)
        assert lo.flatten().tolist() == pytest.approx([0.4, 0.1, 0.2, 0.1])
        assert hi.flatten().tolist() == pytest.approx([0.5, 0.1, 0.3, 0.1])
        assert (out.metrics["task/a/eps_low"], out.metrics["task/c/eps_high"]) == (0.1, 0.5)
        assert out.metrics["task/b/eps_high"] == pytest.approx(0.3)
    assert step.bounds() == {"a": (0.1, 0.1), "b": (0.2, 0.3), "c": (0.4, 0.5)}


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["algo=eppo", "algorithm.task_bounds={letter: [0.1, 0.1]}"], "clip_rule=fixed"),
        (["algorithm.task_bounds={kg: [0.1, 0.1]}"], "task_bounds"),
        (["algorithm.task_bounds={letter: [1.5, 0.1]}"], "eps_low must be < 1"),
        (["algorithm.task_bounds={letter: [0.1]}"], "eps_low, eps_high"),
    ],
)
def test_bad_per_task_bounds_are_refused_at_load(overrides: list[str], match: str) -> None:
    from entropace.envs.toy import register_letter_envs
    from entropace.train.config import ConfigError, load_config

    register_letter_envs("letter")
    with pytest.raises(ConfigError, match=match):
        load_config(None, ["model=tiny", "tasks=letter", *overrides])
