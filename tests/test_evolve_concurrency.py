"""Background evolution with more than one owner in sight: two services on one store, a
drain beside a service, and a job whose ``job.json`` changed after it was listed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import evolane
from evolane.embed import EvolvePolicy, PendingJobs, ServiceSettings, open_evolve_service
from evolane.inputs import InputError
from tests.evolve_helpers import trace_config, trace_record, write_trace_target


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
