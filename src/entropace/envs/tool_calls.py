"""Tool calls in model replies: parsing (Hermes / Mistral / Llama formats) and argument checks.

Used by :mod:`entropace.envs.tools` (the interface); the formats and error kinds are described
there and in ``docs/envs/tools.md``. Everything here is linear in the reply's length and never
raises on model output.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_JSON_DEPTH",
    "ParsedReply",
    "ToolCall",
    "format_tool_call",
    "parse_tool_calls",
    "string_parameters",
    "validate_arguments",
]

#: Deepest JSON nesting accepted in a call (deeper is ``bad_json``; keeps ``json`` away from
#: its recursion limit).
MAX_JSON_DEPTH = 32

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_MISTRAL = "[TOOL_CALLS]"
_PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's ``name`` and its ``arguments`` (a JSON object)."""

    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass(frozen=True)
class ParsedReply:
    """What :func:`parse_tool_calls` found: ``content`` is the reply without the call blocks,
    ``calls`` the well-formed calls in order, ``errors`` one message per malformed call."""

    content: str
    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


def _depth_ok(text: str) -> bool:
    """Whether the bracket nesting of ``text`` (outside JSON strings) stays <= MAX_JSON_DEPTH."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def _loads(text: str) -> tuple[Any, str | None]:
    """``(value, None)`` or ``(None, error)``; never raises."""
    if not _depth_ok(text):
        return None, f"the JSON is nested deeper than {MAX_JSON_DEPTH} levels"
    try:
        return json.loads(text), None
    except (ValueError, RecursionError) as exc:
        return None, f"not valid JSON ({str(exc)[:80]})"


def _call_from(obj: Any, index: int) -> ToolCall | str:
    """A :class:`ToolCall` from a decoded JSON value, or an error message."""
    if not isinstance(obj, dict):
        return f"tool call {index + 1} is not a JSON object with 'name' and 'arguments'"
    if isinstance(obj.get("function"), dict):  # OpenAI's {"type": "function", "function": {...}}
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return f"tool call {index + 1} has no 'name' string"
    extra = sorted(set(obj) - {"name", "arguments", "parameters", "id", "type"})
    if extra:
        return f"tool call {index + 1} ({shorten(name)}) has unknown field(s) {extra}"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI's wire format: the arguments as a JSON string
        args, error = _loads(args) if args.strip() else ({}, None)
        if error is not None:
            return f"the arguments of tool call {index + 1} ({shorten(name)}) are {error}"
    if not isinstance(args, dict):
        return f"the arguments of tool call {index + 1} ({shorten(name)}) are not a JSON object"
    call_id = obj.get("id")
    return ToolCall(name, args, call_id if isinstance(call_id, str) else "")


def shorten(text: str, n: int = 40) -> str:
    text = text.replace("\n", " ")
    return repr(text if len(text) <= n else text[:n] + "...")


def _hermes_blocks(text: str) -> tuple[list[str], str, bool]:
    """The bodies of ``<tool_call>...</tool_call>`` blocks, the text outside them, and whether
    any block was found. A last block left open (the reply was cut) runs to the end."""
    bodies: list[str] = []
    outside: list[str] = []
    pos = 0
    found = False
    while True:
        start = text.find(_OPEN, pos)
        if start < 0:
            outside.append(text[pos:])
            break
        found = True
        outside.append(text[pos:start])
        end = text.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            bodies.append(text[start + len(_OPEN) :])
            break
        bodies.append(text[start + len(_OPEN) : end])
        pos = end + len(_CLOSE)
    return bodies, "".join(outside), found


def _strip_fence(body: str) -> str:
    body = body.strip()
    if body.startswith("```"):
        first_newline = body.find("\n")
        body = body[first_newline + 1 :] if first_newline >= 0 else ""
        if body.rstrip().endswith("```"):
            body = body.rstrip()[:-3]
    return body.strip()


def parse_tool_calls(text: str) -> ParsedReply:
    """The tool calls in one reply (formats in the module docstring); never raises.

    Linear in ``len(text)``: one scan for the call tags, one JSON decode per call (the
    environment refuses replies over :data:`~entropace.envs.base.MAX_ACTION_CHARS` before
    calling this).
    """
    if not isinstance(text, str):
        return ParsedReply("", (), ("the reply is not text",))
    calls: list[ToolCall] = []
    errors: list[str] = []
    bodies, outside, found = _hermes_blocks(text)
    if found:
        for i, body in enumerate(bodies):
            value, error = _loads(_strip_fence(body))
            item = _call_from(value, i) if error is None else f"tool call {i + 1} is {error}"
            (calls if isinstance(item, ToolCall) else errors).append(item)  # type: ignore[arg-type]
        return ParsedReply(outside.strip(), tuple(calls), tuple(errors))
    at = text.find(_MISTRAL)
    if at >= 0:
        value, error = _loads(text[at + len(_MISTRAL) :].strip())
        if error is not None:
            return ParsedReply(text[:at].strip(), (), (f"the [TOOL_CALLS] list is {error}",))
        items = value if isinstance(value, list) else [value]
        for i, obj in enumerate(items):
            item = _call_from(obj, i)
            (calls if isinstance(item, ToolCall) else errors).append(item)  # type: ignore[arg-type]
        return ParsedReply(text[:at].strip(), tuple(calls), tuple(errors))
    bare = text.strip()
    if bare.startswith(_PYTHON_TAG):
        bare = bare[len(_PYTHON_TAG) :].strip()
    if bare.startswith("{") and bare.endswith("}"):
        value, error = _loads(bare)
        if error is None and isinstance(value, dict) and "name" in value:
            item = _call_from(value, 0)
            if isinstance(item, ToolCall):
                return ParsedReply("", (item,), ())
            return ParsedReply("", (), (item,))
    return ParsedReply(text.strip(), (), ())


def format_tool_call(call: ToolCall) -> str:
    """The generic (Hermes) text of ``call``: ``<tool_call>\\n{json}\\n</tool_call>``."""
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"{_OPEN}\n{body}\n{_CLOSE}"


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")

_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def _check_value(value: Any, schema: dict[str, Any], where: str) -> str | None:
    kind = schema.get("type")
    if kind is not None and not _TYPES[kind](value):
        return f"{where} must be a JSON {kind}, got {type(value).__name__}"
    if kind == "array" and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problem = _check_value(item, schema["items"], f"{where}[{i}]")
            if problem is not None:
                return problem
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {schema['enum']}"
    if isinstance(value, str) and _SURROGATE.search(value):
        # only a JSON escape such as "\ud800" makes one; no family can encode it
        return f"{where} holds an unpaired UTF-16 surrogate escape"
    return None


def validate_arguments(arguments: dict[str, Any], parameters: dict[str, Any]) -> str | None:
    """``None`` when ``arguments`` satisfy the JSON schema ``parameters``, else what is wrong:
    a missing required argument, an argument not in ``properties`` (when
    ``additionalProperties`` is false), a value of the wrong type, or a string holding an
    unpaired surrogate (a JSON ``"\\ud800"`` escape: not text any family can encode)."""
    props: dict[str, Any] = parameters.get("properties", {})
    missing = [k for k in parameters.get("required", []) if k not in arguments]
    if missing:
        return f"missing required argument(s) {missing}"
    if parameters.get("additionalProperties", True) is False:
        extra = sorted(set(arguments) - set(props))
        if extra:
            return (
                f"unknown argument(s) {[shorten(k, 30) for k in extra]}; arguments: {list(props)}"
            )
    for key, value in arguments.items():
        if key in props:
            problem = _check_value(value, props[key], f"argument {key!r}")
            if problem is not None:
                return problem
    return None


def string_parameters(**described: str) -> dict[str, Any]:
    """The schema of a tool whose arguments are all required strings (AgentBench FC's tools)."""
    return {
        "type": "object",
        "properties": {k: {"type": "string", "description": d} for k, d in described.items()},
        "required": list(described),
        "additionalProperties": False,
    }
