"""The progress renderers: state folding, plain and JSON lines, the live view, lossy observers."""

from __future__ import annotations

import io
import re
import threading
from functools import partial
from typing import Any

import orjson
import pytest
import trio
from rich.console import Console

import evolane.cli._render as renderer
from evolane.cli._render import render_progress, render_view, resolve_mode
from evolane.measure._progress import ProgressBus
from evolane.messages import (
    EVENT_TYPES,
    BudgetUpdate,
    DecisionEvent,
    EstimateEvent,
    MeasureEvent,
    PhaseEvent,
    ProgressEvent,
    RunFinished,
    RunStarted,
    SlotEvent,
    Usage,
    WarningEvent,
)
from evolane.views import ViewState

PARENT = "sha256:" + "ab12" * 16
CAND = "sha256:" + "cd34" * 16
BEST = "sha256:" + "ef56" * 16
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def script() -> list[ProgressEvent]:
    """A small run: start, estimate, one iteration with two slots, a decision, the end."""
    return [
        RunStarted(
            run_id="-",
            campaign_id="camp-1",
            cycle=0,
            iterations=8,
            population=2,
            replay_lanes=4,
            judge_lanes=2,
            isolation="namespace",
        ),
        EstimateEvent(
            run_id="-",
            replays_max=320,
            judge_calls_max=64,
            optimizer_calls_max=16,
            wall_low_seconds=120,
            wall_high_seconds=300,
            wall_worst_seconds=900,
            judge_retries_max=128,
            cost_usd=3.2,
        ),
        PhaseEvent(run_id="-", phase="baseline", iteration=0, parent=PARENT),
        PhaseEvent(run_id="-", phase="optimize", iteration=1, parent=PARENT, convergence="ok"),
        SlotEvent(run_id="-", iteration=1, slot=0, stage="generated"),
        SlotEvent(run_id="-", iteration=1, slot=0, stage="screening", digest=CAND),
        MeasureEvent(
            run_id="-",
            measurement_id="c0.i1.s0",
            pairs_done=12,
            pairs_planned=40,
            lanes_busy=3,
            mean_delta=0.0123,
            se=0.004,
        ),
        SlotEvent(
            run_id="-", iteration=1, slot=1, stage="blocked", reason="touched a protected path"
        ),
        BudgetUpdate(
            run_id="-",
            spent=Usage(tokens=500_000, cost_usd=1.0),
            reserved=Usage(tokens=100_000),
            ceilings=Usage(tokens=1_000_000, cost_usd=5.0),
        ),
        WarningEvent(run_id="-", message="judge lane 2 failed: exit 1"),
        MeasureEvent(
            run_id="-",
            measurement_id="c0.i1.s0",
            pairs_done=40,
            pairs_planned=40,
            mean_delta=-0.02,
            se=0.01,
            finished=True,
            decision="reject",
        ),
        DecisionEvent(
            run_id="-",
            iteration=1,
            slot=0,
            digest=CAND,
            decision="reject",
            reason="mean_delta -0.02 < k*SE (1.00 x 0.01 = 0.01): rejected",
            mean_delta=-0.02,
            ci_low=-0.04,
            ci_high=0.001,
            summary="Retry the fetch step on timeouts",
            gate="paired",
            se=0.01,
            k_se=1.0,
            min_effect=0.0,
            n=40,
            n_planned=40,
            fixed=1,
            broken=2,
        ),
        SlotEvent(run_id="-", iteration=1, slot=0, stage="rejected", digest=CAND, reason="worse"),
        PhaseEvent(run_id="-", phase="finalize"),
        RunFinished(
            run_id="-",
            status="finished",
            campaign_status="improving",
            best=BEST,
            baseline_val=0.61,
            best_val=0.72,
            report="runs/r-1/report.json",
        ),
    ]


def stamped(events: list[ProgressEvent]) -> list[ProgressEvent]:
    """The events as the bus stamps them (run id, sequence, time)."""
    bus = ProgressBus(None, "r-1")
    return [bus.publish(event) for event in events]


async def run_script(
    mode: str, events: list[ProgressEvent], **kwargs: Any
) -> tuple[ViewState, list[ProgressEvent]]:
    """Publish ``events`` through a bus to a running renderer; return its state and the events."""
    bus = ProgressBus(None, "r-1")
    receive, subscription = bus.subscribe(256)
    result: list[ViewState] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def render() -> None:
                result.append(await render_progress(mode, receive, subscription, **kwargs))  # type: ignore[arg-type]

            nursery.start_soon(render)
            published = []
            for event in events:
                published.append(bus.publish(event))
                await trio.sleep(0)
            bus.close()
    return result[0], published


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class _BrokenPipe(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        raise BrokenPipeError(32, "Broken pipe")


def test_resolve_mode() -> None:
    assert resolve_mode("auto", _Tty()) == "rich"
    assert resolve_mode("auto", io.StringIO()) == "plain"
    for mode in ("rich", "plain", "jsonl", "none"):
        assert resolve_mode(mode, io.StringIO()) == mode
    with pytest.raises(ValueError, match="unknown progress mode"):
        resolve_mode("fancy", io.StringIO())


def test_fold_takes_every_kind() -> None:
    state = ViewState()
    events = stamped(script())
    for event in events[:8]:
        state.fold(event)
    assert (state.run_id, state.campaign_id, state.iterations, state.population) == (
        "r-1",
        "camp-1",
        8,
        2,
    )
    assert (state.replay_lanes, state.judge_lanes, state.isolation) == (4, 2, "namespace")
    assert state.estimate is not None and state.estimate.replays_max == 320
    assert (state.phase, state.iteration, state.parent, state.convergence) == (
        "optimize",
        1,
        PARENT,
        "ok",
    )
    assert {n: s.stage for n, s in state.slots.items()} == {0: "screening", 1: "blocked"}
    assert state.funnel == {"blocked": 1}
    assert list(state.measures) == ["c0.i1.s0"] and state.lanes_busy == 3
    for event in events[8:13]:
        state.fold(event)
    assert state.budget is not None and state.budget.ceilings.tokens == 1_000_000
    assert [w.message for w in state.warnings] == ["judge lane 2 failed: exit 1"]
    assert state.warning_count == 1
    assert state.measures == {} and state.lanes_busy == 0  # the measurement finished
    assert state.last_measure is not None and state.last_measure.decision == "reject"
    assert [(d.slot, d.decision) for d in state.decisions] == [(0, "reject")]
    assert state.funnel == {"blocked": 1, "rejected": 1}
    state.fold(events[12])  # the same terminal event again is not counted twice
    assert state.funnel == {"blocked": 1, "rejected": 1}
    for event in events[13:]:
        state.fold(event)
    assert state.phase == "finalize" and state.iteration == 1  # finalize carries no iteration
    assert state.finished is not None and state.finished.best == BEST
    assert state.events == len(events) + 1 and state.missed == 0
    assert state.t == events[-1].t


def test_fold_starts_a_fresh_slot_table_each_iteration() -> None:
    state = ViewState()
    for event in stamped(
        [
            SlotEvent(run_id="-", iteration=0, slot=0, stage="selected"),
            SlotEvent(run_id="-", iteration=0, slot=1, stage="rejected"),
            PhaseEvent(run_id="-", phase="optimize", iteration=1),
            SlotEvent(run_id="-", iteration=1, slot=1, stage="generated"),
        ]
    ):
        state.fold(event)
    assert state.slot_iteration == 1 and list(state.slots) == [1]
    assert state.funnel == {"selected": 1, "rejected": 1}  # the run's funnel is kept


def test_fold_counts_gaps_and_keeps_the_last_decisions() -> None:
    state = ViewState()
    decisions = [
        DecisionEvent(
            run_id="r", seq=seq, iteration=0, slot=seq, digest=CAND, decision="reject", reason=""
        )
        for seq in (1, 2, 5, 6, 7, 8, 10)
    ]
    for event in decisions:
        state.fold(event)
    assert state.missed == 3  # 3, 4 and 9 never arrived
    assert [d.slot for d in state.decisions] == [5, 6, 7, 8, 10]


def test_eta_from_the_shape_and_progress() -> None:
    state = ViewState()
    events = stamped(script())
    state.fold(events[0])
    assert state.fraction_done() is None and state.eta(10.0) is None  # "?" until progress
    state.fold(events[2])  # baseline before iteration 0: still nothing done
    assert state.eta(10.0) is None
    for event in events[3:8]:
        state.fold(event)
    # iteration 1 of 8 done; of its 2 slots one ended (blocked), one is 12/40 measured
    fraction = (1 + (1 + 12 / 40) / 2) / 8
    assert state.fraction_done() == pytest.approx(fraction)
    assert state.eta(35.0) == pytest.approx(35.0 / fraction - 35.0)
    assert state.eta() == pytest.approx(state.t / fraction - state.t)
    state.fold(events[-2])
    assert state.eta(40.0) is None  # finalizing: no share of the search to scale by
    state.fold(events[-1])
    assert state.fraction_done() == 1.0 and state.eta(50.0) == 0.0


async def test_plain_prints_one_line_per_significant_event() -> None:
    out = io.StringIO()
    state, _ = await run_script("plain", script(), out=out)
    lines = out.getvalue().splitlines()
    assert all(re.match(r"^\[ *\d+\.\ds\] ", line) for line in lines), lines
    assert [line.split("] ", 1)[1] for line in lines] == [
        "run r-1  campaign camp-1, cycle 0  8 iterations x 2 candidates",
        "    4 replay lanes, 2 judge lanes  commands in own namespaces",
        "estimate: at most 320 replays, 64 judge calls, 16 optimizer calls",
        "    + up to 128 judge retries  wall 2m00s..5m00s  worst case 15m00s",
        "    ~$3.20",
        "iteration 2/8 (i1)  parent sha256:ab12ab12…ab12  convergence ok",
        "slot i1.s1 blocked  touched a protected path",
        "warning: judge lane 2 failed: exit 1",
        "decision i1.s0 reject  delta -0.0200 <= 1.0 x SE 0.0100",
        "    fixed 1, broken 2  edit: Retry the fetch step on timeouts",
        "slot i1.s0 rejected  sha256:cd34cd34…cd34",  # the decision said why
        "finalize (cycle 0)",
        "finished: finished (campaign improving)  best sha256:ef56ef56…ef56",
        "    val 0.610 -> 0.720  report runs/r-1/report.json",
    ]
    assert max(len(line) for line in lines) <= 80
    assert state.events == len(script()) and state.finished is not None


async def test_jsonl_lines_parse_back_to_the_events() -> None:
    out = io.StringIO()
    state, published = await run_script("jsonl", script(), out=out)
    by_kind = {cls.model_fields["kind"].default: cls for cls in EVENT_TYPES}
    parsed = []
    for line in out.getvalue().splitlines():
        raw = orjson.loads(line)
        parsed.append(by_kind[raw["kind"]].model_validate(raw))
    assert parsed == published
    assert state.events == len(published)


@pytest.mark.parametrize("mode", ["plain", "jsonl"])
async def test_a_broken_pipe_stops_output_but_not_the_draining(mode: str) -> None:
    out = _BrokenPipe()
    state, published = await run_script(mode, script(), out=out)
    assert out.writes == 1  # gave up after the first failed write
    assert state.events == len(published) and state.finished is not None


async def test_a_broken_terminal_ends_the_live_view_quietly() -> None:
    console = Console(file=_BrokenPipe(), force_terminal=True, width=120)
    state, published = await run_script("rich", script(), console=console)
    assert state.events == len(published) and state.finished is not None


def _drawn(console: Console) -> str:
    return ANSI.sub("", console.file.getvalue())  # type: ignore[attr-defined]


async def _shown(console: Console, texts: tuple[str, ...]) -> str:
    """The console's text once every one of ``texts`` was drawn (or after 10 s, to assert on)."""
    with trio.move_on_after(10):
        while not all(text in _drawn(console) for text in texts):
            await trio.sleep(0.05)
    return _drawn(console)


EARLY = (
    "lanes 3/4 busy",
    "screening",
    "c0.i1.s0  ██████░░░░░░░░░░░░░░ 30%  12/40 pairs  Δ +0.0123 ± 0.0040 (SE)",
)
MIDDLE = (
    "phase optimize",
    "iteration 2/8 (i1)",
    "convergence ok",
    "lanes 0/4 busy",
    "i1.s0",
    "i1.s1",
    "blocked",
    "touched a protected path",
    "c0.i1.s0  ████████████████████ 100%  40/40 pairs  Δ -0.0200 ± 0.0100 (SE)  → reject",
    "tokens",
    "██████████▒▒░░░░░░░░ 50%",  # spent 50% and reserved 10% of the token ceiling
    "████░░░░░░░░░░░░░░░░ 20%",  # cost
    "$5.00",
    "last decisions",
    "i1.s0 reject  delta -0.0200 <= 1.0 x SE 0.0100  fixed 1, broken 2",
    "edit: Retry the fetch step on timeouts",
    "judge lane 2 failed",
)


async def test_rich_live_view_shows_the_run() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    events = script()
    bus = ProgressBus(None, "r-1")
    receive, subscription = bus.subscribe(256)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(render_progress, "rich", receive, subscription, console=console)
            )
            for event in events[:8]:
                bus.publish(event)
            early = await _shown(console, EARLY)  # drawn while a measurement runs
            for event in events[8:12]:
                bus.publish(event)
            middle = await _shown(console, MIDDLE)
            for event in events[12:]:
                bus.publish(event)
            bus.close()
    for text in EARLY:
        assert text in early, text
    for text in MIDDLE:
        assert text in middle, text
    assert re.search(r"ETA (\d|\?)", middle)
    final = _drawn(console)
    assert "finished: finished (campaign improving)" in final
    assert "phase finalize" in final and "ETA done" in final


def test_the_view_shows_dropped_events_and_lists_at_most_a_dozen_slots() -> None:
    state = ViewState()
    for event in stamped(
        [SlotEvent(run_id="-", iteration=0, slot=n, stage="generated") for n in range(20)]
    ):
        state.fold(event)
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    console.print(render_view(state, 3.0, dropped=7))
    text = ANSI.sub("", console.file.getvalue())  # type: ignore[attr-defined]
    assert "dropped 7 events" in text
    assert "i0.s11" in text and "i0.s12" not in text and "8 more" in text
    assert "ETA ?" in text


@pytest.mark.parametrize("mode", ["rich", "plain", "jsonl", "none"])
async def test_a_slow_observer_loses_counted_events_and_never_blocks_the_publisher(
    mode: str,
) -> None:
    flood = 100_000 if mode == "rich" else 20_000
    bus = ProgressBus(None, "r-1")
    receive, subscription = bus.subscribe(64)
    out = io.StringIO()
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    event = MeasureEvent(run_id="-", measurement_id="m", pairs_done=1, pairs_planned=9)
    result: list[ViewState] = []

    async def render() -> None:
        result.append(
            await render_progress(mode, receive, subscription, console=console, out=out)  # type: ignore[arg-type]
        )

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(render)
            for n in range(flood):
                bus.publish(event)  # synchronous: it cannot wait for the observer
                if n % 1000 == 0:
                    await trio.sleep(0)
            while receive.statistics().current_buffer_used:
                await trio.sleep(0.01)
            bus.publish(RunFinished(run_id="-", status="finished", campaign_status="done"))
            bus.close()
    state = result[0]
    published = flood + 1
    assert subscription.dropped > 0
    assert state.events + subscription.dropped == published
    assert state.missed == subscription.dropped  # the gaps in `seq` tell the same loss
    assert state.finished is not None
    if mode == "jsonl":
        assert len(out.getvalue().splitlines()) == state.events
    if mode == "plain":  # each batch says how many were lost since the last one
        losses = re.findall(r"progress view dropped (\d+) events", out.getvalue())
        assert sum(int(n) for n in losses) == subscription.dropped


async def test_the_live_view_refreshes_at_least_twice_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Real time: the view writes from a worker thread, which a MockClock would jump over.
    renders: list[float] = []
    real = renderer.render_view

    def counted(state: ViewState, elapsed: float, dropped: int = 0) -> Any:
        renders.append(trio.current_time())
        return real(state, elapsed, dropped)

    monkeypatch.setattr(renderer, "render_view", counted)
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    bus = ProgressBus(None, "r-1")
    receive, subscription = bus.subscribe(64)
    start = trio.current_time()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(render_progress, "rich", receive, subscription, console=console)
            )
            bus.publish(script()[0])
            await trio.sleep(1.5)  # no events at all: the view still redraws (elapsed, ETA)
            bus.close()
    during = [t for t in renders if t - start <= 1.5]
    assert len(during) >= 3  # 6 expected at 4 per second; loose for a loaded machine
    frames = ANSI.sub("", console.file.getvalue()).count("elapsed ")  # type: ignore[attr-defined]
    assert frames >= len(renders)  # each render reached the terminal


class _Stalled(io.StringIO):
    """A stream whose writes hang until released, like a terminal paused with Ctrl-S."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.gate = threading.Event(), threading.Event()

    def write(self, text: str) -> int:
        self.entered.set()
        self.gate.wait(20)
        return super().write(text)


@pytest.mark.parametrize("mode", ["rich", "plain", "jsonl"])
async def test_a_stalled_terminal_does_not_stall_the_run(mode: str) -> None:
    stream = _Stalled()
    console = Console(file=stream, force_terminal=True, width=120)
    bus = ProgressBus(None, "r-1")
    receive, subscription = bus.subscribe(64)
    result: list[ViewState] = []

    async def render() -> None:
        result.append(
            await render_progress(mode, receive, subscription, console=console, out=stream)  # type: ignore[arg-type]
        )

    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(render)
                bus.publish(script()[0])
                while not stream.entered.is_set():  # the renderer is now stuck in a write
                    await trio.sleep(0.01)
                for event in script()[1:] * 20:
                    bus.publish(event)
                    await trio.sleep(0.001)  # the event loop keeps running meanwhile
                assert subscription.dropped > 0
                stream.gate.set()
                bus.close()
    finally:
        stream.gate.set()
    published = 1 + len(script()[1:]) * 20
    assert result[0].events + subscription.dropped == published
    assert ("run_finished" if mode == "jsonl" else "finished: finished") in ANSI.sub(
        "", stream.getvalue()
    )


async def test_cancelling_the_live_view_restores_the_terminal() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    bus = ProgressBus(None, "r-1")
    receive, subscription = bus.subscribe(64)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(render_progress, "rich", receive, subscription, console=console)
            )
            bus.publish(script()[0])
            await trio.sleep(0.6)
            nursery.cancel_scope.cancel()
    output = console.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[?25l" in output and output.endswith("\x1b[?25h")  # cursor hidden, then shown


@pytest.mark.parametrize("mode", ["rich", "plain", "jsonl"])
async def test_cancelled_right_after_the_run_the_view_still_shows_the_end(mode: str) -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    bus = ProgressBus(None, "r-1")
    receive, subscription = bus.subscribe(256)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(render_progress, mode, receive, subscription, console=console, out=out)  # type: ignore[arg-type]
            )
            await trio.sleep(0.3)
            for event in script():
                bus.publish(event)
            bus.close()
            nursery.cancel_scope.cancel()  # what a caller does once the run has returned
    text = ANSI.sub("", out.getvalue())
    assert ("run_finished" if mode == "jsonl" else "finished: finished (campaign") in text


async def test_refreshing_less_than_twice_a_second_is_refused() -> None:
    send, receive = trio.open_memory_channel[ProgressEvent](1)
    with pytest.raises(ValueError, match="twice a second"):
        await render_progress("rich", receive, refresh_per_second=1.0)
    send.close()


async def test_none_only_folds() -> None:
    out = io.StringIO()
    state, published = await run_script("none", script(), out=out)
    assert out.getvalue() == "" and state.events == len(published)


def test_the_wall_clock_row_counts_the_whole_campaign_apart_from_replay_time() -> None:
    state = ViewState()
    started = RunStarted(
        run_id="-",
        campaign_id="c",
        cycle=1,
        iterations=4,
        population=2,
        replay_lanes=4,
        judge_lanes=2,
        wall_clock_budget=600.0,
        wall_clock_left=240.0,  # 360 s went to earlier cycles and sessions
    )
    budget = BudgetUpdate(
        run_id="-", spent=Usage(wall_seconds=95.0), reserved=Usage(), ceilings=Usage()
    )
    started, budget = stamped([started, budget])
    for event in (started, budget):
        state.fold(event)
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    console.print(render_view(state, started.t + 60.5))  # 60.5 s after the session began
    text = ANSI.sub("", console.file.getvalue())  # type: ignore[attr-defined]
    (wall,) = [line for line in text.splitlines() if "wall clock" in line]
    assert "70%" in wall and "7m00s" in wall and "10m00s" in wall  # 360 + 60 of 600 s
    (replay,) = [line for line in text.splitlines() if "command time" in line]
    assert replay == "also spent: 1m35s command time"  # no ceiling: no bar row
    assert "no ceiling" not in text


def test_the_budget_shows_spend_by_role_and_each_model_endpoints_limit() -> None:
    from evolane.messages import EndpointLoad

    state = ViewState()
    budget = BudgetUpdate(
        run_id="-",
        spent=Usage(tokens=3000, cost_usd=1.5),
        reserved=Usage(tokens=0, cost_usd=0.0),
        ceilings=Usage(cost_usd=10.0),
        by_role={
            "optimizer": Usage(tokens=1000, cost_usd=1.0),
            "judge": Usage(tokens=2000, cost_usd=0.5),
        },
        endpoints=(EndpointLoad(endpoint="http://h:1/v1", limit=3, in_flight=2, rate_limited=7),),
    )
    (budget,) = stamped([budget])
    state.fold(budget)
    console = Console(file=io.StringIO(), force_terminal=True, width=160)
    console.print(render_view(state, budget.t))
    text = ANSI.sub("", console.file.getvalue())  # type: ignore[attr-defined]
    (cost,) = [line for line in text.splitlines() if line.startswith("cost")]
    assert "15%" in cost and "$1.50" in cost and "$10.00" in cost  # the one ceiling set
    assert "also spent: 3.0k tokens" in text and not any(
        line.startswith("tokens") for line in text.splitlines()
    )
    assert "by role: optimizer 1.0k tokens $1.00 · judge 2.0k tokens $0.5000" in text
    assert "model http://h:1/v1: limit 3, in flight 2, 7 answered 429" in text


async def test_a_watched_run_long_silent_is_looked_at_again_once_its_file_is_read() -> None:
    """Found flaky under load: ``watch`` of a run silent for five minutes said so only 30 s
    (`QUIET_AFTER`) after it attached, when the view took its first wait before the watcher
    had read to the file's end (a file's lag is 0 until then). The view now looks again
    within `QUIET_RECHECK`, and says so only when a notice is due."""
    lag = [0.0]  # the watcher has not read to the end yet
    quiet = renderer._Quiet(lambda: lag[0])
    quiet.heard_one()
    assert quiet.wait() <= renderer.QUIET_RECHECK < renderer.QUIET_AFTER
    assert not quiet.due()
    lag[0] = 300.0  # read to the end: the file was last written five minutes ago
    assert quiet.wait() == 0 and quiet.due()
    assert quiet.told() == 300.0 and not quiet.due()  # the next notice: when it has doubled
    lag[0] = 600.0
    assert quiet.due()
