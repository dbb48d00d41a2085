"""Typed, frozen, bounded messages and the `ArtifactRef` that carries payloads by reference."""

from evolane.messages._base import (
    MAX_MESSAGE_BYTES,
    ArtifactRef,
    Digest,
    MediaType,
    Message,
    Name,
    Record,
    ShortText,
    Text,
    message_classes,
)
from evolane.messages._bounds import unbounded_fields
from evolane.messages._schema import message_schemas
from evolane.messages._system import DeadLetter, Ping, Pong, StressWork

__all__ = [
    "MAX_MESSAGE_BYTES",
    "ArtifactRef",
    "DeadLetter",
    "Digest",
    "MediaType",
    "Message",
    "Name",
    "Ping",
    "Pong",
    "Record",
    "ShortText",
    "StressWork",
    "Text",
    "message_classes",
    "message_schemas",
    "unbounded_fields",
]
