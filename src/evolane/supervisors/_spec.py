"""Child and supervisor specifications: what to start, and how to restart it (OTP terms)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from evolane.actors import DEFAULT_MAILBOX_SIZE, Actor

Strategy = Literal["one_for_one", "one_for_all", "rest_for_one"]
"""Which siblings restart with a failed child: itself, all of them, or those started after it."""
Restart = Literal["permanent", "transient", "temporary"]
"""Always restart; restart only after a crash; never restart."""


@dataclass(frozen=True)
class ActorSpec:
    """How to build one actor slot: the class, its arguments and its lifecycle settings."""

    name: str
    actor: type[Actor]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    restart: Restart = "permanent"
    mailbox_size: int = DEFAULT_MAILBOX_SIZE
    shutdown_grace: float = 5.0
    start_timeout: float = 10.0


@dataclass(frozen=True)
class SupervisorSpec:
    """A supervisor with its children (started in order, stopped in reverse) and its limits.

    More than ``max_restarts`` restarts within ``within_seconds`` makes it give up: it stops
    its children and escalates to its parent.
    """

    name: str
    children: Sequence[ActorSpec | SupervisorSpec] = ()
    strategy: Strategy = "one_for_one"
    max_restarts: int = 3
    within_seconds: float = 5.0
    restart: Restart = "permanent"
    shutdown_grace: float = 30.0
    start_timeout: float = 60.0


ChildSpec = ActorSpec | SupervisorSpec
