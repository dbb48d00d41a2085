"""What every measurement of a run shares: the scheduler's settings."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from evolane.measure._journal import RunJournal
from evolane.messages import ArtifactRef, MeasureEvent, ReplayRecord, UnitEvent, UnitRecord


@dataclass(frozen=True)
class SchedulerSettings:
    """What every measurement shares: the cases, timeouts, repetitions policy, journal."""

    case_refs: Mapping[str, ArtifactRef]  # what a replay sees: no answers
    judge_case_refs: Mapping[str, ArtifactRef]  # what a judge sees: with expected_output
    splits: dict[str, tuple[str, ...]]
    fingerprint: str  # dataset, workspace seed, replay and judge commands: what reuse must match
    replay_timeout: float = 600.0
    judge_timeout: float = 120.0
    min_cases: int = 8
    seed: int = 0
    journal: RunJournal | None = None
    restored: Mapping[str, UnitRecord] = field(default_factory=dict)  # unit id -> record
    # (a record counts only if its "tree" is the tree the unit plans: unit ids hold no tree)
    restored_replays: Mapping[str, ReplayRecord] = field(default_factory=dict)  # judged next
    earlier: Mapping[bytes, UnitRecord | ReplayRecord] = field(default_factory=dict)
    """Succeeded units of the campaign's earlier runs of the same cycle, by `reuse_key`: reused
    with no charge (their spend is in the campaign's books already); and their replays a stop
    left unjudged: judged, their replay not charged again."""
    on_progress: Callable[[MeasureEvent], object] | None = None  # a progress bus's publish
    on_unit: Callable[[UnitEvent], object] | None = None  # hears each unit that ended
    rejudge: bool = False  # restored units are judged again (--rerun-evaluator)
    replays_allowed: bool = True  # False: a unit without a stored replay is not run
    judge_costs: bool = False
    """Judges may spend (a judge command or a model backend): each judgement is reserved and
    charged under stage ``judge``. False: exact match or verification commands, free."""
    progress_interval: float = 0.1  # seconds between two progress events of a measurement
    clusters: Mapping[str, str] = field(default_factory=dict)
    """Per case id, its cluster (`inputs.case_clusters`): clustered cases are read cluster by
    cluster (`stats.cluster_order`), judged by cluster (`stats.judge_clusters`) and stopped
    early by cluster (`CasePrefix`)."""
