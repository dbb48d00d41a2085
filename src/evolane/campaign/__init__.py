"""The campaign: hill-climbing over candidate trees (local gates, optimizer prompts, apply
policies, the run directory, resume, the report)."""

from evolane.campaign._config import ApplyPolicyName, CampaignConfig, Focus
from evolane.campaign._estimate import Estimate
from evolane.campaign._report import (
    DecisionRecord,
    FunnelRecord,
    MeasurementRecord,
    Report,
    ScoreCI,
    Scores,
    render_markdown,
)
from evolane.campaign._runs import CampaignState, RunRecord, StoreLayout

__all__ = [
    "ApplyPolicyName",
    "CampaignConfig",
    "CampaignState",
    "DecisionRecord",
    "Estimate",
    "Focus",
    "FunnelRecord",
    "MeasurementRecord",
    "Report",
    "RunRecord",
    "ScoreCI",
    "Scores",
    "StoreLayout",
    "render_markdown",
]
