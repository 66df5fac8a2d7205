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
"""

from __future__ import annotations

from typing import Any

#: Stand-in for the last assistant message while rendering what follows it.
PLACEHOLDER = "\x00ENTROPACE-ASSISTANT-TURN\x00"

Message = dict[str, str]


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

    def render(self, messages: list[Message], *, add_generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}")
        return text

    def encode(self, text: str) -> list[int]:
        """Token ids of template text (special tokens in the text are parsed, none are added)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def prompt_ids(self, system: str, observation: str) -> list[int]:
        """The first prompt: system turn, user turn, assistant header."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": observation}]
        return self.encode(self.render(messages, add_generation_prompt=True))

    def _after_last_assistant(self, messages: list[Message], next_user: str | None) -> str:
        """Template text after the last assistant message's content.

        ``messages`` ends with that assistant message. With ``next_user`` the text runs to the
        next assistant header; without it, to the end of the rendering.
        """
        if not messages or messages[-1]["role"] != "assistant":
            raise ValueError("the conversation must end with an assistant message")
        msgs = [*messages[:-1], {"role": "assistant", "content": PLACEHOLDER}]
        if next_user is not None:
            msgs.append({"role": "user", "content": next_user})
        text = self.render(msgs, add_generation_prompt=next_user is not None)
        at = text.rfind(PLACEHOLDER)
        if at < 0:
            raise ValueError("the chat template dropped the assistant message content")
        return text[at + len(PLACEHOLDER) :]

    def _strip_generated_stop(self, suffix: str, stop_text: str | None) -> str:
        if stop_text and suffix.startswith(stop_text):
            return suffix[len(stop_text) :]
        return suffix

    def continuation_ids(
        self, messages: list[Message], observation: str, stop_text: str | None
    ) -> list[int]:
        """Tokens between the last generated token and the next turn's first generated token.

        Args:
            messages: the conversation so far, ending with the assistant turn just generated.
            observation: the environment's next observation (the next user turn).
            stop_text: the decoded end-of-turn token the model generated (e.g. ``<|im_end|>``),
                or ``None`` when the turn was cut by the token budget. A generated end-of-turn
                token already closes the turn, so the template's copy of it is skipped.
        """
        suffix = self._after_last_assistant(messages, observation)
        return self.encode(self._strip_generated_stop(suffix, stop_text))

    def closing_ids(self, messages: list[Message], stop_text: str | None) -> list[int]:
        """Template tokens that close the last assistant turn (after its generated tokens)."""
        suffix = self._after_last_assistant(messages, None)
        return self.encode(self._strip_generated_stop(suffix, stop_text))
