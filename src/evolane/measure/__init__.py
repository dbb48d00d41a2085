"""Paired measurement: the plan (an IO-free state machine) and the scheduler that performs
it over replay and judge lanes, the budget ledger, the run journal writer, the progress bus,
the measurement's settings and its part of a run tree (lane pools, slot names), and a
standalone pipeline. The measurement's messages live in `evolane.messages`."""

from evolane.measure._budget import (
    PROBE_RUNNING,
    BudgetActor,
    Ledger,
    LedgerSnapshot,
    Overrun,
)
from evolane.measure._journal import RunJournal
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
from evolane.measure._scheduler import MeasurementScheduler
from evolane.measure._scheduling import SchedulerSettings
from evolane.measure._settings import (
    MAX_TIMEOUT,
    CaseRefs,
    CommandSettings,
    MeasureContext,
    MeasureSettings,
    lane_settings,
    optimizer_settings,
    scheduler_settings,
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
from evolane.measure._units import RESTORABLE, repetitions

__all__ = [
    "DEFAULT_MAX_FILE_SIZE",
    "DEFAULT_MAX_MEMORY",
    "DEFAULT_MAX_OPEN_FILES",
    "DEFAULT_MAX_PROCS",
    "LANE_RESTARTS",
    "LANE_RESTART_PERIOD",
    "LANE_SHUTDOWN_GRACE",
    "MAX_TIMEOUT",
    "MEASURE_ASK_TIMEOUT",
    "PROBE_RUNNING",
    "RESTORABLE",
    "STORED_LIMITS",
    "UNITS_STOP_WAIT",
    "BudgetActor",
    "CaseRefs",
    "CommandLimits",
    "CommandSettings",
    "Ledger",
    "LedgerSnapshot",
    "MeasureChildren",
    "MeasureContext",
    "MeasureParts",
    "MeasureSettings",
    "MeasureSlots",
    "MeasurementScheduler",
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
    "scheduler_settings",
    "store_cases",
]
