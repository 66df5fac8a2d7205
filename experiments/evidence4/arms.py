"""Evidence IV's arms, pilots and seeds: the one definition that the runner (``grid.py``), the
analysis (``analyse.py``) and the test of the arms (``tests/test_evidence4_arms.py``) read.

Every arm is ``entropace train --preset lab3`` with a recipe and overrides. Each arm names its
comparator and the lever it changes against it; the test resolves both configs and checks that
they differ in exactly that lever (issue 35: Evidence III's EPPO and GRPO also differed in their
aggregation). Controls vary by seed: the shuffled pacer draws its permutations from (run seed,
step).
"""

from __future__ import annotations

from dataclasses import dataclass

#: lab v3 (docs/lab.md), 40 steps: the preset every arm runs
PRESET = "lab3"
STEPS = 40
TASKS = ("lab2-easy", "lab2-mid", "lab2-hard")
#: staleness of the asynchronous regime (AgentRL's), as in Evidence III
ASYNC = ("rollout.mode=async", "rollout.max_staleness=2")
#: EPPO's pacer range in the calibrated arms: fast-tight's bounds (0.1 on the fast task, 0.4 on
#: the slow one), so that the pacer can reach the dose of the per-task positive control
DOSE_RANGE = ("algorithm.pacer.eps_min=0.1", "algorithm.pacer.eps_max=0.4")


@dataclass(frozen=True)
class Arm:
    """One arm: ``algo`` + ``overrides`` on :data:`PRESET`; against ``comparator`` it changes
    exactly ``lever`` (dotted config keys; ``()`` for a reference arm)."""

    name: str
    algo: str
    overrides: tuple[str, ...] = ()
    comparator: str | None = None
    lever: tuple[str, ...] = ()

    def args(self, seed: int) -> list[str]:
        """The ``entropace train`` overrides of this arm's run of ``seed``."""
        return [f"algo={self.algo}", f"seed={seed}", *self.overrides]


def dose(alpha: float) -> tuple[str, ...]:
    """The pacer overrides of a dose: ``alpha`` over :data:`DOSE_RANGE`."""
    return (f"algorithm.pacer.alpha={alpha}", *DOSE_RANGE)


DOSE_KEYS = ("algorithm.pacer.alpha", "algorithm.pacer.eps_min", "algorithm.pacer.eps_max")
FAST_TIGHT = "algorithm.task_bounds={lab2-easy: [0.1, 0.1], lab2-hard: [0.4, 0.4]}"
FAST_WIDE = "algorithm.task_bounds={lab2-easy: [0.4, 0.4], lab2-hard: [0.1, 0.1]}"

# ------------------------------------------------------------------------------------- pilots
#: Dose calibration (issue 35, item 4): pilot seeds, never experiment seeds
PILOT_SEEDS = (9201, 9202, 9203)
PILOT_ALPHAS = (0.6, 0.8, 0.95)
PILOT_ARMS = (
    Arm("grpo", "grpo"),
    Arm("fast-tight", "grpo", (FAST_TIGHT,), "grpo", ("algorithm.task_bounds",)),
    Arm("eppo", "eppo", (), "grpo", ("algorithm.clip_rule",)),
    *(
        Arm(f"eppo-a{a}", "eppo", dose(a), "eppo", DOSE_KEYS)
        for a in PILOT_ALPHAS
    ),
    Arm("grpo-async2", "grpo", ASYNC, "grpo", ("rollout.mode", "rollout.max_staleness")),
    Arm("eppo-a0.8-async2", "eppo", (*dose(0.8), *ASYNC), "grpo-async2",
        ("algorithm.clip_rule", *DOSE_KEYS)),
)  # fmt: skip

#: PAPO's phase controller (issue 35, item 3): Evidence III's PAPO favoured contraction while the
#: tasks collapsed (its phase EMA, beta 0.95, lags a collapse that halves the entropy in 5
#: steps). Pilots of faster phase signals, on the pilot seeds, against the pilots' grpo.
PAPO_PILOT_ARMS = (
    Arm("papo", "papo", (), "grpo", ("algorithm.papo",)),
    Arm("papo-b0.5", "papo", ("algorithm.polarity.beta=0.5",), "papo",
        ("algorithm.polarity.beta",)),
    Arm("papo-b0.5-ks5", "papo", ("algorithm.polarity.beta=0.5", "algorithm.polarity.kappa_slope=5"),
        "papo", ("algorithm.polarity.beta", "algorithm.polarity.kappa_slope")),
)  # fmt: skip
