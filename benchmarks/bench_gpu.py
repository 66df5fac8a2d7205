"""Rollout speed on one GPU (issue 36): bare ``generate`` against the engine, a paper-small step.

Sections (each timed after one untimed warm-up call of the same shape):

1. **one turn**: ``B`` left-padded prompts of ``--prompt-len`` tokens, ``--new-tokens`` new
   tokens each (the stop id is outside the vocabulary, so every row runs every step: equal
   work in every row). Bare ``model.generate`` with the dynamic and the static cache
   (``cache_implementation="static"``; transformers compiles it on CUDA) against the engine's
   :func:`entropace.rollout.generate.generate_turn` on the dynamic cache, the static cache and
   (CUDA) the static cache with CUDA graphs. Per decoding step milliseconds (wall / steps) and
   generated tokens per second (rows x steps / wall).
2. **multi-turn**: ``collect_rollouts`` over ``--tasks`` (default db, kg; groups of 8) with the
   paper-small preset's rollout settings, per cache mode: generation seconds, generated tokens
   (from the counts, checked against the loss masks), generated tokens per second.
3. **paper-small step** (``--step``): the preset's first step (``--step-overrides`` apply) split
   into rollout generation / environments / statistics and the update, with the update's
   trained tokens per second.
4. **profile**: ``torch.profiler`` over one multi-turn rollout of the default path: host reads
   of device values (``aten::_local_scalar_dense``, ``cudaStreamSynchronize``,
   ``cudaMemcpy`` device-to-host) per decoding step, kernel time against wall time.

Peak memory: ``torch.cuda.max_memory_allocated`` (GPU) or ``ru_maxrss`` (CPU). The results go
to ``--out`` as ``gpu.json`` and ``gpu.md`` (the card, the versions, the command).

On the GPU machine, after the kit's setup (``../shared/gpu/README.md``)::

    source .gpu3/setup.sh && python3 benchmarks/bench_gpu.py --out $OUT

On a CPU (the test suite's smoke run, ``tests/test_bench_gpu.py``)::

    python benchmarks/bench_gpu.py --device cpu --model tiny --quick --out /tmp/gpu
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

CACHE_MODES = ("dynamic", "static", "static+graph")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load(name: str, device: str) -> tuple[Any, Any]:
    if name == "tiny":
        from entropace.models.tiny import build_tiny_model

        model, tok = build_tiny_model(seed=0)
        return model.to(device).eval(), tok
    from entropace.models import load_model

    model, tok = load_model(name, dtype="auto", device=device)
    return model.eval(), tok


def timed(fn: Any, device: torch.device) -> tuple[Any, float]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def one_turn(model: Any, device: torch.device, batch: int, prompt_len: int, new: int,
             modes: list[str]) -> dict[str, Any]:  # fmt: skip
    from entropace.rollout.generate import generate_turn, generation_config, left_pad

    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(10, vocab, (prompt_len - i % 8,), generator=g).tolist()
               for i in range(batch)]  # fmt: skip
    kw = dict(max_new_tokens=new, temperature=1.0, top_p=1.0, do_sample=True,
              stop_ids=[vocab + 7], pad_id=0)  # fmt: skip
    ids, mask = left_pad(prompts, 0, device)

    def bare(static: bool) -> list[list[int]]:
        cfg = generation_config(**kw)
        if static:
            cfg.cache_implementation = "static"
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
        return out[:, ids.shape[1] :].tolist()

    runs = {
        "generate/dynamic": lambda: bare(False),
        "generate/static": lambda: bare(True),
        "engine/dynamic": lambda: generate_turn(model, prompts, **kw),
        "engine/static": lambda: generate_turn(model, prompts, **kw, static=True),
        "engine/static+graph": lambda: generate_turn(model, prompts, **kw, static=True,
                                                     cuda_graph=True),  # fmt: skip
    }
    out: dict[str, Any] = {}
    tokens: dict[str, list[list[int]]] = {}
    for name, fn in runs.items():
        if name.split("/")[1] not in modes:
            continue
        try:
            torch.manual_seed(0)
            fn()  # warm-up (compilation, graph capture, allocator)
            torch.manual_seed(0)
            rows, wall = timed(fn, device)
        except Exception as exc:  # report and go on: the rest of the benchmark still runs
            out[name] = {"error": repr(exc)[:300]}
            continue
        steps = max(len(r) for r in rows)
        count = sum(len(r) for r in rows)
        tokens[name] = rows
        out[name] = {"wall_s": wall, "steps": steps, "generated_tokens": count,
                     "ms_per_step": 1e3 * wall / steps, "tokens_per_s": count / wall}  # fmt: skip
    ref = tokens.get("generate/dynamic")
    for name, rows in tokens.items():
        out[name]["same_tokens_as_generate"] = rows == ref if ref is not None else None
    return out


def requests_for(tasks: list[str], episodes: int, seed: int) -> list[Any]:
    from entropace.envs import make
    from entropace.rollout import RolloutRequest

    group = 8
    reqs = []
    for i in range(episodes // group):
        task = tasks[i % len(tasks)]
        for _ in range(group):
            reqs.append(RolloutRequest(task, lambda t=task: make(t), seed + i, i))
    return reqs


def multi_turn(model: Any, tok: Any, device: torch.device, episodes: int, tasks: list[str],
               modes: list[str], rollout: Any) -> dict[str, Any]:  # fmt: skip
    import dataclasses

    from entropace.rollout import collect_rollouts

    out: dict[str, Any] = {}
    reqs = requests_for(tasks, episodes, seed=1000)
    for mode in modes:
        cfg = dataclasses.replace(rollout, cache="dynamic" if mode == "dynamic" else "static",
                                  cuda_graph=mode == "static+graph")  # fmt: skip
        try:
            collect_rollouts(model, tok, reqs, cfg, task_names=tasks, seed=1)  # warm-up
            res, wall = timed(lambda c=cfg: collect_rollouts(model, tok, reqs, c,
                                                             task_names=tasks, seed=0), device)  # fmt: skip
        except Exception as exc:
            out[mode] = {"error": repr(exc)[:300]}
            continue
        gen = res.timings["generation_s"]
        count = res.counts["generated_tokens"]
        out[mode] = {
            "wall_s": wall, "generation_s": gen, "env_s": res.timings["env_s"],
            "stats_s": res.timings["stats_s"], "generated_tokens": count,
            "loss_mask_tokens": int(res.batch.loss_mask.sum()),
            "turns": res.counts["turns"], "generate_calls": res.counts["generate_calls"],
            "tokens_per_s": count / gen if gen else 0.0,
            "ids_hash": hash(tuple(res.batch.input_ids.flatten().tolist())),
        }  # fmt: skip
    return out


def profile_rollout(model: Any, tok: Any, device: torch.device, episodes: int,
                    tasks: list[str], rollout: Any) -> dict[str, Any]:  # fmt: skip
    from torch.profiler import ProfilerActivity, profile

    from entropace.rollout import collect_rollouts

    reqs = requests_for(tasks, episodes, seed=2000)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    steps = {"n": 0}
    handle = model.register_forward_pre_hook(
        lambda _m, _a, kw: steps.__setitem__("n", steps["n"] + (kw["input_ids"].shape[1] == 1)),
        with_kwargs=True,
    )
    try:
        sync(device)
        t0 = time.perf_counter()
        with profile(activities=acts) as prof:
            collect_rollouts(model, tok, reqs, rollout, task_names=tasks, seed=0)
            sync(device)
        wall = time.perf_counter() - t0
    finally:
        handle.remove()
    events = prof.key_averages()
    counts = {e.key: e.count for e in events}
    reads = counts.get("aten::_local_scalar_dense", 0)
    syncs = counts.get("cudaStreamSynchronize", 0) + counts.get("cudaDeviceSynchronize", 0)
    memcpy = sum(c for k, c in counts.items() if k.startswith("cudaMemcpy") and "Async" not in k)
    kernel_us = sum(getattr(e, "self_device_time_total", 0) for e in events
                    if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA)  # fmt: skip
    n = max(steps["n"], 1)
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:8]
    return {
        "wall_s": wall, "decoding_steps": steps["n"], "host_reads": reads,
        "host_reads_per_step": reads / n, "syncs_per_step": syncs / n,
        "blocking_memcpy_per_step": memcpy / n, "kernel_s": kernel_us / 1e6,
        "kernel_over_wall": kernel_us / 1e6 / wall if wall else 0.0,
        "top_cpu_ops": [(e.key, e.count, e.self_cpu_time_total / 1e6) for e in top],
    }  # fmt: skip


def paper_small_step(overrides: list[str]) -> dict[str, Any]:
    from entropace.rollout import collect_rollouts
    from entropace.train.config import load_config
    from entropace.train.data import TaskSampler
    from entropace.train.trainer import build_learner, build_model, rollout_requests, step_seed
    from entropace.train.update import update_step

    cfg = load_config("paper-small", overrides)
    torch.manual_seed(cfg.seed)
    model, tok, _ = build_model(cfg.model)
    device = next(model.parameters()).device
    requests = rollout_requests(TaskSampler(cfg.tasks).next_prompts(), cfg)
    learner = build_learner(cfg, model)
    model.eval()
    result, rollout_s = timed(lambda: collect_rollouts(
        model, tok, requests, cfg.rollout, task_names=cfg.tasks.names, seed=step_seed(cfg, 1)),
        device)  # fmt: skip
    batch = result.batch
    pattern = torch.tensor([1.0, 0.0, 0.0, 1.0])  # reward variance in every group: a full update
    batch.rewards = pattern.repeat(len(batch.rewards) // 4 + 1)[: len(batch.rewards)]
    _, update_s = timed(lambda: update_step(learner, batch, generator=torch.Generator()
                                            .manual_seed(1)), device)  # fmt: skip
    trained = int(batch.attention_mask.sum())
    return {
        "episodes": result.counts["episodes"], "tasks": list(cfg.tasks.names),
        "rollout_s": rollout_s, "generation_s": result.timings["generation_s"],
        "env_s": result.timings["env_s"], "stats_s": result.timings["stats_s"],
        "generated_tokens": result.counts["generated_tokens"], "update_s": update_s,
        "step_s": rollout_s + update_s, "update_tokens": trained,
        "update_tokens_per_s": trained / update_s if update_s else 0.0,
        "cache": cfg.rollout.cache, "cuda_graph": cfg.rollout.cuda_graph,
    }  # fmt: skip


def markdown(res: dict[str, Any]) -> str:
    env = res["env"]
    label = "CPU (tiny model)" if env["device"] == "cpu" else env["card"]
    lines = [f"# Rollout speed on {label} (issue 36)", "",
             f"Command: `{env['command']}`", "",
             f"Card: {env['card']}; torch {env['torch']}, transformers {env['transformers']}, "
             f"Python {env['python']}; model {env['model']}; threads {env['threads']}.", ""]  # fmt: skip
    if env["device"] == "cpu":
        lines += ["**These numbers are a CPU smoke run of the script (tiny model, small sizes); "
                  "the GPU run is pending.**", ""]  # fmt: skip
    lines += ["## One turn", "", "| batch | path | ms / step | tokens/s | steps | same tokens |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for b, rows in res["one_turn"].items():
        for name, r in rows.items():
            if "error" in r:
                lines.append(f"| {b} | {name} | error: {r['error'][:80]} | | | |")
                continue
            lines.append(f"| {b} | {name} | {r['ms_per_step']:.2f} | {r['tokens_per_s']:.0f} | "
                         f"{r['steps']} | {r['same_tokens_as_generate']} |")  # fmt: skip
    lines += ["", f"## Multi-turn ({', '.join(res['tasks'])}, groups of 8)", "",
              "| episodes | cache | generation s | tokens | tokens/s | turns | calls |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for n, rows in res["multi_turn"].items():
        for mode, r in rows.items():
            if "error" in r:
                lines.append(f"| {n} | {mode} | error: {r['error'][:80]} | | | | |")
                continue
            lines.append(f"| {n} | {mode} | {r['generation_s']:.2f} | {r['generated_tokens']} | "
                         f"{r['tokens_per_s']:.0f} | {r['turns']} | {r['generate_calls']} |")  # fmt: skip
    if res.get("step"):
        s = res["step"]
        lines += ["", "## One paper-small step", "", "| phase | seconds |", "|---|---|"]
        for key in ("generation_s", "env_s", "stats_s", "rollout_s", "update_s", "step_s"):
            lines.append(f"| {key[:-2]} | {s[key]:.2f} |")
        lines += ["", f"{s['episodes']} episodes, {s['generated_tokens']} generated tokens; "
                  f"update {s['update_tokens']} tokens, {s['update_tokens_per_s']:.0f} tokens/s."]  # fmt: skip
    p = res["profile"]
    lines += ["", "## Profile of one rollout (default path)", "",
              f"{p['decoding_steps']} decoding steps; host reads of device values per step "
              f"{p['host_reads_per_step']:.3f}, stream syncs per step {p['syncs_per_step']:.3f}, "
              f"blocking copies per step {p['blocking_memcpy_per_step']:.3f}; kernel time "
              f"{p['kernel_s']:.2f} s of {p['wall_s']:.2f} s wall "
              f"({100 * p['kernel_over_wall']:.0f} %).", "",
              f"Peak memory: {res['peak_mib']:.0f} MiB.", ""]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="smollm2-135m", help="a model name, or tiny")
    ap.add_argument("--quick", action="store_true", help="small sizes (the CPU smoke run)")
    ap.add_argument("--tasks", default="db,kg")
    ap.add_argument("--step", action=argparse.BooleanOptionalAction, default=True,
                    help="time one paper-small step")  # fmt: skip
    ap.add_argument("--step-overrides", default="", help="comma-free, space-separated overrides")
    ap.add_argument("--out", type=Path, required=True, help="folder for gpu.json and gpu.md")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    threads = torch.get_num_threads()
    from entropace.rollout import RolloutConfig

    model, tok = load(args.model, args.device)
    tasks = args.tasks.split(",")
    small = ["tasks.prompts_per_task=1", "tasks.group_size=4", "rollout.max_turns=2",
             "rollout.max_new_tokens_per_turn=8"]  # fmt: skip
    if args.quick:
        batches, prompt_len, new, episodes = [4, 8], 12, 8, [16]
    else:
        batches, prompt_len, new, episodes = [64, 256], 128, 256, [64, 256]
    modes = ["dynamic", "static"] + (["static+graph"] if device.type == "cuda" else [])
    rollout = RolloutConfig(max_new_tokens_per_turn=16 if args.quick else 128,
                            max_turns=2 if args.quick else None, max_episode_tokens=3072,
                            micro_batch_size=16)  # fmt: skip
    res: dict[str, Any] = {"tasks": tasks}
    res["one_turn"] = {b: one_turn(model, device, b, prompt_len, new, modes) for b in batches}
    res["multi_turn"] = {n: multi_turn(model, tok, device, n, tasks, modes, rollout)
                         for n in episodes}  # fmt: skip
    res["profile"] = profile_rollout(model, tok, device, episodes[0], tasks, rollout)
    if args.step:
        over = [f"model.name={args.model}", f"model.device={args.device}",
                f"tasks.names=[{','.join(tasks)}]", *(small if args.quick else []),
                *args.step_overrides.split()]  # fmt: skip
        res["step"] = paper_small_step(over)
    import transformers

    res["peak_mib"] = peak_mib(device)
    res["env"] = {
        "device": device.type,
        "card": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "model": args.model, "threads": threads,
        "command": "python " + " ".join(["benchmarks/bench_gpu.py", *(argv or sys.argv[1:])]),
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu.json").write_text(json.dumps(res, indent=1, default=str))
    (args.out / "gpu.md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
