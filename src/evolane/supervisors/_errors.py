"""Errors a supervisor raises to its parent."""

from __future__ import annotations


class SupervisorEscalation(Exception):
    """A supervisor exceeded its restart intensity and stopped; names the child and its error."""

    def __init__(
        self,
        supervisor: str,
        child: str,
        restarts: int,
        within: float,
        last_error: BaseException | None,
    ) -> None:
        cause = repr(last_error) if last_error is not None else "a normal exit of a permanent child"
        super().__init__(
            f"supervisor {supervisor!r} gave up: child {child!r} needed more than {restarts} "
            f"restarts within {within}s; last error: {cause}"
        )
        self.supervisor = supervisor
        self.child = child
        self.last_error = last_error


class StartFailed(Exception):
    """A child could not be started (its constructor or ``started`` raised, or it timed out)."""

    def __init__(self, child: str, error: BaseException) -> None:
        super().__init__(f"child {child!r} failed to start: {error!r}")
        self.child = child
        self.error = error
