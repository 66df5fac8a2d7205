"""Checks any environment family must pass: run episodes, score policies, probe robustness.

Used by the test suite for every family, and by users who add their own environments::

    from entropace.envs import make
    from entropace.envs.checks import check_env, oracle_success_rate

    check_env(make("db"), seed=0)            # raises EnvCheckError on any violation
    oracle_success_rate("db", range(50))     # 1.0 for a correct family
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from entropace.envs.base import Policy, TurnLimit
from entropace.envs.registry import make, spec

#: Actions every family must survive without raising (plus family-specific ones in its tests).
HOSTILE_ACTIONS: tuple[str, ...] = (
    "",
    " ",
    "\n\n\n",
    "\x00\x01\x02",
    "a" * 100_000,
    "Answer:",
    "SQL:",
    "answer()",
    "rm -rf / --no-preserve-root",
    ":(){ :|:& };:",
    "DROP TABLE users; --",
    "'; DROP TABLE x; --",
    "get_relations(",
    "search[",
    "click[]",
    "]]]][[[[",
    "{{{{}}}}",
    "😀" * 1000,
    "\\" * 500,
    "%s%s%s%n",
    "None",
    "null",
    "-1",
    "1e309",
)


class EnvCheckError(AssertionError):
    """An environment violated the protocol of :mod:`entropace.envs.base`."""


@dataclass
class Episode:
    """One played episode."""

    seed: int
    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    reset_info: dict[str, Any] = field(default_factory=dict)
    last_info: dict[str, Any] = field(default_factory=dict)
    reset_seconds: float = 0.0
    step_seconds: list[float] = field(default_factory=list)

    @property
    def total_reward(self) -> float:
        return float(sum(self.rewards))


def run_episode(env: TurnLimit, policy: Policy, seed: int) -> Episode:
    """Play one episode of ``env`` (seed ``seed``) with ``policy`` until it ends.

    Records the wall time of ``reset`` and of each ``step`` (the policy's time excluded).
    """
    t0 = time.perf_counter()
    obs, info = env.reset(seed)
    ep = Episode(seed=seed, observations=[obs], reset_info=info)
    ep.reset_seconds = time.perf_counter() - t0
    while True:
        action = policy(obs)
        t0 = time.perf_counter()
        obs, reward, terminated, truncated, info = env.step(action)
        ep.step_seconds.append(time.perf_counter() - t0)
        ep.actions.append(action)
        ep.observations.append(obs)
        ep.rewards.append(reward)
        ep.success = ep.success or bool(info.get("success", False))
        ep.last_info = info
        if terminated or truncated:
            ep.terminated, ep.truncated = terminated, truncated
            return ep


def oracle_success_rate(name: str, seeds: Iterable[int], **options: Any) -> float:
    """Fraction of ``seeds`` the family's scripted oracle solves (a fresh env per seed)."""
    s = spec(name)
    seeds = list(seeds)
    solved = 0
    for seed in seeds:
        env = make(name, **options)
        env.reset(seed)
        policy = s.oracle(env)
        ep = run_episode(env, policy, seed)
        solved += int(ep.success)
    return solved / max(1, len(seeds))


def _check_step_result(result: Any, where: str) -> None:
    if not (isinstance(result, tuple) and len(result) == 5):
        raise EnvCheckError(f"{where}: step must return a 5-tuple, got {type(result).__name__}")
    obs, reward, terminated, truncated, info = result
    if not isinstance(obs, str):
        raise EnvCheckError(f"{where}: observation must be str, got {type(obs).__name__}")
    if not isinstance(reward, float) or reward != reward:
        raise EnvCheckError(f"{where}: reward must be a finite float, got {reward!r}")
    if not isinstance(info, dict) or "success" not in info or "parse_error" not in info:
        raise EnvCheckError(f"{where}: info must be a dict with 'success' and 'parse_error'")
    if info["success"] and not terminated:
        raise EnvCheckError(f"{where}: success=True on a step that did not terminate")


def check_env(
    env: TurnLimit,
    seed: int = 0,
    actions: Sequence[str] = HOSTILE_ACTIONS,
    *,
    max_observation_chars: int = 20_000,
) -> None:
    """Probe ``env`` with ``actions`` (one fresh episode per action, then all in one episode).

    Raises :class:`EnvCheckError` when the environment raises, returns malformed results,
    returns an observation longer than ``max_observation_chars``, rewards a hostile action with
    success, does not truncate at ``max_turns``, or gives a different instance for the same seed.
    """
    obs0, info0 = env.reset(seed)
    obs0_again, info0_again = env.reset(seed)
    if obs0 != obs0_again or info0.get("gold") != info0_again.get("gold"):
        raise EnvCheckError(f"{env.name}: reset({seed}) is not deterministic")
    for action in actions:
        env.reset(seed)
        where = f"{env.name} seed={seed} action={action[:40]!r}"
        try:
            result = env.step(action)
        except Exception as exc:  # noqa: BLE001 - any exception is a protocol violation
            raise EnvCheckError(f"{where}: step raised {type(exc).__name__}: {exc}") from exc
        _check_step_result(result, where)
        if len(result[0]) > max_observation_chars:
            raise EnvCheckError(f"{where}: observation has {len(result[0])} characters")
        if result[4]["success"]:
            raise EnvCheckError(f"{where}: a hostile action solved the instance")
    # Turn limit: a policy that never finishes must be truncated at max_turns.
    env.reset(seed)
    rng = random.Random(seed)
    for turn in range(1, env.max_turns + 1):
        result = env.step(rng.choice(actions))
        _check_step_result(result, f"{env.name} turn {turn}")
        if result[2]:  # terminated early (e.g. a wrong final answer ends the episode): fine
            return
        if turn == env.max_turns and not result[3]:
            raise EnvCheckError(f"{env.name}: not truncated after max_turns={env.max_turns}")
