"""Test support for evolane and its users: leak detection, hostile process trees, seeded
fault injection (`Chaos`), and a pytest plugin (`evolane.testing.plugin`)."""

from evolane.testing._chaos import Chaos, ChaosFault
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
    "Chaos",
    "ChaosFault",
    "descendants",
    "kill_processes",
    "leaked_processes",
    "lease_holders",
]
