"""The OTP-style supervisor on a trio nursery: strategies, restart intensity, escalation."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from evolane.actors import ActorRef, is_crash
from evolane.supervisors._cells import ActorCell, Cell, Environment
from evolane.supervisors._errors import StartFailed, SupervisorEscalation
from evolane.supervisors._spec import ChildSpec, SupervisorSpec

_STOP = object()
_STOPPED_FROM_OUTSIDE = "it ended with its supervisor cancelled or interrupted"
_Exit = tuple[Cell, int, BaseException | None]


class Supervisor:
    """Starts children in order, restarts them by strategy, stops them in reverse order.

    ``run`` is one incarnation of the supervisor; the object and its child slots persist, so
    refs handed out stay valid when a parent restarts this supervisor.
    """

    def __init__(self, spec: SupervisorSpec, env: Environment) -> None:
        env.claim(spec.name)
        env.supervisors[spec.name] = self
        self.spec = spec
        self.name = spec.name
        self._env = env
        self._cells: list[Cell] = [make_cell(child, env) for child in spec.children]
        self._restart_times: deque[float] = deque()
        self._lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        # Bounded in practice: at most one exit per running child plus one stop request.
        self._inbox_send, self._inbox = trio.open_memory_channel[Any](math.inf)

    # ----- public handle -------------------------------------------------------------------

    def ref(self, name: str) -> ActorRef:
        """The ref of the child actor ``name``."""
        for cell in self._cells:
            if cell.name == name and isinstance(cell, ActorCell):
                return cell.ref
        raise KeyError(f"supervisor {self.name!r} has no actor child {name!r}")

    def child(self, name: str) -> Supervisor:
        """The nested supervisor ``name``."""
        for cell in self._cells:
            if cell.name == name and isinstance(cell, SupervisorCell):
                return cell.supervisor
        raise KeyError(f"supervisor {self.name!r} has no supervisor child {name!r}")

    @property
    def children(self) -> list[str]:
        """Names of the child slots that can still run, in start order."""
        return [cell.name for cell in self._cells if not cell.retired]

    def restarts_of(self, name: str) -> int:
        """How many times the slot ``name`` has been restarted."""
        return next(cell.restarts for cell in self._cells if cell.name == name)

    async def start_child(self, spec: ChildSpec) -> ActorRef | Supervisor:
        """Add a child at the end of the start order and start it now."""
        if self._nursery is None:
            raise RuntimeError(f"supervisor {self.name!r} is not running")
        async with self._lock:
            cell = make_cell(spec, self._env)
            self._cells.append(cell)
            try:
                await self._start(cell)
            except BaseException:
                self._cells.remove(cell)
                cell.retire()
                raise
        return cell.ref if isinstance(cell, ActorCell) else cell.supervisor  # type: ignore[attr-defined]

    async def stop_child(self, name: str) -> None:
        """Stop the child ``name`` (grace, then cancel) and remove its slot for good."""
        async with self._lock:
            cell = next((c for c in self._cells if c.name == name and not c.retired), None)
            if cell is None:
                raise KeyError(f"supervisor {self.name!r} has no running child {name!r}")
            await self._stop(cell)
            cell.retire()
            self._cells.remove(cell)

    def go_down(self, reason: str = "its supervisor gave up") -> None:
        """This supervisor gave up (or was stopped from outside): every actor under it fails
        its queued asks and new ones until it runs again (`Mailbox.go_down`), so no caller
        waits on a slot no one serves."""
        for cell in self._cells:
            if not cell.retired:  # a retired slot's mailbox is closed: nothing waits on it
                cell.go_down(reason)

    def request_stop(self) -> None:
        """Ask this supervisor to stop its children in reverse order and return."""
        self._inbox_send.send_nowait(_STOP)

    def retire(self) -> None:
        """Retire every child slot (recursively): their mailboxes close, names are freed."""
        for cell in reversed(self._cells):
            cell.retire()
        if self._env.supervisors.get(self.name) is self:
            del self._env.supervisors[self.name]

    # ----- one incarnation -----------------------------------------------------------------

    async def run(self, ready: Callable[[], None]) -> None:
        """Start every child in order, signal ``ready``, then supervise until stopped."""
        self._inbox_send, self._inbox = trio.open_memory_channel[Any](math.inf)
        self._restart_times.clear()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                await self._start_all_or_unwind()
                ready()
                await self._supervise()
            finally:
                self._nursery = None

    async def _start_all_or_unwind(self) -> None:
        started: list[Cell] = []
        for cell in self._cells:
            if cell.retired:
                continue
            try:
                await self._start(cell)
            except StartFailed:
                for earlier in reversed(started):
                    await self._stop(earlier)
                raise
            started.append(cell)

    async def _supervise(self) -> None:
        while True:
            item = await self._inbox.receive()
            if item is _STOP:
                async with self._lock:
                    await self._stop_all()
                return
            cell, incarnation, error = item
            if cell.incarnation != incarnation or cell.stopped_by_supervisor or cell.retired:
                continue
            async with self._lock:
                try:
                    await self._on_exit(cell, error)
                except SupervisorEscalation:
                    await self._stop_all()
                    self.go_down()
                    raise

    async def _on_exit(self, cell: Cell, error: BaseException | None) -> None:
        cell.running = False
        cell.last_error = error
        policy = cell.spec.restart
        if policy == "temporary" or (policy == "transient" and error is None):
            cell.retire()
            return
        self._count_restart(cell, error)
        if self.spec.strategy == "one_for_one":
            group = [cell]
        else:
            first = 0 if self.spec.strategy == "one_for_all" else self._cells.index(cell)
            group = [c for c in self._cells[first:] if not c.retired]
            for sibling in reversed(group):
                if sibling is not cell:
                    await self._stop(sibling)
        for member in group:
            if member.spec.restart == "temporary" and member is not cell:
                member.retire()
                continue
            await self._restart(member)

    async def _restart(self, cell: Cell) -> None:
        while True:
            cell.restarts += 1
            try:
                await self._start(cell)
                return
            except StartFailed as failure:
                cell.last_error = failure.error
                self._count_restart(cell, failure.error)

    def _count_restart(self, cell: Cell, error: BaseException | None) -> None:
        now = trio.current_time()
        times = self._restart_times
        times.append(now)
        while times and times[0] < now - self.spec.within_seconds:
            times.popleft()
        if len(times) > self.spec.max_restarts:
            raise SupervisorEscalation(
                self.name, cell.name, self.spec.max_restarts, self.spec.within_seconds, error
            )

    # ----- starting and stopping one child -------------------------------------------------

    async def _start(self, cell: Cell) -> None:
        assert self._nursery is not None
        cell.incarnation += 1
        cell.done = trio.Event()
        cell.stopped_by_supervisor = False
        try:
            with trio.fail_after(cell.spec.start_timeout):
                await self._nursery.start(self._incarnate, cell, cell.incarnation)
        except trio.TooSlowError as exc:
            raise StartFailed(cell.name, exc) from None
        cell.running = True

    async def _incarnate(
        self, cell: Cell, incarnation: int, task_status: trio.TaskStatus[None]
    ) -> None:
        live = False

        def ready() -> None:
            nonlocal live
            live = True
            task_status.started()

        error: BaseException | None = None
        try:
            with trio.CancelScope() as cell.scope:
                await cell.run(ready)
        except BaseException as exc:
            # Any BaseException but Cancelled and KeyboardInterrupt is the child's own crash
            # (`is_crash`), for the policy below (only an Exception was: a SystemExit or a
            # custom BaseException of user code tore the tree down with no policy, and asks
            # on the dead child waited out their timeouts, a campaign's stop 120 s).
            if not is_crash(exc):  # a stop from outside or the user's interrupt: propagate,
                cell.go_down(_STOPPED_FROM_OUTSIDE)  # and no ask waits on the dead slot
                raise
            if not live:
                raise StartFailed(cell.name, exc) from exc
            error = exc
        finally:
            cell.done.set()
        if live:
            self._inbox_send.send_nowait((cell, incarnation, error))
        else:
            raise StartFailed(cell.name, RuntimeError("stopped before it was ready"))

    async def _stop(self, cell: Cell) -> None:
        """Stop one running child: request, wait its grace, then cancel and wait for it."""
        if not cell.running:
            return
        cell.stopped_by_supervisor = True
        cell.request_stop()
        with trio.move_on_after(cell.spec.shutdown_grace):
            await cell.done.wait()
        if not cell.done.is_set():
            cell.scope.cancel()
            await cell.done.wait()
        cell.running = False

    async def _stop_all(self) -> None:
        for cell in reversed(self._cells):
            await self._stop(cell)


class SupervisorCell(Cell):
    """The slot of a nested supervisor; its children's slots survive its restarts too."""

    spec: SupervisorSpec

    def __init__(self, spec: SupervisorSpec, env: Environment) -> None:
        super().__init__(spec)
        self.supervisor = Supervisor(spec, env)

    async def run(self, ready: Callable[[], None]) -> None:
        await self.supervisor.run(ready)

    def request_stop(self) -> None:
        self.supervisor.request_stop()

    def retire(self) -> None:
        if not self.retired:
            self.retired = True
            self.supervisor.retire()

    def go_down(self, reason: str) -> None:
        self.supervisor.go_down(reason)


def make_cell(spec: ChildSpec, env: Environment) -> Cell:
    """The right cell for ``spec``: a nested supervisor's or an actor's."""
    if isinstance(spec, SupervisorSpec):
        return SupervisorCell(spec, env)
    return ActorCell(spec, env)
