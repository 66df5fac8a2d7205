"""Demonstrations for a warm start: where they come from and how they are tokenised.

A :class:`Demo` is one conversation, ``system``, ``user``, then ``assistant`` replies
alternating with ``user`` / ``tool`` observations. Three sources (:data:`DEMO_SOURCES`, the
warm start's ``source``):

* ``oracle``: each task's scripted oracle (:attr:`entropace.envs.EnvSpec.oracle`) played on
  train-split seeds through the same environment factory as training (its turn limit, its
  interface: text actions, or tool calls through :func:`entropace.envs.tools.tool_oracle`);
  only successful episodes are kept;
* ``prior``: each task's *demonstration prior* (:attr:`entropace.envs.EnvSpec.prior`), a noisy
  demonstrator whose reply distribution the task's options set (the lab's per-position
  probabilities of the right and of a favourite wrong letter); every episode is kept, since the
  distribution is the point;
* ``jsonl``: a file of chat exchanges, one JSON object a line: ``{"messages": [{"role", "content"},
  ...], "tools": [...] (optional), "task": "..." (optional)}``.

:func:`tokenize_demo` lays a demo out exactly as the rollout engine lays out a trajectory
(:mod:`entropace.rollout.chat`: the first prompt, each reply's tokens followed by the
end-of-turn token the model generates, the template's tokens between turns), with the loss mask
on the replies and their end-of-turn tokens only, so the fine-tuned model is trained on the very
token layout it acts in during RL.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entropace.rollout.chat import ChatLayout, Message, Tools, observation_message

__all__ = [
    "DEMO_SOURCES",
    "Demo",
    "DemoError",
    "TokenizedDemo",
    "end_of_turn_id",
    "play_demo",
    "policy_demos",
    "read_jsonl_demos",
    "tokenize_demo",
]

#: Roles a demonstration's messages may have.
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
#: Most bytes of a demonstrations file (a larger one is refused, not read into memory).
MAX_JSONL_BYTES = 1 << 30
#: Most bytes of one line of a demonstrations file (4 MiB: about a million tokens, far more than
#: any ``max_tokens``); a longer line is refused before it is parsed or tokenised.
MAX_JSONL_LINE_BYTES = 4 << 20


class DemoError(ValueError):
    """A demonstration (or a demonstrations file) that cannot be used, with where and why."""


@dataclass(frozen=True)
class Demo:
    """One demonstration conversation.

    Attributes:
        task: the task it demonstrates (a family name, or the file's ``task`` field, or ``""``).
        messages: ``system`` (optional, first), then a ``user`` turn, then ``assistant`` replies
            alternating with ``user`` / ``tool`` observations; at least one reply.
        tools: the tools' JSON schemas shown to the model (tool-calling environments), or None.
        seed: the environment seed it was played on (None for a file's demos).
        success: whether the episode succeeded (None for a file's demos).
    """

    task: str
    messages: tuple[Message, ...]
    tools: Tools | None = None
    seed: int | None = None
    success: bool | None = None

    def __post_init__(self) -> None:
        check_messages(self.messages, where=f"demo of {self.task or 'a file'}")


def check_messages(messages: Sequence[Any], where: str) -> None:
    """Raise :class:`DemoError` unless ``messages`` is a conversation a demo can hold."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise DemoError(f"{where}: 'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise DemoError(f"{where}: message {i} must be an object with a string 'content'")
        _check_text(m["content"], f"{where}: message {i}")
        if m.get("role") not in ROLES:
            raise DemoError(f"{where}: message {i} has role {m.get('role')!r}; allowed {ROLES}")
    body = list(messages[1:] if messages[0]["role"] == "system" else messages)
    if not body or body[0]["role"] != "user":
        raise DemoError(f"{where}: the first message after the system prompt must be 'user'")
    for i, m in enumerate(body):
        expected = ("assistant",) if i % 2 else ("user", "tool")
        if m["role"] not in expected:
            raise DemoError(
                f"{where}: message {i + len(messages) - len(body)} has role {m['role']!r}; "
                "replies ('assistant') must alternate with observations ('user' / 'tool')"
            )
    if len(body) < 2:
        raise DemoError(f"{where}: no 'assistant' reply to learn from")


def _check_text(text: str, where: str) -> None:
    """:class:`DemoError` when ``text`` cannot be encoded as UTF-8 (a lone surrogate such as a
    JSON ``"\\ud800"`` escape), which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DemoError(
            f"{where}: not valid Unicode ({exc.reason} at character {exc.start}: "
            f"{text[exc.start:exc.end]!a})"
        ) from None


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------


def play_demo(task: str, env: Any, policy: Callable[[str], str], seed: int) -> Demo:
    """Play one episode of ``env`` (already built, not yet reset) with ``policy`` and record it
    as the rollout engine would show it to the model: the env's system prompt and tools, its
    observations as ``user`` turns (``tool`` turns for tool results)."""
    obs, _ = env.reset(seed)
    system = str(getattr(env, "system_prompt", ""))
    tools = getattr(env, "tools", None)
    tools = list(tools) if isinstance(tools, list | tuple) and tools else None
    messages: list[Message] = [
        {"role": "system", "content": system}, {"role": "user", "content": obs}
    ]  # fmt: skip
    success = False
    while True:
        action = policy(obs)
        messages.append({"role": "assistant", "content": action})
        obs, _reward, terminated, truncated, info = env.step(action)
        success = success or bool(info.get("success", False))
        if terminated or truncated:
            break
        messages.append(observation_message(obs, info if tools else None))
    return Demo(task=task, messages=tuple(messages), tools=tools, seed=seed, success=success)


def policy_demos(
    task: str,
    factory: Callable[[], Any],
    seeds: Sequence[int],
    policy_of: Callable[[Any], Callable[[str], str]],
    *,
    keep_failures: bool,
) -> tuple[list[Demo], int]:
    """One episode per seed, the policy built by ``policy_of(env)`` after each reset.

    Returns ``(demos, dropped)``: the demos kept (all, or only the successful ones when
    ``keep_failures`` is False) and how many episodes were dropped.
    """
    demos, dropped = [], 0
    for seed in seeds:
        env = factory()
        holder: dict[str, Callable[[str], str]] = {}

        def act(obs: str, env: Any = env, holder: dict[str, Any] = holder) -> str:
            if "policy" not in holder:  # built after reset, as oracles expect
                holder["policy"] = policy_of(env)
            return holder["policy"](obs)

        try:
            demo = play_demo(task, env, act, int(seed))
        finally:
            close = getattr(env, "close", None)
            if callable(close):
                close()
        if demo.success or keep_failures:
            demos.append(demo)
        else:
            dropped += 1
    return demos, dropped


def oracle_policy(task: str) -> Callable[[Any], Callable[[str], str]]:
    """``env -> policy``: the task's oracle (through its tool calls when ``env`` has tools)."""
    from entropace.envs import spec
    from entropace.envs.tools import tool_oracle

    oracle = spec(task).oracle

    def build(env: Any) -> Callable[[str], str]:
        return tool_oracle(oracle)(env) if getattr(env, "tools", None) else oracle(env)

    return build


def prior_policy(
    task: str, rng: random.Random, options: dict[str, Any]
) -> Callable[[Any], Callable[[str], str]]:
    """``env -> policy``: the task's demonstration prior with ``options``; a :class:`DemoError`
    when the task has none or the options do not fit it."""
    from entropace.envs import spec

    prior = spec(task).prior
    if prior is None:
        raise DemoError(
            f"task {task!r} has no demonstration prior (EnvSpec.prior); use the oracle "
            "(warm_start.source=oracle) or a file of demonstrations (source=jsonl)"
        )

    def build(env: Any) -> Callable[[str], str]:
        try:
            return prior(env, rng, **options)
        except (TypeError, ValueError) as exc:
            raise DemoError(f"warm_start.prior.{task}: {exc}") from None

    return build


def _jsonl_lines(path: Path, max_line_bytes: int) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each line of ``path``, read one line at a time: a line of
    more than ``max_line_bytes`` bytes, or one that is not UTF-8, is a :class:`DemoError`
    naming it (the rest of the line is never read into memory)."""
    with path.open("rb") as fh:
        for lineno in itertools.count(1):
            raw = fh.readline(max_line_bytes + 1)
            if not raw:
                return
            if len(raw) > max_line_bytes:
                raise DemoError(
                    f"{path}:{lineno}: longer than {max_line_bytes} bytes, the most a "
                    "demonstration line may hold (cut the conversation, or split it)"
                )
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DemoError(
                    f"{path}:{lineno}: not UTF-8 ({exc.reason} at byte {exc.start} of the line)"
                ) from None


def read_jsonl_demos(
    path: str | Path,
    max_bytes: int = MAX_JSONL_BYTES,
    max_line_bytes: int = MAX_JSONL_LINE_BYTES,
) -> list[Demo]:
    """The demos of a JSONL file (module docstring); :class:`DemoError` naming the line of any
    malformed one (not JSON, not UTF-8, a lone surrogate, longer than ``max_line_bytes``, a
    ``tools`` entry that is not a JSON object). The file must be a regular file of at most
    ``max_bytes``."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise DemoError(f"demonstrations file {str(path)!r} does not exist or is not a file")
    if path.stat().st_size > max_bytes:
        raise DemoError(f"{path}: larger than {max_bytes} bytes")
    demos: list[Demo] = []
    for lineno, line in _jsonl_lines(path, max_line_bytes):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise DemoError(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(row, dict) or "messages" not in row:
            raise DemoError(f"{where}: expected an object with 'messages'")
        unknown = sorted(set(row) - {"messages", "tools", "task"})
        if unknown:
            raise DemoError(f"{where}: unknown field(s) {unknown}; allowed messages, tools, task")
        tools = row.get("tools")
        if tools is not None and not (isinstance(tools, list) and tools):
            raise DemoError(f"{where}: 'tools' must be a non-empty list of schemas")
        for i, schema in enumerate(tools or []):
            if not isinstance(schema, dict):
                raise DemoError(
                    f"{where}: tools entry {i} must be a JSON object (a tool's schema), "
                    f"got {type(schema).__name__}"
                )
            _check_text(json.dumps(schema, ensure_ascii=False), f"{where}: tools entry {i}")
        task = row.get("task", "")
        if not isinstance(task, str):
            raise DemoError(f"{where}: 'task' must be a string")
        _check_text(task, f"{where}: 'task'")
        check_messages(row["messages"], where)
        messages = tuple({"role": m["role"], "content": m["content"]} for m in row["messages"])
        demos.append(Demo(task=task, messages=messages, tools=tools))
    if not demos:
        raise DemoError(f"{path}: no demonstrations")
    return demos


#: The warm start's sources by name (the ``source`` of :class:`WarmStartConfig`).
DEMO_SOURCES: tuple[str, ...] = ("oracle", "prior", "jsonl")


# --------------------------------------------------------------------------------------------
# Tokenisation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenizedDemo:
    """A demo's token ids and loss mask (1 on the replies' tokens and end-of-turn tokens).

    Attributes:
        truncated: the demo was cut at ``max_tokens`` (its later replies are not trained on).
    """

    task: str
    ids: list[int]
    loss_mask: list[int]
    truncated: bool = False


def end_of_turn_id(layout: ChatLayout) -> int:
    """The token a model ends a reply with: the template's end-of-turn token
    (``<|im_end|>``, ``<|eot_id|>`` ...) when the tokenizer has one, else its eos token."""
    vocab = layout.tokenizer.get_vocab()
    for token in ChatLayout.END_OF_TURN_TOKENS:
        if token in vocab:
            return int(vocab[token])
    return int(layout.tokenizer.eos_token_id)


def tokenize_demo(layout: ChatLayout, demo: Demo, max_tokens: int) -> TokenizedDemo:
    """Token ids and loss mask of ``demo`` in the rollout engine's layout (module docstring):

        prompt_ids(system, first user turn)            mask 0
        encode(reply_1) + [end of turn]                mask 1
        continuation_ids(..., observation_2, ...)      mask 0
        encode(reply_2) + [end of turn]                mask 1
        ...

    A demo longer than ``max_tokens`` is cut there (``truncated``); the turns after the cut
    are not tokenised.
    """
    messages = list(demo.messages)
    if messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": ""})  # the engine always has one
    stop = end_of_turn_id(layout)
    stop_text = layout.decode([stop])
    ids = layout.prompt_ids(messages[0]["content"], messages[1]["content"], tools=demo.tools)
    mask = [0] * len(ids)
    conversation: list[Message] = messages[:2]
    for message in messages[2:]:
        if len(ids) > max_tokens:  # cut here: the later turns are not tokenised
            break
        if message["role"] == "assistant":
            part = [*layout.encode(message["content"]), stop]
            flag = 1
        else:
            part = layout.continuation_ids(conversation, message, stop_text, tools=demo.tools)
            flag = 0
        ids += part
        mask += [flag] * len(part)
        conversation.append(message)
    truncated = len(ids) > max_tokens
    return TokenizedDemo(demo.task, ids[:max_tokens], mask[:max_tokens], truncated)
