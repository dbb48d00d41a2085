"""Replay lanes on Dask when a worker misbehaves: a hung worker never holds a stopped run."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio

pytest.importorskip("distributed")

from evolane.messages import ReplayResult
from tests.test_distributed import cluster_for, evil_lane, remote_units, replay_job, run, wait_for


async def test_a_stop_gives_up_a_unit_whose_worker_hangs(tmp_path: Path) -> None:
    """A SIGSTOPped worker cannot answer the stop: the unit ends cancelled after the kill
    grace plus the remote margin, not at its own deadline (here 600 s) plus the guard."""
    async with cluster_for(tmp_path) as (host, store, cluster):
        (worker_pid,) = cluster.workers.values()
        stop = trio.Event()
        results: list[ReplayResult] = []

        async def replay() -> None:
            job = replay_job(store, tmp_path, timeout=600)
            results.append(await run(cluster, job, evil_lane(tmp_path), stop))

        try:
            with trio.fail_after(120):  # a hang guard: the old code waited 630 s
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(replay)
                    await wait_for(lambda: len(remote_units(host)) >= 30)
                    os.kill(worker_pid, signal.SIGSTOP)
                    stop.set()
        finally:
            os.kill(worker_pid, signal.SIGCONT)
        (result,) = results
        assert result.status == "cancelled" and result.failure is not None
        assert result.failure.code == "cancelled"
        # Resumed, the worker sees its task gone and kills the unit's tree.
        await wait_for(lambda: not remote_units(host), 60)
