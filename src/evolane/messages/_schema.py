"""JSON Schema export of every registered message class and every journal record type."""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from evolane.messages._base import message_classes
from evolane.messages._journal import JOURNAL_RECORDS


def message_schemas() -> dict[str, Any]:
    """One JSON Schema document covering every message kind and every journal record type,
    keyed under ``$defs``; ``kinds`` maps each message kind, ``journal_records`` each journal
    line's ``type``, to its class name."""
    classes = [*message_classes().values(), *JOURNAL_RECORDS.values()]
    _, schema = models_json_schema(
        [(cls, "serialization") for cls in classes], title="evolane messages"
    )
    schema["kinds"] = {kind: cls.__name__ for kind, cls in message_classes().items()}
    schema["journal_records"] = {kind: cls.__name__ for kind, cls in JOURNAL_RECORDS.items()}
    return schema
