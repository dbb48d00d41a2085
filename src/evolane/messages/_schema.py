"""JSON Schema export of every registered message class and every journal record type."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from evolane.messages._base import message_classes
from evolane.messages._events import EVENT_TYPES
from evolane.messages._journal import JOURNAL_RECORDS


def _one_of(classes: list[type[BaseModel]], title: str) -> dict[str, Any]:
    """One JSON Schema document: each class under ``$defs``, and at the top a ``oneOf`` of
    them, so the document itself validates any one of them (found by review: the top level
    had no rule, and every document, whatever it held, was valid against it)."""
    _, schema = models_json_schema([(cls, "serialization") for cls in classes], title=title)
    schema["oneOf"] = [{"$ref": f"#/$defs/{cls.__name__}"} for cls in classes]
    return schema


def message_schemas() -> dict[str, Any]:
    """One JSON Schema document that validates any message or journal record (its top-level
    ``oneOf``), each under ``$defs``; ``kinds`` maps each message kind, ``journal_records``
    each journal line's ``type``, to its class name."""
    classes = [*message_classes().values(), *JOURNAL_RECORDS.values()]
    schema = _one_of(classes, "evolane messages")
    schema["kinds"] = {kind: cls.__name__ for kind, cls in message_classes().items()}
    schema["journal_records"] = {kind: cls.__name__ for kind, cls in JOURNAL_RECORDS.items()}
    return schema


def event_schemas() -> dict[str, Any]:
    """One JSON Schema document that validates any progress event (a line of
    ``events.jsonl``, of ``--progress jsonl``) through its top-level ``oneOf``; each kind's
    own document is also under its kind (``event.unit``...), as before."""
    schema = _one_of(list(EVENT_TYPES), "evolane progress events")
    schema["required"] = ["kind"]
    for cls in EVENT_TYPES:
        schema[cls.model_fields["kind"].default] = cls.model_json_schema()
    return schema
