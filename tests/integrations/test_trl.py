"""EntropaceGRPOTrainer inside real TRL 1.16 runs (CPU, tiny model, no hub).

Every test trains TRL's own ``GRPOTrainer`` loop for 1-4 steps; references are independent:
plain ``trl.GRPOTrainer`` (GRPO equality), float64 full-logit recomputations of entropy / t1 /
t2 fed to standalone controllers (EPPO, PAPO), hand-derived leave-one-out advantages (RLOO).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trl_run  # noqa: E402  (the shared set-up, a sibling file)

pytest.importorskip("trl")

from trl import GRPOTrainer  # noqa: E402

import entropace.algos as algos  # noqa: E402
from entropace.control import EntropyPacer, PolarityController  # noqa: E402
from entropace.integrations.trl import (  # noqa: E402
    EPS_LOW_KEY,
    STATE_FILE,
    SUPPORTED,
    TASK_IDS_KEY,
    UNSUPPORTED,
    EntropaceGRPOTrainer,
    resolve_recipe,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return trl_run.tiny_model_dir(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


class RecordingReward:
    """``trl_run.digit_reward``, recording each call's rewards (one list per generation)."""

    __name__ = "digit_reward"

    def __init__(self) -> None:
        self.calls: list[list[float]] = []

    def __call__(self, completions: list[Any], task: list[str], **kw: Any) -> list[float]:
        out = trl_run.digit_reward(completions, task, **kw)
        self.calls.append(out)
        return out


def record_generations(trainer: Any) -> list[dict[str, Any]]:
    """Wrap the trainer's scoring so each generation batch records the weights it was sampled
    with and the batch handed to the loss."""
    records: list[dict[str, Any]] = []
    original = trainer._generate_and_score_completions

    def wrapped(inputs: list[dict[str, Any]]) -> dict[str, Any]:
        weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        out = original(inputs)
        records.append({"weights": weights, "out": out, "tasks": [x["task"] for x in inputs]})
        return out

    trainer._generate_and_score_completions = wrapped
    return records


def reference_stats(model_dir: str, record: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Float64 full-logit entropy, t1, t2 of the recorded completions (temperature 1)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    model.load_state_dict({k: v.double() for k, v in record["weights"].items()})
    out = record["out"]
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
    attention = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
    width = out["completion_ids"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits[:, -width - 1 : -1]
    logp = torch.log_softmax(logits.double(), dim=-1)
    p = logp.exp()
    entropy = -(p * logp).sum(-1)
    logp_y = logp.gather(-1, out["completion_ids"][..., None]).squeeze(-1)
    t1 = logp_y.exp() * (entropy + logp_y)
    t2 = (p * p * (entropy[..., None] + logp)).sum(-1)
    return {"entropy": entropy, "t1": t1, "t2": t2, "mask": out["completion_mask"].double()}


def task_means(values: torch.Tensor, mask: torch.Tensor, tasks: list[str]) -> dict[str, float]:
    out = {}
    for name in sorted(set(tasks)):
        rows = torch.tensor([t == name for t in tasks])
        out[name] = float((values[rows] * mask[rows]).sum() / mask[rows].sum())
    return out


def group_advantages(rewards: list[float], group: int, scale: bool) -> torch.Tensor:
    """TRL's group advantages in float64: ``(r - mean_g) / (std_g + 1e-4)`` (unbiased std)."""
    r = torch.tensor(rewards, dtype=torch.float64).view(-1, group)
    adv = r - r.mean(dim=1, keepdim=True)
    if scale:
        adv = adv / (r.std(dim=1, keepdim=True) + 1e-4)
    return adv.flatten()


# ---------------------------------------------------------------------------------------------
# Recipes
# ---------------------------------------------------------------------------------------------


def test_recipes_map_to_trl_fields() -> None:
    """Hand-derived GRPOConfig fields of every supported recipe; the rest explain themselves."""
    # the GRPOConfig fields each recipe needs (every other field stays the user's), pacer, papo
    eps = {"epsilon": 0.2, "epsilon_high": 0.2}
    expected = {
        "grpo": ({}, False, False),
        "dr_grpo": ({"loss_type": "dr_grpo", "scale_rewards": "none"}, False, False),
        "dapo": ({"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28}, False, False),
        "rloo": ({}, False, False),
        "gspo": (
            {"importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
            False,
            False,
        ),
        "eppo": (eps, True, False),
        "eppo-global": (eps, True, False),
        "eppo-notrend": (eps, True, False),
        "eppo-success": (eps, True, False),
        "eppo-rewardvar": (eps, True, False),
        "eppo-shuffled": (eps, True, False),
        "papo": ({}, False, True),
        "eppo+papo": (eps, True, True),
    }
    assert set(expected) == set(SUPPORTED)
    for name, (fields, pacer, papo) in expected.items():
        r = resolve_recipe(name, max_completion_length=64)
        assert r.trl_args == fields, name
        assert (r.pacer is not None, r.polarity is not None) == (pacer, papo), name
    assert resolve_recipe("eppo", pacer={"eps0": 0.25}).trl_args == {
        "epsilon": 0.25,
        "epsilon_high": 0.25,
    }
    assert resolve_recipe("rloo").advantage == "rloo"
    # EPPO over GSPO scales GSPO's own sequence bounds (its width), not the pacer's 0.2
    gspo = resolve_recipe("eppo", overrides={"policy_loss": "gspo"})
    assert gspo.trl_args == {"epsilon": 3e-4, "epsilon_high": 4e-4} and not gspo.width.native
    assert resolve_recipe("eppo-notrend").pacer.trend is False
    assert resolve_recipe("eppo-success").pacer.signal == "success"
    assert resolve_recipe("eppo-rewardvar").pacer.signal == "reward_var"
    assert resolve_recipe("eppo-global").pacer.task_wise is False
    assert resolve_recipe("eppo", pacer={"alpha": 0.5}).pacer.alpha == 0.5
    dapo = resolve_recipe("dapo", max_completion_length=64)
    assert dapo.overlong == (64, 16) and dapo.notes  # dynamic sampling: explained
    from entropace.train.algorithms import RECIPES

    assert set(SUPPORTED) | set(UNSUPPORTED) == set(RECIPES)  # every recipe says which
    for name, reason in UNSUPPORTED.items():
        with pytest.raises(ValueError, match="cannot run inside TRL") as err:
            resolve_recipe(name)
        assert reason in str(err.value)
    with pytest.raises(ValueError, match="unknown algorithm"):
        resolve_recipe("ppo2")
    with pytest.raises(ValueError, match="defines trend=False"):
        from entropace.control import PacerConfig

        resolve_recipe("eppo-notrend", pacer=PacerConfig())


def test_eppo_needs_a_task_column(model_dir: str, tmp_path: Path) -> None:
    import datasets

    rows = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}] * 4)
    with pytest.raises(ValueError, match="needs a 'task' column"):
        EntropaceGRPOTrainer(
            model_dir,
            trl_run.digit_reward,
            args=trl_run.grpo_args(str(tmp_path)),
            train_dataset=rows,
            algorithm="eppo",
        )
    with pytest.raises(ValueError, match="cannot run inside TRL.*BAPO searches"):
        EntropaceGRPOTrainer(
            model_dir, trl_run.digit_reward, args=trl_run.grpo_args(str(tmp_path)), algorithm="bapo"
        )


def test_overlong_reward_values() -> None:
    """DAPO's penalty as a reward function: 0 up to L - C, linear to -1 at L, -1 beyond."""
    from entropace.integrations.trl.recipes import overlong_reward

    fn = overlong_reward(64, 16)
    assert fn(completion_ids=[[0] * n for n in (10, 48, 56, 64, 70)]) == [
        0.0,
        0.0,
        -0.5,
        -1.0,
        -1.0,
    ]


# ---------------------------------------------------------------------------------------------
# GRPO: nothing changes
# ---------------------------------------------------------------------------------------------


def _train_recording(trainer: Any) -> dict[str, Any]:
    from transformers import TrainerCallback

    grads: list[dict[str, torch.Tensor]] = []

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            grads.append({n: p.grad.clone() for n, p in kw["model"].named_parameters()})

    trainer.add_callback(Grads())
    trainer.train()
    return {
        "losses": [row["loss"] for row in trainer.state.log_history if "loss" in row],
        "grads": grads,
        "weights": {k: v.clone() for k, v in trainer.model.state_dict().items()},
    }


def test_recipes_keep_the_users_grpo_config() -> None:
    """A recipe sets only the fields it needs, where TRL's default stands (no warning); a
    conflicting user value is refused, naming the field; the rest stays the user's."""
    import warnings

    from trl import GRPOConfig

    from entropace.integrations.trl.recipes import apply_recipe

    def config(**kw: Any) -> Any:
        return GRPOConfig("/tmp/unused", report_to="none", use_cpu=True, bf16=False, **kw)

    for loss_type in ("dapo", "grpo", "bnpo"):  # TRL's default and two others: kept
        for name in ("grpo", "papo", "eppo", "rloo"):
            args = config(loss_type=loss_type)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # not one warning
                assert apply_recipe(args, resolve_recipe(name)) == []
            assert args.loss_type == loss_type, name
    args = config()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        changes = apply_recipe(args, resolve_recipe("dapo"))
    assert changes == [("epsilon_high", None, 0.28)] and args.epsilon_high == 0.28
    assert [str(w.message) for w in caught] == [
        f"algorithm='dapo': {n}" for n in resolve_recipe("dapo").notes
    ]  # only the dynamic-sampling note, nothing about epsilon_high
    with pytest.raises(
        ValueError, match=r"needs GRPOConfig.epsilon_high=0.28.*sets epsilon_high=0.3"
    ):
        apply_recipe(config(epsilon_high=0.3), resolve_recipe("dapo"))
    with pytest.raises(ValueError, match=r"needs GRPOConfig.loss_type='dr_grpo'.*'grpo'"):
        apply_recipe(config(loss_type="grpo"), resolve_recipe("dr_grpo"))
    with pytest.raises(ValueError, match=r"GRPOConfig.epsilon=0.2.*pacer=\{'eps0'"):
        apply_recipe(config(epsilon=0.3), resolve_recipe("eppo"))
    args = config(epsilon=0.3)  # the pacer's eps0 given where the pacer reads it: accepted
    assert apply_recipe(args, resolve_recipe("eppo", pacer={"eps0": 0.3})) == []


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_grpo_equals_plain_trl(model_dir: str, tmp_path: Path, loss_type: str) -> None:
    """algorithm="grpo": losses, gradients and weights after 2 steps equal GRPOTrainer's with
    the same GRPOConfig (its loss_type kept: "dapo", TRL's default, weights completions of
    different lengths differently from "grpo")."""
    runs = []
    for cls, extra in ((GRPOTrainer, {}), (EntropaceGRPOTrainer, {"algorithm": "grpo"})):
        args = trl_run.grpo_args(str(tmp_path / cls.__name__), max_steps=2, loss_type=loss_type)
        trainer = cls(
            model_dir,
            trl_run.digit_reward,
            args=args,
            train_dataset=trl_run.task_dataset(),
            **extra,
        )
        runs.append(_train_recording(trainer))
    plain, ours = runs
    assert len(plain["losses"]) == len(ours["losses"]) == 2
    assert plain["losses"] == ours["losses"]
    assert len(plain["grads"]) == len(ours["grads"]) == 2
    for g_plain, g_ours in zip(plain["grads"], ours["grads"], strict=True):
        assert g_plain.keys() == g_ours.keys()
        assert all(torch.equal(g_plain[k], g_ours[k]) for k in g_plain)
        assert any(float(g.abs().sum()) > 0 for g in g_plain.values())
    assert all(torch.equal(plain["weights"][k], ours["weights"][k]) for k in plain["weights"])


# ---------------------------------------------------------------------------------------------
# EPPO: per-completion bounds in TRL's clamp
# ---------------------------------------------------------------------------------------------


def _spy_clamp_bounds(trainer: Any, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record, for every loss call, the ``[B, 1]`` tensor bounds TRL's clamp received."""
    calls: list[dict[str, Any]] = []
    original_loss = trainer._compute_loss
    original_clamp = torch.clamp

    def compute_loss(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        seen: list[tuple[torch.Tensor, torch.Tensor]] = []

        def clamp(x: Any, *args: Any, **kwargs: Any) -> Any:
            if len(args) == 2 and all(isinstance(a, torch.Tensor) for a in args):
                seen.append((args[0].detach().clone(), args[1].detach().clone()))
            return original_clamp(x, *args, **kwargs)

        monkeypatch.setattr(torch, "clamp", clamp)
        try:
            loss = original_loss(model, inputs)
        finally:
            monkeypatch.setattr(torch, "clamp", original_clamp)
        calls.append({"bounds": seen, "task_ids": inputs[TASK_IDS_KEY].clone()})
        return loss

    trainer._compute_loss = compute_loss
    return calls


def test_eppo_bounds_equal_standalone_pacer(
    model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = trl_run.grpo_args(str(tmp_path), max_steps=3, learning_rate=3e-2)
    trainer = EntropaceGRPOTrainer(
        model_dir,
        trl_run.digit_reward,
        args=args,
        train_dataset=trl_run.task_dataset(),
        algorithm="eppo",
    )
    records = record_generations(trainer)
    calls = _spy_clamp_bounds(trainer, monkeypatch)
    trainer.train()
    assert len(records) == len(calls) == 3
    pacer = EntropyPacer()  # the recipe's defaults, fed float64 reference entropies
    names = trainer.task_names
    for step, (record, call) in enumerate(zip(records, calls, strict=True)):
        ref = reference_stats(model_dir, record)
        h = task_means(ref["entropy"], ref["mask"], record["tasks"])
        pacer.update(h)
        bounds = pacer.bounds()
        (low_arg, high_arg) = call["bounds"][0]  # torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        assert low_arg.shape == (8, 1) == high_arg.shape
        expected_lo = torch.tensor([bounds[names[i]][0] for i in call["task_ids"].tolist()])
        expected_hi = torch.tensor([bounds[names[i]][1] for i in call["task_ids"].tolist()])
        torch.testing.assert_close(1 - low_arg[:, 0], expected_lo.float(), atol=2e-6, rtol=0)
        torch.testing.assert_close(high_arg[:, 0] - 1, expected_hi.float(), atol=2e-6, rtol=0)
        out = record["out"]
        assert out[EPS_LOW_KEY].shape == (8, 1)
        logged = trainer.state.log_history[step]
        for name in names:
            assert logged[f"entropace/task/{name}/eps_low"] == pytest.approx(bounds[name][0])
            assert logged[f"entropace/task/{name}/entropy"] == pytest.approx(h[name], rel=1e-5)
    # the two tasks' entropies differ, and so do their eps_k after the warm-up step
    last = pacer.bounds()
    assert last["arith"][0] != pytest.approx(last["chat"][0], abs=1e-3)
    assert trainer.pacer.state_dict()["tasks"].keys() == {"arith", "chat"}


def test_generation_stats_equal_the_forward_pass(model_dir: str, tmp_path: Path) -> None:
    """The statistics collected while ``generate`` samples equal the no-grad forward pass's
    on the same completions (and the trainer used them: no fallback)."""
    from entropace.integrations.trl import completion_token_stats

    args = trl_run.grpo_args(str(tmp_path), max_steps=1, temperature=0.7)
    trainer = EntropaceGRPOTrainer(
        model_dir,
        trl_run.digit_reward,
        args=args,
        train_dataset=trl_run.task_dataset(),
        algorithm="eppo+papo",
    )
    pairs = []
    original = trainer._token_stats

    def token_stats(output: dict[str, Any], inputs: Any, mask: torch.Tensor) -> Any:
        assert trainer._generation_stats is not None
        entropy, sensitivity = original(output, inputs, mask)
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        ref = completion_token_stats(trainer.model, ids, attention, mask, temperature=0.7)
        pairs.append((entropy, sensitivity, ref, mask))
        return entropy, sensitivity

    trainer._token_stats = token_stats
    trainer.train()
    assert len(pairs) == 1
    entropy, sensitivity, ref, mask = pairs[0]
    assert float(mask.sum()) > 40
    torch.testing.assert_close(entropy, ref.entropy, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sensitivity, ref.sensitivity, atol=1e-5, rtol=1e-5)
    assert float((entropy * mask).sum()) > 0


# ---------------------------------------------------------------------------------------------
# PAPO and RLOO: the advantages TRL's loss receives
# ---------------------------------------------------------------------------------------------


def _loss_inputs(trainer: Any) -> list[dict[str, torch.Tensor]]:
    seen: list[dict[str, torch.Tensor]] = []
    original = trainer._compute_loss

    def compute_loss(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        seen.append({k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return original(model, inputs)

    trainer._compute_loss = compute_loss
    return seen


def _rows_by_tokens(batch: dict[str, torch.Tensor]) -> dict[tuple[int, ...], int]:
    rows = {}
    for i in range(batch["completion_ids"].shape[0]):
        key = tuple(batch["prompt_ids"][i].tolist() + batch["completion_ids"][i].tolist())
        assert key not in rows, "two identical sampled sequences; choose another seed"
        rows[key] = i
    return rows


def test_papo_advantages_equal_float64_reweighting(model_dir: str, tmp_path: Path) -> None:
    args = trl_run.grpo_args(str(tmp_path), max_steps=2, temperature=1.0)
    reward = RecordingReward()
    trainer = EntropaceGRPOTrainer(
        model_dir, reward, args=args, train_dataset=trl_run.task_dataset(), algorithm="papo"
    )
    records = record_generations(trainer)
    seen = _loss_inputs(trainer)
    trainer.train()
    assert len(records) == len(seen) == len(reward.calls) == 2
    ctrl = PolarityController()
    for record, loss_batch, rewards in zip(records, seen, reward.calls, strict=True):
        ref = reference_stats(model_dir, record)
        mask = ref["mask"]
        ctrl.update(float((ref["entropy"] * mask).sum() / mask.sum()))
        adv = group_advantages(rewards, trl_run.GROUP, scale=True)[:, None] * mask
        polarity = algos.entropy_polarity(adv, ref["t2"] - ref["t1"])
        expected = algos.polarity_reweight(
            adv, polarity, mask, w_plus=ctrl.w_plus, w_minus=ctrl.w_minus
        )
        got = record["out"]["advantages"]
        assert got.shape == mask.shape
        torch.testing.assert_close(got.double(), expected, atol=2e-5, rtol=1e-4)
        assert not torch.allclose(expected, adv)  # the reweighting moved something
        # the loss received exactly these rows (shuffled by TRL)
        rows = _rows_by_tokens(record["out"])
        for i, key in enumerate(_rows_by_tokens(loss_batch)):
            assert torch.equal(loss_batch["advantages"][i], got[rows[key]])
    assert trainer.polarity_controller.state_dict()["steps"] == 2
    assert trainer.polarity_controller.u == pytest.approx(ctrl.u, abs=1e-5)


def test_rloo_advantages_are_leave_one_out(model_dir: str, tmp_path: Path) -> None:
    args = trl_run.grpo_args(str(tmp_path), max_steps=1)
    reward = RecordingReward()
    trainer = EntropaceGRPOTrainer(
        model_dir, reward, args=args, train_dataset=trl_run.task_dataset(), algorithm="rloo"
    )
    records = record_generations(trainer)
    trainer.train()
    r = torch.tensor(reward.calls[0], dtype=torch.float64).view(-1, trl_run.GROUP)
    loo = r - (r.sum(dim=1, keepdim=True) - r) / (trl_run.GROUP - 1)
    got = records[0]["out"]["advantages"]
    assert got.shape == (8,)
    torch.testing.assert_close(got.double(), loo.flatten(), atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------


def _entropace_logs(trainer: Any) -> list[dict[str, float]]:
    return [
        {k: v for k, v in row.items() if k.startswith("entropace/")}
        for row in trainer.state.log_history
        if any(k.startswith("entropace/") for k in row)
    ]


def test_resume_equals_uninterrupted(model_dir: str, tmp_path: Path) -> None:
    """2 steps + checkpoint + resume + 2 steps = 4 steps: controller state and logged eps_k."""

    def make(out: str, steps: int, **extra: Any) -> Any:
        args = trl_run.grpo_args(out, max_steps=steps, **extra)
        return EntropaceGRPOTrainer(
            model_dir,
            trl_run.digit_reward,
            args=args,
            train_dataset=trl_run.task_dataset(),
            algorithm="eppo+papo",
        )

    straight = make(str(tmp_path / "straight"), 4)
    straight.train()
    first = make(str(tmp_path / "resumed"), 2, save_strategy="steps", save_steps=2)
    first.train()
    checkpoint = tmp_path / "resumed" / "checkpoint-2"
    saved = json.loads((checkpoint / STATE_FILE).read_text())
    assert saved == json.loads(json.dumps(first.entropace_state_dict()))
    assert saved["rule"]["steps"] == 2 and saved["polarity"]["steps"] == 2
    assert saved["format"] == "entropace.task_step" and saved["tasks"] == ["arith", "chat"]
    second = make(str(tmp_path / "resumed"), 4)
    second.train(resume_from_checkpoint=str(checkpoint))
    assert second.entropace_state_dict() == straight.entropace_state_dict()
    logs_straight = _entropace_logs(straight)
    assert len(logs_straight) == 4
    assert _entropace_logs(first) == logs_straight[:2]
    assert _entropace_logs(second) == logs_straight  # the log history resumes with the state
    assert [row["step"] for row in second.state.log_history if "loss" in row] == [1, 2, 3, 4]
    assert {k for k in logs_straight[0] if k.endswith("eps_low")} == {
        "entropace/task/arith/eps_low",
        "entropace/task/chat/eps_low",
    }
    # the callback's loader is the validated one: a tampered or missing file stops the resume
    from entropace.control import StateError

    state_file = checkpoint / STATE_FILE
    for text, message in (
        ("[]", "expected an object, got list"),
        (json.dumps({**saved, "tasks": ["db", "os"]}), "saved by a run with tasks"),
    ):
        state_file.write_text(text)
        with pytest.raises(StateError, match=message) as err:
            make(str(tmp_path / "resumed"), 4).train(resume_from_checkpoint=str(checkpoint))
        assert str(err.value).startswith(str(state_file))
    state_file.unlink()
    with pytest.raises(StateError, match="missing"):
        make(str(tmp_path / "resumed"), 4).train(resume_from_checkpoint=str(checkpoint))
