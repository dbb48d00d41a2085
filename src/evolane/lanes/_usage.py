"""The usage document: what a command writes to ``usage.json`` (or ``$EVOLANE_USAGE_FILE``)
and what a built-in backend returns; `evolane.inputs.read_usage_document` reads it."""

from __future__ import annotations

from typing import Any

from evolane.messages import Usage

MODEL_CHARS = 128
"""Characters of a model name a usage document keeps."""


def usage_document(
    input_tokens: int | None,
    output_tokens: int | None,
    *,
    cached_input_tokens: int | None = None,
    cost_usd: float | None = None,
    model: str | None = None,
    cached: bool = False,
    partial: bool = False,
) -> dict[str, Any] | None:
    """The usage document a command writes to ``usage.json``: ``tokens`` (input + output)
    and ``cost_usd`` when known, with ``model``, ``input_tokens``, ``output_tokens`` and
    ``cached_input_tokens`` (a part of the input) when reported, ``cached`` for an answer
    taken from a response cache. None when nothing is known (and not ``partial``).

    ``partial`` adds ``"partial": true``: some of the spend is not counted here (a request
    sent whose answer, or whose usage, never came), so the document is never complete to
    `read_usage` whatever its counts say (the ledger charges at least the reservation).

    A document without ``cost_usd`` leaves the spend unknown to `read_usage` (fail-closed)."""
    if input_tokens is None and output_tokens is None and cost_usd is None and not partial:
        return None
    document: dict[str, Any] = {}
    if input_tokens is not None or output_tokens is not None:
        document["tokens"] = (input_tokens or 0) + (output_tokens or 0)
    for key, value in (
        ("input_tokens", input_tokens),
        ("output_tokens", output_tokens),
        ("cached_input_tokens", cached_input_tokens),
        ("cost_usd", cost_usd),
    ):
        if value is not None:
            document[key] = value
    if isinstance(model, str) and model:
        document["model"] = model[:MODEL_CHARS]
    if cached:
        document["cached"] = True
    if partial:
        document["partial"] = True
    return document


def sum_usage(total: Usage, part: Usage) -> Usage:
    """``total`` plus ``part`` per dimension (unknown stays unknown only where both are):
    what the attempts of one unit spent together."""
    values = {}
    for name in ("tokens", "cost_usd", "wall_seconds"):
        a, b = getattr(total, name), getattr(part, name)
        values[name] = None if a is None and b is None else (a or 0.0) + (b or 0.0)
    return Usage(**values, cached=total.cached or part.cached)
