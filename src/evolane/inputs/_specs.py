"""Backends named where a command template would go: the built-in ``llm:MODEL`` (a model
behind an OpenAI-compatible endpoint) for ``--judge`` and ``--optimizer``, and the shape of a
plugin's ``NAME:ARGS`` (whether NAME is an installed plugin is `evolane.lanes`' to say)."""

from __future__ import annotations

import re

from evolane.inputs._errors import InputError

LLM_PREFIX = "llm:"
PLUGIN_SPEC = re.compile(r"([a-z][a-z0-9_-]*):(.*)", re.DOTALL)
"""``NAME:ARGS`` with a lower-case NAME: the only shape that can name a plugin backend
(``C:\\x`` never matches; ``https://...`` names a plugin only if one called ``https`` is
installed: see `plugin_words`)."""


def llm_model(spec: str | None, flag: str = "") -> str | None:
    """The model of an ``llm:MODEL`` spec (None for anything else, a command template);
    ``llm:`` without a model is refused (`InputError` naming ``flag``)."""
    if spec is None or not spec.startswith(LLM_PREFIX):
        return None
    model = spec[len(LLM_PREFIX) :].strip()
    if not model or any(c.isspace() for c in model) or len(model) > 128:
        raise InputError(f"{flag or 'llm:'} {spec!r}: say which model, as llm:MODEL")
    return model


def plugin_words(spec: str | None) -> tuple[str, str] | None:
    """``(NAME, ARGS)`` when ``spec`` has the shape ``NAME:ARGS`` (NAME lower-case letters,
    digits, ``_`` and ``-``, starting with a letter), else None. The shape alone decides
    nothing: a value is a plugin spec only when NAME is also an installed plugin, otherwise
    it stays a command template."""
    if spec is None:
        return None
    match = PLUGIN_SPEC.fullmatch(spec.strip())
    return (match.group(1), match.group(2).strip()) if match is not None else None
