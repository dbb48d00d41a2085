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
from evolane.campaign._run import Backends, RunOutcome, RunRequest, run_campaign
from evolane.campaign._runs import (
    CampaignState,
    RunRecord,
    StoreLayout,
    load_campaign,
    load_run,
    read_resume_state,
)

__all__ = [
    "ApplyPolicyName",
    "Backends",
    "CampaignConfig",
    "CampaignState",
    "DecisionRecord",
    "Estimate",
    "Focus",
    "FunnelRecord",
    "MeasurementRecord",
    "Report",
    "RunOutcome",
    "RunRecord",
    "RunRequest",
    "ScoreCI",
    "Scores",
    "StoreLayout",
    "load_campaign",
    "load_run",
    "read_resume_state",
    "render_markdown",
    "run_campaign",
]
