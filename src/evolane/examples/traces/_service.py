"""The traces example's agent with background evolution: an `EvolveService` in the agent's
own trio loop records each task; the agent reads the skill afresh at each task."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import trio

from evolane.embed import (
    EvolvePolicy,
    PendingJob,
    ServiceSettings,
    open_evolve_service,
    open_runtime,
)
from evolane.examples.traces._agent import task_record
from evolane.examples.traces._workspace import campaign_settings

JOBS_TIMEOUT = 1800.0
"""How long the example waits for its background jobs at the end."""


async def run_with_service(directory: Path, args: argparse.Namespace) -> int:
    """Run ``args.tasks`` live tasks, recording each; then let the jobs finish and report."""
    settings = campaign_settings(directory)
    if args.iterations is not None:
        settings["iterations"] = args.iterations
    service_settings = job_settings(args.evolve, args.every)
    target = directory / "target"
    failures = 0
    async with (
        open_runtime(store=settings["store"]) as runtime,
        open_evolve_service(runtime, settings, service_settings) as service,
    ):
        for index in range(args.first, args.first + args.tasks):
            record = await trio.to_thread.run_sync(task_record, target, index)
            failures += record["outcome"]["status"] == "failure"
            await service.record(record)
            await trio.sleep(0)  # the agent's next task
        await service.flush()
        with trio.move_on_after(JOBS_TIMEOUT):
            while service.pending() or service.running is not None:
                await trio.sleep(0.5)
        jobs = list(service.finished)
    print(f"{args.tasks} tasks, {failures} failures recorded ({args.evolve})")
    for job in jobs:
        print(
            f"job {job.job_id}: {job.records} records, run {job.run_id}: {job.status}; "
            f"{_target_line(Path(settings['store']), job)}"
        )
    return 0 if jobs and all(job.state == "done" for job in jobs) else 1


def job_settings(mode: str, every: int) -> ServiceSettings:
    """The service's settings: a job of ``every`` records each time that many are queued.
    A job takes at most ``max_job_records``: found by review, records that came while a
    job was being made went into it (25 and 15 of 40 for ``--every 20``), and the second
    job, too small for its gate, failed (and the agent exited 1)."""
    return ServiceSettings(
        mode=mode,  # type: ignore[arg-type]
        policy=EvolvePolicy(every=every),
        max_job_records=every,
        max_queue=max(every, ServiceSettings().max_queue),
    )


def _target_line(store: Path, job: PendingJob) -> str:
    """What the job did to the target, as its run's report says (found by review: an online
    job printed only ``finished``, whether its best was published or not)."""
    try:
        report = json.loads((store / "runs" / str(job.run_id) / "report.json").read_text())
    except (OSError, ValueError):
        return "target unchanged (no report)"
    apply = report.get("apply") or {}
    if apply.get("status") == "applied":
        return "target: the best candidate published"
    if apply:
        return f"target unchanged ({apply.get('status')}: {apply.get('message', '')})"
    return "target unchanged (no candidate accepted)"
