"""`EvolveService`: the durable queue, the policy, pending jobs, and background runs in
shadow and online mode (issue 21, item 2)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import evolane
from evolane.embed import (
    EvolvePolicy,
    PendingJobs,
    QueueFull,
    ServiceSettings,
    open_evolve_service,
)
from evolane.inputs import InputError
from tests.evolve_helpers import (
    trace_config,
    trace_record,
    write_trace_target,
)


def tree_digest(root: Path) -> str:
    """One digest of every file's path and bytes under ``root``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


# the policy: pure


@given(
    queued=st.integers(0, 500),
    failed=st.integers(0, 500),
    since=st.floats(0, 1e5),
    every=st.none() | st.integers(1, 100),
    failures=st.none() | st.integers(1, 100),
    interval=st.none() | st.floats(1, 1e4),
)
def test_the_policy_is_due_exactly_when_one_of_its_triggers_holds(
    queued: int,
    failed: int,
    since: float,
    every: int | None,
    failures: int | None,
    interval: float | None,
) -> None:
    failed = min(failed, queued)
    policy = EvolvePolicy(every=every, failures=failures, interval=interval)
    expected = queued > 0 and (
        (every is not None and queued >= every)
        or (failures is not None and failed >= failures)
        or (interval is not None and since >= interval)
    )
    assert policy.due(queued, failed, since) == expected


def test_settings_refuse_a_job_larger_than_the_queue() -> None:
    with pytest.raises(ValueError, match="max_job_records"):
        ServiceSettings(max_queue=10, max_job_records=11)


# the queue and the jobs


async def test_a_full_queue_refuses_the_record_and_counts_it(tmp_path: Path) -> None:
    paths = write_trace_target(tmp_path, 8)
    policy = EvolvePolicy(every=None)
    settings = ServiceSettings(max_queue=3, max_job_records=3, policy=policy, run_jobs=False)
    async with (
        evolane.open_runtime(store=paths["store"]) as runtime,
        open_evolve_service(runtime, trace_config(paths), settings) as service,
    ):
        for index in range(3):
            await service.record(trace_record(index))
        with pytest.raises(QueueFull):
            await service.record(trace_record(3))
        assert (service.recorded, service.refused, service.queued) == (3, 1, 3)
        kept = sorted(os.listdir(paths["store"] / "evolve" / "queue"))
        assert len(kept) == 3  # the refused record was not written
        await service.flush()  # room again
        await service.record(trace_record(4))
        assert service.queued == 1


async def test_a_record_that_is_no_trajectory_record_is_bad_input(tmp_path: Path) -> None:
    paths = write_trace_target(tmp_path, 2)
    async with (
        evolane.open_runtime(store=paths["store"]) as runtime,
        open_evolve_service(runtime, trace_config(paths)) as service,
    ):
        with pytest.raises(InputError, match="not a trajectory record"):
            await service.record(["not", "an", "object"])
        with pytest.raises(InputError, match=r"not a trajectory record \(outcome"):
            await service.record({**trace_record(0), "outcome": {"status": "meh"}})
        assert service.queued == 0


@pytest.mark.parametrize(
    ("policy", "records", "jobs"),
    [
        (EvolvePolicy(every=4), 9, 2),  # at 4 and at 8
        (EvolvePolicy(every=None, failures=2), 9, 1),  # failures are records 0, 4, 8: at 4
        (EvolvePolicy(every=None), 9, 0),  # only flush makes jobs
    ],
)
async def test_the_policy_turns_queued_records_into_pending_jobs(
    tmp_path: Path, policy: EvolvePolicy, records: int, jobs: int
) -> None:
    paths = write_trace_target(tmp_path, records)
    settings = ServiceSettings(policy=policy, max_pending_jobs=100, run_jobs=False)
    made = []
    async with (
        evolane.open_runtime(store=paths["store"]) as runtime,
        open_evolve_service(runtime, trace_config(paths), settings) as service,
    ):
        for index in range(records):
            await service.record(trace_record(index, failed=index % 4 == 0))
            await _settle(service)
        made = PendingJobs(paths["store"]).list()
    assert len(made) == jobs
    assert [job.records for job in made] == [4] * jobs if policy.every else True
    taken = sum(job.records for job in made)
    queue = os.listdir(paths["store"] / "evolve" / "queue")
    assert taken + len(queue) == records  # nothing lost, nothing doubled
    for job in made:
        lines = (paths["store"] / "pending" / job.job_id / "trajectories.jsonl").read_text()
        assert len(lines.splitlines()) == job.records


async def _settle(service: Any) -> None:
    """Let the job maker act on the last record (it runs on each record's wake-up)."""
    for _ in range(20):
        await trio.sleep(0.01)
        if not service._wake.is_set():
            return


async def test_a_crash_between_job_and_queue_removal_neither_loses_nor_doubles(
    tmp_path: Path,
) -> None:
    """A job file is durable before its records leave the queue: a reopened queue drops the
    records a job already took, and an uncommitted job folder is removed."""
    paths = write_trace_target(tmp_path, 6)
    settings = ServiceSettings(policy=EvolvePolicy(every=None), run_jobs=False)
    async with (
        evolane.open_runtime(store=paths["store"]) as runtime,
        open_evolve_service(runtime, trace_config(paths), settings) as service,
    ):
        for index in range(6):
            await service.record(trace_record(index))
        queue_dir = paths["store"] / "evolve" / "queue"
        saved = {name: (queue_dir / name).read_bytes() for name in os.listdir(queue_dir)}
        job = await service.flush()
    assert job is not None and job.records == 6
    for name, data in saved.items():  # the crash: the records were not removed yet
        (queue_dir / name).write_bytes(data)
    (paths["store"] / "pending" / "job-0000000000000-broken").mkdir()  # never committed
    async with (
        evolane.open_runtime(store=paths["store"]) as runtime,
        open_evolve_service(runtime, trace_config(paths), settings) as service,
    ):
        assert service.queued == 0
        assert [j.job_id for j in service.pending()] == [job.job_id]
    assert not (paths["store"] / "pending" / "job-0000000000000-broken").exists()


async def test_a_store_that_is_a_file_is_bad_input(tmp_path: Path) -> None:
    paths = write_trace_target(tmp_path, 1)
    store = tmp_path / "file"
    store.write_text("x")
    async with evolane.open_runtime(store=store) as runtime:
        with pytest.raises(InputError, match="not a directory"):
            async with open_evolve_service(runtime, trace_config(paths)):
                pass
