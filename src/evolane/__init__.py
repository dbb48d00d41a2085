"""evolane: a trio actor runtime for fast, bounded, crash-consistent self-evolve campaigns."""

from evolane.actors import Actor, ActorRef
from evolane.supervisors import ActorSpec, Runtime, SupervisorSpec, open_runtime

__version__ = "0.1.0"

__all__ = [
    "Actor",
    "ActorRef",
    "ActorSpec",
    "Runtime",
    "SupervisorSpec",
    "__version__",
    "open_runtime",
]
