"""What case derivation keeps of one trajectory record: an `Entry`, compact.

A line is validated as a `TrajectoryRecord` (pydantic) and then reduced to the fields the
cases are made of (the request, the answer, the outcome, the ids, the attachments and, for
a record that logs earlier user turns, that history as text), so that no model, message
object or raw JSON is held per record (found by review: ~3.4 KB held per tiny record).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import JsonValue

from evolane.inputs._trajectory_records import TrajectoryRecord

MAX_PINNED = 32
"""At most this many URLs and this many artifact names are pinned."""
MAX_PINNED_CHARS = 2048
"""A pinned URL or artifact name longer than this is cut."""
EXCERPT_CHARS = 240
"""A recorded failure's excerpt (its reason and the end of its trace) is cut to this."""

_URL = re.compile(r"https?://[^\s<>\"'`)\]}]+")
_NONE: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Pinned:
    """The first user turn's URLs and attached artifact names: never evicted."""

    urls: tuple[str, ...] = ()
    attachments: tuple[str, ...] = ()

    def note(self) -> dict[str, str] | None:
        """The chain message that carries them once the first user turn is evicted."""
        if not self.urls and not self.attachments:
            return None
        parts = ["[earlier context, shortened]"]
        if self.urls:
            parts.append("URLs: " + " ".join(self.urls))
        if self.attachments:
            parts.append("Attached: " + ", ".join(self.attachments))
        return {"role": "user", "content": "\n".join(parts)}


def bounded_names(items: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``items`` without empty ones, each cut to `MAX_PINNED_CHARS`, deduplicated, at most
    `MAX_PINNED` (applied twice, the same)."""
    unique = dict.fromkeys(item[:MAX_PINNED_CHARS] for item in items if item)
    return tuple(unique)[:MAX_PINNED]


def pinned_of(text: str, attachments: list[str] | tuple[str, ...]) -> Pinned:
    """The URLs in ``text`` and the ``attachments`` (each list deduplicated and bounded)."""
    return Pinned(bounded_names(_URL.findall(text)), bounded_names(attachments))


class Inline(NamedTuple):
    """A record's logged earlier turns: the first user message's text (``opening``) and
    attachments (bounded), and the user and assistant messages with text, as (role, text)."""

    opening: str
    pins: tuple[str, ...]
    history: tuple[tuple[str, str], ...]


class Entry(NamedTuple):
    """One record as case derivation needs it, and where it came from (``path``, 1-based
    ``line``). ``input`` is the record's ``input`` when it has no ``task`` (a case carries
    it); ``attached``: its attachment names (at most `MAX_PINNED`, as given); ``pins``: the
    same bounded for pinning; ``excerpt``: a failure's `trace_excerpt`; ``inline``: the
    earlier turns its messages log (None when they log no user turn); ``first``: its user
    message as `conversation` gives it when it logs no earlier one and that is not its
    request (a record whose ``task`` or ``input`` stands for it, or whose message is an
    image), else None; ``asked``: the text of its own user message when that is not its
    request (a ``task`` or ``input`` stands for it), else None (`ask`).

    A tuple: small, quick to make, and of strings alone it is left out of the cyclic
    garbage collector's walks (a million records would otherwise be walked again and
    again while they are read)."""

    path: str
    line: int
    session_id: str | None
    turn: int | None
    id: str | None
    target: str | None
    follows: int | bool | None
    request: str
    answer: str
    input: JsonValue
    status: str
    score: float | None
    excerpt: str | None
    attached: tuple[str, ...]
    pins: tuple[str, ...]
    inline: Inline | None
    first: str | None = None
    asked: str | None = None

    @property
    def where(self) -> str:
        """``path:line``."""
        return f"{self.path}:{self.line}"

    @property
    def opening(self) -> str:
        """The first user message of the conversation (else the request)."""
        return self.inline.opening if self.inline is not None else self.request

    @property
    def conversation(self) -> str:
        """The first user message of the conversation as its messages log it, its text and
        its attachments' names (`opening_of`): the record's own user message rather than
        its ``task`` or ``input`` when it logs no earlier turn (what a later record's inline
        history opens with)."""
        if self.inline is not None:
            return opening_of(self.inline.opening, self.inline.pins)
        return self.request if self.first is None else self.first

    @property
    def ask(self) -> str:
        """The text of the record's own user message, as a later record's messages log
        it (its request when it has no user message)."""
        return self.request if self.asked is None else self.asked


def opening_of(text: str, attachments: tuple[str, ...]) -> str:
    """A conversation's first user message as one string: its text, and the names of its
    attachments (an image-only first message has no text)."""
    return text + ("\n[attached: " + ", ".join(attachments) + "]" if attachments else "")


def entry_of(record: TrajectoryRecord, path: str, line: int, shared: dict[str, str]) -> Entry:
    """The `Entry` of a validated ``record`` at ``path:line`` (what its `request`,
    `split_messages`, `answer` and `attachments` give); ``shared`` maps a session id or
    target to one string object, so the turns of a session hold one copy."""
    history, own = record.split_messages()
    inline = None
    users = [m for m in history if m.role == "user"]
    if users:
        said = ((m.role, m.text()) for m in history if m.role in ("user", "assistant"))
        inline = Inline(
            users[0].text(),
            bounded_names(users[0].attachments()) or _NONE,
            tuple((role, text) for role, text in said if text),
        )
    answer = next((text for m in reversed(own) if m.role == "assistant" and (text := m.text())), "")
    request, first, text = record.request(), None, None
    asked = next((m for m in own if m.role == "user"), None)
    if asked is not None:
        text = asked.text()
        if inline is None:
            first = opening_of(text, bounded_names(asked.attachments()))
    attachments = record.attachments()
    outcome = record.outcome
    status = outcome.status if outcome is not None else "unknown"
    return Entry(
        path,
        line,
        _shared(shared, record.session_id),
        record.turn,
        record.id,
        _shared(shared, record.target),
        record.follows,
        request,
        answer,
        record.input if record.task is None else None,
        status,
        outcome.score if outcome is not None else None,
        trace_excerpt(record) if status == "failure" else None,
        tuple(attachments[:MAX_PINNED]) or _NONE,
        bounded_names(attachments) or _NONE,
        inline,
        None if first == request else first,
        None if text == request else text,
    )


def _shared(shared: dict[str, str], text: str | None) -> str | None:
    return None if text is None else shared.setdefault(text, text)


def trace_excerpt(record: TrajectoryRecord) -> str:
    """A one-line reason for a recorded failure: the outcome's reason, then the end of
    the turn's trace (its last tool or assistant message), cut to `EXCERPT_CHARS`."""
    parts = [record.outcome.reason] if record.outcome and record.outcome.reason else []
    for message in reversed(record.split_messages()[1]):
        if message.role in ("tool", "function", "assistant") and message.text().strip():
            parts.append(f"{message.role}: {message.text()}")
            break
    text = " | ".join(" ".join(part.split()) for part in parts) or "recorded as a failure"
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 3] + "..."


def plain(role: str, text: str) -> dict[str, Any]:
    """A chain message."""
    return {"role": role, "content": text}
