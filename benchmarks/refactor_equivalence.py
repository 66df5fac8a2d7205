"""Record and compare the metrics of short training runs, to show a refactor changed nothing.

Runs ``entropace.train.train`` for every recipe (or ``--algos``) on the tiny model with a tiny
two-task environment whose groups have reward variance, and optionally the quick preset on the
embedded SmolLM2-135M (``--smollm``), then writes every logged metric except timings to JSON.
With ``--against OLD.json`` it compares the new metrics to a recorded file key by key and prints
every difference (missing keys, new keys, values that differ by more than ``--rtol``).

    python benchmarks/refactor_equivalence.py --out /tmp/before.json            # before a change
    python benchmarks/refactor_equivalence.py --out /tmp/after.json --against /tmp/before.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from entropace.envs.toy import register_letter_envs

TIMING = ("time/", "tokens_per_s", "memory/")


def _register() -> None:
    register_letter_envs("eqletter", "eqletter2")


TINY = [
    "model=tiny", "tasks=eqletter,eqletter2", "steps=3", "P=2", "G=3", "seed=1",
    "rollout.max_new_tokens_per_turn=6", "rollout.max_episode_tokens=96",
    "rollout.temperature=1.0", "optim.lr=3e-3", "ppo.epochs=2", "ppo.num_minibatches=2",
    "ppo.micro_batch_size=2", "log.checkpoint_every=0", "log.progress=false",
    "log.tensorboard=false", "log.report=false",
]  # fmt: skip
SMOLLM = ["steps=2", "log.progress=false", "log.tensorboard=false", "log.report=false"]


def run(preset: str | None, overrides: list[str]) -> list[dict[str, Any]]:
    from entropace.train.config import load_config
    from entropace.train.metrics_log import read_metrics
    from entropace.train.trainer import train

    cfg = load_config(preset, overrides)
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, Path(tmp) / "run")
        rows = read_metrics(Path(tmp) / "run")
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


#: Intended changes of the issue-8 refactor (one source per metric: the loss's own outputs).
#: ``approx_kl`` is now the loss's own k3 estimate of KL(pi_old || pi) (was a second, opposite-
#: direction estimate computed in the update; the loss's one was logged as ``loss/approx_kl``).
RENAMED = {"approx_kl": "loss/approx_kl"}
#: Keys removed on purpose: the update's own ``approx_kl`` (its value lives on as the loss's,
#: renamed above); the per-optimiser-step means of the loss's clip fractions duplicated
#: the pooled ``clip_frac_*``; KL-Cov has no clip, so no clip fractions.
REMOVED = ("approx_kl", "loss/clip_frac_low", "loss/clip_frac_high", "loss/approx_kl")
#: Keys added on purpose: every loss flag is also pooled per task.
ADDED_SUFFIXES = ("/dual_clip_frac", "/cov_drop_frac", "/kl_cov_frac")
#: Recipes whose clip fractions were computed at 1 +- eps although their clip is elsewhere
#: (DCPO: probability-dependent bounds; GSPO: the sequence ratio; KL-Cov: no clip), and the
#: ``loss/<flag>`` metrics now pooled over the step's tokens instead of averaged over steps.
FIXED = {"clip_frac_low", "clip_frac_high", "loss/dual_clip_frac", "loss/cov_drop_frac",
         "loss/kl_cov_frac"}  # fmt: skip


def _expected(run_name: str, key: str, where: str) -> bool:
    if where == "old":
        return key in REMOVED or (run_name.endswith("/kl_cov") and "clip_frac" in key)
    return key.endswith(ADDED_SUFFIXES)


def compare(old: dict[str, Any], new: dict[str, Any], rtol: float) -> list[str]:
    """Differences beyond the intended changes above; a FIXED metric is compared only for the
    recipes whose clip is the plain 1 +- eps one (there it must not change)."""
    out = []
    for run_name in sorted(set(old) | set(new)):
        if run_name not in new or run_name not in old:
            out.append(f"{run_name}: only in {'old' if run_name in old else 'new'}")
            continue
        for i, (a, b) in enumerate(zip(old[run_name], new[run_name], strict=True)):
            b = {RENAMED.get(k, k): v for k, v in b.items()}
            for key in sorted(set(a) | set(b)):
                fixed_here = run_name.endswith(("/dcpo", "/gspo", "/kl_cov", "/clip_cov"))
                if (key in FIXED or key.endswith(("/clip_frac_low", "/clip_frac_high"))) and (
                    fixed_here or key.startswith("loss/")
                ):
                    continue
                if key not in b or key not in a:
                    if _expected(run_name, key, "old" if key in a else "new"):
                        continue
                    where = "old" if key in a else "new"
                    out.append(f"{run_name} step {i + 1}: {key} only in {where}")
                    continue
                va, vb = a[key], b[key]
                same = va == vb or (
                    isinstance(va, float) and isinstance(vb, float)
                    and ((math.isnan(va) and math.isnan(vb))
                         or math.isclose(va, vb, rel_tol=rtol, abs_tol=1e-12))
                )  # fmt: skip
                if not same:
                    out.append(f"{run_name} step {i + 1}: {key} {va!r} -> {vb!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--algos", default="all", help="comma list of recipes (default: all)")
    p.add_argument("--smollm", action="store_true", help="also the quick preset on SmolLM2")
    p.add_argument("--extra", nargs="*", default=[], help="overrides added to every run")
    p.add_argument("--against", type=Path, help="a recorded JSON to compare with")
    p.add_argument("--rtol", type=float, default=1e-6)
    args = p.parse_args(argv)
    _register()
    from entropace.train.algorithms import RECIPES

    algos = sorted(RECIPES) if args.algos == "all" else args.algos.split(",")
    result: dict[str, Any] = {}
    for name in algos:
        result[f"tiny/{name}"] = run(None, [*TINY, f"algo={name}", *args.extra])
        print(f"tiny/{name}: {len(result[f'tiny/{name}'])} steps", flush=True)
    if args.smollm:
        result["smollm2/quick"] = run("quick", [*SMOLLM, *args.extra])
        print("smollm2/quick done", flush=True)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    if args.against:
        diffs = compare(json.loads(args.against.read_text()), result, args.rtol)
        print(f"{len(diffs)} differences")
        for line in diffs:
            print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
