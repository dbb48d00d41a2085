"""Replay lanes on Dask distributed: same decisions as local lanes, and no process survives a
killed worker, a remote deadline, a stopped unit or a cancelled driver."""

from __future__ import annotations

import multiprocessing.resource_tracker
import os
import signal
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing

pytest.importorskip("distributed")

from evolane.distributed import ClusterError, DaskCluster, open_cluster, parse_cluster
from evolane.distributed._driver import future_done
from evolane.distributed._protocol import INLINE_BYTES, UnitReport
from evolane.inputs import REPLAY_PLACEHOLDERS, CommandTemplate
from evolane.lanes._replay import LaneSettings
from evolane.messages import ReplayJob, ReplayResult
from evolane.sandbox import SandboxHost, lease_holders, open_sandbox
from evolane.sandbox._lifeline import lease_of
from evolane.store import BlobStore, load_manifest, snapshot_tree
from evolane.testing import EVIL_TREE_SH, LEASE_VARIABLE
from tests.pipeline_helpers import sleeper_bench
from tests.test_pipeline import measure, units

# Dask's worker processes are spawned through multiprocessing, whose resource tracker then
# lives as long as this process: start it now, before any test records its baseline.
multiprocessing.resource_tracker.ensure_running()


def remote_units(host: SandboxHost) -> set[int]:
    """Live processes of units run on this host's Dask workers (their lease nests a worker
    host's lease under the workers' ``<host lease>/dask``)."""
    marker = f"{host.lease}/dask/rt-"
    return {pid for pid in lease_holders(host.lease) if marker in (lease_of(pid) or "")}


async def wait_for(predicate: Any, seconds: float = 40.0) -> None:
    with trio.fail_after(seconds):
        while not predicate():
            await trio.sleep(0.05)


@asynccontextmanager
async def cluster_for(
    tmp_path: Path, text: str = "local:1", **kwargs: Any
) -> AsyncIterator[tuple[SandboxHost, BlobStore, DaskCluster]]:
    store = BlobStore(tmp_path / "store")
    async with (
        open_sandbox(tmp_path / "sandbox", store=store) as host,
        open_cluster(text, host, store, **kwargs) as cluster,
    ):
        assert cluster is not None
        yield host, store, cluster


def replay_job(store: BlobStore, root: Path, unit: str = "u1", timeout: float = 60) -> ReplayJob:
    tree = root / "tree"
    tree.mkdir(exist_ok=True)
    (tree / "prompt.txt").write_text("be brief")
    case = store.put_bytes(orjson.dumps({"id": "c1", "input": 3}), media_type="application/json")
    return ReplayJob(
        unit_id=unit,
        case_id="c1",
        case_ref=case,
        tree_ref=snapshot_tree(store, tree),
        arm="candidate",
        repetition=0,
        seed=7,
        timeout_seconds=timeout,
    )


def lane(command: str) -> LaneSettings:
    template = CommandTemplate.parse(command, role="replay", allowed=REPLAY_PLACEHOLDERS)
    return LaneSettings(template=template, kill_grace=0.3)


def evil_lane(root: Path) -> LaneSettings:
    script = root / "evil.sh"
    script.write_text(EVIL_TREE_SH)
    return lane(f"sh {script}")


async def run(
    cluster: DaskCluster, job: ReplayJob, settings: LaneSettings, stop: trio.Event | None = None
) -> ReplayResult:
    deadline = trio.current_time() + job.timeout_seconds
    stop = trio.Event() if stop is None else stop
    return await cluster.replay(job, 1, deadline, stop, settings)


async def output_of(
    cluster: DaskCluster, store: BlobStore, root: Path, settings: LaneSettings
) -> Any:
    """Run one replay job with ``settings`` (a hang guard, no timing figure), check that it
    succeeded, and return the JSON of its one output file."""
    with trio.fail_after(90):
        result = await run(cluster, replay_job(store, root, timeout=80), settings)
    assert result.status == "succeeded", result
    assert result.output_ref is not None
    (entry,) = load_manifest(store, result.output_ref.digest).values()
    return orjson.loads(store.read_bytes(entry.digest))


def test_cluster_values() -> None:
    assert parse_cluster("local").kind == "local"
    assert parse_cluster("local:3").workers == 3
    assert parse_cluster("dask://10.0.0.5:8786").address == "tcp://10.0.0.5:8786"
    for bad in ("local:0", "local:x", "dask://host", "dask://h:99999", "ray://h:1", ""):
        with pytest.raises(ClusterError):
            parse_cluster(bad)


class _FakeFuture:
    """A Dask future's done-callback contract: callbacks run in another thread once it ends."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []
        self.lock = threading.Lock()
        self.ended = False

    def add_done_callback(self, fn: Any) -> None:
        with self.lock:
            if not self.ended:
                self.callbacks.append(fn)
                return
        threading.Thread(target=fn, args=(self,)).start()

    def end(self) -> None:
        with self.lock:
            self.ended, callbacks = True, list(self.callbacks)
        for fn in callbacks:
            fn(self)


async def test_waiting_for_units_holds_no_thread_of_trio(tmp_path: Path) -> None:
    lanes = 60  # more than trio's 40 default threads
    futures = [_FakeFuture() for _ in range(lanes)]
    futures[0].end()  # an already ended future wakes its waiter too
    woken: list[int] = []

    async def wait(index: int) -> None:
        await future_done(futures[index])
        woken.append(index)

    limiter = trio.to_thread.current_default_thread_limiter()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for index in range(lanes):
                nursery.start_soon(wait, index)
            await wait_for(lambda: woken == [0])
            await trio.testing.wait_all_tasks_blocked()
            assert limiter.borrowed_tokens == 0 and woken == [0]
            # the sandbox's own thread work still runs while every lane waits
            assert await trio.to_thread.run_sync(lambda: "free") == "free"
            ender = threading.Thread(target=lambda: [f.end() for f in futures[1:]])
            ender.start()
            await wait_for(lambda: len(woken) == lanes)
            ender.join()
    assert sorted(woken) == list(range(lanes))


async def test_local_cluster_reaches_the_same_decisions_as_local_lanes(tmp_path: Path) -> None:
    outcomes, remote_peak = [], 0
    for cluster in ("local", "local:2"):
        async with sleeper_bench(
            tmp_path / cluster.replace(":", "-"),
            cases=10,
            spread=1.0,
            replay_concurrency=2,
            cluster=cluster,
            seed=11,
        ) as bench:

            async def sample(host: SandboxHost = bench.host) -> None:
                nonlocal remote_peak
                while True:
                    remote_peak = max(remote_peak, len(remote_units(host)))
                    await trio.sleep(0.02)

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sample)
                    summary = await measure(bench, 0.1, gate=None, name="m")
                    nursery.cancel_scope.cancel()
            outcomes.append(
                (
                    [(r["unit"], r["status"], r["score"]) for r in units(bench, summary)],
                    summary.gate.model_dump(),
                    summary.status,
                )
            )
            # Every output the judges read came home through verified blobs.
            record = units(bench, summary)[0]
            assert load_manifest(bench.store, record["replay"]["output_ref"]["digest"])
    assert outcomes[0] == outcomes[1]
    assert remote_peak >= 1  # the local:2 run really replayed on Dask workers


async def test_a_worker_killed_mid_unit_is_an_infrastructure_failure(tmp_path: Path) -> None:
    async with cluster_for(tmp_path) as (host, store, cluster):
        result: ReplayResult | None = None

        async def replay() -> None:
            nonlocal result
            result = await run(cluster, replay_job(store, tmp_path), evil_lane(tmp_path))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(replay)
                await wait_for(lambda: len(remote_units(host)) >= 30)
                (worker_pid,) = cluster.workers.values()
                os.kill(worker_pid, signal.SIGKILL)
            assert result is not None and result.status == "failed"
            assert result.failure is not None
            assert (result.failure.owner, result.failure.code) == ("infrastructure", "worker_lost")
            # The dead worker's lifeline kills its trees, escapees included.
            await wait_for(lambda: not remote_units(host), 10)


async def test_a_remote_deadline_kill_leaves_no_survivors(tmp_path: Path) -> None:
    async with cluster_for(tmp_path) as (host, store, cluster):
        with trio.fail_after(60):  # a hang guard: the deadline, not the tree's 1000 s sleeps
            job = replay_job(store, tmp_path, timeout=2.0)
            result = await run(cluster, job, evil_lane(tmp_path))
        assert result.status == "timed_out" and result.failure is not None
        assert (result.failure.owner, result.failure.code) == ("infrastructure", "timeout")
        assert remote_units(host) == set()  # gone before the result came back


async def test_a_stopped_unit_is_killed_on_its_worker_and_reports_cancelled(
    tmp_path: Path,
) -> None:
    async with cluster_for(tmp_path) as (host, store, cluster):
        stop = trio.Event()
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                results: list[ReplayResult] = []

                async def replay() -> None:
                    results.append(
                        await run(cluster, replay_job(store, tmp_path), evil_lane(tmp_path), stop)
                    )

                nursery.start_soon(replay)
                await wait_for(lambda: len(remote_units(host)) >= 30)
                # The running unit holds none of trio's threads (the sandbox needs them).
                assert trio.to_thread.current_default_thread_limiter().borrowed_tokens == 0
                stop.set()
        assert results[0].status == "cancelled"
        assert remote_units(host) == set()


async def test_a_driver_cancelled_mid_run_leaves_nothing_on_the_workers(tmp_path: Path) -> None:
    async with sleeper_bench(
        tmp_path, cases=8, median=30, replay_concurrency=2, cluster="local:2"
    ) as bench:
        with trio.move_on_after(60) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(measure, bench, 0.1, None, "m")
                await wait_for(lambda: len(remote_units(bench.host)) >= 2)
                nursery.cancel_scope.cancel()
        assert not scope.cancelled_caught
        assert remote_units(bench.host) == set()  # killed before the cancellation returned


async def test_without_a_shared_store_inputs_travel_and_results_come_back_inline(
    tmp_path: Path,
) -> None:
    big = INLINE_BYTES * 3
    command = (
        'sh -c \'cat "$1" > "$2/output.json"; head -c '
        f'{big} /dev/zero > "$2/big.bin"; cat "$3/prompt.txt"\' replay '
        "{case_file} {output_dir} {candidate}"
    )
    for share in (False, True):
        async with cluster_for(tmp_path / str(share), share_store=share) as (_host, store, cluster):
            assert cluster.shared is share
            with trio.fail_after(60):
                result = await run(cluster, replay_job(store, tmp_path / str(share)), lane(command))
            assert result.status == "succeeded", result.failure
            assert result.output_ref is not None and result.stdout_ref is not None
            tree = load_manifest(store, result.output_ref)
            assert orjson.loads(store.read_bytes(tree["output.json"].ref)) == {
                "id": "c1",
                "input": 3,
            }  # type: ignore[union-attr]
            assert store.read_bytes(tree["big.bin"].ref) == bytes(big)  # type: ignore[union-attr]
            assert store.read_bytes(result.stdout_ref) == b"be brief"
        assert not (tmp_path / str(share) / "store" / "dask").exists()  # staging removed


def test_a_tampered_result_never_enters_the_store(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "store")
    honest = BlobStore(tmp_path / "honest")
    out = tmp_path / "out"
    out.mkdir()
    (out / "output.json").write_text('"yes"')
    tree = snapshot_tree(honest, out)
    (file_ref,) = [e.ref for e in load_manifest(honest, tree).values()]  # type: ignore[union-attr]
    result = ReplayResult(
        unit_id="u", case_id="c", arm="baseline", repetition=0, status="succeeded", output_ref=tree
    )
    inline = {tree.digest: honest.read_bytes(tree), file_ref.digest: b'"no!"'}
    cluster = DaskCluster(parse_cluster("local:1"), store, None, None, shared=False)
    checked = cluster._ingest(UnitReport(result, inline, {}, "w1"), None)
    assert checked.status == "failed" and checked.failure is not None
    assert checked.failure.code == "bad_result" and checked.output_ref is None
    assert checked.failure.owner == "infrastructure"
    assert not store.has(file_ref) and not store.has(tree)


async def test_an_existing_scheduler_must_not_rerun_units(tmp_path: Path) -> None:
    from distributed import LocalCluster

    def start() -> Any:
        return LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            scheduler_kwargs={"allowed_failures": 0},
            local_directory=str(tmp_path / "external"),
        )

    external = await trio.to_thread.run_sync(start)
    try:
        address = "dask://" + external.scheduler_address.removeprefix("tcp://")
        async with cluster_for(tmp_path, address) as (_host, store, cluster):
            assert cluster.owned is None and cluster.shared  # the probe saw the same store
            with trio.fail_after(60):
                result = await run(cluster, replay_job(store, tmp_path), lane("echo '\"ok\"'"))
            assert result.status == "succeeded"
        external.scheduler.allowed_failures = 3
        with pytest.raises(ClusterError, match="ALLOWED_FAILURES=0"):
            async with cluster_for(tmp_path / "again", address):
                pass
    finally:
        await trio.to_thread.run_sync(external.close)


def test_the_cli_runs_a_campaign_on_a_local_cluster_with_the_same_decisions(
    tmp_path: Path,
) -> None:
    import json
    import subprocess
    import sys

    from tests.campaign_helpers import toy_flags, write_toy
    from tests.test_cli_optimize import PLAN

    paths = write_toy(tmp_path, PLAN)
    reports = []
    for cluster in ("local", "local:2"):
        store = tmp_path / cluster.replace(":", "-")
        flags = [*toy_flags(paths, store), "--cluster", cluster]
        done = subprocess.run(
            [sys.executable, "-m", "evolane", "optimize", *flags],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
        (run_dir,) = (store / "runs").iterdir()
        reports.append(json.loads((run_dir / "report.json").read_text()))
    assert reports[1]["config"]["cluster"] == "local:2"
    for key in ("decisions", "scores", "selected", "status"):
        assert reports[0][key] == reports[1][key], key
    bad = subprocess.run(
        [sys.executable, "-m", "evolane", "optimize", *toy_flags(paths, tmp_path / "s"),
         "--cluster", "local:0"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "local:N" in bad.stderr


DRIVER = """
import sys
import trio
from pathlib import Path

sys.path.insert(0, {repo!r})
from tests.test_distributed import cluster_for, evil_lane, replay_job, run


async def main(root: Path) -> None:
    async with cluster_for(root) as (_host, store, cluster):
        await run(cluster, replay_job(store, root), evil_lane(root))


if __name__ == "__main__":
    trio.run(main, Path(sys.argv[1]))
"""


async def test_a_killed_driver_leaves_no_process_behind(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(repo=str(Path(__file__).resolve().parent.parent)))

    def remote() -> set[int]:  # found by lease, wherever the orphans were reparented
        session = os.environ[LEASE_VARIABLE]
        return {p for p in lease_holders(session) if "/dask/rt-" in (lease_of(p) or "")}

    driver = subprocess.Popen([sys.executable, str(script), str(tmp_path)])
    try:
        await wait_for(lambda: len(remote()) >= 30, 60)
        driver.kill()  # SIGKILL: no cleanup code of the driver runs
        driver.wait()
        await wait_for(lambda: not remote(), 15)
    finally:
        driver.kill()
        driver.wait()


def test_the_outbox_keeps_small_blobs_inline_and_stages_the_rest(tmp_path: Path) -> None:
    from evolane.distributed._outbox import Outbox, ResultTooLarge

    box = Outbox(tmp_path / "staging", inline_bytes=1024, inline_total=4096)
    small, large = box.put_bytes(b"x" * 100), box.put_bytes(b"y" * 5000)
    assert small.digest in box.inline and large.digest in box.staged
    assert BlobStore(tmp_path / "staging").read_bytes(large) == b"y" * 5000
    for index in range(50):  # past the inline total, small blobs are staged as well
        box.put_bytes(bytes([index]) * 1000)
    assert sum(len(data) for data in box.inline.values()) <= 4096
    assert len(box.inline) + len(box.staged) == 52
    private = Outbox(None, inline_bytes=1024, inline_total=4096)
    assert private.put_bytes(b"z" * 3000).digest in private.inline  # no staging: all inline
    with pytest.raises(ResultTooLarge):
        private.put_bytes(b"z" * 2000)


ATTACK = """
import asyncio, json, os, ssl, sys
from distributed import Client
from distributed.core import rpc
from distributed.security import Security

address, out = sys.argv[1], sys.argv[2]
plain = address.replace("tls://", "tcp://")
no_check = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
no_check.check_hostname, no_check.verify_mode = False, ssl.CERT_NONE


async def identity(args):
    remote = rpc(address, timeout=3, connection_args=args)
    try:
        return await asyncio.wait_for(remote.identity(), 5)
    finally:
        await remote.close_rpc()


tries = {
    "plain": lambda: Client(plain, timeout=3, set_as_default=False).run(os.getuid),
    "own certificate": lambda: Client(
        address, timeout=3, security=Security.temporary(), set_as_default=False
    ).run(os.getuid),
    "no certificate": lambda: asyncio.run(
        identity({"ssl_context": no_check, "require_encryption": True})
    ),
}
results = {}
for name, attempt in tries.items():
    try:
        results[name] = "reached: " + repr(attempt())[:80]
    except Exception as error:
        results[name] = "refused: " + type(error).__name__
json.dump(results, open(os.path.join(out, "output.json"), "w"))
"""


async def test_a_replay_cannot_reach_the_local_clusters_scheduler(tmp_path: Path) -> None:
    # A plain tcp:// scheduler on 127.0.0.1 ran any function a replay sent it, as evolane's
    # user, outside every sandbox (found by review). Given the address outright, a replay
    # reaches it neither in the clear, nor over TLS with a key of its own or none at all.
    import sys

    (tmp_path / "attack.py").write_text(ATTACK)
    async with cluster_for(tmp_path, "local:1") as (_host, store, cluster):
        address = cluster.owned.scheduler_address
        assert address.startswith("tls://")
        settings = lane(f"{sys.executable} {tmp_path / 'attack.py'} {address} {{output_dir}}")
        tried = await output_of(cluster, store, tmp_path, settings)
    assert sorted(tried) == ["no certificate", "own certificate", "plain"]
    assert all(outcome.startswith("refused") for outcome in tried.values()), tried


async def test_a_local_cluster_leaves_dasks_dashboard_port_alone(tmp_path: Path) -> None:
    # Found in two test workers: the scheduler's HTTP server (no routes) took 8787, Dask's
    # dashboard port, and warned on stderr when another cluster had it ("Port 8787 is
    # already in use"): it now takes a free loopback port, as the workers' do.
    import warnings

    import psutil

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with cluster_for(tmp_path, "local:1"):
            me = psutil.Process()
            listening = [
                connection.laddr
                for process in (me, *me.children(recursive=True))
                for connection in process.net_connections(kind="tcp")
                if connection.status == psutil.CONN_LISTEN
            ]
    assert listening and all(address.ip == "127.0.0.1" for address in listening), listening
    assert 8787 not in {address.port for address in listening}, listening
    assert not [w for w in caught if "8787" in str(w.message)]
