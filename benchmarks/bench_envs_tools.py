"""Step latency of the tool-calling interface next to the text interface, per family.

    python benchmarks/bench_envs_tools.py [--episodes 30] [--families db,kg,...]

For each family (medium difficulty), the same oracle episodes are played through the text
interface and through ``interface="tools"`` (the oracle's actions written as ``<tool_call>``
JSON), interleaved episode by episode so that machine noise hits both alike. Reported: median
and p95 step time of each, their ratio, the oracle success of both, and the cost of the call
parser alone on typical and on huge hostile replies.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import time

from entropace.envs import make, spec
from entropace.envs.base import MAX_ACTION_CHARS
from entropace.envs.checks import run_episode
from entropace.envs.tools import ToolCall, format_tool_call, parse_tool_calls, tool_oracle


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _episode(family: str, interface: str, seed: int) -> tuple[list[float], bool]:
    env = make(family, interface=interface, difficulty="medium")
    env.reset(seed)
    oracle = spec(family).oracle
    policy = tool_oracle(oracle)(env) if interface == "tools" else oracle(env)
    ep = run_episode(env, policy, seed)
    close = getattr(env, "close", None)
    if callable(close):
        close()
    return ep.step_seconds, ep.success


def _parser_rows() -> list[tuple[str, str]]:
    typical = "I will run the query.\n" + format_tool_call(
        ToolCall("execute_sql", {"query": "SELECT name FROM artists WHERE artist_id < 10"})
    )
    return [
        ("typical call (~100 chars)", typical),
        (f"{MAX_ACTION_CHARS} chars of '<tool_call>'", "<tool_call>" * (MAX_ACTION_CHARS // 11)),
        (f"{MAX_ACTION_CHARS} chars nested '['", "<tool_call>" + "[" * (MAX_ACTION_CHARS - 11)),
        (
            f"{MAX_ACTION_CHARS} chars of one string argument",
            format_tool_call(ToolCall("bash_action", {"script": "x" * (MAX_ACTION_CHARS - 80)})),
        ),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=30)
    ap.add_argument("--families", default="db,kg,reasoning,household,shop,os")
    args = ap.parse_args()
    families = [f for f in args.families.split(",") if f != "os" or shutil.which("bwrap")]
    print(f"python {platform.python_version()} on {platform.machine()}, {args.episodes} episodes")
    print()
    print(
        "| family | text step median (ms) | tools step median (ms) | ratio tools/text "
        "| text p95 (ms) | tools p95 (ms) | oracle success text / tools |"
    )
    print("|---|---|---|---|---|---|---|")
    for family in families:
        _episode(family, "text", 0)  # warm caches (graph, catalogue, databases)
        _episode(family, "tools", 0)
        steps: dict[str, list[float]] = {"text": [], "tools": []}
        solved = {"text": 0, "tools": 0}
        for seed in range(args.episodes):
            for interface in ("text", "tools") if seed % 2 == 0 else ("tools", "text"):
                seconds, ok = _episode(family, interface, seed)
                steps[interface] += seconds
                solved[interface] += ok
        text_med = statistics.median(steps["text"]) * 1e3
        tools_med = statistics.median(steps["tools"]) * 1e3
        print(
            f"| {family} | {text_med:.3f} | {tools_med:.3f} | {tools_med / text_med:.2f} "
            f"| {pct(steps['text'], 0.95) * 1e3:.3f} | {pct(steps['tools'], 0.95) * 1e3:.3f} "
            f"| {solved['text'] / args.episodes:.2f} / {solved['tools'] / args.episodes:.2f} |"
        )
    print()
    print("| reply parsed by parse_tool_calls | median (ms) over 50 |")
    print("|---|---|")
    for label, reply in _parser_rows():
        times = []
        for _ in range(50):
            t = time.perf_counter()
            parse_tool_calls(reply)
            times.append(time.perf_counter() - t)
        print(f"| {label} | {statistics.median(times) * 1e3:.3f} |")


if __name__ == "__main__":
    main()
