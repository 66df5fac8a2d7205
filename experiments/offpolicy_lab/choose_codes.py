"""Choose the lab v2 codes: at each position the letter of a given rank under the untrained
tiny model (mean over 4 prompts), letters of earlier tasks excluded (docs/lab.md).

    python experiments/offpolicy_lab/choose_codes.py

Prints each task's code and the base rate of each of its letters given the letters before it.
"""

import string

import torch

from entropace.models.tiny import build_tiny_model

torch.set_num_threads(1)
m, t = build_tiny_model(seed=0)
cands = [c for c in string.ascii_letters if len(t.encode(c, add_special_tokens=False)) == 1]
SYS = "Reply with the code only: its characters, nothing before them."


def dist(name, code, prefix, seeds=(0, 1, 2, 3)):
    acc = None
    for s in seeds:
        obs = f"{name} #{s}. The code is {code}.\nA reply that starts like the code earns part of the reward."
        chat = [{"role": "system", "content": SYS}, {"role": "user", "content": obs}]
        ids = t.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        if prefix:
            ids = torch.cat([ids, torch.tensor([t.encode(prefix, add_special_tokens=False)])], 1)
        with torch.no_grad():
            p = m(ids).logits[0, -1].softmax(-1)
        acc = p if acc is None else acc + p
    acc /= len(seeds)
    return {c: float(acc[t.encode(c, add_special_tokens=False)[0]]) for c in cands}


used = set()
for name, n, rank in (("lab2-easy", 2, 0), ("lab2-mid", 3, 1), ("lab2-hard", 4, 3)):
    code = "x" * n
    for _ in range(2):
        new = ""
        for _ in range(n):
            p = dist(name, code, new)
            order = [
                c
                for c, _ in sorted(p.items(), key=lambda kv: -kv[1])
                if c not in used and c not in new
            ]
            new += order[rank]
        code = new
    ps = [dist(name, code, code[:i])[code[i]] for i in range(n)]
    used |= set(code)
    print(name, code, [round(x, 4) for x in ps])
