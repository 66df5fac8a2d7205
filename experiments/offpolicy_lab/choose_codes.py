"""Choose the lab v2 codes from the untrained tiny model's own next-letter probabilities.

    python experiments/offpolicy_lab/choose_codes.py [--seeds 8]

For each v2 task in turn (easy, mid, hard), on the task's real prompts (train seeds 0..n-1,
with the candidate code shown in them), the code's letter at position 0 is the letter of rank
``first`` among the letters not used by an earlier task, and at each later position the letter
of rank ``rest`` given the letters before it (ranks by mean probability over the prompts; two
passes, since the code is part of its own prompt). Prints each code with the base rate of each
of its letters given the ones before. The ranks are in ``RANKS``; the chosen codes are the ones
in ``entropace.envs.lab.LAB_TASKS`` (docs/lab.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import string

import torch

from entropace.envs.lab import LAB_TASKS, LabEnv
from entropace.models.tiny import build_tiny_model

#: task -> (code length, rank of the first letter, rank of the later letters)
RANKS = {"lab2-easy": (2, 0, 0), "lab2-mid": (3, 0, 0), "lab2-hard": (4, 0, 1)}
#: task -> the two extra letters of its alphabet (distractors and the difficulty extension);
#: reserved: no code uses them.
EXTRAS = {"lab2-easy": "wk", "lab2-mid": "qY", "lab2-hard": "zQ"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tok = build_tiny_model(seed=0)
    letters = [c for c in string.ascii_letters if len(tok.encode(c, add_special_tokens=False)) == 1]
    ids_of = {c: tok.encode(c, add_special_tokens=False)[0] for c in letters}

    def probs(name: str, code: str, prefix: str) -> dict[str, float]:
        extra = EXTRAS[name]
        alphabet = "".join(dict.fromkeys(code + extra))
        task = dataclasses.replace(LAB_TASKS[name], code=code, extension=extra, alphabet=alphabet)
        env = type("Env", (LabEnv,), {"task": task})()
        total = torch.zeros(len(tok))
        for seed in range(args.seeds):
            obs, _ = env.reset(seed)
            chat = [
                {"role": "system", "content": env.system_prompt},
                {"role": "user", "content": obs},
            ]
            ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
            ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
            if prefix:
                extra = torch.tensor([tok.encode(prefix, add_special_tokens=False)])
                ids = torch.cat([ids, extra], dim=1)
            with torch.no_grad():
                total += model(ids).logits[0, -1].softmax(-1)
        return {c: float(total[ids_of[c]]) / args.seeds for c in letters}

    used: set[str] = set("".join(EXTRAS.values()))
    for name, (n, first, rest) in RANKS.items():
        code = "".join(c for c in letters if c not in used)[:n]
        for _ in range(2):
            new = ""
            for i in range(n):
                p = probs(name, code, new)
                order = sorted(
                    (c for c in letters if c not in used and c not in new), key=lambda c: -p[c]
                )
                new += order[first if i == 0 else rest]
            code = new
        rates = [probs(name, code, code[:i])[code[i]] for i in range(n)]
        used |= set(code)
        print(name, code, "alphabet", "".join(dict.fromkeys(code + EXTRAS[name])), "rates",
              " ".join(f"{r:.4f}" for r in rates))  # fmt: skip


if __name__ == "__main__":
    main()
