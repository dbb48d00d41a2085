"""Built-in backends named where a command template would go: ``llm:MODEL`` (a model behind
an OpenAI-compatible endpoint) for ``--judge`` and ``--optimizer``."""

from __future__ import annotations

from evolane.inputs._errors import InputError

LLM_PREFIX = "llm:"


def llm_model(spec: str | None, flag: str = "") -> str | None:
    """The model of an ``llm:MODEL`` spec (None for anything else, a command template);
    ``llm:`` without a model is refused (`InputError` naming ``flag``)."""
    if spec is None or not spec.startswith(LLM_PREFIX):
        return None
    model = spec[len(LLM_PREFIX) :].strip()
    if not model or any(c.isspace() for c in model) or len(model) > 128:
        raise InputError(f"{flag or 'llm:'} {spec!r}: say which model, as llm:MODEL")
    return model
