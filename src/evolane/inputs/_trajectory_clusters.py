"""Conversations: which turns of a task family are dealt to one split together.

Two turns are one conversation when they share a session id, or when one's messages (the
user and assistant messages it logs, from the first user message, then its own user
message) extend the other's, whatever their session ids say: recorders that give every
call its own id (OpenAI-style API logs, LangSmith and Langfuse exports) log the turns of
one conversation as sessions of their own, and dealt apart, turn k+1 in train held turn k
of val or test and its answer (found by review: about half of the val and test cases).

A stock opening (a greeting or template message that many conversations begin with) joins
none of them: a logged prefix that `STOCK_FANOUT` or more conversations continue in
different ways is no one conversation. Its turns (the greeting's own call, and any call
whose messages are a prefix of it) are left out: their input and the answer they recorded
sit in conversations of every split. Keyed on the first user message instead, every
conversation that opened with one greeting was one cluster, and the split put all of them
in val (found by review). Two continuations (a turn edited or retried) stay one
conversation: its branches are near copies of each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from evolane.inputs._trajectory_entry import Entry
from evolane.inputs._trajectory_sessions import Turn

STOCK_FANOUT = 3
"""A logged prefix continued in this many different ways or more is a stock opening."""


@dataclass(frozen=True, slots=True)
class Conversations:
    """Each turn's cluster (None: a stock opening, left out) and what the messages did."""

    keys: list[str | None]
    fanout: dict[int, int]  # a left-out turn's index -> how many ways its prefix goes on
    joined: int  # sessions (or records without a session id) joined to another's by messages


def conversations(turns: list[Turn], ids: list[str]) -> Conversations:
    """The conversations of ``turns`` (whose case ids are ``ids``): a cluster key for each,
    ``session:<id>`` or ``conversation:<case id>`` of the conversation's first turn."""
    if all(turn.entry.inline is None for turn in turns):
        return _by_session(turns, ids)  # no turn logs another: its session alone
    paths = [_path(turn.entry) for turn in turns]
    own: dict[int, int] = {}
    for index, path in enumerate(paths):
        own.setdefault(path[-1], index)
    shared = _stock(paths, own)
    parent = list(range(len(turns)))
    by_session: dict[str, int] = {}
    units = 0
    fanout: dict[int, int] = {}
    for index, (turn, path) in enumerate(zip(turns, paths, strict=True)):
        if path[-1] in shared:
            fanout[index] = shared[path[-1]]
            continue
        session = turn.entry.session_id
        if session is None or session not in by_session:
            units += 1
        if session is not None:
            _join(parent, index, by_session.setdefault(session, index))
        if len(path) > 1:  # the first turn logged with the messages it extends (not one
            # with the same messages: sessions opening with one request would be one cluster)
            above = next((own[node] for node in reversed(path[:-1]) if node in own), None)
            if above is not None and paths[above][-1] not in shared:
                _join(parent, index, above)
    names: dict[int, str] = {}  # a conversation's root -> its key
    keys: list[str | None] = []
    for index in range(len(turns)):
        if index in fanout:
            keys.append(None)
            continue
        root = _root(parent, index)
        key = names.get(root)
        if key is None:
            first = turns[root].entry  # the root is the conversation's first turn
            key = names[root] = (
                f"session:{first.session_id}" if first.session_id else f"conversation:{ids[root]}"
            )
        keys.append(key)
    return Conversations(keys, fanout, units - len(names))


def _by_session(turns: list[Turn], ids: list[str]) -> Conversations:
    """The conversations of turns none of which logs an earlier one: their sessions (a
    record without a session id alone), as `conversations` keys them, at a tenth of its
    cost (a million tiny records)."""
    names: dict[str, str] = {}
    keys: list[str | None] = []
    for turn, cid in zip(turns, ids, strict=True):
        session = turn.entry.session_id
        if session is None:
            keys.append(f"conversation:{cid}")
            continue
        key = names.get(session)
        if key is None:
            key = names[session] = f"session:{session}"
        keys.append(key)
    return Conversations(keys, {}, 0)


def _path(entry: Entry) -> list[int]:
    """A digest of the turn's messages at each user message: the conversation's first user
    message (its text and attachments' names, `Entry.conversation`), the messages it logs
    after that, then its own user message (the last). A record that logs no earlier turn is
    its first user message alone; what comes before the first user message (an assistant's
    greeting) is not counted. Texts are taken without the spaces around them (a recorder
    that trims what it logs), else exact: `normalise` of each message of each call of a
    long conversation cost 20% of its ingestion."""
    digest = hash((0, "user", entry.conversation.strip()))
    marks = [digest]
    if entry.inline is None:
        return marks
    before = bool(entry.inline.opening)  # an image alone: its message has no text to skip
    for role, text in entry.inline.history:
        if before:
            before = role != "user"
            continue
        digest = hash((digest, role, text.strip()))
        if role == "user":
            marks.append(digest)
    marks.append(hash((digest, "user", entry.ask.strip())))
    return marks


def _stock(paths: list[list[int]], own: dict[int, int]) -> dict[int, int]:
    """The turns' own messages that are a stock opening or a prefix of one (`STOCK_FANOUT`),
    each with the most ways its stock prefix goes on."""
    first_next: dict[int, int] = {}
    forks: dict[int, set[int]] = {}
    for path in paths:
        for node, after in pairwise(path):
            seen = first_next.setdefault(node, after)
            if seen != after:
                forks.setdefault(node, {seen}).add(after)
    stock = {node: len(ways) for node, ways in forks.items() if len(ways) >= STOCK_FANOUT}
    shared: dict[int, int] = {}
    if not stock:
        return shared
    for path in paths:
        ways = 0
        for node in reversed(path):  # a prefix of a stock opening is shared too
            ways = max(ways, stock.get(node, 0))
            if ways and node in own:
                shared[node] = max(shared.get(node, 0), ways)
    return shared


def _root(parent: list[int], index: int) -> int:
    while parent[index] != index:
        parent[index] = parent[parent[index]]
        index = parent[index]
    return index


def _join(parent: list[int], one: int, other: int) -> None:
    """Join two turns' clusters; the root is the earlier turn (the conversation's first)."""
    a, b = _root(parent, one), _root(parent, other)
    if a != b:
        parent[max(a, b)] = min(a, b)


def shared_reason(fanout: int) -> str:
    """Why a turn of a stock opening is left out."""
    return (
        f"shared: a stock opening (a greeting or template) of {fanout} conversations: in "
        "any split, its input and answer would sit in the other splits' inputs"
    )


def cluster_note(dealt: list[tuple[str, str]], joined: int) -> str:
    """One line on the clusters of the dealt cases (``(split, cluster)`` each): how many,
    per split, their sizes, the sessions their messages joined, and a warning when one
    cluster holds most of the cases (the split then holds nothing out)."""
    sizes: dict[str, int] = {}
    splits: dict[str, set[str]] = {}
    for split, key in dealt:
        sizes[key] = sizes.get(key, 0) + 1
        splits.setdefault(split, set()).add(key)
    if not sizes:
        return ""
    largest = max(sizes, key=lambda key: (sizes[key], key))
    per = ", ".join(f"{split} {len(splits[split])}" for split in sorted(splits))
    low, high = min(sizes.values()), sizes[largest]
    each = (
        f"{low}-{high} cases each (the largest: {largest[:80]})"
        if low < high
        else f"{low} cases each"
    )
    note = f"{len(sizes)} conversations dealt whole ({per}), {each}"
    if joined:
        note += (
            f"; {joined} sessions (or records without one) joined to an earlier one's "
            "conversation: their messages extend its messages"
        )
    if len(sizes) > 1 and 2 * sizes[largest] > len(dealt):
        note += f"; warning: one conversation holds {sizes[largest]} of {len(dealt)} cases"
    return note
