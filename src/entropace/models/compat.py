"""What the installed transformers calls things, detected from its code (not its version string).

Everything in entropace that differs between the transformers versions pyproject declares goes
through this module:

* :func:`cache_kwarg` - the keyword that hands a key/value cache to a model's ``forward`` and to
  ``generate`` (``past_key_values`` in 4.57 to 5.17 at least, ``cache`` in 5.25, which still
  accepts the old name with a deprecation warning; read from the model's ``forward``
  signature);
* :func:`takes_logits_to_keep` / :func:`keeps_logits_by_mask` - whether ``forward`` computes
  the LM head on some positions only (``logits_to_keep``), and whether it also takes a boolean
  ``[rows, L]`` mask there (transformers' ``slice_logits_to_keep``, after 5.10);
* :func:`load_tokenizer` - ``AutoTokenizer``, or, for a checkpoint saved by a newer
  transformers whose tokenizer class the installed one does not have (5.x saves
  ``TokenizersBackend``), the generic fast tokenizer built from its ``tokenizer.json``;
* :func:`config_overrides` - the rotary settings of a ``config.json`` saved by a newer
  transformers (``rope_parameters``) for an installed config class that still reads
  ``rope_theta`` / ``rope_scaling`` (it would otherwise fall back to its defaults silently).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from pathlib import Path
from typing import Any

#: The keyword names a transformers causal LM has used for its key/value cache, newest first.
CACHE_KWARGS: tuple[str, ...] = ("cache", "past_key_values")


@functools.cache
def _parameters(fn: Any) -> frozenset[str]:
    """The parameter names of ``fn`` (empty when it has no signature)."""
    try:
        return frozenset(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return frozenset()


@functools.cache
def _generation_cache_kwarg() -> str:
    """The cache keyword of the installed transformers' ``prepare_inputs_for_generation``."""
    from transformers import GenerationMixin

    names = _parameters(GenerationMixin.prepare_inputs_for_generation)
    return next((k for k in CACHE_KWARGS if k in names), CACHE_KWARGS[-1])


def cache_kwarg(model: Any) -> str:
    """The keyword under which ``model``'s ``forward`` (and so ``generate``) takes its cache.

    Read from the signature of the (peft-unwrapped) model's ``forward``; a ``forward`` that
    names neither (``**kwargs`` only) gets the keyword of the installed transformers'
    ``GenerationMixin.prepare_inputs_for_generation``.
    """
    names = _parameters(_base_forward(model))
    found = next((k for k in CACHE_KWARGS if k in names), None)
    return found if found is not None else _generation_cache_kwarg()


def _base_forward(model: Any) -> Any:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return type(base).forward


def takes_logits_to_keep(model: Any) -> bool:
    """Whether ``model``'s (peft-unwrapped) ``forward`` takes ``logits_to_keep`` (an integer:
    the LM head on the last N positions only)."""
    return "logits_to_keep" in _parameters(_base_forward(model))


def keeps_logits_by_mask(model: Any) -> bool:
    """Whether ``logits_to_keep`` may also be a boolean ``[rows, L]`` mask (the logits of its
    ``True`` positions, ``[n_true, V]``): the model's ``forward`` slices through transformers'
    ``slice_logits_to_keep``, which takes one (read from the forward's code; older forwards
    index ``hidden[:, logits_to_keep]`` and fail on a 2-D mask)."""
    if not takes_logits_to_keep(model):
        return False
    code = getattr(inspect.unwrap(_base_forward(model)), "__code__", None)
    return code is not None and "slice_logits_to_keep" in code.co_names


def _saved_file(path: str, name: str) -> Path | None:
    """``path/name`` for a local directory (or the hub's cached copy), ``None`` if absent."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local / name if (local / name).is_file() else None
    try:
        from transformers.utils import cached_file

        found = cached_file(path, name)
    except (OSError, ValueError):
        return None
    return Path(found) if found else None


def _known_tokenizer_class(name: str) -> bool:
    import transformers

    base = name.removesuffix("Fast")
    return any(getattr(transformers, n, None) is not None for n in (base, f"{base}Fast"))


def load_tokenizer(path: str) -> Any:
    """The tokenizer saved at ``path`` (a local directory or hub id).

    ``AutoTokenizer.from_pretrained``, unless the saved ``tokenizer_class`` does not exist in
    the installed transformers and a ``tokenizer.json`` is there: then
    ``PreTrainedTokenizerFast`` loads it (same vocabulary, merges, normaliser, special tokens
    and chat template: the fast tokenizer *is* ``tokenizer.json``), with a list-valued
    ``extra_special_tokens`` (newer transformers' name for the additional special tokens)
    passed as ``additional_special_tokens``.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config_file = _saved_file(path, "tokenizer_config.json")
    saved = json.loads(config_file.read_text()) if config_file is not None else {}
    name = saved.get("tokenizer_class")
    if not name or _known_tokenizer_class(name) or _saved_file(path, "tokenizer.json") is None:
        return AutoTokenizer.from_pretrained(path)
    fixes: dict[str, Any] = {}
    extra = saved.get("extra_special_tokens")
    if isinstance(extra, list):
        fixes = {"extra_special_tokens": {}, "additional_special_tokens": list(extra)}
    # from_pretrained warns that the saved class differs from the one called: that is the point
    quiet = logging.getLogger("transformers.tokenization_utils_base")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return PreTrainedTokenizerFast.from_pretrained(path, **fixes)
    finally:
        quiet.setLevel(level)


def config_overrides(path: str) -> dict[str, Any]:
    """``from_pretrained`` keyword overrides that make the installed config class read a
    ``config.json`` written by another transformers the same way (empty when none is needed).

    A config saved with ``rope_parameters`` (``{"rope_theta": ..., "rope_type": ..., ...}``)
    whose installed config class takes ``rope_theta`` / ``rope_scaling`` instead gets those:
    ``rope_theta`` and, for a ``rope_type`` other than ``default``, ``rope_scaling`` (the
    remaining entries).
    """
    config_file = _saved_file(path, "config.json")
    if config_file is None:
        return {}
    saved = json.loads(config_file.read_text())
    rope = saved.get("rope_parameters")
    if not isinstance(rope, dict) or "rope_theta" not in rope:
        return {}
    from transformers import AutoConfig

    try:
        cls = type(AutoConfig.for_model(saved["model_type"]))
    except (KeyError, ValueError):
        return {}
    names = _parameters(cls.__init__)
    if "rope_parameters" in names or "rope_theta" not in names:
        return {}
    out: dict[str, Any] = {"rope_theta": rope["rope_theta"]}
    if rope.get("rope_type", "default") != "default":
        out["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return out
