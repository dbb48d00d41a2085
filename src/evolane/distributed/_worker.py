"""The worker side: one replay unit inside a Dask worker process, through the same sandbox.

Each worker process keeps a small pool of `SandboxHost`s (one per concurrently running
unit), each with its own lease and lifeline: if the worker process dies, SIGKILL included,
the lifelines kill every tree it started. A unit stops early when the driver asks
(`stop_unit`, run on the worker by ``Client.run``) or when its Dask task is cancelled or
released (the driver went away); either way the sandbox's kill ladder runs before the
task returns.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import os
import pickle
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from evolane.distributed._local import forget_scratch_folders
from evolane.distributed._outbox import Outbox
from evolane.distributed._protocol import REPORT_FILE, UnitReport, UnitRequest
from evolane.lanes import (
    UnitScratch,
    blame_tree,
    collect_replay,
    replay_environment,
    replay_name,
    run_lane_command,
)
from evolane.messages import FailureEvent, ReplayResult
from evolane.sandbox import SandboxHost
from evolane.store import BlobStore, CorruptBlobError

_WATCH_SECONDS = 0.05
_TOMBSTONES = 4096
_LIVE_STATES = ("executing", "long-running")


@dataclass
class _Slot:
    """A sandbox host this process owns, lent to one unit at a time."""

    host: SandboxHost
    leftover: Path | None = None


@dataclass
class _Running:
    """How `stop_unit` reaches a running unit's trio loop."""

    token: trio.lowlevel.TrioToken
    stop: trio.Event


class _ProcessState:
    """Per worker process: the host pool, the running units, stopped keys, the input cache."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.inputs = BlobStore(root / "inputs")
        self.running: dict[str, _Running] = {}
        self.tombstones: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._slots: list[_Slot] = []
        self._free: list[_Slot] = []
        self._lock = threading.Lock()

    def acquire(self) -> _Slot:
        with self._lock:
            if self._free:
                return self._free.pop()
        host = SandboxHost(self.root / "sandbox", None, use_cgroups=True)
        host.start()
        slot = _Slot(host)
        with self._lock:
            self._slots.append(slot)
        return slot

    def release(self, slot: _Slot) -> None:
        with self._lock:
            self._free.append(slot)

    def tombstone(self, key: str) -> None:
        with self._lock:
            self.tombstones[key] = None
            while len(self.tombstones) > _TOMBSTONES:
                self.tombstones.popitem(last=False)

    def stopped(self, key: str) -> bool:
        return key in self.tombstones

    def close(self) -> None:
        """Kill whatever the hosts still run and remove their directories."""
        with self._lock:
            slots, self._slots, self._free = self._slots, [], []
        for slot in slots:
            with contextlib.suppress(Exception):
                slot.host.close()


_STATE: _ProcessState | None = None
_STATE_LOCK = threading.Lock()


def _state(worker: Any) -> _ProcessState:
    global _STATE
    with _STATE_LOCK:
        if _STATE is None:
            forget_scratch_folders()  # this worker's own, and those inherited from the driver
            base = Path(worker.local_directory) if worker is not None else Path.cwd()
            _STATE = _ProcessState(base / "evolane")
            atexit.register(_STATE.close)
        return _STATE


def _current_worker() -> Any:
    from distributed import get_worker

    try:
        return get_worker()
    except ValueError:  # called outside a worker (a direct call in a test)
        return None


def run_unit(request: UnitRequest, *bundles: dict[str, bytes]) -> UnitReport | None:
    """The Dask task: run one replay attempt and report its result with the blobs it made
    (returned, or written to the staging directory when the store is shared)."""
    worker = _current_worker()
    state = _state(worker)
    address = f"{worker.address if worker is not None else 'local'} pid {os.getpid()}"
    if state.stopped(request.key):
        return UnitReport(_cancelled(request), worker=address)
    inputs = BlobStore(request.store_root) if request.shared else state.inputs
    for bundle in bundles:
        _receive_inputs(inputs, bundle)
    staging = Path(request.staging) if request.staging is not None else None
    outbox = Outbox(staging, request.inline_bytes, request.inline_total)
    slot = state.acquire()
    try:
        slot.host.store = outbox  # the captured streams go home with the result
        result = trio.run(_run_unit, state, slot, inputs, outbox, request, worker)
    finally:
        slot.host.store = None
        state.release(slot)
    report = UnitReport(result, outbox.inline, outbox.staged, address)
    if staging is None:
        return report
    # With a shared store the report goes there too: the driver reads it as soon as Dask
    # says the task finished, saving a round trip to fetch the task's value.
    staging.mkdir(parents=True, exist_ok=True)
    (staging / REPORT_FILE).write_bytes(pickle.dumps(report, protocol=pickle.HIGHEST_PROTOCOL))
    return None


def _receive_inputs(store: BlobStore, bundle: dict[str, bytes]) -> None:
    for digest, data in bundle.items():
        if store.has(digest):
            continue
        ref = store.put_bytes(data)
        if ref.digest != digest:
            raise CorruptBlobError(f"input blob {digest} arrived as {ref.digest}")


def _cancelled(request: UnitRequest) -> ReplayResult:
    failure = FailureEvent(owner="framework", stage="replay", code="cancelled")
    return ReplayResult.without_output(request.job, "cancelled", failure)


async def _run_unit(
    state: _ProcessState,
    slot: _Slot,
    inputs: BlobStore,
    outbox: Outbox,
    request: UnitRequest,
    worker: Any,
) -> ReplayResult:
    job, settings = request.job, request.settings
    stop = trio.Event()
    state.running[request.key] = _Running(trio.lowlevel.current_trio_token(), stop)
    try:
        if state.stopped(request.key):
            return _cancelled(request)
        deadline = trio.current_time() + max(0.0, request.deadline_epoch - time.time())
        name = replay_name(job)
        scratch = UnitScratch(slot.host, inputs, name, request.attempt)
        leftover, slot.leftover = slot.leftover, None
        try:
            # Blocking I/O right here: this trio loop and its thread serve this unit alone.
            scratch.prepare(job.case_ref, job.tree_ref, settings.workspace_seed, None, leftover)
            assert settings.template is not None
            argv = settings.template.render(scratch.placeholders(job.seed))
            env = replay_environment(job, name)
            async with trio.open_nursery() as nursery:
                if worker is not None:
                    nursery.start_soon(_watch_task, worker, request.key, stop)
                outcome = await run_lane_command(
                    slot.host, settings, argv, scratch, "replay", env, deadline, stop
                )
                nursery.cancel_scope.cancel()
            # Priced and walked as a local lane does: without the run's price table a usage
            # document's tokens cost nothing here, and --max-cost-usd never stopped a run
            # whose replays ran on Dask (found by review).
            limits, prices = settings.output_limits, settings.prices
            result = collect_replay(outbox, job, scratch, outcome, limits, prices)
            result = result.model_copy(update={"name": name})
            if outcome.status == "spawn_failed":  # its program may be the tree's, broken
                result = blame_tree(result, argv, scratch.candidate)
        except BaseException:
            scratch.remove()
            raise
        slot.leftover = scratch.dir  # removed when this slot prepares its next unit
        return result
    finally:
        state.running.pop(request.key, None)


async def _watch_task(worker: Any, key: str, stop: trio.Event) -> None:
    """Stop the unit once Dask no longer wants its task (cancelled, or its client is gone)."""
    while True:
        task = worker.state.tasks.get(key)
        if task is None or task.state not in _LIVE_STATES:
            stop.set()
            return
        await trio.sleep(_WATCH_SECONDS)


async def stop_unit(key: str, wait_seconds: float) -> bool:
    """Stop unit ``key`` if it runs in this process (and never start it here); wait up to
    ``wait_seconds`` for its tree to be gone. Returns True when nothing of it is left here.

    Run on workers through ``Client.run`` (in the worker's event loop)."""
    state = _STATE
    if state is None:
        return True
    state.tombstone(key)
    running = state.running.get(key)
    if running is not None:
        with contextlib.suppress(trio.RunFinishedError):
            running.token.run_sync_soon(running.stop.set)
    deadline = time.monotonic() + wait_seconds
    while key in state.running and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return key not in state.running


def warm_up(dask_worker: Any) -> int:
    """Import everything and start one sandbox host, so the first unit starts at full speed."""
    state = _state(dask_worker)
    state.release(state.acquire())
    with contextlib.suppress(AttributeError):  # send results at once, not in 2 ms batches
        dask_worker.batched_stream.interval = 0.0
    return os.getpid()


def sees_store(root: str, token: str) -> bool:
    """True when this worker reads the driver's store at ``root`` (the probe file matches)."""
    probe = Path(root) / "dask" / token / "probe"
    try:
        return probe.read_text() == token
    except OSError:
        return False
