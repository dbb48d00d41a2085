"""The message base classes: frozen, closed, always-validated pydantic models."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

MAX_MESSAGE_BYTES = 16 * 1024
"""Upper bound on the orjson size of any message instance (DESIGN §3)."""

Name = Annotated[str, Field(min_length=1, max_length=128)]
"""An identifier: actor, child, case, run or stage name."""
ShortText = Annotated[str, Field(max_length=256)]
"""A label or a one-line reason."""
Text = Annotated[str, Field(max_length=2048)]
"""A bounded free-text field (an error message, a quoted excerpt)."""
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every control character but tab and newline replaced by U+FFFD (one
    for one, so no bound is crossed): a command's words reach a terminal (the live view,
    the summary, a report) and must not drive it (escape sequences setting the title or the
    clipboard, clearing the screen; found by review). Bidirectional overrides, embeddings,
    isolates and marks go too: they make a line read in another order than it is written
    (``exe.gnp`` shown as ``png.exe``; found by review)."""
    return _CONTROL.sub("\ufffd", text)


Said = Annotated[str, Field(max_length=512), AfterValidator(printable)]
"""What a command said, quoted in a message (a failure's words): bounded, and shown as text,
never as terminal control."""
ShortSaid = Annotated[str, Field(max_length=256), AfterValidator(printable)]
"""`Said` in one line's room: a summary or reason that may quote a command or a file name."""
MediaType = Annotated[str, Field(min_length=1, max_length=128)]
Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$", max_length=71)]
"""A content address: ``sha256:`` followed by 64 lowercase hex digits."""


class Record(BaseModel):
    """A frozen, closed value type: the building block of messages, events and reports.

    ``model_construct`` is refused so that every instance has passed validation and so
    respects the field bounds; ``model_copy(update=...)`` re-validates.
    """

    # defer_build: a record's validator is built when first used, not at import; a command
    # uses a few of the ~120 models, and building them all cost every process ~0.1 s CPU.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, defer_build=True)

    @classmethod
    def model_construct(cls, _fields_set: set[str] | None = None, **values: Any) -> Self:
        raise TypeError(f"{cls.__name__} must be validated: call {cls.__name__}(...) instead")

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        if not update:
            return self
        return self.model_validate({**self.model_dump(), **update})


_MESSAGE_KINDS: dict[str, type[Message]] = {}


class Message(Record):
    """Base of every actor message: a `Record` with a literal ``kind`` unique per class.

    Subclasses declare ``kind: Literal["name"] = "name"``; classes without a literal default
    are abstract groupings and are not registered.
    """

    kind: Name
    abstract: ClassVar[bool] = True

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        default = cls.model_fields["kind"].default
        if not isinstance(default, str):
            return
        cls.abstract = False
        known = _MESSAGE_KINDS.get(default)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise TypeError(f"message kind {default!r} is used by {known.__qualname__} already")
        _MESSAGE_KINDS[default] = cls


def message_classes() -> dict[str, type[Message]]:
    """Every concrete message class, by kind: each of this package's (its modules are loaded
    first: the package loads them on first use) and any other imported so far."""
    import evolane.messages as package

    for name in package.__all__:
        getattr(package, name)
    return dict(sorted(_MESSAGE_KINDS.items()))


class ArtifactRef(Record):
    """A pointer to a payload in the content-addressed store; payloads never travel in messages."""

    digest: Digest
    size: int = Field(ge=0, le=2**53)
    media_type: MediaType = "application/octet-stream"
