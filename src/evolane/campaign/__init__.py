"""The campaign: hill-climbing over candidate trees (local gates, optimizer prompts, apply
policies, the run directory, resume, the report)."""

from typing import TYPE_CHECKING

from evolane._lazy import lazy_exports

if TYPE_CHECKING:
    from evolane.campaign._advice import after_failure
    from evolane.campaign._case_rows import case_rows
    from evolane.campaign._config import ApplyPolicyName, CampaignConfig, Focus, ProposeSettings
    from evolane.campaign._confirm import PUBLISHED_ON_TEST, published_on_test
    from evolane.campaign._containment import host_warnings, network_warning
    from evolane.campaign._continue import HOST_FAILED_RUNS, dropped_on_host
    from evolane.campaign._diff import unified_tree_diff
    from evolane.campaign._estimate import Estimate
    from evolane.campaign._layout import StoreLayout, check_id, run_is_live
    from evolane.campaign._lock import TargetLocked, holder_pid
    from evolane.campaign._markdown import candidate_cell, ci_text, render_markdown
    from evolane.campaign._online import campaign_alpha, p_beside_level
    from evolane.campaign._probe import CaseProbe, HostReport, Probe, probe_run
    from evolane.campaign._report import (
        DecisionRecord,
        FunnelRecord,
        MeasurementRecord,
        Report,
        ScoreCI,
        Scores,
    )
    from evolane.campaign._resume import read_resume_state
    from evolane.campaign._run import (
        CAMPAIGN_ASK_TIMEOUT,
        EXIT_FOR_STATUS,
        Backends,
        RunOutcome,
        RunRequest,
        run_campaign,
    )
    from evolane.campaign._runs import (
        ENDED_RUNS,
        CampaignState,
        ReportSummary,
        ResolvedSetting,
        RunRecord,
        load_campaign,
        load_run,
        publish_note,
        record_problem,
        save_run,
    )
    from evolane.campaign._shares import BudgetShare, ShareBook, reached_test, share
    from evolane.campaign._target import store_root
    from evolane.campaign._tree import OptimizerParts, run_tree
    from evolane.campaign._types import (
        LANE_BROKE,
        CampaignServices,
        CampaignSetup,
        CycleOutcome,
        RunSlots,
        slot_id,
        slot_of,
    )

__all__ = [
    "CAMPAIGN_ASK_TIMEOUT",
    "ENDED_RUNS",
    "EXIT_FOR_STATUS",
    "HOST_FAILED_RUNS",
    "LANE_BROKE",
    "PUBLISHED_ON_TEST",
    "ApplyPolicyName",
    "Backends",
    "BudgetShare",
    "CampaignConfig",
    "CampaignServices",
    "CampaignSetup",
    "CampaignState",
    "CaseProbe",
    "CycleOutcome",
    "DecisionRecord",
    "Estimate",
    "Focus",
    "FunnelRecord",
    "HostReport",
    "MeasurementRecord",
    "OptimizerParts",
    "Probe",
    "ProposeSettings",
    "Report",
    "ReportSummary",
    "ResolvedSetting",
    "RunOutcome",
    "RunRecord",
    "RunRequest",
    "RunSlots",
    "ScoreCI",
    "Scores",
    "ShareBook",
    "StoreLayout",
    "TargetLocked",
    "after_failure",
    "campaign_alpha",
    "candidate_cell",
    "case_rows",
    "check_id",
    "ci_text",
    "dropped_on_host",
    "holder_pid",
    "host_warnings",
    "load_campaign",
    "load_run",
    "network_warning",
    "p_beside_level",
    "probe_run",
    "publish_note",
    "published_on_test",
    "reached_test",
    "read_resume_state",
    "record_problem",
    "render_markdown",
    "run_campaign",
    "run_is_live",
    "run_tree",
    "save_run",
    "share",
    "slot_id",
    "slot_of",
    "store_root",
    "unified_tree_diff",
]

__getattr__ = lazy_exports(__name__)
