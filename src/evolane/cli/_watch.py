"""``evolane watch RUN_ID``: follow a run from any terminal by tailing its ``events.jsonl``.

The watcher only reads: the run's event stream, run.json and report.json, and it asks
whether a process still holds the run's journal (`evolane.campaign.run_is_live`). Every
event it reads is folded through the same `ViewState` and drawn by the same renderers as
the live view of ``evolane optimize`` (`evolane.cli._render.render_progress`), so the two
cannot disagree. It ends when the run ends: its ``event.run_finished`` arrives, or its
process is gone (killed) and nothing more comes. Ctrl-C only detaches (exit 0).
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TextIO

import typer
from rich.console import Console

from evolane.cli._exits import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, fail_usage
from evolane.cli._output import StoreOption, open_store, resolve_run, store_of, written_ago
from evolane.cli._resumable import resume_blocker, resume_command

if TYPE_CHECKING:  # the view's modules load when a run is followed, not with the command line
    import trio

    from evolane import messages
    from evolane.campaign import StoreLayout
    from evolane.cli._render import ProgressMode
    from evolane.views import EventDecoder, EventTail

WATCH_MODES = ("auto", "rich", "plain", "jsonl")
"""The ``--progress`` choices of ``watch`` (``none`` would show nothing)."""

POLL_INTERVAL = 0.2
"""Seconds between two looks at a run that has nothing new to say."""
DEAD_GRACE = 1.0
"""Seconds a run marked ``running`` must stay without a process (and silent) before the
watcher calls it dead: a session that is opening its run holds no lock yet."""


def _warn(message: str) -> None:
    print(f"evolane: warning: {message}", file=sys.stderr)


@dataclass
class Ending:
    """How a watched run ended, as far as the watcher could tell."""

    status: str | None = None  # the run's own status; None when it died without saying
    detached: bool = False  # Ctrl-C on the watcher: the run goes on
    unreadable: str | None = None  # why the run's events cannot be followed (no file there)

    @property
    def exit_code(self) -> int:
        """The run's own exit code; a run that died unfinished is interrupted (resumable)."""
        from evolane.campaign import EXIT_FOR_STATUS

        if self.detached:
            return EXIT_OK
        if self.status is None:
            return EXIT_INTERRUPTED
        return EXIT_FOR_STATUS.get(self.status, EXIT_INTERNAL)


@dataclass
class _Follower:
    """Tails one run's events into a channel until the run ends (IO: reads only)."""

    layout: StoreLayout
    run_id: str
    tail: EventTail
    decoder: EventDecoder
    last: messages.ProgressEvent | None = None
    quiet_since: float | None = None  # when the run was first seen without a process
    caught_up: bool = False  # whether every event the file held has been sent once
    silent_for: float = 0.0  # how long the run had been silent when `silent_from` was
    silent_from: float = 0.0  # the watcher's (monotonic) time of that reading

    def lag(self) -> float:
        """Seconds since the run wrote its newest event, once the watcher has read up to it
        (0 before: the view's clock is then the newest event's time). Only the reading on
        attaching is the wall clock's (the events file's time); from there on it is the
        watcher's monotonic clock since it last read a new event, so a clock that jumps back
        (or a store on another host whose clock is ahead) never hides a silence (found by
        review: `no event for` never came while the file's time was in the future)."""
        import trio

        if not self.caught_up:
            return 0.0
        return self.silent_for + (trio.current_time() - self.silent_from)

    def _heard(self, fresh: bool) -> None:
        """The file has been read to its end: at the first time, take the run's silence
        from the file's time; afterwards a new event starts it again at zero."""
        import trio

        if not self.caught_up:
            events = self.layout.run_dir(self.run_id) / "events.jsonl"
            self.silent_for, self.silent_from = written_ago(events), trio.current_time()
            self.caught_up = True
        elif fresh:
            self.silent_for, self.silent_from = 0.0, trio.current_time()

    async def follow(self, send: trio.MemorySendChannel[messages.ProgressEvent]) -> Ending:
        """Send every event of the run, from its first, until it ends; then close ``send``."""
        import trio

        from evolane.store import NotRegularFileError

        async with send:
            fresh = False  # whether new lines came since the end was last reached
            while True:
                try:
                    lines, at_end = self.tail.read()
                except NotRegularFileError as error:  # a FIFO, a device: never waited on
                    return Ending(unreadable=str(error))
                except OSError as error:  # unreadable (its mode): a traceback before
                    return Ending(unreadable=f"cannot read {self.tail.path}: {error.strerror}")
                fresh = fresh or bool(lines)
                first = self.tail.line_number - len(lines) + 1
                for number, line in enumerate(lines, start=first):
                    event = self.decoder.decode(line, number)
                    if event is not None:
                        self.last = event
                        try:
                            await send.send(event)
                        except trio.BrokenResourceError:  # the view's output went away
                            return Ending(detached=True)
                if not at_end:
                    await trio.lowlevel.checkpoint()
                    continue
                self._heard(fresh)
                ending, fresh = self._ended(fresh), False
                if ending is not None:
                    return ending
                await trio.sleep(POLL_INTERVAL)

    def _ended(self, fresh: bool) -> Ending | None:
        """How the run ended, once the whole file is read; None while it may go on."""
        import trio

        from evolane.campaign import run_is_live
        from evolane.messages import RunFinished

        if isinstance(self.last, RunFinished):
            return Ending(self.last.status)
        if fresh or run_is_live(self.layout, self.run_id):
            self.quiet_since = None
            return None
        status = self._recorded_status()
        if status == "running":  # no process, yet not ended in order: opening, or killed
            now = trio.current_time()
            self.quiet_since = now if self.quiet_since is None else self.quiet_since
            if now - self.quiet_since < DEAD_GRACE:
                return None
        ended = None if status == "running" else status  # e.g. interrupted, with no report
        return Ending(self._report_status() or ended)

    def _recorded_status(self) -> str:
        from evolane.campaign import load_run

        try:
            return load_run(self.layout, self.run_id).status
        except (OSError, ValueError):
            return "running"

    def _report_status(self) -> str | None:
        """The status report.json gives (a run that ended without its final event), if any."""
        from evolane.store import read_json

        try:
            data = read_json(self.layout.run_dir(self.run_id) / "report.json")
        except (OSError, ValueError):
            return None
        status = data.get("status") if isinstance(data, dict) else None
        return status if isinstance(status, str) else None


async def _watch(follower: _Follower, mode: ProgressMode, out: TextIO) -> Ending:
    """Render the run until it ends; Ctrl-C stops the tail only, and the view draws its end."""
    import trio

    from evolane import messages
    from evolane.cli._render import render_progress

    send, receive = trio.open_memory_channel[messages.ProgressEvent](256)
    endings: list[Ending] = []
    async with trio.open_nursery() as nursery:
        console = Console(file=out) if mode == "rich" else None
        view = partial(render_progress, mode, receive, console=console, out=out, lag=follower.lag)
        nursery.start_soon(view)
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async with trio.open_nursery() as tailing:

                async def tail() -> None:
                    endings.append(await follower.follow(send))
                    tailing.cancel_scope.cancel()

                async def detach() -> None:
                    async for _ in signals:
                        tailing.cancel_scope.cancel()
                        return

                tailing.start_soon(tail)
                tailing.start_soon(detach)
        send.close()  # the view then draws its last frame and returns
    return endings[0] if endings else Ending(detached=True)


def follow_run(
    layout: StoreLayout, run_id: str, store: Path, progress: str, out: TextIO | None = None
) -> Ending:
    """Show run ``run_id`` (already resolved) on ``out`` (default stdout) until it ends or
    Ctrl-C detaches; then say how it ended (on stderr when ``out`` carries JSON lines). The
    command's exit code is ``Ending.exit_code``."""
    if progress not in WATCH_MODES:
        fail_usage(f"unknown --progress {progress!r}; choose from: {', '.join(WATCH_MODES)}")
    import trio

    from evolane.cli._render import resolve_mode
    from evolane.views import EventDecoder, EventTail

    view_out = out if out is not None else sys.stdout
    mode = resolve_mode(progress, view_out)
    events = layout.run_dir(run_id) / "events.jsonl"
    follower = _Follower(layout, run_id, EventTail(events), EventDecoder(events, _warn))
    ending = trio.run(_watch, follower, mode, view_out)
    if ending.unreadable is not None:
        fail_usage(f"{ending.unreadable}: no events to follow; run `evolane fsck --store {store}`")
    try:
        view_out.flush()
        _say_how_it_ended(
            ending, layout, run_id, store, sys.stderr if mode == "jsonl" else view_out
        )
    except (BrokenPipeError, ValueError):  # the reader went away: nothing more to say
        pass
    return ending


def _say_how_it_ended(
    ending: Ending, layout: StoreLayout, run_id: str, store: Path, out: TextIO
) -> None:

    if ending.detached:
        again = f"evolane watch {run_id} --store {store}"
        print(f"detached from run {run_id}; it goes on (follow it again: {again})", file=out)
        return
    if ending.status is not None:
        print(f"run {run_id} ended {ending.status} (exit {ending.exit_code})", file=out)
        if ending.status != "interrupted":
            return
    else:
        print(f"run {run_id} ended without finishing: its process is gone (killed?)", file=out)
    from evolane.campaign import load_run

    try:
        blocked = resume_blocker(layout, load_run(layout, run_id), store)
    except (OSError, ValueError) as error:
        blocked = f"its run.json cannot be read ({type(error).__name__})"
    if blocked is None:
        print(f"resume: {resume_command(run_id, store)}", file=out)
    else:
        print(f"it cannot resume: {blocked}", file=out)


def watch(
    run_id: Annotated[str, typer.Argument(help="The run id (or a prefix of exactly one run).")],
    store: StoreOption = None,
    progress: Annotated[
        str, typer.Option(help="auto | rich | plain | jsonl (auto: rich on a terminal).")
    ] = "auto",
) -> None:
    """Follow a run from any terminal until it ends; exit with the run's own exit code.

    Ctrl-C only detaches (exit 0): the run goes on.
    """
    if progress not in WATCH_MODES:
        fail_usage(f"unknown --progress {progress!r}; choose from: {', '.join(WATCH_MODES)}")
    store = store_of(store)
    layout = open_store(store)
    run_id = resolve_run(layout, run_id)
    raise typer.Exit(follow_run(layout, run_id, store, progress).exit_code)
