"""The verl extra is optional: without verl, ``import entropace`` and the library work.

Run in a fresh process with ``verl`` made unimportable (so this also holds where verl is
installed). Never skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys

CODE = r"""
import importlib.abc, json, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "verl" or name.startswith("verl."):
            raise ImportError(f"blocked: {name}")
        return None

sys.meta_path.insert(0, Block())
import entropace
import entropace.algos, entropace.control, entropace.envs
import entropace.integrations.verl as v
from entropace.integrations.verl import plugin
print(json.dumps({
    "verl_loaded": any(m == "verl" or m.startswith("verl.") for m in sys.modules),
    "version": v.VERL_VERSION,
    "registered": plugin.REGISTERED,
    "failed": sorted(plugin.FAILED),
}))
"""


def test_entropace_imports_without_verl() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=180, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["verl_loaded"] is False
    assert result["version"] == "0.9.1"
    # the plug-in module itself never raises: every part reports why it is missing
    assert result["registered"] == {}
    assert result["failed"] == ["agent_loop", "losses", "trainer"]
