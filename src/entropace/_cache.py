"""Location of entropace's local cache (built databases, converted models, generated games)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$ENTROPACE_CACHE`` (default ``~/.cache/entropace``) joined with ``parts``, created."""
    root = Path(os.environ.get("ENTROPACE_CACHE", Path.home() / ".cache" / "entropace"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
