"""benchmarks/bench_gpu.py end to end on the CPU (tiny model, small sizes): the structure of
its results and the values that must hold on any device."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"


def _load() -> Any:
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_gpu_runs_on_the_cpu(tmp_path: Path, single_thread: None) -> None:
    bench = _load()
    out = tmp_path / "gpu"
    assert bench.main(["--device", "cpu", "--model", "tiny", "--quick",
                       "--tasks", "household,lab-easy", "--out", str(out)]) == 0  # fmt: skip
    res = json.loads((out / "gpu.json").read_text())
    md = (out / "gpu.md").read_text()
    assert "CPU (tiny model)" in md and "the GPU run is pending" in md
    assert res["env"]["device"] == "cpu" and res["env"]["transformers"]
    # one turn: every row runs every step (the stop id is outside the vocabulary)
    for batch, rows in res["one_turn"].items():
        assert set(rows) == {"generate/dynamic", "generate/static", "engine/dynamic",
                             "engine/static"}  # fmt: skip
        for name, r in rows.items():
            assert r["steps"] == 8 and r["generated_tokens"] == int(batch) * 8, name
            assert r["same_tokens_as_generate"] is True, name  # float32 CPU: bit for bit
            assert r["tokens_per_s"] == pytest.approx(r["generated_tokens"] / r["wall_s"])
    # multi-turn: the counted tokens are the loss-mask tokens; both caches sample the same
    for rows in res["multi_turn"].values():
        assert set(rows) == {"dynamic", "static"}
        for r in rows.values():
            assert r["generated_tokens"] == r["loss_mask_tokens"] > 0
            assert r["turns"] > 16  # some episodes took a second turn
        assert rows["dynamic"]["ids_hash"] == rows["static"]["ids_hash"]
    step = res["step"]
    assert step["step_s"] == pytest.approx(step["rollout_s"] + step["update_s"])
    assert step["generation_s"] + step["env_s"] + step["stats_s"] <= step["rollout_s"]
    assert step["episodes"] == 8 and step["update_tokens_per_s"] > 0
    prof = res["profile"]
    assert prof["decoding_steps"] > 0 and prof["host_reads_per_step"] >= 0
    assert res["peak_mib"] > 0
