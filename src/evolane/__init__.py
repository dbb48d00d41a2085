"""evolane: a trio actor runtime for fast, bounded, crash-consistent self-evolve campaigns.

The names below load on first use, so that light entry points (the example replay, judge
and optimizer commands) start without importing trio or pydantic.
"""

from __future__ import annotations

import importlib

from evolane._version import __version__

TYPE_CHECKING = False  # not imported from typing, which alone costs ~10 ms of start-up
if TYPE_CHECKING:
    from evolane.actors import Actor, ActorRef
    from evolane.campaign import CampaignConfig, Report
    from evolane.embed import (
        Backend,
        BackendCall,
        Backends,
        EmbeddedRuntime,
        Observer,
        OptimizeRequest,
        RunCancelled,
        RunHandle,
        open_runtime,
    )
    from evolane.supervisors import ActorSpec, Runtime, SupervisorSpec

_LAZY = {
    "Actor": "evolane.actors",
    "ActorRef": "evolane.actors",
    "ActorSpec": "evolane.supervisors",
    "Runtime": "evolane.supervisors",
    "SupervisorSpec": "evolane.supervisors",
    "open_runtime": "evolane.embed",
    "EmbeddedRuntime": "evolane.embed",
    "OptimizeRequest": "evolane.embed",
    "Observer": "evolane.embed",
    "RunHandle": "evolane.embed",
    "RunCancelled": "evolane.embed",
    "Backend": "evolane.embed",
    "BackendCall": "evolane.embed",
    "Backends": "evolane.embed",
    "CampaignConfig": "evolane.campaign",
    "Report": "evolane.campaign",
}

__all__ = [
    "Actor",
    "ActorRef",
    "ActorSpec",
    "Backend",
    "BackendCall",
    "Backends",
    "CampaignConfig",
    "EmbeddedRuntime",
    "Observer",
    "OptimizeRequest",
    "Report",
    "RunCancelled",
    "RunHandle",
    "Runtime",
    "SupervisorSpec",
    "__version__",
    "open_runtime",
]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'evolane' has no attribute {name!r}")
