"""JSON Schema export of every registered message class."""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from evolane.messages._base import message_classes


def message_schemas() -> dict[str, Any]:
    """One JSON Schema document covering every message kind, keyed under ``$defs``."""
    classes = list(message_classes().values())
    _, schema = models_json_schema(
        [(cls, "serialization") for cls in classes], title="evolane messages"
    )
    schema["kinds"] = {kind: cls.__name__ for kind, cls in message_classes().items()}
    return schema
