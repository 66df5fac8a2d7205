"""The warm start (train/demos.py, train/sft.py, train/warm_start.py): the demonstrations' token
layout and loss mask, the fine-tuning loss against a float64 loop, micro-batch invariance, a
bit-reproducible build, the cache and the pin, loading the result, and config errors."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import torch

from entropace.envs import make, spec
from entropace.envs.lab import LAB_TASKS, favourite_letter
from entropace.envs.toy import register_letter_envs
from entropace.rollout.chat import ChatLayout
from entropace.train.config import ConfigError, load_config
from entropace.train.demos import (
    Demo,
    DemoError,
    policy_demos,
    prior_policy,
    read_jsonl_demos,
    tokenize_demo,
)
from entropace.train.sft import batches, fine_tune
from entropace.train.warm_start import (
    WarmStartError,
    ensure_warm_start,
    file_sha256,
    warm_start_key,
)

register_letter_envs("letter", "letter2")

LAB = ["lab2-easy", "lab2-mid", "lab2-hard"]
#: a lab run with a short prior warm start (the lab3 preset's shape, few steps)
BASE = [
    "model=tiny", "tasks=lab2-easy,lab2-mid,lab2-hard", "steps=2", "algo=grpo", "P=1", "G=4",
    "rollout.max_turns=1", "rollout.max_new_tokens_per_turn=5", "rollout.max_episode_tokens=256",
    "log.progress=false", "log.tensorboard=false", "log.report=false",
    "warm_start.source=prior", "warm_start.episodes=16", "warm_start.steps=6",
    "warm_start.batch_size=8", "warm_start.micro_batch_size=8", "warm_start.measure_prompts=2",
    "warm_start.measure_samples=2",
]  # fmt: skip
PRIOR = (
    "warm_start.prior={lab2-easy: {correct: [0.6, 0.25], favourite: [0.2, 0.55]}, "
    "lab2-hard: {correct: 0.15, favourite: 0.5}}"
)
WARM = [*BASE, PRIOR]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ENTROPACE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# ------------------------------------------------------------------------------ layout


def test_tokenized_demo_is_the_chat_template_with_the_mask_on_replies(tiny_tokenizer) -> None:
    layout = ChatLayout(tiny_tokenizer)
    demo = Demo(
        task="t",
        messages=(
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "Again."},
            {"role": "assistant", "content": "hi there"},
        ),
    )
    row = tokenize_demo(layout, demo, max_tokens=10_000)
    # the whole sequence is ChatML's rendering of the conversation up to the last reply's end
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSay hi.<|im_end|>\n"
        "<|im_start|>assistant\nhi<|im_end|>\n<|im_start|>user\nAgain.<|im_end|>\n"
        "<|im_start|>assistant\nhi there<|im_end|>"
    )
    assert layout.decode(row.ids) == expected
    # the loss mask covers exactly the replies and the end-of-turn token the model generates
    masked = [i for i, m in zip(row.ids, row.loss_mask) if m]
    assert layout.decode(masked) == "hi<|im_end|>hi there<|im_end|>"
    assert masked.count(tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")) == 2
    assert not row.truncated
    cut = tokenize_demo(layout, demo, max_tokens=len(row.ids) - 3)
    assert cut.truncated and cut.ids == row.ids[:-3] and cut.loss_mask == row.loss_mask[:-3]


def test_prompt_is_the_rollout_engines_first_prompt(tiny_tokenizer) -> None:
    layout = ChatLayout(tiny_tokenizer)
    env = make("lab2-mid")
    obs, _ = env.reset(5)
    demo = policy_demos("lab2-mid", lambda: make("lab2-mid"), [5], spec("lab2-mid").oracle,
                        keep_failures=False)[0][0]  # fmt: skip
    row = tokenize_demo(layout, demo, 10_000)
    prompt = layout.prompt_ids(env.system_prompt, obs)
    assert row.ids[: len(prompt)] == prompt and not any(row.loss_mask[: len(prompt)])
    assert layout.decode(row.ids[len(prompt) :]) == "JHj<|im_end|>"
    assert demo.success and demo.seed == 5


def test_oracle_demos_keep_successes_and_prior_demos_keep_everything() -> None:
    demos, dropped = policy_demos(
        "letter", lambda: make("letter"), [0, 1, 2], lambda env: (lambda obs: "zzz"),
        keep_failures=False,
    )  # fmt: skip
    assert demos == [] and dropped == 3
    demos, dropped = policy_demos(
        "letter", lambda: make("letter"), [0, 1], lambda env: (lambda obs: "zzz"),
        keep_failures=True,
    )  # fmt: skip
    # a failing episode runs to the turn limit: reply, "Try again.", reply
    assert dropped == 0 and [len(d.messages) for d in demos] == [5, 5]
    assert [m["role"] for m in demos[0].messages] == [
        "system", "user", "assistant", "user", "assistant"
    ]  # fmt: skip


def test_lab_prior_follows_its_probabilities() -> None:
    """Each position: the code's letter with p = correct, the favourite wrong letter with p =
    favourite, the other letters uniformly (chi-square-free check: 4 SE bounds, 20k draws)."""
    task = LAB_TASKS["lab2-mid"]  # alphabet JHjqY, code JHj
    correct, favourite = [0.3, 0.2, 0.6], [0.5, 0.1, 0.0]
    build = prior_policy("lab2-mid", random.Random(1), {"correct": correct, "favourite": favourite})
    env = make("lab2-mid")
    env.reset(3)
    policy = build(env)
    n = 20_000
    replies = [policy("") for _ in range(n)]
    for i, letter in enumerate(task.code):
        fav = favourite_letter(task.alphabet, letter)
        counts = Counter(r[i] for r in replies)
        others = [a for a in task.alphabet if a not in (letter, fav)]
        expected = {letter: correct[i], fav: favourite[i]}
        expected.update({a: (1 - correct[i] - favourite[i]) / len(others) for a in others})
        for a, p in expected.items():
            se = (p * (1 - p) / n) ** 0.5
            assert abs(counts[a] / n - p) <= 4 * se + 1e-12, (i, a, counts[a] / n, p)
    assert favourite_letter("SFwk", "S") == "F" and favourite_letter("SFwk", "k") == "S"


@pytest.mark.parametrize(
    "options, match",
    [
        ({"correct": [0.5]}, "list of 3"),
        ({"correct": 0.7, "favourite": 0.5}, "<= 1"),
        ({"correct": 1.5}, "probability"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_prior_options_are_refused_at_config_load(options: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, [*BASE, f"warm_start.prior={{lab2-mid: {json.dumps(options)}}}"])


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["tasks=letter"], "no demonstration prior"),
        (["warm_start.source=jsonl"], "warm_start.path"),
        (["warm_start.source=jsonl", "warm_start.path=/nonexistent.jsonl"], "does not exist"),
        (["warm_start.tasks=[letter]"], "not among the run's tasks"),
        (["warm_start.source=oracle", PRIOR], "prior applies to source=prior"),
        (["warm_start.tasks=[lab2-mid]", PRIOR], "not among the warm start's tasks"),
        (["warm_start.sha256=abc"], "64 lowercase hex"),
        (["warm_start.micro_batch_size=9"], "exceeds"),
        (["warm_start.source=sft"], "warm_start.source"),
        (["warm_start.steps=0"], "warm_start.steps"),
    ],
)
def test_bad_warm_start_configs_are_refused_at_load(overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, [*BASE, *overrides])


def test_jsonl_demos_are_read_and_malformed_lines_named(tmp_path: Path) -> None:
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    path = tmp_path / "demos.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({**good, "task": "kg"}) + "\n")
    demos = read_jsonl_demos(path)
    assert [d.task for d in demos] == ["", "kg"] and demos[0].messages[1]["content"] == "a"
    bad_rows = {
        "not json": "line 1",
        json.dumps({"messages": [{"role": "assistant", "content": "a"}]}): "first message",
        json.dumps({"messages": [{"role": "user", "content": "q"}]}): "no 'assistant'",
        json.dumps({"messages": [{"role": "user", "content": "q"},
                                 {"role": "user", "content": "q"}]}): "alternate",  # fmt: skip
        json.dumps({"messages": [{"role": "bot", "content": "q"}]}): "role 'bot'",
        json.dumps({**good, "extra": 1}): "unknown field",
        json.dumps([1]): "expected an object",
    }
    for text, match in bad_rows.items():
        path.write_text(text + "\n")
        with pytest.raises(DemoError, match=match):
            read_jsonl_demos(path)


def test_jsonl_lines_are_read_one_at_a_time_with_a_limit_and_decoding_errors_named(
    tmp_path: Path,
) -> None:
    """F1/F2/F4 of issue 37: a line longer than the limit is refused naming it (before it is
    parsed or tokenised; was 19.9 GB and 238 s for 100 MB), invalid UTF-8 and lone surrogates
    name their line (were tracebacks), ``tools`` entries must be JSON objects (F3)."""
    from entropace.train.demos import MAX_JSONL_LINE_BYTES

    good = json.dumps(
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    )
    path = tmp_path / "demos.jsonl"
    path.write_text(good + "\n" + good[:-1] + ', "task": "' + "x" * 200 + '"}\n')
    with pytest.raises(DemoError, match=rf"{path}:2: longer than 100 bytes"):
        read_jsonl_demos(path, max_line_bytes=100)
    assert len(read_jsonl_demos(path)) == 2
    with path.open("w") as fh:
        fh.write(good + "\n" + '{"messages": "' + "x" * MAX_JSONL_LINE_BYTES + '"}\n')
    with pytest.raises(DemoError, match=rf":2: longer than {MAX_JSONL_LINE_BYTES} bytes"):
        read_jsonl_demos(path)
    path.write_bytes(good.encode() + b"\n\x80\x81\n")
    with pytest.raises(DemoError, match=rf"{path}:2: not UTF-8 \(invalid start byte at byte 0"):
        read_jsonl_demos(path)
    rows = {
        '{"messages":[{"role":"user","content":"\\ud800"},{"role":"assistant","content":"a"}]}':
            r":1: message 0: not valid Unicode \(surrogates not allowed at character 0",
        good[:-1] + ', "tools": [1, "x", null]}': ":1: tools entry 0 must be a JSON object",
    }  # fmt: skip
    for text, match in rows.items():
        path.write_text(text + "\n")
        with pytest.raises(DemoError, match=match):
            read_jsonl_demos(path)


def test_a_demonstration_set_without_reply_tokens_is_refused(cache, tmp_path) -> None:
    """F3 of issue 37: demonstrations whose replies all lie past ``max_tokens`` (was a warm
    start trained on nothing, loss 0.0000, exit 0) are refused before fine-tuning."""
    path = tmp_path / "demos.jsonl"
    path.write_text(json.dumps({"messages": [
        {"role": "user", "content": "a long question " * 20}, {"role": "assistant", "content": "a"},
    ]}) + "\n")  # fmt: skip
    cfg = load_config(None, [
        "model=tiny", "tasks=lab2-easy", "warm_start.source=jsonl", f"warm_start.path={path}",
        "warm_start.steps=1", "warm_start.batch_size=1", "warm_start.micro_batch_size=1",
        "warm_start.measure_prompts=0", "warm_start.max_tokens=16",
    ])  # fmt: skip
    with pytest.raises(WarmStartError, match="no reply token within 16 tokens .*max_tokens"):
        ensure_warm_start(cfg)
    assert not list((cache / "warmstart").glob("[0-9a-f]*"))  # nothing cached


def test_a_cut_demo_is_the_full_tokenisation_cut(tiny_tokenizer) -> None:
    """Cutting while tokenising (the turns after the cut are not tokenised) gives the same ids
    and mask as cutting the whole conversation's tokens."""
    layout = ChatLayout(tiny_tokenizer)
    turns = [{"role": "user", "content": "q"}]
    for i in range(6):
        turns += [{"role": "assistant", "content": f"reply {i} " * 3},
                  {"role": "user", "content": f"obs {i}"}]  # fmt: skip
    demo = Demo(task="t", messages=tuple(turns[:-1]))
    full = tokenize_demo(layout, demo, 10**6)
    assert not full.truncated
    for cut in (5, len(full.ids) // 2, len(full.ids) - 1):
        part = tokenize_demo(layout, demo, cut)
        assert part.truncated and part.ids == full.ids[:cut]
        assert part.loss_mask == full.loss_mask[:cut]
    assert tokenize_demo(layout, demo, len(full.ids)) == full


# ------------------------------------------------------------------------------ the loss


def _rows(tiny_tokenizer, n: int = 6):
    layout = ChatLayout(tiny_tokenizer)
    rng = random.Random(0)
    build = prior_policy("lab2-hard", rng, {"correct": 0.3, "favourite": 0.3})
    demos = policy_demos("lab2-hard", lambda: make("lab2-hard"), range(n), build,
                         keep_failures=True)[0]  # fmt: skip
    return [tokenize_demo(layout, d, 10_000) for d in demos]


def test_first_loss_is_the_float64_nll_of_the_replies(tiny_model_and_tokenizer) -> None:
    model, tokenizer = tiny_model_and_tokenizer
    rows = _rows(tokenizer)
    reference = model.double()
    total, count = 0.0, 0
    with torch.no_grad():
        for r in rows:  # one sequence at a time, no padding: the brute-force reference
            logits = reference(torch.tensor([r.ids])).logits[0].double()
            logp = torch.log_softmax(logits, dim=-1)
            for t in range(1, len(r.ids)):
                if r.loss_mask[t]:
                    total -= float(logp[t - 1, r.ids[t]])
                    count += 1
    model.float()
    losses = fine_tune(model, rows, steps=1, batch_size=len(rows), micro_batch_size=2,
                       lr=1e-3, pad_id=tokenizer.pad_token_id)  # fmt: skip
    assert losses[0] == pytest.approx(total / count, rel=1e-5)


def test_micro_batching_does_not_change_the_fine_tuning(single_thread) -> None:
    from entropace.models.tiny import build_tiny_model

    results = []
    for micro in (1, 3, 6):
        model, tokenizer = build_tiny_model(seed=0)
        rows = _rows(tokenizer)
        losses = fine_tune(model, rows, steps=3, batch_size=6, micro_batch_size=micro, lr=3e-3,
                           pad_id=tokenizer.pad_token_id)  # fmt: skip
        results.append((losses, [p.detach().clone() for p in model.parameters()]))
    for losses, params in results[1:]:
        assert losses == pytest.approx(results[0][0], rel=1e-5)
        for a, b in zip(params, results[0][1]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def _mixed_rows(tokenizer, n: int = 4):
    """Demos of two tasks (two system prompts), interleaved."""
    layout = ChatLayout(tokenizer)
    rows = []
    for task in ("lab2-hard", "lab2-easy"):
        build = prior_policy(task, random.Random(0), {"correct": 0.3, "favourite": 0.3})
        demos = policy_demos(task, lambda task=task: make(task), range(n), build,
                             keep_failures=True)[0]  # fmt: skip
        rows.append([tokenize_demo(layout, d, 10_000) for d in demos])
    return [r for pair in zip(*rows) for r in pair]


def test_micro_batches_of_several_tasks_give_the_float64_nll_and_the_same_update(
    single_thread,
) -> None:
    """The two tasks' system prompts run once per micro-batch (shared prefixes, LM head on the
    replies only): the loss is the brute-force float64 NLL, and the update does not depend on
    how the batch is cut (one row per micro-batch: nothing shared)."""
    from entropace.models.tiny import build_tiny_model

    model, tokenizer = build_tiny_model(seed=0)
    rows = _mixed_rows(tokenizer)
    assert len({r.task for r in rows}) == 2
    reference = build_tiny_model(seed=0)[0].double()
    total, count = 0.0, 0
    with torch.no_grad():
        for r in rows:
            logp = torch.log_softmax(reference(torch.tensor([r.ids])).logits[0], dim=-1)
            total -= sum(float(logp[t - 1, r.ids[t]]) for t in range(1, len(r.ids)) if r.loss_mask[t])
            count += sum(r.loss_mask[1:])
    results = []
    for micro in (1, 8):
        model = build_tiny_model(seed=0)[0]
        losses = fine_tune(model, rows, steps=2, batch_size=8, micro_batch_size=micro, lr=3e-3,
                           pad_id=tokenizer.pad_token_id, share_prefix=True)  # fmt: skip
        assert losses[0] == pytest.approx(total / count, rel=1e-5)
        results.append((losses, [p.detach().clone() for p in model.parameters()]))
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-5)
    # Adam moves every weight by ~lr = 3e-3 a step; round-off in a near-zero gradient moves
    # a few by up to ~1e-5 differently
    for a, b in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_batches_draw_without_replacement_within_a_pass() -> None:
    out = batches(10, 4, 5, torch.Generator().manual_seed(0))
    flat = [i for b in out for i in b]
    assert len(out) == 5 and all(len(b) == 4 for b in out)
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))


# ------------------------------------------------------------------------------ build, cache


def test_build_is_bit_reproducible_cached_pinned_and_loads(cache, single_thread) -> None:
    cfg = load_config(None, WARM)
    first = ensure_warm_start(cfg)
    assert first.built and first.path.parent == cache / "warmstart"
    again = ensure_warm_start(cfg)  # from the cache, not rebuilt
    assert not again.built and again.sha256 == first.sha256
    rebuilt = ensure_warm_start(cfg, rebuild=True)  # a second build: the same bytes
    assert rebuilt.built and rebuilt.sha256 == first.sha256
    assert file_sha256(rebuilt.path / "model.safetensors") == first.sha256
    record = json.loads((first.path / "warm_start.json").read_text())
    assert record["sha256"] == first.sha256 and len(record["losses"]) == 6
    assert record["demos"]["lab2-easy"] == {"kept": 16, "dropped": 0}
    assert set(record["measured"]) == set(LAB)
    # the pin: the same config pinned to another hash is refused, its own hash accepted
    pinned = load_config(None, [*WARM, f"warm_start.sha256={'f' * 64}"])
    assert warm_start_key(pinned) == warm_start_key(cfg)  # the pin is not part of the recipe
    with pytest.raises(WarmStartError, match="pins"):
        ensure_warm_start(pinned)
    ensure_warm_start(load_config(None, [*WARM, f"warm_start.sha256={first.sha256}"]))
    # a changed recipe is another key
    assert warm_start_key(load_config(None, [*WARM, "warm_start.lr=2e-3"])) != first.key
    # model.name loads the result: the same weights
    from entropace.models import load_model

    model, tokenizer = load_model(str(first.path))
    assert tokenizer.chat_template is not None
    from safetensors.torch import load_file

    saved = load_file(str(first.path / "model.safetensors"))
    for name, value in model.state_dict().items():
        if name in saved:
            assert torch.equal(value, saved[name])


#: two short warm starts of the tiny model (different weights, different keys)
SHORT = [*WARM, "warm_start.measure_prompts=0"]


def test_cached_weights_are_checked_against_their_record_at_every_load(
    cache, single_thread
) -> None:
    """F5/F7: weights swapped for another entry's, or truncated, are not used: the entry is
    rebuilt (the same bytes again) or, when the config pins a hash, refused naming both."""
    cfg = load_config(None, [*SHORT, "warm_start.steps=2"])
    other = load_config(None, [*SHORT, "warm_start.steps=1"])
    k, o = ensure_warm_start(cfg), ensure_warm_start(other)
    assert k.sha256 != o.sha256
    weights = k.path / "model.safetensors"
    weights.write_bytes((o.path / "model.safetensors").read_bytes())  # swapped
    pinned = load_config(None, [*SHORT, "warm_start.steps=2", f"warm_start.sha256={k.sha256}"])
    with pytest.raises(WarmStartError, match=f"sha256 {o.sha256}.*pins"):
        ensure_warm_start(pinned)
    said: list[str] = []
    again = ensure_warm_start(cfg, log=said.append)
    assert again.built and again.sha256 == k.sha256 == file_sha256(weights)
    assert any("its record says" in m for m in said)
    with weights.open("r+b") as fh:  # truncated
        fh.truncate(1000)
    again = ensure_warm_start(cfg)
    assert again.built and file_sha256(weights) == k.sha256


def test_symlinked_and_corrupt_entries_are_refused_and_half_written_ones_rebuilt(
    cache, single_thread
) -> None:
    """F5/F6: an entry that is (or holds) a symbolic link, or whose record is not JSON, is a
    clear error naming it and what to do; one without its weights is rebuilt."""
    cfg = load_config(None, [*SHORT, "warm_start.steps=2"])
    k = ensure_warm_start(cfg)
    o = ensure_warm_start(load_config(None, [*SHORT, "warm_start.steps=1"]))
    record = k.path / "warm_start.json"
    text = record.read_text()
    record.write_text('{"trunc')
    with pytest.raises(WarmStartError, match=r"warm_start.json is not valid JSON.*delete"):
        ensure_warm_start(cfg)
    record.write_text(text)
    (k.path / "model.safetensors").unlink()
    (k.path / "model.safetensors").symlink_to(o.path / "model.safetensors")
    with pytest.raises(WarmStartError, match="symbolic link"):
        ensure_warm_start(cfg)
    import shutil

    shutil.rmtree(k.path)
    k.path.symlink_to(o.path)
    with pytest.raises(WarmStartError, match="symbolic link"):
        ensure_warm_start(cfg)
    k.path.unlink()
    k.path.mkdir()  # half-written: no weights, no record
    again = ensure_warm_start(cfg)
    assert again.built and again.sha256 == k.sha256


def test_a_finished_entry_loads_without_the_build_lock(cache, single_thread) -> None:
    """F8: loading a finished entry writes nothing (no lock file is created), so a read-only
    cache serves it."""
    cfg = load_config(None, [*SHORT, "warm_start.steps=2"])
    built = ensure_warm_start(cfg)
    lock = cache / "warmstart" / f".{built.key}.lock"
    lock.unlink()
    before = sorted(p.name for p in (cache / "warmstart").iterdir())
    found = ensure_warm_start(cfg)
    assert not found.built and found.sha256 == built.sha256
    assert sorted(p.name for p in (cache / "warmstart").iterdir()) == before


def test_training_starts_from_the_warm_start_and_evaluates_it_at_step_0(
    cache, tmp_path, single_thread
) -> None:
    from entropace.models import load_model
    from entropace.train.checkpoint import latest_checkpoint, load_checkpoint
    from entropace.train.held_out import held_out_metrics
    from entropace.train.metrics_log import read_metrics
    from entropace.train.trainer import train

    cfg = load_config(None, [*WARM, "eval.every=2", "eval.n=3"])
    warm = ensure_warm_start(cfg)
    train(cfg, tmp_path / "run")
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2]
    # step 0 is the warm-started policy the run started from, on the held-out seeds
    model, tokenizer = load_model(str(warm.path))
    expected = held_out_metrics(model, tokenizer, cfg)
    assert {k: v for k, v in rows[0].items() if k.startswith("eval/")} == pytest.approx(expected)
    assert "eval/lab2-hard/success" in rows[2]
    ckpt = latest_checkpoint(tmp_path / "run" / "checkpoints")
    state = load_checkpoint(ckpt, model=load_model(str(warm.path))[0], restore_rng=False)
    assert state["warm_start"] == {"key": warm.key, "sha256": warm.sha256}

    # the run goes on only from those weights: a resume or an evaluation whose config now
    # gives another warm start (one step fewer) is refused, naming both hashes
    from entropace.train.checkpoint import CheckpointError
    from entropace.train.config import load_config_file, save_config
    from entropace.train.evaluation import evaluate

    other = ensure_warm_start(load_config(None, [*WARM, "warm_start.steps=5"]))
    assert other.sha256 != warm.sha256
    with pytest.raises(CheckpointError, match=f"{warm.sha256}.*{other.sha256}"):
        train(load_config(None, [*WARM, "warm_start.steps=5", "steps=3"]), tmp_path / "run",
              resume=True)  # fmt: skip
    saved = tmp_path / "run" / "config.yaml"
    save_config(load_config_file(saved, ["warm_start.steps=5"]), saved)
    with pytest.raises(CheckpointError, match=f"{warm.sha256}.*{other.sha256}"):
        evaluate(tmp_path / "run", n=2, split="test", write=False)


def test_the_lab3_preset_loads_its_shipped_pinned_warm_start(cache) -> None:
    """The lab v3 warm start ships with the package under its recipe's key, and its weights are
    the ones the preset pins: the preset loads it without building (an empty cache)."""
    from entropace.train.warm_start import SHIPPED_DIR

    cfg = load_config("lab3")
    key = warm_start_key(cfg)
    shipped = SHIPPED_DIR / key
    assert (shipped / "model.safetensors").is_file(), f"no shipped warm start for key {key}"
    assert file_sha256(shipped / "model.safetensors") == cfg.warm_start.sha256
    record = json.loads((shipped / "warm_start.json").read_text())
    assert record["key"] == key and record["sha256"] == cfg.warm_start.sha256
    found = ensure_warm_start(cfg)
    assert found.path == shipped and not found.built and not (cache / "warmstart" / key).exists()
    # what it was calibrated to: 0.5-1.5 nats per token and greedy success 0 on every task
    for task in LAB:
        assert 0.5 <= record["measured"][task]["entropy"] <= 1.5
        assert record["measured"][task]["greedy_success"] == 0.0


def test_the_quick_preset_loads_its_shipped_pinned_adapter(cache) -> None:
    """Item 7 of issue 37: the main job's warm start ships with the package as its LoRA
    adapter (a few MB, not a copy of the model) under its recipe's key, pinned by the preset;
    an empty cache finds it without building or writing anything."""
    from entropace.train.warm_start import SHIPPED_DIR

    cfg = load_config("quick")
    key = warm_start_key(cfg)
    shipped = SHIPPED_DIR / key
    adapter = shipped / "adapter.safetensors"
    assert adapter.is_file(), f"no shipped warm start for key {key}"
    assert sorted(p.name for p in shipped.iterdir()) == ["adapter.safetensors", "warm_start.json"]
    assert adapter.stat().st_size < 8 << 20
    assert file_sha256(adapter) == cfg.warm_start.sha256
    record = json.loads((shipped / "warm_start.json").read_text())
    assert record["key"] == key and record["sha256"] == cfg.warm_start.sha256
    assert record["base_model"] == "smollm2-135m" and record["weights"] == "adapter.safetensors"
    losses = record["losses"]
    assert len(losses) == 10 and losses[-1] < losses[0] / 5  # it learnt the demonstrations
    found = ensure_warm_start(cfg)
    assert found.path == shipped and not found.built
    assert not (cache / "warmstart").exists()  # nothing written


def test_runs_started_together_build_the_warm_start_once(cache, single_thread) -> None:
    """A grid's runs start together: one builds (under a file lock), the others wait and load."""
    from concurrent.futures import ThreadPoolExecutor

    cfg = load_config(None, [*WARM, "warm_start.steps=2", "warm_start.measure_prompts=0"])
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: ensure_warm_start(cfg), range(3)))
    assert sorted(r.built for r in results) == [False, False, True]
    assert len({r.sha256 for r in results}) == 1


def test_warmstart_cli_reports_copies_and_refuses_what_it_cannot_do(cache, tmp_path, capsys) -> None:
    from entropace.cli import main

    out = tmp_path / "copy"
    assert main(["warmstart", "--preset", "lab3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    cfg = load_config("lab3")
    assert f"sha256 (model.safetensors): {cfg.warm_start.sha256}" in text
    assert "matches the config's pin" in text and "| lab2-hard | 1.230 |" in text
    assert file_sha256(out / "model.safetensors") == cfg.warm_start.sha256
    assert main(["warmstart", "--preset", "lab3", "--out", str(out)]) == 2  # exists
    assert "exists" in capsys.readouterr().err
    assert main(["warmstart", "--preset", "lab2"]) == 2  # lab2 has no warm start
    assert "warm_start.source=none" in capsys.readouterr().err
    assert main(["warmstart", "--preset", "lab3", "warm_start.source=jsonl"]) == 2
    assert "warm_start.path" in capsys.readouterr().err


#: LoRA on the tiny model's upper decoder layer only (it has two)
UPPER_LORA = [
    "warm_start.lora=true", "model.lora_r=4", "model.lora_alpha=8",
    r"model.lora_target_modules=.*\.layers\.1\.(self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj",
]  # fmt: skip


def test_full_fine_tuning_keys_are_those_from_before_the_lora_option() -> None:
    """Caches and pins made before ``warm_start.lora`` existed are still found (the key of
    ``WARM`` computed by the code of da8234d); the adapter's shape is part of a LoRA key."""
    assert warm_start_key(load_config(None, WARM)) == "f0d32b290a53c028eab1b759"
    lora = warm_start_key(load_config(None, [*WARM, *UPPER_LORA]))
    assert lora != "f0d32b290a53c028eab1b759"
    shared = warm_start_key(load_config(None, [*WARM, "warm_start.share_prefix=true"]))
    assert shared not in ("f0d32b290a53c028eab1b759", lora)
    assert warm_start_key(load_config(None, [*WARM, *UPPER_LORA, "model.lora_r=8"])) != lora


def test_lora_warm_start_is_an_adapter_of_the_upper_layers_merged_as_it_loads(
    cache, single_thread
) -> None:
    """``warm_start.lora``: the entry holds the adapter alone (the LoRA tensors of layer 1, no
    copy of the model); ``model.name`` = the entry loads a plain model (no adapter modules) equal
    to the base everywhere but in the adapted projections of layer 1, which are
    ``W + (alpha / r) B A`` of the saved tensors; its loss on the demonstrations fell."""
    from safetensors.torch import load_file

    from entropace.models.tiny import build_tiny_model
    from entropace.train.config import ModelConfig
    from entropace.train.policy import build_model

    cfg = load_config(None, [*WARM, *UPPER_LORA, "warm_start.steps=8", "warm_start.lr=3e-2"])
    warm = ensure_warm_start(cfg)
    assert sorted(p.name for p in warm.path.iterdir()) == ["adapter.safetensors", "warm_start.json"]
    assert warm.sha256 == file_sha256(warm.path / "adapter.safetensors")
    adapter = load_file(str(warm.path / "adapter.safetensors"))
    assert len(adapter) == 14 and all(".layers.1." in k and ".lora_" in k for k in adapter)
    model, _, _ = build_model(ModelConfig(name=str(warm.path), device="cpu"))
    merged = model.state_dict()
    base = build_tiny_model(seed=0)[0].state_dict()
    assert set(merged) == set(base)  # a plain model
    adapted = {k for k in base if ".layers.1." in k and k.endswith("_proj.weight")}
    assert len(adapted) == 7
    for name, value in base.items():
        if name in adapted:
            stem = "base_model.model." + name.removesuffix(".weight")
            delta = adapter[f"{stem}.lora_B.default.weight"] @ adapter[f"{stem}.lora_A.default.weight"]
            torch.testing.assert_close(merged[name], value + 2.0 * delta)  # alpha / r = 8 / 4
            assert not torch.equal(merged[name], value), name
        else:
            assert torch.equal(merged[name], value), name
    losses = warm.record["losses"]
    assert len(losses) == 8 and losses[-1] < losses[0]


def test_a_lora_warm_start_is_the_same_bytes_whatever_the_process_drew_before(
    cache, single_thread
) -> None:
    """The adapter's initialisation comes from ``warm_start.seed``, not from the global RNG's
    state (was: a LoRA warm start built by ``train`` after other draws differed from one built
    by ``warmstart``, so a shipped adapter could not be rebuilt to its pin); the caller's RNG
    state is left as it was."""
    cfg = load_config(None, [*SHORT, *UPPER_LORA, "warm_start.steps=2"])
    first = ensure_warm_start(cfg)
    torch.manual_seed(1234)
    torch.rand(1000)
    state = torch.get_rng_state()
    again = ensure_warm_start(cfg, rebuild=True)
    assert again.built and again.sha256 == first.sha256
    assert torch.equal(torch.get_rng_state(), state)


def test_eval_of_a_lora_run_uses_its_warm_start(cache, tmp_path, single_thread) -> None:
    """``entropace eval`` of a LoRA run started from a warm start puts the checkpoint's adapter
    on the warm start, not on ``model.name``: its greedy replies are those of warm start +
    adapter, and differ from those of the untuned base + adapter."""
    from entropace.envs import seeds
    from entropace.models import apply_lora
    from entropace.models.tiny import build_tiny_model
    from entropace.train.checkpoint import latest_checkpoint, load_checkpoint
    from entropace.train.evaluation import evaluate
    from entropace.train.held_out import held_out_episodes
    from entropace.train.trainer import train

    cfg = load_config(None, [*WARM, *UPPER_LORA, "model.lora=true", "optim.lr=1e-2",
                             "warm_start.steps=8", "warm_start.lr=3e-2"])  # fmt: skip
    train(cfg, tmp_path / "run")
    result = evaluate(tmp_path / "run", n=4, split="test", write=False)
    warm = ensure_warm_start(cfg)
    ckpt = latest_checkpoint(tmp_path / "run" / "checkpoints")
    lora = {"r": 4, "alpha": 8, "target_modules": cfg.model.lora_target_modules}

    def replies(model, tokenizer):
        load_checkpoint(ckpt, model=model, restore_rng=False)
        factories = {t: cfg.tasks.env_factory(t) for t in LAB}
        episodes = held_out_episodes(model, tokenizer, cfg.rollout, factories,
                                     [int(s) for s in seeds("test", 4)])  # fmt: skip
        return [e["actions"] for e in episodes]

    from entropace.train.config import ModelConfig
    from entropace.train.policy import build_model

    warm_model, warm_tokenizer, _ = build_model(ModelConfig(name=str(warm.path), device="cpu"))
    on_warm = replies(apply_lora(warm_model, lora), warm_tokenizer)
    base, tokenizer = build_tiny_model(seed=0)
    on_base = replies(apply_lora(base, lora), tokenizer)
    assert [e["actions"] for e in result["episodes"]] == on_warm
    assert on_warm != on_base
