"""EPPO (+ PAPO) in Hugging Face TRL on several entropace environment families at once.

A starting point for TRL users: TRL's own ``GRPOTrainer`` loop, accelerate / DeepSpeed / vLLM
as TRL supports them, and entropace's per-task clip pacing (EPPO) and polarity reweighting
(PAPO) by swapping the class. Episodes run through entropace's rollout engine as a TRL
``rollout_func`` (multi-turn for the agent families ``db``, ``kg``, ``reasoning``, ``os``,
``household``, ``shop``); observation tokens carry no loss.

The defaults are a setting where the clip binds, so that EPPO's per-task clip ranges act: the
pace lab's three v2 tasks (``lab2-easy``, ``lab2-mid``, ``lab2-hard``: codes of 2 / 3 / 4
letters with credit by position, so groups have reward variance from the first step), replies
of up to 8 tokens, lr 1e-4, and 8 optimiser steps per generation batch (below). On the agent
families a 135M model's groups rarely have reward variance, and zero-advantage tokens are never
clipped (``--tasks db,kg --max-turns 3 --max-new-tokens 64`` for those).

    # CPU smoke run (a tiny random model, a few seconds per step)
    python examples/trl_eppo.py --model tiny --steps 2
    # the embedded SmolLM2-135M-Instruct (default), or any hub id / local path
    python examples/trl_eppo.py --steps 24
    python examples/trl_eppo.py --model Qwen/Qwen2.5-0.5B-Instruct --bf16 --steps 50 --lr 1e-5
    # several processes / GPUs
    accelerate launch --num_processes 4 examples/trl_eppo.py --model <id> --bf16
    # vLLM generation (TRL's colocate mode) for single-turn prompts: --use-vllm --single-turn

Metrics (``entropace/task/<k>/eps_low``, ``.../entropy``, ``.../pace_z``, ``entropace/polarity/
w_plus`` ...) go through TRL's logger (``--report-to tensorboard`` / ``wandb``).

Where the clip binds: PPO's clip (and so EPPO's per-task clip range) only acts when the policy
has moved away from the one that sampled the batch. With TRL's defaults (one optimiser step per
generation batch, ``num_iterations=1``) the ratio is exactly 1 and ``clip_ratio/region_mean``
is 0 at every step: EPPO would change nothing. This example therefore generates once for
``--steps-per-generation`` (default 4) optimiser steps and reuses each batch
``--num-iterations`` (default 2) times, so the later optimiser steps of a generation batch see
data up to 7 updates stale, as in an off-policy pipeline; the bounds of each completion are its
task's ``eps_k`` from the generation batch's statistics (see docs/integrations/trl.md). The
script prints the clipped-token fraction of every logged step and each task's ``eps_k``
(the controllers step once per generation batch: 8 optimiser steps here). Measured run:
docs/integrations/trl.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

REPO_SRC = Path(__file__).resolve().parents[1] / "src"
if (REPO_SRC / "entropace").is_dir() and str(REPO_SRC) not in sys.path:
    sys.path.insert(0, str(REPO_SRC))


def resolve_model(name: str, workdir: str) -> str:
    """A hub id or path for TRL: ``tiny`` builds a random tiny model, ``smollm2-135m`` is the
    embedded SmolLM2-135M-Instruct (converted once into entropace's cache)."""
    if name == "tiny":
        from entropace.models.tiny import build_tiny_model

        path = os.path.join(workdir, "tiny-model")
        if not os.path.exists(os.path.join(path, "config.json")):
            model, tokenizer = build_tiny_model(seed=0)
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
        return path
    if name == "smollm2-135m":
        from entropace.models import ensure_smollm2

        return str(ensure_smollm2())
    return name


def single_turn_dataset(tasks: list[str], n: int) -> tuple[Any, Any]:
    """Prompts = each instance's system prompt + first observation; reward = one env step."""
    import datasets

    from entropace.envs import make

    rows = []
    for i in range(n):
        for name in tasks:
            env = make(name)
            obs, _ = env.reset(i)
            prompt = [
                {"role": "system", "content": env.system_prompt},
                {"role": "user", "content": obs},
            ]
            rows.append({"prompt": prompt, "task": name, "seed": i})

    def env_step_reward(completions: list[Any], task: list[str], seed: list[int], **_: Any):
        out = []
        for completion, name, s in zip(completions, task, seed, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            env = make(name)
            env.reset(int(s))
            out.append(float(env.step(text)[1]))
        return out

    return datasets.Dataset.from_list(rows), env_step_reward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="hub id, path, tiny, smollm2-135m")
    parser.add_argument(
        "--tasks", default="lab2-easy,lab2-mid,lab2-hard", help="environment families (comma list)"
    )
    parser.add_argument("--algorithm", default="eppo+papo")
    parser.add_argument("--instances", type=int, default=16, help="instances per task")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--group", type=int, default=4, help="completions per prompt (G)")
    parser.add_argument("--max-turns", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=8, help="per turn")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument(
        "--steps-per-generation", type=int, default=4, help="optimiser steps per generation batch"
    )
    parser.add_argument(
        "--num-iterations", type=int, default=2, help="passes over each generation batch"
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--use-vllm", action="store_true", help="TRL's vLLM colocate generation")
    parser.add_argument("--single-turn", action="store_true", help="plain TRL generation")
    parser.add_argument("--output-dir", default="runs/trl_eppo")
    parser.add_argument("--report-to", default="none")
    parser.add_argument("--save-steps", type=int, default=0, help="0: no checkpoints")
    parser.add_argument("--resume", default=None, help="checkpoint directory to resume from")
    ns = parser.parse_args()

    import torch
    from trl import GRPOConfig

    from entropace.integrations.trl import (
        EntropaceGRPOTrainer,
        EnvRolloutConfig,
        env_dataset,
        env_reward,
        env_rollout_func,
    )

    os.makedirs(ns.output_dir, exist_ok=True)
    tasks = [t.strip() for t in ns.tasks.split(",") if t.strip()]
    model = resolve_model(ns.model, ns.output_dir)
    batch = ns.prompts_per_step * ns.group
    args = GRPOConfig(
        output_dir=ns.output_dir,
        per_device_train_batch_size=batch,
        num_generations=ns.group,
        max_completion_length=ns.max_new_tokens * ns.max_turns,
        temperature=ns.temperature,
        learning_rate=ns.lr,
        max_steps=ns.steps,
        steps_per_generation=ns.steps_per_generation,
        num_iterations=ns.num_iterations,
        logging_steps=1,
        report_to=ns.report_to,
        save_strategy="steps" if ns.save_steps else "no",
        save_steps=ns.save_steps or 500,
        bf16=ns.bf16,
        use_cpu=not torch.cuda.is_available(),
        use_vllm=ns.use_vllm,
        vllm_mode="colocate",
        model_init_kwargs={"dtype": torch.bfloat16 if ns.bf16 else torch.float32},
        disable_tqdm=True,
    )
    if ns.single_turn:
        dataset, reward = single_turn_dataset(tasks, ns.instances)
        extra: dict[str, Any] = {}
    else:
        if ns.use_vllm:
            raise SystemExit(
                "--use-vllm applies to --single-turn here: entropace's multi-turn rollouts "
                "generate with the training model (HF generate)"
            )
        dataset, reward = env_dataset(tasks, ns.instances), env_reward
        rollout = EnvRolloutConfig(
            max_turns=ns.max_turns, max_new_tokens_per_turn=ns.max_new_tokens
        )
        extra = {"rollout_func": env_rollout_func(rollout)}
    trainer = EntropaceGRPOTrainer(
        model,
        [reward],
        args=args,
        train_dataset=dataset,
        algorithm=ns.algorithm,
        task_column="task",
        **extra,
    )
    trainer.train(resume_from_checkpoint=ns.resume)
    if trainer.accelerator.is_main_process:
        clipped, reward, shown = [], float("nan"), {}
        for row in trainer.state.log_history:
            if "loss" not in row:
                continue
            clipped.append(row.get("clip_ratio/region_mean", float("nan")))
            # reward and the controllers' metrics are logged on a generation batch's first step
            reward = row.get("reward", reward)
            shown = {k.removeprefix("entropace/task/"): round(v, 4) for k, v in row.items()
                     if k.startswith("entropace/task/") and k.endswith(("eps_low", "entropy"))} or shown  # fmt: skip
            print(
                f"step {row['step']}: reward {reward:.3f} "
                f"clip_ratio/region_mean {clipped[-1]:.4f} {shown}"
            )
        binding = sum(c > 0 for c in clipped)
        print(f"the clip bound on {binding} of {len(clipped)} optimiser steps")


if __name__ == "__main__":
    main()
