"""A parent's baseline unit that failed, across the measurements of its candidates (README
"How a candidate is decided"): one that failed the same way twice in a row for a reason a
new try meets again (its judge failing on its output after the retries, its replay broken by
the tree) is reused as failed, not paid for again in every candidate's measurement; one that
failed on the infrastructure (a timeout, a model endpoint's outage) is tried again each
time. `MeasurePlan` driven without IO (and as a resume finds it from the journal), then
campaigns through `run_campaign` with in-process backends, runs counted in the journal."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from evolane.campaign import Report
from evolane.campaign._config import CampaignConfig
from evolane.campaign._run import Backends, RunRequest, run_campaign
from evolane.embed import BackendCall
from evolane.lanes import ModelError
from evolane.measure._plan import Event, JournalUnit, MeasurePlan, StartJudge, StartReplay
from evolane.measure._sealed import SealedRecords
from evolane.measure._steps import Action, UnitJudged
from evolane.messages import FailureEvent, JudgeResult, UnitRecord
from tests.test_measure_plan import (
    BASE,
    Driver,
    Outcome,
    make_request,
    make_settings,
    stored_unit,
)

# ----- the plan --------------------------------------------------------------------------


@dataclass
class _Judges(Driver):
    """The plan's driver, with judges that fail on some units with a given code."""

    codes: dict[str, str] = field(default_factory=dict)  # unit id -> its judge's failure

    def event_for(self, action: Action) -> Event:
        code = self.codes.get(action.unit_id) if isinstance(action, StartJudge) else None
        if code is None:
            return super().event_for(action)
        failure = FailureEvent(owner="infrastructure", stage="judge", code=code)
        judged = JudgeResult(
            unit_id=action.unit_id, status="failed", source="command", failure=failure
        )
        return UnitJudged(action.unit_id, judged)


def _measure(
    name: str, records: SealedRecords, code: str | None, *, paired: bool = False, **kw: Any
) -> _Judges:
    """Measurement ``name`` of 2 cases, the parent alone (or ``paired``), its judge failing
    with ``code`` on case c0 (of the candidate when ``paired``)."""
    request = make_request(name, sequential=False)
    if not paired:
        request = request.model_copy(update={"candidate_ref": None})
    plan = MeasurePlan(request, make_settings(2, **kw), lanes=2, records=records, journaled=True)
    codes = {f"{name}.0.0.{'c' if paired else 'b'}": code} if code else {}
    driver = _Judges(plan, {u.unit_id: Outcome() for u in plan.units}, codes=codes)
    driver.run(random.Random(0))
    return driver


def _replayed(driver: _Judges) -> list[str]:
    return [a.unit_id for a in driver.log if isinstance(a, StartReplay)]


@pytest.mark.parametrize(
    ("first", "second", "reused"),
    [
        ("judge_exit_5", "judge_exit_5", True),  # the judge fails on this output
        ("judge_not_json", "judge_not_json", True),
        ("judge_exit_5", "judge_exit_6", False),  # not the same way
        ("judge_timed_out", "judge_timed_out", False),  # a timeout: maybe the host's load
        ("judge_endpoint_failed", "judge_endpoint_failed", False),  # an outage
        ("judge_spawn_failed", "judge_spawn_failed", False),
    ],
)
def test_a_baseline_failed_the_same_lasting_way_twice_is_reused_failed(
    first: str, second: str, reused: bool
) -> None:
    records = SealedRecords()
    _measure("m1", records, first)
    _measure("m2", records, second)
    later = [_measure("m3", records, second)]
    later += [_measure("m4", records, second)] if reused else []  # and from then on
    for driver in later:
        unit_id = f"{driver.plan.request.measurement_id}.0.0.b"
        unit = driver.plan.unit(unit_id)
        assert unit.status == "failed"
        assert (unit_id in _replayed(driver)) is not reused
        assert unit.reused is reused and (unit.note == "reused failure") is reused
        assert unit.judge is not None and unit.judge.failure.code == second  # type: ignore[union-attr]
        journaled = [a.unit_id for a in driver.log if isinstance(a, JournalUnit)]
        assert (unit_id in journaled) is not reused


def test_a_timeout_between_two_failures_of_one_way_breaks_the_streak() -> None:
    records = SealedRecords()
    for name, code in (("m1", "judge_exit_5"), ("m2", "judge_timed_out"), ("m3", "judge_exit_5")):
        _measure(name, records, code)
    assert "m4.0.0.b" in _replayed(_measure("m4", records, "judge_exit_5"))
    assert "m5.0.0.b" not in _replayed(_measure("m5", records, "judge_exit_5"))


def test_a_candidates_failure_is_never_reused() -> None:
    """Only a baseline's: the same tree failing as a candidate scores 0 (its own failure),
    and a candidate is measured once (a fresh re-measurement reuses nothing)."""
    records = SealedRecords()
    drivers = [_measure(f"m{i}", records, "judge_exit_5", paired=True) for i in range(3)]
    assert "m2.0.0.c" in _replayed(drivers[2])


def test_a_resume_reuses_the_same_failures_and_the_journal_wins() -> None:
    """A resume walks the measurements again, each unit restored from its journal record:
    the streaks come back alike, so the same units are reused (none replayed); a unit the
    journal holds (journaled by an older evolane, which ran it) is restored, never reused."""
    records = SealedRecords()
    drivers = [_measure(f"m{i}", records, "judge_exit_5") for i in range(1, 4)]
    journal: dict[str, UnitRecord] = {
        a.unit_id: a.record for d in drivers for a in d.log if isinstance(a, JournalUnit)
    }
    assert "m3.0.0.b" not in journal
    resumed = SealedRecords()
    again = [_measure(f"m{i}", resumed, None, restored=journal) for i in range(1, 4)]
    assert [_replayed(d) for d in again] == [[], [], []]
    assert again[2].plan.unit("m3.0.0.b").note == "reused failure"
    older = {**journal, "m3.0.0.b": stored_unit("m3.0.0.b", BASE)}  # it ran, and succeeded
    resumed = SealedRecords()
    again = [_measure(f"m{i}", resumed, None, restored=older) for i in range(1, 4)]
    unit = again[2].plan.unit("m3.0.0.b")
    assert (unit.status, unit.note, unit.reused) == ("succeeded", "restored", False)


# ----- whole campaigns ---------------------------------------------------------------------

VAL = 6
SLOTS = 4
JUDGE_BROKEN, OUTAGE, REPLAY_BROKEN = "v00", "v01", "v02"
"""The parent's cases whose judge fails on its output for good, whose judge's endpoint is down,
and whose replay the parent's tree breaks."""


class _World:
    """In-process replay, judge and optimizer; each candidate a tree of its own, no better
    than its parent."""

    def __init__(self) -> None:
        self.replays: Counter[str] = Counter()  # the parent's replays per case
        self.judged: Counter[str] = Counter()  # judge calls on the parent's output per case
        self.mended = False  # the judge reads `JUDGE_BROKEN`'s answer (its script was fixed)

    async def replay(self, call: BackendCall) -> None:
        assert call.case is not None and call.output_dir is not None
        assert call.candidate is not None
        parent = (call.candidate / "prompt.txt").read_text() == "seed\n"
        case = call.case["id"]
        self.replays[case] += parent
        if parent and case == REPLAY_BROKEN:
            raise RuntimeError("the parent's agent crashes on this case")
        answer = {"case": case, "parent": parent}
        (call.output_dir / "output.json").write_text(json.dumps(answer))

    async def judge(self, call: BackendCall) -> float:
        assert call.output_dir is not None
        answer = json.loads((call.output_dir / "output.json").read_text())
        case = answer["case"]
        self.judged[case] += answer["parent"]
        if answer["parent"] and case == JUDGE_BROKEN and not self.mended:
            raise ValueError("the judge cannot read this answer")  # on every try
        if answer["parent"] and case == OUTAGE:
            raise ModelError("HTTP 503 from the judge's model", endpoint_failed=True)
        return 0.5

    async def optimizer(self, call: BackendCall) -> str:
        assert call.workdir is not None
        (call.workdir / "prompt.txt").write_text(f"reworded {call.seed}\n")
        return "reworded"


async def _campaign(
    tmp: Path, world: _World | None = None, resume: str | None = None, **extra: Any
) -> tuple[Report, _World, list[dict[str, Any]]]:
    """A run of the campaign under ``tmp`` (its first; ``resume``: that campaign's next
    cycle), with ``world`` (a new one by default): its report, world and journaled units."""
    if not (tmp / "target").exists():
        (tmp / "target").mkdir(parents=True)
        (tmp / "target" / "prompt.txt").write_text("seed\n")
        rows = [{"id": f"t{i}", "split": "train"} for i in range(2)]
        rows += [{"id": f"v{i:02d}", "split": "val"} for i in range(VAL)]
        lines = (json.dumps({**r, "input": r["id"]}) + "\n" for r in rows)
        (tmp / "cases.jsonl").write_text("".join(lines))
    settings: dict[str, Any] = {
        "target": str(tmp / "target"),
        "dataset": str(tmp / "cases.jsonl"),
        "store": str(tmp / "store"),
        "replay": "backend:replay",
        "judge": "backend:judge",
        "optimizer": "backend:optimizer",
        "iterations": 1,
        "population": SLOTS,
        "error_control": "none",
        "gate": {"sequential": False, "min_cases": 2},
        "replay_concurrency": 4,
        "judge_concurrency": 4,
        **extra,
    }
    world = world or _World()
    backends = Backends(replay=world.replay, judge=world.judge, optimizer=world.optimizer)
    request = RunRequest(CampaignConfig(**settings), resume_campaign=resume)
    with trio.fail_after(300):  # a guard against a hang, not a timing figure
        outcome = await run_campaign(request, backends=backends)
    assert outcome.report is not None and outcome.report.status == "finished"
    assert outcome.run_dir is not None
    lines = (outcome.run_dir / "journal.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return outcome.report, world, [r for r in records if r["type"] == "unit"]


async def test_a_baseline_that_fails_the_same_way_is_not_paid_for_in_every_measurement(
    tmp_path: Path,
) -> None:
    """The parent measured alone on val, beside each of 4 candidates, then as the seed at
    the end: the unit whose judge fails on its output (3 judge calls a try) and the unit
    whose replay the tree breaks each ran twice, then were reused as failed (the same
    decisions: their cases left out); the unit that met an endpoint outage ran in every
    measurement. Before, every failed baseline unit ran in every measurement (6 runs each)."""
    report, world, units = await _campaign(tmp_path)
    parent = [u for u in units if u["unit"].endswith(".b")]
    ran = Counter(u["replay"]["case_id"] for u in parent if u["status"] != "succeeded")
    val = [m for m in report.measurements if m.split == "val"]
    assert len(val) == 2 + SLOTS
    assert ran == {JUDGE_BROKEN: 2, REPLAY_BROKEN: 2, OUTAGE: len(val)}
    assert world.replays[JUDGE_BROKEN] == world.replays[REPLAY_BROKEN] == 2
    assert world.judged[JUDGE_BROKEN] == 2 * 3  # each try: the judge and its 2 retries
    assert world.judged[OUTAGE] == len(val) * 3  # an outage is tried again each time
    paired = [m for m in val if m.purpose == "paired"]
    for m in paired[1:]:  # the parent's third measurement on: 2 failures reused
        assert (m.units_reused, m.units_failed, m.units_blocked) == (VAL - 1, 3, 3)
    assert [(m.decision, m.n) for m in paired] == [("reject", VAL - 3)] * SLOTS


async def test_a_reused_failure_names_the_unit_that_ran_it_and_its_case_counts_alike(
    tmp_path: Path,
) -> None:
    """A reused failure's record in the measurement's unit list: status failed, note
    ``reused failure``, its results those of a journaled unit of the same experiment; its
    candidate blocked, as when it failed again."""
    report, _, units = await _campaign(tmp_path, population=3)
    journaled = {u["unit"]: u for u in units}
    last = report.measurements[-1]
    listed = json.loads(_blob(tmp_path / "store", last.units_ref.digest))
    reused = [u for u in listed if u["note"] == "reused failure"]
    assert sorted(u["case"] for u in reused) == [JUDGE_BROKEN, REPLAY_BROKEN]
    for unit in reused:
        assert unit["status"] == "failed" and unit["reused"] and unit["score"] is None
        origin = journaled[unit["replay"]["unit_id"]]
        assert origin["status"] == "failed" and origin["replay"]["case_id"] == unit["case"]
        assert unit["unit"] not in journaled  # reused: neither run nor journaled
        treatment = next(u for u in listed if u["unit"] == unit["unit"][:-1] + "c")
        assert treatment["status"] == "blocked"


def _blob(store: Path, digest: str) -> bytes:
    hexdigest = digest.split(":", 1)[1]
    return (store / "objects" / "sha256" / hexdigest[:2] / hexdigest).read_bytes()


async def test_a_next_cycle_tries_its_parents_repeated_failures_again(tmp_path: Path) -> None:
    """A streak is the run's: the next cycle (``--resume-campaign``) measures its parent
    afresh, its failures too (README "How a candidate is decided"). A judge mended between
    the cycles under the same command (its script fixed) scores its case in the next cycle's
    first measurement of the parent; a case the tree still breaks fails twice again, then
    is reused. Carried from the cycle before, both would be reused failed: the mend never
    seen, the case left out of every later measurement of that parent."""
    first, world, _ = await _campaign(tmp_path, max_improvement_cycles=2)
    assert first.campaign_status == "paused" and first.best == first.seed  # the same parent
    world.mended, before = True, world.replays.copy()
    second, _, units = await _campaign(
        tmp_path, world, resume=first.campaign_id, max_improvement_cycles=2
    )
    assert second.cycle == 1 and second.iterations[0].parent == first.seed.digest
    ran = Counter(u["replay"]["case_id"] for u in units if u["unit"].endswith(".b"))
    assert world.replays - before == ran and ran[REPLAY_BROKEN] == 2  # a success once
    val = [m for m in second.measurements if m.split == "val"]
    listed = json.loads(_blob(tmp_path / "store", val[0].units_ref.digest))
    fresh = {u["case"]: u for u in listed if u["arm"] == "baseline"}
    assert fresh[JUDGE_BROKEN]["status"] == "succeeded" and not fresh[JUDGE_BROKEN]["reused"]
    assert fresh[REPLAY_BROKEN]["status"] == "failed" and not fresh[REPLAY_BROKEN]["reused"]
    last = json.loads(_blob(tmp_path / "store", val[-1].units_ref.digest))
    notes = {u["case"]: u["note"] for u in last if u["arm"] == "baseline"}
    assert notes[REPLAY_BROKEN] == "reused failure" and notes[JUDGE_BROKEN] == "reused"
