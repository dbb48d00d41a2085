"""The usage documents of model answers: counted by the API, summed over a backend's calls,
or, where the API reports none, estimated from the text sent and received."""

from __future__ import annotations

import math
from typing import Any

import orjson

from evolane.lanes._backends import BackendCall
from evolane.lanes._usage import usage_document

COUNTS = ("input_tokens", "output_tokens", "cached_input_tokens")


def _count(document: dict[str, Any], key: str) -> int | None:
    value = document.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def add_usage(total: dict[str, Any] | None, more: dict[str, Any]) -> dict[str, Any]:
    """Two usage documents summed: the counts either one has are added, and the sum is
    ``partial`` when either is (or lacks its input or output count: an answer whose usage
    was not reported); ``cached`` only when both answers came from the cache; ``estimated``
    when either is."""
    if total is None:
        return dict(more)
    both = (total, more)
    sums = []
    for key in COUNTS:
        values = [value for value in (_count(d, key) for d in both) if value is not None]
        sums.append(sum(values) if values else None)
    partial = any(
        d.get("partial") is True or _count(d, "input_tokens") is None
        or _count(d, "output_tokens") is None
        for d in both
    )  # fmt: skip
    model = total.get("model") or more.get("model")
    summed = answer_usage(
        str(model or ""),
        *sums,
        cached=bool(total.get("cached") and more.get("cached")),
        partial=partial,
    )
    if total.get("estimated") is True or more.get("estimated") is True:
        summed["estimated"] = True  # some counts are `text_tokens` estimates
    return summed


def answer_usage(
    model: str,
    inputs: int | None = 0,
    outputs: int | None = 0,
    cached_input: int | None = 0,
    *,
    cached: bool,
    partial: bool = False,
) -> dict[str, Any]:
    """The usage document of model answers: the counts given (0 when none was used; None:
    unknown, left out) and ``partial`` when some spend is not counted in it."""
    document = usage_document(
        inputs,
        outputs,
        cached_input_tokens=cached_input,
        model=model,
        cached=cached,
        partial=partial,
    )
    assert document is not None  # counts given or partial: never empty
    return {**document, "cached": cached}


def write_usage(call: BackendCall, usage: dict[str, Any]) -> None:
    """Meter ``usage`` in ``call.usage_file`` (for a backend about to raise: `run_backend`
    writes the usage of a returned value only)."""
    if call.usage_file is not None:
        call.usage_file.write_bytes(orjson.dumps(usage))


MAX_CALL_TOKENS = 100_000_000
"""More tokens than any one call uses: a count past it is a lie, and is not believed."""


def token_count(value: Any) -> int | None:
    """A token count the API reported (None: absent, not a count, or past belief)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        return None
    return int(value) if math.isfinite(value) and value <= MAX_CALL_TOKENS else None


def text_tokens(text: str) -> int:
    """Tokens ``text`` is charged when the API reports none: its UTF-8 bytes over 3 (rounded
    up), more than common tokenizers count for English or code (about 4 bytes a token), so
    an estimate errs toward the ceiling."""
    return -(-len(text.encode("utf-8", "replace")) // 3)


def request_tokens(body: dict[str, Any]) -> int:
    """`text_tokens` of a request's messages (what a provider bills as input)."""
    messages = body.get("messages") or []
    return sum(text_tokens(str(m.get("content") or "")) + 4 for m in messages)
