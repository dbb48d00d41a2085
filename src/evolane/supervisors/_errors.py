"""Errors a supervisor raises to its parent, and the one walk of trio's exception groups."""

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


def leaf_exceptions(error: BaseException) -> list[BaseException]:
    """The exceptions inside ``error``, nested groups flattened, in depth-first order.

    A `BaseExceptionGroup` (what a trio nursery raises) is replaced by its leaves, left to
    right at every depth; any other exception is its own single leaf: ``[error]``. Iterative,
    so arbitrarily deep nesting cannot exhaust the stack.
    """
    leaves: list[BaseException] = []
    pending = [error]
    while pending:
        current = pending.pop()
        if isinstance(current, BaseExceptionGroup):
            pending.extend(reversed(current.exceptions))
        else:
            leaves.append(current)
    return leaves
