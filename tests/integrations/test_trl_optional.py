"""The TRL extra is optional: without ``trl``, ``entropace`` imports and the integration says
which extra to install (runs whether or not ``trl`` is installed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_without_trl_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['trl'] = None\n"  # makes `import trl` raise ImportError
        "import entropace, entropace.integrations\n"
        "try:\n"
        "    import entropace.integrations.trl\n"
        "except ImportError as exc:\n"
        "    print('MSG', exc)\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "pip install 'entropace[trl]'" in out.stdout
