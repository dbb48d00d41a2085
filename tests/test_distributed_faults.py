"""Replay lanes on Dask when a worker misbehaves: a hung worker never holds a stopped run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
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


async def test_a_killed_scheduler_ends_its_units_as_cluster_lost(tmp_path: Path) -> None:
    """A `dask scheduler` killed mid-unit: the client gives it up after Dask's reconnect
    timeout and the unit ends as an infrastructure failure, not at its deadline (600 s)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"}
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    scheduler = subprocess.Popen(
        [*dask, "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "distributed.cli.dask_worker", f"tcp://127.0.0.1:{port}"),
            *("--nthreads", "1", "--no-nanny", "--no-dashboard"),
            *("--local-directory", str(tmp_path / "worker")),
        ],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        await wait_for(lambda: _has_worker(port), 60)
        async with cluster_for(tmp_path, f"dask://127.0.0.1:{port}") as (_host, store, cluster):
            results: list[ReplayResult] = []
            lane = evil_lane(tmp_path)

            async def replay() -> None:
                job = replay_job(store, tmp_path, timeout=600)
                results.append(await run(cluster, job, lane))

            with trio.fail_after(120):  # a hang guard: the old code waited 630 s
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(replay)
                    await wait_for(lambda: any(cluster.client.processing().values()), 60)
                    scheduler.kill()
                # The lane's retry (or the next unit) must not wait on the lost scheduler.
                results.append(await run(cluster, replay_job(store, tmp_path, timeout=600), lane))
            for result in results:
                assert result.failure is not None
                failure = (result.failure.owner, result.failure.code)
                assert failure == ("infrastructure", "cluster_lost")
    finally:
        for process in (scheduler, worker):
            process.kill()
            process.wait()


def _has_worker(port: int) -> bool:
    from distributed import Client

    try:
        with Client(f"tcp://127.0.0.1:{port}", timeout=2, set_as_default=False) as client:
            return bool(client.scheduler_info().get("workers"))
    except OSError:
        return False
