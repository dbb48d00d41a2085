"""Seeded fault injection for concurrency tests: delays and crashes at message delivery, and
failed spawns in the sandbox. The same seed gives the same fault schedule for the same order
of deliveries and spawns (concurrent lanes may interleave them differently)."""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import trio

from evolane._faults import INSTALLED


class ChaosFault(RuntimeError):
    """A fault injected on purpose by `Chaos` (a handler crash)."""


@dataclass
class Chaos:
    """Fault rates (probabilities per event) and the counts of what was injected."""

    seed: int = 0
    delivery_delay: float = 0.0  # a delivered message waits up to ``max_delay`` first
    handler_crash: float = 0.0  # the handler raises `ChaosFault` instead of running
    spawn_failure: float = 0.0  # the sandbox refuses to spawn (an infrastructure failure)
    max_delay: float = 0.005
    only: tuple[str, ...] = ()  # parts of the actor names to target (empty: every actor)
    injected: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()  # spawns are decided in worker threads

    def _targets(self, actor: str) -> bool:
        return not self.only or any(part in actor for part in self.only)

    async def before_handler(self, actor: str, kind: str) -> None:
        if not self._targets(actor):
            return
        if self.delivery_delay and self._rng.random() < self.delivery_delay:
            self.injected["delivery_delay"] += 1
            await trio.sleep(self._rng.random() * self.max_delay)
        if self.handler_crash and self._rng.random() < self.handler_crash:
            self.injected["handler_crash"] += 1
            raise ChaosFault(f"chaos: {actor} crashed handling {kind}")

    def before_spawn(self, label: str) -> None:
        if not self.spawn_failure:
            return
        with self._lock:
            refuse = self._rng.random() < self.spawn_failure
            if refuse:
                self.injected["spawn_failure"] += 1
        if refuse:
            raise OSError(f"chaos: refused to spawn {label}")

    @contextmanager
    def installed(self) -> Iterator[Chaos]:
        """Make this the runtime's fault injector for the body of the ``with``."""
        if INSTALLED:
            raise RuntimeError("a Chaos injector is already installed")
        INSTALLED.append(self)
        try:
            yield self
        finally:
            INSTALLED.remove(self)
