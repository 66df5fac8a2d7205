"""A tiny, random-initialised Llama model with an offline ChatML tokenizer.

Used by the test suite and by smoke runs of the trainer: it builds in well under a second,
needs no network, and behaves like a real chat model to the rollout engine (left padding,
KV cache, a ChatML chat template ending turns with ``<|im_end|>``).

The tokenizer is a byte-level BPE trained on a small built-in corpus (so any text round-trips
through it, like GPT-2/SmolLM2 tokenizers); the model weights depend only on ``seed``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

#: ChatML, the template SmolLM2-Instruct uses (without its default system prompt).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: Special tokens of the tiny tokenizer, in id order (ids 0..3).
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")

# A small corpus so that BPE learns merges for common English, chat-role words, digits and the
# action syntax of the built-in environments. Any byte sequence still encodes (byte fallback
# is built into byte-level BPE), merges only make the common text shorter.
_CORPUS: tuple[str, ...] = (
    "system user assistant tool observation action answer think reward",
    "You are a helpful assistant. Answer the question and explain your reasoning step by step.",
    "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid.",
    "What is 12 + 7? The answer is 19. What is 3 * 4? The answer is 12. 0 1 2 3 4 5 6 7 8 9",
    "Action: SELECT name FROM users WHERE age > 30; Observation: [('alice',), ('bob',)]",
    "Action: get_relations(entity) Action: answer(#3) Final Answer: yes no true false",
    "ls -la /home/user && cat file.txt | grep error; echo done; cd .. ; pwd",
    "go to the kitchen, take the apple from the table, put the apple in the fridge, open door",
    "search[red running shoes] click[Buy Now] think[the price is below 50 dollars] back",
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with one step.",
    "In reinforcement learning an agent interacts with an environment and receives rewards.",
    "Entropy measures the uncertainty of the policy; low entropy means a confident policy.",
    "Please think carefully, then give the final answer inside <answer> and </answer> tags.",
    '{"name": "value", "id": 42, "items": [1, 2, 3], "ok": true}',
)


@functools.lru_cache(maxsize=8)
def _tokenizer_json(vocab_size: int) -> str:
    """Train the byte-level BPE once per vocabulary size and return it serialised."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = list(_CORPUS) * 4
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok.to_str()


def build_tiny_tokenizer(vocab: int = 512) -> Any:
    """The offline ChatML tokenizer (a ``PreTrainedTokenizerFast``), left padding side.

    Args:
        vocab: target vocabulary size; at least ``256 + len(SPECIAL_TOKENS)`` (the byte
            alphabet plus the special tokens). Training stops early if the corpus has fewer
            merges, so ``len(tokenizer)`` can be below ``vocab``.

    Special tokens: ``<|endoftext|>`` (bos/unk, id 0), ``<|im_start|>`` (1), ``<|im_end|>``
    (eos, 2), ``<|pad|>`` (pad, 3). The result is deterministic (same vocab -> same ids).
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    minimum = 256 + len(SPECIAL_TOKENS)
    if vocab < minimum:
        raise ValueError(
            f"vocab must be >= {minimum} (byte alphabet + special tokens), got {vocab}"
        )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(int(vocab))),
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|pad|>",
        additional_special_tokens=["<|im_start|>"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_tiny_model(
    seed: int = 0,
    vocab: int = 512,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    max_positions: int = 8192,
    init_std: float = 0.2,
    dtype: torch.dtype = torch.float32,
) -> tuple[Any, Any]:
    """A random-initialised ``LlamaForCausalLM`` and its offline ChatML tokenizer.

    Args:
        seed: seeds the weight initialisation only (the global RNG is left untouched), so the
            same arguments give bit-identical weights.
        vocab: tokenizer vocabulary size (see :func:`build_tiny_tokenizer`); the embedding
            matrix has exactly ``len(tokenizer)`` rows.
        hidden, layers, heads, kv_heads, intermediate, max_positions: Llama dimensions.
        init_std: standard deviation of the weight init; the default 0.2 (above Llama's 0.02)
            gives peaked, non-uniform next-token distributions, so entropy and polarity
            statistics are not all at their uniform-distribution values.
        dtype: parameter dtype.

    Returns:
        ``(model, tokenizer)``; the model is in eval mode, its ``generation_config`` carries
        the tokenizer's pad and eos ids.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    if hidden % heads or heads % kv_heads:
        raise ValueError(
            f"hidden ({hidden}) must be divisible by heads ({heads}) and heads by kv_heads "
            f"({kv_heads})"
        )
    tokenizer = build_tiny_tokenizer(vocab)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        initializer_range=init_std,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attention_dropout=0.0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.eval()
    return model, tokenizer
