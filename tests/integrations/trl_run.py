"""Shared set-up of the TRL integration tests, and the script their multi-process test launches.

Imported by ``tests/integrations/test_trl*.py`` (tiny model directory, two-task dataset, reward,
``GRPOConfig``); run as a script by ``accelerate launch`` with two CPU processes (and plainly, for the
one-process reference) to train a few steps and write each
rank's controller state (completions: :func:`fixed_rollout`, or greedy decoding), logged ``entropace/`` metrics and the advantages handed to the loss
(per generation batch, this rank's rows) to ``<out>/rank<r>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import zlib
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
    """Share of digits in the completion (x3 for ``chat``), plus ``0.1 j^2`` for the
    completion's index ``j`` within its group (completions of a group are consecutive), so that
    even identical completions of a group (greedy decoding) get different, asymmetric rewards
    (symmetric ones would make PAPO's rescaling factor exactly 1 in every group)."""
    out = []
    for i, (completion, name) in enumerate(zip(completions, task, strict=True)):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        share = sum(ch.isdigit() for ch in text) / max(1, len(text))
        out.append(share * (3.0 if name == "chat" else 1.0) + 0.1 * (i % GROUP) ** 2)
    return out


def fixed_rollout(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
    """A TRL ``rollout_func`` whose completions depend only on (prompt, index in group): the
    same tokens whichever process samples them, and different within a group (lengths 5-11)."""
    tokenizer = trainer.processing_class
    vocab = len(tokenizer)
    out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
    for i, prompt in enumerate(prompts):
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        j = i % GROUP
        gen = torch_generator(zlib.crc32(f"{prompt[-1]['content']}|{j}".encode()))
        length = 5 + (3 * j) % 7
        completion = [int(t) for t in randint(3, vocab, length, gen)]
        out["prompt_ids"].append(ids)
        out["completion_ids"].append(completion)
        out["logprobs"].append([0.0] * length)
    return out


def torch_generator(seed: int) -> Any:
    import torch

    return torch.Generator().manual_seed(seed)


def randint(low: int, high: int, n: int, gen: Any) -> list[int]:
    import torch

    return torch.randint(low, high, (n,), generator=gen).tolist()


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
        bf16=False,  # TRL's configs default to bf16 autocast, also on CPUs
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
    parser.add_argument(
        "--fixed-completions", action="store_true", help="use fixed_rollout (else greedy)"
    )
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
        rollout_func=fixed_rollout if ns.fixed_completions else None,
    )
    advantages: list[list[list[float]]] = []
    original = trainer._generate_and_score_completions

    def scored(inputs: list[dict[str, Any]]) -> dict[str, Any]:
        out = original(inputs)
        advantages.append(out["advantages"].tolist())
        return out

    trainer._generate_and_score_completions = scored
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
                "backend": (
                    torch.distributed.get_backend() if torch.distributed.is_initialized() else None
                ),
                "advantages": advantages,
                "state": trainer.entropace_state_dict(),
                "log": eps_log,
            },
            fh,
        )


if __name__ == "__main__":
    main()
