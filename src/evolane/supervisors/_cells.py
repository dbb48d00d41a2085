"""Cells: a supervisor's slot for one child, living across the child's incarnations.

A nested supervisor's cell lives beside `Supervisor` (in ``_supervisor``), so that this module
never needs the supervisor class: the environment knows supervisors only as `Supervising`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import trio

from evolane.actors import (
    DEFAULT_ASK_TIMEOUT,
    ActorContext,
    ActorRef,
    DeadLetterOffice,
    Mailbox,
    ServeControl,
    serve,
)
from evolane.supervisors._spec import ActorSpec, ChildSpec


class Supervising(Protocol):
    """What the environment holds of a registered supervisor (`Supervisor` is the one kind)."""

    name: str

    def request_stop(self) -> None:
        """Ask it to stop its children in reverse order and return."""

    def retire(self) -> None:
        """Retire its child slots: mailboxes close, names are freed."""


class Environment:
    """What every cell of one runtime shares: the name registry and the dead-letter office."""

    def __init__(
        self, dead_letters: DeadLetterOffice, ask_timeout: float = DEFAULT_ASK_TIMEOUT
    ) -> None:
        self.dead_letters = dead_letters
        self.ask_timeout = ask_timeout  # every mailbox's default for an ask without a timeout
        self.registry: dict[str, ActorRef] = {}
        self.supervisors: dict[str, Supervising] = {}

    def claim(self, name: str) -> None:
        """Reserve ``name``; ValueError if an actor or a supervisor of this runtime has it."""
        if name in self.registry or name in self.supervisors:
            raise ValueError(f"name {name!r} is already taken in this runtime")


class Cell:
    """One child slot. ``run`` is one incarnation; the slot itself survives restarts."""

    spec: ChildSpec

    def __init__(self, spec: ChildSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.incarnation = 0
        self.running = False
        self.retired = False
        self.stopped_by_supervisor = False
        self.restarts = 0
        self.last_error: BaseException | None = None

    async def run(self, ready: Callable[[], None]) -> None:
        """Build and run one incarnation; call ``ready`` once it accepts work."""
        raise NotImplementedError

    def request_stop(self) -> None:
        """Ask the running incarnation to finish at its next safe point."""
        raise NotImplementedError

    def retire(self) -> None:
        """The slot will never run again: refuse its messages, free its name."""
        raise NotImplementedError

    def go_down(self, reason: str) -> None:
        """No incarnation will serve the slot soon: fail its queued asks and new ones until
        it runs again (`Mailbox.go_down`; a nested supervisor's whole subtree)."""
        raise NotImplementedError


class ActorCell(Cell):
    """The slot of one actor: its mailbox and ref outlive each incarnation."""

    spec: ActorSpec

    def __init__(self, spec: ActorSpec, env: Environment) -> None:
        super().__init__(spec)
        env.claim(spec.name)
        self.env = env
        self.mailbox = Mailbox(
            spec.name, spec.actor.accepts, env.dead_letters, spec.mailbox_size, env.ask_timeout
        )
        self.ref = ActorRef(self.mailbox)
        self.control = ServeControl()
        env.registry[spec.name] = self.ref

    async def run(self, ready: Callable[[], None]) -> None:
        spec = self.spec
        self.control = control = ServeControl()
        actor = spec.actor(*spec.args, **spec.kwargs)
        actor.context = ActorContext(self.ref, self.env.registry)
        await actor.started()
        self.mailbox.down = False
        ready()
        await serve(actor, self.mailbox, control)

    def request_stop(self) -> None:
        self.control.request_stop()

    def go_down(self, reason: str) -> None:
        self.mailbox.go_down(reason)

    def retire(self) -> None:
        if self.retired:
            return
        self.retired = True
        self.mailbox.close()
        if self.env.registry.get(self.name) is self.ref:
            del self.env.registry[self.name]
