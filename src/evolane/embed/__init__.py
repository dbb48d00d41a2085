"""evolane inside an agent process: a runtime that runs actors and optimize runs, with Python
backends for replay, judge and optimizer (`evolane.aio` hosts the same on asyncio)."""

from evolane.campaign import Backends, RunOutcome
from evolane.embed._request import OptimizeRequest
from evolane.embed._runtime import EmbeddedRuntime, RunCancelled, RunHandle, open_runtime
from evolane.lanes import Backend, BackendCall

__all__ = [
    "Backend",
    "BackendCall",
    "Backends",
    "EmbeddedRuntime",
    "OptimizeRequest",
    "RunCancelled",
    "RunHandle",
    "RunOutcome",
    "open_runtime",
]
