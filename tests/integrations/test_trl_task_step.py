"""The TRL plug-in's adapter of TaskStep equals our own update on the same batch.

The batch of :mod:`adapter_case` (two steps, recipe eppo+papo) goes through
``EntropaceGRPOTrainer._entropace_process`` (the real trainer, its rollout-statistics path:
per-token entropy / sensitivity and success / abnormal flags handed over as entropace's rollouts
do) and through our trainer's ``update_step``: the per-completion bounds, the PAPO-reweighted
advantages and every ``entropace/`` metric are equal.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import adapter_case as case  # noqa: E402
import trl_run  # noqa: E402

pytest.importorskip("trl")

from entropace.integrations.trl import EPS_HIGH_KEY, EPS_LOW_KEY  # noqa: E402
from entropace.integrations.trl.trainer import (  # noqa: E402
    ROLLOUT_ABNORMAL_KEY,
    ROLLOUT_ENTROPY_KEY,
    ROLLOUT_SENSITIVITY_KEY,
    ROLLOUT_SUCCESS_KEY,
    EntropaceGRPOTrainer,
)


@pytest.mark.slow  # ~35 s on 2 loaded cores: a real TRL trainer plus our update, 2 steps each
def test_trl_adapter_equals_our_update(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    reference = case.update_reference()
    trainer = EntropaceGRPOTrainer(
        trl_run.tiny_model_dir(tmp_path / "tiny"),
        trl_run.digit_reward,
        args=trl_run.grpo_args(str(tmp_path / "run")),
        train_dataset=trl_run.task_dataset(),
        algorithm="eppo+papo",
        task_names=case.TASKS,
    )
    trainer.reward_weights = torch.ones(1)
    for step, ref in enumerate(reference):
        d = case.step_data(step)
        mask = d["mask"]
        inputs: list[dict[str, Any]] = [
            {
                "task": case.ROW_TASKS[i],
                ROLLOUT_ENTROPY_KEY: d["entropy"][i, : case.LENGTHS[i]].tolist(),
                ROLLOUT_SENSITIVITY_KEY: d["sensitivity"][i, : case.LENGTHS[i]].tolist(),
                ROLLOUT_SUCCESS_KEY: bool(d["rewards"][i] >= 1.0),
                ROLLOUT_ABNORMAL_KEY: case.ABNORMAL[i],
            }
            for i in range(6)
        ]
        trainer._rewards_per_func = d["rewards"][:, None].clone()
        output = {
            "prompt_ids": torch.ones(6, 2, dtype=torch.long),
            "prompt_mask": torch.ones(6, 2, dtype=torch.long),
            "completion_ids": torch.ones(6, case.WIDTH, dtype=torch.long),
            "completion_mask": mask.long(),
            "advantages": case.group_advantages(d["rewards"]),
        }
        trainer._metrics["train"].clear()
        out = trainer._entropace_process(output, inputs, "train")
        torch.testing.assert_close(out[EPS_LOW_KEY].flatten(), ref["eps_low"], rtol=0, atol=1e-7)
        torch.testing.assert_close(out[EPS_HIGH_KEY].flatten(), ref["eps_high"], rtol=0, atol=1e-7)
        torch.testing.assert_close(
            out["advantages"] * mask, ref["advantages"], rtol=1e-6, atol=1e-6
        )
        logged = {
            k.removeprefix("entropace/"): v[-1]
            for k, v in trainer._metrics["train"].items()
            if k.startswith("entropace/")
        }
        case.assert_same_metrics(ref["metrics"], logged)
        assert {"task/a/eps_low", "task/b/abnormal", "polarity/pos_mass", "entropy"} <= set(logged)
    assert ref["eps_low"][0] != ref["eps_low"][3]  # step 2: the tasks' bounds differ
