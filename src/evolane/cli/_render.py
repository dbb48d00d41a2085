"""The progress renderers of ``evolane optimize``: a live view, plain lines, or JSON lines.

A renderer reads a lossy observer channel of the `ProgressBus`, folds every event it gets
into a `ViewState` (`evolane.views`) and writes from a worker thread, so a slow or
stalled terminal only makes the observer lose events (counted), never slows the run.
"""

from __future__ import annotations

import errno
import sys
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any, Literal, TextIO, get_args

import orjson
import trio
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from evolane import messages
from evolane.cli._amounts import amount as _amount
from evolane.cli._amounts import count as _count
from evolane.cli._amounts import duration as _duration
from evolane.cli._amounts import role_spend
from evolane.measure import Subscription
from evolane.views import TERMINAL_STAGES, ViewState, kind_of

ProgressMode = Literal["auto", "rich", "plain", "jsonl", "none"]
"""How ``--progress`` shows a run; ``auto`` is ``rich`` on a terminal, else ``plain``."""

_SLOT_ROWS = 12  # candidate slots shown in the live view before "… N more"
FINAL_FRAME_WAIT = 1.0
"""Seconds the view may take to write its last frame after the run ended or was cancelled:
enough for a terminal to take one screen, short enough that a stuck one cannot hold exit."""
_BAR = 20  # cells of a text bar
_LINE_PHASES = frozenset({"optimize", "finalize", "apply"})
_DIMENSIONS: tuple[messages.Dimension, ...] = ("tokens", "cost_usd", "wall_seconds")
_DIMENSION_NAMES = {"tokens": "tokens", "cost_usd": "cost", "wall_seconds": "replay time"}

Feed = trio.MemoryReceiveChannel[messages.ProgressEvent]
"""An observer's end of the progress bus: the events a renderer reads."""


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


# ----- formatting -------------------------------------------------------------------------


def _short(digest: str) -> str:
    return digest if len(digest) <= 19 else digest[:19] + "…"


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


def _measure_text(event: messages.MeasureEvent) -> str:
    planned = event.pairs_planned
    done = bar(event.pairs_done / planned) if planned else "?"
    evidence = ""
    if event.mean_delta is not None:
        se = "" if event.se is None else f" ± {event.se:.4f} (SE)"
        evidence = f"  Δ {event.mean_delta:+.4f}{se}"
    decided = f"  → {event.decision}" if event.finished and event.decision else ""
    return f"{event.measurement_id}  {done}  {event.pairs_done}/{planned} pairs{evidence}{decided}"


def _decision_text(event: messages.DecisionEvent) -> str:
    ci = ""
    if event.ci_low is not None and event.ci_high is not None:
        ci = f" CI [{_num(event.ci_low)}, {_num(event.ci_high)}]"
    delta = f"  Δ {_num(event.mean_delta)}{ci}" if event.mean_delta is not None else ""
    label = _slot_label(event.iteration, event.slot)
    return f"{label} {event.decision}  {_short(event.digest)}{delta}  {event.reason}".rstrip()


def _estimate_text(event: messages.EstimateEvent) -> str:
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
    if event.by_role:
        parts.append("by role " + role_spend(event.by_role))
    return "\n".join(["estimate: " + "; ".join(parts), *_preflight_lines(event)])


def _preflight_lines(event: messages.EstimateEvent) -> list[str]:
    splits = [f"splits: {event.splits}"] if event.splits else []
    return splits + [f"preflight: {line}" for line in event.preflight]


def _finished_text(event: messages.RunFinished) -> str:
    text = f"finished: {event.status} (campaign {event.campaign_status})"
    if event.best:
        text += f"  best {_short(event.best)}"
    if event.baseline_val is not None or event.best_val is not None:
        text += f"  val {_num(event.baseline_val, '.3f')} -> {_num(event.best_val, '.3f')}"
    if event.report:
        text += f"  report {event.report}"
    return text


def _started_line(event: messages.RunStarted, _state: ViewState) -> str:
    return (
        f"run {event.run_id} (campaign {event.campaign_id}, cycle {event.cycle}): "
        f"{event.iterations} iterations x {event.population} candidates, "
        f"lanes replay {event.replay_lanes} judge {event.judge_lanes}"
        + (f", isolation {event.isolation}" if event.isolation else "")
        + (", resumed" if event.resumed else "")
    )


def _phase_line(event: messages.PhaseEvent, state: ViewState) -> str | None:
    if event.phase not in _LINE_PHASES:
        return None
    if event.phase != "optimize":
        return f"{event.phase} (cycle {event.cycle})"
    text = _iteration_text(state, event.iteration)
    text += f"  parent {_short(event.parent)}" if event.parent else ""
    text += f"  convergence {event.convergence}" if event.convergence else ""
    return text


def _slot_line(event: messages.SlotEvent, _state: ViewState) -> str | None:
    if event.stage not in TERMINAL_STAGES:
        return None
    text = f"slot {_slot_label(event.iteration, event.slot)} {event.stage}"
    text += f"  {_short(event.digest)}" if event.digest else ""
    text += f"  {event.reason}" if event.reason else ""
    return text


_LINES: dict[str, Callable[[Any, ViewState], str | None]] = {
    kind_of(messages.RunStarted): _started_line,
    kind_of(messages.EstimateEvent): lambda event, _state: _estimate_text(event),
    kind_of(messages.PhaseEvent): _phase_line,
    kind_of(messages.SlotEvent): _slot_line,
    kind_of(messages.DecisionEvent): lambda event, _state: "decision " + _decision_text(event),
    kind_of(messages.WarningEvent): lambda event, _state: f"warning: {event.message}",
    kind_of(messages.RunFinished): lambda event, _state: _finished_text(event),
}
"""The plain line of each event kind that has one (it may still be None: a minor event)."""


def plain_line(event: messages.ProgressEvent, state: ViewState) -> str | None:
    """The plain-mode line for ``event`` (already folded into ``state``), or None if minor."""
    line = _LINES.get(event.kind)
    text = None if line is None else line(event, state)
    return None if text is None else f"[{event.t:6.1f}s] {text}"


def jsonl_line(event: messages.ProgressEvent) -> str:
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


def _budget_table(budget: messages.BudgetUpdate, state: ViewState, elapsed: float) -> Table:
    table = Table(title="budget", title_justify="left", pad_edge=False)
    columns = ["dimension", "used (█ spent ▒ reserved)", "spent", "reserved", "ceiling"]
    for column in [*columns, "by role"] if budget.by_role else columns:
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
        amounts = [_amount(dimension, value) for value in (spent, reserved, ceiling)]
        if budget.by_role:
            amounts.append(role_spend(budget.by_role, dimension))
        table.add_row(_DIMENSION_NAMES[dimension], shown, *amounts)
    return table


def _endpoint_text(load: messages.EndpointLoad) -> str:
    limited = f", {load.rate_limited} answered 429" if load.rate_limited else ""
    return f"model {load.endpoint}: limit {load.limit}, in flight {load.in_flight}{limited}"


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
        parts.extend(Text(_endpoint_text(load)) for load in state.budget.endpoints)
    if state.estimate is not None and not state.decisions:  # until the first decision
        parts.extend(Text(line, style="dim") for line in _preflight_lines(state.estimate))
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


def _drain(events: Feed) -> tuple[list[messages.ProgressEvent], bool]:
    """Every event available now, and whether the channel is still open."""
    batch: list[messages.ProgressEvent] = []
    while True:
        try:
            batch.append(events.receive_nowait())
        except trio.WouldBlock:
            return batch, True
        except trio.EndOfChannel:
            return batch, False


async def _fold_rest(state: ViewState, events: Feed) -> None:
    async for event in events:
        state.fold(event)


async def _render_lines(
    state: ViewState,
    events: Feed,
    subscription: Subscription | None,
    out: TextIO,
    as_json: bool,
) -> None:
    """Plain or JSON lines, one batch of whatever has arrived per write."""
    output, reported = _Output(out), 0

    def text_of(batch: list[messages.ProgressEvent]) -> str:
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
        with trio.CancelScope(deadline=trio.current_time() + FINAL_FRAME_WAIT, shield=True):
            await output.write(text_of(_drain(events)[0]))


def _finish(live: Live, view: RenderableType) -> None:
    live.update(view)
    live.stop()


async def _render_live(
    state: ViewState,
    events: Feed,
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
        with trio.CancelScope(deadline=trio.current_time() + FINAL_FRAME_WAIT, shield=True):
            if started:
                await output.run(_finish, live, view(), even_if_broken=True)
        vars(console).pop("on_broken_pipe", None)


def _broken_pipe(console: Console) -> None:
    """Instead of rich's exit on a broken pipe: go quiet and let the renderer stop drawing."""
    console.quiet = True
    raise BrokenPipeError(errno.EPIPE, "the terminal went away")


async def render_progress(
    mode: ProgressMode,
    events: Feed,
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
