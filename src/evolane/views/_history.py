"""What a run did over time, for the plots of the HTML report: bounded series from events.

Pure like the rest of the view: `History.fold` takes one event. A run's clock goes on
across sessions (each session's events count seconds from its own start), so a resumed
run's points follow the earlier ones. Every series is bounded: past `MAX_POINTS` it keeps
every other point and thins what comes next alike, so a week-long run still plots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from evolane import messages

MAX_POINTS = 2000
"""Points a series keeps at most (it halves its resolution beyond)."""
MAX_DECISIONS = 10_000
"""Decisions remembered with their time and spend."""

P = TypeVar("P")


@dataclass
class Series(Generic[P]):
    """A bounded time series: beyond ``limit`` points it keeps every other one and from
    then on takes only every ``stride``-th point offered; the newest point is always in
    `points` (a plot ends where the run ended)."""

    limit: int = MAX_POINTS
    stride: int = 1
    _kept: list[P] = field(default_factory=list)
    _newest: P | None = None
    _offered: int = 0

    def add(self, point: P) -> None:
        """Offer one point (the newest)."""
        self._offered += 1
        self._newest = point
        if self._offered % self.stride:
            return
        self._kept.append(point)
        if len(self._kept) > self.limit:
            self._kept = self._kept[::2]
            self.stride *= 2

    @property
    def points(self) -> list[P]:
        """The kept points, oldest first, ending with the newest one offered."""
        if self._newest is None or (self._kept and self._kept[-1] is self._newest):
            return list(self._kept)
        return [*self._kept, self._newest]

    @property
    def newest(self) -> P | None:
        """The newest point offered (no copy of the series)."""
        return self._newest


@dataclass(frozen=True, slots=True)
class SpendPoint:
    """The ledger at one moment of the run's clock."""

    clock: float
    spent: messages.Usage
    ceilings: messages.Usage
    by_role: dict[str, messages.Usage]


@dataclass(frozen=True, slots=True)
class LanePoint:
    """Busy lanes at one moment: replays and judges in flight, proposals awaited."""

    clock: float
    replay: int
    judge: int
    optimizer: int


@dataclass(frozen=True, slots=True)
class DecisionPoint:
    """A gate decision with when it came and what had been spent by then."""

    clock: float
    event: messages.DecisionEvent
    spent: messages.Usage | None


@dataclass
class History:
    """The run's series so far; `fold` adds one event (pure, no IO)."""

    offset: float = 0.0  # the run clock when the current session began
    clock: float = 0.0  # the newest event's run clock
    sessions: int = 0
    spend: Series[SpendPoint] = field(default_factory=Series)
    lanes: Series[LanePoint] = field(default_factory=Series)
    decisions: list[DecisionPoint] = field(default_factory=list)
    decisions_dropped: int = 0
    _busy: dict[str, tuple[int, int]] = field(default_factory=dict)  # measurement: lanes
    _awaited: set[tuple[int, int]] = field(default_factory=set)  # (iteration, slot)
    _heard: set[tuple[int, int]] = field(default_factory=set)
    _population: int = 0
    _spent: messages.Usage | None = None

    def fold(self, event: messages.ProgressEvent) -> None:
        """Take one event into the series."""
        if isinstance(event, messages.RunStarted):
            self.sessions += 1
            self.offset = self.clock if self.sessions > 1 else 0.0
            self._population = event.population
            self._busy.clear()
            self._awaited.clear()
        self.clock = max(self.clock, self.offset + event.t)
        match event:
            case messages.BudgetUpdate():
                self._budget(event)
            case messages.MeasureEvent():
                self._measured(event)
            case messages.PhaseEvent(phase="optimize", iteration=int(iteration)):
                fresh = {(iteration, s) for s in range(self._population)} - self._heard
                self._awaited |= fresh
                self._lanes_now()
            case messages.SlotEvent():
                key = (event.iteration, event.slot)
                self._heard.add(key)
                if key in self._awaited:
                    self._awaited.discard(key)
                    self._lanes_now()
            case messages.DecisionEvent():
                if len(self.decisions) < MAX_DECISIONS:
                    self.decisions.append(DecisionPoint(self.clock, event, self._spent))
                else:
                    self.decisions_dropped += 1
            case messages.RunFinished():
                self._busy.clear()
                self._awaited.clear()
                self._lanes_now()
            case _:
                pass

    def _budget(self, event: messages.BudgetUpdate) -> None:
        """Spend only grows: a resumed session's ledger counts its restored units again
        from zero, so each figure is the most seen so far."""
        last = self.spend.newest
        spent = _at_least(event.spent, last.spent if last else None)
        by_role = {
            role: _at_least(usage, last.by_role.get(role) if last else None)
            for role, usage in event.by_role.items()
        }
        self._spent = spent
        self.spend.add(SpendPoint(self.clock, spent, event.ceilings, by_role))

    def _measured(self, event: messages.MeasureEvent) -> None:
        if event.finished:
            self._busy.pop(event.measurement_id, None)
        else:
            self._busy[event.measurement_id] = (event.lanes_busy, event.judges_busy)
        self._lanes_now()

    def _lanes_now(self) -> None:
        replay = sum(busy[0] for busy in self._busy.values())
        judge = sum(busy[1] for busy in self._busy.values())
        self.lanes.add(LanePoint(self.clock, replay, judge, len(self._awaited)))


def _at_least(usage: messages.Usage, floor: messages.Usage | None) -> messages.Usage:
    """``usage`` with each figure raised to ``floor``'s (None: as it is)."""
    if floor is None:
        return usage
    raised: dict[str, float] = {}
    for name in ("tokens", "cost_usd", "wall_seconds"):
        now, before = getattr(usage, name), getattr(floor, name)
        if before is not None and (now is None or before > now):
            raised[name] = before
    return usage.model_copy(update=raised) if raised else usage
