"""Trajectory files -> a `Dataset` of replayable cases, grouped by task family.

`ingest_trajectories` reads the files (`inputs._trajectory_read`), resolves sessions and
follow-ups (`inputs._trajectory_sessions`), groups the turns by task family, picks one
group, and splits its cases into train/val/test, seeded and stratified by outcome.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import Field, JsonValue

from evolane.inputs._cases import MAX_CASE_ID_CHARS, Case, Split
from evolane.inputs._dataset import Dataset
from evolane.inputs._errors import DatasetError, InputError
from evolane.inputs._trajectory_read import read_trajectories
from evolane.inputs._trajectory_sessions import (
    DEFAULT_CONTEXT_BUDGET,
    Turn,
    fit_chain,
    normalise,
    sessions,
)
from evolane.messages import Name, Record, ShortText

MAX_LISTED = 1000
"""At most this many excluded cases and failures are listed in a summary."""
_EXCERPT_CHARS = 240
_SPLIT_CYCLE: tuple[Split, ...] = ("val", "train", "val", "test", "train")
"""Each outcome's cases, shuffled, are dealt in this cycle: 40% val, 40% train, 20% test,
and every outcome with a case has one in val."""
_UNSAFE_ID = re.compile(r"[^A-Za-z0-9._-]+")


class GroupSummary(Record):
    """One task family: its cases, failures and context completeness."""

    name: Name
    cases: int = Field(ge=0)  # usable cases (context complete)
    failures: int = Field(ge=0)  # usable cases whose outcome is failure
    excluded: int = Field(ge=0)  # context_incomplete turns
    completeness: float = Field(ge=0.0, le=1.0)  # cases / (cases + excluded)
    chosen: bool = False


class ExcludedCase(Record):
    """A turn left out of replay: its would-be case id, group and reason."""

    id: Name
    group: Name
    reason: ShortText
    source: ShortText = ""  # file:line


class TraceFailure(Record):
    """A case whose recorded outcome is a failure, with an excerpt of its trace."""

    id: Name
    reason: ShortText


class TrajectorySummary(Record):
    """What ingestion found: the groups, the one chosen and why, the excluded turns and the
    failures of the chosen group (each list cut at `MAX_LISTED`, ``omitted`` counts the rest)."""

    groups: tuple[GroupSummary, ...] = Field(max_length=MAX_LISTED)
    chosen: Name
    choice: ShortText
    excluded: tuple[ExcludedCase, ...] = Field(default=(), max_length=MAX_LISTED)
    failures: tuple[TraceFailure, ...] = Field(default=(), max_length=MAX_LISTED)
    omitted: dict[str, int] = Field(default_factory=dict, max_length=4)
    sources: tuple[ShortText, ...] = Field(default=(), max_length=256)


@dataclass(frozen=True)
class Trajectories:
    """The result of `ingest_trajectories`: the chosen group's cases and the summary."""

    dataset: Dataset
    summary: TrajectorySummary


def ingest_trajectories(
    paths: Iterable[str | os.PathLike[str]],
    *,
    group: str | None = None,
    seed: int = 0,
    context_budget: int = DEFAULT_CONTEXT_BUDGET,
) -> Trajectories:
    """Read the trajectory files and folders ``paths`` into the cases of one task family.

    ``group`` names the family (else the largest with failures is chosen); ``seed`` seeds
    the split. Raises `DatasetError` (``file:line: reason``) for a bad line and
    `InputError` for an unknown group or one with no usable case.
    """
    given = [os.fspath(path) for path in paths]
    located = read_trajectories(given)
    turns = [turn for session in sessions(located).values() for turn in session]
    groups = _groups(turns)
    if not groups:
        shown = " ".join(given[:3]) + (" ..." if len(given) > 3 else "")
        raise InputError(f"--from-trajectory {shown}: no trajectory records in it")
    summaries = {name: _summary(name, members) for name, members in groups.items()}
    chosen, choice = _choose(summaries, group)
    members = groups[chosen]
    usable = [turn for turn in members if not turn.incomplete]
    splits = _splits(usable, seed)
    cases = sorted(
        (_case(turn, chosen, context_budget, splits[case_id(turn)]) for turn in usable),
        key=lambda case: case.id,
    )
    if not cases:
        raise InputError(f"--group {chosen}: no usable case (every turn lacks context)")
    excluded = [_excluded(turn, name) for name, ts in groups.items() for turn in ts
                if turn.incomplete]  # fmt: skip
    failures = [
        TraceFailure(id=case.id, reason=str((case.metadata or {}).get("trace_reason", "")))
        for case in cases
        if (case.metadata or {}).get("outcome") == "failure"
    ]
    listed = {
        "groups": len(summaries),
        "excluded": len(excluded),
        "failures": len(failures),
    }
    summary = TrajectorySummary(
        groups=_listed_groups(summaries, chosen),
        chosen=chosen,
        choice=choice,
        excluded=tuple(excluded[:MAX_LISTED]),
        failures=tuple(failures[:MAX_LISTED]),
        omitted={k: v - MAX_LISTED for k, v in listed.items() if v > MAX_LISTED},
        sources=tuple(path[:256] for path in given[:256]),
    )
    return Trajectories(Dataset(cases, path=f"trajectories:{chosen}"), summary)


def _listed_groups(summaries: dict[str, GroupSummary], chosen: str) -> tuple[GroupSummary, ...]:
    """The largest groups first (at most `MAX_LISTED`, the chosen one always among them)."""
    ranked = sorted(summaries.values(), key=lambda s: (-s.cases, s.name))[:MAX_LISTED]
    if all(s.name != chosen for s in ranked):
        ranked[-1] = summaries[chosen]
    return tuple(s.model_copy(update={"chosen": s.name == chosen}) for s in ranked)


def group_of(turns: list[Turn]) -> str:
    """A session's task family: the first ``target`` of its records, else ``fp-`` and a
    fingerprint of its first user turn's normalised text."""
    for turn in turns:
        if turn.located.record.target:
            return _safe(turn.located.record.target)
    return task_fingerprint(_opening(turns[0]))


def _opening(turn: Turn) -> str:
    """The first user message of a turn's conversation (else its request)."""
    record = turn.located.record
    history, _ = record.split_messages()
    users = [m.text() for m in history if m.role == "user"]
    return users[0] if users else record.request()


def _dealt_by(turn: Turn) -> str:
    """What a turn is dealt to a split with: its session; a record without a session id
    (each its own session: an API log holding the conversation so far) goes with every
    record that opens with the same first user message, so no conversation is split
    (found by review: 24 of 36 val and test turns sat inside train inputs)."""
    if turn.located.record.session_id:
        return "session:" + turn.session
    return "opening:" + task_fingerprint(_opening(turn))


def task_fingerprint(text: str) -> str:
    """``fp-`` and 12 hex digits of the SHA-256 of ``text`` normalised (`normalise`)."""
    return "fp-" + hashlib.sha256(normalise(text).encode()).hexdigest()[:12]


def _groups(turns: list[Turn]) -> dict[str, list[Turn]]:
    by_session: dict[str, list[Turn]] = {}
    for turn in turns:
        by_session.setdefault(turn.session, []).append(turn)
    groups: dict[str, list[Turn]] = {}
    for members in by_session.values():
        groups.setdefault(group_of(members), []).extend(members)
    return groups


def _summary(name: str, members: list[Turn]) -> GroupSummary:
    usable = [turn for turn in members if not turn.incomplete]
    failures = sum(1 for turn in usable if _status(turn) == "failure")
    return GroupSummary(
        name=name,
        cases=len(usable),
        failures=failures,
        excluded=len(members) - len(usable),
        completeness=len(usable) / len(members),
    )


def _choose(summaries: dict[str, GroupSummary], group: str | None) -> tuple[str, str]:
    """The chosen group's name and why it was chosen."""
    if group is not None:
        if group not in summaries:
            known = ", ".join(sorted(summaries)[:10])
            raise InputError(f"--group {group}: no such group (groups: {known})")
        return group, f"--group {group}"
    ranked = sorted(summaries.values(), key=lambda s: (-s.cases, s.name))
    with_failures = [s for s in ranked if s.failures and s.cases]
    if with_failures:
        best = with_failures[0]
        return best.name, (
            f"the largest group with failures ({best.cases} cases, {best.failures} failures "
            f"of {len(summaries)} groups); pick another with --group"
        )
    best = next((s for s in ranked if s.cases), ranked[0])
    return best.name, f"no group has failures: the largest ({best.cases} cases) was chosen"


def _status(turn: Turn) -> str:
    outcome = turn.located.record.outcome
    return outcome.status if outcome is not None else "unknown"


def _safe(text: str, limit: int = 128) -> str:
    """``text`` usable as a case id or group name: unsafe runs become ``_``, bounded."""
    cleaned = _UNSAFE_ID.sub("_", text).strip("_.") or "x"
    return cleaned[:limit]


def case_id(turn: Turn) -> str:
    """The case id of a turn: its record's ``id``, else session and turn (``S-t3``), else
    ``FILE-L12`` for a record without a session."""
    record = turn.located.record
    if record.id:
        return _safe(record.id, MAX_CASE_ID_CHARS)
    if record.session_id:
        suffix = f"-t{turn.number}"
        return _safe(record.session_id, MAX_CASE_ID_CHARS - len(suffix)) + suffix
    stem = os.path.splitext(os.path.basename(turn.located.path))[0]
    suffix = f"-L{turn.located.line}"
    return _safe(stem, MAX_CASE_ID_CHARS - len(suffix)) + suffix


def _case(turn: Turn, group: str, budget: int, split: Split) -> Case:
    """The case of a complete turn: its request with its (bounded) chain of prior turns;
    a success seeds ``expected_output`` with the recorded answer."""
    record = turn.located.record
    chain = fit_chain(turn.chain, turn.pinned, budget) if turn.follow_up else []
    request = record.request()
    value: dict[str, JsonValue] = {
        "request": request,
        "messages": [*chain, {"role": "user", "content": request}],
    }
    if record.task is None and record.input is not None:
        value["input"] = record.input
    status = _status(turn)
    metadata: dict[str, JsonValue] = {
        "group": group,
        "session": turn.session[:256],
        "turn": turn.number,
        "source": turn.located.where[:512],
        "outcome": status,
        "follow_up": turn.follow_up,
    }
    outcome = record.outcome
    if outcome is not None and outcome.score is not None:
        metadata["score"] = outcome.score
    if status == "failure":
        metadata["trace_reason"] = trace_excerpt(turn)
    expected: JsonValue = None
    if status == "success" and record.answer():
        expected = record.answer()
    return Case(
        id=case_id(turn), input=value, expected_output=expected, split=split, metadata=metadata
    )


def trace_excerpt(turn: Turn) -> str:
    """A one-line reason for a recorded failure: the outcome's reason, then the end of
    the turn's trace (its last tool or assistant message), cut to 240 characters."""
    record = turn.located.record
    parts = [record.outcome.reason] if record.outcome and record.outcome.reason else []
    for message in reversed(record.split_messages()[1]):
        if message.role in ("tool", "function", "assistant") and message.text().strip():
            parts.append(f"{message.role}: {message.text()}")
            break
    text = " | ".join(" ".join(part.split()) for part in parts) or "recorded as a failure"
    return text if len(text) <= _EXCERPT_CHARS else text[: _EXCERPT_CHARS - 3] + "..."


def _splits(turns: list[Turn], seed: int) -> dict[str, Split]:
    """Each turn's case id -> its split. Whole sessions are dealt (`_dealt_by`), never
    single turns: a later turn's input holds the earlier turns and their answers, so turns
    of one session in two splits would show val or test cases to the optimizer (found by
    review). Sessions are stratified by outcome (any failure, else any success, else
    unknown), sorted, shuffled with ``seed`` and dealt in `_SPLIT_CYCLE`. A case id given
    twice is refused with both places."""
    seen: dict[str, Turn] = {}
    by_session: dict[str, list[str]] = {}
    statuses: dict[str, set[str]] = {}
    for turn in turns:
        cid = case_id(turn)
        if cid in seen:
            where = turn.located
            first = seen[cid].located.where
            raise DatasetError.at(
                where.path, where.line, f"case id {cid!r} again (first at {first})"
            )
        seen[cid] = turn
        key = _dealt_by(turn)
        by_session.setdefault(key, []).append(cid)
        statuses.setdefault(key, set()).add(_status(turn))
    strata: dict[str, list[str]] = {}
    for session, found in statuses.items():
        stratum = next((s for s in ("failure", "success") if s in found), "unknown")
        strata.setdefault(stratum, []).append(session)
    dealt: dict[str, Split] = {}
    for outcome, keys in sorted(strata.items()):
        keys.sort()
        random.Random(f"{seed}:{outcome}").shuffle(keys)
        for index, session in enumerate(keys):
            for cid in by_session[session]:
                dealt[cid] = _SPLIT_CYCLE[index % len(_SPLIT_CYCLE)]
    return dealt


def summary_lines(summary: TrajectorySummary) -> list[str]:
    """The summary as lines for a terminal: the groups, the choice, the excluded turns."""
    lines = ["groups (cases, failures, context complete):"]
    for g in summary.groups:
        mark = "*" if g.chosen else " "
        lines.append(
            f" {mark} {g.name}: {g.cases} cases, {g.failures} failures, "
            f"{g.completeness:.0%} complete"
        )
    lines.append(f"chosen: {summary.chosen} ({summary.choice})")
    if summary.excluded:
        lines.append(f"excluded (context_incomplete): {len(summary.excluded)}")
        lines.extend(f"  {e.id} [{e.group}]: {e.reason}" for e in summary.excluded)
    return lines


def _excluded(turn: Turn, group: str) -> ExcludedCase:
    return ExcludedCase(
        id=case_id(turn),
        group=group,
        reason=f"context_incomplete: {turn.incomplete}"[:256],
        source=turn.located.where[:256],
    )
