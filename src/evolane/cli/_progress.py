"""The progress renderers of ``evolane optimize``: a live view, plain lines, or JSON lines.

A renderer reads a lossy observer channel of the `ProgressBus`, folds every event it gets
into a `ViewState` and writes from a worker thread, so a slow or stalled terminal only makes
the observer lose events (counted), never slows the run.
"""

from __future__ import annotations

import errno
import sys
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Literal, TextIO, get_args

import orjson
import trio
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from evolane.measure import Subscription
from evolane.messages import (
    BudgetUpdate,
    DecisionEvent,
    Dimension,
    EstimateEvent,
    MeasureEvent,
    PhaseEvent,
    ProgressEvent,
    RunFinished,
    RunStarted,
    SlotEvent,
    WarningEvent,
)

ProgressMode = Literal["auto", "rich", "plain", "jsonl", "none"]
"""How ``--progress`` shows a run; ``auto`` is ``rich`` on a terminal, else ``plain``."""

TERMINAL_STAGES = frozenset({"selected", "rejected", "blocked", "not_run"})
"""Funnel stages a candidate slot never leaves."""

_KEPT = 5  # decisions and warnings the view remembers
_SLOT_ROWS = 12  # candidate slots shown in the live view before "… N more"
_BAR = 20  # cells of a text bar
_END_PHASES = frozenset({"finalize", "apply", "report"})
_LINE_PHASES = frozenset({"optimize", "finalize", "apply"})
_DIMENSIONS: tuple[Dimension, ...] = ("tokens", "cost_usd", "wall_seconds")
_DIMENSION_NAMES = {"tokens": "tokens", "cost_usd": "cost", "wall_seconds": "replay time"}


def resolve_mode(mode: str, stream: TextIO) -> ProgressMode:
    """The concrete mode for ``mode``: ``auto`` is ``rich`` when ``stream`` is a terminal."""
    if mode not in get_args(ProgressMode):
        choices = ", ".join(get_args(ProgressMode))
        raise ValueError(f"unknown progress mode {mode!r} (one of {choices})")
    if mode != "auto":
        return mode  # type: ignore[return-value]
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError, OSError):
        terminal = False
    return "rich" if terminal else "plain"


@dataclass
class ViewState:
    """What the run has told the observer so far; `fold` adds one event (pure, no IO)."""

    run_id: str = ""
    campaign_id: str = ""
    cycle: int = 0
    iterations: int = 0
    population: int = 0
    replay_lanes: int = 0
    judge_lanes: int = 0
    resumed: bool = False
    isolation: str = ""
    wall_budget: float | None = None  # the campaign's --wall-clock-budget
    wall_left: float | None = None  # what was left of it when this session began
    wall_t: float = 0.0  # when (event time) that was measured
    estimate: EstimateEvent | None = None
    phase: str = ""
    iteration: int | None = None
    parent: str = ""
    convergence: str = ""
    slot_iteration: int | None = None
    slots: dict[int, SlotEvent] = field(default_factory=dict)  # of `slot_iteration`
    funnel: Counter[str] = field(default_factory=Counter)  # terminal stages over the run
    measures: dict[str, MeasureEvent] = field(default_factory=dict)  # unfinished, by id
    last_measure: MeasureEvent | None = None
    lanes_busy: int = 0
    budget: BudgetUpdate | None = None
    decisions: deque[DecisionEvent] = field(default_factory=lambda: deque(maxlen=_KEPT))
    warnings: deque[WarningEvent] = field(default_factory=lambda: deque(maxlen=_KEPT))
    warning_count: int = 0
    finished: RunFinished | None = None
    events: int = 0  # events folded
    missed: int = 0  # events never seen, from gaps in the sequence numbers
    last_seq: int = 0
    t: float = 0.0  # the newest event's seconds since the run began

    def fold(self, event: ProgressEvent) -> None:
        """Take one event into the state."""
        self.events += 1
        if event.seq > self.last_seq:
            self.missed += event.seq - self.last_seq - 1
            self.last_seq = event.seq
        self.t = max(self.t, event.t)
        self.run_id = event.run_id or self.run_id
        if isinstance(event, RunStarted):
            self._started(event)
        elif isinstance(event, EstimateEvent):
            self.estimate = event
        elif isinstance(event, PhaseEvent):
            self._phase(event)
        elif isinstance(event, SlotEvent):
            self._slot(event)
        elif isinstance(event, MeasureEvent):
            self._measure(event)
        elif isinstance(event, DecisionEvent):
            self.decisions.append(event)
        elif isinstance(event, BudgetUpdate):
            self.budget = event
        elif isinstance(event, WarningEvent):
            self.warnings.append(event)
            self.warning_count += 1
        elif isinstance(event, RunFinished):
            self.finished = event
            self.measures.clear()
            self.lanes_busy = 0

    def _started(self, event: RunStarted) -> None:
        self.campaign_id, self.cycle = event.campaign_id, event.cycle
        self.iterations, self.population = event.iterations, event.population
        self.replay_lanes, self.judge_lanes = event.replay_lanes, event.judge_lanes
        self.resumed, self.isolation = event.resumed, event.isolation
        self.wall_budget, self.wall_left = event.wall_clock_budget, event.wall_clock_left
        self.wall_t = event.t

    def _phase(self, event: PhaseEvent) -> None:
        self.phase, self.cycle = event.phase, event.cycle
        if event.iteration is not None:
            self.iteration = event.iteration
        if event.parent:
            self.parent = event.parent
        if event.phase == "optimize":
            self.convergence = event.convergence
            if event.iteration is not None and event.iteration != self.slot_iteration:
                self.slot_iteration, self.slots = event.iteration, {}

    def _slot(self, event: SlotEvent) -> None:
        if event.iteration != self.slot_iteration:
            self.slot_iteration, self.slots = event.iteration, {}
        before = self.slots.get(event.slot)
        if event.stage in TERMINAL_STAGES and (before is None or before.stage != event.stage):
            self.funnel[event.stage] += 1
        self.slots[event.slot] = event

    def _measure(self, event: MeasureEvent) -> None:
        self.last_measure = event
        if event.finished:
            self.measures.pop(event.measurement_id, None)
            if not self.measures:
                self.lanes_busy = 0
        else:
            self.measures[event.measurement_id] = event
            self.lanes_busy = event.lanes_busy

    def fraction_done(self) -> float | None:
        """How much of the search is done (iterations and the current one's slots), if known."""
        if self.finished is not None:
            return 1.0
        if not self.iterations or self.iteration is None or self.phase in _END_PHASES:
            return None
        within = 0.0
        if self.phase == "optimize" and self.population:
            current = self.slot_iteration == self.iteration
            ended = sum(s.stage in TERMINAL_STAGES for s in self.slots.values()) if current else 0
            active = sum(
                m.pairs_done / m.pairs_planned for m in self.measures.values() if m.pairs_planned
            )
            within = min(1.0, (ended + active) / self.population)
        fraction = (min(self.iteration, self.iterations) + within) / self.iterations
        return min(fraction, 1.0) if fraction > 0 else None

    def eta(self, elapsed: float | None = None) -> float | None:
        """Seconds left at the pace so far (``elapsed`` defaults to the newest event's time)."""
        fraction = self.fraction_done()
        if fraction is None:
            return None
        spent = self.t if elapsed is None else elapsed
        return max(0.0, spent / fraction - spent)


# ----- formatting -------------------------------------------------------------------------


def _short(digest: str) -> str:
    return digest if len(digest) <= 19 else digest[:19] + "…"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _count(value: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.1f}{suffix}"
    return f"{value:.0f}"


def _amount(dimension: str, value: float | None) -> str:
    if value is None:
        return "?"
    if dimension == "cost_usd":
        return f"${value:.2f}"
    if dimension == "wall_seconds":
        return _duration(value)
    return _count(value)


def _num(value: float | None, spec: str = "+.4f") -> str:
    return "?" if value is None else format(value, spec)


def bar(fraction: float, reserved: float = 0.0, width: int = _BAR) -> str:
    """A text bar like ``█████░░░░░ 52%``; ``reserved`` adds ``▒`` cells after the filled ones."""
    fraction = min(max(fraction, 0.0), 1.0)
    full = round(fraction * width)
    extra = min(width - full, round(min(max(reserved, 0.0), 1.0) * width))
    return "█" * full + "▒" * extra + "░" * (width - full - extra) + f" {fraction:.0%}"


def _iteration_text(state: ViewState, iteration: int | None) -> str:
    if iteration is None:
        return "iteration ?"
    total = f"/{state.iterations}" if state.iterations else ""
    return f"iteration {iteration + 1}{total} (i{iteration})"  # i: as slot ids and reports


def _slot_label(iteration: int, slot: int) -> str:
    return f"i{iteration}.s{slot}"


def _measure_text(event: MeasureEvent) -> str:
    planned = event.pairs_planned
    done = bar(event.pairs_done / planned) if planned else "?"
    evidence = ""
    if event.mean_delta is not None:
        se = "" if event.se is None else f" ± {event.se:.4f} (SE)"
        evidence = f"  Δ {event.mean_delta:+.4f}{se}"
    decided = f"  → {event.decision}" if event.finished and event.decision else ""
    return f"{event.measurement_id}  {done}  {event.pairs_done}/{planned} pairs{evidence}{decided}"


def _decision_text(event: DecisionEvent) -> str:
    ci = ""
    if event.ci_low is not None and event.ci_high is not None:
        ci = f" CI [{_num(event.ci_low)}, {_num(event.ci_high)}]"
    delta = f"  Δ {_num(event.mean_delta)}{ci}" if event.mean_delta is not None else ""
    label = _slot_label(event.iteration, event.slot)
    return f"{label} {event.decision}  {_short(event.digest)}{delta}  {event.reason}".rstrip()


def _estimate_text(event: EstimateEvent) -> str:
    parts = [
        f"at most {event.replays_max} replays, {event.judge_calls_max} judge calls, "
        f"{event.optimizer_calls_max} optimizer calls"
    ]
    if event.wall_low_seconds is not None and event.wall_high_seconds is not None:
        parts.append(
            f"wall {_duration(event.wall_low_seconds)}..{_duration(event.wall_high_seconds)}"
        )
    if event.tokens is not None:
        parts.append(f"~{_count(event.tokens)} tokens")
    if event.cost_usd is not None:
        parts.append(f"~${event.cost_usd:.2f}")
    return "estimate: " + "; ".join(parts)


def _finished_text(event: RunFinished) -> str:
    text = f"finished: {event.status} (campaign {event.campaign_status})"
    if event.best:
        text += f"  best {_short(event.best)}"
    if event.baseline_val is not None or event.best_val is not None:
        text += f"  val {_num(event.baseline_val, '.3f')} -> {_num(event.best_val, '.3f')}"
    if event.report:
        text += f"  report {event.report}"
    return text


def plain_line(event: ProgressEvent, state: ViewState) -> str | None:
    """The plain-mode line for ``event`` (already folded into ``state``), or None if minor."""
    text: str | None = None
    if isinstance(event, RunStarted):
        text = (
            f"run {event.run_id} (campaign {event.campaign_id}, cycle {event.cycle}): "
            f"{event.iterations} iterations x {event.population} candidates, "
            f"lanes replay {event.replay_lanes} judge {event.judge_lanes}"
            + (f", isolation {event.isolation}" if event.isolation else "")
            + (", resumed" if event.resumed else "")
        )
    elif isinstance(event, EstimateEvent):
        text = _estimate_text(event)
    elif isinstance(event, PhaseEvent) and event.phase in _LINE_PHASES:
        if event.phase == "optimize":
            text = _iteration_text(state, event.iteration)
            text += f"  parent {_short(event.parent)}" if event.parent else ""
            text += f"  convergence {event.convergence}" if event.convergence else ""
        else:
            text = f"{event.phase} (cycle {event.cycle})"
    elif isinstance(event, SlotEvent) and event.stage in TERMINAL_STAGES:
        text = f"slot {_slot_label(event.iteration, event.slot)} {event.stage}"
        text += f"  {_short(event.digest)}" if event.digest else ""
        text += f"  {event.reason}" if event.reason else ""
    elif isinstance(event, DecisionEvent):
        text = "decision " + _decision_text(event)
    elif isinstance(event, WarningEvent):
        text = f"warning: {event.message}"
    elif isinstance(event, RunFinished):
        text = _finished_text(event)
    return None if text is None else f"[{event.t:6.1f}s] {text}"


def jsonl_line(event: ProgressEvent) -> str:
    """``event`` as one JSON line (what ``events.jsonl`` holds)."""
    return orjson.dumps(event.model_dump(mode="json")).decode() + "\n"


# ----- the live view ----------------------------------------------------------------------


def _header(state: ViewState, elapsed: float) -> Text:
    eta = state.eta(elapsed)
    when = "done" if state.finished else ("?" if eta is None else _duration(eta))
    text = Text()
    text.append(f"evolane {state.run_id or '…'}", style="bold")
    if state.campaign_id:
        text.append(f"  campaign {state.campaign_id}  cycle {state.cycle}")
    text.append(f"  │  phase {state.phase or 'starting'}", style="cyan")
    text.append(f"  │  {_iteration_text(state, state.iteration)}")
    text.append(f"  │  elapsed {_duration(elapsed)}  ETA {when}")
    return text


def _context(state: ViewState) -> Text:
    text = Text()
    if state.parent:
        text.append(f"parent {_short(state.parent)}  ")
    if state.convergence:
        text.append(f"convergence {state.convergence}  ")
    text.append(
        f"lanes {state.lanes_busy}/{state.replay_lanes} busy (judge lanes {state.judge_lanes})"
    )
    if state.isolation:
        text.append(f"  isolation {state.isolation}")
    return text


def _slots_table(state: ViewState) -> Table:
    iteration = "?" if state.slot_iteration is None else state.slot_iteration + 1
    funnel = "  ".join(f"{stage} {state.funnel[stage]}" for stage in sorted(TERMINAL_STAGES))
    table = Table(caption=f"run so far: {funnel}", caption_justify="left", pad_edge=False)
    table.title, table.title_justify = f"candidates of iteration {iteration}", "left"
    for column in ("slot", "stage", "candidate", "reason"):
        table.add_column(column, overflow="ellipsis", no_wrap=True, max_width=60)
    slots = sorted(state.slots.values(), key=lambda s: s.slot)
    for slot in slots[:_SLOT_ROWS]:
        style = {"selected": "green", "rejected": "red", "blocked": "yellow"}.get(slot.stage, "")
        label = _slot_label(slot.iteration, slot.slot)
        table.add_row(label, Text(slot.stage, style=style), _short(slot.digest), slot.reason)
    if len(slots) > _SLOT_ROWS:
        table.add_row("…", f"{len(slots) - _SLOT_ROWS} more", "", "")
    return table


def _budget_table(budget: BudgetUpdate, state: ViewState, elapsed: float) -> Table:
    table = Table(title="budget", title_justify="left", pad_edge=False)
    for column in ("dimension", "used (█ spent ▒ reserved)", "spent", "reserved", "ceiling"):
        table.add_column(column, no_wrap=True)
    if state.wall_budget and state.wall_left is not None:  # elapsed, for the whole campaign
        used = state.wall_budget - state.wall_left + max(0.0, elapsed - state.wall_t)
        table.add_row(
            "wall clock",
            bar(used / state.wall_budget, 0.0),
            _duration(used),
            "",
            _duration(state.wall_budget),
        )
    for dimension in _DIMENSIONS:
        spent, reserved = budget.spent.get(dimension), budget.reserved.get(dimension)
        ceiling = budget.ceilings.get(dimension)
        if spent is None and reserved is None and ceiling is None:
            continue
        shown = bar((spent or 0) / ceiling, (reserved or 0) / ceiling) if ceiling else "no ceiling"
        amounts = (_amount(dimension, value) for value in (spent, reserved, ceiling))
        table.add_row(_DIMENSION_NAMES[dimension], shown, *amounts)
    return table


def render_view(state: ViewState, elapsed: float, dropped: int = 0) -> RenderableType:
    """The live view of ``state``: a few lines and two small tables, cheap to redraw."""
    parts: list[RenderableType] = [_header(state, elapsed), _context(state)]
    if state.slots:
        parts.append(_slots_table(state))
    measures = list(state.measures.values())[-3:]
    if not measures and state.last_measure is not None:
        measures = [state.last_measure]
    parts.extend(Text("measure " + _measure_text(m)) for m in measures)
    if state.budget is not None:
        parts.append(_budget_table(state.budget, state, elapsed))
    if state.decisions:
        parts.append(Text("last decisions", style="bold"))
        parts.extend(Text("  " + _decision_text(d)) for d in state.decisions)
    if state.warnings:
        parts.append(Text(f"warnings ({state.warning_count})", style="bold yellow"))
        parts.extend(Text("  " + w.message, style="yellow") for w in list(state.warnings)[-3:])
    if dropped > 0:
        parts.append(
            Text(f"the view dropped {dropped} events (the run is unaffected)", style="yellow")
        )
    if state.finished is not None:
        parts.append(Text(_finished_text(state.finished), style="bold green"))
    return Group(*parts)


# ----- the renderers ----------------------------------------------------------------------


class _Output:
    """Runs blocking writes in a worker thread; a broken or closed stream ends output quietly."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.broken = False
        self.queue: deque[str] = deque()  # text not yet taken by a writing thread

    async def write(self, text: str) -> None:
        """Write ``text`` and whatever an earlier, cancelled write left behind."""
        if text:
            self.queue.append(text)
        if self.queue:
            await self.run(self._write_queue)

    def _write_queue(self) -> None:
        while self.queue:
            self.stream.write(self.queue.popleft())
        self.stream.flush()

    async def run(
        self, write: Callable[..., object], *args: object, even_if_broken: bool = False
    ) -> None:
        if self.broken and not even_if_broken:
            return
        try:
            await trio.to_thread.run_sync(partial(write, *args), abandon_on_cancel=True)
        except OSError:  # BrokenPipeError and friends: the reader went away
            self.broken = True
        except ValueError:
            if not getattr(self.stream, "closed", False):
                raise
            self.broken = True


def _drain(events: trio.MemoryReceiveChannel[ProgressEvent]) -> tuple[list[ProgressEvent], bool]:
    """Every event available now, and whether the channel is still open."""
    batch: list[ProgressEvent] = []
    while True:
        try:
            batch.append(events.receive_nowait())
        except trio.WouldBlock:
            return batch, True
        except trio.EndOfChannel:
            return batch, False


async def _fold_rest(state: ViewState, events: trio.MemoryReceiveChannel[ProgressEvent]) -> None:
    async for event in events:
        state.fold(event)


async def _render_lines(
    state: ViewState,
    events: trio.MemoryReceiveChannel[ProgressEvent],
    subscription: Subscription | None,
    out: TextIO,
    as_json: bool,
) -> None:
    """Plain or JSON lines, one batch of whatever has arrived per write."""
    output, reported = _Output(out), 0

    def text_of(batch: list[ProgressEvent]) -> str:
        nonlocal reported
        lines: list[str] = []
        for event in batch:
            state.fold(event)
            line = jsonl_line(event) if as_json else plain_line(event, state)
            if line is not None:
                lines.append(line if as_json else line + "\n")
        dropped = subscription.dropped if subscription is not None else 0
        if dropped > reported and not as_json:  # in JSON lines the gaps in `seq` tell it
            lines.append(f"[{state.t:6.1f}s] progress view dropped {dropped - reported} events\n")
            reported = dropped
        return "".join(lines)

    open_ = True
    try:
        while open_ and not output.broken:
            try:
                first = await events.receive()
            except trio.EndOfChannel:
                break
            batch, open_ = _drain(events)
            await output.write(text_of([first, *batch]))
        await _fold_rest(state, events)
    finally:  # cancelled just after the run closed the feed: still show how it ended
        with trio.CancelScope(deadline=trio.current_time() + 1.0, shield=True):
            await output.write(text_of(_drain(events)[0]))


def _finish(live: Live, view: RenderableType) -> None:
    live.update(view)
    live.stop()


async def _render_live(
    state: ViewState,
    events: trio.MemoryReceiveChannel[ProgressEvent],
    subscription: Subscription | None,
    console: Console,
    period: float,
) -> None:
    """A `rich.live.Live` redrawn every ``period`` seconds with all that arrived meanwhile."""
    live = Live(console=console, auto_refresh=False, redirect_stdout=False, redirect_stderr=False)
    output, anchor = _Output(console.file), None

    def view() -> RenderableType:
        nonlocal anchor  # elapsed time on trio's clock, anchored at the first event seen
        for event in _drain(events)[0]:
            state.fold(event)
        elapsed, now = state.t, trio.current_time()
        if state.events and state.finished is None:
            anchor = now - state.t if anchor is None else anchor
            elapsed = max(state.t, now - anchor)
        return render_view(state, elapsed, subscription.dropped if subscription else 0)

    console.on_broken_pipe = partial(_broken_pipe, console)  # type: ignore[method-assign]
    await output.run(live.start)
    started = not output.broken
    try:
        deadline = trio.current_time()
        while not output.broken and events.statistics().open_send_channels:
            deadline = max(deadline + period, trio.current_time())
            await trio.sleep_until(deadline)
            await output.run(partial(live.update, refresh=True), view())
        await _fold_rest(state, events)
    finally:  # the final frame, also when cancelled just after the run closed the feed
        with trio.CancelScope(deadline=trio.current_time() + 1.0, shield=True):
            if started:
                await output.run(_finish, live, view(), even_if_broken=True)
        vars(console).pop("on_broken_pipe", None)


def _broken_pipe(console: Console) -> None:
    """Instead of rich's exit on a broken pipe: go quiet and let the renderer stop drawing."""
    console.quiet = True
    raise BrokenPipeError(errno.EPIPE, "the terminal went away")


async def render_progress(
    mode: ProgressMode,
    events: trio.MemoryReceiveChannel[ProgressEvent],
    subscription: Subscription | None = None,
    *,
    console: Console | None = None,
    out: TextIO | None = None,
    refresh_per_second: float = 4.0,
) -> ViewState:
    """Show a run's progress until ``events`` is closed (the run ended); return what was seen.

    ``subscription`` supplies the count of events the bus dropped for this observer;
    ``console`` is the live view's (default: stdout), ``out`` the stream of plain and JSON lines.
    """
    if refresh_per_second < 2:
        raise ValueError("the live view refreshes at least twice a second")
    stream = out if out is not None else sys.stdout
    resolved = resolve_mode(mode, stream)
    state = ViewState()
    with events:
        if resolved == "rich":
            live_console = console if console is not None else Console()
            await _render_live(state, events, subscription, live_console, 1 / refresh_per_second)
        elif resolved in ("plain", "jsonl"):
            await _render_lines(state, events, subscription, stream, resolved == "jsonl")
        else:
            await _fold_rest(state, events)
    return state
