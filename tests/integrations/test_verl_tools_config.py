"""The verl tool config YAML and dataset rows (``integrations.verl.tool_config``): no verl needed.

Runs in both environments (the main suite and the verl venv). What verl does with the file is
in ``test_verl_tools.py`` (verl's own ``initialize_tools_from_config``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from entropace.envs import make, seeds
from entropace.integrations.verl import tool_config as tc


def test_command_line_writes_the_yaml(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "t.yaml"
    options = '{"os": {"shell": "persistent"}}'
    assert tc.main(["--families", "db,os", "--out", str(out), "--options", options]) == 0
    loaded = yaml.safe_load(out.read_text())
    assert loaded == tc.tool_config(["db", "os"], options={"os": {"shell": "persistent"}})
    assert [e["config"]["env"] for e in loaded["tools"]] == ["db"] * 2 + ["os"] * 3
    assert {e["class_name"] for e in loaded["tools"]} == {tc.CLASS_NAME}
    assert json.loads(loaded["tools"][2]["config"]["options"]) == {"shell": "persistent"}
    # each entry's schema is the family's, in the family's order
    schemas = make("db", interface="tools").tools + make("os", interface="tools").tools
    assert [e["tool_schema"] for e in loaded["tools"]] == schemas
    assert "wrote 5 tools" in capsys.readouterr().out
    with pytest.raises(ValueError, match="also"):
        tc.tool_config(["db", "db"])


def test_dataset_rows_name_the_instance_and_the_tools() -> None:
    rows = tc.dataset_rows(["db", "kg"], 2, split="test", profile="agentbench")
    assert [r["data_source"] for r in rows] == ["db", "db", "kg", "kg"]
    for row, seed in zip(rows, [*seeds("test", 2)] * 2, strict=True):
        family = row["data_source"]
        env = make(family, profile="agentbench")
        observation, info = env.reset(seed)
        names = [t["function"]["name"] for t in env.tools]
        assert row["agent_name"] == tc.AGENT_NAME
        assert row["prompt"] == [
            {"role": "system", "content": env.system_prompt},
            {"role": "user", "content": observation},
        ]
        assert row["extra_info"]["tool_selection"] == names
        assert row["extra_info"]["tools_kwargs"] == {
            n: {"create_kwargs": {"seed": seed}} for n in names
        }
        assert row["reward_model"]["ground_truth"] == str(info["gold"])
