"""The view's series (`History`): bounded, continuous across sessions, lanes summed over
concurrent measurements, spend at each decision. Pure: events in, series out."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from evolane import messages
from evolane.views import MAX_POINTS, Series, ViewState


def started(t: float = 0.0, population: int = 2) -> messages.RunStarted:
    return messages.RunStarted(
        run_id="r",
        t=t,
        campaign_id="c",
        cycle=0,
        iterations=3,
        population=population,
        replay_lanes=4,
        judge_lanes=2,
    )


def measured(
    mid: str, t: float, lanes: int, judges: int, done: bool = False
) -> messages.MeasureEvent:
    return messages.MeasureEvent(
        run_id="r",
        t=t,
        measurement_id=mid,
        pairs_done=0,
        pairs_planned=4,
        lanes_busy=lanes,
        judges_busy=judges,
        finished=done,
    )


def budget(t: float, tokens: float) -> messages.BudgetUpdate:
    usage = messages.Usage(tokens=tokens)
    return messages.BudgetUpdate(
        run_id="r",
        t=t,
        spent=usage,
        reserved=messages.Usage(),
        ceilings=messages.Usage(),
        by_role={"replay": usage},
    )


def test_a_series_keeps_its_shape_within_its_bound() -> None:
    series: Series[int] = Series()
    for value in range(10 * MAX_POINTS + 7):
        series.add(value)
    assert MAX_POINTS // 2 <= len(series.points) <= MAX_POINTS
    assert series.points == sorted(series.points) and series.points[0] == 0
    assert series.points[-1] == series.newest == 10 * MAX_POINTS + 6  # the newest end kept


def test_lanes_are_summed_over_concurrent_measurements() -> None:
    state = ViewState()
    for event in (
        started(),
        measured("a", 1.0, 3, 1),
        measured("b", 2.0, 2, 4),
        measured("a", 3.0, 0, 0, done=True),
    ):
        state.fold(event)
    lanes = [(p.clock, p.replay, p.judge) for p in state.history.lanes.points]
    assert lanes == [(1.0, 3, 1), (2.0, 5, 5), (3.0, 2, 4)]


def test_proposals_awaited_count_down_as_slots_report() -> None:
    state = ViewState()
    state.fold(started(population=3))
    state.fold(messages.PhaseEvent(run_id="r", t=1.0, phase="optimize", iteration=0))
    for slot in (0, 1):
        state.fold(
            messages.SlotEvent(run_id="r", t=2.0 + slot, iteration=0, slot=slot, stage="generated")
        )
    state.fold(messages.SlotEvent(run_id="r", t=4.0, iteration=0, slot=0, stage="local_gates"))
    assert [p.optimizer for p in state.history.lanes.points] == [3, 2, 1]


def test_a_resumed_run_continues_the_clock() -> None:
    state = ViewState()
    state.fold(started())
    state.fold(budget(10.0, 5.0))
    state.fold(started(t=0.0))  # the second session counts from its own start
    state.fold(budget(4.0, 7.0))
    clocks = [p.clock for p in state.history.spend.points]
    assert clocks == [10.0, 14.0] and state.history.sessions == 2


def test_each_decision_keeps_the_spend_of_its_moment() -> None:
    state = ViewState()
    state.fold(started())
    state.fold(budget(1.0, 100.0))
    decision = messages.DecisionEvent(
        run_id="r", t=2.0, iteration=0, slot=1, digest="sha256:x", decision="accept", reason="ok"
    )
    state.fold(decision)
    state.fold(budget(3.0, 250.0))
    (point,) = state.history.decisions
    assert point.clock == 2.0 and point.spent is not None and point.spent.tokens == 100.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(0, 1e6)), max_size=60))
def test_the_run_clock_never_goes_back(steps: list[tuple[bool, float]]) -> None:
    state = ViewState()
    last = 0.0
    for restart, t in steps:
        state.fold(started(t=t) if restart else budget(t, 1.0))
        assert state.history.clock >= last
        last = state.history.clock
    clocks = [p.clock for p in state.history.spend.points]
    assert clocks == sorted(clocks)
