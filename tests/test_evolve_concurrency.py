"""Background evolution with more than one owner in sight: two services on one store, a
drain beside a service, and a job whose ``job.json`` changed after it was listed."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

import evolane
from evolane.embed import (
    Backends,
    EvolvePolicy,
    PendingJob,
    PendingJobs,
    ServiceSettings,
    open_evolve_service,
)
from evolane.embed._pending import RecordQueue, StoreDirs
from evolane.embed._service import trajectory_config
from evolane.inputs import InputError
from tests.evolve_helpers import (
    agent_report,
    backend_config,
    fix_backend,
    judge_backend,
    replay_backend,
    trace_config,
    trace_record,
    until,
    write_trace_target,
)

BACKENDS = Backends(replay=replay_backend, judge=judge_backend, optimizer=fix_backend)


async def test_a_second_service_on_the_same_store_is_refused_and_no_record_is_lost(
    tmp_path: Path,
) -> None:
    """Two services numbering records alike would replace each other's queue files and take
    each other's records: the second is refused while the first holds the queue, and may
    open it once the first has closed."""
    paths = write_trace_target(tmp_path, 8)
    settings = ServiceSettings(policy=EvolvePolicy(every=None), run_jobs=False)
    async with evolane.open_runtime(store=paths["store"]) as runtime:
        async with open_evolve_service(runtime, trace_config(paths), settings) as first:
            with pytest.raises(InputError, match="open in another service"):
                async with open_evolve_service(runtime, trace_config(paths), settings):
                    pass
            for index in range(4):
                await first.record(trace_record(index))
        async with open_evolve_service(runtime, trace_config(paths), settings) as second:
            for index in range(4, 8):
                await second.record(trace_record(index))
            assert second.queued == 8
            job = await second.flush()
    assert job is not None and job.records == 8
    assert os.listdir(paths["store"] / "evolve" / "queue") == []
    lines = (paths["store"] / "pending" / job.job_id / "trajectories.jsonl").read_text()
    assert sorted(line.split('"id":"')[1][:4] for line in lines.splitlines()) == [
        f"t{index:03d}" for index in range(8)
    ]
    assert [j.job_id for j in PendingJobs(paths["store"]).list()] == [job.job_id]


def _one_pending_job(paths: dict[str, Path]) -> PendingJob:
    """A store with one pending job of 24 records (as a service leaves it)."""
    queue = RecordQueue.open(StoreDirs(paths["store"]), 24)
    try:
        for index in range(24):
            record = trace_record(index)
            queue.append(json.dumps(record).encode() + b"\n", index % 4 == 0)
        config = backend_config(paths)
        return queue.take("shadow", lambda path: trajectory_config(config, path), 24)
    finally:
        queue.close()


async def test_a_job_listed_before_another_process_started_it_resumes_that_run(
    tmp_path: Path,
) -> None:
    """``evolane drain`` lists the jobs once, then runs them one by one: a job another
    process started after the listing (and left half run: it died, or its service closed)
    is run as its ``job.json`` says under the lock, resuming that run; the listed copy
    (no run yet) would start it over and pay again for what that run had done."""
    paths = write_trace_target(tmp_path, 24)
    _one_pending_job(paths)
    jobs = PendingJobs(paths["store"])
    (listed,) = jobs.list()  # the drain's list, taken before the other process began
    assert listed.run_id is None
    async with evolane.open_runtime(store=paths["store"]) as runtime:
        with jobs.lock(listed) as held:  # the other process: starts the job, then leaves
            assert held is not None
            _, handle = await jobs.start(runtime, held, backends=BACKENDS)
            assert handle is not None
            await handle._cancel_and_wait()
        assert [job.run_id for job in jobs.list()] == [handle.run_id]
        with jobs.lock(listed) as current:  # the drain reaches the job it listed
            assert current is not None and current.run_id == handle.run_id
            resumed, again = await jobs.start(runtime, current, backends=BACKENDS)
            assert again is not None and again.run_id == handle.run_id
            await jobs.finish(resumed, await again.result())
    assert jobs.list() == []
    runs = os.listdir(paths["store"] / "runs")
    assert runs == [handle.run_id]  # one run, resumed: not a second one paid from scratch


FULL_DISK_AGENT = textwrap.dedent(
    """
    import json, resource, signal, sys
    import trio
    import evolane
    from evolane.embed import EvolvePolicy, ServiceSettings, open_evolve_service
    from tests.evolve_helpers import trace_config, trace_record, write_trace_target

    paths = write_trace_target(__import__("pathlib").Path(sys.argv[1]), 8)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a refused write is EFBIG, as ENOSPC
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)

    async def main():
        policy = EvolvePolicy(every=9)
        settings = ServiceSettings(policy=policy, run_jobs=False, retry_interval=0.05)
        async with evolane.open_runtime(store=paths["store"]) as runtime:
            async with open_evolve_service(runtime, trace_config(paths), settings) as evolve:
                for index in range(8):
                    record = {**trace_record(index), "metadata": {"pad": "x" * 40_000}}
                    await evolve.record(record)
                resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, hard))  # the disk fills
                await evolve.record(trace_record(8))  # the agent's next task: the job is due
                while not evolve.faults:
                    await trio.sleep(0.01)
                queued, pending = evolve.queued, len(evolve.pending())
                folders = sorted(p.name for p in (paths["store"] / "pending").iterdir())
                resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # room again
                with trio.move_on_after(60):  # the job is made, then its records leave
                    while not evolve.pending() or evolve.queued:
                        await trio.sleep(0.01)
                print(json.dumps({
                    "fault": evolve.faults[0], "queued": queued, "pending": pending,
                    "folders": folders, "jobs": [job.records for job in evolve.pending()],
                    "left": evolve.queued,
                }))

    trio.run(main)
    """
)


def test_a_job_the_disk_refuses_is_a_fault_retried_and_the_agent_goes_on(
    tmp_path: Path,
) -> None:
    """The job maker's write fails (the disk refuses it: a file size limit here) while the
    agent works: the agent's ``async with`` goes on (it ended with the OSError before), the
    failure is listed in ``faults``, the records stay queued and no half-written job folder
    is left; once there is room the job is made with every record."""
    seen = agent_report(FULL_DISK_AGENT, str(tmp_path))
    assert seen["fault"].startswith("making a job: ") and "File too large" in seen["fault"]
    assert (seen["queued"], seen["pending"], seen["folders"]) == (9, 0, [])
    assert seen["jobs"] == [9] and seen["left"] == 0


async def test_a_job_whose_target_another_run_holds_stays_pending_until_it_is_free(
    tmp_path: Path,
) -> None:
    """Another run holds the target (another agent's service with its own store, a
    command-line run): the job is a fault retried later, not retired as failed with its
    records never measured (found by review: two agent processes on one skill folder)."""
    from evolane.campaign._lock import lock_target

    paths = write_trace_target(tmp_path, 8)
    other = lock_target(paths["target"], "r-other-run")  # a real flock, as a run holds it
    settings = ServiceSettings(policy=EvolvePolicy(every=None), retry_interval=0.2)
    try:
        async with (
            evolane.open_runtime(store=paths["store"]) as runtime,
            open_evolve_service(
                runtime, backend_config(paths), settings, backends=BACKENDS
            ) as service,
        ):
            for index in range(8):
                await service.record(trace_record(index))
            await service.flush()
            with pytest.warns(RuntimeWarning, match="locked by run r-other-run"):
                await until(lambda: bool(service.faults or service.finished))
                assert service.finished == [] and "r-other-run" in service.faults[-1]
            assert [job.state for job in PendingJobs(paths["store"]).list()] == ["pending"]
            other.release()
            await until(lambda: len(service.finished) == 1)
    finally:
        other.release()
    assert service.finished[0].state == "done"
    assert PendingJobs(paths["store"]).list() == []
