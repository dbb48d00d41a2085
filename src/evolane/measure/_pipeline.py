"""Assembles the measurement pipeline as a supervised subtree of the run tree.

measure (one_for_all)
├── budget            the ledger
├── replay-lanes      one_for_one -> replay-lane x replay_concurrency
├── judge-lanes       one_for_one -> judge-lane x judge_concurrency
└── scheduler         plans pairs, dispatches, decides
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
import trio

from evolane.distributed import DaskCluster, DaskReplayLane, open_cluster
from evolane.inputs import JUDGE_PLACEHOLDERS, REPLAY_PLACEHOLDERS, CommandTemplate, Dataset
from evolane.lanes import Backend, JudgeLane, LaneSettings, ReplayLane, StopBoard
from evolane.measure._budget import BudgetActor, Ledger, LedgerSnapshot
from evolane.measure._journal import RunJournal
from evolane.measure._scheduler import (
    MeasurementScheduler,
    MeasureRequest,
    MeasureSummary,
    SchedulerSettings,
)
from evolane.messages import ArtifactRef, LedgerQuery, MeasureEvent, Usage
from evolane.sandbox import Isolation, Limits, SandboxHost
from evolane.store import BlobStore
from evolane.supervisors import ActorSpec, Runtime, SupervisorSpec


@dataclass(frozen=True)
class PipelineConfig:
    """Everything the pipeline needs besides the dataset (mirrors the CLI flags)."""

    replay: str
    judge: str | None = None
    replay_concurrency: int = 4
    judge_concurrency: int = 2
    replay_timeout: float = 600.0
    judge_timeout: float = 120.0
    kill_grace: float = 2.0
    judge_failure_retries: int = 2
    replay_retries: int = 0
    limits: Limits = field(default_factory=Limits)
    pass_env: tuple[str, ...] = ()
    isolation: Isolation = "process"
    ceilings: Usage = field(default_factory=Usage)
    cold_start: dict[str, Usage] = field(default_factory=dict)
    workspace_seed: ArtifactRef | None = None
    seed: int = 0
    min_cases: int = 8
    journal: RunJournal | None = None
    restored: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    restored_replays: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    on_progress: Callable[[MeasureEvent], object] | None = None
    rejudge: bool = False
    replays_allowed: bool = True
    cluster: str = "local"  # where replay lanes run: local | local:N | dask://HOST:PORT
    replay_backend: Backend | None = None
    judge_backend: Backend | None = None
    name: str = "measure"


@dataclass
class Pipeline:
    """Handle on a running pipeline: `measure` and `ledger`."""

    runtime: Runtime
    name: str
    board: StopBoard
    case_refs: Mapping[str, ArtifactRef] = field(default_factory=dict)  # as replays see them

    async def measure(self, request: MeasureRequest, timeout: float = 86_400.0) -> MeasureSummary:
        """Run one measurement; cancelling this call stops and kills every in-flight unit
        before it returns (bounded by the lanes' kill grace)."""
        scheduler = self.runtime.lookup(f"{self.name}.scheduler")
        try:
            return await scheduler.ask(request, timeout=timeout)
        except BaseException:
            with trio.CancelScope(shield=True):
                self.board.cancel_all()
                with trio.move_on_after(120):
                    await self.board.idle.wait()
            raise

    async def ledger(self) -> LedgerSnapshot:
        """The budget ledger's current state."""
        return await self.runtime.lookup(f"{self.name}.budget").ask(LedgerQuery(), timeout=30)


def case_references(
    store: BlobStore, dataset: Dataset, *, include_answers: bool
) -> dict[str, ArtifactRef]:
    """Store every case as ``{case_file}`` JSON: without the answers (``expected_output``,
    ``verification_command``) for replays, so an agent cannot read them; with them for judges."""
    from evolane.inputs import case_json

    return {
        case.id: store.put_bytes(
            case_json(case, include_answers=include_answers), media_type="application/json"
        )
        for case in dataset.cases
    }


def fingerprint(dataset: Dataset, config: PipelineConfig) -> str:
    """What a reused baseline must match besides its tree, case, repetition and seed."""
    parts = {
        "dataset": dataset.digest,
        "replay": config.replay,
        "judge": config.judge,
        "seed_tree": config.workspace_seed.digest if config.workspace_seed else None,
        "limits": config.limits.model_dump(mode="json"),
    }
    return hashlib.sha256(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _lanes(name: str, count: int, lane: type, args: tuple) -> SupervisorSpec:
    children = [
        ActorSpec(name=f"{name}-{i}", actor=lane, args=args, shutdown_grace=0.5)
        for i in range(count)
    ]
    return SupervisorSpec(name=name, children=children, max_restarts=count * 3, within_seconds=5)


@asynccontextmanager
async def open_pipeline(
    runtime: Runtime,
    host: SandboxHost,
    store: BlobStore,
    dataset: Dataset,
    config: PipelineConfig,
    *,
    under: str | None = None,
) -> AsyncIterator[Pipeline]:
    """Start the pipeline's subtree under the runtime's root (or the supervisor ``under``);
    stop it on exit. Replay lanes run in-process, or on the Dask cluster ``config.cluster``
    (started here for ``local:N`` and closed after the lanes stop)."""
    if config.cluster != "local" and config.replay_backend is not None:
        raise ValueError("an in-process replay backend runs on --cluster local only")
    async with (
        open_cluster(config.cluster, host, store) as cluster,
        _open_pipeline(runtime, host, store, dataset, config, cluster, under) as pipeline,
    ):
        yield pipeline


def _lane_settings(config: PipelineConfig) -> tuple[LaneSettings, LaneSettings]:
    """The replay lanes' and the judge lanes' settings (templates parsed: bad ones raise)."""
    replay = CommandTemplate.parse(config.replay, role="replay", allowed=REPLAY_PLACEHOLDERS)
    judge = (
        CommandTemplate.parse(config.judge, role="judge", allowed=JUDGE_PLACEHOLDERS)
        if config.judge
        else None
    )
    common = {
        "limits": config.limits,
        "kill_grace": config.kill_grace,
        "pass_env": config.pass_env,
        "isolation": config.isolation,
    }
    replay_settings = LaneSettings(
        template=replay,
        workspace_seed=config.workspace_seed,
        retries=config.replay_retries,
        backend=config.replay_backend,
        **common,
    )
    judge_settings = LaneSettings(
        template=judge, retries=config.judge_failure_retries, backend=config.judge_backend, **common
    )
    return replay_settings, judge_settings


@asynccontextmanager
async def _open_pipeline(
    runtime: Runtime,
    host: SandboxHost,
    store: BlobStore,
    dataset: Dataset,
    config: PipelineConfig,
    cluster: DaskCluster | None,
    under: str | None,
) -> AsyncIterator[Pipeline]:
    case_refs = await trio.to_thread.run_sync(
        lambda: case_references(store, dataset, include_answers=False)
    )
    judge_refs = await trio.to_thread.run_sync(
        lambda: case_references(store, dataset, include_answers=True)
    )
    splits = {
        split: tuple(c.id for c in dataset.split(split)) for split in ("train", "val", "test")
    }
    board = StopBoard()
    replay_settings, judge_settings = _lane_settings(config)
    name = config.name
    settings = SchedulerSettings(
        case_refs=case_refs,
        judge_case_refs=judge_refs,
        splits=splits,
        fingerprint=fingerprint(dataset, config),
        replay_timeout=config.replay_timeout,
        judge_timeout=config.judge_timeout,
        min_cases=config.min_cases,
        seed=config.seed,
        journal=config.journal,
        restored=config.restored,
        restored_replays=config.restored_replays,
        on_progress=config.on_progress,
        rejudge=config.rejudge,
        replays_allowed=config.replays_allowed,
    )
    ledger = Ledger(ceilings=config.ceilings, cold_start=config.cold_start)
    replay_names = [f"{name}.replay-{i}" for i in range(config.replay_concurrency)]
    judge_names = [f"{name}.judge-{i}" for i in range(config.judge_concurrency)]
    tree = SupervisorSpec(
        name=name,
        strategy="one_for_all",
        children=[
            ActorSpec(name=f"{name}.budget", actor=BudgetActor, args=(ledger,)),
            _lanes(
                f"{name}.replay",
                config.replay_concurrency,
                ReplayLane if cluster is None else DaskReplayLane,
                (host, store, replay_settings, board, *([] if cluster is None else [cluster])),
            ),
            _lanes(
                f"{name}.judge",
                config.judge_concurrency,
                JudgeLane,
                (host, store, judge_settings, board),
            ),
        ],
    )
    parent = runtime.root if under is None else runtime.supervisor(under)
    await parent.start_child(tree)
    try:
        refs = [runtime.lookup(n) for n in replay_names]
        judges = [runtime.lookup(n) for n in judge_names]
        await parent.child(name).start_child(
            ActorSpec(
                name=f"{name}.scheduler",
                actor=MeasurementScheduler,
                args=(settings, refs, judges, runtime.lookup(f"{name}.budget"), store, board),
            )
        )
        yield Pipeline(runtime, name, board, case_refs)
    finally:
        with trio.CancelScope(shield=True):
            board.cancel_all()
            await parent.stop_child(name)
