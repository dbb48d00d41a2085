"""User inputs, checked at the door: JSONL datasets (`load_dataset`), trajectory files
(`ingest_trajectories`) and command templates.

Every refusal is an `InputError` (a ValueError) whose message is one line naming the input
(``file:line`` for a dataset row, ``<role> command`` for a template); the CLI exits with 2.
"""

from typing import TYPE_CHECKING

from evolane._lazy import lazy_exports

if TYPE_CHECKING:
    from evolane.inputs._cases import (
        MAX_CASE_ID_CHARS,
        SPLITS,
        Case,
        CaseId,
        Split,
        case_json,
        case_row,
        cluster_of,
    )
    from evolane.inputs._dataset import (
        MAX_FILE_BYTES,
        MAX_LINE_BYTES,
        Dataset,
        case_clusters,
        load_dataset,
        parse_dataset,
        require_split,
    )
    from evolane.inputs._errors import (
        DatasetError,
        InputError,
        TemplateError,
        first_problem,
        one_line,
        quote,
    )
    from evolane.inputs._prices import (
        ModelPrice,
        PriceTable,
        UsageReading,
        load_prices,
        priced_cost,
        read_usage_document,
    )
    from evolane.inputs._specs import LLM_PREFIX, PLUGIN_SPEC, llm_model, plugin_words
    from evolane.inputs._templates import (
        ALL_PLACEHOLDERS,
        JUDGE_PLACEHOLDERS,
        MAX_TEMPLATE_ARGS,
        MAX_TEMPLATE_CHARS,
        OPTIMIZER_PLACEHOLDERS,
        REPLAY_PLACEHOLDERS,
        VERIFICATION_PLACEHOLDERS,
        CommandTemplate,
        tree_program,
    )
    from evolane.inputs._trajectory import (
        ExcludedCase,
        GroupSummary,
        TraceFailure,
        Trajectories,
        TrajectorySummary,
        ingest_trajectories,
        input_identity,
        summary_lines,
        task_fingerprint,
    )
    from evolane.inputs._trajectory_entry import Pinned
    from evolane.inputs._trajectory_read import (
        MAX_TRAJECTORY_FILES,
        MAX_TRAJECTORY_RECORDS,
        trajectory_files,
    )
    from evolane.inputs._trajectory_records import (
        ChatMessage,
        Outcome,
        TrajectoryRecord,
        trajectory_schema,
    )
    from evolane.inputs._trajectory_sessions import (
        DEFAULT_CONTEXT_BUDGET,
        fit_chain,
        refers_back,
    )

__all__ = [
    "ALL_PLACEHOLDERS",
    "DEFAULT_CONTEXT_BUDGET",
    "JUDGE_PLACEHOLDERS",
    "LLM_PREFIX",
    "MAX_CASE_ID_CHARS",
    "MAX_FILE_BYTES",
    "MAX_LINE_BYTES",
    "MAX_TEMPLATE_ARGS",
    "MAX_TEMPLATE_CHARS",
    "MAX_TRAJECTORY_FILES",
    "MAX_TRAJECTORY_RECORDS",
    "OPTIMIZER_PLACEHOLDERS",
    "PLUGIN_SPEC",
    "REPLAY_PLACEHOLDERS",
    "SPLITS",
    "VERIFICATION_PLACEHOLDERS",
    "Case",
    "CaseId",
    "ChatMessage",
    "CommandTemplate",
    "Dataset",
    "DatasetError",
    "ExcludedCase",
    "GroupSummary",
    "InputError",
    "ModelPrice",
    "Outcome",
    "Pinned",
    "PriceTable",
    "Split",
    "TemplateError",
    "TraceFailure",
    "Trajectories",
    "TrajectoryRecord",
    "TrajectorySummary",
    "UsageReading",
    "case_clusters",
    "case_json",
    "case_row",
    "cluster_of",
    "first_problem",
    "fit_chain",
    "ingest_trajectories",
    "input_identity",
    "llm_model",
    "load_dataset",
    "load_prices",
    "one_line",
    "parse_dataset",
    "plugin_words",
    "priced_cost",
    "quote",
    "read_usage_document",
    "refers_back",
    "require_split",
    "summary_lines",
    "task_fingerprint",
    "trajectory_files",
    "trajectory_schema",
    "tree_program",
]

__getattr__ = lazy_exports(__name__)
