"""What is derived from a measurement's units without IO: each unit's status, its jobs, journal
records, debits and progress event, the scores the gate reads, the units blob and the counts
of a summary. The units themselves are rows of a `UnitTable` (``_table.py``); `MeasurePlan`
(``_plan.py``) drives them."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Literal

import numpy as np
import orjson

from evolane.lanes import HOST_REFUSED, TREE_OWNERS, blind_name
from evolane.measure._sealed import KEY_BYTES, SealedRecords
from evolane.measure._table import Unit, UnitTable, pack, unit_fields, unpack
from evolane.messages import (
    Debit,
    JudgeJob,
    JudgeResult,
    ReplayJob,
    ReplayRecord,
    ReplayResult,
    UnitEvent,
    UnitRecord,
    Usage,
)
from evolane.stats import ScoreMatrix, seed_for

if TYPE_CHECKING:
    from evolane.measure._scheduling import SchedulerSettings

RESTORABLE = frozenset({"succeeded", "failed", "timed_out"})
"""Unit statuses a resumed run takes from the journal; cancelled units run again."""


def unit_status(unit: Unit) -> str:
    """A replayed unit's status: the replay's, else the judge's (a judge that did not succeed
    fails the unit, unless it was cancelled)."""
    assert unit.replay is not None
    if unit.replay.status != "succeeded":
        return unit.replay.status
    if unit.judge is None or unit.judge.status != "succeeded":
        return "cancelled" if unit.judge and unit.judge.status == "cancelled" else "failed"
    return "succeeded"


JUDGE_REPEATS = ("judge_exit_", "judge_not_json", "judge_bad_score", "judge_output_too_long",
                 "limit_", "bad_verification", "no_judge")  # fmt: skip
"""Codes (or their starts) of a judge failing on the output it was given, after its retries:
it exited non-zero, printed no valid score, hit a limit of the run, or has nothing to judge
with. Not a timeout, a spawn, the host's process limit or a model endpoint's outage."""


def repeating_failure(unit: Unit) -> str | None:
    """How ``unit`` failed (stage and code) when a new try of the same experiment (`reuse_key`)
    would meet that failure again: the tree broke its replay (an exit, a signal, a limit, no
    output: a failure it owns), or the judge failed on the output (`JUDGE_REPEATS`). None for
    a success, a stop, and what a new try may not meet: a timeout, the host's or the
    framework's failure, a model endpoint's outage."""
    replay, judge = unit.replay, unit.judge
    assert replay is not None
    failure = replay.failure
    if replay.status != "succeeded":
        if replay.status != "failed" or failure is None or failure.owner not in TREE_OWNERS:
            return None
        return f"replay {failure.code}"
    if judge is None or judge.status != "failed" or judge.failure is None:
        return None
    code = judge.failure.code
    return f"judge {code}" if code.startswith(JUDGE_REPEATS) else None


def reused_results(packed: bytes, unit: Unit) -> tuple[ReplayResult, JudgeResult | None]:
    """The replay and judgement of a sealed record (``packed``) of the same experiment, as
    ``unit`` takes them: a success's replay as ``unit``'s own; a failure's as it was, naming
    the unit that ran it (journaled: where the failure can be read)."""
    stored = orjson.loads(unpack(packed))
    replay = ReplayResult.model_validate(stored["replay"])
    judge = None if stored.get("judge") is None else JudgeResult.model_validate(stored["judge"])
    if judge is not None and judge.status == "succeeded" and replay.status == "succeeded":
        replay = replay.model_copy(update={"unit_id": unit.unit_id, "arm": unit.arm})
    return replay, judge


LANES_DOWN = "lanes_down"
"""The code of a unit whose lane was stopped or down (its supervisor gave up on it after
crashes): the framework's, and every later unit's alike until it comes back."""
HOSTS_FAILURES = ("spawn_failed", "cluster_lost", HOST_REFUSED, LANES_DOWN)
"""Replay failures that are the host's and shared by every unit (tried again by the lane
first): the measurement stops on one, nothing decided on the pairs it cut short. Not one
of a unit beyond an early stop's cutoff: the run stopped it, the decision is taken (found
by review: a judge so stopped while it waited to try again after the host refused it a
process turned the decided measurement into a shared failure, and its run failed)."""


def shared_failure(unit: Unit) -> str | None:
    """Why ``unit``'s replay or judge failed on the host's failure that every unit shares
    (`HOSTS_FAILURES`; a judge's: the host refused it a process, its lanes are down, or its
    command could not start: its program gone mid-run, found by hostile review: each unit
    was left out, the candidate was indecisive and the run ended ``finished``, its campaign
    ``complete``, as if the search had found nothing), else None."""
    replay, judge = unit.replay, unit.judge
    if replay is not None and replay.failure is not None and replay.failure.code in HOSTS_FAILURES:
        how = "could not start" if replay.failure.code == "spawn_failed" else "failed"
        return f"{unit.arm} replay {how}: {replay.failure.message}"
    shared = (HOST_REFUSED, LANES_DOWN, "judge_spawn_failed", "verification_spawn_failed")
    if judge is not None and judge.failure is not None and judge.failure.code in shared:
        code = judge.failure.code
        how = "could not start" if code.endswith("spawn_failed") else "failed"
        what = "verification command" if code.startswith("verification") else "judge"
        return f"{unit.arm} {what} {how}: {judge.failure.message}"
    return None


def blocked_replay(unit: Unit, control_id: str) -> ReplayResult:
    """The replay of a candidate ``unit`` whose control (unit ``control_id``) did not
    succeed: blocked, never run."""
    return ReplayResult(
        unit_id=unit.unit_id,
        case_id=unit.case_id,
        arm="candidate",
        repetition=unit.repetition,
        status="blocked",
        blocked_by=control_id,
    )


def unsent_judge(unit_id: str) -> JudgeResult:
    """The judgement of a unit stopped before its judge ran: cancelled, nothing spent."""
    return JudgeResult(unit_id=unit_id, status="cancelled", source="command")


def arm_matrices(units: UnitTable, upto: int | None) -> tuple[ScoreMatrix, ScoreMatrix]:
    """Each arm's repetition scores (comparable units only) on the cases read before case
    ``upto`` (all without one), as matrices over the scores column: no list per case."""
    layout = units.layout
    cases = layout.cases if upto is None else min(upto, layout.cases)
    ids = units.case_ids if cases == len(units.case_ids) else units.case_ids[:cases]
    column = np.frombuffer(units.scores, dtype=np.float64)
    arms = []
    for candidate, reps in ((False, layout.reps[0]), (True, layout.reps[1] * layout.paired)):
        scores = np.full((cases, reps), np.nan)
        for rep in range(reps):
            where = layout.column(rep, candidate)
            if where is not None:
                scores[:, rep] = column[where][:cases]
        arms.append(scores)
    for index in units.replays.keys() | units.judges.keys():  # ended, not sealed yet
        unit = units[index]
        place, rep, candidate = layout.locate(index)
        if not unit.sealed and place < cases:
            arms[candidate][place, rep] = np.nan if unit.score is None else unit.score
    return ScoreMatrix(ids, arms[0]), ScoreMatrix(ids, arms[1])


def unit_records_json(units: UnitTable) -> bytes:
    """Every unit as the JSON bytes of the units blob behind `MeasureSummary.units_ref`, by
    case, repetition and arm, from each unit's sealed record (else its results)."""
    return b"".join(unit_records_chunks(units))


def unit_records_chunks(units: UnitTable, chunk_bytes: int = 1 << 16) -> Iterator[bytes]:
    """`unit_records_json` in chunks of about ``chunk_bytes``: the blob is streamed to the
    store, never held whole beside the records it is made of (nor a sort key per unit: the
    layout gives the order).
    Small chunks: with 1 MiB ones, the worker thread's malloc arena grew with the blob
    (+4.9 MiB RSS at 20,000 cases; 64 KiB: none, measured in its memory maps)."""
    columns = units.layout.columns()
    buffer, first = bytearray(b"["), True
    for place in units.layout.places_by_number():  # by case, repetition, arm: no sort
        for start, step in columns:
            unit = units[start + place * step]
            buffer += b"" if first else b","
            buffer += unit.record or orjson.dumps(unit_fields(unit))
            first = False
            if len(buffer) >= chunk_bytes:
                yield bytes(buffer)
                buffer.clear()
    buffer += b"]"
    yield bytes(buffer)


def unit_event(measurement_id: str, unit: Unit) -> UnitEvent:
    """``unit``, ended, as a progress event (the bus stamps the run id, sequence and time)."""
    assert unit.replay is not None
    judge = unit.judge
    usages = [unit.replay.usage] + ([judge.usage] if judge is not None else [])
    failure = unit.replay.failure or (judge.failure if judge is not None else None)
    why = "" if failure is None else f"{failure.owner} {failure.stage} {failure.code}: "
    return UnitEvent(
        run_id="-",
        measurement_id=measurement_id,
        unit_id=unit.unit_id,
        case_id=unit.case_id,
        arm=unit.arm,  # type: ignore[arg-type]
        repetition=unit.repetition,
        status=unit.status,  # type: ignore[arg-type]
        note=unit.note[:256],
        reused=unit.reused,
        restored=unit.restored,
        score=unit.score,
        replay_seconds=unit.replay.wall_seconds,
        judge_seconds=judge.wall_seconds if judge is not None else 0.0,
        tokens=_total(usages, "tokens"),
        cost_usd=_total(usages, "cost_usd"),
        failure=(why + failure.message)[:256] if failure is not None else "",
    )


def _total(usages: list[Usage], dimension: Literal["tokens", "cost_usd"]) -> float | None:
    """The sum of the known amounts of ``dimension`` (None when none is known)."""
    known = [amount for usage in usages if (amount := usage.get(dimension)) is not None]
    return sum(known) if known else None


def unit_counts(units: UnitTable) -> dict[str, int]:
    """The unit counts of a `MeasureSummary` (one pass over the units)."""
    statuses: Counter[str] = Counter()
    run = reused = restored = 0
    for unit in units:
        statuses[unit.status] += 1
        reused += unit.reused
        restored += unit.restored
        run += unit.took_part and not (unit.reused or unit.restored)
    return {
        "units_planned": len(units),
        "units_run": run,
        "units_reused": reused,
        "units_restored": restored,
        "units_failed": statuses["failed"] + statuses["timed_out"],
        "units_cancelled": statuses["cancelled"],
        "units_blocked": statuses["blocked"],
        "units_not_run": statuses["not_run"],
    }


# ----- what a unit asks for, derived from the run's settings -----------------------------


def shown_repetition(settings: SchedulerSettings, unit: Unit) -> int:
    """The repetition ``unit``'s commands are told (``EVOLANE_REPETITION``, and its seed):
    its own where both arms have as many; for the arm with fewer, a draw without replacement
    from the other arm's numbers, per case, keyed by the run's secret (`blind_name`'s), the
    same in every measurement of the run (so a tree's replays still serve either arm).
    Found by review: with 1/2 repetitions a tree told repetition 1 knew it was a candidate,
    and could answer well only as one, failing as its own baseline."""
    layout = unit.table.layout
    rep, most = unit.repetition, max(layout.reps)
    if layout.reps[0] == layout.reps[1]:  # (a parent measured alone draws alike: reused)
        return rep
    fewer = layout.reps[0] if unit.arm == "baseline" else layout.reps[1]
    if fewer == most:
        return rep
    case = unit.case_id
    drawn = sorted(range(most), key=lambda n: blind_name(settings.fingerprint, f"{case}#{n}"))
    return drawn[rep]


def pair_seed(settings: SchedulerSettings, unit: Unit, shown: int | None = None) -> int:
    """The seed of ``unit``'s case and shown repetition (``shown``, else `shown_repetition`):
    shared by the two arms' replays told the same repetition."""
    if shown is None:
        shown = shown_repetition(settings, unit)
    return seed_for(settings.seed, unit.case_id, shown)


def reuse_key(settings: SchedulerSettings, unit: Unit) -> bytes:
    """What a reused unit must match: fingerprint, tree, case, repetition and seed (a
    16-byte digest: `ReuseIndex` holds one per succeeded unit)."""
    shown = shown_repetition(settings, unit)
    parts = (
        settings.fingerprint,
        unit.tree_ref.digest,
        settings.case_refs[unit.case_id].digest,
        shown,
        pair_seed(settings, unit, shown),
    )
    return hashlib.blake2b(repr(parts).encode(), digest_size=KEY_BYTES).digest()


def replay_job(settings: SchedulerSettings, unit: Unit) -> ReplayJob:
    """The replay of ``unit`` (its case without the answers)."""
    shown = shown_repetition(settings, unit)
    return ReplayJob(
        unit_id=unit.unit_id,
        case_id=unit.case_id,
        case_ref=settings.case_refs[unit.case_id],
        tree_ref=unit.tree_ref,
        arm=unit.arm,  # type: ignore[arg-type]
        repetition=shown,
        seed=pair_seed(settings, unit, shown),
        timeout_seconds=settings.replay_timeout,
        name=blind_name(settings.fingerprint, unit.unit_id),
    )


def judge_job(settings: SchedulerSettings, unit: Unit) -> JudgeJob:
    """The judgement of ``unit``'s replay output (its case with the answers)."""
    assert unit.replay is not None and unit.replay.output_ref is not None
    return JudgeJob(
        unit_id=unit.unit_id,
        case_id=unit.case_id,
        case_ref=settings.judge_case_refs[unit.case_id],
        output_ref=unit.replay.output_ref,
        tree_ref=unit.tree_ref,
        timeout_seconds=settings.judge_timeout,
        seed=pair_seed(settings, unit),
        name=blind_name(settings.fingerprint, unit.unit_id),
    )


def replay_debit(unit: Unit) -> Debit:
    """The charge for ``unit``'s replay (its usage; incomplete usage as reserved)."""
    assert unit.replay is not None
    replay = unit.replay
    return Debit(
        item=unit.unit_id, actual=replay.usage, complete=replay.usage_complete, stage="replay"
    )


def preload(records: SealedRecords, earlier: Mapping[bytes, UnitRecord | ReplayRecord]) -> None:
    """Put each succeeded unit of ``earlier`` (by `reuse_key`) in ``records``, reusable as if
    this run had ended it (a measurement takes its replay and judgement, with no charge; a
    replay not judged is left to `evolane.measure._restore.earlier_replay`)."""
    for key, record in earlier.items():
        if not isinstance(record, UnitRecord) or record.status != "succeeded":
            continue
        if record.replay is None or record.judge is None:
            continue
        fields = {"replay": record.replay.model_dump(mode="json")}
        fields["judge"] = record.judge.model_dump(mode="json")
        records.reuse.add(key, records.put(pack(orjson.dumps(fields))))


def replay_record(measurement_id: str, unit: Unit, key: bytes) -> ReplayRecord:
    """The journal record of ``unit``'s replay, before its judgement (``key``: its
    `reuse_key`)."""
    assert unit.replay is not None
    return ReplayRecord(
        measurement=measurement_id,
        unit=unit.unit_id,
        tree=unit.tree_ref.digest,
        replay=unit.replay,
        key=key.hex(),
    )


def unit_record(measurement_id: str, unit: Unit, key: bytes | None = None) -> UnitRecord:
    """The journal record of ``unit``, ended (``key``: its `reuse_key`, for a succeeded one)."""
    return UnitRecord(
        measurement=measurement_id,
        unit=unit.unit_id,
        tree=unit.tree_ref.digest,
        status=unit.status,  # type: ignore[arg-type]
        reused=unit.reused,
        replay=unit.replay,
        judge=unit.judge,
        key=None if key is None else key.hex(),
    )
