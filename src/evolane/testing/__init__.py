"""Test support for evolane and its users: leak detection, hostile process trees, seeded
fault injection (`Chaos`), a chat-completions stub server for the model backends
(`ChatStub`), and a pytest plugin (`evolane.testing.plugin`)."""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_LAZY = {
    **dict.fromkeys(("Chaos", "ChaosFault"), "_chaos"),
    **dict.fromkeys(("ChatStub", "StubRule", "StubScript", "StubStats"), "_chat_stub"),
    **dict.fromkeys(
        ("LEASE_VARIABLE", "descendants", "kill_processes", "leaked_processes", "lease_holders"),
        "_leaks",
    ),
    **dict.fromkeys(("DAEMON_AFTER_EXIT_SH", "EVIL_TREE_SH", "POLITE_TREE_SH"), "_trees"),
}


def __getattr__(name: str) -> Any:
    """Every name imported on first use: the pytest plugin (`evolane.testing.plugin`) loads
    in every pytest session of an environment with evolane installed, and must not load the
    runtime there (found by review: ~0.4 s and trio, pydantic and the sandbox on every run);
    ``python -m evolane.testing._chat_stub`` also runs a module not imported already."""
    if name in _LAZY:
        value = getattr(importlib.import_module(f"evolane.testing.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
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
