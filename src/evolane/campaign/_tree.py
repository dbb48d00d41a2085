"""A run's supervision tree as data (DESIGN §2): a pure function of what its actors are built
from. Nothing here starts anything; peers find each other by the slot names of `RunSlots`.

    run-<id>                   one_for_all: a run lives or dies whole
    ├── run-<id>.budget        the ledger
    ├── run-<id>.optimizer     one_for_one -> run-<id>.optimizer-i x optimizer_concurrency
    ├── run-<id>.replay        one_for_one -> run-<id>.replay-i x replay_concurrency
    ├── run-<id>.judge         one_for_one -> run-<id>.judge-i x judge_concurrency
    ├── run-<id>.scheduler     plans paired measurement, dispatches work, decides
    └── run-<id>.campaign      drives the cycle: iterations, gates, final scores

The journal and the progress bus are objects the actors share, not actors (see
`CampaignServices`); children stop in reverse order, the campaign first.
"""

from __future__ import annotations

from dataclasses import dataclass

from evolane.campaign._actor import Campaign
from evolane.campaign._types import CampaignServices, CampaignSetup, RunSlots
from evolane.lanes import OptimizerLane, OptimizerSettings
from evolane.measure import MeasureParts, lane_pool, measure_children
from evolane.supervisors import ActorSpec, SupervisorSpec


@dataclass(frozen=True)
class OptimizerParts:
    """What the optimizer lanes are built from: their settings and how many there are (the
    sandbox host and store are the measurement's, in `MeasureParts`)."""

    settings: OptimizerSettings
    count: int


def run_tree(
    slots: RunSlots,
    measure: MeasureParts,
    optimizer: OptimizerParts,
    setup: CampaignSetup,
    services: CampaignServices,
) -> SupervisorSpec:
    """The run's supervision tree (see the module docstring), in start order."""
    children = measure_children(slots, measure)
    optimizers = lane_pool(
        slots.optimizer,
        optimizer.count,
        OptimizerLane,
        (measure.host, measure.store, optimizer.settings),
    )
    return SupervisorSpec(
        name=slots.prefix,
        strategy="one_for_all",
        children=[
            children.budget,
            optimizers,
            children.replay,
            children.judge,
            children.scheduler,
            ActorSpec(name=slots.campaign, actor=Campaign, args=(setup, services)),
        ],
    )
