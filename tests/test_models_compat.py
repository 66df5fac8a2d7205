"""``entropace.models.compat``: what differs between the transformers versions pyproject declares,
read from the installed transformers' code (issue 36). The same file runs in .ci/run's venvs
with the lowest declared transformers and with verl's newest allowed one."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from entropace.models import load_model  # noqa: E402
from entropace.models.compat import (  # noqa: E402
    CACHE_KWARGS,
    cache_kwarg,
    config_overrides,
    keeps_logits_by_mask,
    load_tokenizer,
    takes_logits_to_keep,
)
from entropace.models.tiny import build_tiny_tokenizer  # noqa: E402

WARM = Path(__file__).parents[1] / "src/entropace/models/warm/48e73f00086670992c7c819f"
CHAT = [
    {"role": "system", "content": "You answer with letters."},
    {"role": "user", "content": "seed 123456: the code?"},
    {"role": "assistant", "content": "abc"},
    {"role": "user", "content": "again <|im_end|> 42"},
]


class _Old:
    def forward(self, input_ids: Any = None, past_key_values: Any = None, use_cache: Any = None):
        raise NotImplementedError


class _New:
    def forward(self, input_ids: Any = None, cache: Any = None, use_cache: Any = None):
        raise NotImplementedError


class _KwargsOnly:
    def forward(self, input_ids: Any = None, **kwargs: Any):
        raise NotImplementedError


class _Wrapper:
    """peft's ``PeftModel`` shape: a ``forward(**kwargs)`` of its own, the model inside."""

    def __init__(self, base: Any) -> None:
        self.base = base

    def get_base_model(self) -> Any:
        return self.base

    def forward(self, *args: Any, **kwargs: Any):
        raise NotImplementedError


def test_cache_kwarg_is_read_from_the_forward_signature() -> None:
    from transformers import LlamaForCausalLM

    assert cache_kwarg(_Old()) == "past_key_values"
    assert cache_kwarg(_New()) == "cache"
    assert cache_kwarg(_Wrapper(_Old())) == "past_key_values"
    assert cache_kwarg(_Wrapper(_New())) == "cache"
    # a forward naming neither: the keyword of the installed transformers (its generation
    # code's, the one its own models take)
    llama = inspect.signature(LlamaForCausalLM.forward).parameters
    assert [k for k in CACHE_KWARGS if k in llama] == [cache_kwarg(_KwargsOnly())]


def test_cache_kwarg_of_the_tiny_model_is_what_its_forward_uses(
    tiny_model_and_tokenizer: tuple[Any, Any],
) -> None:
    """The keyword hands the cache over: a forward with it fills the given cache (a wrong
    keyword raises or leaves it empty)."""
    from transformers import DynamicCache

    model, tok = tiny_model_and_tokenizer
    cache = DynamicCache()
    ids = torch.tensor([tok("hello there").input_ids])
    with torch.no_grad():
        model(input_ids=ids, **{cache_kwarg(model): cache}, use_cache=True)
    assert cache.get_seq_length() == ids.shape[1]


def test_keeps_logits_by_mask_is_what_the_forward_does(
    tiny_model_and_tokenizer: tuple[Any, Any],
) -> None:
    """True exactly when a boolean ``[rows, L]`` ``logits_to_keep`` gives the ``[n_true, V]``
    logits of those positions (an older forward raises on the 2-D index)."""
    model, _ = tiny_model_and_tokenizer
    ids = torch.arange(4, 4 + 2 * 6).reshape(2, 6)
    keep = torch.zeros(2, 6, dtype=torch.bool)
    keep[0, 2] = keep[1, 4] = keep[1, 5] = True
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
        try:
            out = model(input_ids=ids, use_cache=False, logits_to_keep=keep).logits
        except IndexError:
            out = None
    assert takes_logits_to_keep(model) and not takes_logits_to_keep(_KwargsOnly())
    assert keeps_logits_by_mask(model) == (out is not None)
    if out is not None:
        torch.testing.assert_close(out, full[keep])
    assert not keeps_logits_by_mask(_KwargsOnly())


def _chat_ids(tok: Any) -> list[int]:
    text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    return list(tok(text, add_special_tokens=False).input_ids)


def _saved_by_a_newer_transformers(tok: Any, path: Path) -> Path:
    """``tok`` saved at ``path`` with the tokenizer_config.json a newer transformers writes: a
    class the installed one lacks, and the additional special tokens as a list under
    ``extra_special_tokens`` (transformers 5.x's form)."""
    tok.save_pretrained(path)
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.pop("additional_special_tokens", None)
    config["tokenizer_class"] = "NoSuchTokenizerBackend"
    config["extra_special_tokens"] = ["<|im_start|>"]
    config["backend"] = "tokenizers"
    config_file.write_text(json.dumps(config))
    return path


def test_a_tokenizer_of_an_unknown_class_loads_from_tokenizer_json(
    tiny_model_and_tokenizer: tuple[Any, Any], tmp_path: Path
) -> None:
    """Before the fix ``load_model`` failed: 'Tokenizer class ... does not exist'."""
    model, reference = tiny_model_and_tokenizer
    model.save_pretrained(tmp_path)
    path = _saved_by_a_newer_transformers(build_tiny_tokenizer(), tmp_path)
    _, tok = load_model(str(path))
    assert type(load_tokenizer(str(path))) is type(tok)
    assert _chat_ids(tok) == _chat_ids(reference)
    assert tok.convert_tokens_to_ids("<|im_start|>") == 1
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 2, 3)
    assert tok.decode(_chat_ids(reference)) == reference.decode(_chat_ids(reference))


def test_the_shipped_warm_start_loads_with_the_tiny_tokenizer() -> None:
    """The lab3 warm start (saved by transformers 5.x, weights pinned by configs/lab3.yaml)
    loads on the installed transformers and tokenises as the tiny tokenizer it was built
    with."""
    model, tok = load_model(str(WARM))
    reference = build_tiny_tokenizer()
    assert _chat_ids(tok) == _chat_ids(reference)
    assert (tok.pad_token_id, tok.eos_token_id, tok.padding_side) == (3, 2, "left")
    assert model.config.vocab_size == len(reference)


def _rope_inv_freq(theta: float, dim: int) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)


def test_rope_parameters_of_a_newer_config_are_read(
    tiny_model_and_tokenizer: tuple[Any, Any], tmp_path: Path
) -> None:
    """A config.json in transformers 5.x's form (``rope_parameters``, no ``rope_theta``) with
    a non-default theta: the loaded model's rotary frequencies use that theta (a config class
    that reads ``rope_theta`` would otherwise take its default 10000 silently)."""
    model, tok = tiny_model_and_tokenizer
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    config_file = tmp_path / "config.json"
    config = json.loads(config_file.read_text())
    for key in ("rope_theta", "rope_scaling", "rope_parameters"):
        config.pop(key, None)
    config["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "default"}
    config_file.write_text(json.dumps(config))
    loaded, _ = load_model(str(tmp_path))
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    torch.testing.assert_close(
        loaded.model.rotary_emb.inv_freq, _rope_inv_freq(500000.0, head_dim)
    )
    assert set(config_overrides(str(tmp_path))) <= {"rope_theta"}
