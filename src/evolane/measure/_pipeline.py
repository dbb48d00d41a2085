"""The measurement pipeline: the client its users measure through, the dataset as lanes see
it, and a standalone pipeline (its own subtree) for tests, benchmarks and stress runs.

measure (one_for_all)
├── budget            the ledger
├── replay            one_for_one -> replay-i x replay_concurrency
├── judge             one_for_one -> judge-i x judge_concurrency
└── scheduler         plans pairs, dispatches, decides
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson
import trio

from evolane.actors import ActorError, ActorRef
from evolane.distributed import check_cluster
from evolane.inputs import SPLITS, Dataset, case_clusters
from evolane.lanes import LaneSettings
from evolane.measure._budget import Ledger, LedgerSnapshot
from evolane.measure._settings import (
    CaseRefs,
    CommandSettings,
    MeasureContext,
    MeasureSettings,
    ModelSettings,
    lane_settings,
    scheduler_settings,
)
from evolane.measure._tree import MeasureParts, MeasureSlots, measure_children
from evolane.messages import (
    GateConfig,
    LedgerQuery,
    MeasureRequest,
    MeasureSummary,
    Ping,
    StopAll,
)
from evolane.sandbox import SandboxHost
from evolane.store import BlobStore, RefTable, put_table
from evolane.supervisors import Runtime, SupervisorSpec

if TYPE_CHECKING:
    from evolane.distributed import DaskCluster

MEASURE_ASK_TIMEOUT = float("inf")
"""A measurement ends by itself (every unit has its deadline, a crashed scheduler answers with
an error) and its caller's scope carries the wall-clock budget: its ask needs no timeout."""
JSON = "application/json"
UNITS_STOP_WAIT = 120.0
"""How long an abandoned measurement waits for its in-flight units to be killed (each takes
its kill grace and a reap; Dask workers hear the stop through their scheduler)."""


async def stop_measurement(scheduler: ActorRef) -> None:
    """Cancel the scheduler's running measurement (a `StopAll` signal: its units in flight are
    stopped through their lanes) and wait, at most `UNITS_STOP_WAIT`, until it has ended: a
    `Ping` is answered after it, since the scheduler serves its mailbox in order."""
    scheduler.signal(StopAll())
    with trio.move_on_after(UNITS_STOP_WAIT), contextlib.suppress(ActorError):
        await scheduler.ask(Ping(seq=0), timeout=UNITS_STOP_WAIT)


@dataclass(frozen=True)
class Pipeline:
    """The client of a running measurement: ``measure`` asks its scheduler, ``ledger`` its
    budget (both found by slot name)."""

    scheduler: ActorRef
    budget: ActorRef

    async def measure(self, request: MeasureRequest) -> MeasureSummary:
        """Run one measurement; cancelling this call stops and kills every in-flight unit
        before it returns (bounded by `UNITS_STOP_WAIT`)."""
        try:
            return await self.scheduler.ask(request, timeout=MEASURE_ASK_TIMEOUT)
        except ActorError:
            # The scheduler crashed or stopped: its measurement ended with it (its lanes were
            # told to stop on the way out) and no Ping could be answered before it restarts.
            self.scheduler.signal(StopAll())
            raise
        except BaseException:
            with trio.CancelScope(shield=True):
                await stop_measurement(self.scheduler)
            raise

    async def ledger(self) -> LedgerSnapshot:
        """The budget ledger's current state."""
        return await self.budget.ask(LedgerQuery())


def case_references(
    store: BlobStore,
    dataset: Dataset,
    *,
    include_answers: bool,
    between: Callable[[], None] | None = None,
) -> RefTable:
    """Store every case as ``{case_file}`` JSON: without the answers (``expected_output``,
    ``verification_command``) for replays, so an agent cannot read them; with them for judges."""
    rows = dataset.rows(include_answers=include_answers)
    return put_table(store, rows, JSON, places=dataset.places, between=between)


def store_cases(
    store: BlobStore, dataset: Dataset, between: Callable[[], None] | None = None
) -> CaseRefs:
    """Store the dataset's cases for replays and for judges, in one batch each (one fsync
    pass, not one per blob; blocking: run it in a thread). ``between`` is called between
    batches and may raise to stop (a run stopped while a large dataset is stored)."""
    splits = {s: dataset.split_ids(s) for s in SPLITS}
    return CaseRefs(
        replay=case_references(store, dataset, include_answers=False, between=between),
        judge=case_references(store, dataset, include_answers=True, between=between),
        splits=splits,
        clusters=case_clusters(dataset),
    )


def fingerprint(
    dataset: Dataset,
    settings: MeasureSettings,
    replay_lane: LaneSettings,
    models: ModelSettings | None = None,
) -> str:
    """What a reused baseline must match besides its tree, case, repetition and seed (a
    model judge's rubric and samples too, only when set: older fingerprints stay valid)."""
    seed_tree = replay_lane.workspace_seed
    parts: dict[str, object] = {
        "dataset": dataset.digest,
        "replay": settings.replay,
        "judge": settings.judge,
        "seed_tree": seed_tree.digest if seed_tree else None,
        "limits": replay_lane.limits.model_dump(mode="json"),
    }
    if models is not None and models.rubric is not None:
        parts.update(rubric=models.rubric, judge_samples=models.judge_samples)
    return hashlib.sha256(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)).hexdigest()


def measure_parts(
    settings: MeasureSettings,
    commands: CommandSettings,
    context: MeasureContext,
    *,
    dataset: Dataset,
    cases: CaseRefs,
    seed: int,
    min_cases: int,
    ledger: Ledger,
    host: SandboxHost,
    store: BlobStore,
    cluster: DaskCluster | None,
    models: ModelSettings | None = None,
) -> MeasureParts:
    """Everything the measure actors are built from (no IO: ``cases`` are already stored);
    ``models``: the run's price table and model judge settings."""
    prices = models.prices if models is not None else None
    replay_lane, judge_lane = lane_settings(settings, commands, context, prices)
    scheduler = scheduler_settings(
        cases,
        context,
        settings=settings,
        fingerprint=fingerprint(dataset, settings, replay_lane, models),
        seed=seed,
        min_cases=min_cases,
    )
    return MeasureParts(
        settings=settings,
        scheduler=scheduler,
        replay_lane=replay_lane,
        judge_lane=judge_lane,
        ledger=ledger,
        host=host,
        store=store,
        cluster=cluster,
    )


@asynccontextmanager
async def open_measure_cluster(
    settings: MeasureSettings, context: MeasureContext, host: SandboxHost, store: BlobStore
) -> AsyncIterator[DaskCluster | None]:
    """The cluster replay lanes run on (None: in-process lanes), started here for
    ``local:N`` and closed on exit."""
    if settings.cluster != "local" and context.replay_backend is not None:
        raise ValueError("an in-process replay backend runs on --cluster local only")
    if not check_cluster(settings.cluster).uses_dask:  # in-process lanes: no Dask driver loads
        yield None
        return
    from evolane.distributed import open_cluster

    async with open_cluster(settings.cluster, host, store) as cluster:
        yield cluster


@asynccontextmanager
async def open_pipeline(
    runtime: Runtime,
    host: SandboxHost,
    store: BlobStore,
    dataset: Dataset,
    settings: MeasureSettings,
    *,
    commands: CommandSettings | None = None,
    context: MeasureContext | None = None,
    seed: int = 0,
    min_cases: int | None = None,
    ledger: Ledger | None = None,
    name: str = "measure",
) -> AsyncIterator[Pipeline]:
    """A standalone pipeline: its subtree ``name`` (one_for_all) under the runtime's root,
    stopped on exit. ``min_cases`` defaults to the gate's, ``ledger`` to one without
    ceilings; replay lanes run in-process, or on the Dask cluster ``settings.cluster``
    (started here for ``local:N``)."""
    context = context or MeasureContext()
    async with open_measure_cluster(settings, context, host, store) as cluster:
        cases = await trio.to_thread.run_sync(store_cases, store, dataset)
        slots = MeasureSlots(name)
        parts = measure_parts(
            settings,
            commands or CommandSettings(),
            context,
            dataset=dataset,
            cases=cases,
            seed=seed,
            min_cases=GateConfig().min_cases if min_cases is None else min_cases,
            ledger=ledger or Ledger(),
            host=host,
            store=store,
            cluster=cluster,
        )
        tree = SupervisorSpec(
            name=name, strategy="one_for_all", children=list(measure_children(slots, parts))
        )
        await runtime.start_supervisor(tree)
        try:
            yield Pipeline(runtime.lookup(slots.scheduler), runtime.lookup(slots.budget))
        finally:
            with trio.CancelScope(shield=True):
                runtime.lookup(slots.scheduler).signal(StopAll())
                await runtime.root.stop_child(name)
