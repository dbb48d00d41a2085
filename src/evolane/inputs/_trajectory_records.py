"""One trajectory record (an agent turn, or a plain ``{"messages": [...]}`` line) as a model.

A record is one line of a trajectory JSONL file. evolane's own format carries the session,
the turn number, the request (``task`` or ``input``, else the last user message), the
messages in the OpenAI chat format and an optional outcome; a plain chat-completion line
carries only ``messages`` (and is a session of its own).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

import orjson
from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from evolane.messages import Record, ShortText, Text

MAX_MESSAGES = 4096
"""Upper bound on the messages of one record."""
MAX_SESSION_CHARS = 256
"""Upper bound on a session id, in characters."""
_Label = Annotated[str, Field(min_length=1, max_length=MAX_SESSION_CHARS)]

OutcomeStatus = Literal["success", "failure", "unknown"]
"""How a recorded turn ended, as the agent (or its user) judged it."""
Role = Literal["system", "developer", "user", "assistant", "tool", "function"]
"""The roles of the OpenAI chat format."""


class ChatMessage(BaseModel):
    """One message in the OpenAI chat format (``role``, ``content`` as text or parts, and
    any of the format's other fields, such as ``tool_calls`` or ``name``, kept as given)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    role: Role
    content: str | list[JsonValue] | None = None

    def text(self) -> str:
        """The message's text: ``content`` itself, or its text parts joined by newlines."""
        if isinstance(self.content, str):
            return self.content
        parts: list[str] = []
        for part in self.content or ():
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)

    def attachments(self) -> list[str]:
        """The names (or URLs) of the files and images attached to the message's parts."""
        names: list[str] = []
        for part in self.content if isinstance(self.content, list) else ():
            if not isinstance(part, dict):
                continue
            for key, field in (("file", "filename"), ("image_url", "url"), ("input_file", "name")):
                inner = part.get(key)
                if isinstance(inner, dict) and isinstance(inner.get(field), str):
                    names.append(inner[field])
                elif isinstance(inner, str) and key == "image_url":
                    names.append(inner)
            if isinstance(part.get("filename"), str):
                names.append(part["filename"])
        return names


class Outcome(Record):
    """How a recorded turn ended: ``status``, an optional ``score`` in [0, 1] and ``reason``."""

    status: OutcomeStatus = "unknown"
    score: float | None = Field(default=None, ge=0.0, le=1.0)
    reason: Text | None = None


class TrajectoryRecord(BaseModel):
    """One agent turn of a trajectory file; only ``messages`` (or ``task``/``input``) is
    required, so a plain ``{"messages": [...]}`` chat-completion line is a record too.

    ``follows``: the turn this one continues (``true``: the previous turn of the session);
    ``metadata.attachments``: names of artifacts attached to the turn.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_id: _Label | None = None
    turn: int | None = Field(default=None, ge=0, le=1_000_000)
    id: _Label | None = None
    task: str | None = None
    input: JsonValue = None
    messages: tuple[ChatMessage, ...] = Field(default=(), max_length=MAX_MESSAGES)
    outcome: Outcome | None = None
    target: ShortText | None = None
    started_at: str | float | None = None
    metadata: dict[str, JsonValue] | None = None
    follows: int | bool | None = None

    @model_validator(mode="after")
    def _has_request(self) -> Self:
        if self.request() == "":
            raise ValueError("no request: give a user message, 'task' or 'input'")
        if self.turn is None and (self.follows is not None and self.follows is not False):
            raise ValueError("'follows' needs 'turn' (and 'session_id')")
        return self

    def request(self) -> str:
        """The turn's request text: ``task``, else ``input`` (text, or its JSON), else the
        last user message's text."""
        if self.task:
            return self.task
        if isinstance(self.input, str) and self.input:
            return self.input
        if self.input is not None and not isinstance(self.input, str):
            return orjson.dumps(self.input, option=orjson.OPT_SORT_KEYS).decode()
        for message in reversed(self.messages):
            if message.role == "user" and message.text():
                return message.text()
        return ""

    def split_messages(self) -> tuple[tuple[ChatMessage, ...], tuple[ChatMessage, ...]]:
        """(history, this turn): the messages before the last user message, and the rest.

        A record that logs the whole conversation carries earlier turns in its history."""
        last_user = max((i for i, m in enumerate(self.messages) if m.role == "user"), default=0)
        return self.messages[:last_user], self.messages[last_user:]

    def answer(self) -> str:
        """The text of the turn's last assistant message ("" when it has none)."""
        for message in reversed(self.split_messages()[1]):
            if message.role == "assistant" and message.text():
                return message.text()
        return ""

    def attachments(self) -> list[str]:
        """The artifact names attached to the turn: ``metadata.attachments`` (or
        ``artifacts``) and the files and images of its user messages."""
        names: list[str] = []
        for key in ("attachments", "artifacts"):
            value = (self.metadata or {}).get(key)
            if isinstance(value, list):
                names.extend(item for item in value if isinstance(item, str))
        for message in self.messages:
            if message.role == "user":
                names.extend(message.attachments())
        return names


def trajectory_schema() -> dict[str, Any]:
    """The JSON Schema of one trajectory record (what ``evolane schema trajectory`` prints)."""
    schema = TrajectoryRecord.model_json_schema()
    schema["title"] = "evolane trajectory record"
    schema["description"] = (
        "One line of a trajectory JSONL file: one agent turn. A plain OpenAI chat-completion "
        'line {"messages": [...]} is a record too (a session of its own).'
    )
    return schema
