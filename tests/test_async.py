"""Asynchronous rollouts (``rollout.mode: async``): the fixed bounded-staleness schedule, the
worker process, exact resume, and no process left behind however a run ends.

The runs use the real trainer on the tiny model with the lab tasks (builtin, so the spawned
worker builds them itself) or the test families of ``_async_envs`` (``rollout.worker_imports``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import psutil
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

import _async_envs  # noqa: F401  (registers letter / boom / crash here too)
from entropace.rollout.batch import RolloutBatch
from entropace.rollout.types import RolloutResult
from entropace.rollout.worker import (
    RolloutJob,
    RolloutOutput,
    RolloutWorkerError,
    output_from_state,
    output_state,
)
from entropace.train.config import ConfigError, load_config
from entropace.train.data import TaskSampler
from entropace.train.pipeline import RolloutPipeline, behaviour_version, overlapped, slots_needed
from entropace.train.threads import ThreadsConfig, plan_threads
from entropace.train.trainer import train

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
LAB = [
    "steps=4", "P=1", "G=4", "log.checkpoint_every=1", "log.keep_last=1", "log.progress=false",
    "log.tensorboard=false", "ppo.num_minibatches=2",
]  # fmt: skip
TIMING = ("time/", "tokens_per_s", "memory/")


def untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    last = sorted((run / "checkpoints").glob("step_*"))[-1]
    return load_file(str(last / "model.safetensors"))


def lab(tmp: Path, name: str, *overrides: str) -> Path:
    run = tmp / name
    train(load_config("lab", [*LAB, *overrides]), run)
    return run


def children() -> list[psutil.Process]:
    """This process's live (non-zombie) descendants, but Python's own ``resource_tracker``
    (started by the first multiprocessing queue, shared by the whole interpreter, exits with
    it: not a worker)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(
                p.cmdline()
            ):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def gone(pids: list[int], within: float = 15.0) -> bool:
    """Every pid has exited (a zombie counts: it runs nothing) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        time.sleep(0.2)
    return False


# ---------------------------------------------------------------------------------------------
# The schedule
# ---------------------------------------------------------------------------------------------


def test_behaviour_version_and_slots_by_hand() -> None:
    # k = 1: steps 1, 2 from version 0, then one version behind
    assert [behaviour_version(t, 1) for t in range(1, 6)] == [0, 0, 1, 2, 3]
    assert [behaviour_version(t, 0) for t in range(1, 5)] == [0, 1, 2, 3]  # sync's schedule
    assert [behaviour_version(t, 2, floor=5) for t in range(6, 11)] == [5, 5, 5, 6, 7]
    assert [slots_needed(k) for k in range(5)] == [1, 1, 1, 2, 3]
    # generation [1, 5], learner waited [4, 6]: 3 s of it overlapped the learner's work
    assert overlapped(1.0, 5.0, 4.0, 6.0) == 3.0
    assert overlapped(1.0, 5.0, 0.0, 5.0) == 0.0  # in-process: all of it waited for


class FakeHost:
    """A worker on a thread with a deliberately slow or fast, random pace: each job sleeps
    its drawn delay; loading a version sleeps too. Its batch records the version it held, so
    a schedule bug (a job run on the wrong weights) shows in ``policy_version``."""

    def __init__(self, delays: list[float], slots: int) -> None:
        self.delays = deque(delays)
        self.commands: deque = deque()
        self.outputs: deque[RolloutOutput] = deque()
        self.cv = threading.Condition()
        self.slot_versions: dict[int, int] = {}
        self.loaded = -1
        self.slots = slots
        self.held = -1
        self.published: list[int] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            with self.cv:
                self.cv.wait_for(lambda: self.commands)
                kind, arg = self.commands.popleft()
            if kind == "stop":
                return
            time.sleep(self.delays[0] if self.delays else 0.0)
            self.delays.rotate(-1)
            if kind == "weights":
                with self.cv:
                    self.held = self.slot_versions[arg % self.slots]
                    assert self.held == arg, "a slot was overwritten before it was loaded"
                    self.loaded = arg
                    self.cv.notify_all()
            else:
                n = len(arg.requests)
                batch = RolloutBatch(
                    *(torch.zeros(n, 1) for _ in range(6)), rewards=torch.zeros(n),
                    group_ids=torch.zeros(n, dtype=torch.long),
                    task_ids=torch.zeros(n, dtype=torch.long), task_names=["letter"],
                    success=torch.zeros(n, dtype=torch.bool),
                    abnormal=torch.zeros(n, dtype=torch.bool),
                    num_turns=torch.ones(n, dtype=torch.long),
                    policy_version=torch.full((n,), self.held, dtype=torch.long),
                )  # fmt: skip
                result = RolloutResult(batch, {}, {}, {})
                now = time.monotonic()
                with self.cv:
                    self.outputs.append(RolloutOutput(arg.step, self.held, result, now, now))
                    self.cv.notify_all()

    def publish(self, version: int, weights) -> None:
        with self.cv:
            previous = self.slot_versions.get(version % self.slots)
            self.cv.wait_for(lambda: previous is None or self.loaded >= previous)
            self.slot_versions[version % self.slots] = version
            self.published.append(version)
            self.commands.append(("weights", version))
            self.cv.notify_all()

    def submit(self, job: RolloutJob) -> None:
        with self.cv:
            self.commands.append(("job", job))
            self.cv.notify_all()

    def next_output(self) -> RolloutOutput:
        with self.cv:
            self.cv.wait_for(lambda: self.outputs)
            return self.outputs.popleft()

    def close(self) -> None:
        with self.cv:
            self.commands.append(("stop", None))
            self.cv.notify_all()
        self.thread.join()


def _sampler() -> TaskSampler:
    return TaskSampler(load_config(None, ["tasks=letter", "P=1", "G=2"]).tasks)


def _make_job(step: int, version: int, prompts: list) -> RolloutJob:
    return RolloutJob(step, version, [object()] * 2, seed=step)  # type: ignore[list-item]


@settings(max_examples=25, deadline=None)
@given(
    k=st.integers(0, 3),
    steps=st.integers(1, 7),
    delays=st.lists(st.sampled_from([0.0, 0.0005, 0.003]), min_size=1, max_size=6),
    learner=st.lists(st.sampled_from([0.0, 0.002]), min_size=1, max_size=4),
    stop_at=st.integers(1, 7),
)
def test_staleness_never_exceeds_k_whatever_the_pace(k, steps, delays, learner, stop_at) -> None:
    """With a worker slow or fast relative to the learner, every step's batch comes from
    exactly version max(t - 1 - k, 0) (so staleness <= k); a checkpoint at any step stores
    the batches of older versions and the sampler state that regenerates the rest."""
    host = FakeHost(delays, slots_needed(k))
    sampler = _sampler()
    pipe = RolloutPipeline(host, sampler, _make_job, max_staleness=k, steps=steps)
    pipe.publish(0, {})
    try:
        for t in range(1, steps + 1):
            out, m = pipe.next(t)
            assert out.step == t and out.version == behaviour_version(t, k)
            assert m["rollout/staleness_max"] == min(t - 1, k) <= k
            assert m["rollout/staleness_mean"] == min(t - 1, k)
            time.sleep(learner[t % len(learner)])  # the update
            pipe.publish(t, {})
            if t == stop_at:
                sampler_state, stored = pipe.checkpoint_state()
                assert [o.step for o in stored] == list(range(t + 1, min(t + k, steps) + 1))
                assert all(o.version < t for o in stored)
                # the next job to regenerate draws what the uninterrupted run drew
                first = t + len(stored) + 1
                assert sampler_state["position"]["letter"] == first - 1 or first > steps
    finally:
        pipe.close()
    assert host.published == sorted(set(host.published))  # each version once, in order


# ---------------------------------------------------------------------------------------------
# The real trainer
# ---------------------------------------------------------------------------------------------


class Spy:
    """Records, at each update's start, the batch and the learner's weights (version t - 1)."""

    def __init__(self) -> None:
        self.seen: list[tuple[RolloutBatch, dict[str, torch.Tensor]]] = []

    def __call__(self, original):
        def spy(learner, batch, **kw):
            weights = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
            self.seen.append((batch, weights))
            return original(learner, batch, **kw)

        return spy


@pytest.fixture(scope="module")
def lab_runs(tmp_path_factory):
    """sync, async k=0 and async k=2 (its updates spied on) on the lab preset, 4 steps each;
    no process may be left once they have returned."""
    import entropace.train.trainer as trainer_module

    tmp = tmp_path_factory.mktemp("lab")
    before = {p.pid for p in children()}
    runs = {
        "sync": lab(tmp, "sync"),
        "k0": lab(tmp, "k0", "rollout.mode=async", "rollout.max_staleness=0"),
    }
    spy, original = Spy(), trainer_module.update_step
    trainer_module.update_step = spy(original)
    try:
        runs["k2"] = lab(tmp, "k2", "P=2", "G=8", "rollout.mode=async", "rollout.max_staleness=2")
    finally:
        trainer_module.update_step = original
    runs["left"] = {p.pid for p in children()} - before
    runs["spy"] = spy
    return runs


def test_async_k0_reproduces_sync_bit_for_bit(lab_runs) -> None:
    sync, k0 = lab_runs["sync"], lab_runs["k0"]
    assert untimed(metrics(k0)) == untimed(metrics(sync))
    a, b = final_weights(sync), final_weights(k0)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    assert [r["rollout/staleness_max"] for r in metrics(k0)] == [0, 0, 0, 0]


def test_a_normal_end_leaves_no_process(lab_runs) -> None:
    assert lab_runs["left"] == set()


def test_async_k2_is_as_stale_as_scheduled(lab_runs) -> None:
    rows = metrics(lab_runs["k2"])
    assert [r["rollout/staleness_max"] for r in rows] == [0, 1, 2, 2]
    assert [r["rollout/staleness_mean"] for r in rows] == [0, 1, 2, 2]
    assert all("memory/worker_peak_rss_mib" in r and r["threads/rollout"] == 1 for r in rows)
    versions = [int(b.policy_version.unique()) for b, _ in lab_runs["spy"].seen]
    assert versions == [0, 0, 0, 1]


@pytest.mark.slow  # a second async run (a worker process: ~10-25 s on 2 loaded cores)
def test_async_k2_is_deterministic(lab_runs, tmp_path) -> None:
    again = lab(tmp_path, "k2b", "P=2", "G=8", "rollout.mode=async", "rollout.max_staleness=2")
    assert untimed(metrics(again)) == untimed(metrics(lab_runs["k2"]))
    a, b = final_weights(lab_runs["k2"]), final_weights(again)
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_behaviour_logprobs_are_the_generating_snapshots(lab_runs) -> None:
    """An async batch's old log-probs equal a recomputation under the weights of the version
    that generated it, not under the learner's newer weights."""
    from entropace.models.tiny import build_tiny_model
    from entropace.rollout.stats import sequence_token_stats

    seen = lab_runs["spy"].seen  # seen[i]: the batch of step i + 1, the learner at version i
    batch, learner_v2 = seen[2]  # step 3: generated by version 0
    assert int(batch.policy_version.unique()) == 0
    model, _ = build_tiny_model(seed=0)  # version 0: the initial weights
    assert all(torch.equal(w, seen[0][1][n]) for n, w in model.named_parameters())

    def logprobs(net):
        out = sequence_token_stats(
            net.eval(), batch.input_ids, batch.attention_mask, temperature=1.0
        )
        return out.logprob[batch.loss_mask.bool()]

    old = batch.old_logprobs[batch.loss_mask.bool()]
    torch.testing.assert_close(logprobs(model), old, atol=1e-5, rtol=0)
    assert any(not torch.equal(w, seen[0][1][n]) for n, w in learner_v2.items())
    model.load_state_dict({**model.state_dict(), **learner_v2})
    assert (logprobs(model) - old).abs().max() > 1e-4  # the learner has moved on


def test_in_flight_batches_round_trip_exactly() -> None:
    """A real rollout through the worker's / the checkpoint's format comes back equal."""
    cfg = load_config("lab", [*LAB, "steps=2"])
    from entropace.models.tiny import build_tiny_model
    from entropace.rollout import collect_rollouts
    from entropace.train.trainer import rollout_requests

    model, tok = build_tiny_model(seed=0)
    result = collect_rollouts(
        model, tok, rollout_requests(TaskSampler(cfg.tasks).next_prompts(), cfg), cfg.rollout,
        task_names=cfg.tasks.names, seed=1,
    )  # fmt: skip
    result.batch.policy_version = torch.arange(result.batch.size)
    out = RolloutOutput(3, 1, result, 1.0, 2.0, 5.0)
    from entropace.rollout.worker import from_bytes, to_bytes

    back = output_from_state(from_bytes(to_bytes(output_state(out))))
    assert (back.step, back.version, back.started, back.worker_peak_rss_mib) == (3, 1, 1.0, 5.0)
    for name in ("input_ids", "old_logprobs", "entropy", "loss_mask", "policy_version", "rewards"):
        assert torch.equal(getattr(back.result.batch, name), getattr(result.batch, name))
    assert back.result.batch.episodes == result.batch.episodes
    assert back.result.task_counts == result.task_counts

    # issue 29: a stored batch's numbers are checked on resume (a planted or damaged
    # rollouts.pt failed mid-run, or fed other steps' batches to the learner)
    from entropace.train.checkpoint import CheckpointError
    from entropace.train.pipeline import restored_outputs

    def stored(step: int, version: int, versions: torch.Tensor) -> dict:
        result.batch.policy_version = versions
        return output_state(RolloutOutput(step, version, result, 1.0, 2.0, None))

    n = result.batch.size
    good = [stored(5, 3, torch.full((n,), 3)), stored(6, 3, torch.full((n,), 3))]
    assert [o.step for o in restored_outputs(good, 4, Path("rollouts.pt"))] == [5, 6]
    bad = {
        "batch 0 is step 6 of version 3": [good[1]],
        "batch 1 is step 5 of version 3": [good[0], good[0]],
        "batch 0 is step 5 of version 4": [stored(5, 4, torch.full((n,), 4))],
        "batch 0 is step 5 of version -1": [stored(5, -1, torch.full((n,), -1))],
        r"batch 0's policy_version is outside \[0, 3\]": [stored(5, 3, torch.full((n,), 9))],
        "not the in-flight batches of a run": [{"step": 5}],
    }
    for says, states in bad.items():
        with pytest.raises(CheckpointError, match=f"rollouts.pt: {says}"):
            restored_outputs(states, 4, Path("rollouts.pt"))


# ---------------------------------------------------------------------------------------------
# Config, threads
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("rollout.mode=asink", "rollout.mode"),
        ("rollout.max_staleness=-1", "max_staleness"),
        ("rollout.max_staleness=true", "max_staleness"),
        ("threads.rollout=0", "threads.rollout"),
    ],
)
def test_bad_async_settings_fail_when_the_config_loads(override, says) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config("lab", [override])


def _plan(cfg: ThreadsConfig, **kw) -> tuple[int, int]:
    p = plan_threads(cfg, **kw)
    return p.learner, p.rollout


def test_thread_plan(monkeypatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("ENTROPACE_CPUS", raising=False)
    cfg = ThreadsConfig()
    big, small = 135_000_000, 100_000
    assert _plan(cfg, n_params=big, processes=1, cpus=2) == (2, 2)
    assert _plan(cfg, n_params=big, processes=2, cpus=2) == (1, 1)
    assert _plan(cfg, n_params=big, processes=2, cpus=8) == (4, 4)
    assert _plan(cfg, n_params=small, processes=1, cpus=8) == (1, 1)
    assert _plan(ThreadsConfig(learner=3), n_params=small, processes=2, cpus=8) == (3, 1)
    monkeypatch.setenv("ENTROPACE_CPUS", "4")  # compare --jobs: this run's share
    assert _plan(cfg, n_params=big, processes=2) == (2, 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's explicit choice
    assert _plan(cfg, n_params=big, processes=2) == (3, 3)


def test_compare_jobs_give_each_run_its_share_of_the_cores(monkeypatch) -> None:
    from entropace.report.grid import _thread_env

    monkeypatch.delenv("ENTROPACE_CPUS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    assert _thread_env(2)["ENTROPACE_CPUS"] == "2"
    assert _thread_env(8)["ENTROPACE_CPUS"] == "1"
    monkeypatch.setenv("ENTROPACE_CPUS", "2")
    child = _thread_env(2)["ENTROPACE_CPUS"]
    monkeypatch.setenv("ENTROPACE_CPUS", child)  # inside that child: 1 core, 2 processes
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    plan = plan_threads(ThreadsConfig(), n_params=135_000_000, processes=2)
    assert (plan.learner, plan.rollout) == (1, 1)


# ---------------------------------------------------------------------------------------------
# Failures: the worker's error reaches the trainer; no process is left behind
# ---------------------------------------------------------------------------------------------

LETTER = [
    "model=tiny", "P=1", "G=2", "rollout.max_new_tokens_per_turn=3",
    "rollout.max_episode_tokens=64", "ppo.epochs=1", "ppo.num_minibatches=1",
    "log.progress=false", "log.tensorboard=false", "log.checkpoint_every=1",
    "rollout.mode=async", "rollout.max_staleness=1", "rollout.worker_imports=[_async_envs]",
]  # fmt: skip


def test_an_exception_in_the_worker_names_it_and_leaves_no_process(tmp_path) -> None:
    before = {p.pid for p in children()}
    cfg = load_config(None, [*LETTER, "tasks=boom", "steps=4"])
    with pytest.raises(RolloutWorkerError, match=r"ValueError: boom at seed 2"):
        train(cfg, tmp_path / "run")
    assert {p.pid for p in children()} - before == set()
    # the checkpoint of step 1 is kept (step 2's needed the failed batch of step 3)
    assert (tmp_path / "run" / "checkpoints" / "step_00000001").is_dir()


@pytest.mark.slow  # one more worker process (~10-45 s on 2 loaded cores)
def test_an_exception_in_the_learner_leaves_no_process(tmp_path, monkeypatch) -> None:
    import entropace.train.trainer as trainer_module

    calls = []

    def fail_at_step_2(learner, batch, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # a second Ctrl-C, or any error in the learner
        return original(learner, batch, **kw)

    original = trainer_module.update_step
    monkeypatch.setattr(trainer_module, "update_step", fail_at_step_2)
    before = {p.pid for p in children()}
    with pytest.raises(KeyboardInterrupt):
        train(load_config(None, [*LETTER, "tasks=letter", "steps=4"]), tmp_path / "run")
    assert {p.pid for p in children()} - before == set()


@pytest.mark.slow  # one more worker process (~10-45 s on 2 loaded cores)
def test_a_worker_that_dies_is_named(tmp_path, capsys) -> None:
    # issue 29 item 9: the CLI printed the raw RolloutWorkerError traceback and exited 1
    from entropace.cli import main

    before = {p.pid for p in children()}
    (tmp_path / "none.yaml").write_text("{}\n")
    run = tmp_path / "run"
    args = ["--preset", str(tmp_path / "none.yaml"), *LETTER, "tasks=crash", "steps=4"]
    assert main(["train", *args, "--run-dir", str(run), "--no-report"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(
        r"entropace train: error: the rollout worker process \(pid \d+\) died with exit code "
        rf"-9 \(signal 9\); killed, out of memory\?; the checkpoints are kept: continue with "
        rf"entropace train --resume {re.escape(str(run))}",
        last,
    ), last
    assert {p.pid for p in children()} - before == set()


@pytest.mark.skipif(
    subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0,
    reason="no unprivileged mount namespaces (unshare -rm) here",
)
def test_a_full_dev_shm_names_the_remedy(tmp_path) -> None:
    # issue 29 item 10: a raw torch traceback ("unable to allocate shared memory(shm)"), exit 1;
    # a private mount namespace with a 64 KiB /dev/shm, the host's untouched
    src = Path(__file__).resolve().parents[1] / "src"
    train_cmd = [sys.executable, "-m", "entropace.cli", "train", "--preset", "lab2", "steps=1",
                 "rollout.mode=async", "eval.every=0", "--run-dir", str(tmp_path / "run")]  # fmt: skip
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs /dev/shm && exec "$@"',
         "sh", *train_cmd],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("entropace train: error: rollout.mode=async needs "), last
    assert "of shared memory in /dev/shm" in last and "train with rollout.mode=sync" in last


@pytest.mark.slow  # one more worker process (~10-30 s on 2 loaded cores)
def test_a_family_the_worker_cannot_import_is_named(tmp_path) -> None:
    from entropace.envs.toy import register_letter_envs

    register_letter_envs("letter_here_only")  # registered in this process only
    cfg = load_config(None, [*LETTER[:-1], "tasks=letter_here_only", "steps=1"])
    with pytest.raises(RolloutWorkerError, match="rollout.worker_imports"):
        train(cfg, tmp_path / "run")


# ---------------------------------------------------------------------------------------------
# The CLI: SIGTERM, Ctrl-C and kill -9, then resume
# ---------------------------------------------------------------------------------------------

CLI_LAB = [*LAB, "steps=5", "rollout.mode=async", "rollout.max_staleness=2"]


def _cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{TESTS}", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "entropace.cli", "train", *args], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def _wait_for_step(proc: subprocess.Popen, run: Path, step: int, timeout: float = 120) -> list[int]:
    """Wait until ``run`` has checkpointed ``step``; return the pids of proc's descendants."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run / "checkpoints" / f"step_{step:08d}").is_dir():
            return [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        assert proc.poll() is None, proc.stdout.read().decode()
        time.sleep(0.1)
    raise AssertionError(f"no checkpoint of step {step} within {timeout} s")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("cli") / "full"
    proc = _cli("--preset", "lab", *CLI_LAB, "--run-dir", str(run), "--no-report")
    assert proc.wait(timeout=300) == 0, proc.stdout.read().decode()
    return run


@pytest.mark.slow  # three CLI runs with a worker process each (~30-60 s on 2 loaded cores)
@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_stop_then_resume_equals_the_uninterrupted_run(uninterrupted, tmp_path, how) -> None:
    run = tmp_path / "run"
    proc = _cli("--preset", "lab", *CLI_LAB, "--run-dir", str(run), "--no-report")
    descendants = _wait_for_step(proc, run, 2)
    assert descendants, "the async run has a worker process"
    if how == "SIGINT":  # a terminal's Ctrl-C: the whole process group
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(getattr(signal, how))
    code = proc.wait(timeout=120)
    assert code == (-9 if how == "SIGKILL" else 0), proc.stdout.read().decode()
    assert gone(descendants), "a worker process outlived the run"
    resume = _cli("--resume", str(run), "--no-report")
    assert resume.wait(timeout=300) == 0, resume.stdout.read().decode()
    assert untimed(metrics(run)) == untimed(metrics(uninterrupted))
    a, b = final_weights(run), final_weights(uninterrupted)
    assert all(torch.equal(a[n], b[n]) for n in a)
