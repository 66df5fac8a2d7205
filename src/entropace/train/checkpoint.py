"""Atomic, keep-last-k checkpoints that resume a run exactly.

``RUN/checkpoints/step_XXXXXXXX/`` holds:

* ``model.safetensors``: the trainable weights (all of them; for LoRA the adapter only),
  saved with ``safetensors`` (shared/tied tensors handled);
* ``optim.pt``: optimiser and LR-scheduler state dicts (``torch.save``);
* ``rng.pt``: python, numpy and torch RNG states;
* ``state.json``: step, data position, controllers' state dicts, skipped-step count (any
  JSON-serialisable trainer state).

Writing goes to a temporary sibling directory; every file is fsynced, then the directory is
renamed into place (atomic on POSIX) and the parent fsynced. A crash therefore leaves either
the previous checkpoints or the new one, never a partial one. Older checkpoints beyond
``keep_last`` are deleted after the new one is in place. A model with a non-finite weight is
never written (:class:`NonFiniteCheckpointError`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

PREFIX = "step_"


class NonFiniteCheckpointError(RuntimeError):
    """Refusing to checkpoint a model whose weights hold NaN/inf."""


def _safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError as exc:
        raise ImportError("checkpoints need safetensors: pip install 'entropace[train]'") from exc
    return safetensors.torch


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.is_dir() and p.name.startswith(PREFIX) and (p / "state.json").exists()
    ]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002 (the global state is what we restore)
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights a checkpoint holds: the LoRA adapter for peft models, else everything."""
    if _is_peft(model):
        from peft import get_peft_model_state_dict

        return dict(get_peft_model_state_dict(model))
    return model.state_dict()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    root: Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: dict[str, Any],
    keep_last: int = 2,
) -> Path:
    """Write checkpoint ``step`` under ``root`` atomically; prune to ``keep_last``.

    Args:
        state: JSON-serialisable trainer state (controllers, data position, counters).

    Raises:
        NonFiniteCheckpointError: a weight is NaN/inf (nothing is written).
    """
    st = _safetensors()
    weights = model_state(model)
    bad = [k for k, v in weights.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise NonFiniteCheckpointError(
            f"not checkpointing step {step}: non-finite weights in {bad[:5]}"
        )
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(step)
    tmp = root / f".tmp-{checkpoint_name(step)}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if _is_peft(model):
        st.save_file(
            {k: v.detach().contiguous() for k, v in weights.items()}, tmp / "model.safetensors"
        )
    else:
        st.save_model(model, str(tmp / "model.safetensors"))
    torch.save(
        {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optim.pt"
    )
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=1))
    for f in tmp.iterdir():
        _fsync(f)
    _fsync(tmp)
    if final.exists():  # re-saving the same step (e.g. stop right after a periodic save)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(root)
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(
    path: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load weights (and optimiser, scheduler, RNG) from ``path``; return ``state.json``."""
    st = _safetensors()
    if not (path / "state.json").exists():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no state.json)")
    if _is_peft(model):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, st.load_file(str(path / "model.safetensors")))
    else:
        st.load_model(model, str(path / "model.safetensors"), strict=True)
    if optimizer is not None or scheduler is not None:
        optim = torch.load(path / "optim.pt", weights_only=False)
        if optimizer is not None:
            optimizer.load_state_dict(optim["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(optim["scheduler"])
    if restore_rng:
        set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    return json.loads((path / "state.json").read_text())
