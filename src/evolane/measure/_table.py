"""A measurement's units as columns (issue 22): each unit's state is a row of machine arrays
(a byte for its step, status and flags, four for its note, eight for its score and its
sealed record's number), and `Unit` is a view of one row, made when asked for. Where a unit
sits (its case, repetition and arm) is arithmetic (`UnitLayout`). Typed results are held
only while a unit runs; an ended unit's record is sealed out of memory (`SealedRecords`).
No IO of its own."""

from __future__ import annotations

import math
import zlib
from array import array
from collections.abc import Iterator
from functools import cache
from typing import Any, Literal, get_args

import orjson

from evolane.lanes import JUDGE_ENDPOINT_FAILED
from evolane.measure._layout import UnitLayout
from evolane.measure._sealed import SealedRecords
from evolane.messages import ArtifactRef, JudgeResult, MeasureRequest, ReplayResult, Usage
from evolane.store import TREE_MEDIA_TYPE

UnitStep = Literal[
    "waiting",  # for its control
    "ready",  # for a lane
    "replaying",  # the shell reserves and replays (or the unit is restored while holding it)
    "charging",
    "journaling_replay",
    "judging",
    "rejudging",  # a restored replay judged again, its lane still held
    "journaling",
    "done",
]
_STEPS: tuple[UnitStep, ...] = get_args(UnitStep)
_STEP_CODES = {step: code for code, step in enumerate(_STEPS)}


class _Codes:
    """Texts (statuses, notes) as small numbers, each distinct text kept once."""

    def __init__(self, *texts: str) -> None:
        self.texts: list[str] = []
        self._codes: dict[str, int] = {}
        for text in texts:
            self.code(text)

    def code(self, text: str) -> int:
        found = self._codes.get(text)
        if found is None:
            found = self._codes[text] = len(self.texts)
            self.texts.append(text)
        return found


class UnitTable:
    """Every unit of one measurement, by index in plan order (see the module docstring):
    ``table[i]`` is a `Unit` view of row ``i``; ``records`` is where ended units are sealed."""

    def __init__(
        self,
        request: MeasureRequest,
        layout: UnitLayout,
        case_ids: list[str],
        records: SealedRecords,
    ) -> None:
        self.layout, self.case_ids, self.records = layout, case_ids, records
        self.trees = (request.baseline_ref, request.candidate_ref)
        size = len(layout)
        self.steps = bytearray(size)  # `_STEPS` codes: all "waiting"
        self.flags = bytearray(size)
        self.statuses = bytearray(size)  # codes of `_statuses`: all "pending"
        self.notes = array("I", bytes(4 * size))  # codes of `_notes`: all ""
        self.scores = array("d", [math.nan]) * size  # once sealed (NaN: not comparable)
        self.sealed = array("q", [-1]) * size  # each sealed record's number in ``records``
        self.replays: dict[int, ReplayResult] = {}  # typed results, until compacted
        self.judges: dict[int, JudgeResult] = {}
        self._statuses = _Codes("pending")
        self._notes = _Codes("")

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, index: int) -> Unit:
        if not 0 <= index < len(self.steps):
            raise IndexError(index)
        return Unit(self, index)

    def __iter__(self) -> Iterator[Unit]:
        return (Unit(self, index) for index in range(len(self.steps)))


class _Flag:
    """One bit of a unit's flags in its table, read and set as a bool."""

    def __init__(self, bit: int) -> None:
        self.bit = bit

    def __get__(self, unit: Unit, owner: type | None = None) -> bool:
        return bool(unit.table.flags[unit.index] & self.bit)

    def __set__(self, unit: Unit, value: bool) -> None:
        flags, index = unit.table.flags, unit.index
        flags[index] = flags[index] | self.bit if value else flags[index] & ~self.bit


class Unit:
    """One replay of one case on one arm and repetition, and what became of it: a view of
    row ``index`` of its `UnitTable` (two views of one row are equal; neither holds state).

    Once ended, a unit is `seal`-ed (its record serialised once, deflated and put in the
    scheduler's `SealedRecords`, out of memory: the units blob and the reuse cache read it
    there) and then `compact`-ed (its typed results dropped): a finished unit keeps its
    score and its record's number, and ``replay``/``judge`` are decoded from the record on
    the rare reads after that (a reused unit, a test)."""

    __slots__ = ("index", "table")

    def __init__(self, table: UnitTable, index: int) -> None:
        self.table, self.index = table, index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unit) and other.table is self.table and other.index == self.index

    def __hash__(self) -> int:
        return hash((id(self.table), self.index))

    def __repr__(self) -> str:
        return f"<Unit {self.unit_id} {self.step} {self.status}>"

    # ----- where it sits: arithmetic on the layout ---------------------------------------

    @property
    def measurement(self) -> str:
        """The measurement's id."""
        return self.table.layout.measurement_id

    @property
    def case_index(self) -> int:
        """The case's place in the reading order (the prefix early stop reads)."""
        return self.table.layout.locate(self.index)[0]

    @property
    def repetition(self) -> int:
        return self.table.layout.locate(self.index)[1]

    @property
    def arm(self) -> str:
        return "candidate" if self.table.layout.locate(self.index)[2] else "baseline"

    @property
    def case_id(self) -> str:
        return self.table.case_ids[self.case_index]

    @property
    def case_number(self) -> int:
        """The case's place in the dataset (names the unit, orders records)."""
        return self.table.layout.number(self.case_index)

    @property
    def unit_id(self) -> str:
        """``<measurement>.<case number>.<repetition>.<b|c>``: named by the case's place in
        the dataset, so the same whatever the reading order (a journal resumes under any);
        built when asked for, not held (`UnitLayout.find` goes back)."""
        place, rep, candidate = self.table.layout.locate(self.index)
        number = self.table.layout.number(place)
        return f"{self.measurement}.{number}.{rep}.{'c' if candidate else 'b'}"

    @property
    def tree_ref(self) -> ArtifactRef:
        """The tree its arm replays."""
        tree = self.table.trees[self.table.layout.locate(self.index)[2]]
        assert tree is not None
        return tree

    @property
    def depends_on(self) -> Unit | None:
        """A candidate's control (`UnitLayout.control`); None for a baseline."""
        control = self.table.layout.control(self.index)
        return None if control is None else Unit(self.table, control)

    # ----- its state: one row of the table -----------------------------------------------

    @property
    def step(self) -> UnitStep:
        return _STEPS[self.table.steps[self.index]]

    @step.setter
    def step(self, value: UnitStep) -> None:
        self.table.steps[self.index] = _STEP_CODES[value]

    @property
    def status(self) -> str:
        return self.table._statuses.texts[self.table.statuses[self.index]]

    @status.setter
    def status(self, value: str) -> None:
        self.table.statuses[self.index] = self.table._statuses.code(value)

    @property
    def note(self) -> str:
        return self.table._notes.texts[self.table.notes[self.index]]

    @note.setter
    def note(self, value: str) -> None:
        self.table.notes[self.index] = self.table._notes.code(value)

    holds_lane = _Flag(1)
    done = _Flag(2)
    reused = _Flag(4)
    restored = _Flag(8)
    _took = _Flag(16)  # once sealed: `took_part`

    @property
    def sealed_at(self) -> int:
        """Its sealed record's number in the table's records (-1 before it ended)."""
        return self.table.sealed[self.index]

    @property
    def sealed(self) -> bool:
        return self.table.sealed[self.index] >= 0

    @property
    def record(self) -> bytes | None:
        """The sealed record: this unit's JSON in the units blob (None before it ended)."""
        at = self.table.sealed[self.index]
        return None if at < 0 else unpack(self.table.records.get(at))

    @property
    def replay(self) -> ReplayResult | None:
        """The replay's result (decoded from the record once compacted)."""
        held = self.table.replays.get(self.index)
        if held is None and (record := self.record) is not None:
            stored = orjson.loads(record)["replay"]
            return None if stored is None else ReplayResult.model_validate(stored)
        return held

    @replay.setter
    def replay(self, value: ReplayResult | None) -> None:
        _hold(self.table.replays, self.index, value)

    @property
    def judge(self) -> JudgeResult | None:
        """The judge's result (decoded from the record once compacted)."""
        held = self.table.judges.get(self.index)
        if held is None and (record := self.record) is not None:
            stored = orjson.loads(record)["judge"]
            return None if stored is None else JudgeResult.model_validate(stored)
        return held

    @judge.setter
    def judge(self, value: JudgeResult | None) -> None:
        _hold(self.table.judges, self.index, value)

    @property
    def score(self) -> float | None:
        """The judge's score when both the replay and the judge succeeded; 0 when the candidate
        itself broke the replay (a crash or no output it caused), or when a candidate unit
        ended unscored for a reason its tree could have caused (`unscored_counts_as_zero`);
        else None (not comparable)."""
        if self.sealed:
            score = self.table.scores[self.index]
            return None if math.isnan(score) else score
        replay, judge = self.table.replays.get(self.index), self.table.judges.get(self.index)
        failure = replay.failure if replay is not None else None
        if failure is not None and failure.owner == "candidate":
            return 0.0
        ok = replay is not None and replay.status == "succeeded"
        judged = judge is not None and judge.status == "succeeded"
        if ok and judged and judge is not None:
            return judge.score
        unscored = replay is not None and unscored_counts_as_zero(replay, judge)
        return 0.0 if unscored and self.arm == "candidate" else None

    @property
    def took_part(self) -> bool:
        """Whether it ran, was reused or was restored (observers hear of it when it ends);
        units never started or blocked by their control are only counted."""
        if self.sealed:
            return self._took
        replay = self.table.replays.get(self.index)
        return replay is not None and replay.status != "blocked"

    def seal(self) -> None:
        """The unit ended: keep its score and put its record in the table's records (nothing
        of it changes any more)."""
        table, index = self.table, self.index
        self._took = self.took_part
        score = self.score
        table.scores[index] = math.nan if score is None else score
        table.sealed[index] = table.records.put(pack(orjson.dumps(unit_fields(self))))

    def compact(self) -> None:
        """Drop the typed results of a sealed unit (its record holds them)."""
        if self.sealed:
            self.table.replays.pop(self.index, None)
            self.table.judges.pop(self.index, None)


def unscored_counts_as_zero(replay: ReplayResult, judge: JudgeResult | None) -> bool:
    """Whether a candidate unit that ended unscored scores 0 (the worst score) in the
    comparison: its replay timed out or failed, or its judge failed on its output, for any
    reason but a spawn that never started, the framework's stop (early stop, budget, cancel:
    a status of its own) or a judge backend's model endpoint that failed (HTTP 5xx, 401, the
    network: nothing an output can cause; scored 0, an outage on the candidate's units
    rejected a better candidate, found by review). A candidate's tree can cause a timeout, a
    judge crash or even a lane crash (an output it made unreadable) on the cases it would
    fail; left out, they would leave only the cases it passes in the comparison (found by
    review: a worse candidate accepted and published that way). What is left out is missing
    data, and the coverage guard makes a measurement with too little of it indecisive."""
    if replay.status in ("cancelled", "blocked", "not_run"):
        return False
    if replay.status != "succeeded":  # failed or timed out
        return replay.failure is None or not replay.failure.code.endswith("spawn_failed")
    if judge is None or judge.status != "failed" or judge.failure is None:
        return False
    code = judge.failure.code  # a model endpoint's outage is not the output's doing
    return not code.endswith("spawn_failed") and code != JUDGE_ENDPOINT_FAILED


def unit_table(
    request: MeasureRequest,
    case_ids: list[str],
    reps: tuple[int, int],
    records: SealedRecords | None = None,
) -> UnitTable:
    """The units of ``request`` over ``case_ids`` (read in that order, numbered by it) with
    ``reps`` repetitions, alone (a plan makes its own: `MeasurePlan`)."""
    numbers = {case_id: number for number, case_id in enumerate(case_ids)}
    layout = UnitLayout(request, case_ids, reps, numbers)
    return UnitTable(request, layout, case_ids, SealedRecords() if records is None else records)


def _hold(held: dict[int, Any], index: int, value: object) -> None:
    if value is None:
        held.pop(index, None)
    else:
        held[index] = value


def unit_fields(unit: Unit) -> dict[str, Any]:
    """``unit`` as its record in the units blob."""
    return {
        "unit": unit.unit_id,
        "case": unit.case_id,
        "arm": unit.arm,
        "repetition": unit.repetition,
        "status": unit.status,
        "reused": unit.reused,
        "restored": unit.restored,
        "note": unit.note,
        "score": unit.score,
        "replay": unit.replay.model_dump(mode="json") if unit.replay else None,
        "judge": unit.judge.model_dump(mode="json") if unit.judge else None,
    }


def pack(record: bytes) -> bytes:
    """A sealed record as kept: deflated against `_preset` (a typical record), so it costs
    what differs from that (its ids, digests and timings: about a quarter of its size), at a
    few microseconds' cost."""
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
    ref = ArtifactRef(digest="sha256:" + "0" * 64, size=1)
    unit = unit_table(MeasureRequest(measurement_id="m", baseline_ref=ref), ["c"], (1, 0))[0]
    unit.status = "succeeded"
    unit.replay = ReplayResult(
        unit_id=unit.unit_id,
        case_id=unit.case_id,
        arm="baseline",
        repetition=0,
        status="succeeded",
        output_ref=ref.model_copy(update={"size": 100, "media_type": TREE_MEDIA_TYPE}),
        usage=Usage(wall_seconds=0.01),
        wall_seconds=0.01,
    )
    unit.judge = JudgeResult(
        unit_id=unit.unit_id,
        status="succeeded",
        score=1.0,
        source="command",
        detail_ref=ref.model_copy(update={"size": 10}),
        wall_seconds=0.01,
        usage=Usage(tokens=0.0, cost_usd=0.0, wall_seconds=0.01),
        usage_complete=True,
    )
    return orjson.dumps(unit_fields(unit))
