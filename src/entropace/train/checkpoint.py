"""Atomic, keep-last-k checkpoints that resume a run exactly.

``RUN/checkpoints/step_XXXXXXXX/`` holds:

* ``model.safetensors``: the trainable weights (all of them; for LoRA the adapter only),
  saved with ``safetensors`` (shared/tied tensors handled);
* ``optim.pt``: the optimiser's state dict (``torch.save`` of tensors and plain values); with
  ``optimizer_state="last"`` only the newest checkpoint keeps it (AdamW's moments are twice
  the weights' size: 1.08 GB of the quick preset's 1.6 GB checkpoint), the older ones hold
  what ``eval`` and reports need but cannot be resumed from (:func:`load_checkpoint` says so);
* ``rng.pt``: python, numpy and torch RNG states, as tensors and plain values;
* ``rollouts.pt`` (``async`` runs): the finished in-flight rollout batches the run needs next
  (:mod:`entropace.train.pipeline`), as tensors and plain values;
* ``state.json``: step, the resolved config, the LR schedule's position
  (``scheduler_steps``), data position, controllers' state dicts, skipped-step count (any
  JSON-serialisable trainer state). The scheduler itself is not saved: a resumed run rebuilds
  it from its (possibly changed) config at that position.

Loading never runs code: ``.pt`` files are read with ``torch.load(weights_only=True)``, which
unpickles only tensors and plain containers (numpy's array reconstruction is allow-listed for
``rng.pt`` files written before the RNG states were stored as tensors).

Writing goes to a temporary sibling directory; every file is fsynced, then the directory is
renamed into place (atomic on POSIX) and the parent fsynced. A crash therefore leaves either
the previous checkpoints or the new one, never a partial one. Older checkpoints beyond
``keep_last`` are deleted (and, with ``optimizer_state="last"``, the kept older ones lose
``optim.pt``) after the new one is in place. A model with a non-finite weight is
never written (:class:`NonFiniteCheckpointError`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

PREFIX = "step_"
OPTIM_FILE = "optim.pt"


class NonFiniteCheckpointError(RuntimeError):
    """Refusing to checkpoint a model whose weights hold NaN/inf."""


class CheckpointError(RuntimeError):
    """A checkpoint file that does not load: the message names the file and why."""


def clean_stale_temporaries(root: Path) -> list[Path]:
    """Remove ``.tmp-*`` directories left by a save that was killed (``kill -9``) under
    ``root``; returns what was removed. Complete checkpoints are never touched."""
    if not root.is_dir():
        return []
    stale = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(".tmp-")]
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale


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
    """Python, numpy and torch RNG states as tensors and plain values (weights-only loadable)."""
    name, key, pos, has_gauss, gauss = np.random.get_state()  # noqa: NPY002 (global state)
    return {
        "python": random.getstate(),
        "numpy": [name, torch.from_numpy(key.astype(np.int64)), pos, has_gauss, gauss],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    name, key, pos, has_gauss, gauss = state["numpy"]
    key = key.numpy() if isinstance(key, torch.Tensor) else np.asarray(key)
    np.random.set_state((name, key.astype(np.uint32), pos, has_gauss, gauss))  # noqa: NPY002
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _load_pt(path: Path) -> Any:
    """``torch.load`` that never runs code (weights only; numpy arrays of older ``rng.pt``)."""
    safe = [np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    reconstruct = getattr(np, "_core", np.core).multiarray._reconstruct
    with torch.serialization.safe_globals([reconstruct, *safe]):
        return torch.load(path, weights_only=True)


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
    state: dict[str, Any],
    keep_last: int = 2,
    optimizer_state: Literal["all", "last"] = "all",
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write checkpoint ``step`` under ``root`` atomically; prune to ``keep_last``.

    Args:
        state: JSON-serialisable trainer state (controllers, data position, counters).
        optimizer_state: ``all``: every kept checkpoint keeps ``optim.pt``; ``last``: only
            the new one (it is removed from the older ones once the new one is in place).
        extra: ``file name -> object`` of tensors and plain containers, written with
            ``torch.save`` inside the checkpoint (read back with :func:`load_extra`).

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
    torch.save({"optimizer": optimizer.state_dict()}, tmp / OPTIM_FILE)
    torch.save(rng_state(), tmp / "rng.pt")
    for name, obj in (extra or {}).items():
        torch.save(obj, tmp / name)
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=1))
    for f in tmp.iterdir():
        _fsync(f)
    _fsync(tmp)
    if final.exists():  # re-saving the same step (e.g. stop right after a periodic save)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(root)
    kept = list_checkpoints(root)
    for old in kept[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    if optimizer_state == "last":
        for old in kept[-keep_last:]:
            if old != final and (old / OPTIM_FILE).exists():
                (old / OPTIM_FILE).unlink()
                _fsync(old)
    return final


def load_checkpoint(
    path: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load weights (and optimiser, RNG) from ``path``; return ``state.json`` (with
    ``scheduler_steps`` taken from an older checkpoint's saved scheduler if it lacks it)."""
    st = _safetensors()
    if not (path / "state.json").exists():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no state.json)")
    with _explained(path / "state.json", "is not a valid state file"):
        state = json.loads((path / "state.json").read_text())
        if not isinstance(state, dict) or not isinstance(state.get("step"), int):
            raise ValueError("expected a JSON object with an integer 'step'")
    with _explained(path / "model.safetensors", "does not hold this model's weights"):
        if _is_peft(model):
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(model, st.load_file(str(path / "model.safetensors")))
        else:
            st.load_model(model, str(path / "model.safetensors"), strict=True)
    if optimizer is not None:
        if not (path / OPTIM_FILE).exists():
            raise CheckpointError(
                f"{path}: has no optimiser state ({OPTIM_FILE}), so a run cannot continue "
                "exactly from it (log.optimizer_state=last keeps it in the newest checkpoint "
                "only); its weights still load for eval and reports"
            )
        with _explained(path / OPTIM_FILE, "does not load as this run's optimiser state"):
            optim = _load_pt(path / OPTIM_FILE)
            optimizer.load_state_dict(optim["optimizer"])
        if "scheduler_steps" not in state and "scheduler" in optim:
            state["scheduler_steps"] = int(optim["scheduler"]["last_epoch"])
    if restore_rng:
        with _explained(path / "rng.pt", "does not load as RNG states"):
            set_rng_state(_load_pt(path / "rng.pt"))
    return state


def load_extra(path: Path, name: str) -> Any | None:
    """The ``extra`` file ``name`` of checkpoint ``path`` (None when it has none), loaded
    without running code."""
    if not (path / name).exists():
        return None
    with _explained(path / name, "does not load (tensors and plain values expected)"):
        return _load_pt(path / name)


@contextmanager
def _explained(path: Path, what: str) -> Iterator[None]:
    """Turn any failure while loading ``path`` into a :class:`CheckpointError` naming it (a
    file that would need code to unpickle is refused, never executed)."""
    try:
        yield
    except Exception as exc:  # truncated, empty, wrong shapes, foreign pickle, bad JSON ...
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "weights_only" in str(exc) or "Unsupported global" in str(exc):
            reason = "it holds objects that would run code when unpickled; refused"
        raise CheckpointError(f"{path}: {what} ({reason})") from exc
