"""The verl plug-in's adapter of TaskStep equals our own update on the same batch.

The batch of :mod:`adapter_case` (two steps, recipe eppo+papo) goes through the verl trainer's
driver hook (:class:`~entropace.integrations.verl.hooks.EntropaceHook`, on a ``DataProto`` as
verl hands it over: ``entropy``, ``response_mask``, ``token_level_scores``, ``data_source``,
``entropace_success``) and through our trainer's ``update_step``: the per-token bounds, the
PAPO-reweighted advantages and every ``entropace/`` metric are equal.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import adapter_case as case  # noqa: E402

pytest.importorskip("verl", reason="verl is not installed (pip install 'entropace[verl]')")

from omegaconf import OmegaConf  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl import DataProto  # noqa: E402

from entropace.integrations.verl.hooks import EntropaceHook, settings_from_config  # noqa: E402


def test_verl_adapter_equals_our_update() -> None:
    torch.set_num_threads(1)
    reference = case.update_reference()
    config = OmegaConf.create(
        {"actor_rollout_ref": {"actor": {"clip_ratio": 0.2, "clip_ratio_low": 0.2,
                                         "clip_ratio_high": 0.2,
                                         "policy_loss": {"loss_mode": "eppo_papo"}}}}
    )  # fmt: skip
    hook = EntropaceHook(settings_from_config(config))
    for step, ref in enumerate(reference):
        d = case.step_data(step)
        mask = d["mask"]
        scores = torch.zeros(6, case.WIDTH)
        for i, n in enumerate(case.LENGTHS):
            scores[i, n - 1] = d["rewards"][i]
        adv = case.group_advantages(d["rewards"])[:, None] * mask
        data = DataProto(
            batch=TensorDict(
                {
                    "entropy": d["entropy"],
                    "response_mask": mask,
                    "token_level_scores": scores,
                    "advantages": adv,
                    "entropace_sensitivity": d["sensitivity"],
                },
                batch_size=[6],
            ),
            non_tensor_batch={
                "data_source": np.array(case.ROW_TASKS, dtype=object),
                "entropace_success": (d["rewards"] >= 1.0).numpy().astype(np.float64),
            },
        )
        metrics = hook.on_old_log_prob(data)
        metrics.update(hook.on_advantages(data))
        low, high = data.batch["entropace_eps_low"], data.batch["entropace_eps_high"]
        assert low.shape == mask.shape
        torch.testing.assert_close(low[:, 0], ref["eps_low"], rtol=0, atol=1e-7)
        torch.testing.assert_close(high[:, -1], ref["eps_high"], rtol=0, atol=1e-7)
        torch.testing.assert_close(
            data.batch["advantages"], ref["advantages"], rtol=1e-6, atol=1e-6
        )
        logged = {k.removeprefix("entropace/"): v for k, v in metrics.items()}
        case.assert_same_metrics(ref["metrics"], logged)
        assert {"task/a/eps_low", "task/b/pace_z", "polarity/pos_mass", "entropy"} <= set(logged)
    assert ref["eps_low"][0] != ref["eps_low"][3]  # step 2: the tasks' bounds differ
