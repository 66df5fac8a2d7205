"""Chat-template layout of a multi-turn trajectory, tokenised once and grown in place.

A trajectory is the token list of the conversation rendered by the tokenizer's chat template:

    [system + first user turn + assistant header]  (prompt_ids)
    [generated tokens of turn 1, exactly as sampled, e.g. "... <|im_end|>"]
    [template tokens closing turn 1 + the next observation as a user turn + assistant header]
    [generated tokens of turn 2]
    ...
    [template tokens closing the last turn]          (closing_ids)

The template tokens between turns are found by rendering the conversation with a placeholder
as the last assistant message and taking the text after it, so any chat template works without
hand-written role markers; the generated tokens are never re-tokenised (no drift between what
was sampled and what is trained on).

Tool-calling environments (``make(name, interface="tools")``) publish ``env.tools`` (JSON
schemas) and mark observations that are tool results (``info["observation_role"] == "tool"``).
:meth:`ChatLayout.tool_rendering` probes the template once: a template that renders ``tools=``
(Qwen2.5/3, Hermes, Llama 3.1, ...) gets the schemas through ``apply_chat_template(tools=...)``
and the results as ``{"role": "tool", "content": ...}`` messages; a template without tool
support (SmolLM2's ChatML) gets the generic format: the schemas and the Hermes
``<tool_call>`` call format appended to the system prompt (:func:`generic_tools_section`) and
each result as ``<tool_response>\n...\n</tool_response>`` in a ``tool`` turn (or a ``user``
turn when the template drops ``tool`` messages). The model's reply stays the assistant
message's content verbatim (no ``tool_calls`` field), so the trajectory holds exactly the
sampled tokens either way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: Stand-in for the last assistant message while rendering what follows it.
PLACEHOLDER = "\x00ENTROPACE-ASSISTANT-TURN\x00"
#: Markers of the one-off probe of a template's tool support.
_PROBE_TOOL = "entropace_probe_tool_7f3a"
_PROBE_RESULT = "ENTROPACE-PROBE-RESULT-7f3a"

Message = dict[str, str]
Tools = list[dict[str, Any]]


def generic_tools_section(tools: Tools) -> str:
    """The generic (Hermes-style) tools section appended to the system prompt when the chat
    template has no tool support: one JSON schema a line, then the call format."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


@dataclass(frozen=True)
class ToolRendering:
    """How a template shows tools: ``native`` (it renders ``tools=``) and the role of tool
    results (``"tool"``, or ``"user"`` when the template drops ``tool`` messages)."""

    native: bool
    result_role: str


def observation_message(observation: str, info: dict[str, Any] | None = None) -> Message:
    """The chat message of an observation: a ``tool`` message (with ``tool_call_id`` and
    ``name``) when ``info["observation_role"] == "tool"``, else a ``user`` message."""
    info = info or {}
    if info.get("observation_role") != "tool":
        return {"role": "user", "content": observation}
    message = {"role": "tool", "content": observation}
    if info.get("tool_call_id"):
        message["tool_call_id"] = str(info["tool_call_id"])
    if info.get("tool_name"):
        message["name"] = str(info["tool_name"])
    return message


class ChatLayout:
    """Renders and tokenises the template parts of a conversation for one tokenizer.

    Attributes:
        stop_ids: token ids that end an assistant turn (the tokenizer's eos token, the
            ``<|im_end|>`` / ``<|eot_id|>`` / ``<end_of_turn>`` token when present, and the
            model's ``generation_config.eos_token_id`` values passed in).
    """

    END_OF_TURN_TOKENS: tuple[str, ...] = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")

    def __init__(self, tokenizer: Any, extra_stop_ids: list[int] | tuple[int, ...] = ()) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "tokenizer has no chat template; set tokenizer.chat_template (ChatML for SmolLM2)"
            )
        self.tokenizer = tokenizer
        stop: set[int] = {int(i) for i in extra_stop_ids}
        if tokenizer.eos_token_id is not None:
            stop.add(int(tokenizer.eos_token_id))
        vocab = tokenizer.get_vocab()
        for token in self.END_OF_TURN_TOKENS:
            if token in vocab:
                stop.add(int(vocab[token]))
        if not stop:
            raise ValueError("tokenizer has no eos or end-of-turn token: turns could never end")
        self.stop_ids: frozenset[int] = frozenset(stop)
        self._tool_rendering: ToolRendering | None = None

    def _apply(self, messages: list[Message], add_generation_prompt: bool, tools: Any) -> str:
        kwargs = {"tools": tools} if tools else {}
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}")
        return text

    def tool_rendering(self) -> ToolRendering:
        """Probe (once) whether the template renders ``tools=`` and ``tool`` messages."""
        if self._tool_rendering is None:
            probe = [
                {
                    "type": "function",
                    "function": {
                        "name": _PROBE_TOOL,
                        "description": "probe",
                        "parameters": {"type": "object", "properties": {}},
                    },
                }
            ]
            base: list[Message] = [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "u"},
            ]
            try:
                native = _PROBE_TOOL in self._apply(base, True, probe)
            except Exception:  # noqa: BLE001 - a template that rejects tools= has no support
                native = False
            turn = [
                *base,
                {"role": "assistant", "content": "a"},
                {"role": "tool", "content": _PROBE_RESULT, "tool_call_id": "call_1", "name": "t"},
            ]
            try:
                shown = _PROBE_RESULT in self._apply(turn, True, probe if native else None)
            except Exception:  # noqa: BLE001 - a template that rejects the tool role
                shown = False
            self._tool_rendering = ToolRendering(native, "tool" if shown else "user")
        return self._tool_rendering

    def _prepare(self, messages: list[Message], tools: Tools | None) -> tuple[list[Message], Any]:
        """The messages and ``tools=`` argument to render (module docstring)."""
        if not tools:
            return [_plain(m) if m["role"] == "tool" else m for m in messages], None
        how = self.tool_rendering()
        out: list[Message] = []
        for m in messages:
            if m["role"] == "tool":
                if how.native and how.result_role == "tool":
                    out.append(m)
                else:
                    wrapped = f"<tool_response>\n{m['content']}\n</tool_response>"
                    out.append({"role": how.result_role, "content": wrapped})
            elif m["role"] == "system" and not how.native:
                section = generic_tools_section(tools)
                content = f"{m['content']}\n\n{section}" if m["content"] else section
                out.append({"role": "system", "content": content})
            else:
                out.append(m)
        return out, (tools if how.native else None)

    def render(
        self, messages: list[Message], *, add_generation_prompt: bool, tools: Tools | None = None
    ) -> str:
        """The template's text of ``messages`` (with ``tools`` shown as the template can)."""
        prepared, tools_arg = self._prepare(messages, tools)
        return self._apply(prepared, add_generation_prompt, tools_arg)

    def encode(self, text: str) -> list[int]:
        """Token ids of template text (special tokens in the text are parsed, none are added)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def prompt_ids(self, system: str, observation: str, *, tools: Tools | None = None) -> list[int]:
        """The first prompt: system turn (with the tools), user turn, assistant header."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": observation}]
        return self.encode(self.render(messages, add_generation_prompt=True, tools=tools))

    def _after_last_assistant(
        self, messages: list[Message], next_message: Message | None, tools: Tools | None
    ) -> str:
        """Template text after the last assistant message's content.

        ``messages`` ends with that assistant message. With ``next_message`` (the next user or
        tool turn) the text runs to the next assistant header; without it, to the end.
        """
        if not messages or messages[-1]["role"] != "assistant":
            raise ValueError("the conversation must end with an assistant message")
        msgs = [*messages[:-1], {"role": "assistant", "content": PLACEHOLDER}]
        if next_message is not None:
            msgs.append(next_message)
        text = self.render(msgs, add_generation_prompt=next_message is not None, tools=tools)
        at = text.rfind(PLACEHOLDER)
        if at < 0:
            raise ValueError("the chat template dropped the assistant message content")
        return text[at + len(PLACEHOLDER) :]

    def _strip_generated_stop(self, suffix: str, stop_text: str | None) -> str:
        if stop_text and suffix.startswith(stop_text):
            return suffix[len(stop_text) :]
        return suffix

    def continuation_ids(
        self,
        messages: list[Message],
        observation: str | Message,
        stop_text: str | None,
        *,
        tools: Tools | None = None,
    ) -> list[int]:
        """Tokens between the last generated token and the next turn's first generated token.

        Args:
            messages: the conversation so far, ending with the assistant turn just generated.
            observation: the environment's next observation: text (a user turn) or a message
                (:func:`observation_message`: a user or tool turn).
            stop_text: the decoded end-of-turn token the model generated (e.g. ``<|im_end|>``),
                or ``None`` when the turn was cut by the token budget. A generated end-of-turn
                token already closes the turn, so the template's copy of it is skipped.
            tools: the environment's tools (``env.tools``), or None.
        """
        message = (
            {"role": "user", "content": observation}
            if isinstance(observation, str)
            else observation
        )
        suffix = self._after_last_assistant(messages, message, tools)
        return self.encode(self._strip_generated_stop(suffix, stop_text))

    def closing_ids(
        self, messages: list[Message], stop_text: str | None, *, tools: Tools | None = None
    ) -> list[int]:
        """Template tokens that close the last assistant turn (after its generated tokens)."""
        suffix = self._after_last_assistant(messages, None, tools)
        return self.encode(self._strip_generated_stop(suffix, stop_text))


def _plain(message: Message) -> Message:
    """A tool message rendered without tools (not produced by the engine): a user turn."""
    return {"role": "user", "content": message["content"]}
