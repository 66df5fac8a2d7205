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
``rng.pt`` files written before the RNG states were stored as tensors). Loading never blocks
either: every file is opened without following a symbolic link and only as a regular file
(:mod:`entropace._files`: a FIFO or a device is refused, not waited on), and ``state.json``'s
integers are range-checked, its ``step`` against the directory's name
(:func:`check_state`).

Writing goes to a temporary sibling directory; every file is fsynced, then the directory is
renamed into place (atomic on POSIX) and the parent fsynced. A crash therefore leaves either
the previous checkpoints or the new one, never a partial one. Older checkpoints beyond
``keep_last`` are deleted (and, with ``optimizer_state="last"``, the kept older ones lose
``optim.pt``) after the new one is in place. A model with a non-finite weight is
never written (:class:`NonFiniteCheckpointError`).
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from entropace._files import UnsafeFileError, make_dir, open_read, read_text, regular_path
from entropace.train.config import MAX_STEPS
from entropace.train.schema import Range

PREFIX = "step_"
OPTIM_FILE = "optim.pt"
#: A checkpoint directory's name: ``step_`` and the step, zero-padded to 8 digits.
NAME = re.compile(r"step_([0-9]{8,9})")
#: The integers of ``state.json`` and their ranges (each checked when present).
STATE_RANGES: dict[str, Range] = {
    "step": Range(0, MAX_STEPS),
    "scheduler_steps": Range(0, 2**31 - 1),
    "skipped_steps": Range(0, MAX_STEPS),
}
#: The largest ``state.json`` loaded (it holds the config and the controllers' state).
STATE_BYTES = 256 << 20


class NonFiniteCheckpointError(RuntimeError):
    """Refusing to checkpoint a model whose weights hold NaN/inf."""


class CheckpointError(RuntimeError):
    """A checkpoint file that does not load: the message names the file and why."""


class CheckpointDiskFullError(CheckpointError):
    """A checkpoint not written for want of disk space (the earlier ones are kept)."""


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _disk_full(exc: BaseException, free: int, needed: int) -> bool:
    """Whether a failed write ran out of space: an ``ENOSPC`` / ``EDQUOT`` error anywhere in
    its chain (safetensors words it "No space left on device (os error 28)"), or less room
    left on the device than the checkpoint needs (torch's writer says only "unexpected pos")."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(seen) or "os error 28" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return free < needed


def _disk_full_message(root: Path, step: int, free: int, needed: int) -> str:
    kept = list_checkpoints(root)
    return (
        f"not checkpointing step {step}: no space left on the device of {root} "
        f"({_mib(max(free, 0))} free when the write failed; this checkpoint needs about "
        f"{_mib(needed)}); "
        + (
            f"the earlier checkpoint {kept[-1].name} is kept. Free some space, then continue "
            f"with: entropace train --resume {root.parent}"
            if kept else "no earlier checkpoint. Free some space and start the run again"
        )
    )  # fmt: skip


def _free_bytes(path: Path) -> int:
    try:
        st = os.statvfs(path)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize


def _state_bytes(weights: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer) -> int:
    """The bytes of the tensors a checkpoint holds (weights and the optimiser's state)."""
    total = sum(v.nelement() * v.element_size() for v in weights.values())
    for state in optimizer.state.values():
        total += sum(
            v.nelement() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor)
        )
    return total


def clean_stale_temporaries(root: Path) -> list[Path]:
    """Remove ``.tmp-*`` directories left by a save that was killed (``kill -9``) under
    ``root``; returns what was removed. Complete checkpoints are never touched."""
    if not root.is_dir():
        return []
    stale = [
        p for p in root.iterdir()
        if p.name.startswith(".tmp-") and p.is_dir() and not p.is_symlink()
    ]  # fmt: skip
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
    """Complete checkpoints under ``root``, oldest first (directories named ``step_`` and 8
    or 9 digits that hold a ``state.json``; anything else there is ignored)."""
    if not root.is_dir():
        return []
    found = [
        p for p in root.iterdir()
        if NAME.fullmatch(p.name) and p.is_dir() and (p / "state.json").exists()
    ]  # fmt: skip
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
    with torch.serialization.safe_globals([reconstruct, *safe]), open_read(path) as f:
        return torch.load(f, weights_only=True)


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
        CheckpointDiskFullError: the device ran out of space while writing (the partial
            checkpoint is removed, the earlier ones are kept).
    """
    st = _safetensors()
    weights = model_state(model)
    bad = [k for k, v in weights.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise NonFiniteCheckpointError(
            f"not checkpointing step {step}: non-finite weights in {bad[:5]}"
        )
    make_dir(root)  # refused if RUN/checkpoints is a symbolic link
    final = root / checkpoint_name(step)
    tmp = root / f".tmp-{checkpoint_name(step)}-{os.getpid()}"
    if tmp.is_symlink():
        tmp.unlink()
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        if _is_peft(model):
            st.save_file(
                {k: v.detach().contiguous() for k, v in weights.items()},
                tmp / "model.safetensors",
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
    except Exception as exc:  # OSError, torch's RuntimeError, SafetensorError
        free, needed = _free_bytes(root), _state_bytes(weights, optimizer)
        if not _disk_full(exc, free, needed):
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        full = (free, needed)
    else:
        full = None
    if full is not None:  # raised out here: the failed writer (its open file) is released
        shutil.rmtree(tmp, ignore_errors=True)  # first, so that its space is freed
        raise CheckpointDiskFullError(_disk_full_message(root, step, *full))
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
    if not os.path.lexists(path / "state.json"):
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no state.json)")
    with _explained(path / "state.json", "is not a valid state file"):
        state = check_state(json.loads(read_text(path / "state.json", limit=STATE_BYTES)), path)
    weights = path / "model.safetensors"
    with _explained(weights, "does not hold this model's weights"), regular_path(weights) as fp:
        if _is_peft(model):
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(model, st.load_file(fp))
        else:
            st.load_model(model, fp, strict=True)
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


def check_state(state: Any, path: Path) -> dict[str, Any]:
    """``state`` (the JSON of ``path/state.json``) when it is an object whose integers of
    :data:`STATE_RANGES` are in range and whose ``step`` is the one in the directory's name
    (``step_00000003`` holds step 3; a directory named otherwise, e.g. one given to ``eval
    --checkpoint``, is not compared); a ``ValueError`` saying what is wrong otherwise."""
    if not isinstance(state, dict) or "step" not in state:
        raise ValueError("expected a JSON object with an integer 'step'")
    for key, rng in STATE_RANGES.items():
        value = state.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value not in rng:
            raise ValueError(f"'{key}' must be an integer {rng}, got {value!r}")
    named = NAME.fullmatch(path.name)
    if named and int(named.group(1)) != state["step"]:
        raise ValueError(f"'step' is {state['step']}, but the directory is {path.name}")
    return state


def load_extra(path: Path, name: str) -> Any | None:
    """The ``extra`` file ``name`` of checkpoint ``path`` (None when it has none), loaded
    without running code."""
    if not os.path.lexists(path / name):
        return None
    with _explained(path / name, "does not load (tensors and plain values expected)"):
        return _load_pt(path / name)


@contextmanager
def _explained(path: Path, what: str) -> Iterator[None]:
    """Turn any failure while loading ``path`` into a :class:`CheckpointError` naming it (a
    file that would need code to unpickle is refused, never executed)."""
    try:
        yield
    except UnsafeFileError as exc:  # a FIFO, device or symbolic link: the message names it
        raise CheckpointError(str(exc)) from exc
    except Exception as exc:  # truncated, empty, wrong shapes, foreign pickle, bad JSON ...
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "weights_only" in str(exc) or "Unsupported global" in str(exc):
            reason = "it holds objects that would run code when unpickled; refused"
        raise CheckpointError(f"{path}: {what} ({reason})") from exc


def check_warm_start(recorded: Any, warm: Any, path: str | Path) -> None:
    """A checkpoint (at ``path``) trained from the warm start whose weights' sha256 it recorded
    (``state["warm_start"]``, None without one) can only go on from those weights: a resume
    (the KL reference and a LoRA run's base are those weights) and an evaluation (a LoRA
    checkpoint's adapter sits on them). ``warm`` is what the config gives now: the
    :class:`~entropace.train.warm_start.WarmStart` of ``warm_started``, or None.

    Raises:
        CheckpointError: the config gives other weights (or a warm start where the run had
            none, or none where it had one).
    """
    now = None if warm is None else warm.sha256
    then = recorded.get("sha256") if isinstance(recorded, dict) else None
    if then != now:
        raise CheckpointError(
            f"{path}: the run started from warm start weights {then or '(none)'}, this config "
            f"gives {now or '(none)'}; use the run's own warm_start settings"
        )
