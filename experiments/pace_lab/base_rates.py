"""First-reply probabilities of the lab's codes under the untrained tiny model (docs/lab.md).

    python experiments/pace_lab/base_rates.py [--seeds 20]

For each lab task, over the prompts of train seeds ``0..n-1`` (the chat the trainer builds:
system prompt, observation, assistant header), the mean probability at temperature 1 of

* the code's first digit as the first reply token, and of the whole code (first digit, then
  the second given the first: the product, averaged over prompts);
* the decoy's first digit (lab-hard), and the entropy of the first reply token (nats).

The tiny model's weights are fixed (``build_tiny_model(seed=0)``, as ``model=tiny`` loads it),
so these numbers hold for every run seed; training seeds change the sampling only.
"""

from __future__ import annotations

import argparse

import torch

from entropace.envs import make
from entropace.envs.lab import LAB_TASKS
from entropace.models.tiny import build_tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tok = build_tiny_model(seed=0)
    print("| task | code | P(first digit) | P(code) | decoy | P(decoy) | H(first token) |")
    print("|---|---|---|---|---|---|---|")
    for name, task in LAB_TASKS.items():
        env = make(name)
        p_first = p_code = p_decoy = ent = 0.0
        for seed in range(args.seeds):
            obs, info = env.reset(seed)
            gold = info["gold"]
            chat = [
                {"role": "system", "content": env.system_prompt},
                {"role": "user", "content": obs},
            ]
            ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
            ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
            code_ids = tok.encode(gold)
            full = torch.cat([ids, torch.tensor([code_ids[:-1]], dtype=ids.dtype)], dim=1)
            with torch.no_grad():
                logp = model(full).logits[0].log_softmax(-1).double()
            start = ids.shape[1] - 1
            first = logp[start]
            p_first += float(first[code_ids[0]].exp())
            p_code += float(sum(logp[start + i, t] for i, t in enumerate(code_ids)).exp())
            ent -= float((first.exp() * first).sum())
            if task.decoy:
                p_decoy += float(first[tok.encode(task.decoy)[0]].exp())
        n = args.seeds
        decoy = f"`{task.decoy}` | {p_decoy / n:.4f}" if task.decoy else "- | -"
        print(
            f"| {name} | `{task.code}` | {p_first / n:.4f} | {p_code / n:.2e} | {decoy} "
            f"| {ent / n:.2f} |"
        )


if __name__ == "__main__":
    main()
