"""Two processes (torchrun + gloo on the CPU, launched by ``accelerate launch``) against one.

The same global batch: 2 ranks x 4 completions (one prompt group each) vs 1 rank x 8, with a
``rollout_func`` whose completions depend only on (prompt, index in group), so both layouts
train on the same tokens (different within a group, different lengths), ``eppo+papo`` for
2 steps. Every rank must
hold the same controller state, equal to the one-process run's (float round-off of the reduced
sums apart), and the PAPO advantages of the two ranks together must equal the one-process
batch's (the ``sum |A|``-preserving factor is the global one, not each rank's).
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("accelerate")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trl_run  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "trl_run.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(cmd: list[str], out: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert (out / "rank0.json").exists(), result.stderr[-3000:]


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        return {
            k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}/{key}").items()
        }
    if isinstance(value, list):
        return {
            k: v for i, item in enumerate(value) for k, v in _flat(item, f"{prefix}[{i}]").items()
        }
    return {prefix: value}


def _assert_close(a: Any, b: Any, tol: float) -> None:
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    for key in fa:
        if isinstance(fa[key], float):
            assert math.isclose(fa[key], fb[key], rel_tol=tol, abs_tol=tol), key
        else:
            assert fa[key] == fb[key], key


def test_two_processes_hold_the_one_process_state(tmp_path: Path) -> None:
    model_dir = trl_run.tiny_model_dir(tmp_path / "tiny")
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    common = ["--model-dir", model_dir, "--algorithm", "eppo+papo", "--steps", "2"]
    common += ["--fixed-completions"]
    _run([sys.executable, str(SCRIPT), *common, "--out", str(one), "--per-device", "8"], one)
    launch = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(_free_port()),
    ]  # fmt: skip
    _run([*launch, str(SCRIPT), *common, "--out", str(two), "--per-device", "4"], two)

    ref = json.loads((one / "rank0.json").read_text())
    ranks = [json.loads((two / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ref["world"] == 1
    assert [r["world"] for r in ranks] == [2, 2]
    assert [r["backend"] for r in ranks] == ["gloo", "gloo"]
    # every rank holds exactly the same controller state and logged the same metrics
    assert ranks[0]["state"] == ranks[1]["state"]
    assert ranks[0]["log"] == ranks[1]["log"]
    assert ranks[0]["state"]["rule"]["steps"] == 2
    # ... equal to the one-process run on the same global batch
    _assert_close(ranks[0]["state"], ref["state"], 1e-4)
    _assert_close(ranks[0]["log"], ref["log"], 1e-4)
    eps = ranks[0]["log"][1]
    assert eps["entropace/task/arith/eps_low"] != pytest.approx(eps["entropace/task/chat/eps_low"])
    # PAPO: the ranks' (B, T) advantages together are the one-process batch's
    for step in range(2):
        joined = ranks[0]["advantages"][step] + ranks[1]["advantages"][step]
        _assert_close(joined, ref["advantages"][step], 2e-5)
