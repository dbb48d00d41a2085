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

A turn's chain is not held: it is walked back from the turn (`chain_tail`) when its case
is made, only as far as the context budget reaches (a session of n follow-ups would
otherwise hold n chains of up to n turns each).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from evolane.inputs._dataset import _fail
from evolane.inputs._trajectory_entry import Entry, Pinned, pinned_of, plain

DEFAULT_CONTEXT_BUDGET = 32 * 1024
"""Bytes of prior turns a follow-up case carries (newest kept; pinned items always)."""

_NO_PINS = Pinned()
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


@dataclass(slots=True)
class Turn:
    """One record placed in its session: its number, what it depends on, its context."""

    entry: Entry
    number: int
    parent: int | None = None  # the turn it continues (rules 1 and 3)
    inline: bool = False  # rule 2: its messages carry its context
    incomplete: str | None = None  # why its context is incomplete
    link: Turn | None = None  # the parent turn, when its context is complete
    pinned: Pinned = _NO_PINS

    @property
    def follow_up(self) -> bool:
        """Whether the turn continues earlier turns."""
        return self.parent is not None or self.inline

    @property
    def session(self) -> str:
        """The turn's session: its ``session_id``, else its ``file:line`` (made when asked
        for, not held: one string per record otherwise; a session id that reads as the
        ``file:line`` of a record without one is not that record's session)."""
        return self.entry.session_id or self.entry.where


def sessions(records: list[Entry]) -> list[list[Turn]]:
    """The records grouped by session (in the order of each session's first record), each
    session in turn order, follow-ups resolved (`Turn.parent`, `Turn.incomplete`,
    `Turn.link`). A record without a session id is a session of its own."""
    order: list[list[Entry] | Entry | None] = []
    by_id: dict[str, list[Entry]] = {}
    for entry in records:
        if not entry.session_id:
            order.append(entry)
            continue
        items = by_id.get(entry.session_id)
        if items is None:
            items = by_id[entry.session_id] = []
            order.append(items)
        items.append(entry)
    del by_id
    resolved: list[list[Turn]] = []
    for index, item in enumerate(order):
        order[index] = None  # let the list of entries go as its turns are made
        if isinstance(item, list):
            resolved.append(_session(item))
        elif item is not None:
            resolved.append(_single(item))
    return resolved


def _single(entry: Entry) -> list[Turn]:
    """The session of one record (what `_session` gives for it, without its tables)."""
    turn = Turn(entry, entry.turn if entry.turn is not None else 0)
    _resolve(turn, {}, first=True)
    return [turn]


def _session(items: list[Entry]) -> list[Turn]:
    """The turns of one session's records. Either every record gives its ``turn`` or none
    does (then file order numbers them): a record without one, after turn 5, was taken
    as turn 1, replayed first and without the context it followed up (found by review)."""
    turns: dict[int, Turn] = {}
    numbered = items[0].turn is not None
    for index, entry in enumerate(items):
        if (entry.turn is not None) != numbered:
            gives = "gives no 'turn'" if numbered else "gives a 'turn'"
            first = f"the first record of session {entry.session_id!r} ({items[0].where})"
            _fail(entry.path, entry.line, f"{gives}, unlike {first}: give every record's turn, "
                  "or none")  # fmt: skip
        number = entry.turn if entry.turn is not None else index
        if number in turns:
            earlier = turns[number].entry.where
            _fail(entry.path, entry.line, f"turn {number} of session {entry.session_id!r} "
                  f"again (first at {earlier})")  # fmt: skip
        turns[number] = Turn(entry, number)
    if len(turns) == 1:
        ordered = list(turns.values())
    else:
        ordered = [turns[number] for number in sorted(turns)]
    for position, turn in enumerate(ordered):
        _resolve(turn, turns, first=position == 0)
    return ordered


def _resolve(turn: Turn, turns: dict[int, Turn], *, first: bool) -> None:
    """Set the turn's dependency, completeness and link (its earlier turns are resolved)."""
    entry = turn.entry
    if entry.follows is not None and entry.follows is not False:
        parent = turn.number - 1 if entry.follows is True else int(entry.follows)
        if parent >= turn.number:
            _fail(entry.path, entry.line,
                  f"'follows' must name an earlier turn than {turn.number}")  # fmt: skip
        turn.parent = parent
    elif entry.inline is not None:
        turn.inline = True
        turn.pinned = pinned_of(entry.inline.opening, entry.inline.pins)
        return
    elif entry.follows is None and not (first and turn.number <= 1) and refers_back(entry.request):
        turn.parent = turn.number - 1
    if turn.parent is None:
        return
    parent = turns.get(turn.parent)
    if parent is None:
        turn.incomplete = f"turn {turn.parent} of session {turn.session!r} is missing"
    elif parent.incomplete is not None:
        turn.incomplete = f"it follows turn {parent.number}, whose context is incomplete"
    else:
        turn.link = parent
        root = parent if not parent.follow_up else None
        turn.pinned = parent.pinned if root is None else _pinned_root(root)


def _pinned_root(turn: Turn) -> Pinned:
    return pinned_of(turn.entry.request, turn.entry.pins)


def own_chain(turn: Turn) -> list[dict[str, Any]]:
    """The chain a turn's own messages carry (rule 2), its first turn's attachments named."""
    if not turn.inline or turn.entry.inline is None:
        return []
    chain = [plain(role, text) for role, text in turn.entry.inline.history]
    if turn.pinned.attachments and chain:  # parts are read as text: name the files
        named = ", ".join(turn.pinned.attachments)
        chain[0] = {**chain[0], "content": f"{chain[0]['content']}\n[attached: {named}]"}
    return chain


def _newest_first(turn: Turn) -> Iterator[dict[str, Any]]:
    """The turn's chain, newest message first: its parents' exchanges, then the own
    chain of the first turn of the line."""
    node = turn
    while node.link is not None:
        yield from reversed(exchange(node.link))
        node = node.link
    yield from reversed(own_chain(node))


def chain_tail(turn: Turn, budget: int) -> list[dict[str, Any]]:
    """The turn's chain of prior turns (oldest first), or, when it is over ``budget`` bytes,
    its newest messages just past ``budget`` and one more: `fit_chain` of this is `fit_chain`
    of the whole chain (which never keeps more than ``budget`` bytes of it, nor the oldest
    message of a chain over it)."""
    picked: list[dict[str, Any]] = []
    size = 0
    for message in _newest_first(turn):
        picked.append(message)
        if size > budget:  # the one more
            break
        size += message_bytes(message)
    picked.reverse()
    return picked


def exchange(turn: Turn) -> list[dict[str, Any]]:
    """The turn as chain messages: its request (with its attachments named) and its answer."""
    entry = turn.entry
    request = entry.request
    if entry.attached:
        request += "\n[attached: " + ", ".join(entry.attached) + "]"
    messages: list[dict[str, Any]] = [{"role": "user", "content": request}]
    if entry.answer:
        messages.append({"role": "assistant", "content": entry.answer})
    return messages
