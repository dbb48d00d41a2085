"""Trajectory files -> a `Dataset` of replayable cases, grouped by task family.

`ingest_trajectories` reads the files (`inputs._trajectory_read`), resolves sessions and
follow-ups (`inputs._trajectory_sessions`), groups the turns by task family, picks one
group, finds its conversations (`inputs._trajectory_clusters`) and deals them whole into
train/val/test, seeded and stratified by outcome.

Memory is held per record only as an `Entry` and a `Turn`: groups are counted (a
`GroupSummary` is made for the listed ones alone) and the cases go into the `Dataset` one
by one, refused past `MAX_FILE_BYTES` of cases (what a dataset file may hold).
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import orjson
from pydantic import Field, JsonValue

from evolane.inputs._cases import Case, Split, case_json
from evolane.inputs._dataset import MAX_FILE_BYTES, Dataset, _size
from evolane.inputs._errors import DatasetError, InputError
from evolane.inputs._trajectory_clusters import cluster_note, conversations, shared_reason
from evolane.inputs._trajectory_ids import case_id, case_ids, safe_name
from evolane.inputs._trajectory_read import read_trajectories, shown_path
from evolane.inputs._trajectory_sessions import (
    DEFAULT_CONTEXT_BUDGET,
    Turn,
    chain_tail,
    fit_chain,
    normalise,
    sessions,
)
from evolane.messages import Name, Record, ShortText, Text

MAX_LISTED = 1000
"""At most this many excluded cases and failures are listed in a summary."""
MAX_CASES_BYTES = MAX_FILE_BYTES
"""Derived cases over this many bytes (as a dataset JSONL file) are refused: a dataset file
may not be larger, and a follow-up case carries up to `DEFAULT_CONTEXT_BUDGET` of chain."""
_SPLIT_CYCLE: tuple[Split, ...] = ("val", "train", "val", "test", "train")
"""Each outcome's cases, shuffled, are dealt in this cycle: 40% val, 40% train, 20% test,
and every outcome with a case has one in val."""


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
    """What ingestion found: the groups, the one chosen and why, the excluded turns, and the
    failures and repeated inputs of the chosen group (each list cut at `MAX_LISTED`,
    ``omitted`` counts the rest)."""

    groups: tuple[GroupSummary, ...] = Field(max_length=MAX_LISTED)
    chosen: Name
    choice: ShortText
    excluded: tuple[ExcludedCase, ...] = Field(default=(), max_length=MAX_LISTED)
    failures: tuple[TraceFailure, ...] = Field(default=(), max_length=MAX_LISTED)
    repeats: tuple[ExcludedCase, ...] = Field(default=(), max_length=MAX_LISTED)
    """Turns of the chosen group left out because their input repeats an earlier case's."""
    shared: tuple[ExcludedCase, ...] = Field(default=(), max_length=MAX_LISTED)
    """Turns of the chosen group left out as a stock opening (`conversations`)."""
    clusters: Text = ""  # `cluster_note`
    omitted: dict[str, int] = Field(default_factory=dict, max_length=5)
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
    the split. Raises `DatasetError` (``file:line: reason``) for a bad line, too many
    records or cases over `MAX_CASES_BYTES`, and `InputError` for an unknown group or one
    with no usable case.
    """
    given = [os.fspath(path) for path in paths]
    groups = _groups(sessions(read_trajectories(given)))
    if not groups:
        shown = " ".join(given[:3]) + (" ..." if len(given) > 3 else "")
        raise InputError(f"--from-trajectory {shown}: no trajectory records in it")
    tallies = {name: _tally(name, members, context_budget) for name, members in groups.items()}
    chosen, choice = _choose(tallies, group)
    usable = [turn for turn in groups[chosen] if not turn.incomplete]
    if not usable:
        raise InputError(f"--group {chosen}: no usable case (every turn lacks context)")
    dealt = _splits(usable, seed, context_budget, chosen)
    failures: list[TraceFailure] = []
    cases = _cases(sorted(dealt.cases.items()), chosen, context_budget, failures)
    dataset = Dataset(cases, path=f"trajectories:{chosen}")
    excluded = [_excluded(turn, name) for name, ts in groups.items() for turn in ts
                if turn.incomplete]  # fmt: skip
    listed = {
        "groups": len(tallies),
        "excluded": len(excluded),
        "failures": len(failures),
        "repeats": len(dealt.repeats),
        "shared": len(dealt.shared),
    }
    summary = TrajectorySummary(
        groups=_listed_groups(tallies, chosen),
        chosen=chosen,
        choice=choice,
        excluded=tuple(excluded[:MAX_LISTED]),
        failures=tuple(failures[:MAX_LISTED]),
        repeats=tuple(dealt.repeats[:MAX_LISTED]),
        shared=tuple(dealt.shared[:MAX_LISTED]),
        clusters=dealt.clusters,
        omitted={k: v - MAX_LISTED for k, v in listed.items() if v > MAX_LISTED},
        sources=tuple(shown_path(path)[:256] for path in given[:256]),
    )
    return Trajectories(dataset, summary)


def _cases(
    dealt: list[tuple[str, tuple[Split, Turn, str]]],
    group: str,
    budget: int,
    failures: list[TraceFailure],
) -> Iterator[Case]:
    """The cases of the ``dealt`` turns (sorted by case id), made one at a time; each
    failure is added to ``failures``. Raises `DatasetError` at the record whose case takes
    the cases over `MAX_CASES_BYTES`."""
    size = 0
    for case_id_, (split, turn, cluster) in dealt:
        case = _case(turn, case_id_, group, budget, split, cluster)
        size += len(case_json(case)) + 1
        if size > MAX_CASES_BYTES:
            raise _over_limit(turn, group)
        if turn.entry.status == "failure":
            failures.append(TraceFailure(id=case.id, reason=turn.entry.excerpt or ""))
        yield case


def _over_limit(turn: Turn, group: str) -> DatasetError:
    """The error for the turn whose case takes ``group``'s cases over `MAX_CASES_BYTES`."""
    return DatasetError.at(
        turn.entry.path,
        turn.entry.line,
        f"the cases of group {group!r} are over the {_size(MAX_CASES_BYTES)} limit of "
        "a dataset (pick a smaller group with --group, or give fewer files)",
    )


class _Tally(NamedTuple):
    """One task family's counts (a `GroupSummary` is made for the listed ones only)."""

    name: str
    cases: int  # usable cases (context complete)
    failures: int  # usable cases whose outcome is failure
    excluded: int  # context_incomplete turns
    distinct: int  # usable cases, a repeated input (not a follow-up's) counted once

    def size(self) -> str:
        """``N cases``, and how many distinct inputs when fewer."""
        shown = f"{self.cases} cases"
        return shown if self.distinct == self.cases else f"{shown}, {self.distinct} distinct"

    def summary(self, chosen: str) -> GroupSummary:
        """The family as a `GroupSummary`."""
        return GroupSummary(
            name=self.name,
            cases=self.cases,
            failures=self.failures,
            excluded=self.excluded,
            completeness=self.cases / (self.cases + self.excluded),
            chosen=self.name == chosen,
        )


def _listed_groups(tallies: dict[str, _Tally], chosen: str) -> tuple[GroupSummary, ...]:
    """The largest groups first (at most `MAX_LISTED`, the chosen one always among them)."""
    ranked = sorted(tallies.values(), key=lambda s: (-s.cases, s.name))[:MAX_LISTED]
    if all(s.name != chosen for s in ranked):
        ranked[-1] = tallies[chosen]
    return tuple(s.summary(chosen) for s in ranked)


def _target_of(turns: list[Turn]) -> str | None:
    """The first ``target`` of a session's records (None: it names none)."""
    return next((turn.entry.target for turn in turns if turn.entry.target), None)


def _bounded(key: str, limit: int = 256) -> str:
    """``key`` as a cluster name of at most ``limit`` characters: a longer one is cut and
    ends with a digest of it in full (cut alone, the sessions of ids alike in their first
    248 characters were one cluster: found by review)."""
    if len(key) <= limit:
        return key
    return key[: limit - 17] + "~" + hashlib.sha256(key.encode()).hexdigest()[:16]


def task_fingerprint(text: str) -> str:
    """``fp-`` and 12 hex digits of the SHA-256 of ``text`` normalised (`normalise`)."""
    return "fp-" + hashlib.sha256(normalise(text).encode()).hexdigest()[:12]


def _groups(by_session: list[list[Turn]]) -> dict[str, list[Turn]]:
    """The sessions by task family: their ``target`` in safe characters (`safe_name`), else
    ``fp-`` and a fingerprint of the first user turn's normalised text. Targets alike only
    in that form (``客服`` and ``编程``, ``my agent`` and ``my/agent``) each end with ``-``
    and 8 hex digits of the target in full: they were one family (found by review)."""
    named = [(_target_of(members), members) for members in by_session]
    targets: dict[str, set[str]] = {}
    for target, _ in named:
        if target is not None:
            targets.setdefault(safe_name(target), set()).add(target)
    groups: dict[str, list[Turn]] = {}
    for target, members in named:
        if target is None:
            name = task_fingerprint(members[0].entry.opening)
        elif len(targets[safe_name(target)]) > 1:
            name = safe_name(target, 119) + "-" + hashlib.sha256(target.encode()).hexdigest()[:8]
        else:
            name = safe_name(target)
        groups.setdefault(name, []).extend(members)
    return groups


def _tally(name: str, members: list[Turn], budget: int) -> _Tally:
    """A group's counts; ``distinct`` counts a turn that is not a follow-up and repeats an
    earlier one's input once, as `_splits` keeps it (its chain, unbuilt, is not compared)."""
    usable = [turn for turn in members if not turn.incomplete]
    failures = sum(1 for turn in usable if turn.entry.status == "failure")
    seen: set[bytes] = set()
    distinct = 0
    for turn in usable:
        if len(usable) > 1 and not turn.follow_up:
            identity = input_identity(_input_value(turn, budget))
            if identity in seen:
                continue
            seen.add(identity)
        distinct += 1
    return _Tally(name, len(usable), failures, len(members) - len(usable), distinct)


def _choose(tallies: dict[str, _Tally], group: str | None) -> tuple[str, str]:
    """The chosen group's name and why it was chosen."""
    if group is not None:
        if group not in tallies:
            known = ", ".join(sorted(tallies)[:10])
            raise InputError(f"--group {group}: no such group (groups: {known})")
        return group, f"--group {group}"
    # the largest by distinct inputs: a group of one task given 500 times was chosen over
    # 60 distinct tasks, and gave one case, its repeats left out (found by review)
    ranked = sorted(tallies.values(), key=lambda s: (-s.distinct, -s.cases, s.name))
    with_failures = [s for s in ranked if s.failures and s.cases]
    if with_failures:
        best = with_failures[0]
        return best.name, (
            f"the largest group with failures ({best.size()}, {best.failures} failures "
            f"of {len(tallies)} groups); pick another with --group"
        )
    best = next((s for s in ranked if s.cases), ranked[0])
    return best.name, f"no group has failures: the largest ({best.size()}) was chosen"


def _input_value(turn: Turn, budget: int) -> dict[str, JsonValue]:
    """What the agent is given to replay a turn: its request with its (bounded) chain of
    prior turns, and the record's ``input``."""
    entry = turn.entry
    chain = fit_chain(chain_tail(turn, budget), turn.pinned, budget) if turn.follow_up else []
    value: dict[str, JsonValue] = {
        "request": entry.request,
        "messages": [*chain, {"role": "user", "content": entry.request}],
    }
    if entry.input is not None:
        value["input"] = entry.input
    return value


def input_identity(value: JsonValue) -> bytes:
    """A digest of a case input (`_input_value`), its request, message texts and a text
    ``input`` (the request, given as ``input``) taken up to letter case, Unicode form and
    runs of spaces (`normalise`): two cases with one identity are one task. Other content
    (a structured ``input``, structured message parts) is exact. Found by review: ``Fix
    X`` and ``fix  x``, given as ``input``, were two cases, in any two splits."""
    shown = value
    if isinstance(value, dict):
        messages = value.get("messages")
        shown = {
            **value,
            "request": _normalised(value.get("request")),
            "messages": [
                {**m, "content": _normalised(m.get("content"))} if isinstance(m, dict) else m
                for m in messages
            ]
            if isinstance(messages, list)
            else messages,
        }
        if isinstance(value.get("input"), str):
            shown["input"] = _normalised(value["input"])
    return hashlib.sha256(orjson.dumps(shown, option=orjson.OPT_SORT_KEYS)).digest()[:16]


def _normalised(text: JsonValue) -> JsonValue:
    return normalise(text) if isinstance(text, str) else text


def _case(turn: Turn, case_id_: str, group: str, budget: int, split: Split, cluster: str) -> Case:
    """The case of a complete turn (`_input_value`); a success seeds ``expected_output``
    with the recorded answer."""
    entry = turn.entry
    value = _input_value(turn, budget)
    metadata: dict[str, JsonValue] = {
        "group": group,
        "session": (turn.session if entry.session_id else case_id_)[:256],  # not its file
        "cluster": _bounded(cluster),  # its conversation: its turns are not independent
        "turn": turn.number,
        "source": entry.where[:512],
        "outcome": entry.status,
        "follow_up": turn.follow_up,
    }
    if entry.score is not None:
        metadata["score"] = entry.score
    if entry.excerpt is not None:
        metadata["trace_reason"] = entry.excerpt
    expected: JsonValue = None
    if entry.status == "success" and entry.answer:
        expected = entry.answer
    return Case(id=case_id_, input=value, expected_output=expected, split=split, metadata=metadata)


class _Dealt(NamedTuple):
    """`_splits`' result: each kept case's split, turn and cluster, and what was left out."""

    cases: dict[str, tuple[Split, Turn, str]]
    repeats: list[ExcludedCase]
    shared: list[ExcludedCase]
    clusters: str  # `cluster_note`


def _splits(turns: list[Turn], seed: int, budget: int, group: str) -> _Dealt:
    """Each turn's case id -> its split, the turn and its cluster. Whole conversations
    (`conversations`) are dealt, never single turns: a later turn's input holds the earlier
    turns and their answers, so turns of one conversation in two splits would show val or
    test cases to the optimizer (found by review). A stock opening's turns are left out
    (``shared``). A turn whose input repeats an earlier turn's (`input_identity`: an agent
    given the same task twice) is left out (``repeats``): in another split it would show
    the optimizer a val or test case, in the same split it would count one task twice.
    Conversations are stratified by outcome (any failure, else any success, else unknown),
    sorted, shuffled with ``seed`` and dealt in `_SPLIT_CYCLE`. A case id given twice is
    refused with both places, and the turn whose input takes the kept inputs over
    `MAX_CASES_BYTES` as `_cases` would refuse it: a session of 20,000 tiny follow-ups
    (2 MB), each carrying its chain, was refused after a minute, every chain built first
    (found by review)."""
    seen: dict[str, Turn] = {}
    size = 0
    first_of: dict[bytes, str] = {}
    repeats: list[ExcludedCase] = []
    shared: list[ExcludedCase] = []
    members: dict[str, list[str]] = {}
    statuses: dict[str, set[str]] = {}
    ids = case_ids(turns)
    found = conversations(turns, ids)
    for index, (cid, turn, key) in enumerate(zip(ids, turns, found.keys, strict=True)):
        if cid in seen:
            first = seen[cid].entry.where
            raise DatasetError.at(
                turn.entry.path, turn.entry.line, f"case id {cid!r} again (first at {first})"
            )
        seen[cid] = turn
        if key is None:
            shared.append(_left_out(turn, group, shared_reason(found.fanout[index])))
            continue
        value = _input_value(turn, budget)
        earlier = first_of.setdefault(input_identity(value), cid)
        if earlier != cid:
            repeats.append(_left_out(turn, group, f"repeat: the same input as case {earlier}"))
            continue
        size += len(orjson.dumps(value))  # each case holds its input
        if size > MAX_CASES_BYTES:
            raise _over_limit(turn, group)
        members.setdefault(key, []).append(cid)
        statuses.setdefault(key, set()).add(turn.entry.status)
    strata: dict[str, list[str]] = {}
    for key, outcomes in statuses.items():
        stratum = next((s for s in ("failure", "success") if s in outcomes), "unknown")
        strata.setdefault(stratum, []).append(key)
    dealt: dict[str, tuple[Split, Turn, str]] = {}
    for outcome, keys in sorted(strata.items()):
        keys.sort()
        random.Random(f"{seed}:{outcome}").shuffle(keys)
        for index, key in enumerate(keys):
            for cid in members[key]:
                dealt[cid] = (_SPLIT_CYCLE[index % len(_SPLIT_CYCLE)], seen[cid], key)
    note = cluster_note([(split, key) for split, _, key in dealt.values()], found.joined)
    return _Dealt(dealt, repeats, shared, note)


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
    if summary.repeats:
        lines.append(f"left out (the same input as an earlier case): {len(summary.repeats)}")
        lines.extend(f"  {e.id}: {e.reason}" for e in summary.repeats)
    if summary.shared:
        lines.append(f"left out (a stock opening of many conversations): {len(summary.shared)}")
        lines.extend(f"  {e.id}: {e.reason}" for e in summary.shared)
    if summary.clusters:
        lines.append(f"clusters: {summary.clusters}")
    return lines


def _excluded(turn: Turn, group: str) -> ExcludedCase:
    return _left_out(turn, group, f"context_incomplete: {turn.incomplete}")


def _left_out(turn: Turn, group: str, reason: str) -> ExcludedCase:
    """A turn of ``group`` left out of the cases, and why."""
    return ExcludedCase(
        id=case_id(turn), group=group, reason=reason[:256], source=turn.entry.where[:256]
    )
