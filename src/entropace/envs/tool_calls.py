"""Tool calls in model replies: parsing (Hermes / Mistral / Llama / OpenAI formats) and checks.

Used by :mod:`entropace.envs.tools` (the interface); the error kinds are described there and in
``docs/envs/tools.md``. Formats, tried in this order (the first that matches decides):

1. Hermes / Qwen: ``<tool_call>{...}</tool_call>`` blocks anywhere in the reply;
2. Mistral: ``[TOOL_CALLS]`` and a JSON list of calls;
3. a reply that is one JSON object (after an optional ``<|python_tag|>``): a call
   ``{"name", "arguments" | "parameters"}`` (Llama 3.1 JSON), or an OpenAI assistant message
   ``{"tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}], ...}``;
4. Llama 3.2 pythonic: a reply that is a Python list of calls with keyword arguments,
   ``[get_weather(city="Paris", days=3), finish()]`` (literal values only: strings, numbers,
   booleans, None, lists, dicts);
5. a JSON call after prose: the reply ends with one JSON object with ``name`` and
   ``arguments`` / ``parameters`` (optionally in a ```` ``` ```` fence), after text that is
   the model's thinking. Only where unambiguous: the object must end the reply, and no other
   top-level JSON object of the reply may be call-shaped (two are not guessed between).

Everything here is linear in the reply's length (one scan per format, each character decoded
at most once) and never raises on model output.
"""

from __future__ import annotations

import ast
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
    outer_id = obj.get("id")
    if isinstance(obj.get("function"), dict):  # OpenAI's {"type": "function", "function": {...}}
        extra = sorted(set(obj) - {"function", "id", "type"})
        if extra:
            return f"tool call {index + 1} has unknown field(s) {extra}"
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
    call_id = obj.get("id", outer_id)
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
        if error is None and isinstance(value, dict) and "tool_calls" in value:
            return _openai_message(value)
    if bare.startswith("[") and bare.endswith("]") and _PYTHONIC_START.match(bare):
        return _pythonic(bare)
    after = _call_after_prose(text)
    if after is not None:
        return after
    return ParsedReply(text.strip(), (), ())


def _openai_message(message: dict[str, Any]) -> ParsedReply:
    """The calls of an OpenAI assistant message ``{"tool_calls": [...], "content": ...}``."""
    extra = sorted(set(message) - {"tool_calls", "role", "content"})
    content = message.get("content")
    content = content.strip() if isinstance(content, str) else ""
    items = message["tool_calls"]
    if extra or not isinstance(items, list):
        why = f"unknown field(s) {extra}" if extra else "'tool_calls' is not a list"
        return ParsedReply(content, (), (f"the tool_calls message has {why}",))
    calls: list[ToolCall] = []
    errors: list[str] = []
    for i, obj in enumerate(items):
        item = _call_from(obj, i)
        (calls if isinstance(item, ToolCall) else errors).append(item)  # type: ignore[arg-type]
    return ParsedReply(content, tuple(calls), tuple(errors))


# --------------------------------------------------------------------------------------------
# Llama 3.2 pythonic calls: [name(key=value, ...), ...]
# --------------------------------------------------------------------------------------------

_PYTHONIC_START = re.compile(r"\[\s*[A-Za-z_][A-Za-z0-9_.]*\s*\(")


def _python_depth_ok(text: str) -> bool:
    """Bracket nesting of Python source ``text`` (outside '...' / "..." strings) <= the limit."""
    depth = 0
    quote = ""
    escaped = False
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return False
        elif ch in ")]}":
            depth -= 1
    return True


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _pythonic(body: str) -> ParsedReply:
    """Llama 3.2's pythonic format: a list of calls with keyword arguments and literal values."""
    if not _python_depth_ok(body):
        return ParsedReply(
            "", (), (f"the call list is nested deeper than {MAX_JSON_DEPTH} levels",)
        )
    try:
        tree = ast.parse(body, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return ParsedReply("", (), (f"the call list is not valid Python ({str(exc)[:80]})",))
    if not isinstance(tree.body, ast.List):
        return ParsedReply("", (), ("the call list is not a Python list of calls",))
    calls: list[ToolCall] = []
    errors: list[str] = []
    for i, node in enumerate(tree.body.elts):
        name = _dotted(node.func) if isinstance(node, ast.Call) else None
        if not isinstance(node, ast.Call) or name is None:
            errors.append(f"tool call {i + 1} is not a call name(key=value, ...)")
            continue
        if node.args or any(k.arg is None for k in node.keywords):
            errors.append(f"tool call {i + 1} ({shorten(name)}) has positional arguments")
            continue
        try:
            args = {str(k.arg): ast.literal_eval(k.value) for k in node.keywords}
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            errors.append(f"an argument of tool call {i + 1} ({shorten(name)}) is not a literal")
            continue
        if any(isinstance(v, set | tuple | bytes | complex) for v in args.values()):
            errors.append(f"an argument of tool call {i + 1} ({shorten(name)}) is not JSON")
            continue
        calls.append(ToolCall(name, args))
    return ParsedReply("", tuple(calls), tuple(errors))


# --------------------------------------------------------------------------------------------
# A JSON call after prose
# --------------------------------------------------------------------------------------------


def _top_level_objects(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each balanced top-level ``{...}`` of ``text`` (one scan).

    Outside an object, quotes are prose and ignored; inside one, JSON strings are tracked so
    that braces in them do not count. An object left open runs past the end and is dropped.
    """
    spans: list[tuple[int, int]] = []
    depth = 0
    start = 0
    in_string = escaped = False
    for i, ch in enumerate(text):
        if depth == 0:
            if ch == "{":
                depth, start = 1, i
            continue
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                spans.append((start, i + 1))
    return spans


def _call_shaped(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("name"), str)
        and ("arguments" in value or "parameters" in value)
    )


def _call_after_prose(text: str) -> ParsedReply | None:
    """The JSON call that ends ``text`` after prose, or None (rules in the module docstring)."""
    if "{" not in text:
        return None
    tail = text.rstrip()
    if tail.endswith("```"):
        tail = tail[:-3].rstrip()
    if not tail.endswith("}"):
        return None
    spans = _top_level_objects(tail)
    if not spans or spans[-1][1] != len(tail):
        return None
    decoded = [_loads(tail[a:b]) for a, b in spans]  # disjoint spans: linear in total
    shaped = [
        k for k, (value, error) in enumerate(decoded) if error is None and _call_shaped(value)
    ]
    if shaped != [len(spans) - 1]:
        return None  # the last object is not a call, or another object is one too
    start = spans[-1][0]
    prose = tail[:start].rstrip()
    if prose.endswith("```json") or prose.endswith("```"):
        prose = prose[: prose.rfind("```")].rstrip()
    item = _call_from(decoded[-1][0], 0)
    if isinstance(item, ToolCall):
        return ParsedReply(prose, (item,), ())
    return ParsedReply(prose, (), (item,))


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
