"""The client of the spawn server (`evolane.sandbox._spawnd`): one per `SandboxHost`.

Where the server works (Linux >= 5.7 with clone3 allowed), a command is born in its unit's
cgroup v2 directory with its rlimits set and, when evolane is root at the ``process`` level,
its dangerous capabilities gone from its bounding set: one exec (the command's), where the
launcher chain of `evolane.sandbox._launch` takes three (``sh`` to join the cgroups,
``setpriv``, the command) and a cgroup migration. Anywhere else the launcher chain runs, as
before: `Spawner.start` returns None, and a spawner that breaks later stops being used.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from evolane.sandbox import _spawnd
from evolane.sandbox._secrets import DROPPED_CAPABILITIES

_CAPABILITY_NUMBERS = {
    "dac_read_search": 2,
    "sys_module": 16,
    "sys_rawio": 17,
    "sys_ptrace": 19,
    "sys_admin": 21,
    "perfmon": 38,
    "bpf": 39,
    "checkpoint_restore": 40,
}
"""linux/capability.h numbers of `DROPPED_CAPABILITIES`."""
_REPLY_BYTES = 4096
_FAILURE_BYTES = 2048  # what a child that could not exec writes at most (as _spawnd)
REPLY_TIMEOUT = 10.0
"""Seconds a spawn waits for the server's reply, and then for the clone's exec (each takes
well under one): past them a hung server (stopped by a signal, say) is killed, and a clone
that never reached its exec too."""
SERVER_EXIT_WAIT = 5.0
"""Seconds the server gets to exit once its socket closes; past them it is killed."""


class SpawnerUnavailable(Exception):
    """The server cannot take this request (gone, or the request too large): use the
    launcher chain instead."""


def _dropped_numbers() -> tuple[int, ...]:
    """The capability numbers to drop that this kernel knows."""
    try:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        last = 40
    return tuple(n for name in DROPPED_CAPABILITIES if (n := _CAPABILITY_NUMBERS[name]) <= last)


class Spawner:
    """A connection to one running spawn server; `spawn` may be called from any thread."""

    def __init__(self, process: subprocess.Popen[bytes], connection: socket.socket) -> None:
        self._process = process
        self._socket = connection
        self._socket.settimeout(REPLY_TIMEOUT)
        self._lock = threading.Lock()
        self._devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.broken = False
        self.dropped: tuple[int, ...] = ()
        """The capabilities a root command loses in the clone (probed by `start`)."""

    @classmethod
    def start(cls) -> Spawner | None:
        """Start a server and probe it with ``true``; None where it cannot spawn."""
        true = shutil.which("true", path="/usr/bin:/bin")
        if true is None or not sys.platform.startswith("linux"):
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", _spawnd.__file__, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                env={},
            )
        except OSError:
            ours.close()
            return None
        finally:
            theirs.close()
        spawner = cls(process, ours)
        drops = _dropped_numbers() if os.geteuid() == 0 else ()
        for dropped in (drops, ()) if drops else ((),):
            if spawner._probe(true, dropped):
                spawner.dropped = dropped
                return spawner
        spawner.close()
        return None

    def _probe(self, true: str, dropped: tuple[int, ...]) -> bool:
        try:
            pid = self.spawn(true, [true], {}, "/", (self._devnull,) * 2, [], [], dropped, None)
        except (OSError, SpawnerUnavailable):
            return False
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status) == 0

    def spawn(
        self,
        path: str,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        output: tuple[int, int],
        rlimits: list[tuple[int, int, int]],
        v1_procs: list[str],
        dropped: tuple[int, ...],
        cgroup: str | None,
    ) -> int:
        """Start ``path`` with ``argv`` as a child of this process, in a session of its own,
        stdin from /dev/null, stdout and stderr to ``output``; returns its pid once it has
        exec'd. Raises OSError when it could not start (the child is reaped), and
        `SpawnerUnavailable` when the server could not take the request."""
        request = (path, argv, env, cwd, rlimits, v1_procs, dropped, cgroup)
        payload = marshal.dumps(request)
        if len(payload) > _spawnd.MAX_REQUEST:
            raise SpawnerUnavailable("the request is larger than the spawn server takes")
        failed_read, failed_write = os.pipe2(os.O_CLOEXEC)
        try:
            reply = self._ask(payload, (self._devnull, *output, failed_write))
            os.close(failed_write)
            failed_write = -1
            pid, number, message = reply
            if not pid:
                raise OSError(number, message)
            failure = _read_failure(failed_read)
        finally:
            os.close(failed_read)
            if failed_write >= 0:
                os.close(failed_write)
        if failure is None:  # never reached its exec: it is ours to end
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            failure = b"0:the command did not reach its exec in time"
        if failure:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            code, _, text = failure.decode(errors="replace").partition(":")
            raise OSError(int(code) if code.isdigit() else 0, text or "spawn failed")
        return pid

    def _ask(self, payload: bytes, fds: tuple[int, ...]) -> tuple[int, int, str]:
        """Send one request and wait for its reply. Unsent: `SpawnerUnavailable` (the
        launcher may run it instead). Sent but unanswered: OSError, and the server is
        killed, for a clone it made may be running (its unit's cgroup ends it), and must be
        the only one."""
        with self._lock:
            if self.broken:
                raise SpawnerUnavailable("the spawn server broke earlier")
            try:
                socket.send_fds(self._socket, [payload], list(fds))
            except OSError as error:
                self._break()
                raise SpawnerUnavailable(str(error)) from error
            try:
                data = self._socket.recv(_REPLY_BYTES)
                pid, number, message = marshal.loads(data)
                return int(pid), int(number), str(message)
            except (OSError, ValueError, EOFError, TypeError) as error:
                self._break()
                why = "timed out" if isinstance(error, TimeoutError) else "failed"
                raise OSError(0, f"the spawn server {why} during this spawn") from error

    def _break(self) -> None:
        """Stop using the server for good, and kill it: no request it still holds may run."""
        self.broken = True
        with contextlib.suppress(OSError):
            self._process.kill()

    @property
    def pid(self) -> int:
        """The server's pid."""
        return self._process.pid

    def close(self) -> None:
        """Close the connection (the server exits at EOF) and reap the server."""
        with contextlib.suppress(OSError):
            self._socket.close()
        with contextlib.suppress(OSError):
            os.close(self._devnull)
        try:
            self._process.wait(timeout=SERVER_EXIT_WAIT)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=SERVER_EXIT_WAIT)


def _read_failure(fd: int) -> bytes | None:
    """What a clone wrote on its error pipe before the pipe closed: b"" when it exec'd,
    its failure otherwise (at most `_FAILURE_BYTES`); None when the pipe stayed open
    `REPLY_TIMEOUT` seconds."""
    chunks, size = [], 0
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + REPLY_TIMEOUT
    while (left := deadline - time.monotonic()) > 0:
        if not poller.poll(left * 1000):
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            return b"".join(chunks)
        if size < _FAILURE_BYTES:
            chunks.append(chunk[: _FAILURE_BYTES - size])
            size += len(chunks[-1])
    return None
