"""Paired measurement: the plan (an IO-free state machine) and the scheduler that performs
it over replay and judge lanes, the budget ledger, the run journal writer, the progress bus
and the pipeline that assembles them. The measurement's messages live in `evolane.messages`."""

from evolane.measure._budget import (
    PROBE_RUNNING,
    BudgetActor,
    Ledger,
    LedgerSnapshot,
    Overrun,
)
from evolane.measure._journal import RunJournal
from evolane.measure._pipeline import (
    Pipeline,
    PipelineConfig,
    case_references,
    fingerprint,
    open_pipeline,
)
from evolane.measure._progress import ProgressBus, Subscription
from evolane.measure._scheduler import MeasurementScheduler
from evolane.measure._scheduling import SchedulerSettings
from evolane.measure._units import RESTORABLE, repetitions

__all__ = [
    "PROBE_RUNNING",
    "RESTORABLE",
    "BudgetActor",
    "Ledger",
    "LedgerSnapshot",
    "MeasurementScheduler",
    "Overrun",
    "Pipeline",
    "PipelineConfig",
    "ProgressBus",
    "RunJournal",
    "SchedulerSettings",
    "Subscription",
    "case_references",
    "fingerprint",
    "open_pipeline",
    "repetitions",
]
