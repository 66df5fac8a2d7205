"""Cost of the per-step controllers, the diagnostics and the report, plus a pacer illustration.

Usage: python benchmarks/bench_controllers.py [--repeats 20] [--threads 1]
Recorded output: benchmarks/results/controllers.md
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from entropace.control import BapoClipController, EntropyPacer, PolarityController
from entropace.diagnostics import crossover_count, polarity_audit, spike_amplitude, trend_r2
from entropace.report import write_report


def _time(fn, repeats: int) -> float:
    """Median wall time in ms (the machine is shared: the median resists outliers)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def synthetic_curves(tasks: int, steps: int, seed: int = 0) -> dict[str, list[float]]:
    """Entropy curves collapsing at task-specific rates, with noise (illustration only)."""
    rng = np.random.default_rng(seed)
    s = np.arange(1, steps + 1)
    return {
        f"task{k}": list(
            np.clip(1.0 - (0.05 + 0.04 * k) * np.log(s) + 0.02 * rng.normal(size=steps), 0.05, None)
        )
        for k in range(tasks)
    }


def fake_run(root: Path, curves: dict[str, list[float]]) -> Path:
    root.mkdir(parents=True)
    pacer, papo = EntropyPacer(), PolarityController()
    with (root / "metrics.jsonl").open("w") as f:
        steps = len(next(iter(curves.values())))
        for i in range(steps):
            ent = {t: v[i] for t, v in curves.items()}
            pacer.update(ent)
            papo.update(sum(ent.values()) / len(ent))
            rec = {"step": i + 1, "entropy": sum(ent.values()) / len(ent), "loss": 1.0 / (i + 1)}
            rec.update({f"task/{t}/entropy": h for t, h in ent.items()})
            rec.update({f"task/{t}/success": 1 - h for t, h in ent.items()})
            rec.update(pacer.metrics())
            rec.update(papo.metrics())
            rec.update({"polarity/pos_mass": 0.4, "polarity/neg_mass": 0.6})
            f.write(json.dumps(rec) + "\n")
    return root


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: on a loaded shared machine, OpenMP spin-waits dominate otherwise)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(
        f"# Controllers, diagnostics and report: cost\n\nmachine: {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats}\n"
    )
    print("| operation | size | median ms |\n|---|---|---|")

    pacer = EntropyPacer()
    step = iter(range(10**9))

    def five() -> dict[str, float]:
        i = next(step)
        return pacer.update({f"t{k}": 1.0 / (1 + 0.01 * i * (k + 1)) for k in range(5)})

    print(f"| EntropyPacer.update | 5 tasks | {_time(five, args.repeats * 50):.4f} |")
    papo = PolarityController()
    print(
        f"| PolarityController.update | 1 value | {_time(lambda: papo.update(0.7), args.repeats * 50):.4f} |"
    )
    for b, length in [(32, 1024), (256, 2048)]:
        lp = torch.randn(b, length) * 0.1 - 1.0
        old = lp + torch.randn(b, length) * 0.2
        adv = torch.randn(b, 1).expand(b, length).contiguous()
        mask = (torch.rand(b, length) > 0.3).float()
        bapo = BapoClipController()
        ms = _time(lambda c=bapo, x=(lp, old, adv, mask): c.update(*x), args.repeats)
        print(
            f"| BapoClipController.update (52 candidate bounds) | {b}x{length} tokens | {ms:.2f} |"
        )
    p = torch.randn(200_000)
    dh = 0.2 * p + torch.randn(200_000)
    print(
        f"| polarity_audit | 200k tokens | {_time(lambda: polarity_audit(p, dh), args.repeats):.2f} |"
    )
    curves = synthetic_curves(5, 1000)
    print(
        f"| crossover_count (EMA 0.9) | 5 tasks x 1000 steps | "
        f"{_time(lambda: crossover_count(curves, ema=0.9), args.repeats):.2f} |"
    )
    print(
        f"| trend_r2 + spike_amplitude | 5 tasks x 1000 steps | "
        f"{_time(lambda: (trend_r2(curves), spike_amplitude(curves)), args.repeats):.2f} |"
    )
    with tempfile.TemporaryDirectory() as tmp:
        a = fake_run(Path(tmp) / "a", curves)
        b = fake_run(Path(tmp) / "b", synthetic_curves(5, 1000, seed=1))
        start = time.perf_counter()
        write_report([a, b], Path(tmp) / "report")
        print(
            f"| write_report (5 figures, md/html/json) | 2 runs x 5 tasks x 1000 steps | "
            f"{(time.perf_counter() - start) * 1e3:.0f} |"
        )

    print("\n## Pacer illustration (synthetic curves, not a training result)\n")
    print("h_k(s) = 1 - (0.05 + 0.04 k) log s + noise, 200 steps; defaults of EntropyPacer.\n")
    print("| task | collapse rate | final m_k | final z_k | final eps_k |\n|---|---|---|---|---|")
    pacer = EntropyPacer()
    curves = synthetic_curves(5, 200)
    for i in range(200):
        pacer.update({t: v[i] for t, v in curves.items()})
    for k, (t, snap) in enumerate(pacer.snapshot().items()):
        print(
            f"| {t} | {0.05 + 0.04 * k:.2f} | {snap['m']:.4f} | {snap['z']:+.3f} | {snap['eps_low']:.4f} |"
        )
    assert math.isfinite(snap["eps_low"])


if __name__ == "__main__":
    main()
