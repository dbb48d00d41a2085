"""Test support for evolane and its users: leak detection (a pytest plugin comes later)."""

from evolane.testing._leaks import (
    LEASE_VARIABLE,
    descendants,
    kill_processes,
    leaked_processes,
    lease_holders,
)

__all__ = ["LEASE_VARIABLE", "descendants", "kill_processes", "leaked_processes", "lease_holders"]
