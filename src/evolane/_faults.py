"""The hook through which a test injects faults into a live runtime (`evolane.testing.Chaos`).

Nothing is installed in production: each hook point costs one global lookup.
"""

from __future__ import annotations

from typing import Protocol


class FaultInjector(Protocol):
    """Decides, deterministically from its seed, where faults happen."""

    async def before_handler(self, actor: str, kind: str) -> None:
        """Called as a message is delivered to a handler: may delay it or raise a fault."""

    def before_spawn(self, label: str) -> None:
        """Called before a sandboxed process is spawned: may raise `OSError`."""


INSTALLED: list[FaultInjector] = []
"""At most one injector; tests install and remove it (see `evolane.testing.chaos`)."""
