"""The first example of docs/integrations/trl.md, complete: EPPO + PAPO in TRL's GRPOTrainer on
three tasks, with the built-in SmolLM2-135M-Instruct, on a CPU (a GPU is used when there is one).

    python examples/trl_quickstart.py

tests/integrations/test_trl_quickstart.py checks that the doc shows this code and runs it (the
tiny test model, 9 optimiser steps). examples/trl_eppo.py is the configurable version
(any model, agent families, vLLM, several processes).
"""

import torch
from trl import GRPOConfig

from entropace.integrations.trl import (
    EntropaceGRPOTrainer,
    EnvRolloutConfig,
    env_dataset,
    env_reward,
    env_rollout_func,
)
from entropace.models import ensure_smollm2

# Three tasks whose groups have reward variance from the first step (codes of 2 / 3 / 4
# letters, credit by position); any entropace families work, e.g. ["db", "kg", "reasoning"].
tasks = ["lab2-easy", "lab2-mid", "lab2-hard"]
dataset = env_dataset(tasks, instances_per_task=16)  # columns: prompt, task, seed
on_cpu = not torch.cuda.is_available()
args = GRPOConfig(
    output_dir="runs/trl-quickstart",
    num_generations=4,  # G completions per prompt
    per_device_train_batch_size=8,  # 2 prompts per optimiser step,
    steps_per_generation=4,  # 8 prompts per generation batch: several tasks, so the pacer
    # compares them (TRL's defaults give one prompt, one task, per batch)
    num_iterations=2,  # each batch used twice: the policy moves off the sampler, the clip binds
    max_completion_length=8,
    learning_rate=1e-4,
    max_steps=24,  # 3 generation batches; the controllers step once per generation batch
    logging_steps=1,
    report_to="none",
    use_cpu=on_cpu,  # TRL's default bf16=True fails on a CPU without use_cpu
    bf16=not on_cpu,
    model_init_kwargs={"dtype": torch.float32 if on_cpu else torch.bfloat16},
)
trainer = EntropaceGRPOTrainer(
    str(ensure_smollm2()),  # the built-in model (converted once into the cache); or a hub id
    reward_funcs=[env_reward],  # the episode's reward, computed by the rollout below
    args=args,
    train_dataset=dataset,
    algorithm="eppo+papo",  # see the table below
    task_column="task",
    rollout_func=env_rollout_func(EnvRolloutConfig(max_turns=1, max_new_tokens_per_turn=8)),
    pacer={"alpha": 0.4},  # our PacerConfig (or its fields); PolarityConfig via polarity=
)
trainer.train()
for row in trainer.state.log_history:  # TRL's clipped share; each task's eps_k per batch
    if "loss" in row:
        eps = {k.split("/")[2]: round(v, 3) for k, v in row.items() if k.endswith("/eps_low")}
        print(f"step {row['step']}: clipped {row['clip_ratio/region_mean']:.3f}", eps or "")
