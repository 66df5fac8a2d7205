"""The first example of docs/integrations/trl.md is examples/trl_quickstart.py, and it runs: the
doc's code block equals the example's code, which trains here (the tiny test model instead of
SmolLM2, 9 optimiser steps instead of 24) with several tasks in each generation batch, per-task
clip ranges that differ after the first batch, and a clip that binds."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trl_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "trl_quickstart.py"
DOC = ROOT / "docs" / "integrations" / "trl.md"


def example_code() -> str:
    """The example without its module docstring."""
    text = EXAMPLE.read_text()
    return text[text.index('"""', 3) + 3 :].strip()


def test_the_doc_shows_the_example() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks[0].strip() == example_code()


def test_the_example_trains_with_several_tasks_per_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, single_thread: None
) -> None:
    code = example_code()
    model = trl_run.tiny_model_dir(tmp_path / "tiny")
    for old, new in [
        ("str(ensure_smollm2())", repr(model)),
        ("max_steps=24", "max_steps=9"),
        ('output_dir="runs/trl-quickstart"', f"output_dir={str(tmp_path / 'run')!r}"),
    ]:
        assert code.count(old) == 1, old
        code = code.replace(old, new)
    scope: dict = {"__name__": "quickstart"}
    exec(compile(code, str(EXAMPLE), "exec"), scope)
    rows = [r for r in scope["trainer"].state.log_history if "loss" in r]
    assert len(rows) == 9
    eps = [{k.split("/")[2]: v for k, v in r.items() if k.endswith("/eps_low")} for r in rows]
    # controllers act once per generation batch (8 optimiser steps): first at steps 1 and 9
    assert [i + 1 for i, e in enumerate(eps) if e] == [1, 9]
    # every batch holds all three tasks, so the pacer compares them: equal at its warmup,
    # different per task from the second batch on
    assert set(eps[0]) == set(eps[8]) == {"lab2-easy", "lab2-mid", "lab2-hard"}
    assert set(eps[0].values()) == {0.2}
    assert len(set(eps[8].values())) == 3
    # the later optimiser steps of a batch see a moved policy: the clip binds somewhere
    assert rows[0]["clip_ratio/region_mean"] == 0.0  # ratio 1 on the batch's first step
    assert max(r["clip_ratio/region_mean"] for r in rows[1:8]) > 0
