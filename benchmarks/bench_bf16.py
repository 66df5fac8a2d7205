"""bf16 autocast (fp32 master weights) against fp32 on the CPU: update and generation, side by side.

Workload: SmolLM2-135M (the embedded ``smollm2-135m``, fp32 weights), ``--rows`` chat prompts
of real text, ``--new-tokens`` sampled tokens each (one batched ``generate_turn``), then the
update's forward + backward on those trajectories: ``sequence_token_stats(grad=True,
fused_head=True)`` at the sampling temperature and a REINFORCE-style loss
``-sum(A_t log pi_t) / n`` over the generated tokens (``A_t`` fixed random signs), which has the
gradient shape of the PPO loss at ratio 1.

Arms (in one process, alternated ABAB... so that the machine's load hits both alike):

- ``fp32``: the plain path;
- ``bf16``: the same calls under ``torch.autocast("cpu", dtype=torch.bfloat16)``: the weights
  stay fp32 (the optimiser's master copy), matmuls run in bf16, gradients land in fp32
  (``ppo.autocast=bf16`` / ``rollout.autocast=bf16``).

Time: median over ``--repeats`` alternated pairs of wall and process CPU time (on a shared
machine, CPU time is the fairer ratio). Numerics, from one pair on the same inputs: the
generated tokens' log-probs (max / mean |diff|), the loss (relative difference), the gradient
(relative L2 difference, cosine), and for generation, with greedy decoding, the share of
positions where bf16 picked the same token as fp32 before the first disagreement.

Run: ``python benchmarks/bench_bf16.py --markdown benchmarks/results/bf16.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator

import torch

PROMPTS = [
    "List the tables of a music store database and explain which one stores invoices.",
    "Write a SQL query that counts the customers of each country, largest first.",
    "You are in a kitchen. Find a clean mug and put it in the coffee machine. What do you do?",
    "Which relation links a film to its director in a knowledge graph? Answer briefly.",
    "Explain how to list the five largest files under /var/log with a shell command.",
    "A shopper wants red running shoes under 60 dollars. Which search query would you send?",
    "Solve: a train leaves at 9:40 and arrives at 13:05. How long is the journey?",
    "Summarise the rules of tic-tac-toe in three sentences.",
]


@contextlib.contextmanager
def arm(name: str) -> Iterator[None]:
    if name == "bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield
    else:
        yield


def timed(fn: Callable[[], object]) -> tuple[float, float, object]:
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w0, time.process_time() - c0, out


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--markdown", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from entropace.models import load_model
    from entropace.rollout.chat import ChatLayout
    from entropace.rollout.generate import generate_turn
    from entropace.rollout.stats import sequence_token_stats

    load0 = uptime()
    model, tok = load_model("smollm2-135m", dtype="float32", device="cpu")
    chat = ChatLayout(tok, [])
    prompts = [chat.prompt_ids("You are a helpful agent.", PROMPTS[i % len(PROMPTS)])
               for i in range(args.rows)]  # fmt: skip
    stop = sorted(chat.stop_ids)
    pad = int(tok.pad_token_id)

    def generate(
        name: str, seed: int, sample: bool = True, recorder: object = None
    ) -> list[list[int]]:
        torch.manual_seed(seed)
        with arm(name):
            return generate_turn(
                model, prompts, max_new_tokens=args.new_tokens, temperature=args.temperature,
                top_p=1.0, do_sample=sample, stop_ids=stop, pad_id=pad, recorder=recorder,
            )  # fmt: skip

    def padded(new: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = [p + n for p, n in zip(prompts, new, strict=True)]
        L = max(map(len, rows))
        ids = torch.full((len(rows), L), pad, dtype=torch.long)
        attn = torch.zeros(len(rows), L, dtype=torch.long)
        mask = torch.zeros(len(rows), L)
        for i, (p, r) in enumerate(zip(prompts, rows, strict=True)):
            ids[i, : len(r)] = torch.tensor(r)
            attn[i, : len(r)] = 1
            mask[i, len(p) : len(r)] = 1
        return ids, attn, mask

    # trajectories for the update: fp32 sampling, right-padded
    ids, attn, mask = padded(generate("fp32", 0))
    L = ids.shape[1]
    n = mask.sum()
    params = [p for p in model.parameters() if p.requires_grad]

    def update(name: str, ids=ids, attn=attn, mask=mask) -> tuple:
        n = mask.sum()
        signs = torch.rand(len(prompts), 1, generator=torch.Generator().manual_seed(1))
        adv = torch.where(signs > 0.5, 1.0, -1.0) * mask  # the same in every call
        model.train()
        model.zero_grad(set_to_none=True)
        with arm(name):
            stats = sequence_token_stats(
                model, ids, attn, temperature=args.temperature, grad=True, loss_mask=mask,
                fused_head=True,
            )  # fmt: skip
        loss = -(adv * stats.logprob.float() * mask).sum() / n
        loss.backward()
        grad = torch.cat([p.grad.flatten() for p in params])
        model.eval()
        return loss.detach(), stats.logprob.detach().float(), grad

    # numerics (one pair, same inputs)
    loss32, lp32, g32 = update("fp32")
    loss16, lp16, g16 = update("bf16")
    m = mask.bool()
    d = (lp16 - lp32)[m].abs()
    g16, g32 = g16.double(), g32.double()  # 134M-element reductions: accumulate in float64
    grad_rel = float((g16 - g32).norm() / g32.norm())
    cos = float(g16 @ g32 / (g16.norm() * g32.norm()))
    greedy32, greedy16 = generate("fp32", 0, sample=False), generate("bf16", 0, sample=False)
    agree = total = 0
    for a, b in zip(greedy32, greedy16, strict=True):
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        agree += k
        total += len(a)
    with torch.no_grad():  # the behaviour log-probs a bf16 rollout would record
        model.eval()
        s32 = sequence_token_stats(model, ids, attn, temperature=args.temperature, loss_mask=mask,
                                   fused_head=True)  # fmt: skip
        with arm("bf16"):
            s16 = sequence_token_stats(model, ids, attn, temperature=args.temperature,
                                       loss_mask=mask, fused_head=True)  # fmt: skip
    d_stats = (s16.logprob.float() - s32.logprob.float())[m].abs()

    # the on-policy first step: |log r| between the update's forward and the behaviour
    # log-probs recorded at generation (GenerationRecorder, rollout.stats_from_generation) or by
    # a statistics pass, each arm sampling and updating in its own precision
    from entropace.rollout.gen_stats import GenerationRecorder, assemble_generation_stats

    first_step = {}
    for name in ("fp32", "bf16"):
        rec = GenerationRecorder(args.temperature)
        new_a = generate(name, 5, recorder=rec)
        ids_a, attn_a, mask_a = padded(new_a)
        gen = assemble_generation_stats([[r] for r in rec.rows(new_a)], mask_a).logprob
        with torch.no_grad(), arm(name):
            model.eval()
            st = sequence_token_stats(model, ids_a, attn_a, temperature=args.temperature,
                                      loss_mask=mask_a, fused_head=True).logprob.float()  # fmt: skip
        _, lp_a, _ = update(name, ids_a, attn_a, mask_a)
        ma = mask_a.bool()
        first_step[name] = ((lp_a - gen)[ma].abs(), (lp_a - st)[ma].abs())

    # timings, alternated
    times: dict[str, dict[str, list[tuple[float, float]]]] = {
        "update (fwd+bwd)": {"fp32": [], "bf16": []},
        "generation": {"fp32": [], "bf16": []},
    }
    for rep in range(args.repeats + 1):  # the first pair warms up
        for name in ("fp32", "bf16") if rep % 2 == 0 else ("bf16", "fp32"):
            w, c, _ = timed(lambda name=name: update(name))
            if rep:
                times["update (fwd+bwd)"][name].append((w, c))
            w, c, _ = timed(lambda name=name, rep=rep: generate(name, 100 + rep))
            if rep:
                times["generation"][name].append((w, c))
    load1 = uptime()

    lines = [
        "# bf16 autocast vs fp32 on the CPU (SmolLM2-135M)",
        "",
        f"Command: `OMP_NUM_THREADS={args.threads} python benchmarks/bench_bf16.py --rows "
        f"{args.rows} --new-tokens {args.new_tokens} --repeats {args.repeats} --threads "
        f"{args.threads}`",
        "",
        f"torch {torch.__version__}, {args.threads} intra-op thread(s); CPU bf16 support "
        f"(`lscpu` flags): {', '.join(_bf16_flags()) or 'none'}. The machine is shared by 8 "
        "helpers (2 cores): the arms are alternated in one process and the ratios use the "
        "medians of each arm.",
        f"Load before: `{load0}`; after: `{load1}`.",
        f"Workload: {args.rows} trajectories, {int(n)} generated tokens in total (longest row "
        f"{L} tokens), temperature {args.temperature}; update = fused-head statistics with "
        "gradients + backward of `-sum(A log pi)/n`; generation = one batched `generate_turn` "
        f"of up to {args.new_tokens} new tokens per row (sampling).",
        "",
        "| workload | fp32 wall s | bf16 wall s | wall speed-up | fp32 CPU s | bf16 CPU s "
        "| CPU speed-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for work, arms in times.items():
        w32 = statistics.median(t[0] for t in arms["fp32"])
        w16 = statistics.median(t[0] for t in arms["bf16"])
        c32 = statistics.median(t[1] for t in arms["fp32"])
        c16 = statistics.median(t[1] for t in arms["bf16"])
        lines.append(
            f"| {work} | {w32:.2f} | {w16:.2f} | {w32 / w16:.2f}x | {c32:.2f} | {c16:.2f} "
            f"| {c32 / c16:.2f}x |"
        )
    lines += [
        "",
        "Numerical difference (bf16 autocast minus fp32, same weights and tokens):",
        "",
        f"- update forward: generated-token log-probs |diff| max {float(d.max()):.3g}, "
        f"mean {float(d.mean()):.3g} (nats);",
        f"- loss: fp32 {float(loss32):.6f}, bf16 {float(loss16):.6f}, relative difference "
        f"{abs(float(loss16 - loss32)) / abs(float(loss32)):.3g};",
        f"- gradient (fp32 master, all parameters): relative L2 difference {grad_rel:.3g}, "
        f"cosine {cos:.6f};",
        f"- rollout statistics pass (no grad): log-prob |diff| max {float(d_stats.max()):.3g}, "
        f"mean {float(d_stats.mean()):.3g};",
        f"- greedy generation: {agree} of {total} fp32 tokens ({agree / max(total, 1):.1%}) "
        "reproduced by bf16 before each row's first disagreement.",
        "",
        "On-policy first optimiser step, `|log r|` = |update forward - behaviour log-prob| over "
        "the generated tokens, each arm sampling, recording and updating in its own precision "
        "(the ratio a clip sees before any weight moves; ideally 0):",
        "",
        "| arm | behaviour from generation logits: mean | max | from a statistics pass: mean "
        "| max |",
        "|---|---|---|---|---|",
    ]
    for name, (d_gen, d_pass) in first_step.items():
        lines.append(
            f"| {name} | {float(d_gen.mean()):.3g} | {float(d_gen.max()):.3g} "
            f"| {float(d_pass.mean()):.3g} | {float(d_pass.max()):.3g} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(text)


def _bf16_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next(line for line in fh if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags if "bf16" in f or f.startswith("amx"))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
