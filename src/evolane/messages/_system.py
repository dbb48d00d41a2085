"""Messages of the runtime itself: liveness probes, stress work and dead-letter records."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import Field

from evolane.messages._base import Message, Name, Record, ShortText, Text


class Ping(Message):
    """A liveness probe; actors that accept it answer with `Pong`."""

    kind: Literal["ping"] = "ping"
    seq: int = Field(ge=0, le=2**63 - 1)


class Pong(Message):
    """The answer to `Ping`, echoing its sequence number."""

    kind: Literal["pong"] = "pong"
    seq: int = Field(ge=0, le=2**63 - 1)
    responder: Name


class StressWork(Message):
    """One unit of stress-harness traffic; ``crash`` asks the handler to raise."""

    kind: Literal["stress.work"] = "stress.work"
    seq: int = Field(ge=0, le=2**63 - 1)
    crash: bool = False


MAX_STOPS_PER_SIGNAL = 16
"""Unit ids one `StopUnits` carries; a sender with more sends several (bounded by schema)."""


class StopUnits(Message):
    """A signal to a lane: stop these units if they are in flight (their kill ladder runs),
    or as soon as they arrive (a stop may overtake its job)."""

    kind: Literal["lane.stop"] = "lane.stop"
    unit_ids: tuple[Name, ...] = Field(min_length=1, max_length=MAX_STOPS_PER_SIGNAL)

    @classmethod
    def batches(cls, unit_ids: Iterable[str]) -> list[StopUnits]:
        """The signals that stop these units, at most `MAX_STOPS_PER_SIGNAL` ids each."""
        ids = tuple(unit_ids)
        step = MAX_STOPS_PER_SIGNAL
        return [cls(unit_ids=ids[i : i + step]) for i in range(0, len(ids), step)]


class StopAll(Message):
    """A signal to a lane: stop whatever it runs now (a run or a measurement is ending)."""

    kind: Literal["lane.stop_all"] = "lane.stop_all"


StressAction = Literal["reply", "slow", "crash", "stop"]


class StressAsk(Message):
    """One question of the ask storm: what the responder does with it, and how long it takes."""

    kind: Literal["stress.ask"] = "stress.ask"
    seq: int = Field(ge=0, le=2**63 - 1)
    action: StressAction = "reply"
    delay: float = Field(default=0.0, ge=0.0, le=60.0)


class DeadLetter(Record):
    """A message that reached no handler, and why (the runtime's record, not a message)."""

    target: Name
    kind: ShortText
    reason: Literal["crashed", "stopped", "cancelled", "no_handler"]
    detail: Text = ""
