"""One rollout batch fed to every engine adapter of :class:`entropace.control.TaskStep`.

Two training steps of 6 completions (tasks ``a`` rows 0-2 and ``b`` rows 3-5, groups of 3) with
given sampling entropies, PAPO sensitivities, rewards, success and abnormal flags. The
reference is our own trainer's update (:func:`entropace.train.update.update_step`, recipe
``eppo+papo``, a spy policy loss recording the bounds and advantages it receives); the TRL and
verl tests feed the same numbers through their plug-ins and must find the same bounds,
advantages and metrics. (TRL and verl live in separate environments, so each engine is compared
with our update, the common reference.)
"""

from __future__ import annotations

import copy
from typing import Any

import torch

TASKS = ["a", "b"]
ROW_TASKS = ["a", "a", "a", "b", "b", "b"]
PROMPT = 2  # prompt tokens before the completion in our trainer's rows
WIDTH = 8  # completion width
LENGTHS = [8, 6, 5, 7, 4, 8]  # completion tokens of each row (right-padded)
REWARDS = [(1.0, 0.0, 0.5, 1.0, 1.0, 0.0), (0.0, 1.0, 1.0, 0.5, 0.0, 1.0)]
ABNORMAL = [False, True, False, False, False, False]
CALLS: list[dict[str, torch.Tensor]] = []  # what the spy policy loss received


def completion_mask() -> torch.Tensor:
    mask = torch.zeros(6, WIDTH)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1.0
    return mask


def step_data(step: int) -> dict[str, torch.Tensor]:
    """Completion-aligned ``[6, WIDTH]`` entropy / sensitivity (0 off the mask), rewards."""
    g = torch.Generator().manual_seed(10 + step)
    mask = completion_mask()
    entropy = (0.3 + torch.rand(6, WIDTH, generator=g)) * mask
    entropy[3:] *= 0.6**step  # task b's entropy collapses faster: the pacer separates them
    sensitivity = (torch.rand(6, WIDTH, generator=g) - 0.5) * mask
    rewards = torch.tensor(REWARDS[step])
    return {"entropy": entropy, "sensitivity": sensitivity, "mask": mask, "rewards": rewards}


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """entropace's GRPO advantages ``[6]`` (groups of 3): what every engine is handed."""
    import entropace.algos as algos

    return algos.grpo_advantages(rewards, torch.tensor([0, 0, 0, 1, 1, 1])).float()


def update_reference() -> list[dict[str, Any]]:
    """Per step: ``eps_low`` / ``eps_high`` ``[6]``, completion-aligned advantages ``[6, WIDTH]``
    and the metrics, from our trainer's ``update_step`` (recipe eppo+papo)."""
    from entropace.algos.policy_losses import POLICY_LOSSES, PPOLossConfig, register_policy_loss
    from entropace.models.tiny import build_tiny_model
    from entropace.rollout import RolloutBatch
    from entropace.train.config import load_config
    from entropace.train.trainer import build_learner
    from entropace.train.update import update_step

    name = "adapter-spy"
    if name not in POLICY_LOSSES:

        @register_policy_loss(name, config=PPOLossConfig, default_bounds=(0.2, 0.2))
        def spy(inputs: Any, cfg: PPOLossConfig) -> Any:
            CALLS.append(
                {
                    "advantages": inputs.advantages.detach().clone(),
                    # floats when another test calls every registered loss with scalar bounds
                    "eps_low": torch.as_tensor(inputs.eps_low).detach().clone(),
                    "eps_high": torch.as_tensor(inputs.eps_high).detach().clone(),
                }
            )
            return POLICY_LOSSES["ppo"](inputs, cfg)

    cfg = load_config(
        None,
        ["tasks=a,b", "algo=eppo+papo", f"algorithm.policy_loss={name}", "ppo.epochs=1",
         "ppo.num_minibatches=1", "ppo.micro_batch_size=6", "ppo.shuffle=false",
         "rollout.max_episode_tokens=16", "optim.lr=1e-3"],
        check_envs=False,
    )  # fmt: skip
    model, _ = build_tiny_model(seed=0)
    learner = build_learner(cfg, copy.deepcopy(model))
    out = []
    length = PROMPT + WIDTH
    for step in range(2):
        d = step_data(step)
        attn = torch.zeros(6, length, dtype=torch.long)
        for i, n in enumerate(LENGTHS):
            attn[i, : PROMPT + n] = 1
        gen = torch.Generator().manual_seed(step)
        ids = torch.randint(4, model.config.vocab_size, (6, length), generator=gen)
        pad = torch.zeros(6, PROMPT)
        loss_mask = torch.cat([pad, d["mask"]], dim=1)
        rewards = d["rewards"]
        batch = RolloutBatch(
            input_ids=ids,
            attention_mask=attn,
            loss_mask=loss_mask,
            old_logprobs=torch.zeros(6, length),
            entropy=torch.cat([pad, d["entropy"]], dim=1),
            sensitivity=torch.cat([pad, d["sensitivity"]], dim=1),
            rewards=rewards,
            group_ids=torch.tensor([0, 0, 0, 1, 1, 1]),
            task_ids=torch.tensor([0, 0, 0, 1, 1, 1]),
            task_names=list(TASKS),
            success=rewards >= 1.0,
            abnormal=torch.tensor(ABNORMAL),
            num_turns=torch.ones(6, dtype=torch.long),
        )
        CALLS.clear()
        metrics = update_step(learner, batch)
        call = CALLS[0]
        out.append(
            {
                "eps_low": call["eps_low"].flatten(),
                "eps_high": call["eps_high"].flatten(),
                "advantages": call["advantages"][:, PROMPT:],
                "metrics": metrics,
            }
        )
    return out


def assert_same_metrics(
    ours: dict[str, float], theirs: dict[str, float], *, tol: float = 1e-6
) -> None:
    """Every metric the engine's adapter reports equals the update's (same name, same value)."""
    import math

    assert theirs, "the adapter reported no metrics"
    for key, value in theirs.items():
        assert key in ours, key
        if math.isnan(value):
            assert math.isnan(ours[key]), key
        else:
            assert math.isclose(ours[key], value, rel_tol=tol, abs_tol=tol), (key, ours[key], value)
