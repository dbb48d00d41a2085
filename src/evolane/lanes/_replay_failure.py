"""How a replay's outcome reads as a failure (`classify`), and which failed replays a lane
tries again, and when.

A replay's infrastructure failure may pass (a lost worker, a crash of the lane's own work), so
it is tried again up to `ReplaySettings.retries` times; not a limit the tree would hit again,
nor a spawn, which is its own case: a program missing stays missing, while a host refusing a
process slot or memory for the moment (EAGAIN, ENOMEM) is tried again after a short wait.
"""

from __future__ import annotations

import errno

from evolane.lanes._program import arm_owner
from evolane.lanes._usage import sum_usage
from evolane.messages import FailureEvent, ReplayResult
from evolane.sandbox import ProcessOutcome

SPAWN_REFUSALS = 3
"""How many times a replay whose spawn (or a fork of its tree: `HOST_REFUSED`) the host
refused for the moment is tried again."""
HOST_REFUSED = "host_refused"
"""The code of a replay whose tree failed after the host refused it a process: a pid limit
enclosing evolane (a cgroup's ``pids.max``), not the run's ``--max-procs``."""
_REFUSED = (errno.EAGAIN, errno.ENOMEM)  # a pid or memory limit


def may_pass(result: ReplayResult) -> bool:
    """Whether ``result`` failed on the infrastructure in a way a retry may mend: not a
    spawn (see `refused_for_now`) and not a limit (the tree would hit it again)."""
    failure = result.failure
    return (
        failure is not None
        and failure.owner == "infrastructure"
        and failure.code not in ("spawn_failed", HOST_REFUSED)
        and not failure.code.startswith("limit_")
    )


def refused_for_now(result: ReplayResult, refusals: int) -> float | None:
    """How long to wait before trying again a replay whose spawn the host refused for want
    of a process slot or memory (EAGAIN, ENOMEM: a pid limit or memory reached for a
    moment), after ``refusals`` such refusals; None when it is not one or the tries are
    spent. No command ran, so nothing is charged twice (found by review: under a pid limit
    one refusal stopped the measurement as a shared failure, and with it the run)."""
    failure = result.failure
    if failure is None or refusals >= SPAWN_REFUSALS or not refused_by_host(failure):
        return None
    return refusal_wait(refusals)  # a tree that ran: its spend stays charged (`with_spend`)


def refused_by_host(failure: FailureEvent) -> bool:
    """Whether ``failure`` is the host refusing a process for the moment: a command's own
    spawn (``spawn_failed``, ``judge_spawn_failed``... with a refused errno) or a fork of
    its tree (`HOST_REFUSED`)."""
    if failure.code == HOST_REFUSED:
        return True
    return failure.code.endswith("spawn_failed") and spawn_refused(failure.spawn_errno)


def spawn_refused(number: int | None) -> bool:
    """Whether a spawn whose own call failed with errno ``number`` (`ProcessOutcome.spawn_errno`)
    was refused a process slot or memory by the host for the moment (EAGAIN, ENOMEM): no
    command ran, so trying again costs nothing. An errno, not the message's text: a command
    that printed the launcher's join failure line with ``[Errno 11]`` in it was read as
    refused (found by review)."""
    return number in _REFUSED


def refusal_wait(refusals: int) -> float:
    """How long a command the host refused (a spawn, a process of its tree) waits before
    it is tried again, after ``refusals`` such refusals: 0.25, 0.5, 1 s."""
    return 0.25 * 2**refusals


def with_spend(result: ReplayResult, ran_before: list[ReplayResult]) -> ReplayResult:
    """``result``, the last attempt of a unit, charged also what the attempts before it
    that ran (``ran_before``: a tree the host refused a process, tried again) spent: a
    retried replay's model calls are paid once each, never dropped from the budget."""
    if not ran_before:
        return result
    usage, complete = result.usage, result.usage_complete
    for earlier in ran_before:
        usage = sum_usage(usage, earlier.usage)
        complete = complete and earlier.usage_complete
    return result.model_copy(update={"usage": usage, "usage_complete": complete})


def stopped_waiting(result: ReplayResult) -> ReplayResult:
    """``result``, a refused spawn, when the run stopped its unit while it waited to try
    again (an early stop's cutoff, the budget, a cancel): ``cancelled``, the run's doing,
    never the host's failure (found by review: a unit beyond an early stop's cutoff ended
    ``spawn_failed``, stopping its measurement as a shared failure, and the run ``failed``
    though its decision was taken)."""
    failure = FailureEvent(owner="framework", stage="replay", code="cancelled")
    return result.model_copy(update={"status": "cancelled", "failure": failure})


def classify(outcome: ProcessOutcome, arm: str) -> FailureEvent | None:
    """The failure of a replay that ended as ``outcome`` on ``arm``, and whose it is: the
    host's (a spawn, a timeout), the run's (cancelled), or the tree's (a limit, an exit)."""
    if outcome.ok:
        return None
    if outcome.status == "spawn_failed":
        return FailureEvent(
            owner="infrastructure",
            stage="replay",
            code="spawn_failed",
            message=outcome.error[:512],
            spawn_errno=outcome.spawn_errno,
        )
    if outcome.status == "timed_out":
        return FailureEvent(
            owner="infrastructure",
            stage="replay",
            code="timeout",
            message=outcome.error or f"killed at the deadline after {outcome.wall_seconds:.1f}s",
            repairable=True,
        )
    if outcome.status == "cancelled":
        return FailureEvent(owner="framework", stage="replay", code="cancelled")
    if outcome.status == "limit_exceeded" and outcome.limits_hit == ("host_processes",):
        # The host refused a fork (the tree's own limit was never reached): its failure is
        # the host's, tried again, then a shared failure (found by review: charged to the
        # candidate as its --max-procs, a candidate fixing 8 of 12 cases was rejected).
        return FailureEvent(
            owner="infrastructure", stage="replay", code=HOST_REFUSED, message=outcome.error[:512]
        )
    if outcome.status == "limit_exceeded":
        # The replay ran the tree under test and it used more than the run allows: that is
        # the tree's doing, like a crash (a candidate's case scores 0; a baseline's is not
        # comparable). Were it an infrastructure failure, a candidate could drop the cases
        # it fails from the comparison by exhausting a limit (or by printing "Too many open
        # files") on them.
        return FailureEvent(
            owner=arm_owner(arm),  # type: ignore[arg-type]
            stage="replay",
            code=f"limit_{'_'.join(outcome.limits_hit)}",
            message=outcome.error[:512],
        )
    detail = outcome.stderr.text()[-500:]
    code = (
        f"exit_{outcome.exit_code}" if outcome.exit_code is not None else f"signal_{outcome.signal}"
    )
    return FailureEvent(owner=arm_owner(arm), stage="replay", code=code, message=detail)  # type: ignore[arg-type]
