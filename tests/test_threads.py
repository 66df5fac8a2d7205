"""OpenMP wait policy (``entropace.train.threads.default_wait_policy``), set by the command line
before torch loads; the user's own choice wins; spawned children inherit it.

The subprocess tests read the policy from the OpenMP runtime itself: with
``OMP_DISPLAY_ENV=VERBOSE`` GNU OpenMP (torch's ``libgomp``) prints its settings to stderr when
it starts, i.e. when torch is imported, once per process. ``GOMP_SPINCOUNT`` is how long an idle
thread spins before it sleeps: ``0`` with ``OMP_WAIT_POLICY=PASSIVE``, ``300000`` by default,
``30000000000`` with ``ACTIVE``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from entropace.train.threads import (
    WAIT_MARK_ENV,
    WAIT_VARS,
    ThreadPlan,
    default_wait_policy,
    wait_policy,
)

SRC = str(Path(__file__).resolve().parents[1] / "src")
PASSIVE, DEFAULT, ACTIVE = "0", "300000", "30000000000"  # libgomp's GOMP_SPINCOUNT

# Records OMP_WAIT_POLICY at the moment torch is first imported, runs the given code, then
# imports torch (if the code did not) so that its OpenMP runtime starts in every case.
SPY = """
import json, os, sys
seen = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.append(os.environ.get("OMP_WAIT_POLICY"))
sys.meta_path.insert(0, Spy())
{code}
import torch  # noqa: F401
print(json.dumps({{"at_torch_import": seen[0], "env": {{k: os.environ.get(k) for k in
                   ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")}}}}))
"""


def _run(code: str, **env: str) -> tuple[dict, list[str]]:
    """Run ``code`` in a fresh interpreter without any wait-policy variable (plus ``env``);
    returns what it printed and the ``GOMP_SPINCOUNT`` of every OpenMP runtime that started
    (this process's and its children's), as the runtime itself reported it."""
    clean = {k: v for k, v in os.environ.items() if k not in (*WAIT_VARS, WAIT_MARK_ENV)}
    clean.update(PYTHONPATH=SRC, OMP_NUM_THREADS="1", OMP_DISPLAY_ENV="VERBOSE", **env)
    out = subprocess.run(
        [sys.executable, "-c", SPY.format(code=code)], env=clean, capture_output=True,
        text=True, timeout=120, check=True,
    )  # fmt: skip
    spins = re.findall(r"GOMP_SPINCOUNT = '(\d+)'", out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1]), spins


CLI = "from entropace.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"


def test_the_command_line_sets_passive_before_torch_loads() -> None:
    res, spins = _run(CLI)
    # torch (and its OpenMP runtime) loaded with the variable already set ...
    assert res["at_torch_import"] == "PASSIVE"
    assert res["env"]["OMP_WAIT_POLICY"] == "PASSIVE"
    # ... and the runtime took it: idle threads sleep at once
    assert spins == [PASSIVE]


def test_without_the_command_line_openmp_spins() -> None:
    # the reference the test above is read against: a plain ``import torch`` spins
    res, spins = _run("pass")
    assert res["env"]["OMP_WAIT_POLICY"] is None
    assert spins == [DEFAULT]


def test_nothing_set_when_torch_came_first() -> None:
    res, spins = _run(
        "import torch\nfrom entropace.train.threads import default_wait_policy as d\nd()"
    )
    assert res["at_torch_import"] is None  # too late to matter: left alone
    assert res["env"]["OMP_WAIT_POLICY"] is None
    assert spins == [DEFAULT]


@pytest.mark.parametrize(
    "var, value, spin",
    [("OMP_WAIT_POLICY", "ACTIVE", ACTIVE), ("GOMP_SPINCOUNT", "1000", "1000"),
     ("KMP_BLOCKTIME", "0", DEFAULT)],
)  # fmt: skip
def test_the_users_choice_wins(var: str, value: str, spin: str) -> None:
    res, spins = _run(CLI, **{var: value})
    assert res["env"][var] == value
    if var != "OMP_WAIT_POLICY":  # not added next to the user's own setting
        assert res["env"]["OMP_WAIT_POLICY"] is None
    # KMP_BLOCKTIME is the Intel runtime's; GNU OpenMP ignores it (a user's choice all the same)
    assert spins == [spin]


def test_spawned_children_inherit_the_policy() -> None:
    # as the async rollout worker (torch.multiprocessing's "spawn") and `entropace compare`'s
    # runs (subprocesses with the parent's environment) are started: the parent ran the command
    # line's entry point, the child imports torch afresh
    code = CLI + (
        "\nimport multiprocessing, importlib\n"
        "if __name__ == '__main__':\n"
        "    p = multiprocessing.get_context('spawn').Process(target=importlib.import_module,"
        " args=('torch',))\n"
        "    p.start(); p.join(); assert p.exitcode == 0\n"
    )
    _, spins = _run(code)
    assert spins == [PASSIVE, PASSIVE]  # the parent's runtime, then the child's
    _, spins = _run(code, GOMP_SPINCOUNT="1000")
    assert spins == ["1000", "1000"]


def test_the_plan_says_which_policy_and_who_chose_it(monkeypatch) -> None:
    for var in (*WAIT_VARS, WAIT_MARK_ENV):
        monkeypatch.delenv(var, raising=False)
    assert "torch" in sys.modules  # in this process the runtime has started: nothing changes
    assert default_wait_policy().startswith("OpenMP's default wait policy (spinning")
    assert "OMP_WAIT_POLICY" not in os.environ
    assert WAIT_MARK_ENV not in os.environ
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv(WAIT_MARK_ENV, "1")
    assert wait_policy() == "OMP_WAIT_POLICY=PASSIVE (entropace's default)"
    monkeypatch.setenv("GOMP_SPINCOUNT", "100")
    assert wait_policy() == "OMP_WAIT_POLICY=PASSIVE, GOMP_SPINCOUNT=100 (set by the user)"
    monkeypatch.delenv("GOMP_SPINCOUNT")
    # a child of an entropace process (mark inherited) whose user then asked for ACTIVE
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert wait_policy() == "OMP_WAIT_POLICY=ACTIVE (set by the user)"
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.delenv(WAIT_MARK_ENV)
    assert wait_policy() == "OMP_WAIT_POLICY=PASSIVE (set by the user)"
    plan = ThreadPlan(learner=2, rollout=2, reason="2 cores / 1 process")
    assert plan.describe() == (
        "torch threads: learner 2, rollout worker 2 (2 cores / 1 process); "
        "OMP_WAIT_POLICY=PASSIVE (set by the user)"
    )
