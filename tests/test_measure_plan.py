"""`MeasurePlan` without trio: hypothesis drives it over case and lane counts, repetitions,
results and completion orders, and checks the rules of DESIGN §6 at every step."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from evolane.lanes import HOST_REFUSED
from evolane.measure import SchedulerSettings
from evolane.measure._plan import (
    Action,
    ChargeUnit,
    Event,
    Finish,
    JournalReplay,
    JournalUnit,
    JudgeDenied,
    MeasurePlan,
    Progress,
    ReplayJournaled,
    ReserveDenied,
    StartJudge,
    StartReplay,
    StopRequested,
    StopUnit,
    UnitCharged,
    UnitEnded,
    UnitJournaled,
    UnitJudged,
    UnitReplayed,
)
from evolane.measure._prefix import decision
from evolane.measure._sealed import SealedRecords
from evolane.messages import (
    ArtifactRef,
    FailureEvent,
    GateConfig,
    JudgeResult,
    MeasureRequest,
    ReplayRecord,
    ReplayResult,
    UnitRecord,
)
from evolane.stats import decide

TERMINAL = {"succeeded", "failed", "timed_out", "cancelled", "blocked", "not_run"}
FAST_GATE = {"bootstrap_samples": 200, "min_cases": 2}


def ref(n: int) -> ArtifactRef:
    return ArtifactRef(digest=f"sha256:{n:064x}", size=n)


BASE, CAND, OUTPUT = ref(1), ref(2), ref(3)


def make_settings(cases: int, **overrides: Any) -> SchedulerSettings:
    ids = tuple(f"c{i}" for i in range(cases))
    refs = {case: ref(100 + i) for i, case in enumerate(ids)}
    values: dict[str, Any] = {
        "case_refs": refs,
        "judge_case_refs": refs,
        "splits": {"val": ids},
        "fingerprint": "fp",
        "min_cases": 1,  # repetitions 1/1 unless a test asks for the adaptive ones
        **overrides,
    }
    return SchedulerSettings(**values)


def make_request(
    name: str = "m", sequential: bool = True, reps: tuple[int, int] | None = None, **gate: Any
) -> MeasureRequest:
    return MeasureRequest(
        measurement_id=name,
        baseline_ref=BASE,
        candidate_ref=CAND,
        baseline_repetitions=reps[0] if reps else None,
        candidate_repetitions=reps[1] if reps else None,
        gate=GateConfig(sequential=sequential, **{**FAST_GATE, **gate}),
    )


@dataclass(frozen=True)
class Outcome:
    """What a unit's replay and judgement come to when its lanes answer."""

    replay: str = "succeeded"  # or failed / timed_out
    owner: str = "task"  # of a failed replay: a "candidate" failure scores 0
    score: float | None = 1.0  # None: the judge fails


def replay_result(job: Any, outcome: Outcome, stopped: bool = False) -> ReplayResult:
    status = "cancelled" if stopped else outcome.replay
    failure = None
    if status == "failed":
        failure = FailureEvent(owner=outcome.owner, stage="replay", code="exit_1")  # type: ignore[arg-type]
    return ReplayResult(
        unit_id=job.unit_id,
        case_id=job.case_id,
        arm=job.arm,
        repetition=job.repetition,
        status=status,  # type: ignore[arg-type]
        failure=failure,
        output_ref=OUTPUT if status == "succeeded" else None,
    )


def judge_result(unit_id: str, outcome: Outcome, stopped: bool = False) -> JudgeResult:
    if stopped:
        return JudgeResult(unit_id=unit_id, status="cancelled", source="command")
    if outcome.score is None:
        failure = FailureEvent(owner="infrastructure", stage="judge", code="bad_output")
        return JudgeResult(unit_id=unit_id, status="failed", source="command", failure=failure)
    return JudgeResult(unit_id=unit_id, status="succeeded", score=outcome.score, source="command")


@dataclass
class Driver:
    """Plays the scheduler's part: answers the plan's actions in an order it is told, and
    checks the plan's rules after every step."""

    plan: MeasurePlan
    outcomes: dict[str, Outcome]
    deny: set[str] = field(default_factory=set)  # units whose reservation the budget denies
    deny_judge: set[str] = field(default_factory=set)  # units whose judgement it denies
    pending: list[Action] = field(default_factory=list)
    stopped: set[str] = field(default_factory=set)
    started: dict[str, int] = field(default_factory=dict)  # StartReplay per unit
    ended: dict[str, str] = field(default_factory=dict)  # unit id -> terminal status, once
    finishes: int = 0
    told: list[str] = field(default_factory=list)  # UnitEnded, in order
    log: list[Action] = field(default_factory=list)
    checking: bool = True  # check every rule after every step (off for large plans)

    def take(self, actions: list[Action]) -> None:
        for action in actions:
            self.log.append(action)
            if isinstance(action, StartReplay):
                unit = self.plan.unit(action.unit_id)
                control = unit.depends_on
                assert control is None or (control.done and control.status == "succeeded")
                self.started[action.unit_id] = self.started.get(action.unit_id, 0) + 1
                assert self.started[action.unit_id] == 1, f"{action.unit_id} started twice"
            if isinstance(action, StartJudge):  # nothing is judged once it is not wanted
                unit = self.plan.unit(action.unit_id)
                assert self.plan.stop_reason is None and not self.plan._beyond_cutoff(unit)
            if isinstance(action, StopUnit):
                self.stopped.update(action.unit_ids)
            elif isinstance(action, Finish):
                self.finishes += 1
            elif isinstance(action, UnitEnded):  # told once it ended, journaled if it is
                unit = self.plan.unit(action.unit_id)
                assert unit.done and action.unit_id not in self.told
                journaling = [a for a in self.pending if isinstance(a, JournalUnit)]
                assert unit.unit_id not in {a.unit_id for a in journaling}
                self.told.append(action.unit_id)
                event = self.plan.unit_event(action.unit_id)
                assert (event.unit_id, event.status) == (unit.unit_id, unit.status)
            elif not isinstance(action, Progress):
                self.pending.append(action)
        if self.checking:
            self.check()

    def check(self) -> None:
        plan = self.plan
        assert plan.finished or self.pending, "units wait, but nothing is in flight"
        replaying = sum(isinstance(a, StartReplay) for a in self.pending)
        assert replaying <= plan.in_flight <= plan.lanes
        assert sum(u.holds_lane for u in plan.units) == plan.in_flight
        judging = sum(u.step in ("judging", "rejudging") for u in plan.units)
        assert plan.progress().judges_busy == judging  # the running count is the recount
        for unit in plan.units:
            if unit.done:
                assert unit.status in TERMINAL
                assert self.ended.setdefault(unit.unit_id, unit.status) == unit.status
            else:
                assert unit.unit_id not in self.ended, f"{unit.unit_id} ended twice"
        assert self.finishes == (1 if plan.finished else 0)
        if plan.finished:
            assert not self.pending and len(self.ended) == len(plan.units)
            took_part = [u.unit_id for u in plan.units if u.replay and u.replay.status != "blocked"]
            assert sorted(self.told) == sorted(took_part)  # every unit that ran, told once
            restored = plan.settings.restored_replays  # journaled before a resume, charged
            if plan.journaled:  # a journaled replay has its unit's record: none stands alone
                records = {a.unit_id: a.record for a in self.log if isinstance(a, JournalUnit)}
                records = {**plan.settings.restored, **records}  # its session's, or this one's
                alone = [a.unit_id for a in self.log if isinstance(a, JournalReplay)]
                alone += list(restored)
                assert all(unit_id in records for unit_id in alone), "a replay without its unit"
            for unit in plan.units:  # a control that did not succeed blocks its treatment
                control = unit.depends_on
                if control is not None and control.status != "succeeded":
                    kept = unit.unit_id in restored and unit.status == "cancelled"
                    assert kept or unit.status in ("blocked", "not_run")
                    assert unit.unit_id not in self.started

    def answer(self, index: int) -> None:
        action = self.pending.pop(index)
        self.take(self.plan.handle(self.event_for(action)))

    def event_for(self, action: Action) -> Event:
        if isinstance(action, StartReplay):
            if action.unit_id in self.deny:
                return ReserveDenied(action.unit_id)
            stopped = action.unit_id in self.stopped
            outcome = self.outcomes[action.unit_id]
            return UnitReplayed(action.unit_id, replay_result(action.job, outcome, stopped))
        if isinstance(action, StartJudge):
            if action.unit_id in self.deny_judge:
                return JudgeDenied(action.unit_id)
            stopped = action.unit_id in self.stopped
            outcome = self.outcomes[action.unit_id]
            return UnitJudged(action.unit_id, judge_result(action.unit_id, outcome, stopped))
        if isinstance(action, ChargeUnit):
            return UnitCharged(action.unit_id)
        if isinstance(action, JournalReplay):
            return ReplayJournaled(action.unit_id)
        assert isinstance(action, JournalUnit)
        assert action.record.status == self.plan.unit(action.unit_id).status
        return UnitJournaled(action.unit_id)

    def run(self, rng: random.Random) -> None:
        """Answer every action in a random order until the measurement ends."""
        self.take(self.plan.start())
        while self.pending:
            self.answer(rng.randrange(len(self.pending)))
        assert self.plan.finished


def outcomes_for(plan: MeasurePlan, rng: random.Random, fail: float) -> dict[str, Outcome]:
    """Random results: scores per case and arm (repetitions vary a little), some failures."""
    level = {case: rng.random() for case in plan.case_ids}
    effect = rng.choice([-0.3, 0.0, 0.2, 0.5])
    table = {}
    for unit in plan.units:
        base = level[unit.case_id] + (effect if unit.arm == "candidate" else 0.0)
        score = min(1.0, max(0.0, base + rng.uniform(-0.1, 0.1)))
        if rng.random() < fail:
            kind = rng.choice(["failed", "timed_out", "judge", "candidate"])
            if kind == "candidate" and unit.arm == "baseline":
                kind = "failed"
            if kind == "judge":
                table[unit.unit_id] = Outcome(score=None)
            elif kind == "candidate":
                table[unit.unit_id] = Outcome(replay="failed", owner="candidate")
            else:
                table[unit.unit_id] = Outcome(replay=kind)
        else:
            table[unit.unit_id] = Outcome(score=round(score, 3))
    return table


def expected_scores(
    plan: MeasurePlan, outcomes: dict[str, Outcome]
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each arm's per-case scores from the outcomes alone (a failed control blocks)."""
    baseline: dict[str, list[float]] = {}
    candidate: dict[str, list[float]] = {}

    def score(unit_id: str, arm: str) -> float | None:
        outcome = outcomes[unit_id]
        if outcome.replay == "failed" and outcome.owner == "candidate":
            return 0.0
        if outcome.replay == "succeeded" and outcome.score is not None:
            return outcome.score
        return 0.0 if arm == "candidate" else None  # never in the candidate's favour

    def succeeded(unit_id: str) -> bool:
        outcome = outcomes[unit_id]
        return outcome.replay == "succeeded" and outcome.score is not None

    for unit in plan.units:
        if unit.depends_on is not None and not succeeded(unit.depends_on.unit_id):
            continue  # blocked
        value = score(unit.unit_id, unit.arm)
        if value is not None:
            side = baseline if unit.arm == "baseline" else candidate
            side.setdefault(unit.case_id, []).append(value)
    return baseline, candidate


shapes = st.fixed_dictionaries(
    {
        "cases": st.integers(1, 40),
        "lanes": st.integers(1, 8),
        "reps": st.one_of(st.none(), st.tuples(st.integers(1, 3), st.integers(1, 3))),
        "fail": st.sampled_from([0.0, 0.1, 0.4]),
        "seed": st.integers(0, 2**32 - 1),
    }
)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def build(
    shape: dict[str, Any], sequential: bool, stored: tuple[int, ...] = (), **plan_args: Any
) -> tuple[MeasurePlan, Any]:
    """A plan of ``shape`` and its units' outcomes; the units at ``stored`` (indexes, modulo
    the plan's size) have a replay journaled unjudged before the run resumed."""
    plan = MeasurePlan(
        make_request(sequential=sequential, reps=shape["reps"]),
        make_settings(shape["cases"], min_cases=8),
        lanes=shape["lanes"],
        **plan_args,
    )
    if stored:
        ids = [plan.units[i % len(plan.units)].unit_id for i in stored]
        plan = resumed(plan, ids, ids[::2], **plan_args)
    rng = random.Random(shape["seed"])
    return plan, outcomes_for(plan, rng, shape["fail"])


def resumed(
    plan: MeasurePlan, unit_ids: list[str], cut: list[str] | None = None, **plan_args: Any
) -> MeasurePlan:
    """``plan`` again, as a resume plans it when its units ``unit_ids`` were replayed and
    journaled, not judged, before the interruption (their replays charged as it resumed);
    those in ``cut`` were then journaled ``cancelled`` (their session's stop cut the judge)."""
    replays, restored = {}, {}
    for unit_id in unit_ids:
        unit = plan.unit(unit_id)
        replay = ReplayResult(
            unit_id=unit_id,
            case_id=unit.case_id,
            arm=unit.arm,  # type: ignore[arg-type]
            repetition=unit.repetition,
            status="succeeded",
            output_ref=OUTPUT,
        )
        tree = unit.tree_ref.digest
        replays[unit_id] = ReplayRecord(measurement="m", unit=unit_id, tree=tree, replay=replay)
        if unit_id in (cut or ()):
            judge = JudgeResult(unit_id=unit_id, status="cancelled", source="command")
            restored[unit_id] = UnitRecord(
                measurement="m",
                unit=unit_id,
                tree=tree,
                status="cancelled",
                replay=replay,
                judge=judge,
            )
    update = {"restored_replays": replays, "restored": restored}
    settings_ = dataclasses.replace(plan.settings, **update)
    return MeasurePlan(plan.request, settings_, lanes=plan.lanes, **plan_args)


@FAST
@given(shape=shapes, budgeted=st.booleans(), journaled=st.booleans())
def test_a_full_evaluation_decides_as_the_gate_on_all_the_data(
    shape: dict[str, Any], budgeted: bool, journaled: bool
) -> None:
    plan, outcomes = build(shape, sequential=False, budgeted=budgeted, journaled=journaled)
    Driver(plan, outcomes).run(random.Random(shape["seed"] + 1))
    summary = plan.summary(OUTPUT, 0.0)
    baseline, candidate = expected_scores(plan, outcomes)
    expected = decide(baseline, candidate, plan.request.gate, n_planned=len(plan.case_ids))
    assert summary.gate == expected
    assert summary.status == "complete" and plan.cutoff is None
    blocked = sum(
        u.depends_on is not None and u.depends_on.status != "succeeded" for u in plan.units
    )
    assert summary.units_blocked == blocked
    assert summary.units_not_run == 0


@FAST
@given(shape=shapes, orders=st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)))
def test_the_decision_and_the_cutoff_do_not_depend_on_completion_order(
    shape: dict[str, Any], orders: tuple[int, int]
) -> None:
    results = []
    for order in orders:
        plan, outcomes = build(shape, sequential=True, budgeted=True, journaled=True)
        Driver(plan, outcomes).run(random.Random(order))
        summary = plan.summary(OUTPUT, 0.0)
        results.append((summary.gate, summary.status, plan.cutoff, plan.early))
    assert results[0] == results[1]


class PlanMachine(RuleBasedStateMachine):
    """Hypothesis picks which pending action the lanes answer next, and when a stop comes."""

    @initialize(
        shape=shapes,
        sequential=st.booleans(),
        budgeted=st.booleans(),
        stored=st.lists(st.integers(0, 10_000), max_size=4).map(tuple),
    )
    def setup(
        self, shape: dict[str, Any], sequential: bool, budgeted: bool, stored: tuple[int, ...]
    ) -> None:
        """``stored``: units replayed and journaled, not judged, before the run resumed."""
        plan, outcomes = build(shape, sequential, stored, budgeted=budgeted, journaled=True)
        self.driver = Driver(plan, outcomes)
        self.driver.take(plan.start())

    @rule(pick=st.integers(0, 10_000))
    def answer(self, pick: int) -> None:
        if self.driver.pending:  # else the measurement has ended
            self.driver.answer(pick % len(self.driver.pending))

    @precondition(lambda self: not self.driver.plan.finished)
    @rule()
    def cancel(self) -> None:
        stop = StopRequested("cancelled", "the measurement was cancelled")
        self.driver.take(self.driver.plan.handle(stop))

    @invariant()
    def rules_hold(self) -> None:
        self.driver.check()

    def teardown(self) -> None:
        driver = self.driver
        while driver.pending:  # the lanes answer the rest: every unit ends, once
            driver.answer(0)
        assert driver.plan.finished and driver.finishes == 1
        assert set(driver.ended) == {u.unit_id for u in driver.plan.units}


PlanMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_the_plan_keeps_its_rules_in_any_order = PlanMachine.TestCase


# ----- single situations ------------------------------------------------------------------


def run_plan(plan: MeasurePlan, outcomes: dict[str, Outcome] | None = None, **kw: Any) -> Driver:
    outcomes = outcomes or {u.unit_id: Outcome() for u in plan.units}
    driver = Driver(plan, outcomes, **kw)
    driver.run(random.Random(0))
    return driver


def kinds(driver: Driver, kind: type) -> list[Any]:
    return [a for a in driver.log if isinstance(a, kind)]


def test_a_reused_unit_is_neither_replayed_nor_journaled() -> None:
    records = SealedRecords()
    first = MeasurePlan(make_request("m1", False), make_settings(4), lanes=2, records=records)
    run_plan(first)
    second = MeasurePlan(make_request("m2", False), make_settings(4), lanes=2, records=records)
    driver = run_plan(second)
    assert kinds(driver, StartReplay) == [] and kinds(driver, JournalUnit) == []
    summary = second.summary(OUTPUT, 0.0)
    assert summary.units_reused == 8 and summary.units_run == 0
    assert all(u.note == "reused" and u.replay.unit_id == u.unit_id for u in second.units)


def test_the_same_tree_on_both_arms_reuses_the_baseline_for_the_candidate() -> None:
    request = make_request(sequential=False).model_copy(update={"candidate_ref": BASE})
    plan = MeasurePlan(request, make_settings(3), lanes=3, journaled=True)
    driver = run_plan(plan)
    assert {a.unit_id for a in kinds(driver, StartReplay)} == {"m.0.0.b", "m.1.0.b", "m.2.0.b"}
    assert plan.summary(OUTPUT, 0.0).units_reused == 3


def stored_unit(unit_id: str, tree: ArtifactRef | None, status: str = "succeeded") -> UnitRecord:
    replay = ReplayResult(
        unit_id=unit_id,
        case_id="c0",
        arm="baseline",
        repetition=0,
        status=status,  # type: ignore[arg-type]
        output_ref=OUTPUT if status == "succeeded" else None,
    )
    judge = JudgeResult(unit_id=unit_id, status="succeeded", score=0.5, source="command")
    return UnitRecord(
        measurement="m",
        unit=unit_id,
        tree=tree.digest if tree else None,
        status=status,  # type: ignore[arg-type]
        replay=replay,
        judge=judge if status == "succeeded" else None,
    )


def test_a_restored_unit_is_not_charged_replayed_nor_journaled_again() -> None:
    """Its spend is charged as the run resumes (`restored_debits`), not by the plan: an
    early stop can leave a restored unit unread."""
    restored = {
        "m.0.0.b": stored_unit("m.0.0.b", BASE),
        "m.1.0.b": stored_unit("m.1.0.b", None),  # an older journal: no tree
        "m.2.0.b": stored_unit("m.2.0.b", BASE, status="cancelled"),  # runs again
    }
    plan = MeasurePlan(
        make_request(sequential=False),
        make_settings(3, restored=restored),
        lanes=2,
        budgeted=True,
        journaled=True,
    )
    driver = run_plan(plan)
    replayed = {a.unit_id for a in kinds(driver, StartReplay)}
    assert replayed == {"m.2.0.b", "m.0.0.c", "m.1.0.c", "m.2.0.c"}
    assert {a.unit_id for a in kinds(driver, ChargeUnit)} == replayed
    assert {a.unit_id for a in kinds(driver, JournalUnit)} == replayed
    notes = {u.unit_id: u.note for u in plan.units if u.restored}
    assert notes == {"m.0.0.b": "restored", "m.1.0.b": "restored"}
    assert plan.summary(OUTPUT, 0.0).units_restored == 2


def test_a_stored_replay_is_judged_only() -> None:
    record = stored_unit("m.0.0.b", BASE)
    stored = {
        "m.0.0.b": ReplayRecord(
            measurement="m", unit="m.0.0.b", tree=BASE.digest, replay=record.replay
        )
    }  # type: ignore[arg-type]
    plan = MeasurePlan(
        make_request(sequential=False),
        make_settings(1, restored_replays=stored),
        lanes=1,
        journaled=True,
    )
    driver = run_plan(plan)
    assert [a.unit_id for a in kinds(driver, StartReplay)] == ["m.0.0.c"]
    assert [a.unit_id for a in kinds(driver, StartJudge)] == ["m.0.0.b", "m.0.0.c"]
    assert [a.unit_id for a in kinds(driver, JournalReplay)] == ["m.0.0.c"]  # not again


def test_a_rejudge_judges_stored_replays_and_diverged_trees_are_not_used() -> None:
    restored = {
        "m.0.0.b": stored_unit("m.0.0.b", BASE),
        "m.1.0.b": stored_unit("m.1.0.b", CAND),  # replayed on another tree
    }
    settings_ = make_settings(2, restored=restored, rejudge=True, replays_allowed=False)
    request = make_request(sequential=False).model_copy(update={"candidate_ref": None})
    plan = MeasurePlan(request, settings_, lanes=2, budgeted=True, journaled=True)
    driver = run_plan(plan)
    assert kinds(driver, StartReplay) == [] and kinds(driver, ChargeUnit) == []
    assert [a.unit_id for a in kinds(driver, JournalUnit)] == ["m.0.0.b"]
    by_id = {u.unit_id: u for u in plan.units}
    assert by_id["m.0.0.b"].note == "rejudged" and by_id["m.0.0.b"].judge.score == 1.0
    assert by_id["m.1.0.b"].status == "not_run" and "diverged" in by_id["m.1.0.b"].note
    summary = plan.summary(OUTPUT, 0.0)
    assert summary.status == "diverged" and "m.1.0.b" in summary.message


def test_a_budget_denial_stops_the_measurement_as_budget_limited() -> None:
    plan = MeasurePlan(make_request(sequential=False), make_settings(8), lanes=2, budgeted=True)
    driver = run_plan(plan, deny={"m.3.0.b"})
    summary = plan.summary(OUTPUT, 0.0)
    assert summary.status == "budget_limited" and summary.units_not_run > 0
    by_id = {u.unit_id: u for u in plan.units}
    assert by_id["m.3.0.b"].note == "budget" and by_id["m.3.0.b"].status == "not_run"
    stops = kinds(driver, StopUnit)
    assert len(stops) == 1 and "m.3.0.b" in stops[0].unit_ids
    assert all(u.done for u in plan.units)


def test_a_judge_the_budget_denies_stops_the_measurement_and_keeps_its_replay() -> None:
    """A judge that may spend is reserved like a replay: denied, the measurement ends
    budget-limited, the unit is cancelled (not counted; its journaled replay lets a resume
    judge it), and no unit starts after the denial."""
    plan = MeasurePlan(
        make_request(sequential=False), make_settings(8), lanes=2, budgeted=True, journaled=True
    )
    driver = Driver(plan, {u.unit_id: Outcome() for u in plan.units}, deny_judge={"m.2.0.b"})
    driver.run(random.Random(3))
    summary = plan.summary(OUTPUT, 0.0)
    denied = plan.unit("m.2.0.b")
    assert summary.status == "budget_limited"
    assert denied.status == "cancelled" and denied.note == "budget"
    replays = [a for a in driver.log if isinstance(a, JournalReplay)]
    assert any(a.unit_id == "m.2.0.b" for a in replays)  # its replay is on record
    at = next(i for i, a in enumerate(driver.log) if isinstance(a, StopUnit))
    assert not any(isinstance(a, StartReplay) for a in driver.log[at:])


def test_a_replay_that_cannot_spawn_is_one_shared_failure() -> None:
    plan = MeasurePlan(make_request(), make_settings(16), lanes=4, journaled=True)
    driver = Driver(plan, {u.unit_id: Outcome() for u in plan.units})
    driver.take(plan.start())
    first = driver.pending.pop(0)
    assert isinstance(first, StartReplay)
    failure = FailureEvent(
        owner="infrastructure", stage="replay", code="spawn_failed", message="no-such-agent"
    )
    broken = ReplayResult(
        unit_id=first.unit_id,
        case_id=first.job.case_id,
        arm="baseline",
        repetition=0,
        status="failed",
        failure=failure,
    )
    after = plan.handle(UnitReplayed(first.unit_id, broken))
    driver.take(after)
    assert not any(isinstance(a, StartReplay) for a in after)  # no further unit starts
    while driver.pending:
        driver.answer(0)
    summary = plan.summary(OUTPUT, 0.0)
    assert summary.status == "shared_failure" and "no-such-agent" in summary.message
    assert len(kinds(driver, StartReplay)) == 4
    assert summary.units_blocked == 4 and summary.units_not_run == 32 - 8


@pytest.mark.parametrize("stage", ["replay", "judge"])
def test_a_host_failure_beyond_an_early_stops_cutoff_fails_nothing(stage: str) -> None:
    # Found by review: a judge the host refused a process, stopped by the run while it
    # waited to try again (beyond the cutoff), came back with code host_refused: the
    # measurement early stop had decided ended shared_failure, and its run failed (a
    # replay so refused as its stop came did the same).
    plan = MeasurePlan(make_request(), make_settings(40), lanes=8, journaled=True)
    outcomes = {u.unit_id: Outcome(score=1.0 if u.arm == "candidate" else 0.0) for u in plan.units}
    driver = Driver(plan, outcomes, checking=False)  # what is held is in flight too
    driver.take(plan.start())
    held: list[Any] = []
    kind = StartReplay if stage == "replay" else StartJudge
    while driver.pending and plan.early is None:
        action = driver.pending[0]
        late = isinstance(action, kind) and plan.unit(action.unit_id).case_index >= 20
        if late and len(held) < 2:
            held.append(driver.pending.pop(0))  # still running as the decision comes
            continue
        driver.answer(0)
    assert plan.cutoff == 20 and held and all(a.unit_id in driver.stopped for a in held)
    said = "the host refused a process"
    failure = FailureEvent(owner="infrastructure", stage=stage, code=HOST_REFUSED, message=said)
    for action in held:
        if stage == "judge":
            judged = JudgeResult(
                unit_id=action.unit_id, status="cancelled", source="command", failure=failure
            )
            driver.take(plan.handle(UnitJudged(action.unit_id, judged)))
            continue
        job = action.job
        refused = replay_result(job, Outcome(replay="failed")).model_copy(
            update={"failure": failure}
        )
        driver.take(plan.handle(UnitReplayed(job.unit_id, refused)))
    while driver.pending:
        driver.answer(0)
    summary = plan.summary(OUTPUT, 0.0)
    assert (summary.status, summary.gate.decision) == ("early_stopped", "accept"), summary.message


def test_a_unit_an_early_stop_cuts_between_its_replay_and_its_judge_is_journaled() -> None:
    """Replayed and charged or journaled as its measurement stops early, its judge never
    started: journaled ``cancelled`` with its replay, as a judge the stop cut is (found by
    audit: after a resume the replay record stood alone, a reader saw no outcome)."""
    plan = MeasurePlan(make_request(), make_settings(40), lanes=8, budgeted=True, journaled=True)
    outcomes = {u.unit_id: Outcome(score=1.0 if u.arm == "candidate" else 0.0) for u in plan.units}
    driver = Driver(plan, outcomes, checking=False)  # what is held is in flight too
    driver.take(plan.start())
    held: list[Any] = []
    while driver.pending and plan.early is None:
        action = driver.pending[0]
        late = plan.unit(action.unit_id).case_index >= 20
        if isinstance(action, (ChargeUnit, JournalReplay)) and late and len(held) < 2:
            held.append(driver.pending.pop(0))  # replayed, not yet judged, as the stop comes
            continue
        driver.answer(0)
    assert plan.cutoff == 20 and {type(a) for a in held} == {ChargeUnit}
    driver.pending[:0] = held
    while driver.pending:
        driver.answer(0)
    driver.check()
    records = {a.unit_id: a.record for a in kinds(driver, JournalUnit)}
    for action in held:
        record = records[action.unit_id]
        assert (record.status, record.replay.status, record.judge.status) == (
            "cancelled",
            "succeeded",
            "cancelled",
        )
        assert plan.unit(action.unit_id).note == "early_stop"
    summary = plan.summary(OUTPUT, 0.0)
    assert (summary.status, summary.gate.decision) == ("early_stopped", "accept")
    assert summary.units_cancelled == sum(r.status == "cancelled" for r in records.values())


@pytest.mark.parametrize("cut", [False, True])
@pytest.mark.parametrize("stop", ["early_stop", "cancelled"])
def test_a_stored_replay_a_stop_comes_before_is_journaled_cancelled(stop: str, cut: bool) -> None:
    """A resumed run's replays journaled unjudged before the interruption (charged as it
    resumed) whose units its stop (an early stop, a cancel) comes before: each ends
    ``cancelled`` with its replay, journaled, as a judge the stop cut is (found by review:
    they ended ``not_run``, a charged replay in the journal with no outcome). A baseline
    (its lane taken, or waiting for one), a candidate whose control was not run, one whose
    control is such a baseline. ``cut``: its session's stop had cut its judge, journaled
    ``cancelled`` then: so it ends again, not journaled twice (found by the decision audit)."""
    fresh = MeasurePlan(make_request(), make_settings(40), lanes=2, journaled=True)
    last = {(u.case_index, u.arm): u.unit_id for u in fresh.units if u.case_index >= 38}
    stored = [last[38, "baseline"], last[38, "candidate"], last[39, "candidate"]]
    plan = resumed(fresh, stored, stored if cut else [], budgeted=True, journaled=True)
    outcomes = {u.unit_id: Outcome(score=1.0 if u.arm == "candidate" else 0.0) for u in plan.units}
    driver = Driver(plan, outcomes)
    driver.take(plan.start())
    if stop == "cancelled":
        driver.take(plan.handle(StopRequested("cancelled", "the run is stopping")))
    while driver.pending:
        driver.answer(0)
    driver.check()  # among the rules: every stored replay has its unit's record
    assert plan.cutoff is None if stop == "cancelled" else plan.cutoff <= 38
    records = {a.unit_id: a.record for a in kinds(driver, JournalUnit)}
    assert not cut or not set(records) & set(stored)  # journaled by its session already
    records = {**plan.settings.restored, **records}
    for unit_id in stored:
        record, unit = records[unit_id], plan.unit(unit_id)
        outcome = (record.status, record.replay.status, record.judge.status)
        assert outcome == ("cancelled", "succeeded", "cancelled") == (unit.status, *outcome[1:])
        assert unit.restored and record.replay == plan.settings.restored_replays[unit_id].replay
    assert plan.unit(stored[0]).note == stop  # the other two: their control's status
    begun = kinds(driver, StartReplay) + kinds(driver, StartJudge) + kinds(driver, ChargeUnit)
    assert not {a.unit_id for a in begun} & set(stored)  # nothing run nor charged again
    summary = plan.summary(OUTPUT, 0.0)
    assert summary.status == ("early_stopped" if stop == "early_stop" else "cancelled")
    assert summary.units_restored == len(stored)
    assert summary.units_cancelled == sum(r.status == "cancelled" for r in records.values())


def test_a_cancelled_measurement_starts_nothing_more_and_ends() -> None:
    plan = MeasurePlan(make_request(), make_settings(10), lanes=3)
    driver = Driver(plan, {u.unit_id: Outcome() for u in plan.units})
    driver.take(plan.start())
    driver.answer(0)
    waiting = {u.unit_id for u in plan.units if not u.done}
    driver.take(plan.handle(StopRequested("cancelled", "the measurement was cancelled")))
    (stop,) = [a for a in driver.log if isinstance(a, StopUnit)]
    assert set(stop.unit_ids) == waiting
    started = len(kinds(driver, StartReplay))
    while driver.pending:
        driver.answer(0)
    assert len(kinds(driver, StartReplay)) == started
    summary = plan.summary(OUTPUT, 0.0)
    assert summary.status == "cancelled" and summary.units_cancelled == started  # all stopped
    assert {u.note for u in plan.units if u.status == "not_run" and u.arm == "baseline"} == {
        "cancelled"
    }


def test_events_out_of_turn_are_refused() -> None:
    plan = MeasurePlan(make_request(), make_settings(2), lanes=1)
    plan.start()
    with pytest.raises(ValueError, match="not judging"):
        plan.handle(UnitJudged("m.0.0.b", judge_result("m.0.0.b", Outcome())))
    with pytest.raises(ValueError, match="unknown"):
        plan.handle(UnitCharged("nope"))
    with pytest.raises(RuntimeError, match="did not end"):
        plan.summary(OUTPUT, 0.0)


def test_early_stop_bookkeeping_stays_linear_in_the_cases() -> None:
    """Each ended unit costs O(1) amortised: a case's delta is taken once (counted here)."""
    from evolane.measure import _prefix

    calls = 0
    original = _prefix._case_delta

    def counting(units: list) -> float | None:  # type: ignore[type-arg]
        nonlocal calls
        calls += 1
        return original(units)

    _prefix._case_delta = counting  # type: ignore[assignment]
    try:
        plan = MeasurePlan(make_request(min_cases=400), make_settings(400), lanes=8)
        driver = Driver(plan, {u.unit_id: Outcome() for u in plan.units}, checking=False)
        driver.run(random.Random(0))
    finally:
        _prefix._case_delta = original  # type: ignore[assignment]
    assert calls == 400


def test_a_baseline_measured_alone_is_measured_whole() -> None:
    """No candidate, no delta: early stop has nothing to decide, so no case is skipped (a
    coverage rule fed only incomparable cases would stop it at once)."""
    request = make_request(sequential=True).model_copy(update={"candidate_ref": None})
    plan = MeasurePlan(request, make_settings(12), lanes=3)
    driver = run_plan(plan)
    assert len(kinds(driver, StartReplay)) == 12
    summary = plan.summary(OUTPUT, 0.0)
    assert summary.status == "complete" and summary.units_not_run == 0


def test_a_split_is_read_in_the_seeded_order_and_units_keep_their_dataset_numbers() -> None:
    from evolane.stats import case_order

    ids = [f"c{i}" for i in range(10)]
    plan = MeasurePlan(make_request(sequential=False), make_settings(10, seed=7), lanes=2)
    assert plan.case_ids == case_order(ids, 7) != ids
    for unit in plan.units:
        number = ids.index(unit.case_id)
        assert unit.unit_id.split(".")[1] == str(number) and unit.case_number == number
        assert plan.case_ids[unit.case_index] == unit.case_id


def test_a_stop_before_the_start_runs_no_unit_and_ends() -> None:
    plan = MeasurePlan(make_request(), make_settings(6), lanes=3)
    first = plan.handle(StopRequested("cancelled", "stopped before it was served"))
    actions = [*first, *plan.start()]
    assert not any(isinstance(a, StartReplay) for a in actions)
    assert plan.finished and any(isinstance(a, Finish) for a in actions)
    summary = plan.summary(OUTPUT, 0.0)
    assert summary.status == "cancelled" and summary.units_not_run == len(plan.units)
    assert summary.units_run == 0  # a treatment blocked by its control never ran


def test_a_replay_that_ends_as_the_stop_comes_is_kept_but_not_judged() -> None:
    plan = MeasurePlan(make_request(), make_settings(4), lanes=2)
    driver = Driver(plan, {u.unit_id: Outcome() for u in plan.units})
    driver.take(plan.start())
    in_flight = [a for a in driver.pending if isinstance(a, StartReplay)]
    driver.take(plan.handle(StopRequested("cancelled", "the run is stopping")))
    for action in in_flight:  # each replay had already exited: it comes back succeeded
        driver.pending.remove(action)
        job = action.job
        driver.take(plan.handle(UnitReplayed(job.unit_id, replay_result(job, Outcome()))))
    while driver.pending:
        driver.answer(0)
    assert not kinds(driver, StartJudge)
    assert {plan.unit(a.unit_id).status for a in in_flight} == {"cancelled"}
    summary = plan.summary(OUTPUT, 0.0)
    assert summary.units_run == len(in_flight)  # replayed (and kept), then stopped
    assert summary.units_not_run + summary.units_blocked == len(plan.units) - len(in_flight)


@FAST
@given(shapes, st.booleans(), st.booleans())
def test_the_layout_finds_every_unit_and_its_treatments_without_a_map(
    shape: dict[str, Any], paired: bool, named: bool
) -> None:
    """Ids are built when asked for and found back by arithmetic: every unit's id leads to
    it, every control to exactly the candidates that wait on it, and ids of no unit (another
    measurement, another spelling, a case or repetition beyond the plan) to none."""
    request = make_request(reps=shape["reps"])
    cases = min(shape["cases"], 8) if named else shape["cases"]
    update: dict[str, Any] = {} if paired else {"candidate_ref": None}
    if named:  # screening: a few cases named out of file order
        update["case_ids"] = tuple(f"c{i}" for i in reversed(range(cases)))
    plan = MeasurePlan(request.model_copy(update=update), make_settings(cases), lanes=2)
    # Plan order by a plain loop: (case place, repetition, candidate, its control's index).
    expected: list[tuple[int, int, bool, int | None]] = []
    baseline_at: dict[tuple[int, int], int] = {}
    for rep in range(max(plan.reps)):
        for place in range(len(plan.case_ids)):
            if rep < plan.reps[0]:
                baseline_at[(place, rep)] = len(expected)
                expected.append((place, rep, False, None))
            if paired and rep < plan.reps[1]:
                control = baseline_at[(place, min(rep, plan.reps[0] - 1))]
                expected.append((place, rep, True, control))
    assert len(plan.units) == len(expected)
    for unit, (place, rep, candidate, control) in zip(plan.units, expected, strict=True):
        assert (unit.case_index, unit.repetition, unit.arm) == (
            place,
            rep,
            "candidate" if candidate else "baseline",
        )
        assert unit.case_id == plan.case_ids[place]
        assert unit.tree_ref == (request.candidate_ref if candidate else request.baseline_ref)
        depends_on = unit.depends_on
        assert (None if depends_on is None else depends_on.index) == control
        assert plan.unit(unit.unit_id) == unit
        waiting = [index for index, row in enumerate(expected) if row[3] == unit.index]
        assert list(plan.layout.dependents(unit.index)) == waiting
    reps = max(plan.reps)
    for wrong in ("x.0.0.b", "m.0.0.x", "m.0.b", f"m.{cases}.0.b", f"m.0.{reps}.b", "m.00.0.b"):
        with pytest.raises(KeyError):
            plan.unit(wrong)
    if not paired:
        with pytest.raises(KeyError):
            plan.unit("m.0.0.c")


def test_a_request_naming_a_case_twice_is_refused() -> None:
    """Two units under one id would each take the other's answers."""
    with pytest.raises(ValueError, match="must name each case once"):
        make_request().model_copy(update={"case_ids": ("c1", "c2", "c1")})


def test_clustered_cases_stop_early_by_whole_clusters() -> None:
    """Clustered cases (the turns of one session) are read session by session, and early
    stop reads whole sessions: it stops at a session's end, counting sessions; the gate on
    the cases read judges sessions."""
    sessions = {f"c{i}": f"session-{i // 4}" for i in range(40)}  # 10 sessions of 4 turns
    plan = MeasurePlan(make_request(), make_settings(40, clusters=sessions), lanes=2)
    outcomes = {u.unit_id: Outcome(score=1.0 if u.arm == "candidate" else 0.0) for u in plan.units}
    run_plan(plan, outcomes)
    summary = plan.summary(ref(9), 0.0)
    assert summary.status == "early_stopped" and summary.gate.decision == "accept"
    assert plan.cutoff is not None and plan.cutoff < 40 and plan.cutoff % 4 == 0
    read = plan.case_ids[: plan.cutoff]
    assert all(sum(sessions[c] == sessions[case] for c in read) == 4 for case in read)
    assert summary.gate.reason.startswith(f"early stop after {plan.cutoff // 4} of 10 clusters")
    gate = decision(plan.units, 40, plan.request.gate, plan.cutoff, None, sessions)
    assert gate.reason.startswith(f"by cluster ({plan.cutoff // 4} of {plan.cutoff // 4}")
