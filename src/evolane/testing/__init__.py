"""Test support for evolane and its users: leak detection and hostile process trees."""

from evolane.testing._leaks import (
    LEASE_VARIABLE,
    descendants,
    kill_processes,
    leaked_processes,
    lease_holders,
)
from evolane.testing._trees import DAEMON_AFTER_EXIT_SH, EVIL_TREE_SH, POLITE_TREE_SH

__all__ = [
    "DAEMON_AFTER_EXIT_SH",
    "EVIL_TREE_SH",
    "LEASE_VARIABLE",
    "POLITE_TREE_SH",
    "descendants",
    "kill_processes",
    "leaked_processes",
    "lease_holders",
]
