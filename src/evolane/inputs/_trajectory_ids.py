"""Case ids of trajectory turns: the record's ``id``, else its session and turn, else its
line, in safe characters, told apart by a digest when only their safe forms are alike."""

from __future__ import annotations

import hashlib
import re

from evolane.inputs._cases import MAX_CASE_ID_CHARS
from evolane.inputs._trajectory_sessions import Turn

_UNSAFE_ID = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str, limit: int = 128) -> str:
    """``text`` usable as a case id or group name: unsafe runs become ``_``, bounded."""
    cleaned = _UNSAFE_ID.sub("_", text).strip("_.") or "x"
    return cleaned[:limit]


def case_id(turn: Turn) -> str:
    """The case id of a turn: its record's ``id``, else session and turn (``S-t3``), else
    its line (``L12``) for a record without a session: never its file's name, which a
    replay sees in ``EVOLANE_CASE_ID`` (found by review: ``failures-L3`` told a tree which
    cases its seed failed, when the traces were filed by outcome)."""
    entry = turn.entry
    if entry.id:
        return safe_name(entry.id, MAX_CASE_ID_CHARS)
    if entry.session_id:
        suffix = f"-t{turn.number}"
        return safe_name(entry.session_id, MAX_CASE_ID_CHARS - len(suffix)) + suffix
    return f"L{entry.line}"


def case_ids(turns: list[Turn]) -> list[str]:
    """The case id of each of ``turns`` (`case_id`); turns whose ids are equal only in
    their safe form (session ids ``a b`` and ``a/b``, or of non-Latin letters alone, long
    ones alike in their first 120 characters, ``traces.jsonl`` of two folders) each get
    ``-`` and 8 hex digits of what names them in full: their records were refused as the
    same case (found by review). Records named alike in full (an ``id`` given twice) keep
    the one id, refused when the cases are dealt."""
    ids = [case_id(turn) for turn in turns]
    names: dict[str, set[tuple[object, ...]]] = {}
    for cid, turn in zip(ids, turns, strict=True):
        names.setdefault(cid, set()).add(_full_name(turn))
    for index, (cid, turn) in enumerate(zip(ids, turns, strict=True)):
        if len(names[cid]) > 1:
            digest = hashlib.sha256(repr(_full_name(turn)).encode()).hexdigest()[:8]
            ids[index] = cid[: MAX_CASE_ID_CHARS - 9].rstrip("_.") + "-" + digest
    return ids


def _full_name(turn: Turn) -> tuple[object, ...]:
    """What `case_id` makes a turn's id of, in full."""
    entry = turn.entry
    if entry.id:
        return ("id", entry.id)
    if entry.session_id:
        return ("session", entry.session_id, turn.number)
    return ("file", entry.path, entry.line)
