"""Text for the report page: credentials hidden, then HTML-escaped (the one way text enters
the page, SVG included)."""

from __future__ import annotations

import re
from html import escape
from typing import Any

from evolane.lanes import redact

_SECRETS = (
    re.compile(r"(?i)\bbearer\s+[^\s'\"]+"),
    re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}"),
    re.compile(r"(?i)\b(api[_-]?key|token|secret|password|passwd)(\s*[=:]\s*)[^\s'\"&]+"),
)


def scrub(text: Any) -> str:
    """``text`` as a string with credentials hidden, then HTML-escaped."""
    words = redact(str(text))
    words = _SECRETS[0].sub("Bearer ***", words)
    words = _SECRETS[1].sub("sk-***", words)
    words = _SECRETS[2].sub(lambda m: f"{m.group(1)}{m.group(2)}***", words)
    return escape(words)
