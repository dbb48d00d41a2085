"""The measurement's part of a supervision tree, as data: slot names, lane pools, and the
budget, lane and scheduler specs. Nothing here starts anything.

    <prefix>.budget        the ledger
    <prefix>.replay        one_for_one -> <prefix>.replay-i x replay_concurrency
    <prefix>.judge         one_for_one -> <prefix>.judge-i x judge_concurrency
    <prefix>.scheduler     plans pairs, dispatches, decides (finds its peers by slot name)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from evolane.actors import Actor
from evolane.lanes import JudgeLane, LaneSettings, ReplayLane
from evolane.measure._budget import BudgetActor, Ledger
from evolane.measure._scheduler import MeasurementScheduler
from evolane.measure._scheduling import SchedulerSettings
from evolane.measure._settings import MeasureSettings
from evolane.messages import MeasureSummary, Message, Pong
from evolane.sandbox import SandboxHost
from evolane.store import BlobStore
from evolane.supervisors import ActorSpec, SupervisorSpec

if TYPE_CHECKING:  # Dask lanes (their worker, asyncio) load only for a run on a cluster
    from evolane.distributed import DaskCluster

LANE_SHUTDOWN_GRACE = 0.5
"""Seconds a lane gets to stop before it is cancelled: an idle lane stops at once, and a busy
one has its unit stopped by a signal first (cancelling it kills the unit's tree)."""
LANE_RESTARTS = 3
"""Crashes per lane a pool absorbs within `LANE_RESTART_PERIOD` (OTP's default for one
child, scaled by the pool's size) before it gives up and fails the run."""
LANE_RESTART_PERIOD = 5.0
"""The window, in seconds, over which a pool counts its lanes' restarts."""


def lane_pool(name: str, count: int, actor: type[Actor], args: tuple[Any, ...]) -> SupervisorSpec:
    """A one_for_one pool of ``count`` identical lanes ``<name>-0`` ... ``<name>-<count-1>``:
    a crashed lane restarts alone; too many crashes in a row fail the pool."""
    children = [
        ActorSpec(name=f"{name}-{i}", actor=actor, args=args, shutdown_grace=LANE_SHUTDOWN_GRACE)
        for i in range(count)
    ]
    return SupervisorSpec(
        name=name,
        children=children,
        max_restarts=count * LANE_RESTARTS,
        within_seconds=LANE_RESTART_PERIOD,
    )


def lane_names(pool: str, count: int) -> list[str]:
    """The slot names of the lanes of `lane_pool` ``pool``."""
    return [f"{pool}-{i}" for i in range(count)]


@dataclass(frozen=True)
class MeasureSlots:
    """The slot names of a measurement's actors under ``prefix``: peers find each other by
    these names, never by holding each other's objects."""

    prefix: str

    @property
    def budget(self) -> str:
        """The budget actor."""
        return f"{self.prefix}.budget"

    @property
    def replay(self) -> str:
        """The replay lanes' pool."""
        return f"{self.prefix}.replay"

    @property
    def judge(self) -> str:
        """The judge lanes' pool."""
        return f"{self.prefix}.judge"

    @property
    def scheduler(self) -> str:
        """The scheduler (the measurement's entry point)."""
        return f"{self.prefix}.scheduler"


@dataclass(frozen=True)
class MeasureParts:
    """What a measurement's actors are built from: the settings (the scheduler's and the
    lanes', derived in `evolane.measure._settings`), the ledger, and the services they use."""

    settings: MeasureSettings
    scheduler: SchedulerSettings
    replay_lane: LaneSettings
    judge_lane: LaneSettings
    ledger: Ledger
    host: SandboxHost
    store: BlobStore
    cluster: DaskCluster | None = None  # replay lanes run on it when given


class MeasureChildren(NamedTuple):
    """The measurement's child specs, in start order."""

    budget: ActorSpec
    replay: SupervisorSpec
    judge: SupervisorSpec
    scheduler: ActorSpec


def measure_children(slots: MeasureSlots, parts: MeasureParts) -> MeasureChildren:
    """The budget, the two lane pools and the scheduler, for any tree to include."""
    host, store, cluster = parts.host, parts.store, parts.cluster
    replay_args: tuple[Any, ...] = (host, store, parts.replay_lane)
    replay_lane: type[Actor] = ReplayLane
    if cluster is not None:
        from evolane.distributed import DaskReplayLane

        replay_args, replay_lane = (*replay_args, cluster), DaskReplayLane
    replays, judges = parts.settings.replay_concurrency, parts.settings.judge_concurrency
    peers = SchedulerPeers(
        lane_names(slots.replay, replays), lane_names(slots.judge, judges), slots.budget
    )
    return MeasureChildren(
        budget=ActorSpec(name=slots.budget, actor=BudgetActor, args=(parts.ledger,)),
        replay=lane_pool(slots.replay, replays, replay_lane, replay_args),
        judge=lane_pool(slots.judge, judges, JudgeLane, (host, store, parts.judge_lane)),
        scheduler=ActorSpec(
            name=slots.scheduler, actor=Scheduler, args=(parts.scheduler, peers, store)
        ),
    )


@dataclass(frozen=True)
class SchedulerPeers:
    """The slot names the scheduler sends work to and asks budget of."""

    replay: Sequence[str]
    judge: Sequence[str]
    budget: str


class Scheduler(Actor):
    """The scheduler's slot in a tree given as data: when it starts (after its lanes and
    budget, which precede it), it resolves them by slot name and hands every request to a
    `MeasurementScheduler` built on those refs."""

    accepts = MeasurementScheduler.accepts
    signals = MeasurementScheduler.signals

    def __init__(
        self, settings: SchedulerSettings, peers: SchedulerPeers, store: BlobStore
    ) -> None:
        self.settings, self.peers, self.store = settings, peers, store
        self.inner: MeasurementScheduler | None = None

    async def started(self) -> None:
        lookup = self.context.lookup
        self.inner = MeasurementScheduler(
            self.settings,
            [lookup(name) for name in self.peers.replay],
            [lookup(name) for name in self.peers.judge],
            lookup(self.peers.budget),
            self.store,
        )
        self.inner.context = self.context
        await self.inner.started()

    async def receive(self, message: Message) -> MeasureSummary | Pong:
        assert self.inner is not None
        return await self.inner.receive(message)

    def on_signal(self, message: Message) -> None:
        if self.inner is not None:
            self.inner.on_signal(message)

    async def stopped(self) -> None:
        if self.inner is not None:
            await self.inner.stopped()
