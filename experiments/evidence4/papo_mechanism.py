"""PAPO's mechanism on lab v3, measured (issue 35, item 3): counterfactual updates from one state.

    python experiments/evidence4/papo_mechanism.py --seed 9201 --trajectory grpo --out DIR
    python experiments/evidence4/papo_mechanism.py --summarise DIR/papo_mechanism_*.json

A lab3 run (``--trajectory``: the recipe whose updates the run follows) is replayed in this
process, with the trainer's own pieces (warm start, rollout pipeline, ``update_step``). At the
probe steps, from the run's policy and optimiser state and that step's rollout batch, copies of
the learner take the step's update under several advantage weightings, and each copy's realised
per-state entropy change is measured on every policy token of the batch (float64, at the
sampling temperature):

- ``grpo``: the plain update (weights 1);
- ``papo``: PAPO with the branch weights the run's controller gives at that step (the same
  controller state as the trajectory, i.e. ``w_plus``, ``w_minus`` of a PAPO run at this state);
- ``plus<w>`` / ``minus<w>``: PAPO's reweighting with fixed weights (``w_plus = w``,
  ``w_minus = 2 - w``: the expanding branch up, or the contracting one) to see the dose;
- ``pos-only`` / ``neg-only``: only one branch's advantages (the other's set to 0), without the
  rescale: what each branch alone does to each task's entropy under the real optimiser.

Per variant, task and branch (``P = A S > 0`` expanding, ``< 0`` contracting, ``A`` and ``S``
before the update, as PAPO computes them): the mean realised ``dH`` over the states, the
polarity's first-order prediction ``sum_t w_t c P_t`` (per unit step; its sign and its share per
task are what PAPO steers), the effective pressure ``sum |A'|`` against ``sum |A|``, the
parameter step norm, and the mean change of the sampled tokens' log-probability per branch.
Writes ``OUT/papo_mechanism_seed<k>.json`` and prints a table. One torch thread.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import sys
from pathlib import Path

import torch

from entropace.algos import entropy_polarity, polarity_reweight, token_stats
from entropace.diagnostics.training_audit import state_logits
from entropace.rollout.worker import RolloutJob, trainable_weights
from entropace.train import update as U
from entropace.train.config import load_config
from entropace.train.data import TaskSampler
from entropace.train.pipeline import open_pipeline
from entropace.train.policy import build_model
from entropace.train.trainer import build_learner, rollout_requests, seed_everything, step_seed
from entropace.train.warm_start import warm_started

PROBE_STEPS = (1, 2, 3, 4, 6, 8, 10, 12, 16, 20)
FIXED = (1.16, 1.5)  # plus<w>: w_plus = w, w_minus = 2 - w; minus<w>: the reverse


def states(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Every policy token's (row, col): the state is the prefix before col."""
    rows, cols = batch.loss_mask.nonzero(as_tuple=True)
    return rows, cols


def stats_at(model, batch, rows, cols, temperature: float) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        logits = state_logits(model, batch.input_ids, batch.attention_mask, rows, cols)
    st = token_stats(logits.double(), batch.input_ids[rows, cols], temperature=temperature)
    return {"entropy": st.entropy, "logprob": st.logprob, "S": st.sensitivity}


def summarise(paths: list[Path]) -> str:
    """Markdown tables over the probe records of ``paths`` (module docstring)."""
    recs = [(json.loads(p.read_text()), p) for p in paths]
    tasks = ("lab2-easy", "lab2-mid", "lab2-hard")
    names = ", ".join(f"{d['trajectory']} seed {d['seed']}" for d, _ in recs)
    out = [f"Records: {names}; probe steps {PROBE_STEPS}.\n"]
    out.append("### Realised entropy change per task (mean dH over the batch's policy tokens, "
               "nats), mean over records, steps 1-8 (the collapse) and 10-20\n")  # fmt: skip
    variants = ("grpo", "papo", "plus1.16", "plus1.5", "minus1.16", "minus1.5", "pos-only",
                "neg-only")  # fmt: skip
    for lo, hi in ((1, 8), (10, 20)):
        out.append(f"steps {lo}-{hi}:\n")
        out.append("| variant | w+ (run's) | " + " | ".join(tasks) + " | step norm / grpo's | "
                   + " | ".join(f"pressure {t} / grpo's" for t in tasks) + " |")  # fmt: skip
        out.append("|---|---|" + "---|" * (2 * len(tasks) + 1))
        for v in variants:
            rows = [(st, st["variants"][v], st["variants"]["grpo"]) for d, _ in recs
                    for st in d["steps"] if lo <= st["step"] <= hi]  # fmt: skip
            if not rows:
                continue
            mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
            cells = [f"{mean([st['w_plus'] for st, _, _ in rows]):.2f}" if v == "papo" else "",
                     *(f"{mean([r[f'{t}/all/dH'] for _, r, _ in rows]):+.4f}" for t in tasks),
                     f"{mean([r['step_norm'] / g['step_norm'] for _, r, g in rows]):.3f}",
                     *(f"{mean([r[f'{t}/all/pressure'] / g[f'{t}/all/pressure'] for _, r, g in rows if g[f'{t}/all/pressure'] > 0]):.3f}"
                       for t in tasks)]  # fmt: skip
            out.append(f"| {v} | " + " | ".join(cells) + " |")
        out.append("")
    # sign checks, cell by cell (record, step, task)
    n = agree_pos = agree_neg = agree_diff = 0
    for d, _ in recs:
        for st in d["steps"]:
            v = st["variants"]
            for t in tasks:
                if v["grpo"][f"{t}/all/pressure"] == 0:  # no gradient on the task
                    continue
                n += 1
                agree_pos += v["pos-only"][f"{t}/all/dH"] > v["grpo"][f"{t}/all/dH"]
                agree_neg += v["neg-only"][f"{t}/all/dH"] < v["grpo"][f"{t}/all/dH"]
                pred = v["papo"][f"{t}/all/pred"] - v["grpo"][f"{t}/all/pred"]
                real = v["papo"][f"{t}/all/dH"] - v["grpo"][f"{t}/all/dH"]
                agree_diff += (pred > 0) == (real > 0)
    out.append(f"Sign checks over {n} (record, step, task) cells: the expanding branch alone "
               f"leaves the entropy above the full GRPO update's in {agree_pos}, the contracting "
               f"branch alone below it in {agree_neg}; PAPO's change of the first-order "
               f"prediction (sum over the task's tokens of A' S - A S) has the sign of the "
               f"realised change (dH_papo - dH_grpo) in {agree_diff}.")  # fmt: skip
    return "\n".join(out) + "\n"


def main() -> None:
    if sys.argv[1:2] == ["--summarise"]:
        print(summarise([Path(p) for p in sys.argv[2:]]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=9201)
    ap.add_argument("--trajectory", default="grpo", help="recipe the run follows (grpo | papo)")
    ap.add_argument("--steps", type=int, default=max(PROBE_STEPS))
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = [f"seed={args.seed}", "eval.every=0", "log.progress=false"]
    cfg = load_config("lab3", [*base, f"algo={args.trajectory}"])
    # the PAPO learner: the same run, PAPO's recipe (grpo + papo)
    cfg_papo = load_config("lab3", [*base, "algo=papo"])
    built, _ = warm_started(cfg)
    seed_everything(cfg.seed)
    model, tokenizer, _ = build_model(built.model)
    learner = build_learner(cfg, model)
    papo_ctrl = build_learner(cfg_papo, copy.deepcopy(model)).polarity  # tracks the phase
    sampler = TaskSampler(cfg.tasks)

    def make_job(step: int, version: int, prompts):
        return RolloutJob(step, version, rollout_requests(prompts, cfg), step_seed(cfg, step))

    pipeline = open_pipeline(built, model, tokenizer, sampler, make_job,
                             build_model=build_model, rollout_threads=1)  # fmt: skip
    weights = trainable_weights(model)
    T = cfg.rollout.temperature
    records = []
    for step in range(1, args.steps + 1):
        model.eval()
        output, _ = pipeline.next(step)
        batch = output.result.batch
        names = batch.task_names
        # PAPO's phase controller follows the run's batch entropy (as in a PAPO run)
        ctrl_step = U.task_step(
            dataclasses.replace(learner, polarity=papo_ctrl, cfg=cfg_papo), names
        )
        sums = ctrl_step.sums(batch.entropy, batch.loss_mask, batch.rewards, batch.success,
                              batch.task_ids, abnormal=batch.abnormal)  # fmt: skip
        ctrl_step.step(sums)
        w_plus, w_minus = ctrl_step.weights
        if step in PROBE_STEPS:
            records.append(probe(step, cfg, learner, batch, (float(w_plus), float(w_minus)), T))
            print(summary_line(records[-1]), flush=True)
        U.update_step(learner, batch, generator=torch.Generator().manual_seed(step_seed(cfg, step)))
        pipeline.publish(step, weights)
    pipeline.close()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"papo_mechanism_{args.trajectory}_seed{args.seed}.json"
    path.write_text(json.dumps({"seed": args.seed, "trajectory": args.trajectory,
                                "steps": records}, indent=1) + "\n")  # fmt: skip
    print(f"wrote {path}")


def probe(step, cfg, learner, batch, weights, T) -> dict:
    """The counterfactual updates of one step (module docstring)."""
    rows, cols = states(batch)
    before = stats_at(learner.model, batch, rows, cols, T)
    adv, keep = U.token_advantages(batch, cfg)
    a_tok = adv[rows, cols].double()
    polarity = entropy_polarity(a_tok, before["S"])
    task = batch.task_ids[rows]
    names = batch.task_names
    mask = batch.loss_mask
    full_p = entropy_polarity(adv.double(), torch.zeros_like(adv, dtype=torch.float64).index_put(
        (rows, cols), before["S"]))  # [B, L]
    variants: dict[str, torch.Tensor | None] = {"grpo": None}
    w_run = weights
    variants["papo"] = polarity_reweight(adv.double(), full_p, mask, w_plus=w_run[0],
                                         w_minus=w_run[1]).float()  # fmt: skip
    for w in FIXED:
        variants[f"plus{w}"] = polarity_reweight(adv.double(), full_p, mask, w_plus=w,
                                                 w_minus=2 - w).float()  # fmt: skip
        variants[f"minus{w}"] = polarity_reweight(adv.double(), full_p, mask, w_plus=2 - w,
                                                  w_minus=w).float()  # fmt: skip
    variants["pos-only"] = torch.where(full_p > 0, adv, torch.zeros_like(adv))
    variants["neg-only"] = torch.where(full_p < 0, adv, torch.zeros_like(adv))
    out = {"step": step, "w_plus": weights[0], "w_minus": weights[1], "variants": {}}
    for name, a_new in variants.items():
        lrn = copy.deepcopy(learner)
        lrn.polarity = None  # the advantages below are the whole difference between variants
        theta0 = torch.cat([p.detach().flatten().double() for p in lrn.model.parameters()])
        original = U.token_advantages
        if a_new is not None:
            U.token_advantages = lambda b, c, _a=a_new, _k=keep: (_a, _k)  # noqa: E731
        try:
            U.update_step(lrn, batch,
                          generator=torch.Generator().manual_seed(step_seed(cfg, step)))  # fmt: skip
        finally:
            U.token_advantages = original
        theta1 = torch.cat([p.detach().flatten().double() for p in lrn.model.parameters()])
        after = stats_at(lrn.model, batch, rows, cols, T)
        dH = after["entropy"] - before["entropy"]
        dlp = after["logprob"] - before["logprob"]
        a_used = (a_new if a_new is not None else adv)[rows, cols].double()
        row = {"step_norm": float((theta1 - theta0).norm())}
        for k, tname in enumerate(names):
            on = task == k
            for branch, sel in (("all", on), ("pos", on & (polarity > 0)),
                                ("neg", on & (polarity < 0))):  # fmt: skip
                n = int(sel.sum())
                row[f"{tname}/{branch}/n"] = n
                row[f"{tname}/{branch}/dH"] = float(dH[sel].mean()) if n else math.nan
                row[f"{tname}/{branch}/dlogp"] = float(dlp[sel].mean()) if n else math.nan
                # first-order prediction per unit step: sum of the update's own polarity
                row[f"{tname}/{branch}/pred"] = float((a_used[sel] * before["S"][sel]).sum())
                row[f"{tname}/{branch}/pressure"] = float(a_used[sel].abs().sum())
                row[f"{tname}/{branch}/pressure_grpo"] = float(a_tok[sel].abs().sum())
            row[f"{tname}/H_before"] = float(before["entropy"][on].mean())
        out["variants"][name] = row
    return out


def summary_line(rec: dict) -> str:
    v = rec["variants"]
    parts = [f"step {rec['step']:2d} w+ {rec['w_plus']:.2f}"]
    for name in ("grpo", "papo", "plus1.5", "minus1.5", "pos-only", "neg-only"):
        r = v[name]
        parts.append(name + " " + "/".join(
            f"{r[f'lab2-{t}/all/dH']:+.3f}" for t in ("easy", "mid", "hard")))
    return " | ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
