"""Text from a run directory or a user's file, made safe to print or to put in a report.

A run directory may come from someone else (``train --resume``, ``report``, ``compare``,
``eval``): its ``config.yaml`` values, metric keys and directory names are whatever its
author wrote, escape sequences included (``ESC ] 0 ; title BEL`` sets a terminal's window
title, ``ESC [ 2 J`` clears the screen). Every such string goes through :func:`printable`
before it reaches the terminal, a log line, a plot's labels or a report (docs/security.md,
"Terminal and report output").
"""

from __future__ import annotations

import unicodedata

__all__ = ["printable"]

#: Format characters that reorder the text around them (bidirectional overrides, isolates).
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, *, keep: str = "") -> str:
    """``str(text)`` with every control character (Unicode category ``Cc``: C0, DEL, C1) and
    bidirectional format character written as an escape (``\\x1b``, ``\\x07``, ``\\u202e``);
    the characters of ``keep`` (e.g. ``"\\n"`` for a multi-line message) stay as they are.
    Everything else, non-ASCII letters included, is unchanged, so ordinary text reads the same.
    """
    s = str(text)
    if s.isprintable() and not keep:  # the common case: nothing to escape (one C-level scan)
        return s
    out = []
    for ch in s:
        bad = unicodedata.category(ch) == "Cc" or ch in _BIDI
        out.append(_escape(ch) if bad and ch not in keep else ch)
    return "".join(out)
