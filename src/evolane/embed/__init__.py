"""evolane inside an agent process: a runtime that runs actors and optimize runs, with Python
backends for replay, judge and optimizer (`evolane.aio` hosts the same on asyncio)."""

from evolane.actors._backends import Backend, BackendCall
from evolane.campaign._run import Backends, RunOutcome
from evolane.embed._request import OptimizeRequest
from evolane.embed._runtime import EmbeddedRuntime, RunCancelled, RunHandle, open_runtime

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
