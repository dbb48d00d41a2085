"""The progress renderers of ``evolane optimize``: a live view, plain lines, or JSON lines.

A renderer reads a lossy observer channel of the `ProgressBus`, folds every event it gets
into a `ViewState` (`evolane.views`) and writes from a worker thread, so a slow or
stalled terminal only makes the observer lose events (counted), never slows the run.
"""

from __future__ import annotations

import errno
import math
import sys
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Literal, TextIO, get_args

import trio
from rich.console import Console, RenderableType
from rich.live import Live

from evolane import messages
from evolane.cli._output import is_terminal
from evolane.cli._view import (
    PLAIN_WIDTH,
    QUIET_AFTER,
    bar,
    jsonl_line,
    plain_line,
    quiet_line,
    render_view,
)
from evolane.measure import Subscription
from evolane.views import ViewState

__all__ = [
    "FINAL_FRAME_WAIT",
    "PLAIN_WIDTH",
    "Feed",
    "ProgressMode",
    "bar",
    "jsonl_line",
    "plain_line",
    "render_progress",
    "render_view",
    "resolve_mode",
]

ProgressMode = Literal["auto", "rich", "plain", "jsonl", "none"]
"""How ``--progress`` shows a run; ``auto`` is ``rich`` on a terminal, else ``plain``."""

FINAL_FRAME_WAIT = 1.0
"""Seconds the view may take to write its last frame after the run ended or was cancelled:
enough for a terminal to take one screen, short enough that a stuck one cannot hold exit."""

Feed = trio.MemoryReceiveChannel[messages.ProgressEvent]
"""An observer's end of the progress bus: the events a renderer reads."""
Lag = Callable[[], float]
"""Seconds since the newest event was written, for events read from a file (``watch``)."""


def resolve_mode(mode: str, stream: TextIO) -> ProgressMode:
    """The concrete mode for ``mode``: ``auto`` is ``rich`` when ``stream`` is a terminal."""
    if mode not in get_args(ProgressMode):
        choices = ", ".join(get_args(ProgressMode))
        raise ValueError(f"unknown progress mode {mode!r} (one of {choices})")
    if mode != "auto":
        return mode  # type: ignore[return-value]
    return "rich" if is_terminal(stream) else "plain"


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


async def _receive(events: Feed, wait: float) -> messages.ProgressEvent | None:
    """The next event: one waiting is taken at once; else None after ``wait`` seconds."""
    try:
        return events.receive_nowait()
    except trio.WouldBlock:
        pass
    with trio.move_on_after(wait):
        return await events.receive()
    return None


QUIET_RECHECK = 1.0
"""Seconds between two looks at a watched run's silence (a file's lag is known late)."""


class _Quiet:
    """How long the run has been quiet, and when the plain view says so next (after
    `QUIET_AFTER` seconds, then each time the silence has doubled)."""

    def __init__(self, lag: Lag | None) -> None:
        self.lag, self.heard, self.next = lag, trio.current_time(), QUIET_AFTER

    def seconds(self) -> float:
        """Seconds since the newest event (as written, when ``lag`` is known)."""
        return self.lag() if self.lag is not None else trio.current_time() - self.heard

    def wait(self) -> float:
        """Seconds until the next notice is due; for a file's events, at most
        `QUIET_RECHECK` (its lag is 0 until the watcher has read up to the end)."""
        left = max(0.0, self.next - self.seconds())
        return left if self.lag is None else min(left, QUIET_RECHECK)

    def due(self) -> bool:
        """Whether the next notice is due now."""
        return self.seconds() >= self.next - 1e-6

    def told(self) -> float:
        """A notice is written: the next once the silence has doubled; returns it."""
        quiet = self.seconds()
        self.next = 2 * max(self.next, quiet)
        return quiet

    def heard_one(self) -> None:
        self.heard, self.next = trio.current_time(), QUIET_AFTER


async def _render_lines(
    state: ViewState,
    events: Feed,
    subscription: Subscription | None,
    out: TextIO,
    as_json: bool,
    lag: Lag | None = None,
) -> None:
    """Plain or JSON lines, one batch of whatever has arrived per write; plain lines also
    say when the run has been quiet for long (`quiet_line`)."""
    output, reported, quiet = _Output(out), 0, _Quiet(lag)

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
                first = await _receive(events, math.inf if as_json else quiet.wait())
            except trio.EndOfChannel:
                break
            if first is None:
                if quiet.due():
                    line = quiet_line(state, quiet.told())
                    await output.write("" if line is None else line + "\n")
                continue
            quiet.heard_one()
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
    lag: Lag | None = None,
) -> None:
    """A `rich.live.Live` redrawn every ``period`` seconds with all that arrived meanwhile;
    its clock is the run's: the newest event's time plus ``lag`` when given (a watcher that
    attached late), else the time since the first event arrived."""
    live = Live(console=console, auto_refresh=False, redirect_stdout=False, redirect_stderr=False)
    output, anchor = _Output(console.file), None

    def view() -> RenderableType:
        nonlocal anchor  # elapsed time on trio's clock, anchored at the first event seen
        for event in _drain(events)[0]:
            state.fold(event)
        elapsed, now = state.t, trio.current_time()
        if state.events and state.finished is None and lag is not None:
            elapsed = state.t + lag()
        elif state.events and state.finished is None:
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
    lag: Lag | None = None,
) -> ViewState:
    """Show a run's progress until ``events`` is closed (the run ended); return what was seen.

    ``subscription`` supplies the count of events the bus dropped for this observer;
    ``console`` is the live view's (default: stdout), ``out`` the stream of plain and JSON lines;
    ``lag``, for events read from a file, the seconds since the newest was written.
    """
    if refresh_per_second < 2:
        raise ValueError("the live view refreshes at least twice a second")
    stream = out if out is not None else sys.stdout
    resolved = resolve_mode(mode, stream)
    state = ViewState()
    with events:
        if resolved == "rich":
            live_console = console if console is not None else Console()
            period = 1 / refresh_per_second
            await _render_live(state, events, subscription, live_console, period, lag)
        elif resolved in ("plain", "jsonl"):
            await _render_lines(state, events, subscription, stream, resolved == "jsonl", lag)
        else:
            await _fold_rest(state, events)
    return state
