"""Ctrl-C (or SIGTERM) while the command line is still loading its modules, and SIGTERM after.

Loading takes a second or more on a busy host, and a `KeyboardInterrupt` raised inside a C
extension's module initialisation can crash the interpreter (a segmentation fault in
``orjson``'s, seen when Ctrl-C came 0.3 s after ``evolane optimize``: exit -11, no message)
or print an import traceback. So the package holds both signals while it loads its modules
and `main` answers a held one as any interrupted start: one line, exit 130. Only Python's
own handlers are replaced (a host that set its own keeps them), only in the main thread,
and only for the import itself. From then on `main` answers SIGTERM as Ctrl-C
(`answer_sigterm_as_ctrl_c`), wherever a command has not taken both signals over.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
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


def answer_sigterm_as_ctrl_c() -> None:
    """From now on answer SIGTERM as Ctrl-C, where Python's defaults still handle both (in
    the main thread; a process started with Ctrl-C ignored, as in a script's background
    job, keeps SIGTERM's default: it must still end): it raises SIGINT, so whatever handles
    a Ctrl-C at that moment (Python's `KeyboardInterrupt`, trio's guarded one, a session's
    receiver, a run over that ignores it) handles it. Found by review: between the load and
    a run's start (a command's own imports, its reading of the inputs) SIGTERM killed the
    process (exit -15, no message) where a Ctrl-C is one line and exit 130."""
    if threading.current_thread() is not threading.main_thread():
        return
    if (
        signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        signal.signal(signal.SIGTERM, _as_ctrl_c)


def _as_ctrl_c(_signum: int, _frame: FrameType | None) -> None:
    signal.raise_signal(signal.SIGINT)


def exit_on_late_signal(code: int) -> None:
    """From now on (the command is over: its output written, exit code ``code``) a Ctrl-C or
    SIGTERM ends the process at once with ``code``, where the command answered them (SIGTERM
    as Ctrl-C): found by review, a thread a plugin or observer left running (not a daemon)
    held the process at exit, and a run had set Ctrl-C, and so SIGTERM, to be ignored."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not _as_ctrl_c:
        return  # started with Ctrl-C ignored (a script's background job): SIGTERM still ends it

    def _exit_now(_signum: int, _frame: FrameType | None) -> None:
        for stream in (sys.stdout, sys.stderr):
            with suppress(Exception):
                stream.flush()
        os._exit(code)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _exit_now)
    left = [t for t in threading.enumerate() if t is not threading.current_thread()]
    if any(not t.daemon and t.is_alive() for t in left):
        print(
            "evolane: waiting for threads a plugin or observer left running "
            "(Ctrl-C ends the process now)",
            file=sys.stderr,
        )
