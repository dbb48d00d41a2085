"""The two process-wide flags a sandbox host needs, held while any host of the process is
open and put back as they were when the last one closes.

The process may be an agent's (the embedded API): a runtime must leave it as it found it.
Left set after the last host closed, the flags went on changing the agent's process:

* non-dumpable (`evolane.sandbox._secrets.make_undumpable`): no core dump of the agent, and
  no debugger or ``py-spy`` of its user could attach, for the rest of its life;
* child subreaper (`evolane.sandbox._tree.become_subreaper`): every orphan of any program
  the agent ran later (a tool that backgrounds a process and exits) was re-parented to the
  agent, which never reaps it: one zombie each, until the process table is full.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

from evolane.sandbox._secrets import make_undumpable
from evolane.sandbox._tree import become_subreaper

_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4
_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37


@dataclass
class _Held:
    hosts: int = 0
    dumpable: int | None = None  # as the first host found them (None: unknown)
    subreaper: int | None = None


_LOCK = threading.Lock()
_HELD = _Held()


def hold_host_flags() -> tuple[bool, bool]:
    """Make the process non-dumpable and a child subreaper for one more host (the first
    saves what the flags were); returns whether each is in force. Pair every call with
    `release_host_flags`."""
    with _LOCK:
        if _HELD.hosts == 0:
            _HELD.dumpable, _HELD.subreaper = _dumpable(), _subreaper()
        _HELD.hosts += 1
        return make_undumpable(), become_subreaper()


def release_host_flags() -> None:
    """One host fewer: when none is left, put both flags back as the first host found them
    (a value the kernel refuses to set again is left as it is)."""
    with _LOCK:
        _HELD.hosts = max(0, _HELD.hosts - 1)
        if _HELD.hosts:
            return
        if _HELD.dumpable in (0, 1):
            _prctl(_PR_SET_DUMPABLE, _HELD.dumpable)
        if _HELD.subreaper is not None:
            _prctl(_PR_SET_CHILD_SUBREAPER, _HELD.subreaper)


def _dumpable() -> int | None:
    value = _prctl(_PR_GET_DUMPABLE, 0)
    return None if value is None or value < 0 else value


def _subreaper() -> int | None:
    flag = ctypes.c_int(0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return int(bool(flag.value))


def _prctl(option: int, value: int) -> int | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0))
    except (OSError, AttributeError):
        return None
