"""evolane inside an agent process: a runtime that runs actors and optimize runs, with Python
backends for replay, judge and optimizer, and observers of a run's progress, among them an
OpenTelemetry exporter (extra ``evolane[otel]``; `evolane.aio` hosts the same on asyncio), and
`EvolveService`: background evolution from the agent's own recorded trajectories."""

from typing import TYPE_CHECKING

from evolane._lazy import lazy_exports

if TYPE_CHECKING:
    from evolane.campaign import Backends, RunOutcome
    from evolane.embed._budget import BudgetDamaged, ServiceBudget, budget_file
    from evolane.embed._observers import (
        OBSERVER_BUFFER,
        OBSERVER_CLOSE_TIMEOUT,
        OBSERVER_DRAIN_TIMEOUT,
        Observer,
        ObserverLike,
        ObserverReport,
        observer_name,
        observer_plugin,
    )
    from evolane.embed._otel import OpenTelemetryObserver
    from evolane.embed._pending import EvolveMode, PendingJob, QueueFull
    from evolane.embed._pending_run import PendingJobs
    from evolane.embed._request import OptimizeRequest
    from evolane.embed._runtime import (
        RUNTIME_CLOSED,
        EmbeddedRuntime,
        RunCancelled,
        RunHandle,
        check_arguments,
        open_runtime,
    )
    from evolane.embed._service import (
        EvolvePolicy,
        EvolveService,
        ServiceSettings,
        open_evolve_service,
    )
    from evolane.lanes import Backend, BackendCall, PluginError

__all__ = [
    "OBSERVER_BUFFER",
    "OBSERVER_CLOSE_TIMEOUT",
    "OBSERVER_DRAIN_TIMEOUT",
    "RUNTIME_CLOSED",
    "Backend",
    "BackendCall",
    "Backends",
    "BudgetDamaged",
    "EmbeddedRuntime",
    "EvolveMode",
    "EvolvePolicy",
    "EvolveService",
    "Observer",
    "ObserverLike",
    "ObserverReport",
    "OpenTelemetryObserver",
    "OptimizeRequest",
    "PendingJob",
    "PendingJobs",
    "PluginError",
    "QueueFull",
    "RunCancelled",
    "RunHandle",
    "RunOutcome",
    "ServiceBudget",
    "ServiceSettings",
    "budget_file",
    "check_arguments",
    "observer_name",
    "observer_plugin",
    "open_evolve_service",
    "open_runtime",
]

__getattr__ = lazy_exports(__name__)
