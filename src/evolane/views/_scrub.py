"""Text for the report page: credentials hidden, then HTML-escaped (the one way text enters
the page, SVG included)."""

from __future__ import annotations

import re
from html import escape
from typing import Any

from evolane.lanes import redact
from evolane.messages import printable

_KEY = r"[A-Za-z0-9_.-]*(?:api[_-]?key|token|secret|passw(?:or)?d|pwd|credential)[A-Za-z0-9_.-]*"
_SECRETS: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (re.compile(r"(?i)\bbearer\s+[^\s'\"]+"), "Bearer ***"),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}"), "sk-***"),
    # NAME_API_KEY=v, access_token: v, password = "v", {"api_key": "v"}, ?token=v&
    (re.compile(rf"(?i)({_KEY}[\"']?\s*[=:]\s*)([\"']?)([^\s\"'&,;}}]+)"), None),
    # --api-key v, --password=v
    (re.compile(rf"(?i)(--{_KEY}[= ]\s*)[^\s\"']+"), r"\1***"),
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def scrub(text: Any) -> str:
    """``text`` as a string with credentials hidden (URL passwords, bearer tokens, ``sk-``
    keys, values of keys named like a key, token, secret or password) and control
    characters dropped, bidirectional controls shown as U+FFFD (`printable`: found by
    review, a candidate's file ``a<U+202E>txt.exe`` read ``aexe.txt`` in the page's diff),
    then HTML-escaped."""
    words = printable(_CONTROL.sub("", redact(str(text))))
    for pattern, replacement in _SECRETS:
        words = pattern.sub(replacement or _hide_value, words)
    return escape(words)


def _hide_value(match: re.Match[str]) -> str:
    """A key's value hidden, unless it is a plain number (``max_tokens=5``, ``tokens: 12``)."""
    if re.fullmatch(r"[0-9][0-9.,_]*", match.group(3)):
        return match.group(0)
    return f"{match.group(1)}{match.group(2)}***"
