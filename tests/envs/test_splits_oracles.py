"""The scripted oracles solve every instance of every split, through every interface.

household and shop: 20 seeds per (split, difficulty, interface), text / tools / the
``agentbench`` profile; os (real sandbox): 4 seeds per (split, difficulty) in the text
interface with lenient scoring and in the ``agentbench`` profile (tools, persistent shell,
AgentBench scoring), which covers every held-out kind on test_unseen.
"""

from __future__ import annotations

import pytest

from entropace.envs import make
from entropace.envs.base import DIFFICULTIES
from entropace.envs.registry import seeds, spec
from entropace.envs.tools import tool_oracle

SPLIT_NAMES = ("train", "test", "test_unseen")
INTERFACES = (
    {"interface": "text"},
    {"interface": "tools"},
    {"profile": "agentbench"},
)


def _solve(env, family: str, seed: int, tools: bool) -> tuple[bool, str]:
    obs, info = env.reset(seed)
    build = tool_oracle(spec(family).oracle) if tools else spec(family).oracle
    policy = build(env)
    while True:
        obs, _reward, terminated, truncated, info = env.step(policy(obs))
        if terminated or truncated:
            return bool(info["success"]), obs[:200]


@pytest.mark.parametrize("how", INTERFACES, ids=lambda h: "-".join(h.values()))
@pytest.mark.parametrize("family", ["household", "shop"])
@pytest.mark.parametrize("split", SPLIT_NAMES)
def test_oracle_solves_every_split(family: str, split: str, how: dict) -> None:
    failed = []
    tools = how.get("interface") == "tools" or how.get("profile") == "agentbench"
    for difficulty in DIFFICULTIES:
        env = make(family, difficulty=difficulty, **how)
        for seed in seeds(split, 20):  # type: ignore[arg-type]
            ok, last = _solve(env, family, int(seed), tools)
            if not ok:
                failed.append((difficulty, int(seed), last))
    assert failed == []


@pytest.mark.parametrize("split", SPLIT_NAMES)
@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_os_oracle_solves_every_split(difficulty: str, split: str) -> None:
    failed = []
    for how, tools in (({"scoring": "lenient"}, False), ({"profile": "agentbench"}, True)):
        env = make("os", difficulty=difficulty, **how)
        for seed in seeds(split, 4):  # type: ignore[arg-type]
            ok, last = _solve(env, "os", int(seed), tools)
            if not ok:
                failed.append((how, int(seed), env.task.kind, last))
        env.close()
    assert failed == []
