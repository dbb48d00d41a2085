"""A measurement's units and what is derived from them without IO: the plan of pairs, the
start order, each unit's status, score and seed, its jobs, journal records and the counts of
a summary. `MeasurePlan` (``_plan.py``) drives them."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import orjson

from evolane.messages import (
    ArtifactRef,
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
from evolane.stats import seed_for
from evolane.store import TREE_MEDIA_TYPE

if TYPE_CHECKING:
    from evolane.measure._scheduling import SchedulerSettings
    from evolane.measure._sealed import SealedRecords

RESTORABLE = frozenset({"succeeded", "failed", "timed_out"})
"""Unit statuses a resumed run takes from the journal; cancelled units run again."""

UnitStep = Literal[
    "waiting",  # for its control
    "ready",  # for a lane
    "replaying",  # the shell reserves and replays (or the unit is restored while holding it)
    "charging",
    "charging_restored",
    "journaling_replay",
    "judging",
    "rejudging",  # a restored replay judged again, its lane still held
    "journaling",
    "done",
]


@dataclass(eq=False, slots=True)
class Unit:
    """One replay of one case on one arm and repetition, and what became of it.

    Once ended, a unit is `seal`-ed (its record serialised once, deflated and put in the
    scheduler's `SealedRecords`, out of memory: the units blob and the reuse cache read it
    there) and then `compact`-ed (its typed results dropped): a finished unit keeps its
    score and its record's number, and ``replay``/``judge`` are decoded from the record on
    the rare reads after that (a reused unit, a test)."""

    index: int
    measurement: str  # the measurement's id (one string shared by its units): see `unit_id`
    case_id: str
    case_index: int  # the case's place in the reading order (the prefix early stop reads)
    arm: str
    repetition: int
    tree_ref: ArtifactRef
    depends_on: Unit | None = None  # a candidate's control (`UnitLayout.dependents`: back)
    step: UnitStep = "waiting"
    holds_lane: bool = False
    done: bool = False
    status: str = "pending"
    reused: bool = False
    restored: bool = False
    note: str = ""
    case_number: int = 0  # the case's place in the dataset (names the unit, orders records)
    _replay: ReplayResult | None = None
    _judge: JudgeResult | None = None
    records: SealedRecords | None = None  # where its sealed record is, once sealed
    sealed_at: int = -1  # the record's number there (deflated: `pack`): see `record`
    _score: float | None = None  # once sealed: `score`
    _took: bool = False  # once sealed: `took_part`

    @property
    def unit_id(self) -> str:
        """``<measurement>.<case number>.<repetition>.<b|c>``: named by the case's place in
        the dataset, so the same whatever the reading order (a journal resumes under any);
        built when asked for, not held (`UnitLayout.find` goes back)."""
        return f"{self.measurement}.{self.case_number}.{self.repetition}.{self.arm[0]}"

    @property
    def record(self) -> bytes | None:
        """The sealed record: this unit's JSON in the units blob (None before it ended)."""
        return None if self.records is None else unpack(self.records.get(self.sealed_at))

    @property
    def replay(self) -> ReplayResult | None:
        """The replay's result (decoded from the record once compacted)."""
        if self._replay is None and (record := self.record) is not None:
            stored = orjson.loads(record)["replay"]
            return None if stored is None else ReplayResult.model_validate(stored)
        return self._replay

    @replay.setter
    def replay(self, value: ReplayResult | None) -> None:
        self._replay = value

    @property
    def judge(self) -> JudgeResult | None:
        """The judge's result (decoded from the record once compacted)."""
        if self._judge is None and (record := self.record) is not None:
            stored = orjson.loads(record)["judge"]
            return None if stored is None else JudgeResult.model_validate(stored)
        return self._judge

    @judge.setter
    def judge(self, value: JudgeResult | None) -> None:
        self._judge = value

    @property
    def score(self) -> float | None:
        """The judge's score when both the replay and the judge succeeded; 0 when the candidate
        itself broke the replay (a crash or no output it caused); else None (not comparable)."""
        if self.records is not None:
            return self._score
        replay, judge = self._replay, self._judge
        failure = replay.failure if replay is not None else None
        if failure is not None and failure.owner == "candidate":
            return 0.0
        ok = replay is not None and replay.status == "succeeded"
        judged = judge is not None and judge.status == "succeeded"
        return judge.score if ok and judged and judge is not None else None

    def seal(self, records: SealedRecords) -> None:
        """The unit ended: keep its score and put its record in ``records`` (nothing of it
        changes any more)."""
        self._took = self._replay is not None and self._replay.status != "blocked"
        self._score = self.score
        self.sealed_at = records.put(pack(orjson.dumps(_record(self))))
        self.records = records

    def compact(self) -> None:
        """Drop the typed results of a sealed unit (its record holds them)."""
        if self.records is not None:
            self._replay = self._judge = None


def pack(record: bytes) -> bytes:
    """A sealed record as kept in memory: deflated against `_PRESET` (a typical record), so
    it costs what differs from that (its ids, digests and timings: about a quarter of its
    size), at a few microseconds' cost."""
    packer = zlib.compressobj(1, zlib.DEFLATED, -12, 2, zlib.Z_DEFAULT_STRATEGY, _preset())
    return packer.compress(record) + packer.flush()


def unpack(packed: bytes) -> bytes:
    """The record `pack` deflated."""
    unpacker = zlib.decompressobj(-12, _preset())
    return unpacker.decompress(packed) + unpacker.flush()


@cache
def _preset() -> bytes:
    """A typical sealed record (a judged replay's), as `pack`'s preset dictionary: the field
    names, the fixed values and the shape every record shares. Only a process's own scratch
    holds packed records, so a change here needs no migration."""
    ref = "sha256:" + "0" * 64
    usage = Usage(tokens=0.0, cost_usd=0.0, wall_seconds=0.01)
    unit = Unit(0, "m", "c", 0, "baseline", 0, ArtifactRef(digest=ref, size=1))
    unit.status = "succeeded"
    unit.replay = ReplayResult(
        unit_id=unit.unit_id,
        case_id=unit.case_id,
        arm="baseline",
        repetition=0,
        status="succeeded",
        output_ref=ArtifactRef(digest=ref, size=100, media_type=TREE_MEDIA_TYPE),
        usage=Usage(wall_seconds=0.01),
        wall_seconds=0.01,
    )
    unit.judge = JudgeResult(
        unit_id=unit.unit_id,
        status="succeeded",
        score=1.0,
        source="command",
        detail_ref=ArtifactRef(digest=ref, size=10),
        wall_seconds=0.01,
        usage=usage,
        usage_complete=True,
    )
    return orjson.dumps(_record(unit))


def unit_status(unit: Unit) -> str:
    """A replayed unit's status: the replay's, else the judge's (a judge that did not succeed
    fails the unit, unless it was cancelled)."""
    assert unit.replay is not None
    if unit.replay.status != "succeeded":
        return unit.replay.status
    if unit.judge is None or unit.judge.status != "succeeded":
        return "cancelled" if unit.judge and unit.judge.status == "cancelled" else "failed"
    return "succeeded"


def arm_scores(
    units: list[Unit], upto: int | None
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per-case repetition scores of each arm (comparable units only), before case ``upto``."""
    baseline: dict[str, list[float]] = {}
    candidate: dict[str, list[float]] = {}
    for unit in units:
        if upto is not None and unit.case_index >= upto:
            continue
        if unit.score is not None:
            side = baseline if unit.arm == "baseline" else candidate
            side.setdefault(unit.case_id, []).append(unit.score)
    return baseline, candidate


def _record(u: Unit) -> dict[str, Any]:
    return {
        "unit": u.unit_id,
        "case": u.case_id,
        "arm": u.arm,
        "repetition": u.repetition,
        "status": u.status,
        "reused": u.reused,
        "restored": u.restored,
        "note": u.note,
        "score": u.score,
        "replay": u.replay.model_dump(mode="json") if u.replay else None,
        "judge": u.judge.model_dump(mode="json") if u.judge else None,
    }


def unit_records_json(units: list[Unit]) -> bytes:
    """Every unit as the JSON bytes of the units blob behind `MeasureSummary.units_ref`, by
    case, repetition and arm, from each unit's sealed record (else its results)."""
    return b"".join(unit_records_chunks(units))


def unit_records_chunks(units: list[Unit], chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    """`unit_records_json` in chunks of about ``chunk_bytes``: the blob is streamed to the
    store, never held whole beside the records it is made of (nor a sort key per unit)."""
    keys = np.fromiter(
        ((u.case_number << 24) | (u.repetition << 1) | (u.arm != "baseline") for u in units),
        dtype=np.int64,
        count=len(units),
    )
    parts, size = [b"["], 1
    for number, at in enumerate(np.argsort(keys, kind="stable")):  # no list of Python ints
        unit = units[int(at)]
        record = unit.record or orjson.dumps(_record(unit))
        parts.append(record if number == 0 else b"," + record)
        size += len(parts[-1])
        if size >= chunk_bytes:
            yield b"".join(parts)
            parts, size = [], 0
    parts.append(b"]")
    yield b"".join(parts)


def took_part(unit: Unit) -> bool:
    """Whether ``unit`` ran, was reused or was restored (observers hear of it when it ends);
    units never started or blocked by their control are only counted."""
    if unit.records is not None:
        return unit._took
    return unit.replay is not None and unit.replay.status != "blocked"


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


def unit_counts(units: list[Unit]) -> dict[str, int]:
    """The unit counts of a `MeasureSummary`."""
    return {
        "units_planned": len(units),
        "units_run": sum(took_part(u) and not (u.reused or u.restored) for u in units),
        "units_reused": sum(u.reused for u in units),
        "units_restored": sum(u.restored for u in units),
        "units_failed": sum(u.status in ("failed", "timed_out") for u in units),
        "units_cancelled": sum(u.status == "cancelled" for u in units),
        "units_blocked": sum(u.status == "blocked" for u in units),
        "units_not_run": sum(u.status == "not_run" for u in units),
    }


# ----- what a unit asks for, derived from the run's settings -----------------------------


def pair_seed(settings: SchedulerSettings, unit: Unit) -> int:
    """The seed shared by both arms of a pair (same case, same repetition)."""
    return seed_for(settings.seed, unit.case_id, unit.repetition)


def reuse_key(settings: SchedulerSettings, unit: Unit) -> bytes:
    """What a reused unit must match: fingerprint, tree, case, repetition and seed (a raw
    digest: the cache holds one per succeeded unit)."""
    parts = (
        settings.fingerprint,
        unit.tree_ref.digest,
        settings.case_refs[unit.case_id].digest,
        unit.repetition,
        pair_seed(settings, unit),
    )
    return hashlib.sha256(repr(parts).encode()).digest()


def replay_job(settings: SchedulerSettings, unit: Unit) -> ReplayJob:
    """The replay of ``unit`` (its case without the answers)."""
    return ReplayJob(
        unit_id=unit.unit_id,
        case_id=unit.case_id,
        case_ref=settings.case_refs[unit.case_id],
        tree_ref=unit.tree_ref,
        arm=unit.arm,  # type: ignore[arg-type]
        repetition=unit.repetition,
        seed=pair_seed(settings, unit),
        timeout_seconds=settings.replay_timeout,
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
    )


def replay_debit(unit: Unit) -> Debit:
    """The charge for ``unit``'s replay (its usage; incomplete usage as reserved)."""
    assert unit.replay is not None
    replay = unit.replay
    return Debit(
        item=unit.unit_id, actual=replay.usage, complete=replay.usage_complete, stage="replay"
    )


def unit_debits(unit: Unit) -> tuple[Debit, ...]:
    """The charges of a unit restored from the journal: its replay, then its judgement."""
    judge = unit.judge
    if judge is None or not (judge.usage.tokens or judge.usage.cost_usd):  # it cost nothing
        return (replay_debit(unit),)
    return (
        replay_debit(unit),
        Debit(item=unit.unit_id, actual=judge.usage, complete=judge.usage_complete, stage="judge"),
    )


def replay_record(measurement_id: str, unit: Unit) -> ReplayRecord:
    """The journal record of ``unit``'s replay, before its judgement."""
    assert unit.replay is not None
    return ReplayRecord(
        measurement=measurement_id, unit=unit.unit_id, tree=unit.tree_ref.digest, replay=unit.replay
    )


def unit_record(measurement_id: str, unit: Unit) -> UnitRecord:
    """The journal record of ``unit``, ended."""
    return UnitRecord(
        measurement=measurement_id,
        unit=unit.unit_id,
        tree=unit.tree_ref.digest,
        status=unit.status,  # type: ignore[arg-type]
        reused=unit.reused,
        replay=unit.replay,
        judge=unit.judge,
    )
