"""Generation of the quick workload, old path vs fast path (shared prefixes + KV reuse).

The quick preset's rollout (``src/entropace/configs/quick.yaml``: SmolLM2-135M-Instruct, tasks
db, kg, reasoning, P prompts per task, G samples per prompt, its rollout settings) is sampled
for the preset's first ``--steps`` training steps (the trainer's prompts and step seeds), each
step twice in a row: ``rollout.share_prefix=false rollout.reuse_kv=false`` (old path: every turn
re-encodes the whole history, G times per prompt) and both on (fast path). Interleaving the
two paths step by step shares the noise of a busy machine between them.

Reported per path: generation seconds (``timings["generation_s"]``: prefix prefill + every
``generate``), generated tokens per second, token positions prefilled, the statistics pass
(identical work in both paths), the peak resident memory during the call (``VmRSS`` sampled
every 10 ms), and whether the fast path sampled exactly the old path's tokens (same seed).
Forward hooks split the model's generation time into prefill forwards (several positions per
row) and decoding steps (one position per row; the same steps in both paths). On a shared
machine wall times swing several-fold with the other jobs' load, so the process CPU times
(``time.process_time``; with one torch thread they count this job's work, not its waiting)
are reported next to them: ``generation_cpu_s`` is the call's CPU time minus the statistics
forwards'.

Run: ``python benchmarks/bench_rollout_fast.py --markdown benchmarks/results/rollout_fast.md``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

ROLLOUT_KEYS = (
    "max_turns",
    "max_new_tokens_per_turn",
    "max_episode_tokens",
    "temperature",
    "generation_batch_size",
)


def rss_mib() -> float:
    """Current resident set size of this process (``VmRSS``), MiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class ForwardTimer:
    """Wall time of the model's cached forwards (generation and prefix prefill pass
    ``use_cache=True``; the statistics pass does not), split into prefill (the prefix
    prefill and the first forward of each ``generate`` call) and decoding steps (the others,
    one position per row)."""

    def __init__(self, model: Any) -> None:
        self.prefill_s = self.decode_s = 0.0
        self.prefill_cpu_s = self.decode_cpu_s = self.uncached_cpu_s = 0.0
        self.decode_steps = 0
        self._start = self._start_cpu = 0.0
        self._first = True  # the next cached forward prefills
        self._model, self._generate = model, model.generate

        def generate(*args: Any, **kwargs: Any) -> Any:
            self._first = True
            try:
                return self._generate(*args, **kwargs)
            finally:
                self._first = True

        model.generate = generate
        self._handles = [
            model.register_forward_pre_hook(self._pre, with_kwargs=True),
            model.register_forward_hook(self._post, with_kwargs=True),
        ]

    def _pre(self, _module: Any, _args: Any, _kwargs: dict[str, Any]) -> None:
        self._start, self._start_cpu = time.perf_counter(), time.process_time()

    def _post(self, _module: Any, _args: Any, kwargs: dict[str, Any], _out: Any) -> None:
        elapsed = time.perf_counter() - self._start
        cpu = time.process_time() - self._start_cpu
        if not kwargs.get("use_cache"):
            self.uncached_cpu_s += cpu  # the statistics pass
        elif self._first or kwargs["input_ids"].shape[1] > 1:
            self.prefill_s += elapsed
            self.prefill_cpu_s += cpu
            self._first = False
        else:
            self.decode_s += elapsed
            self.decode_cpu_s += cpu
            self.decode_steps += 1

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._model.generate = self._generate


class PeakRSS:
    """Samples ``VmRSS`` every ``interval`` seconds while the block runs."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.peak = 0.0
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mib())
            time.sleep(self.interval)

    def __enter__(self) -> PeakRSS:
        self.peak = rss_mib()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mib())


def run(steps: int, threads: int, preset: str) -> dict[str, Any]:
    from entropace.models import load_model
    from entropace.rollout import collect_rollouts
    from entropace.train.config import load_config
    from entropace.train.data import TaskSampler
    from entropace.train.trainer import rollout_requests, step_seed

    torch.set_num_threads(threads)
    cfg = load_config(preset)
    if cfg.model.name == "tiny":  # a smoke test of this script
        from entropace.models.tiny import build_tiny_model

        model, tok = build_tiny_model(seed=0)
    else:
        model, tok = load_model(cfg.model.name)
    model.eval()
    paths = {
        "old": dataclasses.replace(cfg.rollout, share_prefix=False, reuse_kv=False),
        "fast": dataclasses.replace(cfg.rollout, share_prefix=True, reuse_kv=True),
    }
    sampler = TaskSampler(cfg.tasks)
    rows: list[dict[str, Any]] = []
    for step in range(1, steps + 1):
        requests = rollout_requests(sampler.next_prompts(), cfg)
        seed = step_seed(cfg, step)
        batches = {}
        for name, rcfg in paths.items():
            timer = ForwardTimer(model)
            cpu0 = time.process_time()
            try:
                with PeakRSS() as rss:
                    result = collect_rollouts(
                        model, tok, requests, rcfg, task_names=cfg.tasks.names, seed=seed
                    )
            finally:
                timer.remove()
            cpu = time.process_time() - cpu0
            t, c = result.timings, result.counts
            batches[name] = result.batch
            row = {
                "step": step,
                "path": name,
                "episodes": c["episodes"],
                "turns": c["turns"],
                "generated_tokens": c["generated_tokens"],
                "prefill_tokens": c["prefill_tokens"],
                "cached_tokens": c["cached_tokens"],
                "max_len": c["max_len"],
                "generation_s": t["generation_s"],
                "generation_cpu_s": cpu - timer.uncached_cpu_s,
                "prefill_s": timer.prefill_s,
                "decode_s": timer.decode_s,
                "prefill_cpu_s": timer.prefill_cpu_s,
                "decode_cpu_s": timer.decode_cpu_s,
                "decode_steps": timer.decode_steps,
                "stats_s": t["stats_s"],
                "total_s": t["total_s"],
                "tokens_per_s": c["generated_tokens"] / t["generation_s"],
                "peak_rss_mib": rss.peak,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        old, fast = batches["old"], batches["fast"]
        same = old.input_ids.shape == fast.input_ids.shape and torch.equal(
            old.input_ids, fast.input_ids
        )
        rows[-1]["identical_tokens"] = rows[-2]["identical_tokens"] = bool(same)
        if same:
            diff = (old.old_logprobs - fast.old_logprobs).abs().max().item()
            rows[-1]["max_logprob_diff"] = rows[-2]["max_logprob_diff"] = diff
    return {
        "rows": rows,
        "config": {
            "preset": preset,
            "model": cfg.model.name,
            "tasks": cfg.tasks.names,
            "prompts_per_task": cfg.tasks.prompts_per_task,
            "group_size": cfg.tasks.group_size,
            "rollout": {k: getattr(cfg.rollout, k) for k in ROLLOUT_KEYS},
        },
        "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name in ("old", "fast"):
        mine = [r for r in rows if r["path"] == name]
        gen = sum(r["generation_s"] for r in mine)
        out[name] = {
            "generation_s": gen,
            "generated_tokens": sum(r["generated_tokens"] for r in mine),
            "tokens_per_s": sum(r["generated_tokens"] for r in mine) / gen,
            "prefill_tokens": sum(r["prefill_tokens"] for r in mine),
            "generation_cpu_s": sum(r["generation_cpu_s"] for r in mine),
            "prefill_s": sum(r["prefill_s"] for r in mine),
            "decode_s": sum(r["decode_s"] for r in mine),
            "prefill_cpu_s": sum(r["prefill_cpu_s"] for r in mine),
            "decode_cpu_s": sum(r["decode_cpu_s"] for r in mine),
            "decode_steps": sum(r["decode_steps"] for r in mine),
            "stats_s": sum(r["stats_s"] for r in mine),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in mine),
        }
    return out


def markdown(result: dict[str, Any], argv: list[str], threads: int) -> str:
    rows, s = result["rows"], summary(result["rows"])
    cols = ["step", "path", "episodes", "turns", "generated_tokens", "prefill_tokens",
            "cached_tokens", "max_len", "generation_s", "generation_cpu_s", "prefill_s",
            "prefill_cpu_s", "decode_s", "decode_cpu_s", "tokens_per_s", "stats_s",
            "peak_rss_mib", "identical_tokens"]  # fmt: skip
    lines = [
        "# Quick-workload generation: old path vs shared prefix + KV reuse (CPU)",
        "",
        f"Command: `python benchmarks/bench_rollout_fast.py {' '.join(argv)}`",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs "
        f"(shared with other jobs while measured), torch {torch.__version__}, {threads} torch "
        f"threads, fp32. Workload: `{json.dumps(result['config'])}`.",
        "",
        "## Summary (all steps)",
        "",
        "| quantity | old | fast | ratio |",
        "|---|---|---|---|",
    ]
    keys = ("generation_s", "generation_cpu_s", "tokens_per_s", "prefill_tokens", "prefill_s",
            "prefill_cpu_s", "decode_s", "decode_cpu_s", "decode_steps", "stats_s",
            "peak_rss_mib")  # fmt: skip
    for key in keys:
        a, b = s["old"][key], s["fast"][key]
        ratio = b / a if key == "tokens_per_s" else a / b
        lines.append(f"| {key} | {a:.4g} | {b:.4g} | {ratio:.2f} |")
    lines += [
        "",
        "ratio: old / fast (the speed-up for times, the reduction for counts), except "
        "tokens_per_s: fast / old.",
    ]
    lines += ["", "## Per step", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Process peak RSS (ru_maxrss): {result['ru_maxrss_mib']:.0f} MiB.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    result = run(args.steps, args.threads, args.preset)
    print(json.dumps(summary(result["rows"])))
    if args.markdown:
        text = markdown(result, sys.argv[1:], args.threads)
        if args.markdown.exists():  # keep hand-written notes below the generated part
            old = args.markdown.read_text()
            if "\n## Notes" in old:
                text += old[old.index("\n## Notes") :]
        args.markdown.write_text(text)


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
