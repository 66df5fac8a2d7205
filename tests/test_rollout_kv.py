"""Fast rollout path: shared prompt prefixes and cross-turn KV reuse (``rollout/kvcache.py``).

The fast path must sample exactly what the old path samples: ``generate`` receives the same
ids and attention mask, and only the columns already in a cache are not recomputed. Checked
on the tiny offline Llama with the scripted environments of ``test_rollout.py`` (multi-turn,
uneven observation lengths, episodes ending at different turns, turns that stop and turns cut
by the budget, episodes ending on the token budget, groups of equal prompts).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

try:
    from tests.test_rollout import IM_END, CounterEnv, add_eot_bias
except ModuleNotFoundError:  # a site-packages `tests` package (verl's venv) shadows ours
    from test_rollout import IM_END, CounterEnv, add_eot_bias  # type: ignore[no-redef]

import entropace.rollout.decode as decode_mod  # noqa: E402
from entropace.models.compat import cache_kwarg  # noqa: E402
from entropace.rollout import RolloutConfig, RolloutRequest, collect_rollouts  # noqa: E402
from entropace.rollout.kvcache import (  # noqa: E402
    PrefixKV,
    _length_buckets,
    batch_cache,
    kv_reuse_support,
    prefill_prefixes,
    row_prefixes,
)

PATHS = {
    "old": {"share_prefix": False, "reuse_kv": False},
    "prefix": {"share_prefix": True, "reuse_kv": False},
    "reuse": {"share_prefix": False, "reuse_kv": True},
    "fast": {"share_prefix": True, "reuse_kv": True},
}


def grouped_requests(seeds: list[int], group_size: int, env: Any = CounterEnv) -> list[Any]:
    """``group_size`` episodes per seed (equal first prompts), as the trainer builds groups."""
    return [RolloutRequest("counter", env, s, g) for g, s in enumerate(seeds)
            for _ in range(group_size)]  # fmt: skip


class CallSpy:
    """Wraps the decoding loop (``entropace.rollout.decode.decode``): records each call's ids,
    mask, the cache handed in (its batch size and length before the call; ``None`` when it is
    empty) and the output (the ids followed by the generated tokens). ``remove`` restores it."""

    def __init__(self, model: Any) -> None:
        self.calls: list[dict[str, Any]] = []
        self.original = original = decode_mod.decode

        def decode(m: Any, input_ids: Any, attention_mask: Any, cache: Any, **kwargs: Any) -> Any:
            length = cache.get_seq_length()
            record = {
                "input_ids": input_ids.clone(),
                "attention_mask": attention_mask.clone(),
                "cache_len": length or None,
                "cache_rows": int(cache.layers[0].keys.shape[0]) if length else None,
            }
            new = original(m, input_ids, attention_mask, cache, **kwargs)
            record["output"] = torch.cat([input_ids.cpu(), new], dim=1)
            self.calls.append(record)
            return new

        decode_mod.decode = decode

    def remove(self) -> None:
        decode_mod.decode = self.original


def rollout_all_paths(
    model: Any, tok: Any, reqs: list[Any], cfg: RolloutConfig, seed: int | None
) -> dict[str, tuple[Any, CallSpy]]:
    out = {}
    for name, switches in PATHS.items():
        spy = CallSpy(model)
        try:
            out[name] = (collect_rollouts(model, tok, reqs, dataclasses.replace(cfg, **switches),
                                          seed=seed), spy)  # fmt: skip
        finally:
            spy.remove()
    return out


def assert_same_rollouts(results: dict[str, tuple[Any, CallSpy]]) -> None:
    ref, ref_spy = results["old"]
    for name, (res, spy) in results.items():
        a, b = ref.batch, res.batch
        assert torch.equal(a.input_ids, b.input_ids), name
        assert torch.equal(a.attention_mask, b.attention_mask), name
        assert torch.equal(a.loss_mask, b.loss_mask), name
        assert a.num_turns.tolist() == b.num_turns.tolist(), name
        assert torch.equal(a.rewards, b.rewards), name
        assert [e.end_reason for e in a.episodes] == [e.end_reason for e in b.episodes]
        assert [e.messages for e in a.episodes] == [e.messages for e in b.episodes]
        # the statistics are recomputed on the same ids by the same pass
        # with share_prefix the statistics pass also runs a group's prompt once (another matmul
        # shape: equal to float32 round-off, tests/test_prefix_stats.py)
        for stat in ("old_logprobs", "entropy", "sensitivity"):
            torch.testing.assert_close(getattr(b, stat), getattr(a, stat), rtol=1e-5, atol=1e-5)
        assert res.generate_batch_sizes == ref.generate_batch_sizes
        # generate saw exactly the old path's ids and attention masks, call by call
        assert len(spy.calls) == len(ref_spy.calls)
        for old_call, call in zip(ref_spy.calls, spy.calls, strict=True):
            assert torch.equal(old_call["input_ids"], call["input_ids"]), name
            assert torch.equal(old_call["attention_mask"], call["attention_mask"]), name
            assert torch.equal(old_call["output"], call["output"]), name
    # the old path passes no cache; the fast path always does, sized to the live batch
    assert all(c["cache_len"] is None for c in ref_spy.calls)
    for call in results["fast"][1].calls:
        width = call["input_ids"].shape[1]
        assert 0 < call["cache_len"] < width
        assert call["cache_rows"] == call["input_ids"].shape[0]


def turn_ends(batch: Any) -> list[int]:
    """The last token of every generated turn (each contiguous run of the loss mask)."""
    out = []
    for i in range(batch.size):
        m = batch.loss_mask[i].tolist()
        out += [int(batch.input_ids[i, t]) for t in range(len(m))
                if m[t] and (t + 1 == len(m) or not m[t + 1])]  # fmt: skip
    return out


CFG = RolloutConfig(max_new_tokens_per_turn=10, max_episode_tokens=400, temperature=1.0)


@pytest.mark.parametrize("generation_batch_size", [None, 4])
def test_fast_path_equals_old_path_greedy(
    tiny_model_and_tokenizer: tuple[Any, Any], generation_batch_size: int | None
) -> None:
    """Greedy decoding: token for token, every switch combination, with groups of equal
    prompts (3 per seed), episodes of 1-3 turns, stopped and budget-cut turns, and
    ``generation_batch_size`` splitting the live batch across calls."""
    model, tok = tiny_model_and_tokenizer
    add_eot_bias(model, tok, 3.0)
    cfg = dataclasses.replace(CFG, do_sample=False, generation_batch_size=generation_batch_size)
    reqs = grouped_requests([0, 1, 2, 13, 25, 107], 3)  # stops after 1, 2, 3, 2, 2, 3 turns
    results = rollout_all_paths(model, tok, reqs, cfg, seed=None)
    assert_same_rollouts(results)
    batch = results["old"][0].batch
    assert sorted(set(batch.num_turns.tolist())) == [1, 2, 3]
    sizes = results["old"][0].generate_batch_sizes
    expected = (
        [[18], [15], [6]]
        if generation_batch_size is None
        else [[4] * 4 + [2], [4] * 3 + [3], [4, 2]]
    )
    assert sizes == [n for turn in expected for n in turn]
    ends = turn_ends(batch)
    eot = tok.convert_tokens_to_ids(IM_END)
    assert eot in ends and any(e != eot for e in ends)  # both kinds of turn end occurred


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_fast_path_samples_the_same_tokens_with_the_same_seed(
    tiny_model_and_tokenizer: tuple[Any, Any], top_p: float
) -> None:
    """Sampling, fp32: the RNG is consumed by the same ``generate`` calls with the same batch
    shapes (the prefix prefill draws nothing), and the probabilities differ only by float
    round-off, so the samples are identical; the G samples of a group really differ."""
    model, tok = tiny_model_and_tokenizer
    add_eot_bias(model, tok, 3.0)
    cfg = dataclasses.replace(CFG, temperature=0.9, top_p=top_p)
    reqs = grouped_requests([0, 1, 2, 5], 4)
    results = rollout_all_paths(model, tok, reqs, cfg, seed=11)
    assert_same_rollouts(results)
    ids = results["fast"][0].batch.input_ids
    assert len({tuple(ids[i].tolist()) for i in range(4)}) > 1  # group 0 sampled 4 ways


def test_episode_token_budget_with_the_fast_path(tiny_model_and_tokenizer: tuple[Any, Any]) -> None:
    """Episodes that run into ``max_episode_tokens`` at different turns: each row's budget
    is smaller than the call's, so the batch generates tokens past some rows' budgets; those
    are not kept, neither in the trajectory nor in the row's cache."""
    model, tok = tiny_model_and_tokenizer
    env = lambda: CounterEnv(max_turns=10, stop_at=99)  # noqa: E731
    cfg = RolloutConfig(max_new_tokens_per_turn=15, max_episode_tokens=75)
    reqs = [RolloutRequest("counter", env, s, s) for s in (1, 22, 333, 4444)]
    for do_sample in (False, True):
        results = rollout_all_paths(
            model, tok, reqs, dataclasses.replace(cfg, do_sample=do_sample), seed=4
        )
        assert_same_rollouts(results)
        batch = results["fast"][0].batch
        assert {e.end_reason for e in batch.episodes} == {"length"}
        assert len(set(batch.attention_mask.sum(1).tolist())) > 1


def forward_shapes(model: Any) -> tuple[list[tuple[int, int]], Any]:
    """Record ``(batch, positions)`` of every cached forward of ``model`` during generation
    (generation and prefix prefill pass ``use_cache=True``; the statistics pass, which shares
    prefixes through a cache of its own, is left out while it runs)."""
    import entropace.rollout.engine as engine_mod

    shapes: list[tuple[int, int]] = []
    in_stats = [False]
    original = engine_mod.sequence_token_stats

    def stats(*args: Any, **kwargs: Any) -> Any:
        in_stats[0] = True
        try:
            return original(*args, **kwargs)
        finally:
            in_stats[0] = False

    engine_mod.sequence_token_stats = stats

    class Handle:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def remove(self) -> None:
            self.inner.remove()
            engine_mod.sequence_token_stats = original

    def hook(_module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if kwargs.get("use_cache") and not in_stats[0]:
            ids = kwargs["input_ids"]
            shapes.append((int(ids.shape[0]), int(ids.shape[1])))

    return shapes, Handle(model.register_forward_pre_hook(hook, with_kwargs=True))


@pytest.mark.parametrize("share_roots", [True, False])
def test_fast_path_prefills_only_new_tokens(
    tiny_model_and_tokenizer: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, share_roots: bool
) -> None:
    """Every forward, counted by a hook. Two-turn episodes, every turn cut at its 6-token
    budget (end-of-turn logit -inf), 4 prompts x G=3. Old path: turn 1 prefills the 12
    left-padded prompts, turn 2 the whole histories. Fast path: the 4 distinct prompts minus
    their last token once (their common prefix, system prompt and template, once for all
    four when ``share_roots``), then 1 column per row at turn 1, and at turn 2 the last
    generated token plus the longest template-and-observation continuation."""
    import entropace.rollout.kvcache as kvcache

    if not share_roots:
        monkeypatch.setattr(kvcache, "MIN_SHARED_PREFIX", 10**9)
    model, tok = tiny_model_and_tokenizer
    add_eot_bias(model, tok, float("-inf"))
    k = 6
    env = lambda: CounterEnv(max_turns=2, stop_at=99)  # noqa: E731
    cfg = RolloutConfig(max_new_tokens_per_turn=k, max_episode_tokens=400)
    reqs = grouped_requests([3, 40, 500, 6000], 3, env)  # prompts of 4 different lengths
    runs = {}
    for name in ("old", "fast"):
        shapes, handle = forward_shapes(model)
        try:
            result = collect_rollouts(model, tok, reqs, dataclasses.replace(cfg, **PATHS[name]),
                                      seed=0)  # fmt: skip
        finally:
            handle.remove()
        runs[name] = (result, shapes)
    old, fast = runs["old"][0], runs["fast"][0]
    assert torch.equal(old.batch.input_ids, fast.batch.input_ids)
    batch = old.batch
    B = batch.size
    prompt_len = [int(batch.loss_mask[i].nonzero()[0]) for i in range(B)]
    n1 = max(prompt_len)
    # tokens between the turns: closing template, observation, headers (loss mask 0)
    gen_cols = [batch.loss_mask[i].nonzero().flatten().tolist() for i in range(B)]
    assert all(len(c) == 2 * k for c in gen_cols)
    cont = [c[k] - c[k - 1] - 1 for c in gen_cols]
    n2 = max(p + k + c for p, c in zip(prompt_len, cont, strict=True))
    decode = [(B, 1)] * (k - 1)
    assert runs["old"][1] == [(B, n1), *decode, (B, n2), *decode]
    prompts = sorted({tuple(batch.input_ids[i, :p].tolist()) for i, p in enumerate(prompt_len)})
    assert len(prompts) == 4
    lcp = 0  # longest common prefix of the 4 prompts minus their last token, by hand
    while all(len(q) - 1 > lcp and q[lcp] == prompts[0][lcp] for q in prompts):
        lcp += 1
    assert lcp >= 32  # system prompt + "count ": shared (MIN_SHARED_PREFIX = 32)
    root = lcp if share_roots else 0
    tails = [len(q) - 1 - root for q in prompts]
    buckets = _length_buckets(tails, 16, 1.25)
    prefix = [(1, root)] if share_roots else []
    prefix += [(len(b), max(tails[j] for j in b)) for b in buckets]
    assert runs["fast"][1] == [*prefix, (B, 1), *decode, (B, 1 + max(cont)), *decode]
    prefix_positions = sum(b * w for b, w in prefix)
    assert fast.counts["prefill_tokens"] == prefix_positions + B + B * (1 + max(cont))
    assert old.counts["prefill_tokens"] == B * (n1 + n2)
    assert fast.counts["prefill_tokens"] * 2 < old.counts["prefill_tokens"]
    # turn 1: the prompts minus their last token; turn 2: each row's n_i - U first tokens
    # (all but the last generated one were cached; shorter continuations recompute a few)
    turn2 = sum(p + k + c - (1 + max(cont)) for p, c in zip(prompt_len, cont, strict=True))
    assert fast.counts["cached_tokens"] == sum(p - 1 for p in prompt_len) + turn2


def test_batch_cache_layout_and_row_views() -> None:
    """Row i keeps its first keep[i] cached tokens right-aligned, zeros before them."""
    g = torch.Generator().manual_seed(0)
    prefixes = [
        PrefixKV(
            [
                (torch.randn(2, n, 3, generator=g), torch.randn(2, n, 3, generator=g))
                for _ in range(2)
            ]
        )  # fmt: skip
        for n in (5, 2, 4)
    ]
    keep = [3, 2, 0]
    cache = batch_cache([*prefixes[:2], None], keep, 4)
    assert cache.get_seq_length() == 4
    for layer in range(2):
        keys, values = cache.layers[layer].keys, cache.layers[layer].values
        assert keys.shape == (3, 2, 4, 3)
        for row, n in enumerate(keep):
            assert torch.equal(keys[row, :, : 4 - n], torch.zeros(2, 4 - n, 3))
            if n:
                assert torch.equal(keys[row, :, 4 - n :], prefixes[row].layers[layer][0][:, :n])
                assert torch.equal(values[row, :, 4 - n :], prefixes[row].layers[layer][1][:, :n])
    views = row_prefixes(cache, [1, 2], [3, 2])
    assert [v.length for v in views] == [3, 2]
    assert torch.equal(views[0].layers[1][0], prefixes[0].layers[1][0][:, :3])
    assert batch_cache([None], [0], 0).get_seq_length() == 0
    with pytest.raises(ValueError, match="shorter prefix"):
        batch_cache([prefixes[1]], [3], 3)
    # buckets: longest first, grown while padding stays within 25% of the real tokens
    assert _length_buckets([10, 100, 90, 95, 30], 16, 1.25) == [[1, 3, 2], [4], [0]]
    assert _length_buckets([10, 10, 10], 2, 1.25) == [[0, 1], [2]]


def test_prefill_prefixes_match_a_plain_forward(tiny_model_and_tokenizer: tuple[Any, Any]) -> None:
    """Keys/values of padded, bucketed prefills, and of tails run on a shared root, equal
    each list run alone (fp32 round-off)."""
    from transformers import DynamicCache

    from entropace.rollout.kvcache import shared_roots

    model, tok = tiny_model_and_tokenizer
    g = torch.Generator().manual_seed(1)
    lists = [torch.randint(4, 500, (n,), generator=g).tolist() for n in (9, 30, 28, 0, 31)]
    root = torch.randint(4, 500, (40,), generator=g).tolist()
    lists += [root + [7] * 5, root + torch.randint(4, 500, (12,), generator=g).tolist(), root]
    lists.append(lists[1][:20] + [9] * 15)  # shares 20 < 32 tokens with lists[1]: not a root
    assert shared_roots(lists, 32) == [(40, [7, 5, 6])]
    kvs, positions = prefill_prefixes(model, lists, pad_id=tok.pad_token_id)
    # the root once (40); tails 31 (list 4), 30, 28, 35 (list 8), 12, 9, 5; list 7 is the root.
    # Buckets (<= 25% padding): [35, 31, 30, 28] -> 4 x 35, [12, 9] -> 2 x 12, [5]
    assert positions == 40 + 4 * 35 + 2 * 12 + 5 and kvs[3].length == 0
    assert kvs[7].length == 40
    for ids, kv in zip(lists, kvs, strict=True):
        if not ids:
            continue
        cache = DynamicCache()
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]), **{cache_kwarg(model): cache}, use_cache=True)
        assert kv.length == len(ids)
        for (k, v), layer in zip(kv.layers, cache.layers, strict=True):
            torch.testing.assert_close(k, layer.keys[0], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(v, layer.values[0], rtol=1e-5, atol=1e-5)


def test_unsupported_caches_fall_back_to_the_old_path(
    tiny_model_and_tokenizer: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    sliding = transformers.MistralConfig(
        sliding_window=4, num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=64, vocab_size=100,
    )  # fmt: skip
    assert "DynamicSlidingWindowLayer" in str(
        kv_reuse_support(type("M", (), {"config": sliding})())
    )
    assert "no transformers config" in str(kv_reuse_support(object()))
    model, tok = tiny_model_and_tokenizer
    assert kv_reuse_support(model) is None

    # A model the fast path cannot serve: a warning, then exactly the old path.
    reqs = grouped_requests([0, 1], 2)
    old = collect_rollouts(model, tok, reqs, dataclasses.replace(CFG, **PATHS["old"]), seed=3)
    import entropace.rollout.engine as engine

    monkeypatch.setattr(engine, "kv_reuse_support", lambda _m: "layers ['X'] are not full")
    with pytest.warns(RuntimeWarning, match="re-encodes the whole history"):
        fell_back = collect_rollouts(model, tok, reqs, CFG, seed=3)
    assert torch.equal(old.batch.input_ids, fell_back.batch.input_ids)
    assert fell_back.counts["cached_tokens"] == 0
    assert fell_back.counts["prefill_tokens"] == old.counts["prefill_tokens"]


def test_config_switches() -> None:
    assert RolloutConfig().share_prefix and RolloutConfig().reuse_kv
    with pytest.raises(ValueError, match=r"rollout\.reuse_kv must be true or false"):
        RolloutConfig(reuse_kv="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"rollout\.share_prefix"):
        RolloutConfig(share_prefix=1)  # type: ignore[arg-type]


def test_growing_layer_appends_in_place_and_adopts_outside_changes() -> None:
    """Decoding steps write into the reserved buffer (no reallocation, no copy of the cache);
    the views always equal the concatenation ``DynamicLayer`` would hold."""
    from entropace.rollout.kvcache import growing_layer_class

    g = torch.Generator().manual_seed(2)
    chunks = [torch.randn(2, 3, n, 4, generator=g) for n in (5, 1, 1, 1, 2)]
    layer = growing_layer_class()(reserve=4)
    pointers = []
    for i, chunk in enumerate(chunks):
        keys, values = layer.update(chunk, -chunk)
        pointers.append(keys.data_ptr())
        expected = torch.cat(chunks[: i + 1], dim=-2)
        assert torch.equal(keys, expected) and torch.equal(values, -expected)
        assert layer.get_seq_length() == expected.shape[-2]
    # 5 columns + 4 reserved: the first four updates share one buffer, the fifth (10 > 9) grows
    assert len(set(pointers[:4])) == 1 and pointers[4] != pointers[0]
    layer.crop(-3)  # changed from outside (10 -> 7 columns): adopted at the next update
    keys, _ = layer.update(chunks[1], chunks[1])
    assert torch.equal(keys, torch.cat([torch.cat(chunks, -2)[:, :, :7], chunks[1]], -2))
    layer.batch_select_indices(torch.tensor([1]))  # a new tensor: copied into a new buffer
    keys, _ = layer.update(chunks[2][:1], chunks[2][:1])
    assert keys.shape == (1, 3, 9, 4) and torch.equal(keys[:, :, 8:], chunks[2][:1])
