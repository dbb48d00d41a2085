"""The runtime: the root of the supervision tree, one per process (CLI or embedded)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio

from evolane.actors import DEFAULT_ASK_TIMEOUT, Actor, ActorRef, ActorStats, DeadLetterOffice
from evolane.supervisors._cells import Environment
from evolane.supervisors._errors import leaf_exceptions
from evolane.supervisors._spec import ActorSpec, ChildSpec, Restart, SupervisorSpec
from evolane.supervisors._supervisor import Supervisor


class Runtime:
    """Handle on a running runtime: spawn children under the root, look up refs, read stats."""

    def __init__(self, root: Supervisor, env: Environment) -> None:
        self.root = root
        self._env = env

    @property
    def dead_letters(self) -> DeadLetterOffice:
        return self._env.dead_letters

    async def spawn(
        self,
        actor: type[Actor],
        *args: Any,
        name: str,
        restart: Restart = "permanent",
        mailbox_size: int | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> ActorRef:
        """Start one actor under the root supervisor and return its ref."""
        spec = ActorSpec(name=name, actor=actor, args=args, kwargs=kwargs or {}, restart=restart)
        if mailbox_size is not None:
            spec = ActorSpec(**{**spec.__dict__, "mailbox_size": mailbox_size})
        ref = await self.root.start_child(spec)
        assert isinstance(ref, ActorRef)
        return ref

    async def start_supervisor(self, spec: SupervisorSpec) -> Supervisor:
        """Start a supervisor (and its whole subtree) under the root."""
        supervisor = await self.root.start_child(spec)
        assert isinstance(supervisor, Supervisor)
        return supervisor

    async def start_child(self, spec: ChildSpec) -> ActorRef | Supervisor:
        """Start any child spec under the root."""
        return await self.root.start_child(spec)

    def lookup(self, name: str) -> ActorRef:
        """The ref registered under ``name``; KeyError when no running actor has it."""
        return self._env.registry[name]

    def supervisor(self, name: str) -> Supervisor:
        """The supervisor registered under ``name``; KeyError when none has it."""
        supervisor = self._env.supervisors[name]
        assert isinstance(supervisor, Supervisor)
        return supervisor

    def stats(self) -> list[ActorStats]:
        """A snapshot of every registered actor's counters, sorted by name."""
        return [self._env.registry[name].stats() for name in sorted(self._env.registry)]


@asynccontextmanager
async def open_runtime(
    *,
    name: str = "runtime",
    max_restarts: int = 3,
    within_seconds: float = 5.0,
    shutdown_timeout: float = 60.0,
    dead_letters_kept: int = 1000,
    ask_timeout: float = DEFAULT_ASK_TIMEOUT,
) -> AsyncIterator[Runtime]:
    """Run a runtime for the body of the ``async with``: a one_for_one root supervisor.

    On exit the tree shuts down in reverse start order (each child gets its grace), even when
    the body was cancelled, bounded by ``shutdown_timeout``; then every mailbox is closed.
    An error that escapes the tree or the body is raised as itself, not wrapped in a group.
    ``ask_timeout`` is how long an `ActorRef.ask` without its own timeout waits.
    """
    env = Environment(DeadLetterOffice(dead_letters_kept), ask_timeout)
    root = Supervisor(
        SupervisorSpec(name=name, max_restarts=max_restarts, within_seconds=within_seconds), env
    )
    runtime = Runtime(root, env)
    finished = trio.Event()
    # The tree is shielded from the caller's cancellation so that it can shut down in order;
    # this scope is cancelled once the orderly shutdown is done or out of time.
    tree_scope = trio.CancelScope(shield=True)

    async def run_root(task_status: trio.TaskStatus[None]) -> None:
        with tree_scope:
            try:
                await root.run(task_status.started)
            finally:
                finished.set()

    try:
        async with trio.open_nursery() as nursery:
            try:
                # Shielded: a `start` whose caller is cancelled leaves the started task in its
                # own nursery and waits for it to end, which the shielded tree never does by
                # itself (an `open_runtime` entered under a cancelled scope hung for ever,
                # found by review). The caller's cancellation lands at the next checkpoint,
                # inside this try, so the tree is stopped in order below.
                with trio.CancelScope(shield=True):
                    await nursery.start(run_root)
                yield runtime
            finally:
                with trio.CancelScope(shield=True) as scope:
                    scope.deadline = trio.current_time() + shutdown_timeout
                    if not finished.is_set():
                        root.request_stop()
                    await finished.wait()
                tree_scope.cancel()
    except BaseExceptionGroup as group:
        leaves = leaf_exceptions(group)
        raise (leaves[0] if len(leaves) == 1 else group) from None
    finally:
        root.retire()
