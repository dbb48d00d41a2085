"""Sessions and follow-ups: which turn continues which, its chain of prior turns, and
whether that context is complete.

Records are grouped by ``session_id`` (a record without one is a session of its own) and
ordered by ``turn`` (else by file order). A turn is a **follow-up** when:

1. it is marked ``follows`` (a turn number, or ``true`` for the previous turn); or
2. its own messages log earlier user turns (the context is then inline, and complete); or
3. its request refers back (`refers_back`): it starts with a continuation word (``and``,
   ``also``, ``now``, ``then``, ``instead``, ``again``, ``what about``, ``try again``...)
   or names earlier output (``above``, ``previous``, ``as before``, ``fix it``, ``that
   file``...). This rule is not applied to a session's first record when its turn is 0 or
   1 (or absent): there is nothing before it to refer to.

A follow-up of rule 1 or 3 depends on one earlier turn (the named one, else ``turn - 1``).
It is ``context_incomplete`` when that turn is absent (a gap in the turn numbers, or a
session that starts late) or is itself incomplete: incompleteness propagates along
dependencies only, so a later independent request of the same session is unaffected.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

import orjson

from evolane.inputs._dataset import _fail
from evolane.inputs._trajectory_read import Located

DEFAULT_CONTEXT_BUDGET = 32 * 1024
"""Bytes of prior turns a follow-up case carries (newest kept; pinned items always)."""
MAX_PINNED = 32
"""At most this many URLs and this many artifact names are pinned."""
MAX_PINNED_CHARS = 2048
"""A pinned URL or artifact name longer than this is cut."""

_URL = re.compile(r"https?://[^\s<>\"'`)\]}]+")
_STARTS = (
    "and",
    "also",
    "now",
    "then",
    "but",
    "instead",
    "again",
    "same",
    "what about",
    "how about",
    "continue",
    "redo",
    "retry",
    "try again",
    "actually",
    "not quite",
    "no,",
    "ok,",
    "okay,",
)
_BACK_START = re.compile(r"^(?:" + "|".join(re.escape(word) for word in _STARTS) + r")(?:\b|\s)")
_BACK_ANY = re.compile(
    r"\b(?:above|previous(?:ly)?|earlier|as before|you just|your (?:last|previous) "
    r"(?:answer|reply|response|output|attempt)|that (?:file|answer|result|output|code|"
    r"version|one)|the same (?:file|thing|one)|fix it|change it|do it again|make it|"
    r"try again|one more time)\b"
)


def normalise(text: str) -> str:
    """``text`` in NFKC, case-folded, with every run of whitespace one space, stripped."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def refers_back(request: str) -> bool:
    """Whether a request reads as a continuation of an earlier turn (rule 3 above)."""
    text = normalise(request)
    return bool(_BACK_START.match(text) or _BACK_ANY.search(text))


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


def pinned_of(text: str, attachments: list[str]) -> Pinned:
    """The URLs in ``text`` and the ``attachments`` (each list deduplicated and bounded)."""

    def bounded(items: list[str]) -> tuple[str, ...]:
        unique = dict.fromkeys(item[:MAX_PINNED_CHARS] for item in items if item)
        return tuple(unique)[:MAX_PINNED]

    return Pinned(bounded(_URL.findall(text)), bounded(attachments))


def message_bytes(message: dict[str, Any]) -> int:
    """The size of one chain message as JSON (what the budget counts)."""
    return len(orjson.dumps(message, option=orjson.OPT_SORT_KEYS))


def fit_chain(messages: list[dict[str, Any]], pinned: Pinned, budget: int) -> list[dict[str, Any]]:
    """The newest of ``messages`` (oldest first) that fit ``budget`` bytes in all.

    When the first message (the first user turn) does not fit, a note carrying ``pinned``
    leads the chain instead, and the budget holds it first (a note larger than the budget
    is kept alone). A newest message too large for the room left is cut to it."""
    total = sum(message_bytes(m) for m in messages)
    if total <= budget:
        return list(messages)
    note = pinned.note()
    room = budget - (message_bytes(note) if note else 0)
    kept: list[dict[str, Any]] = []
    for message in reversed(messages[1:]):
        size = message_bytes(message)
        if size > room:
            if not kept:
                cut = _cut(message, room)
                if cut is not None:
                    kept.append(cut)
            break
        kept.append(message)
        room -= size
    kept.reverse()
    return ([note] if note else []) + kept


def _cut(message: dict[str, Any], room: int) -> dict[str, Any] | None:
    """``message`` with its text cut so that it fits ``room`` bytes (None: it cannot)."""
    text = str(message.get("content") or "")
    low, high = 0, len(text)
    while low < high:  # the longest prefix that fits
        middle = (low + high + 1) // 2
        if message_bytes({**message, "content": text[:middle] + " [cut]"}) <= room:
            low = middle
        else:
            high = middle - 1
    candidate = {**message, "content": text[:low] + " [cut]"}
    return candidate if low > 0 and message_bytes(candidate) <= room else None


@dataclass
class Turn:
    """One record placed in its session: its number, what it depends on, its context."""

    located: Located
    session: str
    number: int
    parent: int | None = None  # the turn it continues (rules 1 and 3)
    inline: bool = False  # rule 2: its messages carry its context
    incomplete: str | None = None  # why its context is incomplete
    chain: list[dict[str, Any]] = field(default_factory=list)  # prior turns, oldest first
    pinned: Pinned = field(default_factory=Pinned)

    @property
    def follow_up(self) -> bool:
        """Whether the turn continues earlier turns."""
        return self.parent is not None or self.inline


def sessions(records: list[Located]) -> dict[str, list[Turn]]:
    """The records grouped by session, each session in turn order, follow-ups resolved
    (`Turn.parent`, `Turn.incomplete`, the full chain before eviction)."""
    grouped: dict[str, list[Located]] = {}
    for located in records:
        key = located.record.session_id or f"{located.path}:{located.line}"
        grouped.setdefault(key, []).append(located)
    return {key: _session(key, items) for key, items in grouped.items()}


def _session(key: str, items: list[Located]) -> list[Turn]:
    turns: dict[int, Turn] = {}
    for index, located in enumerate(items):
        number = located.record.turn if located.record.turn is not None else index
        if number in turns:
            earlier = turns[number].located.where
            _fail(located.path, located.line, f"turn {number} of session {key!r} again "
                  f"(first at {earlier})")  # fmt: skip
        turns[number] = Turn(located, key, number)
    ordered = [turns[number] for number in sorted(turns)]
    for position, turn in enumerate(ordered):
        _resolve(turn, turns, first=position == 0)
    return ordered


def _resolve(turn: Turn, turns: dict[int, Turn], *, first: bool) -> None:
    """Set the turn's dependency, completeness and chain (its earlier turns are resolved)."""
    record = turn.located.record
    history, _ = record.split_messages()
    if record.follows is not None and record.follows is not False:
        parent = turn.number - 1 if record.follows is True else int(record.follows)
        if parent >= turn.number:
            _fail(turn.located.path, turn.located.line,
                  f"'follows' must name an earlier turn than {turn.number}")  # fmt: skip
        turn.parent = parent
    elif any(message.role == "user" for message in history):
        turn.inline = True
        turn.chain = [_plain(m) for m in history if m.role in ("user", "assistant") and m.text()]
        first_user = next(m for m in history if m.role == "user")
        turn.pinned = pinned_of(first_user.text(), first_user.attachments())
        if turn.pinned.attachments and turn.chain:  # parts are read as text: name the files
            named = ", ".join(turn.pinned.attachments)
            first = turn.chain[0]
            turn.chain[0] = {**first, "content": f"{first['content']}\n[attached: {named}]"}
        return
    elif (
        record.follows is None
        and not (first and turn.number <= 1)
        and refers_back(record.request())
    ):
        turn.parent = turn.number - 1
    if turn.parent is None:
        return
    parent = turns.get(turn.parent)
    if parent is None:
        turn.incomplete = f"turn {turn.parent} of session {turn.session!r} is missing"
    elif parent.incomplete is not None:
        turn.incomplete = f"it follows turn {parent.number}, whose context is incomplete"
    else:
        turn.chain = [*parent.chain, *exchange(parent)]
        root = parent if not parent.follow_up else None
        turn.pinned = parent.pinned if root is None else _pinned_root(root)


def _pinned_root(turn: Turn) -> Pinned:
    record = turn.located.record
    return pinned_of(record.request(), record.attachments())


def exchange(turn: Turn) -> list[dict[str, Any]]:
    """The turn as chain messages: its request (with its attachments named) and its answer."""
    record = turn.located.record
    request = record.request()
    attached = record.attachments()
    if attached:
        request += "\n[attached: " + ", ".join(attached[:MAX_PINNED]) + "]"
    messages: list[dict[str, Any]] = [{"role": "user", "content": request}]
    answer = record.answer()
    if answer:
        messages.append({"role": "assistant", "content": answer})
    return messages


def _plain(message: Any) -> dict[str, Any]:
    return {"role": message.role, "content": message.text()}
