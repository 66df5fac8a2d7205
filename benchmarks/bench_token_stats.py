"""Time and peak extra memory of ``token_stats`` against two baselines (CPU).

Methods, on ``[N, V]`` logits (default N = 2,048 tokens, V = 49,152), float32 and bfloat16 input:

- ``log_softmax+gather``: ``torch.log_softmax(z, -1, dtype=float32).gather(...)``, the log-probs
  alone (what a plain policy-gradient loss needs);
- ``naive fp32 (4 stats)``: the four statistics straight from the formulas on full-vocabulary
  float32 tensors (``x = z.float(); logp = log_softmax(x); p = exp(logp); ...``);
- ``token_stats``: :func:`entropace.algos.token_stats.token_stats` (chunked, default chunk size).

Memory method: each (method, dtype) runs in a fresh subprocess. PyTorch's CPU allocator has no
cache: tensors come from ``malloc``. The subprocess runs with ``MALLOC_MMAP_THRESHOLD_=65536``,
which fixes glibc's mmap threshold (by default it grows after the first free, and freed chunks
then stay resident in the heap), so every tensor over 64 KiB is ``mmap``-ed and unmapped on free
and the resident set follows live tensor memory. After a warm-up call the kernel's high-water mark
``VmHWM`` is reset (``echo 5 > /proc/self/clear_refs``), one call is made, and
``peak extra = VmHWM - VmRSS before the call``: inputs excluded, outputs and every temporary
included, however short-lived. (tracemalloc does not see torch's allocations.)

Time: median of ``--repeats`` calls after the warm-up, in the same subprocess, both wall time and
process CPU time. With one intra-op thread (the default here: the machine is shared), CPU time is
the less load-sensitive of the two; the ratios in the table use CPU time.

Run: ``python benchmarks/bench_token_stats.py`` (add ``--markdown FILE`` to write the report).
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

METHODS = ("log_softmax+gather", "naive fp32 (4 stats)", "token_stats")
BACKWARD_METHODS = ("naive fp32 fwd+bwd", "token_stats fwd+bwd")


def _naive_fp32(z: Tensor, y: Tensor) -> tuple[Tensor, ...]:
    x = z.float()
    logp = torch.log_softmax(x, dim=-1)
    p = logp.exp()
    entropy = -(p * logp).sum(-1)
    idx = y[:, None]
    logprob = logp.gather(1, idx)[:, 0]
    p_y = p.gather(1, idx)[:, 0]
    t1 = p_y * (entropy + logprob)
    t2 = (p * p * (entropy[:, None] + logp)).sum(-1)
    return logprob, entropy, t1, t2


def _fwd_bwd(stats_fn: Callable[[Tensor, Tensor], tuple[Tensor, ...]]) -> Callable:
    """``d/dz sum(logprob + entropy)``: the gradient a PAPO/EPPO loss with an entropy term needs."""

    def run(z: Tensor, y: Tensor) -> Tensor:
        leaf = z.detach().requires_grad_(True)
        logprob, entropy, *_ = stats_fn(leaf, y)
        (logprob + entropy).sum().backward()
        return leaf.grad  # type: ignore[return-value]

    return run


def _method(name: str, chunk_size: int | None) -> Callable[[Tensor, Tensor], object]:
    from entropace.algos.token_stats import token_stats

    def chunked(z: Tensor, y: Tensor) -> tuple[Tensor, ...]:
        s = token_stats(z, y, chunk_size=chunk_size)
        return s.logprob, s.entropy, s.t1, s.t2

    table: dict[str, Callable[[Tensor, Tensor], object]] = {
        "log_softmax+gather": lambda z, y: torch.log_softmax(z, -1, dtype=torch.float32).gather(
            1, y[:, None]
        ),
        "naive fp32 (4 stats)": _naive_fp32,
        "token_stats": chunked,
        "naive fp32 fwd+bwd": _fwd_bwd(_naive_fp32),
        "token_stats fwd+bwd": _fwd_bwd(chunked),
    }
    return table[name]


def _memory_kib() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in KiB."""
    status = open("/proc/self/status").read()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    hwm = int(re.search(r"VmHWM:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return rss, hwm


def _make_inputs(n: int, vocab: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(0)
    z = torch.empty(n, vocab, dtype=dtype)
    for start in range(0, n, 64):  # row blocks: no full-size float32 temporary for bf16
        z[start : start + 64] = 2.0 * torch.randn(min(64, n - start), vocab, generator=gen)
    y = torch.randint(vocab, (n,), generator=gen)
    return z, y


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    z, y = _make_inputs(args.n, args.vocab, getattr(torch, args.dtype))
    fn = _method(args.method, args.chunk_size)
    fn(z, y)  # warm-up
    open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM to the current RSS
    rss_before, _ = _memory_kib()
    out = fn(z, y)
    _, hwm = _memory_kib()
    del out
    times, cpu_times = [], []
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn(z, y)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    print(
        json.dumps(
            {
                "method": args.method,
                "dtype": args.dtype,
                "chunk_size": args.chunk_size,
                "median_s": statistics.median(times),
                "median_cpu_s": statistics.median(cpu_times),
                "peak_extra_mib": (hwm - rss_before) / 1024,
            }
        )
    )


def run_one(args: argparse.Namespace, method: str, dtype: str, chunk_size: int | None) -> dict:
    cmd = [
        sys.executable, __file__, "--worker", "--method", method, "--dtype", dtype,
        "--n", str(args.n), "--vocab", str(args.vocab), "--repeats", str(args.repeats),
        "--threads", str(args.threads),
    ]  # fmt: skip
    if chunk_size is not None:
        cmd += ["--chunk-size", str(chunk_size)]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument(
        "--chunk-sweep",
        default="4,8,16,32,64,128,512",
        help="extra token_stats chunk sizes timed on float32 ('' to skip)",
    )
    parser.add_argument(
        "--backward-n",
        type=int,
        default=512,
        help="tokens for the forward+backward comparison (float32; 0 to skip)",
    )
    parser.add_argument("--markdown", default=None, help="also write the report to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--chunk-size", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    from entropace.algos.token_stats import default_chunk_size

    load_before = os.getloadavg()
    lines = [
        f"N = {args.n} tokens, V = {args.vocab}, torch {torch.__version__}, "
        f"{args.threads} intra-op thread(s), {os.cpu_count()} CPUs, {platform.processor() or '?'}",
        f"default chunk size = {default_chunk_size(args.vocab)} rows; "
        f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}",
        "",
        "| input | method | median wall (s) | median CPU (s) | CPU time / (a) "
        "| peak extra memory (MiB) | memory / (b) |",
        "|---|---|---|---|---|---|---|",
    ]
    for dtype in args.dtypes.split(","):
        results = {m: run_one(args, m, dtype, None) for m in METHODS}
        t_a = results["log_softmax+gather"]["median_cpu_s"]
        m_b = results["naive fp32 (4 stats)"]["peak_extra_mib"]
        for m, r in results.items():
            lines.append(
                f"| {dtype} | {m} | {r['median_s']:.3f} | {r['median_cpu_s']:.3f} | "
                f"{r['median_cpu_s'] / t_a:.2f} | {r['peak_extra_mib']:.1f} | "
                f"{r['peak_extra_mib'] / m_b:.3f} |"
            )
        print("\n".join(lines[-len(results) :]), flush=True)
    if args.backward_n:
        bwd_args = argparse.Namespace(**{**vars(args), "n": args.backward_n})
        lines += ["", f"forward + backward of sum(logprob + entropy), float32 input, "
                  f"N = {args.backward_n} tokens (the gradient itself is "
                  f"{args.backward_n * args.vocab * 4 / 2**20:.0f} MiB):", "",
                  "| method | median wall (s) | median CPU (s) | peak extra memory (MiB) |",
                  "|---|---|---|---|"]  # fmt: skip
        for m in BACKWARD_METHODS:
            r = run_one(bwd_args, m, "float32", None)
            lines.append(
                f"| {m} | {r['median_s']:.3f} | {r['median_cpu_s']:.3f} | "
                f"{r['peak_extra_mib']:.1f} |"
            )
            print(lines[-1], flush=True)
    if args.chunk_sweep:
        lines += ["", "token_stats chunk-size sweep (float32 input):", "",
                  "| chunk rows | MiB per fp32 buffer | median wall (s) | median CPU (s) "
                  "| peak extra memory (MiB) |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for cs in [int(c) for c in args.chunk_sweep.split(",")]:
            r = run_one(args, "token_stats", "float32", cs)
            lines.append(
                f"| {cs} | {cs * args.vocab * 4 / 2**20:.1f} | {r['median_s']:.3f} | "
                f"{r['median_cpu_s']:.3f} | {r['peak_extra_mib']:.1f} |"
            )
            print(lines[-1], flush=True)
    load_after = os.getloadavg()
    lines.append("")
    lines.append(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    report = "\n".join(lines)
    print(report)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(report + "\n")


if __name__ == "__main__":
    main()
