"""How a lane stops a unit it runs: its own stop events, set by `StopUnits` / `StopAll`
signals (no stop object is shared with the scheduler or the campaign)."""

from __future__ import annotations

from collections import OrderedDict

from evolane.actors import Actor
from evolane.messages import Message, StopAll, StopUnits
from evolane.sandbox import UnitStop

EARLY_STOPS_KEPT = 1024
"""Stops remembered for units that have not reached the lane yet (a stop signal can overtake
the job queued in the mailbox); the oldest is forgotten first, so the memory stays bounded."""


class StopSwitches:
    """One stop per unit in flight on this lane, plus stops that came early."""

    def __init__(self) -> None:
        self._events: dict[str, UnitStop] = {}
        self._early: OrderedDict[str, None] = OrderedDict()

    def arm(self, unit_id: str) -> UnitStop:
        """The stop of a unit that starts now (already set if its stop came first)."""
        event = UnitStop()
        if self._early.pop(unit_id, False) is None:
            event.set()
        self._events[unit_id] = event
        return event

    def disarm(self, unit_id: str) -> None:
        """Forget a unit that ended."""
        self._events.pop(unit_id, None)

    def stop(self, unit_ids: tuple[str, ...]) -> None:
        """Set the events of these units; remember the ones not here yet."""
        for unit_id in unit_ids:
            event = self._events.get(unit_id)
            if event is not None:
                event.set()
                continue
            self._early[unit_id] = None
            self._early.move_to_end(unit_id)
            while len(self._early) > EARLY_STOPS_KEPT:
                self._early.popitem(last=False)

    def stop_all(self) -> None:
        """Set the event of every unit in flight."""
        for event in self._events.values():
            event.set()

    def __len__(self) -> int:
        return len(self._events)


class StoppableLane(Actor):
    """Base of the lanes: accepts `StopUnits` and `StopAll` as signals, so a stop reaches
    the unit while the lane's handler runs it."""

    signals = (StopUnits, StopAll)

    def __init__(self) -> None:
        self.stops = StopSwitches()

    def on_signal(self, message: Message) -> None:
        if isinstance(message, StopUnits):
            self.stops.stop(message.unit_ids)
        elif isinstance(message, StopAll):
            self.stops.stop_all()
