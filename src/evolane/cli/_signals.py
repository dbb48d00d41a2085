"""Ctrl-C and SIGTERM during a session: what each one means, and a way out when the event
loop cannot hear them.

One receiver takes both signals for the whole session (`watching_signals`), and
`SignalWatch` decides what each means. The receiver is the loop's: code blocking the loop
(an observer's ``on_event`` or an in-process backend running sync code) left the command
deaf to every Ctrl-C and SIGTERM (found by review). So the process's own handler also
counts the signals the loop has not taken: at `UNHEARD` of them, the oldest at least
`UNHEARD_SECONDS` old, it says so in one line and exits 130 at once. That is a crash the
run is built for: the lifeline ends every command tree, the journal keeps every finished
unit, and ``--resume`` goes on from there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import trio

from evolane.cli._exits import EXIT_INTERRUPTED

UNHEARD = 3
"""Signals the loop has not taken, after which the process exits without it."""
UNHEARD_SECONDS = 1.0
"""How long the oldest of them must have waited: three quick presses a loop that answers
takes in microseconds are never read as a deaf loop."""
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def watching_signals(body: Callable[[SignalWatch], Awaitable[int]]) -> int:
    """``body``'s exit code, run under one SIGINT/SIGTERM receiver for the whole session (a
    Ctrl-C is never lost between handlers; `SignalWatch` decides what it means)."""
    with trio.open_signal_receiver(*_SIGNALS) as signals:
        watch = SignalWatch()
        with _exit_when_unheard(watch):
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watch.follow, signals)
                    code = await body(watch)
                    nursery.cancel_scope.cancel()
            except BaseException as error:
                if watch.code is None or not _only_interrupts(error):
                    raise
                print(CLOSE_CUT_SHORT, file=sys.stderr)
                return watch.code
    return code


CLOSE_CUT_SHORT = (
    "evolane: closing cut short (Ctrl-C); the run had ended and its report is written: "
    "the lifeline ends what is left of its commands"
)


def _only_interrupts(error: BaseException) -> bool:
    """Whether ``error`` is a Ctrl-C (alone, or a group of nothing else)."""
    if isinstance(error, BaseExceptionGroup):
        return error.split(KeyboardInterrupt)[1] is None
    return isinstance(error, KeyboardInterrupt)


@contextmanager
def _exit_when_unheard(watch: SignalWatch) -> Iterator[None]:
    """The receiver's handlers wrapped to count what the loop has not taken yet (the main
    thread runs them between bytecodes, even while sync code blocks the loop)."""
    receiver = {signum: signal.getsignal(signum) for signum in _SIGNALS}

    def handler(signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        watch.unheard.append(now)
        late = now - watch.unheard[0] >= UNHEARD_SECONDS
        if watch.following and len(watch.unheard) >= UNHEARD and late:
            _exit_now(watch)
        passed = receiver[signum]
        if callable(passed):
            passed(signum, frame)

    for signum in _SIGNALS:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, passed in receiver.items():
            signal.signal(signum, passed)


def _exit_now(watch: SignalWatch) -> None:
    """One line on stderr, then exit 130 with no cleanup (the loop that would run it is
    blocked): the lifeline ends the command trees, the journal keeps the finished units."""
    run_id = getattr(watch.handle, "run_id", None)
    how = f"; evolane optimize --resume {run_id} goes on from its journal" if run_id else ""
    line = (
        f"\nevolane: interrupted: {len(watch.unheard)} signals unheard for "
        f"{time.monotonic() - watch.unheard[0]:.1f} s (code blocking the event loop: an "
        f"observer or an in-process backend?); exiting now, without a report{how}\n"
    )
    with contextlib.suppress(OSError, ValueError):  # stderr a pipe whose reader died with
        os.write(sys.stderr.fileno(), line.encode(errors="replace"))  # the Ctrl-C (tee)
    os._exit(EXIT_INTERRUPTED)


class SignalWatch:
    """What Ctrl-C (or SIGTERM) means at each moment of a session: before the run exists,
    abort start-up; while it runs, stop it now (the units in flight are killed through the
    kill ladder and run again on resume; the report is written), then (again) cancel at
    once without a report; after it ended, nothing the first time (a second Ctrl-C often
    races a quick stop and must not cut the summary short), then abort the runtime's close."""

    def __init__(self) -> None:
        self.handle: Any = None
        self.ended = False
        self._ignored = False
        self.unheard: deque[float] = deque()
        """When each signal the loop has not taken yet arrived (`_exit_when_unheard`)."""
        self.following = False
        """Whether `follow` waits for signals: once it has let a Ctrl-C abort the session,
        the rest are nobody's to take, and the process is on its way out."""
        self.code: int | None = None
        """The session's exit code once its run ended and its summary is printed: a Ctrl-C
        that then cuts the runtime's close short keeps it (it said 130, "interrupted", of a
        run that had finished and published)."""

    async def follow(self, signals: Any) -> None:
        """Take each signal the receiver holds and do what it means now."""
        self.following = True
        try:
            await self._follow(signals)
        finally:
            self.following = False

    async def _follow(self, signals: Any) -> None:
        async for _ in signals:
            self.unheard.clear()  # the loop hears: whatever came before is taken
            if self.handle is None or (self.ended and self._ignored):
                raise KeyboardInterrupt
            if self.ended:
                self._ignored = True
                continue
            if self.handle._interrupt.is_set():
                self.handle.cancel()
                continue
            print(
                "\nevolane: stopping now: units in flight are killed (SIGTERM, --kill-grace, "
                "SIGKILL) and re-run on --resume; writing the report (Ctrl-C again: no report)",
                file=sys.stderr,
            )
            self.handle.stop()
