"""The replay lane actor whose units run on a Dask cluster."""

from __future__ import annotations

import trio

from evolane.distributed._driver import DaskCluster
from evolane.lanes import LaneSettings, ReplayLane
from evolane.messages import ReplayJob, ReplayResult
from evolane.sandbox import SandboxHost
from evolane.store import BlobStore


class DaskReplayLane(ReplayLane):
    """A `ReplayLane` that runs each attempt as one Dask task: same `ReplayJob` in, same
    `ReplayResult` out, same stop signals (a stopped unit is killed on its worker), same
    retry policy for infrastructure failures (a lost worker is one)."""

    def __init__(
        self,
        host: SandboxHost,
        store: BlobStore,
        settings: LaneSettings,
        cluster: DaskCluster,
    ) -> None:
        if settings.backend is not None:
            raise ValueError("an in-process replay backend runs on local lanes only")
        super().__init__(host, store, settings)
        self.cluster = cluster

    async def stopped(self) -> None:
        """Nothing to clean up here: each worker removes its own scratch directories."""

    async def _attempt(
        self, job: ReplayJob, attempt: int, deadline: float, stop: trio.Event
    ) -> ReplayResult:
        return await self.cluster.replay(job, attempt, deadline, stop, self.settings)
