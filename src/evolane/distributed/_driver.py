"""The driver side: a Dask client (and the LocalCluster it owns), one remote task per unit.

The client's own event loop runs in its thread. A task's end wakes trio through the
future's done callback, so a running unit holds no thread (trio's default thread limiter
is shared by the whole process, sandbox included); what then waits on the client (a
result's transfer, ``Client.run``, scatter, close) runs through ``trio.to_thread``;
``submit`` only queues a message, so it is called from trio directly. A unit's task is
submitted with retries off, on a scheduler that allows no failures: a worker lost
mid-unit is an infrastructure failure of the unit, never a silent re-run. What comes back
is verified blob by blob before anything enters the store.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

from evolane.distributed._futures import answer_of, cancel_quietly, future_done, lost_scheduler
from evolane.distributed._local import local_cluster
from evolane.distributed._protocol import (
    INLINE_TOTAL,
    PRIVATE_RESULT_BYTES,
    UnitReport,
    UnitRequest,
)
from evolane.distributed._spec import EXTRA_HINT, ClusterError, ClusterSpec, check_cluster
from evolane.distributed._worker import run_unit, sees_store, stop_unit, warm_up
from evolane.lanes import LaneSettings
from evolane.messages import ArtifactRef, FailureEvent, ReplayJob, ReplayResult
from evolane.sandbox import SandboxHost, child_lease
from evolane.store import (
    BlobStore,
    CorruptBlobError,
    FileEntry,
    StoreError,
    TreeManifest,
    load_manifest,
    remove_tree,
)

GUARD_SECONDS = 30.0
"""How long past a unit's deadline (plus kill grace) the driver waits before giving it up."""
_BUNDLES = 64
_CONNECT_SECONDS = 10.0
_WATCH_SECONDS = 0.5
REMOTE_KILL_MARGIN = 10.0
"""Seconds past the kill grace a worker may take to report a stopped unit's tree gone (the
request crosses the Dask scheduler both ways)."""
CANCEL_WAIT = 5.0
"""Seconds to wait for Dask to drop a stopped unit's future (its tree is already gone)."""
CLOSE_TIMEOUT = 10.0
"""Seconds the client, then an owned LocalCluster, get to close."""


class DaskCluster:
    """Replay lanes' handle on a Dask cluster: runs units remotely and brings results home."""

    def __init__(
        self, spec: ClusterSpec, store: BlobStore, client: Any, owned: Any, shared: bool
    ) -> None:
        self.spec, self.store, self.client, self.owned = spec, store, client, owned
        self.shared = shared
        self.root = store.root.resolve()
        self.probe = secrets.token_hex(8)
        self.scratch = self.root / "dask" / self.probe  # staging for large results, the probe
        self.directory: Path | None = None  # the owned LocalCluster's local directory
        self.start_seconds = 0.0
        self.workers: dict[str, int] = {}
        self._bundles: OrderedDict[str, Any] = OrderedDict()
        self._bundle_lock = trio.Lock()

    # ----- one unit -------------------------------------------------------------------------

    async def replay(
        self, job: ReplayJob, attempt: int, deadline: float, stop: trio.Event, lane: LaneSettings
    ) -> ReplayResult:
        """Run one attempt of ``job`` on the cluster; cancelling kills its remote tree first."""
        assert lane.template is not None
        key = f"evolane-{job.unit_id}-{attempt}-{secrets.token_hex(4)}"
        remaining = max(0.0, deadline - trio.current_time())
        staging = self.scratch / "staging" / key if self.shared else None
        request = UnitRequest(
            key=key,
            job=job,
            attempt=attempt,
            settings=replace(lane, backend=None),  # a worker runs the command, never a backend
            deadline_epoch=time.time() + remaining,
            shared=self.shared,
            store_root=str(self.root),
            staging=str(staging) if staging is not None else None,
            inline_total=INLINE_TOTAL if self.shared else PRIVATE_RESULT_BYTES,
        )
        if self.lost():
            return _failed(job, lost_scheduler())
        bundles = [] if self.shared else await self._inputs(job, lane.workspace_seed)
        future = self.client.submit(run_unit, request, *bundles, key=key, pure=False, retries=0)
        try:
            return await self._wait(future, job, key, stop, remaining, lane.kill_grace, staging)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._abort(future, key, lane.kill_grace, staging)
            raise

    async def _wait(
        self,
        future: Any,
        job: ReplayJob,
        key: str,
        stop: trio.Event,
        remaining: float,
        grace: float,
        staging: Path | None,
    ) -> ReplayResult:
        result: ReplayResult | None = None
        with trio.move_on_after(remaining + grace + GUARD_SECONDS):
            ended = False
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._forward_stop, stop, key, grace, nursery.cancel_scope)
                nursery.start_soon(self._watch_client, nursery.cancel_scope)
                await future_done(future)  # no thread is held while the unit runs
                ended = True
                nursery.cancel_scope.cancel()
            if ended:  # a result on its way is fetched even when the stop's patience runs out
                result = await trio.to_thread.run_sync(
                    self._settle, future, job, staging, abandon_on_cancel=True
                )
        if result is not None:
            return result
        if self.lost() or stop.is_set():  # no scheduler, or a worker that never answered
            with trio.CancelScope(shield=True):  # asking it again would wait as long
                await self._drop(future, staging)
        if self.lost():
            return _failed(job, lost_scheduler())
        if stop.is_set():
            failure = FailureEvent(
                owner="framework",
                stage="replay",
                code="cancelled",
                message="stopped; its worker did not confirm the kill "
                f"{grace + REMOTE_KILL_MARGIN:.0f}s later",
            )
            return ReplayResult.without_output(job, "cancelled", failure)
        with trio.CancelScope(shield=True):
            await self._abort(future, key, 1.0, staging)
        failure = FailureEvent(
            owner="infrastructure",
            stage="replay",
            code="cluster_timeout",
            message=f"no answer from the cluster {GUARD_SECONDS:.0f}s past the deadline",
            repairable=True,
        )
        return _failed(job, failure)

    def _settle(self, future: Any, job: ReplayJob, staging: Path | None) -> ReplayResult:
        """In one thread, once the task has ended: fetch, verify and store what it made,
        drop its staging."""
        try:
            answer = answer_of(future, staging)
            if isinstance(answer, FailureEvent):  # Dask cancels what a lost client waited on
                return _failed(job, lost_scheduler() if self.lost() else answer)
            return self._ingest(answer, staging)
        finally:
            if staging is not None:
                remove_tree(staging)

    async def _forward_stop(
        self, stop: trio.Event, key: str, grace: float, give_up: trio.CancelScope
    ) -> None:
        """A stopped unit is killed on its worker and still reports (as cancelled); one
        whose worker does not answer within the kill grace plus `REMOTE_KILL_MARGIN` (a
        hung or cut-off worker) is given up, so a stop (Ctrl-C, the wall clock, an early
        stop) never waits for the unit's own deadline (found by review: a SIGSTOPped
        worker held a Ctrl-C'd run for --replay-timeout plus 30 s)."""
        await stop.wait()
        with trio.move_on_after(grace + REMOTE_KILL_MARGIN):
            await trio.to_thread.run_sync(self._stop_remote, key, 0.0, abandon_on_cancel=True)
            await trio.sleep_forever()  # the unit's report ends this wait first
        give_up.cancel()

    def lost(self) -> bool:
        """True once the client has lost its scheduler (killed, or unreachable: Dask
        cancels every future then, and closes the client past its reconnect timeout)."""
        return self.client.status != "running"

    async def _watch_client(self, give_up: trio.CancelScope) -> None:
        """Give a unit up when the scheduler is lost (found by review: a killed scheduler
        held the run for --replay-timeout plus 30 s, its lanes waiting on dead futures)."""
        while not self.lost():
            await trio.sleep(_WATCH_SECONDS)
        give_up.cancel()

    def _stop_remote(self, key: str, wait_seconds: float) -> dict[str, Any]:
        return self.client.run(stop_unit, key, wait_seconds, on_error="return")  # type: ignore[no-any-return]

    async def _abort(self, future: Any, key: str, grace: float, staging: Path | None) -> None:
        """Kill the unit wherever it runs, wait (bounded) until its tree is gone, drop it."""
        with trio.move_on_after(grace + REMOTE_KILL_MARGIN + CANCEL_WAIT):
            await trio.to_thread.run_sync(
                self._stop_remote, key, grace + REMOTE_KILL_MARGIN, abandon_on_cancel=True
            )
        await self._drop(future, staging)

    async def _drop(self, future: Any, staging: Path | None) -> None:
        """Have Dask forget the unit's task (bounded) and remove its staging folder."""
        with trio.move_on_after(CANCEL_WAIT):
            await trio.to_thread.run_sync(cancel_quietly, future, abandon_on_cancel=True)
        if staging is not None:
            await trio.to_thread.run_sync(remove_tree, staging)

    # ----- inputs without a shared store ----------------------------------------------------

    async def _inputs(self, job: ReplayJob, seed: ArtifactRef | None) -> list[Any]:
        case = await trio.to_thread.run_sync(self.store.read_bytes, job.case_ref)
        bundles: list[Any] = [{job.case_ref.digest: case}]
        for tree in (job.tree_ref, seed):
            if tree is not None:
                bundles.append(await self._tree_bundle(tree))
        return bundles

    async def _tree_bundle(self, tree: ArtifactRef) -> Any:
        """A tree's blobs scattered to the cluster once, each under its digest as its Dask
        key (trees sharing files share them); Dask moves them to the workers that need them."""
        async with self._bundle_lock:
            future = self._bundles.get(tree.digest)
            if future is None:
                bundle = await trio.to_thread.run_sync(_tree_blobs, self.store, tree)
                future = await trio.to_thread.run_sync(
                    lambda: self.client.scatter(bundle, hash=False)
                )
                self._bundles[tree.digest] = future
                while len(self._bundles) > _BUNDLES:
                    self._bundles.popitem(last=False)
            self._bundles.move_to_end(tree.digest)
            return future

    # ----- results --------------------------------------------------------------------------

    def _ingest(self, report: UnitReport, staging: Path | None) -> ReplayResult:
        """Store the blobs the result refers to, each verified against its digest."""
        result = report.result
        staged = BlobStore(staging) if staging is not None else None
        try:
            for ref in (result.stdout_ref, result.stderr_ref):
                if ref is not None:
                    self._take(ref.digest, ref.size, report, staged, ref.media_type)
            if result.output_ref is not None:
                self._take_tree(result.output_ref, report, staged)
        except (StoreError, OSError, ValueError) as error:
            failure = FailureEvent.of(
                error,
                owner="infrastructure",
                stage="replay",
                code="bad_result",
                where=report.worker,
            )
            empty = {"output_ref": None, "stdout_ref": None, "stderr_ref": None}
            return result.model_copy(update={"status": "failed", "failure": failure, **empty})
        return result

    def _take_tree(self, ref: ArtifactRef, report: UnitReport, staged: BlobStore | None) -> None:
        """The files first, the manifest last: the store never holds a tree with holes."""
        if ref.digest in report.inline:
            data = report.inline[ref.digest]
        elif ref.digest in report.staged and staged is not None:
            data = staged.read_bytes(ref.digest, verify=False)
        else:
            raise CorruptBlobError(f"the worker did not return the output tree {ref.digest}")
        actual = "sha256:" + hashlib.sha256(data).hexdigest()
        if actual != ref.digest:
            raise CorruptBlobError(f"output tree {ref.digest} arrived as {actual}")
        for entry in TreeManifest.from_json(data).values():
            if isinstance(entry, FileEntry):
                self._take(entry.digest, entry.size, report, staged)
        self._take(ref.digest, ref.size, report, staged, ref.media_type)

    def _take(
        self,
        digest: str,
        size: int,
        report: UnitReport,
        staged: BlobStore | None,
        media_type: str = "application/octet-stream",
    ) -> None:
        if digest in report.inline:
            ref = self.store.put_bytes(report.inline[digest], media_type=media_type)
        elif digest in report.staged and staged is not None:
            ref = self.store.put_file(staged.path_of(digest), media_type=media_type)
        else:
            raise CorruptBlobError(f"the worker did not return blob {digest}")
        if ref.digest != digest or ref.size != size:
            raise CorruptBlobError(f"blob {digest} ({size} bytes) arrived as {ref.digest}")

    # ----- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Close the client, then the LocalCluster we own (its workers exit)."""
        self._bundles.clear()
        try:
            self.client.close(timeout=CLOSE_TIMEOUT)
        finally:
            if self.owned is not None:
                self.owned.close(timeout=CLOSE_TIMEOUT)
            remove_tree(self.scratch)
            with contextlib.suppress(OSError):
                self.scratch.parent.rmdir()  # when no other run uses it
            if self.directory is not None:
                remove_tree(self.directory)


def _failed(job: ReplayJob, failure: FailureEvent) -> ReplayResult:
    return ReplayResult.without_output(job, "failed", failure)


def _tree_blobs(store: BlobStore, tree: ArtifactRef) -> dict[str, bytes]:
    blobs = {tree.digest: store.read_bytes(tree)}
    for entry in load_manifest(store, tree).values():
        if isinstance(entry, FileEntry) and entry.digest not in blobs:
            blobs[entry.digest] = store.read_bytes(entry.ref)
    return blobs


# ----- opening a cluster ----------------------------------------------------------------------


def _allowed_failures(dask_scheduler: Any) -> int:
    return int(dask_scheduler.allowed_failures)


def _start(
    spec: ClusterSpec, store: BlobStore, directory: Path, lease: str, share: bool | None
) -> DaskCluster:
    try:
        from distributed import Client
    except ImportError as error:
        raise ClusterError(f"Dask lanes need the distributed package: {EXTRA_HINT}") from error
    started = time.perf_counter()
    owned = None
    if spec.kind == "local_dask":
        owned = local_cluster(spec, directory, lease)
        client = Client(owned, set_as_default=False, direct_to_workers=True)
    else:
        try:
            client = Client(spec.address, set_as_default=False, timeout=_CONNECT_SECONDS)
        except (OSError, TimeoutError) as error:
            raise ClusterError(f"cannot reach the scheduler at {spec.address}: {error}") from None
    cluster = DaskCluster(spec, store, client, owned, shared=True)
    cluster.directory = directory if owned is not None else None
    try:
        _send_at_once(client, owned)
        _check_scheduler(cluster)
        cluster.workers = client.run(warm_up)
        cluster.shared = _shared(cluster, share)
    except BaseException:
        cluster.close()
        raise
    cluster.start_seconds = time.perf_counter() - started
    return cluster


def _send_at_once(client: Any, owned: Any) -> None:
    """Dask holds small messages back for up to 10 ms (client) and 5 ms (scheduler) to batch
    them; a unit is a handful of small messages, each of which would pay that wait."""
    with contextlib.suppress(AttributeError):
        client.scheduler_comm.interval = 0.0
    if owned is not None:
        scheduler = owned.scheduler
        for comm in [*scheduler.stream_comms.values(), *scheduler.client_comms.values()]:
            comm.interval = 0.0


def _check_scheduler(cluster: DaskCluster) -> None:
    """Refuse a scheduler that would re-run a unit whose worker died (no silent re-execution)."""
    where = cluster.spec.address or "the local cluster"
    try:
        allowed = cluster.client.run_on_scheduler(_allowed_failures)
    except Exception as error:
        raise ClusterError(f"{where}: cannot read the scheduler's settings: {error}") from None
    if allowed != 0:
        raise ClusterError(
            f"the scheduler at {where} re-runs a task up to {allowed} times when "
            "its worker dies; start it with DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=0"
        )
    if not cluster.client.scheduler_info().get("workers"):
        raise ClusterError(f"the scheduler at {where} has no workers")


def _shared(cluster: DaskCluster, share: bool | None) -> bool:
    """Whether every worker reads this store at the same path (then inputs are not shipped)."""
    if share is not None:
        return share
    if cluster.owned is not None:
        return True
    probe = cluster.scratch / "probe"
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text(cluster.probe)
    try:
        seen = cluster.client.run(sees_store, str(cluster.root), cluster.probe, on_error="return")
    finally:
        probe.unlink(missing_ok=True)
    return all(value is True for value in seen.values())


@asynccontextmanager
async def open_cluster(
    text: str, host: SandboxHost, store: BlobStore, *, share_store: bool | None = None
) -> AsyncIterator[DaskCluster | None]:
    """The cluster replay lanes run on: None for ``local`` (in-process lanes); for
    ``local:N`` a LocalCluster of N single-threaded worker processes owned (and closed) here;
    for ``dask://HOST:PORT`` a client of that scheduler. ``share_store`` forces whether
    workers use the store directly (default: probe; always for ``local:N``)."""
    spec = check_cluster(text)
    if not spec.uses_dask:
        yield None
        return
    # Trees started on owned workers carry a lease under the host's, so this host's
    # lifeline and sweeps find them too (each worker's own lifeline is the first line).
    lease = child_lease(host.inherited_lease, host.lease, "dask")
    directory = host.root / "dask"
    cluster = await trio.to_thread.run_sync(_start, spec, store, directory, lease, share_store)
    try:
        yield cluster
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(cluster.close)
