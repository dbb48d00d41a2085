"""Ctrl-C (or SIGTERM) while the command line is still loading its modules.

Loading takes a second or more on a busy host, and a `KeyboardInterrupt` raised inside a C
extension's module initialisation can crash the interpreter (a segmentation fault in
``orjson``'s, seen when Ctrl-C came 0.3 s after ``evolane optimize``: exit -11, no message)
or print an import traceback. So the package holds both signals while it loads its modules
and `main` answers a held one as any interrupted start: one line, exit 130. Only Python's
own handlers are replaced (a host that set its own keeps them), only in the main thread,
and only for the import itself.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_HELD: list[int] = []
"""The signals that arrived while the modules loaded (consumed by `take_held`)."""
_DEFAULTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


def _hold(signum: int, _frame: FrameType | None) -> None:
    _HELD.append(signum)


@contextmanager
def holding_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM (where Python's defaults handle them) for the block."""
    replaced: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        for signum, default in _DEFAULTS.items():
            if signal.getsignal(signum) is default:
                replaced[signum] = signal.signal(signum, _hold)
    try:
        yield
    finally:
        for signum, previous in replaced.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]


def take_held() -> bool:
    """Whether a signal was held while the modules loaded (and forget it)."""
    held = bool(_HELD)
    _HELD.clear()
    return held
