"""``evolane drain`` (and ``evolane optimize --drain-pending``): run the pending
background-evolution jobs of a store from the command line.

The jobs are those an `evolane.embed.EvolveService` left in ``STORE/pending/``: waiting ones,
and half-run ones of a process that died (their run is resumed, not started over). Each runs
with the live view and its summary, one at a time, oldest first; a job another live process
holds is skipped. Exit codes as ``optimize``: 0 every job finished (or is held by another
process), 2 bad usage or input (a refused job is retired as failed), 3 a job was budget
limited, 130 interrupted (the job stays pending), 1 internal error or a failed run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from evolane.cli._exits import (
    EXIT_BUDGET,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    error_line,
    fail_usage,
)
from evolane.cli._output import StoreOption, store_of

_PROGRESS = ("auto", "rich", "plain", "jsonl", "none")
_SEVERITY = (EXIT_INTERRUPTED, EXIT_USAGE, EXIT_INTERNAL, EXIT_BUDGET, EXIT_OK)
"""Which code a drain of several jobs exits with: the first of these that any job had."""


def drain(
    store: StoreOption = None,
    max_jobs: Annotated[
        int | None, typer.Option(help="Run at most N jobs (default: every pending job).")
    ] = None,
    progress: Annotated[
        str,
        typer.Option(help="auto | rich | plain | jsonl | none (default auto).", show_default=False),
    ] = "auto",
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Run the pending background-evolution jobs (resuming half-run ones), one at a time."""
    root = str(store_of(store))
    raise typer.Exit(run_drain(root, max_jobs=max_jobs, progress=progress, debug=debug))


def drain_with_config(flags: dict[str, Any]) -> int:
    """``optimize --drain-pending``: the store and progress as ``optimize`` resolves them
    (flag, else the config file, else the default), then `run_drain`."""
    from evolane.cli._config import ConfigError, merge_config_file

    try:
        merge_config_file(flags, session_only=True)
    except ConfigError as error:
        fail_usage(str(error))
    return run_drain(
        str(flags["store"]), max_jobs=None, progress=flags["progress"], debug=flags["debug"]
    )


def run_drain(store: str, *, max_jobs: int | None, progress: str, debug: bool) -> int:
    """Drain ``store``'s pending jobs; returns the exit code (see the module docstring)."""
    from evolane.cli._session import _exit_for, _leaf

    try:
        root = _check(store, max_jobs, progress)
        import trio

        from evolane.cli._signals import watching_signals

        return trio.run(
            watching_signals, lambda watch: _drain_jobs(root, max_jobs, progress, watch)
        )
    except BaseException as error:  # every error becomes one line and an exit code
        return _exit_for(_leaf(error), debug, store)


def _check(store: str, max_jobs: int | None, progress: str) -> Path:
    from evolane.cli._session import UsageError

    if max_jobs is not None and max_jobs < 1:
        raise UsageError(f"--max-jobs must be at least 1, got {max_jobs}")
    if progress not in _PROGRESS:
        raise UsageError(f"--progress {progress}: choose from {', '.join(_PROGRESS)}")
    root = Path(store).absolute()
    if not root.exists():
        raise UsageError(f"--store {store}: no such folder")
    if not root.is_dir():
        raise UsageError(f"--store {store}: not a directory")
    return root


async def _drain_jobs(root: Path, max_jobs: int | None, progress: str, watch: Any) -> int:
    import trio

    from evolane import embed

    jobs, damaged = embed.PendingJobs(root), []
    pending = await trio.to_thread.run_sync(jobs.list, damaged)
    for reason in damaged:  # set aside: the others still run, and the exit says it
        error_line(reason)
    if max_jobs is not None:
        pending = pending[:max_jobs]
    if not pending:
        if not damaged:
            print(f"evolane drain: no pending jobs in {root}")
        return EXIT_USAGE if damaged else EXIT_OK
    codes = [EXIT_USAGE] if damaged else []
    async with embed.open_runtime(store=root) as runtime:
        for job in pending:
            with jobs.lock(job) as locked:  # as it is now: another process may have run it
                if locked is None:
                    print(
                        f"evolane drain: job {job.job_id} is running in another process "
                        "(or another ran it)"
                    )
                    continue
                code = await _drain_one(runtime, jobs, locked, root, progress, watch)
            codes.append(code)
            if code == EXIT_INTERRUPTED:
                break
    if not codes:  # every job is held by another live process: nothing failed here
        return EXIT_OK
    return next((code for code in _SEVERITY if code in codes), EXIT_INTERNAL)


async def _drain_one(
    runtime: Any, jobs: Any, job: Any, root: Path, progress: str, watch: Any
) -> int:
    """Run one job with the live view and its summary; its exit code."""
    from evolane.campaign import TargetLocked
    from evolane.cli._session import _follow
    from evolane.cli._summary import print_summary
    from evolane.embed import BudgetDamaged
    from evolane.inputs import InputError

    how = "resuming run " + job.run_id if job.run_id else "a new run"
    print(
        f"evolane drain: job {job.job_id} ({job.mode}, {job.records} records, "
        f"{job.failures} failures): {how}"
    )
    try:
        job, handle = await jobs.start(runtime, job)
    except (TargetLocked, BudgetDamaged) as error:  # the job waits its turn
        error_line(f"job {job.job_id}: {error}; it stays pending")
        return EXIT_USAGE
    except InputError as error:
        await jobs.fail(job, error)
        error_line(f"job {job.job_id}: {error}")
        return EXIT_USAGE
    if handle is None:
        print(f"evolane drain: job {job.job_id}: its run had already ended ({job.status})")
        return job.exit_code if job.exit_code is not None else EXIT_OK
    watch.handle, watch.ended = handle, False
    flags = {"store": str(root), "run_id": handle.run_id, "progress": progress}
    outcome = await _follow(handle, flags)
    watch.ended = True
    print_summary(outcome, flags)
    await jobs.finish(job, outcome)
    if outcome is None or outcome.report is None:
        return EXIT_INTERRUPTED
    return outcome.exit_code
