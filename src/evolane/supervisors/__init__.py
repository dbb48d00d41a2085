"""Supervision: OTP strategies and restart intensity on trio nurseries, and the runtime root."""

from typing import TYPE_CHECKING

from evolane._lazy import lazy_exports

if TYPE_CHECKING:
    from evolane._allocator import fix_mmap_threshold
    from evolane.supervisors._errors import StartFailed, SupervisorEscalation, leaf_exceptions
    from evolane.supervisors._runtime import Runtime, open_runtime
    from evolane.supervisors._spec import ActorSpec, ChildSpec, Restart, Strategy, SupervisorSpec
    from evolane.supervisors._supervisor import Supervisor

__all__ = [
    "ActorSpec",
    "ChildSpec",
    "Restart",
    "Runtime",
    "StartFailed",
    "Strategy",
    "Supervisor",
    "SupervisorEscalation",
    "SupervisorSpec",
    "fix_mmap_threshold",
    "leaf_exceptions",
    "open_runtime",
]

__getattr__ = lazy_exports(__name__)
