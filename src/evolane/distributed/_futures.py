"""Dask futures seen from trio: waiting for one without a thread, reading its answer."""

from __future__ import annotations

import contextlib
import pickle
import threading
from pathlib import Path
from typing import Any

import trio

from evolane.distributed._protocol import REPORT_FILE, UnitReport
from evolane.messages import FailureEvent
from evolane.store import StoreError


async def future_done(future: Any) -> None:
    """Wait until a Dask future has ended (finished, failed or cancelled) without holding a
    thread: its done callback (run in Dask's callback thread, also for a future that has
    already ended) wakes this task through the trio token."""
    token = trio.lowlevel.current_trio_token()
    ended = trio.Event()

    def wake(_: Any) -> None:
        with contextlib.suppress(trio.RunFinishedError):  # the trio run is already gone
            token.run_sync_soon(ended.set)

    future.add_done_callback(wake)
    await ended.wait()


def answer_of(future: Any, staging: Path | None) -> UnitReport | FailureEvent:
    """Wait for the task (in a thread) and turn what Dask says into a report or a failure."""
    from distributed import KilledWorker

    finished = threading.Event()
    future.add_done_callback(lambda _: finished.set())  # also on error and cancellation
    try:
        finished.wait()
        report = None
        if future.status == "finished" and staging is not None:
            with contextlib.suppress(FileNotFoundError):  # else the report is the task's value
                report = pickle.loads((staging / REPORT_FILE).read_bytes())
        if report is None:
            report = future.result()
    except KilledWorker as error:
        return FailureEvent(
            owner="infrastructure",
            stage="replay",
            code="worker_lost",
            message=f"the worker running this unit died: {error}"[:512],
            repairable=True,
        )
    except BaseException as error:  # the remote function raised, or the cluster cancelled it
        cancelled = type(error).__name__ in ("CancelledError", "FutureCancelledError")
        # A worker that cannot read the store or write its scratch space is the cluster's
        # problem; anything else raised on the worker is a bug of ours.
        infrastructure = cancelled or isinstance(error, StoreError | OSError)
        code = (
            "cluster_cancelled" if cancelled else "worker_io" if infrastructure else "remote_error"
        )
        return FailureEvent.of(
            error,
            owner="infrastructure" if infrastructure else "framework",
            stage="replay",
            code=code,
            repairable=infrastructure,
        )
    if not isinstance(report, UnitReport):
        return FailureEvent(
            owner="framework", stage="replay", code="remote_error", message="not a unit report"
        )
    return report


def lost_scheduler() -> FailureEvent:
    return FailureEvent(
        owner="infrastructure",
        stage="replay",
        code="cluster_lost",
        message="the client lost the Dask scheduler (it died or became unreachable)",
        repairable=True,
    )


def cancel_quietly(future: Any) -> None:
    try:
        future.cancel()
    except Exception:  # the client may already be closing; the task dies with its key
        return
