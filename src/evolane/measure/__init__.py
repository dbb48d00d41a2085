"""Paired measurement: the plan (an IO-free state machine) and the scheduler that performs
it over replay and judge lanes, the budget ledger, the run journal writer, the progress bus,
the measurement's settings and its part of a run tree (lane pools, slot names), and a
standalone pipeline. The measurement's messages live in `evolane.messages`."""

from typing import TYPE_CHECKING

from evolane._lazy import lazy_exports

if TYPE_CHECKING:
    from evolane.measure._budget import (
        OVERRUNS_KEPT,
        PROBE_POLL_SECONDS,
        PROBE_RUNNING,
        ROLES,
        BudgetActor,
        Ledger,
        LedgerSnapshot,
        Overrun,
        reserve_when_known,
    )
    from evolane.measure._journal import RunJournal
    from evolane.measure._layout import repetitions
    from evolane.measure._limits import (
        DEFAULT_MAX_FILE_SIZE,
        DEFAULT_MAX_MEMORY,
        DEFAULT_MAX_OPEN_FILES,
        DEFAULT_MAX_PROCS,
        STORED_LIMITS,
        CommandLimits,
        describe_limits,
        parse_count,
        parse_size,
    )
    from evolane.measure._pipeline import (
        MEASURE_ASK_TIMEOUT,
        UNITS_STOP_WAIT,
        Pipeline,
        case_references,
        fingerprint,
        measure_parts,
        open_measure_cluster,
        open_pipeline,
        store_cases,
    )
    from evolane.measure._progress import ProgressBus, Subscription
    from evolane.measure._restore import (
        replay_names,
        restored_debits,
        stored_replay_debit,
        unpaid_debits,
    )
    from evolane.measure._scheduler import MeasurementScheduler
    from evolane.measure._scheduling import SchedulerSettings
    from evolane.measure._settings import (
        COMMAND_ROLES,
        MAX_TIMEOUT,
        CaseRefs,
        CommandRole,
        CommandSettings,
        MeasureContext,
        MeasureSettings,
        ModelSettings,
        lane_settings,
        optimizer_settings,
        scheduler_settings,
        split_grant,
    )
    from evolane.measure._tree import (
        LANE_RESTART_PERIOD,
        LANE_RESTARTS,
        LANE_SHUTDOWN_GRACE,
        MeasureChildren,
        MeasureParts,
        MeasureSlots,
        Scheduler,
        SchedulerPeers,
        lane_names,
        lane_pool,
        measure_children,
    )
    from evolane.measure._units import RESTORABLE

__all__ = [
    "COMMAND_ROLES",
    "DEFAULT_MAX_FILE_SIZE",
    "DEFAULT_MAX_MEMORY",
    "DEFAULT_MAX_OPEN_FILES",
    "DEFAULT_MAX_PROCS",
    "LANE_RESTARTS",
    "LANE_RESTART_PERIOD",
    "LANE_SHUTDOWN_GRACE",
    "MAX_TIMEOUT",
    "MEASURE_ASK_TIMEOUT",
    "OVERRUNS_KEPT",
    "PROBE_POLL_SECONDS",
    "PROBE_RUNNING",
    "RESTORABLE",
    "ROLES",
    "STORED_LIMITS",
    "UNITS_STOP_WAIT",
    "BudgetActor",
    "CaseRefs",
    "CommandLimits",
    "CommandRole",
    "CommandSettings",
    "Ledger",
    "LedgerSnapshot",
    "MeasureChildren",
    "MeasureContext",
    "MeasureParts",
    "MeasureSettings",
    "MeasureSlots",
    "MeasurementScheduler",
    "ModelSettings",
    "Overrun",
    "Pipeline",
    "ProgressBus",
    "RunJournal",
    "Scheduler",
    "SchedulerPeers",
    "SchedulerSettings",
    "Subscription",
    "case_references",
    "describe_limits",
    "fingerprint",
    "lane_names",
    "lane_pool",
    "lane_settings",
    "measure_children",
    "measure_parts",
    "open_measure_cluster",
    "open_pipeline",
    "optimizer_settings",
    "parse_count",
    "parse_size",
    "repetitions",
    "replay_names",
    "reserve_when_known",
    "restored_debits",
    "scheduler_settings",
    "split_grant",
    "store_cases",
    "stored_replay_debit",
    "unpaid_debits",
]

__getattr__ = lazy_exports(__name__)
