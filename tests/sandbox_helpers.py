"""Shared pieces of the sandbox tests."""

from __future__ import annotations

from evolane.sandbox import SandboxHost, lease_holders
from evolane.testing import descendants


def sh(script: str, **fields: object) -> dict[str, object]:
    """Keyword arguments for a SandboxSpec that runs ``script`` with ``sh -c``."""
    return {"argv": ("sh", "-c", script), **fields}


def survivors(host: SandboxHost, before: set[int] | None = None) -> set[int]:
    """Processes of this host's lease, plus new descendants, that are still alive."""
    alive = lease_holders(host.lease)
    if before is not None:
        alive |= descendants() - before
    return alive
