"""The main job's training step alone and beside busy background processes, side by side.

Question (issue 31): does a training run thrash when other processes share the cores? Each
measurement is a fresh ``entropace train`` process (``python -m entropace.cli train``, so the
command line's entry point runs as a user's would) with ``PYTHONPATH=<tree>/src``, on a short
fixed workload of the quick preset (SmolLM2-135M from its warm start, db + kg, its LoRA
adapter, rollout and update settings; ``WORKLOAD`` below: one step, G = 4, no held-out
evaluation), timed by the trainer itself (``time/step`` of every step in ``metrics.jsonl``;
model loading, the warm start (built once into ``ENTROPACE_CACHE`` before the first
measurement) and the final checkpoint are outside it).

Each variant (a source tree, plus environment variables and config overrides) runs ``--reps``
pairs: alone, and beside ``--busy`` background processes, in alternating order (alone first,
then loaded first on the next repetition), variants interleaved, so that every pair sees the
same background. The background processes are single-threaded CPU spinners
(``python -c 'while True: pass'``), started 1 s before the run and killed after it, in the
run's own session: Linux with ``kernel.sched_autogroup_enabled=1`` (the default on desktop
distributions and on this machine) shares the CPU fairly between sessions first, then between
the threads of a session, so spinners in the run's session compete thread against thread
(the fair share below); ``--own-session`` starts each in a session of its own, like another
user's job, and the run's whole session then gets ``c / (b + 1)`` cores.

Reported per run: the step times, the threads the run logged (``threads/*``), the run's
process CPU time (``wait4`` rusage), the background processes' CPU time, the CPU time the rest
of the machine used meanwhile (``/proc/stat`` busy time minus ours: other people's work), and
the load average before the run. Per variant: the slowdown (loaded / alone) of each pair and
their median, against the fair-share slowdown

    F = min(t, c) / (t * min(1, c / (t + b)))

for a job that uses ``t`` threads alone beside ``b`` busy single-thread processes on ``c``
cores, if the scheduler gave each runnable thread an equal share (alone the job gets
``min(t, c)`` cores; loaded each of its threads gets ``min(1, c / (t + b))`` of a core). With
t = c = 2 and b = 2: F = 2. Issue 31's goal: slowdown <= 1.3 F.

Run (passive: the command line's default; spinning: libgomp's own default, kept because the
user set a wait-policy variable, here the Intel runtime's ``KMP_BLOCKTIME`` that GNU OpenMP
ignores): ``python benchmarks/bench_load.py --variant passive . --variant spinning .
KMP_BLOCKTIME=200 --reps 2 --markdown benchmarks/results/load.md``. Two source trees side by
side: ``--variant before /tmp/base --variant after . --reps 3``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: The fixed workload: the quick preset's first step with G = 4 (2 prompts per task: 16
#: episodes), no held-out evaluation, no trackers, no progress bar, no report. The
#: update trains the groups with reward variance, as the main job's does: with the same
#: threads the same tokens are sampled in every run (``response_tokens`` tells), so every run
#: does the same work.
WORKLOAD = [
    "steps=1", "tasks.mix={}", "tasks.group_size=4", "log.trackers=[]", "log.progress=false",
    "log.checkpoint_every=0", "log.optimizer_state=last", "eval.every=0",
]  # fmt: skip
SPINNER = "while True: pass"


def fair_share(threads: int, busy: int, cpus: int, own_session: bool = False) -> float:
    """Fair-share slowdown ``F`` (module docstring); with ``own_session`` the spinners are
    sessions of their own and the run's session gets ``c / (b + 1)`` cores (or what the
    spinners, one core each at most, leave)."""
    if own_session:
        return min(threads, cpus) / min(threads, max(cpus / (busy + 1), cpus - busy))
    return min(threads, cpus) / (threads * min(1.0, cpus / (threads + busy)))


def proc_stat_busy() -> float:
    """Seconds of CPU time the whole machine has spent busy (``/proc/stat``: everything but
    idle and iowait; steal counts as busy: a core the hypervisor took is not ours)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])  # guest time is already in user
    return (total - idle) / os.sysconf("SC_CLK_TCK")


def pid_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(
    tree: Path, env: dict[str, str], overrides: list[str], busy: int, own_session: bool
) -> dict[str, Any]:
    """One ``entropace train`` run of the workload beside ``busy`` spinners."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", SPINNER], start_new_session=own_session)
        for _ in range(busy)
    ]
    try:
        if spinners:
            time.sleep(1.0)
        with tempfile.TemporaryDirectory(prefix="bench_load_") as tmp:
            run_dir = Path(tmp) / "run"
            child_env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
            child_env.update(PYTHONPATH=str(tree / "src"), **env)
            cmd = [sys.executable, "-m", "entropace.cli", "train", "--preset", "quick",
                   *WORKLOAD, *overrides, "--run-dir", str(run_dir), "--no-report"]  # fmt: skip
            load = os.getloadavg()
            spin0 = [pid_cpu(s.pid) for s in spinners]
            busy0, w0 = proc_stat_busy(), time.perf_counter()
            with open(Path(tmp) / "stderr", "w") as err:
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=child_env)
                _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - w0
            spin = sum(pid_cpu(s.pid) - c for s, c in zip(spinners, spin0, strict=True))
            machine = proc_stat_busy() - busy0
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit(f"{cmd} failed:\n{(Path(tmp) / 'stderr').read_text()[-3000:]}")
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    cpu = usage.ru_utime + usage.ru_stime
    out: dict[str, Any] = {
        "step_s": [r["time/step"] for r in rows],
        "generation_s": [r["time/generation"] for r in rows],
        "update_s": [r["time/update"] for r in rows],
        "response_tokens": [r.get("response_tokens") for r in rows],
        "trained_rows_frac": [r.get("update/trained_rows_frac") for r in rows],
        "threads": {k: [r[k] for r in rows] for k in rows[0] if k.startswith("threads/")},
        "process_s": wall,
        "cpu_s": cpu,
        "spinners_cpu_s": spin,
        "others_cores": max(0.0, machine - cpu - spin) / wall,  # other people's work
        "load1": load[0],
        "busy": busy,
    }
    return out


def parse_variant(spec: list[str]) -> tuple[str, Path, dict[str, str], list[str]]:
    """``NAME TREE [ENV=VALUE | key.sub=value ...]``: upper-case keys are environment
    variables, the others config overrides."""
    if len(spec) < 2:
        raise SystemExit(f"--variant needs NAME TREE, got {spec}")
    name, tree, rest = spec[0], Path(spec[1]).resolve(), spec[2:]
    env = dict(x.split("=", 1) for x in rest if x.split("=", 1)[0].isupper())
    overrides = [x for x in rest if not x.split("=", 1)[0].isupper()]
    return name, tree, env, overrides


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--variant", action="append", nargs="+", required=True,
                   metavar="NAME TREE [KEY=VALUE]")  # fmt: skip
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--busy", type=int, default=2)
    p.add_argument("--own-session", action="store_true", help="each spinner in its own session")
    p.add_argument("--alone-only", nargs="*", default=[], metavar="NAME",
                   help="variants measured alone only (their quiet-machine speed)")  # fmt: skip
    p.add_argument("--json", type=Path, help="append every run's row to this JSON-lines file")
    p.add_argument("--markdown", type=Path)
    args = p.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    cpus = len(os.sched_getaffinity(0))
    rows: list[dict[str, Any]] = []
    for rep in range(args.reps):
        for i, (name, tree, env, overrides) in enumerate(variants):
            order = (0, args.busy) if (rep + i) % 2 == 0 else (args.busy, 0)
            if name in args.alone_only:
                order = (0,)
            for busy in order:
                res = one_run(tree, env, overrides, busy, args.own_session)
                res.update(variant=name, rep=rep + 1)
                rows.append(res)
                print(json.dumps(res), flush=True)
                if args.json:
                    with args.json.open("a") as fh:
                        fh.write(json.dumps(res) + "\n")
    text = markdown(rows, variants, args, cpus)
    print(text)
    if args.markdown:
        args.markdown.write_text(
            "# The main job's step alone and beside busy processes\n\n"
            f"Command: `python benchmarks/bench_load.py {' '.join(sys.argv[1:])}`\n\n" + text + "\n"
        )
    return 0


def markdown(rows: list[dict[str, Any]], variants: list[Any], args: Any, cpus: int) -> str:
    try:
        autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
    except OSError:
        autogroup = "?"
    where = "each in its own session" if args.own_session else "in the run's session"
    lines = [
        f"python {platform.python_version()}, {cpus} cores, sched_autogroup_enabled="
        f"{autogroup}; {args.busy} background spinners (`python -c '{SPINNER}'`, {where}) "
        f"in the loaded runs; workload `entropace train --preset "
        f"quick {' '.join(WORKLOAD)}`; step time = the trainer's `time/step`, summed over the "
        "steps.",
        "",
        "Variants: "
        + "; ".join(
            f"**{n}** = `{t}`"
            + (f" {' '.join(f'{k}={v}' for k, v in e.items())}" if e else "")
            + (f" `{' '.join(o)}`" if o else "")
            for n, t, e, o in variants
        ),
        "",
        "| variant | rep | busy | step s (sum) | steps s | generation s | update s | threads "
        "| run CPU s | spinners CPU s | others' cores | load1 before |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        threads = ", ".join(
            f"{k[8:]} {'/'.join(str(x) for x in v)}" for k, v in r["threads"].items()
        )
        lines.append(
            f"| {r['variant']} | {r['rep']} | {r['busy']} | {sum(r['step_s']):.1f} | "
            f"{' / '.join(f'{x:.1f}' for x in r['step_s'])} | "
            f"{sum(r['generation_s']):.1f} | {sum(r['update_s']):.1f} | {threads} | "
            f"{r['cpu_s']:.1f} | {r['spinners_cpu_s']:.1f} | {r['others_cores']:.2f} | "
            f"{r['load1']:.2f} |"
        )
    lines += [
        "",
        "| variant | alone s (median) | loaded s (median) | slowdown per pair | median slowdown "
        "| fair share F | slowdown / F |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, *_ in variants:
        alone = [r for r in rows if r["variant"] == name and r["busy"] == 0]
        loaded = [r for r in rows if r["variant"] == name and r["busy"] > 0]
        if not loaded:
            med_alone = statistics.median(sum(r["step_s"]) for r in alone)
            lines.append(f"| {name} | {med_alone:.1f} | - | - | - | - | - |")
            continue
        ratios = [sum(b["step_s"]) / sum(a["step_s"]) for a, b in zip(alone, loaded, strict=True)]
        t = max(max(v) for k, v in alone[0]["threads"].items() if k == "threads/learner")
        f = fair_share(t, args.busy, cpus, args.own_session)
        med = statistics.median(ratios)
        lines.append(
            f"| {name} | {statistics.median(sum(r['step_s']) for r in alone):.1f} | "
            f"{statistics.median(sum(r['step_s']) for r in loaded):.1f} | "
            f"{', '.join(f'{x:.2f}' for x in ratios)} | {med:.2f} | {f:.2f} (t={t}) | "
            f"{med / f:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
