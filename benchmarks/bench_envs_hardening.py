"""Before/after timings of the environment hardening (issue 9), measured side by side.

* ``os`` sandbox: one command in a fresh sandbox with the code of ``--before`` (read from git),
  with the current code in bwrap-only mode (``unshare=None``: bytes capped, inodes not), and
  with the current default (the outer ``unshare`` step that mounts inode-capped tmpfs). The
  three variants run interleaved, round after round, so load changes hit them alike.
* parsers: ``strip_sql`` and ``normalize_answer`` of ``--before`` vs now on the issue's
  adversarial shapes at growing sizes (best of 5; the old ones run once above 32 KiB and are
  skipped at 1 MiB, where they take 29 s and 12 s).

* with ``--flood``: peak host kernel memory while one command creates 400,000 empty files,
  with and without the inode caps.
* with ``--shmem REV``: host ``Shmem`` (/proc/meminfo) while the memory attacks of issue 21
  run (``/dev/shm`` and ``/dev`` filled, memfds held), with the code of ``REV`` (its sandbox,
  supervisor and session modules, read from git) and now, in both shell modes.

Run: ``python benchmarks/bench_envs_hardening.py --before 6811e00 --rounds 30 --flood``
(issue 21: ``--shmem 3e9e8c5 --rounds 0``)
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = (
    "ls -la",
    "find . -type f | wc -l",
    "grep -rh ' ERROR ' logs | sort | head -n 3",
    "echo note > note.txt && wc -c note.txt",
)


def _old_module(
    rev: str, path: str, name: str, renames: dict[str, str] | None = None
) -> types.ModuleType:
    """A module of revision ``rev`` loaded under another name; ``renames`` rewrites the
    module names it imports (to other old modules loaded so)."""
    source = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    for old, new in (renames or {}).items():
        source = source.replace(f"from {old} import", f"from {new} import")
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses look the module up while the class is built
    exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)  # noqa: S102
    return module


def _ms(xs: list[float]) -> str:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]
    return f"{statistics.median(xs) * 1e3:.1f} / {p95 * 1e3:.1f}"


def bench_sandbox(rev: str, rounds: int) -> list[str]:
    from entropace.envs.os.env import OsEnv
    from entropace.envs.os.sandbox import Sandbox, SandboxLimits, _require

    old = _old_module(rev, "src/entropace/envs/os/sandbox.py", "old_sandbox")
    bwrap, host_uid, unshare = _require()
    env = OsEnv("medium")
    env.reset(3)
    state = env.state
    boxes: dict[str, Any] = {
        f"before ({rev})": old.Sandbox(old.SandboxLimits(), bwrap=bwrap, host_uid=host_uid),
        "now, bwrap-only fallback": Sandbox(SandboxLimits(), bwrap=bwrap, host_uid=host_uid),
        "now (default: inode-capped mounts)": Sandbox(
            SandboxLimits(), bwrap=bwrap, host_uid=host_uid, unshare=unshare
        ),
    }
    times: dict[str, list[float]] = {k: [] for k in boxes}
    for _ in range(rounds):
        for command in COMMANDS:
            for name, box in boxes.items():
                start = time.perf_counter()
                result = box.run(command, state)
                times[name].append(time.perf_counter() - start)
                assert result.error is None, (name, command, result.error)
    rows = [
        "| variant | ms per command (median / p95) | ratio to before (medians) |",
        "|---|---|---|",
    ]
    base = statistics.median(times[f"before ({rev})"])
    for name, xs in times.items():
        rows.append(f"| {name} | {_ms(xs)} | {statistics.median(xs) / base:.2f} |")
    return rows


def bench_parsers(rev: str) -> list[str]:
    from entropace.envs.db.sandbox import strip_sql
    from entropace.envs.os.actions import normalize_answer

    old_db = _old_module(rev, "src/entropace/envs/db/sandbox.py", "old_db_sandbox")
    old_os = _old_module(rev, "src/entropace/envs/os/actions.py", "old_os_actions")
    rows = ["| function | input | chars | before (ms) | now (ms) |", "|---|---|---|---|---|"]
    cases = (
        ("strip_sql", "SELECT 1 + ' ;' x n", lambda n: "SELECT 1" + " ;" * n, old_db.strip_sql, strip_sql),
        ("normalize_answer", "42 + \"'.\" x n", lambda n: "42" + "'." * n, old_os.normalize_answer, normalize_answer),
    )  # fmt: skip
    for name, shape, make, before, now in cases:
        for n in (4_000, 16_000, 64_000, 524_280):
            text = make(n)
            times = []
            for fn in (before, now) if n <= 64_000 else (now,):
                best = math.inf
                for _ in range(1 if fn is before and n > 16_000 else 5):  # best of 5 (noisy box)
                    start = time.perf_counter()
                    out = fn(text)
                    best = min(best, time.perf_counter() - start)
                    assert out in ("SELECT 1", "42")
                times.append(best)
            old_ms = f"{times[0] * 1e3:.1f}" if len(times) == 2 else "(skipped: quadratic)"
            rows.append(
                f"| `{name}` | `{shape}` | {len(text):,} | {old_ms} | {times[-1] * 1e3:.3f} |"
            )
    return rows


def _kernel_kib() -> int:
    """Slab + Shmem of the whole host (/proc/meminfo), KiB: where tmpfs inodes and data live."""
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return int(fields["Slab"].split()[0]) + int(fields["Shmem"].split()[0])


def _sample(done: Any, peak: list[int]) -> None:
    while not done.is_set():
        peak[0] = max(peak[0], _kernel_kib())
        time.sleep(0.01)


def bench_file_flood() -> list[str]:
    """Peak host kernel memory while one command creates 400,000 empty files in /work and
    in /tmp (sampled every 10 ms; global, so other jobs on the machine add noise)."""
    import threading

    from entropace.envs.os.sandbox import Sandbox, SandboxLimits, _require, empty_state

    bwrap, host_uid, unshare = _require()
    command = (
        "for d in /work /tmp; do cd $d && seq 400000 | xargs touch 2>/dev/null; ls | wc -l; done"
    )
    rows = ["| variant | files made (/work, /tmp) | peak growth of Slab+Shmem (MiB) | outcome |",
            "|---|---|---|---|"]  # fmt: skip
    for name, outer in (("inode-capped (default)", unshare), ("bwrap --tmpfs fallback", None)):
        box = Sandbox(SandboxLimits(timeout_s=20.0), bwrap=bwrap, host_uid=host_uid, unshare=outer)
        base = _kernel_kib()
        peak = [base]
        done = threading.Event()

        thread = threading.Thread(target=_sample, args=(done, peak))
        thread.start()
        result = box.run(command, empty_state())
        done.set()
        thread.join()
        made = ", ".join(result.output.decode().split()) or "-"
        outcome = result.error or f"kept (exit {result.exit_code})"
        rows.append(f"| {name} | {made} | {(peak[0] - base) / 1024:.0f} | {outcome[:70]} |")
    return rows


def _shmem_kib() -> int:
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return int(fields["Shmem"].split()[0])


# Issue 21's attacks, scaled to finish in seconds: 100 x 8 MiB into /dev/shm, 6,000 files under
# /dev, and a python3 that holds 64 memfds of 8 MiB (in the background, for 20 s).
_FILL = (
    "for i in $(seq 100); do head -c 8M /dev/zero > /dev/shm/f$i 2>/dev/null || break; done; "
    "mkdir -p /dev/x 2>/dev/null && (cd /dev/x && seq 6000 | xargs touch) 2>/dev/null; "
)
_HOLD = (
    'python3 -c \'import os, time\nfds = []\nfor _ in range(64):\n try:\n  f = os.memfd_create("m")'
    "\n  os.write(f, bytes(8 << 20)); fds.append(f)\n except OSError: break\n"
    "print(len(fds), flush=True); time.sleep(20)' "
)


def bench_shmem(rev: str) -> list[str]:
    """Growth of host Shmem: peak during one fresh-mode command (which holds the memfds for
    1 s), and 1 s after a persistent-shell command returned (its memfd holder in the
    background), before (``rev``) and now. Global, so other jobs on the machine add noise."""
    import threading

    from entropace.envs.os.sandbox import Sandbox, SandboxLimits, _require, empty_state
    from entropace.envs.os.session import ShellSession
    from entropace.envs.os.worktree import build_archive

    old_box = _old_module(rev, "src/entropace/envs/os/sandbox.py", "old_sandbox")
    _old_module(rev, "src/entropace/envs/os/supervisor.py", "old_supervisor",  # for old_ses
                          {"entropace.envs.os.sandbox": "old_sandbox"})  # fmt: skip
    old_ses = _old_module(rev, "src/entropace/envs/os/session.py", "old_session",
                          {"entropace.envs.os.sandbox": "old_sandbox",
                           "entropace.envs.os.supervisor": "old_supervisor"})  # fmt: skip
    bwrap, host_uid, unshare = _require()
    variants = [
        (f"before ({rev})", old_box.Sandbox, old_box.SandboxLimits, old_ses.ShellSession, unshare),
        ("now", Sandbox, SandboxLimits, ShellSession, unshare),
        ("now, bwrap-only fallback", Sandbox, SandboxLimits, ShellSession, None),
    ]
    rows = ["| variant | fresh: peak growth during the command (MiB) | memfds made | "
            "persistent: growth held after the command (MiB) | memfds made |",
            "|---|---|---|---|---|"]  # fmt: skip
    fresh_cmd = _FILL + _HOLD.replace("time.sleep(20)", "time.sleep(1)")
    for name, box_cls, limits_cls, session_cls, outer in variants:
        box = box_cls(limits_cls(timeout_s=30.0), bwrap=bwrap, host_uid=host_uid, unshare=outer)
        base = _shmem_kib()
        peak = [base]
        done = threading.Event()

        def sample(done: Any = done, peak: list[int] = peak) -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _shmem_kib())
                time.sleep(0.01)

        thread = threading.Thread(target=sample)
        thread.start()
        result = box.run(fresh_cmd, empty_state())
        done.set()
        thread.join()
        made_fresh = result.output.decode().strip().splitlines()[-1:] or ["-"]
        time.sleep(1.0)
        base = _shmem_kib()
        session = session_cls(box, build_archive([]))
        try:
            wait = "for _ in $(seq 500); do [ -s /work/n ] && break; sleep 0.02; done"
            out = session.run(f"{_FILL} ({_HOLD} > /work/n &); {wait}; cat /work/n").output
            time.sleep(1.0)
            held = _shmem_kib() - base
        finally:
            session.close()
        made = out.decode().strip().splitlines()[-1:] or ["-"]
        rows.append(f"| {name} | {(peak[0] - base) / 1024:.0f} | {made_fresh[0]} | "
                    f"{held / 1024:.0f} | {made[0]} |")  # fmt: skip
        time.sleep(1.0)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", default="6811e00", help="git revision of the 'before' code")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--flood", action="store_true", help="also the 400k-file flood (~1 min)")
    parser.add_argument("--shmem", metavar="REV", help="also issue 21's memory attacks")
    args = parser.parse_args()
    print("# Environment hardening: before / after\n")
    flood = " --flood" if args.flood else ""
    flood += f" --shmem {args.shmem}" if args.shmem else ""
    print(f"Command: `python benchmarks/bench_envs_hardening.py --before {args.before} "
          f"--rounds {args.rounds}{flood}`\n")  # fmt: skip
    bwrap = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
    print(f"Machine: {platform.machine()}, Linux {platform.release()}, Python "
          f"{platform.python_version()}, {bwrap}, {os.cpu_count()} CPUs.\n")  # fmt: skip
    if args.rounds > 0:
        print(f"## `os`: one command in a fresh sandbox ({args.rounds} rounds x {len(COMMANDS)} "
              "commands, medium seed 3, interleaved)\n")  # fmt: skip
        print("\n".join(bench_sandbox(args.before, args.rounds)))
        print("\n## Parsers on adversarial input\n")
        print("\n".join(bench_parsers(args.before)))
    if args.shmem:
        print("\n## `os`: host Shmem under the memory attacks of issue 21\n")
        print("\n".join(bench_shmem(args.shmem)))
    if args.flood:
        print("\n## `os`: one command creating 400,000 empty files (20 s limit)\n")
        print("\n".join(bench_file_flood()))
    print(f"\nLoad average at the end: {os.getloadavg()[0]:.1f}.")


if __name__ == "__main__":
    main()
