"""Time and peak extra memory of the fused LM head + token statistics against the unfused path.

Workload: ``N`` hidden states of width ``d`` (default N = 1,024, d = 576: SmolLM2-135M), an LM
head ``W [V, d]`` with V = 49,152 (SmolLM2) and 151,936 (Qwen2.5), float32 and bfloat16.

Methods:

- ``unfused``: ``z = h @ W.T`` in the input dtype (what ``model.lm_head`` returns: ``[N, V]``),
  then :func:`entropace.algos.token_stats.token_stats` (chunked) on it;
- ``fused``: :func:`entropace.algos.fused_head.hidden_token_stats` (default chunking; bfloat16
  logits formed in float32 from the bfloat16 values);
- ``fused no-upcast`` (bfloat16 only): the same with ``upcast=False`` (matmuls in bfloat16, the
  statistics of the bfloat16-rounded logits, as ``unfused``).

Modes: ``fwd``, the four statistics under ``torch.no_grad`` (the rollout's statistics pass);
``fwd+bwd``, the statistics and the gradient of ``sum(logprob + entropy)`` w.r.t. ``h`` and ``W``
(the update).

Memory: each (mode, V, dtype, method) runs in a fresh subprocess with
``MALLOC_MMAP_THRESHOLD_=65536`` (so that freed tensors leave the resident set; PyTorch's CPU
allocator has no cache). After a warm-up call the kernel's high-water mark ``VmHWM`` is reset
(``/proc/self/clear_refs``), one call is made, and ``peak extra = VmHWM - VmRSS before``: inputs
excluded; outputs, gradients (``dW`` is ``V * d`` values in the weight dtype) and all temporaries
included. Time: median of ``--repeats`` further calls in the same subprocess, wall and process CPU
time; with one intra-op thread on a shared machine the ratios use CPU time.

Run: ``python benchmarks/bench_fused_head.py --markdown benchmarks/results/fused_head.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
from torch import Tensor

VOCABS = (49_152, 151_936)
METHODS = ("unfused", "fused", "fused no-upcast")


def _stats_fn(method: str, chunk_size: int | None) -> Callable[[Tensor, Tensor, Tensor], tuple]:
    from entropace.algos.fused_head import hidden_token_stats
    from entropace.algos.token_stats import token_stats

    def unfused(h: Tensor, w: Tensor, y: Tensor) -> tuple:
        s = token_stats(h @ w.T, y)
        return s.logprob, s.entropy, s.t1, s.t2

    def fused(h: Tensor, w: Tensor, y: Tensor) -> tuple:
        s = hidden_token_stats(h, w, y, chunk_size=chunk_size, upcast=method != "fused no-upcast")
        return s.logprob, s.entropy, s.t1, s.t2

    return unfused if method == "unfused" else fused


def _call(mode: str, fn: Callable, h: Tensor, w: Tensor, y: Tensor) -> object:
    if mode == "fwd":
        with torch.no_grad():
            return fn(h, w, y)
    hh = h.detach().requires_grad_(True)
    ww = w.detach().requires_grad_(True)
    logprob, entropy, *_ = fn(hh, ww, y)
    (logprob.sum() + entropy.sum()).backward()
    return hh.grad, ww.grad


def _memory_kib() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in KiB."""
    status = open("/proc/self/status").read()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    hwm = int(re.search(r"VmHWM:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return rss, hwm


def _inputs(n: int, d: int, vocab: int, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """Hidden states of unit scale and a head giving logits of std ~3 (peaked, not one-hot)."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(n, d, generator=gen).to(dtype)
    w = (torch.randn(vocab, d, generator=gen) * (3.0 / d**0.5)).to(dtype)
    y = torch.randint(vocab, (n,), generator=gen)
    return h, w, y


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    h, w, y = _inputs(args.n, args.d, args.vocab, getattr(torch, args.dtype))
    fn = _stats_fn(args.method, args.chunk_size)
    _call(args.mode, fn, h, w, y)  # warm-up
    open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM to the current RSS
    rss_before, _ = _memory_kib()
    out = _call(args.mode, fn, h, w, y)
    _, hwm = _memory_kib()
    del out
    times, cpu_times = [], []
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        _call(args.mode, fn, h, w, y)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    print(
        json.dumps(
            {
                "median_s": statistics.median(times),
                "median_cpu_s": statistics.median(cpu_times),
                "peak_extra_mib": (hwm - rss_before) / 1024,
            }
        )
    )


def run_one(
    args: argparse.Namespace, mode: str, vocab: int, dtype: str, method: str, chunk: int | None
) -> dict:
    cmd = [
        sys.executable, __file__, "--worker", "--mode", mode, "--vocab", str(vocab),
        "--dtype", dtype, "--method", method, "--n", str(args.n), "--d", str(args.d),
        "--repeats", str(args.repeats), "--threads", str(args.threads),
    ]  # fmt: skip
    if chunk is not None:
        cmd += ["--chunk-size", str(chunk)]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--d", type=int, default=576)
    parser.add_argument("--vocabs", default=",".join(str(v) for v in VOCABS))
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--modes", default="fwd,fwd+bwd")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--chunk-sweep",
        default="64,128,256,512",
        help="fused chunk sizes (rows) timed on float32 fwd at each V ('' to skip)",
    )
    parser.add_argument("--markdown", default=None, help="also write the report to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--vocab", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--method", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--chunk-size", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    from entropace.algos.fused_head import default_head_chunk_size

    load = os.getloadavg()
    lines = [
        f"N = {args.n} tokens, d = {args.d}, torch {torch.__version__}, {args.threads} intra-op "
        f"thread(s), {os.cpu_count()} CPUs, {platform.machine()}; {args.repeats} timed calls",
        f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        "",
        "| mode | V | dtype | method | chunk rows | median wall (s) | median CPU (s) "
        "| CPU / unfused | peak extra (MiB) | memory / unfused |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in args.modes.split(","):
        for vocab in [int(v) for v in args.vocabs.split(",")]:
            for dtype in args.dtypes.split(","):
                methods = [m for m in METHODS if dtype != "float32" or m != "fused no-upcast"]
                res = {m: run_one(args, mode, vocab, dtype, m, None) for m in methods}
                base = res["unfused"]
                for m, r in res.items():
                    chunk = "-" if m == "unfused" else str(default_head_chunk_size(vocab))
                    lines.append(
                        f"| {mode} | {vocab} | {dtype} | {m} | {chunk} | {r['median_s']:.2f} | "
                        f"{r['median_cpu_s']:.2f} | "
                        f"{r['median_cpu_s'] / base['median_cpu_s']:.2f} | "
                        f"{r['peak_extra_mib']:.1f} | "
                        f"{r['peak_extra_mib'] / base['peak_extra_mib']:.3f} |"
                    )
                    print(lines[-1], flush=True)
    if args.chunk_sweep:
        lines += [
            "",
            "fused chunk-size sweep (fwd, float32; unfused at the same V for reference):",
            "",
            "| V | chunk rows | MiB per fp32 logits chunk | median wall (s) | median CPU (s) "
            "| CPU / unfused | peak extra (MiB) |",
            "|---|---|---|---|---|---|---|",
        ]
        for vocab in [int(v) for v in args.vocabs.split(",")]:
            base = run_one(args, "fwd", vocab, "float32", "unfused", None)
            for chunk in [int(c) for c in args.chunk_sweep.split(",")]:
                r = run_one(args, "fwd", vocab, "float32", "fused", chunk)
                lines.append(
                    f"| {vocab} | {chunk} | {chunk * vocab * 4 / 2**20:.1f} | "
                    f"{r['median_s']:.2f} | {r['median_cpu_s']:.2f} | "
                    f"{r['median_cpu_s'] / base['median_cpu_s']:.2f} | "
                    f"{r['peak_extra_mib']:.1f} |"
                )
                print(lines[-1], flush=True)
    load = os.getloadavg()
    lines += ["", f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"]
    report = "\n".join(lines)
    print(report)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(report + "\n")


if __name__ == "__main__":
    main()
