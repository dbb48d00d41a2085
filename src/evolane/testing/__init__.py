"""Test support for evolane and its users: leak detection, hostile process trees, seeded
fault injection (`Chaos`), a chat-completions stub server for the model backends
(`ChatStub`), and a pytest plugin (`evolane.testing.plugin`)."""

from evolane.testing._chaos import Chaos, ChaosFault
from evolane.testing._chat_stub import ChatStub, StubRule, StubScript, StubStats
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
    "ChatStub",
    "StubRule",
    "StubScript",
    "StubStats",
    "descendants",
    "kill_processes",
    "leaked_processes",
    "lease_holders",
]
