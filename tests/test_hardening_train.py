"""Issue 9 (trainer side): checkpoints that cannot run code, run directories never mixed,
clear errors for damaged files and careless config values, stale temporaries cleaned."""

from __future__ import annotations

import json
import os
import pickle
import re

import pytest
import torch

from entropace.cli import main
from entropace.envs import EnvSpec, register, specs
from entropace.train.checkpoint import CheckpointError, list_checkpoints, load_checkpoint
from entropace.train.config import ConfigError, load_config
from entropace.train.metrics_log import read_metrics
from entropace.train.rundir import RunDirError
from entropace.train.trainer import build_model, resolve_device, train


class _Echo:
    name = "hecho"
    system_prompt = "Reply with one word."
    max_turns = 1

    def __init__(self, difficulty: str = "easy") -> None:
        pass

    def reset(self, seed: int):
        return "Say a.", {"task": self.name, "seed": seed, "difficulty": "easy", "gold": "a"}

    def step(self, action: str):
        ok = "a" in action
        return "ok", float(ok), True, False, {"success": ok, "parse_error": False}


if "hecho" not in specs():
    register(EnvSpec(name="hecho", factory=_Echo, oracle=lambda env: lambda obs: "a",
                     description="test", options={"difficulty": "ignored"}))  # fmt: skip

RUN = ["model=tiny", "tasks=hecho", "steps=2", "P=1", "G=2", "rollout.max_new_tokens_per_turn=4",
       "rollout.max_episode_tokens=64", "ppo.epochs=1", "ppo.num_minibatches=1",
       "log.checkpoint_every=1", "log.keep_last=2", "log.progress=false",
       "log.tensorboard=false", "log.report=false"]  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("hard")
    run = root / "run"
    train(load_config(None, RUN), run)
    return run


def _copy(run, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(run, out)
    return out


class _Payload:
    """Unpickling this runs ``os.system`` (what a planted checkpoint would do)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("name", ["rng.pt", "optim.pt"])
def test_a_planted_pickle_never_runs_on_resume(run_dir, tmp_path, name, capsys) -> None:
    run = _copy(run_dir, tmp_path)
    marker = tmp_path / "PWNED"
    ckpt = list_checkpoints(run / "checkpoints")[-1]
    with (ckpt / name).open("wb") as f:
        pickle.dump({"payload": _Payload(str(marker))}, f)
    torch.save({"payload": _Payload(str(marker))}, ckpt / name)  # both pickle formats
    assert main(["train", "--resume", str(run), "steps=3", "--no-report"]) == 2
    err = capsys.readouterr().err
    assert not marker.exists()
    assert name in err and "refused" in err


@pytest.mark.parametrize(
    ("name", "damage", "says"),
    [
        ("model.safetensors", b"", "does not hold this model's weights"),
        ("model.safetensors", None, "does not hold this model's weights"),  # truncated
        ("optim.pt", None, "does not load as this run's optimiser state"),
        ("rng.pt", None, "does not load as RNG states"),
        ("state.json", b"{not json", "is not a valid state file"),
    ],
)
def test_damaged_checkpoint_files_are_named(run_dir, tmp_path, name, damage, says) -> None:
    run = _copy(run_dir, tmp_path)
    ckpt = list_checkpoints(run / "checkpoints")[-1]
    path = ckpt / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage is None else damage)
    model, _, _ = build_model(load_config(None, RUN).model)
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(CheckpointError, match=f"{name}: {says}"):
        load_checkpoint(ckpt, model=model, optimizer=opt)


def test_failed_resume_leaves_config_yaml_alone(run_dir, tmp_path, capsys) -> None:
    run = _copy(run_dir, tmp_path)
    before = (run / "config.yaml").read_text()
    ckpt = list_checkpoints(run / "checkpoints")[-1]
    (ckpt / "rng.pt").write_bytes(b"garbage")
    assert main(["train", "--resume", str(run), "steps=5", "--no-report"]) == 2
    assert "rng.pt" in capsys.readouterr().err
    assert (run / "config.yaml").read_text() == before


def test_a_run_directory_holds_one_run(run_dir, tmp_path, capsys) -> None:
    run = _copy(run_dir, tmp_path)
    rows = read_metrics(run)
    # a second run into it is refused, naming --resume and --overwrite; nothing changes
    code = main(["train", "--preset", str(run / "config.yaml"), "algo=grpo", "--run-dir",
                 str(run), "--no-report"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "--overwrite" in err
    assert read_metrics(run) == rows
    # --overwrite moves the old run aside, whole, and starts anew
    code = main(["train", "--preset", str(run / "config.yaml"), "algo=grpo", "steps=1",
                 "--run-dir", str(run), "--overwrite", "--no-report"])  # fmt: skip
    assert code == 0
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("copy.old-")]
    assert len(aside) == 1 and read_metrics(aside[0]) == rows
    assert [p.name for p in list_checkpoints(aside[0] / "checkpoints")] == [
        "step_00000001", "step_00000002",
    ]  # fmt: skip
    assert [r["step"] for r in read_metrics(run)] == [1]
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_00000001"]
    with pytest.raises(RunDirError, match="already holds a run"):
        train(load_config(None, RUN), run)


def test_stale_checkpoint_temporaries_are_removed_on_start(run_dir, tmp_path, caplog) -> None:
    run = _copy(run_dir, tmp_path)
    stale = run / "checkpoints" / ".tmp-step_00000003-12345"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    caplog.set_level("WARNING")
    assert main(["train", "--resume", str(run), "steps=3", "--no-report"]) == 0
    assert not stale.exists() and "interrupted" in caplog.text
    assert [p.name for p in list_checkpoints(run / "checkpoints")][-1] == "step_00000003"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_run_directory_is_a_clear_error(tmp_path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(RunDirError, match="not writable"):
            train(load_config(None, RUN), ro / "run")
    finally:
        ro.chmod(0o700)


def test_unwritable_run_directory_is_a_clear_error(tmp_path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["train", "--preset", "quick", *RUN, "--run-dir", str(blocker / "run")]) == 2
    assert "not writable" in capsys.readouterr().err


def test_malformed_config_yaml_is_named(run_dir, tmp_path, capsys) -> None:
    run = _copy(run_dir, tmp_path)
    (run / "config.yaml").write_text("steps: [1,\n")
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert "config.yaml: not valid YAML" in err


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("lr=.nan", "optim.lr must be a finite number > 0, got nan"),
        ("lr=.inf", "optim.lr must be a finite number > 0, got inf"),
        ("optim.weight_decay=.nan", "optim.weight_decay must be a finite number >= 0"),
        ("optim.max_grad_norm=.nan", "optim.max_grad_norm must be a finite number > 0"),
        ("model.device=tpu", "model.device: 'tpu' is not a device"),
        ("G=1", r"tasks.group_size must be an integer in \[2, 1024\], got 1: every advantage"),
        ("tasks.options={db: {timeout_s: 0}}", "tasks.options.db: timeout_s must be"),
        ("tasks.options={db: {nope: 1}}", r"tasks.options.db: db: unknown option\(s\) \['nope'\]"),
    ],
)  # fmt: skip
def test_careless_values_fail_when_the_config_loads(override, says) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config("quick", [override])


@pytest.mark.parametrize(
    ("override", "says"),
    [
        # issue 21 items 10-14: each loaded (or raised OverflowError) before
        ("G=999999999999999999999", r"tasks.group_size must be an integer in \[2, 1024\]"),
        ("P=999999999999999999999", r"tasks.prompts_per_task must be an integer in \[1, 1024\]"),
        ("seed=999999999999999999999", r"seed must be an integer in \[0, 4294967295\], got 9"),
        ("steps=999999999999999999999", r"steps must be an integer in \[1, 1000000\]"),
        ("rollout.temperature=.inf", r"rollout.temperature must be a finite number in \[0.001"),
        ("rollout.temperature=-.inf", r"rollout.temperature must be a finite number"),
        ("rollout.max_episode_tokens=999999999999999999999",
         r"rollout.max_episode_tokens must be an integer in \[2, 1048576\]"),
        ("rollout.max_new_tokens_per_turn=true", "rollout.max_new_tokens_per_turn: expected an int"),
        ("model.lora_dropout=.nan", r"model.lora_dropout must be a finite number in \[0, 1\), got nan"),
        ("model.lora_dropout=-1", r"model.lora_dropout must be a finite number in \[0, 1\)"),
        ("model.lora_r=0", r"model.lora_r must be an integer in \[1, 4096\], got 0"),
        ("model.lora_alpha=-1", r"model.lora_alpha must be an integer in \[1, 1048576\]"),
        ("tasks.seed_offset=999999", "the run needs train seeds up to"),
        ("tasks.mix={db: 1000} & G=100", "200200 episodes per step"),
        ("algorithm.overlong.cache_len=2000", "algorithm.overlong.cache_len must be in"),
        ("algorithm.pacer.warmup_steps=999999999999999999999",
         r"algorithm.pacer.warmup_steps must be an integer in \[1, 1000000\]"),
        ("algorithm.loss_options={dual_clip: .nan}", "algorithm.loss_options.dual_clip must be"),
        ("optim.betas=[.nan, 0.9]", r"optim.betas\[0\] must be a finite number in \[0, 1\)"),
        ("optim.lr=1e400", "optim.lr must be a finite number > 0, got inf"),
        ("optim.lr=" + "9" * 400, "optim.lr: 9+ is out of range for a number"),
    ],
)  # fmt: skip
def test_numbers_out_of_range_fail_when_the_config_loads(override, says) -> None:
    for lora in ("model.lora=false", "model.lora=true"):  # LoRA values checked either way
        with pytest.raises(ConfigError, match=says):
            load_config("quick", [lora, *override.split(" & ")])


def test_a_missing_device_is_named_before_the_model_loads() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match=r"model.device=cuda:7: this machine has 0 CUDA"):
        resolve_device("cuda:7")
    assert resolve_device("cpu") == "cpu"


def test_state_json_written_is_plain_json(run_dir) -> None:
    state = json.loads((list_checkpoints(run_dir / "checkpoints")[-1] / "state.json").read_text())
    assert state["step"] == 2 and state["config"]["tasks"]["names"] == ["hecho"]


@pytest.mark.parametrize("algo", ["grpo", "papo"])
def test_an_episode_budget_below_the_prompt_is_named_on_the_first_rollout(algo, tmp_path) -> None:
    """Issue 21 item 13: a budget the first prompt already fills was a NaN traceback (PAPO's
    controller on a batch of zero policy tokens) or a silent run of abnormal episodes; now a
    ConfigError names the key, the task, the seed and the prompt's length."""
    cfg = load_config(None, [*RUN, f"algo={algo}", "rollout.max_episode_tokens=8"])
    says = (r"rollout.max_episode_tokens=8 leaves no room for a reply: 2 of the first "
            r"rollout's 2 episodes end before their first turn; the longest prompt, task "
            r"'hecho' seed 0, has (\d+) tokens. Raise rollout.max_episode_tokens to at least")  # fmt: skip
    with pytest.raises(ConfigError, match=says) as info:
        train(cfg, tmp_path / "run")
    assert not list((tmp_path / "run").glob("checkpoints/step_*"))
    n = int(re.search(says, str(info.value)).group(1))
    assert n > 8 and f"at least {n + 4} " in str(info.value)  # + max_new_tokens_per_turn
