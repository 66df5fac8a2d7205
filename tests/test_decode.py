"""The rollout's decoding loop (issue 36): ``generate``'s tokens without a host synchronisation
per decoding step, on the dynamic and the static (fixed-shape) cache."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch

try:
    from tests.test_rollout import CounterEnv, add_eot_bias
    from tests.test_rollout_kv import PATHS, grouped_requests
except ModuleNotFoundError:  # a site-packages `tests` package (verl's venv) shadows ours
    from test_rollout import CounterEnv, add_eot_bias  # type: ignore[no-redef]
    from test_rollout_kv import PATHS, grouped_requests  # type: ignore[no-redef]

import entropace.rollout.decode as decode_mod
from entropace.rollout import RolloutConfig, collect_rollouts
from entropace.rollout.gen_stats import GenerationRecorder
from entropace.rollout.generate import generate_turn, generation_config, left_pad
from entropace.rollout.kvcache import batch_cache

STOPS = [5, 11, 17, 23, 29, 31, 37, 41]  # frequent enough that most rows stop early


def _prompts(n: int = 8, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 20, (n,), generator=g).tolist()
    return [torch.randint(50, 200, (k,), generator=g).tolist() for k in lengths]


def _bare_generate(model: Any, prompts: list[list[int]], **kw: Any) -> list[list[int]]:
    """``model.generate`` itself (dynamic cache), cut after the first stop as generate_turn."""
    ids, mask = left_pad(prompts, kw["pad_id"], "cpu")
    out = model.generate(input_ids=ids, attention_mask=mask,
                         generation_config=generation_config(**kw))  # fmt: skip
    rows = []
    for row in out[:, ids.shape[1] :].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in kw["stop_ids"]), len(row))
        rows.append(row[:cut])
    return rows


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize(("do_sample", "temperature", "top_p"),
                         [(True, 1.0, 1.0), (True, 0.7, 0.9), (False, 1.0, 1.0)])  # fmt: skip
def test_decoding_loop_samples_what_generate_samples(
    tiny_model_and_tokenizer: tuple[Any, Any], static: bool, do_sample: bool,
    temperature: float, top_p: float,
) -> None:  # fmt: skip
    """Same tokens as ``model.generate`` with the same seed, and the global RNG left in the
    same state (the next call draws the same numbers): rows that stop early, rows that run
    to the budget."""
    model, _ = tiny_model_and_tokenizer
    prompts = _prompts()
    kw = dict(max_new_tokens=40, temperature=temperature, top_p=top_p, do_sample=do_sample,
              stop_ids=STOPS, pad_id=0)  # fmt: skip
    torch.manual_seed(3)
    want = _bare_generate(model, prompts, **kw)
    after = torch.rand(4)
    torch.manual_seed(3)
    got = generate_turn(model, prompts, **kw, static=static)
    assert got == want
    assert torch.equal(torch.rand(4), after)
    lengths = {len(r) for r in want}
    assert min(lengths) < 40 and any(r[-1] in STOPS for r in want)  # stops were exercised


def _run(model: Any, prompts: list[list[int]], every: int, static: bool, steps: int = 60):
    ids, mask = left_pad(prompts, 0, "cpu")
    cursor = torch.zeros(1, dtype=torch.long) if static else None
    cache = batch_cache([None] * len(prompts), [0] * len(prompts), 0, ids.shape[1] + steps,
                        cursor)  # fmt: skip
    rec = GenerationRecorder(0.8)
    torch.manual_seed(11)
    with torch.no_grad():
        out = decode_mod.decode(
            model, ids, mask, cache, cached=0, max_new_tokens=steps, temperature=0.8,
            top_p=1.0, do_sample=True, stop_ids=range(4, 512, 9), pad_id=0, recorder=rec,
            cursor=cursor,
            check_every=every,
        )  # fmt: skip
    stats = torch.stack(rec._columns, dim=1)
    keys = cache.layers[0].keys.clone()
    return out, stats, keys, cache.get_seq_length(), torch.rand(3)


@pytest.mark.parametrize("static", [False, True])
def test_results_do_not_depend_on_the_stop_check_interval(
    tiny_model_and_tokenizer: tuple[Any, Any], static: bool
) -> None:
    """Reading the stop flags every 1, 3 or 16 steps: the same tokens, recorded statistics,
    cache (cut back to the columns generate would hold) and RNG state after the call, though
    the loop ran up to 15 steps past the last row's stop."""
    model, _ = tiny_model_and_tokenizer
    prompts = _prompts(6, seed=2)
    ref = _run(model, prompts, 1, static)
    assert ref[0].shape[1] < 60  # every row stopped before the budget
    for every in (3, 16):
        got = _run(model, prompts, every, static)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
        assert torch.equal(got[2], ref[2]) and got[3] == ref[3]
        assert torch.equal(got[4], ref[4])


class SyncCounter:
    """Counts the host reads of tensor values (``item``, ``tolist``, ``bool``, ``int``,
    ``float``, ``cpu``, ``numpy``): on an accelerator each one waits for the device."""

    NAMES = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")

    def __init__(self) -> None:
        self.count = 0

    @staticmethod
    def _wrap(counter: SyncCounter, fn: Any) -> Any:
        def wrapped(self: torch.Tensor, *a: Any, **k: Any) -> Any:
            if self.numel() > 0 or fn.__name__ != "__bool__":
                counter.count += 1
            return fn(self, *a, **k)

        return wrapped

    def __enter__(self) -> SyncCounter:
        self._saved = {n: getattr(torch.Tensor, n) for n in self.NAMES}
        for name, fn in self._saved.items():
            setattr(torch.Tensor, name, self._wrap(self, fn))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, fn in self._saved.items():
            setattr(torch.Tensor, name, fn)


@pytest.fixture
def _check_every_16(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(decode_mod, "CPU_CHECK_EVERY", 16, raising=False)
    yield


@pytest.mark.parametrize(("static", "bound"), [(False, 0.1), (True, 0.1)])
def test_host_reads_per_decoding_step_are_bounded(
    tiny_model_and_tokenizer: tuple[Any, Any], _check_every_16: None, static: bool, bound: float
) -> None:
    """One ``generate_turn`` of 8 rows x 96 steps (no row stops: the stop id is outside the
    vocabulary), with the accelerator's stop-check interval (16): every host read of a
    tensor value is counted (model forwards included). At most ``bound`` per decoding step
    plus a constant per call; ``model.generate`` reads at least one per step."""
    model, _ = tiny_model_and_tokenizer
    prompts = _prompts()
    kw = dict(max_new_tokens=96, temperature=1.0, top_p=1.0, do_sample=True, stop_ids=[10**6],
              pad_id=0)  # fmt: skip
    with SyncCounter() as bare:
        torch.manual_seed(0)
        want = _bare_generate(model, prompts, **kw)
    with SyncCounter() as ours:
        torch.manual_seed(0)
        got = generate_turn(model, prompts, **kw, static=static)
    assert got == want and all(len(r) == 96 for r in got)
    assert bare.count >= 96  # generate: one or more per step
    assert ours.count <= 12 + bound * 96, ours.count


@pytest.mark.parametrize("path", ["old", "fast"])
@pytest.mark.parametrize("from_generation", [False, True])
def test_static_cache_rollouts_equal_the_dynamic_ones(
    tiny_model_and_tokenizer: tuple[Any, Any], path: str, from_generation: bool
) -> None:
    """Multi-turn rollouts (groups of 3, shared prefixes and KV reuse on the fast path, turns
    cut by the budget): ``rollout.cache=static`` samples the same tokens as ``dynamic`` and
    gets the same statistics from the statistics pass (float32, 1e-6) or from generation
    (1e-5: the generation forward attends over the call's fixed width, so its sums run over
    more, masked, columns; measured 4e-6)."""
    model, tok = tiny_model_and_tokenizer
    add_eot_bias(model, tok, 3.0)
    cfg = RolloutConfig(max_new_tokens_per_turn=12, max_episode_tokens=400, temperature=0.9,
                        stats_from_generation=from_generation, **PATHS[path])  # fmt: skip
    reqs = grouped_requests([0, 1, 5], 3, lambda: CounterEnv(max_turns=4))
    a = collect_rollouts(model, tok, reqs, cfg, seed=5).batch
    b = collect_rollouts(model, tok, reqs, dataclasses.replace(cfg, cache="static"), seed=5).batch
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
    assert int(a.num_turns.sum()) > len(reqs)  # several turns
    for name in ("old_logprobs", "entropy", "sensitivity"):
        tol = 1e-5 if from_generation else 1e-6
        torch.testing.assert_close(getattr(b, name), getattr(a, name), rtol=tol, atol=tol)


def test_cuda_graph_needs_the_static_cache() -> None:
    with pytest.raises(ValueError, match="rollout.cuda_graph=true needs rollout.cache=static"):
        RolloutConfig(cuda_graph=True)
    with pytest.raises(ValueError, match="rollout.cache must be one of"):
        RolloutConfig(cache="paged")  # type: ignore[arg-type]
    assert RolloutConfig(cache="static", cuda_graph=True).cuda_graph
