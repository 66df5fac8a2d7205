"""Shared set-up of the TRL integration tests, and the script their multi-process test launches.

Imported by ``tests/integrations/test_trl*.py`` (tiny model directory, two-task dataset, reward,
``GRPOConfig``); run as a script by ``accelerate launch --num_processes 2 --cpu`` (and plainly,
for the one-process reference) to train a few steps with greedy generation and write each
rank's controller state to ``<out>/rank<r>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO_SRC = Path(__file__).resolve().parents[2] / "src"
if str(REPO_SRC) not in sys.path:
    sys.path.insert(0, str(REPO_SRC))

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

GROUP = 4  # num_generations
TASKS = ("arith", "chat")


def tiny_model_dir(path: str | os.PathLike[str]) -> str:
    """Save ``build_tiny_model(seed=0)`` and its tokenizer to ``path`` (once); return it."""
    from entropace.models.tiny import build_tiny_model

    path = str(path)
    if not os.path.exists(os.path.join(path, "config.json")):
        model, tokenizer = build_tiny_model(seed=0)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return path


def task_dataset(num_prompts: int = 16) -> Any:
    """``num_prompts`` chat prompts, tasks alternating ``arith`` / ``chat`` (different styles,
    so the tiny model's entropies differ per task)."""
    import datasets

    rows = []
    for i in range(num_prompts):
        task = TASKS[i % 2]
        text = f"What is {i} + {i * 7}? Digits only." if task == "arith" else f"Say hello to #{i}"
        rows.append({"prompt": [{"role": "user", "content": text}], "task": task})
    return datasets.Dataset.from_list(rows)


def digit_reward(completions: list[Any], task: list[str], **_: Any) -> list[float]:
    """Share of digits in the completion (x3 for ``chat``), plus 0.1 x the completion's index
    within its group (completions of a group are consecutive), so that even identical
    completions of a group (greedy decoding) get different rewards."""
    out = []
    for i, (completion, name) in enumerate(zip(completions, task, strict=True)):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        share = sum(ch.isdigit() for ch in text) / max(1, len(text))
        out.append(share * (3.0 if name == "chat" else 1.0) + 0.1 * (i % GROUP))
    return out


def grpo_args(output_dir: str, **overrides: Any) -> Any:
    """A small, deterministic CPU ``GRPOConfig`` (fp32, no checkpoints unless overridden)."""
    import torch
    from trl import GRPOConfig

    kwargs: dict[str, Any] = dict(
        output_dir=output_dir,
        per_device_train_batch_size=8,
        num_generations=GROUP,
        max_completion_length=12,
        gradient_accumulation_steps=1,
        max_steps=2,
        logging_steps=1,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        loss_type="grpo",
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,  # transformers 5 defaults to bf16 autocast where the CPU supports it
        seed=0,
        disable_tqdm=True,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        model_init_kwargs={"dtype": torch.float32},
    )
    kwargs.update(overrides)
    return GRPOConfig(**kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--algorithm", default="eppo+papo")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--per-device", type=int, default=GROUP)
    ns = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from entropace.integrations.trl import EntropaceGRPOTrainer

    args = grpo_args(
        os.path.join(ns.out, "run"),
        per_device_train_batch_size=ns.per_device,
        max_steps=ns.steps,
        generation_kwargs={"do_sample": False},
    )
    trainer = EntropaceGRPOTrainer(
        ns.model_dir,
        digit_reward,
        args=args,
        train_dataset=task_dataset(),
        algorithm=ns.algorithm,
    )
    trainer.train()
    eps_log = [
        {k: v for k, v in row.items() if k.startswith("entropace/")}
        for row in trainer.state.log_history
        if any(k.startswith("entropace/") for k in row)
    ]
    rank = trainer.accelerator.process_index
    with open(os.path.join(ns.out, f"rank{rank}.json"), "w") as fh:
        json.dump(
            {
                "world": trainer.accelerator.num_processes,
                "state": trainer.entropace_state_dict(),
                "log": eps_log,
            },
            fh,
        )


if __name__ == "__main__":
    main()
