"""Progress on stderr for the commands that walk every run of a store (``fsck``, ``runs``):
silent when the walk ends within `TallySettings.after` seconds, else a live line on a
terminal, or a plain line at most every `TallySettings.plain_interval` seconds (found by
review: 13 minutes of silence at 100,000 runs looked like a hung process). Stdout is never
touched: what a command prints there is the same with or without progress."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text

from evolane.cli._exits import fail_usage
from evolane.cli._output import is_terminal

AFTER_ENV = "EVOLANE_PROGRESS_AFTER"
"""Environment variable overriding `TallySettings.after` (seconds; ``0`` shows progress
from the first run, as tests and scripts that want it do)."""


@dataclass(frozen=True)
class TallySettings:
    """When a store walk shows progress, and how often."""

    after: float = 1.0
    """Seconds a walk runs before its first progress: a shorter one shows none."""
    plain_interval: float = 5.0
    """Seconds at least between two plain lines (stderr not a terminal: a log)."""
    live_interval: float = 0.25
    """Seconds between two redraws of the live line (stderr a terminal)."""

    @classmethod
    def from_environ(cls) -> TallySettings:
        """The defaults, with `AFTER_ENV` when set; a value that is no number of seconds is
        one error line naming it (exit 2)."""
        raw = os.environ.get(AFTER_ENV)
        if raw is None or not raw.strip():
            return cls()
        try:
            after = float(raw)
        except ValueError:
            after = math.nan
        if not math.isfinite(after) or after < 0:
            fail_usage(f"{AFTER_ENV}={raw[:40]!r}: not a number of seconds (>= 0)")
        return cls(after=after)


class Tally:
    """Counts a walk's items (``what``: ``runs``, ``objects``) and its damage (with
    ``counts_damage``), and shows
    them on ``stream`` once the walk has run `TallySettings.after` seconds. A context
    manager: leaving it ends the live line (it leaves nothing on screen) and writes a last
    plain line when any was written."""

    def __init__(
        self,
        command: str,
        *,
        counts_damage: bool = False,
        settings: TallySettings | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.command, self.counts_damage = command, counts_damage
        self.settings = settings or TallySettings.from_environ()
        self.stream = stream if stream is not None else sys.stderr
        self.what, self.done, self.damaged = "runs", 0, 0
        self.total: int | None = 0
        self._next = time.monotonic() + self.settings.after  # when to show (or show again)
        self._live: Live | None = None
        self._terminal = is_terminal(self.stream)
        self._shown = False
        self._broken = False

    def begin(self, what: str, total: int | None) -> None:
        """Start counting ``total`` items of ``what`` (None: not known before the walk ends;
        a walk may count several kinds in turn)."""
        self.what, self.total, self.done = what, total, 0
        self.tick(0)

    def tick(self, count: int = 1, damaged: int = 0) -> None:
        """``count`` more items walked, ``damaged`` more problems found among them."""
        self.done += count
        self.damaged += damaged
        now = time.monotonic()
        if now < self._next or self._broken:
            return
        if self._terminal:  # drawn from here on by the live view's own thread
            self._next = math.inf
            self._start_live()
        else:
            self._next = now + self.settings.plain_interval
            self._write(self.line() + "\n")

    def line(self) -> str:
        """``fsck: 12,000 of 100,000 runs, 3 damaged so far`` (the damage when counted)."""
        of = "" if self.total is None else f" of {self.total:,}"
        text = f"{self.command}: {self.done:,}{of} {self.what}"
        if self.counts_damage:
            text += f", {self.damaged:,} damaged so far"
        return text

    def _start_live(self) -> None:
        """The live line: redrawn every `TallySettings.live_interval` from the counts as
        they are then, erased when the walk ends."""
        try:
            console = Console(file=self.stream, force_terminal=True)
            self._live = Live(
                console=console,
                transient=True,
                refresh_per_second=1.0 / self.settings.live_interval,
                get_renderable=lambda: Text(self.line()),
            )
            self._live.start(refresh=True)
        except (OSError, ValueError):
            self._broken = True

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
            self._shown = True
        except (OSError, ValueError):  # a closed stderr: the walk goes on, unshown
            self._broken = True

    def __enter__(self) -> Tally:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._live is not None:
            with contextlib.suppress(OSError, ValueError):
                self._live.stop()
        elif self._shown and not self._broken and kind is None:
            self._write(self.line().replace(" so far", "") + "\n")
