"""The run's supervision tree is data (DESIGN §2): its shape is checked without starting it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from evolane.campaign import (
    CampaignConfig,
    CampaignServices,
    CampaignSetup,
    CampaignState,
    OptimizerParts,
    RunRecord,
    RunSlots,
    run_tree,
)
from evolane.campaign._actor import Campaign
from evolane.campaign._gates import GateSettings
from evolane.campaign._resume import ResumeState
from evolane.lanes import JudgeLane, OptimizerLane, ReplayLane
from evolane.measure import (
    LANE_RESTART_PERIOD,
    LANE_RESTARTS,
    LANE_SHUTDOWN_GRACE,
    BudgetActor,
    CaseRefs,
    Ledger,
    MeasureContext,
    MeasureParts,
    Scheduler,
    SchedulerPeers,
    lane_pool,
    lane_settings,
    optimizer_settings,
    scheduler_settings,
)
from evolane.messages import ArtifactRef
from evolane.store import BlobStore
from evolane.supervisors import ActorSpec, SupervisorSpec

TREE = ArtifactRef(digest="sha256:" + "0" * 64, size=2)
PLACEHOLDER: Any = object()  # a service the tree only passes on (nothing here starts)


def _tree(tmp_path: Path, cluster: Any = None, **values: Any) -> SupervisorSpec:
    config = CampaignConfig(target="t", dataset="d", replay="r", optimizer="o", **values)
    cases = CaseRefs(replay={}, judge={}, splits={})
    context = MeasureContext()
    replay_lane, judge_lane = lane_settings(config.measure, config.commands, context)
    store = BlobStore(tmp_path)
    measure = MeasureParts(
        settings=config.measure,
        scheduler=scheduler_settings(
            cases, context, settings=config.measure, fingerprint="f", seed=0, min_cases=8
        ),
        replay_lane=replay_lane,
        judge_lane=judge_lane,
        ledger=Ledger(),
        host=PLACEHOLDER,
        store=store,
        cluster=cluster,
    )
    optimizer = OptimizerParts(
        optimizer_settings("o", config.commands), config.propose.optimizer_concurrency
    )
    run = RunRecord(
        run_id="r1",
        campaign_id="c1",
        cycle=0,
        created=0.0,
        config=config,
        dataset_digest="d",
        seed_ref=TREE,
        parent_ref=TREE,
    )
    slots = RunSlots("run-r1")
    setup = CampaignSetup(
        config=config,
        gates=GateSettings(),
        run=run,
        campaign=CampaignState(campaign_id="c1", seed_ref=TREE, best_ref=TREE),
        slots=slots,
        test_cases=0,
    )
    services = CampaignServices(
        store=store,
        host=PLACEHOLDER,
        journal=PLACEHOLDER,
        bus=PLACEHOLDER,
        resume=ResumeState(),
        case_refs={},
    )
    return run_tree(slots, measure, optimizer, setup, services)


def _shape(spec: ActorSpec | SupervisorSpec) -> tuple[str, ...]:
    if isinstance(spec, SupervisorSpec):
        return (spec.name, spec.strategy, *(child.name for child in spec.children))
    return (spec.name, spec.actor.__name__)


def test_the_run_tree_mirrors_the_design(tmp_path: Path) -> None:
    tree = _tree(tmp_path, replay_concurrency=3, judge_concurrency=2, optimizer_concurrency=1)
    assert (tree.name, tree.strategy) == ("run-r1", "one_for_all")
    budget, optimizers, replays, judges, scheduler, campaign = tree.children
    assert cast(ActorSpec, scheduler).actor is Scheduler
    assert [_shape(child) for child in tree.children] == [
        ("run-r1.budget", "BudgetActor"),
        ("run-r1.optimizer", "one_for_one", "run-r1.optimizer-0"),
        ("run-r1.replay", "one_for_one", "run-r1.replay-0", "run-r1.replay-1", "run-r1.replay-2"),
        ("run-r1.judge", "one_for_one", "run-r1.judge-0", "run-r1.judge-1"),
        ("run-r1.scheduler", "Scheduler"),
        ("run-r1.campaign", "Campaign"),
    ]
    assert cast(ActorSpec, budget).actor is BudgetActor
    assert cast(ActorSpec, campaign).actor is Campaign
    pools = [(optimizers, OptimizerLane), (replays, ReplayLane), (judges, JudgeLane)]
    for pool, lane in pools:
        assert isinstance(pool, SupervisorSpec)
        count = len(pool.children)
        assert (pool.max_restarts, pool.within_seconds) == (
            count * LANE_RESTARTS,
            LANE_RESTART_PERIOD,
        )
        for child in pool.children:
            assert isinstance(child, ActorSpec) and child.actor is lane
            assert child.shutdown_grace == LANE_SHUTDOWN_GRACE


def test_the_scheduler_finds_its_peers_by_the_slot_names_of_the_tree(tmp_path: Path) -> None:
    tree = _tree(tmp_path, replay_concurrency=2, judge_concurrency=1)
    _, _, replays, judges, scheduler, _ = tree.children
    assert isinstance(scheduler, ActorSpec) and scheduler.actor is Scheduler
    (peers,) = [arg for arg in scheduler.args if isinstance(arg, SchedulerPeers)]
    assert list(peers.replay) == [child.name for child in cast(SupervisorSpec, replays).children]
    assert list(peers.judge) == [child.name for child in cast(SupervisorSpec, judges).children]
    assert peers.budget == tree.children[0].name


def test_replay_lanes_run_on_a_cluster_when_there_is_one(tmp_path: Path) -> None:
    from evolane.distributed import DaskReplayLane

    cluster = object()
    _, _, replays, _, _, _ = _tree(tmp_path, cluster=cluster).children
    for lane in cast(SupervisorSpec, replays).children:
        assert isinstance(lane, ActorSpec) and lane.actor is DaskReplayLane
        assert lane.args[-1] is cluster


def test_a_lane_pool_restarts_lanes_alone_within_its_intensity() -> None:
    pool = lane_pool("p", 4, ReplayLane, ("args",))
    assert (pool.strategy, pool.max_restarts) == ("one_for_one", 4 * LANE_RESTARTS)
    assert [c.name for c in pool.children] == ["p-0", "p-1", "p-2", "p-3"]
    assert all(isinstance(c, ActorSpec) and c.args == ("args",) for c in pool.children)
