"""Lanes: actors that run one unit at a time (replay, judge, optimizer) through the sandbox,
or through an in-process backend, and answer with a typed result. The built-in model
backends (`llm_judge`, `llm_optimizer`) call OpenAI-compatible endpoints through `chat`."""

from typing import TYPE_CHECKING

from evolane._lazy import lazy_exports

if TYPE_CHECKING:
    from evolane.lanes._agent_kit import AgentCall, AgentPreset
    from evolane.lanes._agent_presets import BUILTIN_AGENTS
    from evolane.lanes._agents import (
        AGENT_ENTRY_POINTS,
        AGENT_PREFIX,
        AGENT_PROMPT_BYTES,
        AgentCommand,
        AgentNotInstalledError,
        AgentSpecError,
        agent_presets,
        agent_prompt,
        is_agent_spec,
        optimizer_command,
        resolve_agent,
    )
    from evolane.lanes._backends import Backend, BackendCall, run_backend
    from evolane.lanes._entries import check_entries
    from evolane.lanes._judge import (
        JUDGE_ENDPOINT_FAILED,
        MAX_ANSWER_BYTES,
        JudgeLane,
        parse_judge_output,
    )
    from evolane.lanes._limits import (
        LIMIT_FLAGS,
        format_size,
        limit_reason,
        limits_hit,
        note_limits,
    )
    from evolane.lanes._llm import (
        ChatAnswer,
        Endpoint,
        ModelError,
        api_key,
        chat,
        redact,
    )
    from evolane.lanes._llm_edits import EDIT_FORMAT, Edit, EditError, apply_edits, parse_edits
    from evolane.lanes._llm_extra import LLM_EXTRA_HINT, llm_available
    from evolane.lanes._llm_judge import MalformedVerdictError, llm_judge, parse_verdict
    from evolane.lanes._llm_limit import AdaptiveLimiter, LimiterSettings, NoSlot, limiter_snapshot
    from evolane.lanes._llm_optimizer import llm_optimizer
    from evolane.lanes._optimizer import (
        OPTIMIZER_ENDPOINT_FAILED,
        SIGNATURE_MAX_ENTRIES,
        OptimizerLane,
        OptimizerSettings,
        workdir_signature,
    )
    from evolane.lanes._plugins import (
        BACKEND_GROUPS,
        OBSERVER_GROUP,
        InstalledPlugin,
        PluginError,
        PluginSpec,
        check_plugin,
        installed_plugins,
        load_entry,
        plugin_backend,
        plugin_points,
        plugin_spec,
    )
    from evolane.lanes._program import TREE_OWNERS, blame_tree
    from evolane.lanes._replay import (
        MAX_OUTPUT_BYTES,
        MAX_USAGE_BYTES,
        OUTPUT_LIMITS,
        LaneSettings,
        ReplayLane,
        collect_replay,
        excerpt,
        read_usage,
        run_lane_command,
    )
    from evolane.lanes._replay_failure import HOST_REFUSED
    from evolane.lanes._scratch import (
        ScratchKind,
        SlotScratch,
        UnitScratch,
        blind_name,
        replay_environment,
        replay_name,
        safe_name,
        scratch_dir,
    )
    from evolane.lanes._stop import EARLY_STOPS_KEPT, StoppableLane, StopSwitches
    from evolane.lanes._usage import usage_document

__all__ = [
    "AGENT_ENTRY_POINTS",
    "AGENT_PREFIX",
    "AGENT_PROMPT_BYTES",
    "BACKEND_GROUPS",
    "BUILTIN_AGENTS",
    "EARLY_STOPS_KEPT",
    "EDIT_FORMAT",
    "HOST_REFUSED",
    "JUDGE_ENDPOINT_FAILED",
    "LIMIT_FLAGS",
    "LLM_EXTRA_HINT",
    "MAX_ANSWER_BYTES",
    "MAX_OUTPUT_BYTES",
    "MAX_USAGE_BYTES",
    "OBSERVER_GROUP",
    "OPTIMIZER_ENDPOINT_FAILED",
    "OUTPUT_LIMITS",
    "SIGNATURE_MAX_ENTRIES",
    "TREE_OWNERS",
    "AdaptiveLimiter",
    "AgentCall",
    "AgentCommand",
    "AgentNotInstalledError",
    "AgentPreset",
    "AgentSpecError",
    "Backend",
    "BackendCall",
    "ChatAnswer",
    "Edit",
    "EditError",
    "Endpoint",
    "InstalledPlugin",
    "JudgeLane",
    "LaneSettings",
    "LimiterSettings",
    "MalformedVerdictError",
    "ModelError",
    "NoSlot",
    "OptimizerLane",
    "OptimizerSettings",
    "PluginError",
    "PluginSpec",
    "ReplayLane",
    "ScratchKind",
    "SlotScratch",
    "StopSwitches",
    "StoppableLane",
    "UnitScratch",
    "agent_presets",
    "agent_prompt",
    "api_key",
    "apply_edits",
    "blame_tree",
    "blind_name",
    "chat",
    "check_entries",
    "check_plugin",
    "collect_replay",
    "excerpt",
    "format_size",
    "installed_plugins",
    "is_agent_spec",
    "limit_reason",
    "limiter_snapshot",
    "limits_hit",
    "llm_available",
    "llm_judge",
    "llm_optimizer",
    "load_entry",
    "note_limits",
    "optimizer_command",
    "parse_edits",
    "parse_judge_output",
    "parse_verdict",
    "plugin_backend",
    "plugin_points",
    "plugin_spec",
    "read_usage",
    "redact",
    "replay_environment",
    "replay_name",
    "resolve_agent",
    "run_backend",
    "run_lane_command",
    "safe_name",
    "scratch_dir",
    "usage_document",
    "workdir_signature",
]

__getattr__ = lazy_exports(__name__)
