"""Test support for evolane and its users: leak detection, hostile process trees, seeded
fault injection (`Chaos`), a chat-completions stub server for the model backends
(`ChatStub`), and a pytest plugin (`evolane.testing.plugin`)."""

from typing import TYPE_CHECKING, Any

from evolane.testing._chaos import Chaos, ChaosFault
from evolane.testing._leaks import (
    LEASE_VARIABLE,
    descendants,
    kill_processes,
    leaked_processes,
    lease_holders,
)
from evolane.testing._trees import DAEMON_AFTER_EXIT_SH, EVIL_TREE_SH, POLITE_TREE_SH

if TYPE_CHECKING:
    from evolane.testing._chat_stub import ChatStub, StubRule, StubScript, StubStats

_CHAT_STUB_NAMES = frozenset({"ChatStub", "StubRule", "StubScript", "StubStats"})


def __getattr__(name: str) -> Any:
    """The chat stub's names, imported on first use: ``python -m evolane.testing._chat_stub``
    then runs a module that this package has not imported already."""
    if name in _CHAT_STUB_NAMES:
        from evolane.testing import _chat_stub

        return getattr(_chat_stub, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
