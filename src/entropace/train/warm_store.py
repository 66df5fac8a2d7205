"""Warm-start entries on disk: what one holds, how it is written, and how it is checked on load.

An entry is a directory ``<key>/`` (in the cache, ``cache_dir("warmstart")``, or shipped with
the package, :data:`entropace.train.warm_start.SHIPPED_DIR`) holding

* the weights: ``model.safetensors`` with tokenizer and config (a full fine-tune; a
  ``save_pretrained`` directory that any loader reads), or ``adapter.safetensors`` (a LoRA warm
  start, ``warm_start.lora``: the adapter's tensors only, a few MB; loading merges them into
  the base model named in the record, :func:`load_adapter_entry`);
* ``warm_start.json``: the record (recipe, loss curve, measurements, ``weights`` (the weights
  file's name) and ``sha256`` (its digest)).

An entry is written into a temporary directory and renamed into place (:func:`write_entry`), so
a complete one appears at once or not at all. On every load (:func:`read_entry`) the weights'
sha256 is computed and compared with the record's (about 0.4 s for SmolLM2's 538 MB of full
weights, milliseconds for an adapter): an entry that is a symbolic link or holds one, or
whose record is not valid JSON, is refused with :class:`WarmStartError`; an incomplete entry or
one whose weights differ from its record is reported as stale (rebuilt by the caller), or
refused when the config pins a hash (``warm_start.sha256``). Reading takes no lock and writes
nothing, so a finished entry loads from a read-only cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ADAPTER_FILE",
    "RECORD_FILE",
    "WEIGHTS_FILE",
    "WarmStart",
    "WarmStartError",
    "adapter_tensors",
    "build_lock",
    "file_sha256",
    "is_adapter_entry",
    "load_adapter_entry",
    "read_entry",
        "write_entry",
]

#: The weights of a full fine-tune (a ``save_pretrained`` directory).
WEIGHTS_FILE = "model.safetensors"
#: The weights of a LoRA warm start: the adapter's tensors, named as the peft model names them.
ADAPTER_FILE = "adapter.safetensors"
#: The record written beside the weights.
RECORD_FILE = "warm_start.json"


class WarmStartError(RuntimeError):
    """A warm start that cannot be built or loaded, or does not match its record or pin."""


@dataclass(frozen=True)
class WarmStart:
    """A warm start's directory (``model.name`` loads it), weights hash and record."""

    path: Path
    key: str
    sha256: str
    built: bool
    record: dict[str, Any]

    @property
    def weights_file(self) -> str:
        return str(self.record.get("weights", WEIGHTS_FILE))


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _read_record(path: Path) -> dict[str, Any]:
    """The record of the entry at ``path``; :class:`WarmStartError` when it is not a JSON
    object with a ``sha256``."""
    file = path / RECORD_FILE
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise WarmStartError(
            f"warm start {path}: {RECORD_FILE} is not valid JSON ({exc}); delete {path} to "
            "rebuild it"
        ) from None
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
        raise WarmStartError(
            f"warm start {path}: {RECORD_FILE} is not a warm-start record (no sha256); delete "
            f"{path} to rebuild it"
        )
    return record


def read_entry(
    path: Path, key: str, weights: str, pin: str | None, say: Callable[[str], None]
) -> WarmStart | None:
    """The entry at ``path`` checked (module docstring): a :class:`WarmStart` when its
    ``weights`` file has the record's sha256 (and the pin's, when ``pin`` is set); None when
    there is none, or it is incomplete or stale (``say`` tells which; the caller rebuilds).
    :class:`WarmStartError` for a symbolic link, a corrupt record, or weights that differ from
    the pin."""
    if path.is_symlink() or any(p.is_symlink() for p in (path / weights, path / RECORD_FILE)):
        raise WarmStartError(
            f"warm start {path}: a symbolic link; entropace uses only the directories it wrote "
            f"itself: delete it to rebuild"
        )
    if not path.exists():
        return None
    if not ((path / weights).is_file() and (path / RECORD_FILE).is_file()):
        say(f"warm start {path}: incomplete (no {weights} or {RECORD_FILE}); rebuilding")
        return None
    record = _read_record(path)
    digest = file_sha256(path / weights)
    if pin is not None and digest != pin:
        raise WarmStartError(
            f"warm start {path}: {weights} has sha256 {digest}, the config pins "
            f"warm_start.sha256={pin}; delete the directory to rebuild, or fix the pin"
        )
    if digest != record["sha256"] or record.get("weights", WEIGHTS_FILE) != weights:
        if pin is not None:  # the pinned weights under another record: refuse, not guess
            raise WarmStartError(
                f"warm start {path}: {weights} (sha256 {digest}) is not what its {RECORD_FILE} "
                f"records ({record['sha256']}); delete the directory to rebuild"
            )
        say(
            f"warm start {path}: {weights} has sha256 {digest[:12]}..., its record says "
            f"{record['sha256'][:12]}... (changed or damaged); rebuilding"
        )
        return None
    return WarmStart(path=path, key=key, sha256=digest, built=False, record=record)


def write_entry(target: Path, write: Callable[[Path], None], record: dict[str, Any]) -> None:
    """Write an entry atomically: ``write(tmp)`` puts the weights file ``record["weights"]``
    (and whatever loads with it) into a temporary directory beside ``target``; the weights'
    sha256 goes into ``record``, the record beside them, and the directory is renamed to
    ``target`` (replacing an old entry)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(tmp)
        record["sha256"] = file_sha256(tmp / record["weights"])
        (tmp / RECORD_FILE).write_text(json.dumps(record, indent=1) + "\n")
        if target.is_symlink():
            target.unlink()
        elif target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def build_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` for the block (released when the process dies)."""
    import fcntl

    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# LoRA warm starts: the adapter alone
# --------------------------------------------------------------------------------------------


def adapter_tensors(model: Any) -> dict[str, Any]:
    """Copies of the trainable tensors of a peft ``model`` (its adapter), by parameter name."""
    return {
        n: p.detach().clone().contiguous() for n, p in model.named_parameters() if p.requires_grad
    }


def is_adapter_entry(name: str) -> bool:
    """Whether ``model.name`` is a LoRA warm start's directory (an adapter and its record)."""
    path = Path(name).expanduser()
    return (path / ADAPTER_FILE).is_file() and (path / RECORD_FILE).is_file()


def load_adapter_entry(
    cfg: Any, build: Callable[[Any], tuple[Any, Any, str]], lora: dict[str, Any] | None = None
) -> tuple[Any, Any, str]:
    """``(model, tokenizer, device)`` of the model section ``cfg`` whose ``name`` is a LoRA warm
    start's directory: the base model of its record built by ``build`` (as the model section
    would build it, without LoRA), the adapter checked against the record's sha256 and merged
    into the weights (``W + (alpha / r) B A``, exactly as the build merged it), then the
    section's own LoRA adapter on top: ``lora``, its options
    (:func:`entropace.train.policy.lora_options`), None without one."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from entropace.models.loading import apply_lora

    path = Path(cfg.name).expanduser()
    record = _read_record(path)
    digest = file_sha256(path / ADAPTER_FILE)
    if digest != record["sha256"]:
        raise WarmStartError(
            f"warm start {path}: {ADAPTER_FILE} has sha256 {digest}, its {RECORD_FILE} records "
            f"{record['sha256']}; delete the directory to rebuild"
        )
    adapter, base = record.get("adapter"), record.get("base_model")
    if not isinstance(adapter, dict) or not isinstance(base, str):
        raise WarmStartError(f"warm start {path}: {RECORD_FILE} names no adapter or base model")
    model, tokenizer, device = build(
        dataclasses.replace(cfg, name=base, lora=False, gradient_checkpointing=False)
    )
    try:
        tensors = load_file(str(path / ADAPTER_FILE), device=str(device))
    except SafetensorError as exc:
        raise WarmStartError(f"warm start {path}: {ADAPTER_FILE}: {exc}") from None
    peft_model = apply_lora(model, adapter)
    expected = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    if set(tensors) != expected:
        raise WarmStartError(
            f"warm start {path}: {ADAPTER_FILE} holds other tensors than an adapter {adapter} "
            f"of {base} ({len(tensors)} vs {len(expected)})"
        )
    peft_model.load_state_dict(tensors, strict=False)
    model = peft_model.merge_and_unload()
    model.requires_grad_(True)
    if lora is not None:
        model = apply_lora(model, lora)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.eval()
    return model, tokenizer, device
