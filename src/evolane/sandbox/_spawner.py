"""The client of the spawn server (`evolane.sandbox._spawnd`): one per `SandboxHost`.

Where the server works (Linux >= 5.7 with clone3 allowed), a command is born in its unit's
cgroup v2 directory with its rlimits set and, when evolane is root at the ``process`` level,
its dangerous capabilities gone from its bounding set, or (a ``drop_root`` command) running
as its unit uid: one exec (the command's), where the launcher chain of
`evolane.sandbox._launch` takes three (``sh`` to join the cgroups, ``setpriv``, the command)
and a cgroup migration. Anywhere else the launcher chain runs, as before: `Spawner.start`
returns None, and a spawner that breaks later stops being used.
"""

from __future__ import annotations

import contextlib
import errno
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

import trio

from evolane.sandbox import _spawnd
from evolane.sandbox._secrets import (
    DROPPED_CAPABILITIES,
    UNIT_UID_BASE,
    UNIT_UID_CAPABILITIES,
)
from evolane.store import close_fd, close_in_forks

_REPLY_BYTES = 4096
_SEQPACKET_OVERHEAD = 64  # a message may take the send buffer less ~32 bytes
_NOT_SENT = (errno.EMSGSIZE, errno.ENOBUFS, errno.ENOMEM)  # too large now, not a dead server
_FAILURE_BYTES = 2048  # what a child that could not exec writes at most (as _spawnd)
_PIPE_BYTES = _spawnd.PID_BYTES + _FAILURE_BYTES  # what an error pipe holds, kept at most
REPLY_TIMEOUT = 10.0
"""Seconds a spawn waits for the server's reply, and then for the clone's exec (each takes
well under one): past them a hung server (stopped by a signal, say) is killed, and a clone
that never reached its exec too."""
SERVER_EXIT_WAIT = 5.0
"""Seconds the server gets to exit once its socket closes; past them it is killed."""
_REAP_PAUSE_MAX = 0.02  # the longest pause between two checks of a clone being reaped


class SpawnerUnavailable(Exception):
    """The server did not take this request (too large, gone, or its kernel's clone3 too
    old): no clone of it exists, so the launcher chain may run it instead."""


class _NoReply(Exception):
    """The server took the request but never answered (killed now)."""


def _last_capability() -> int:
    try:
        return int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        return 40


def _dropped_numbers() -> tuple[int, ...]:
    """The capability numbers to drop that this kernel knows."""
    last = _last_capability()
    return tuple(n for n in DROPPED_CAPABILITIES.values() if n <= last)


UserCounts = tuple[tuple[str, int], ...]
"""(``/proc/sys/user/max_*`` file, cap) pairs the clone sets in its own user namespace."""
UidSwitch = tuple[int, tuple[int, ...]]
"""(uid, the capabilities kept): the clone becomes the unit uid (see `_spawnd._switch_uid`)."""


class Spawner:
    """A connection to one running spawn server; `spawn` may be called from any thread."""

    def __init__(self, process: subprocess.Popen[bytes], connection: socket.socket) -> None:
        self._process = process
        self._socket = connection
        close_in_forks(connection.fileno())  # its EOF: the client is gone, the server leaves
        with contextlib.suppress(OSError):  # capped by the kernel's wmem_max
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _spawnd.MAX_REQUEST)
        room = connection.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) - _SEQPACKET_OVERHEAD
        self.largest_request = min(_spawnd.MAX_REQUEST, room)
        """Bytes of the largest request this connection sends (larger ones: the launcher)."""
        self._lock = threading.Lock()  # one request in flight: replies come in order
        self._trio_lock = trio.Lock()  # the tasks of a trio loop wait here, not on ``_lock``
        self._devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.broken = False
        self.reply_timeout = REPLY_TIMEOUT
        self.dropped: tuple[int, ...] = ()
        """The capabilities a root command loses in the clone (probed by `start`)."""
        self.switches_uid = False
        """Whether the clone can become a ``drop_root`` command's unit uid (probed)."""
        kept = tuple(UNIT_UID_CAPABILITIES.values())
        self._kept, self._unit_bounding = (
            kept,
            tuple(n for n in range(_last_capability() + 1) if n not in kept),
        )

    @classmethod
    def start(cls, probe_cgroup: str | None = None) -> Spawner | None:
        """Start a server and probe it with ``true`` (born in ``probe_cgroup``, an empty
        cgroup v2 directory, when units will be: an older kernel refuses only that); None
        where it cannot spawn."""
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
            if spawner._probe(true, dropped, probe_cgroup):
                spawner.dropped = dropped
                break
        else:
            spawner.close()
            return None
        if os.geteuid() == 0:  # else a drop_root command keeps evolane's uid
            spawner.switches_uid = spawner._probe(true, (), probe_cgroup, UNIT_UID_BASE)
        return spawner

    def _probe(
        self, true: str, dropped: tuple[int, ...], cgroup: str | None, uid: int | None = None
    ) -> bool:
        output = (self._devnull, self._devnull)
        try:
            switch = self.uid_switch(uid) if uid is not None else None
            pid = self.spawn(true, [true], {}, "/", output, [], [], dropped, cgroup, switch)
        except (OSError, SpawnerUnavailable):
            return False
        status = _reap(pid, self.reply_timeout, kill=False)
        return status is not None and os.waitstatus_to_exitcode(status) == 0

    def spawn(
        self,
        path: str,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        output: tuple[int, int],
        rlimits: list[tuple[int, int, int]],
        v1_tasks: list[str],
        dropped: tuple[int, ...],
        cgroup: str | None,
        switch: UidSwitch | None = None,
        seccomp: bytes | None = None,
        counts: UserCounts = (),
    ) -> int:
        """Start ``path`` with ``argv`` as a child of this process, in a session of its own,
        stdin from /dev/null, stdout and stderr to ``output``; returns its pid once it has
        exec'd. ``switch`` (from `uid_switch`): it runs as that unit uid, and ``dropped``
        is ignored. ``seccomp``: a filter the clone installs last (a confined command's).
        ``counts``: the clone runs it in a user namespace of its own with these caps.
        Raises OSError when it could not start (the child is killed and reaped), and
        `SpawnerUnavailable` when the server did not take the request."""
        payload = self._request(
            path, argv, env, cwd, rlimits, v1_tasks, dropped, cgroup, switch, seccomp, counts
        )
        failed_read, failed_write = os.pipe2(os.O_CLOEXEC)
        try:
            try:
                reply = self._ask(payload, (self._devnull, *output, failed_write))
            except _NoReply as error:
                os.close(failed_write)
                failed_write = -1
                if self._end_lost_clone(failed_read):
                    raise OSError(0, str(error)) from None
                raise SpawnerUnavailable(str(error)) from None  # no clone: the launcher may
            os.close(failed_write)
            failed_write = -1
            pid = self._cloned(reply)
            failure = _failure(*_read(failed_read, self.reply_timeout, _PIPE_BYTES, True))
        finally:
            os.close(failed_read)
            if failed_write >= 0:
                os.close(failed_write)
        if failure:  # killed too: a clone that failed may have been stopped before its exit
            _reap(pid, self.reply_timeout)
            raise _spawn_error(failure)
        return pid

    async def spawn_from_trio(
        self,
        path: str,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        output: tuple[int, int],
        rlimits: list[tuple[int, int, int]],
        v1_tasks: list[str],
        dropped: tuple[int, ...],
        cgroup: str | None,
        switch: UidSwitch | None = None,
        seccomp: bytes | None = None,
        counts: UserCounts = (),
    ) -> int | None:
        """`spawn` awaited on a trio event loop: no thread, and nothing blocks the loop (the
        rare failure paths that must wait for a clone to die run in a worker thread). None,
        with nothing sent, while a worker thread's `spawn` holds the connection: `spawn` it
        there too. Not cancellable once called: it ends within its timeouts, as `spawn`."""
        payload = self._request(
            path, argv, env, cwd, rlimits, v1_tasks, dropped, cgroup, switch, seccomp, counts
        )
        with trio.CancelScope(shield=True):
            failed_read, failed_write = os.pipe2(os.O_CLOEXEC)
            try:
                try:
                    fds = (self._devnull, *output, failed_write)
                    reply = await self._ask_from_trio(payload, fds)
                finally:
                    os.close(failed_write)  # the server holds its copy once sent
                if reply is None:
                    return None
                pid = self._cloned(reply)
                data, eof = await _read_from_trio(failed_read, self.reply_timeout)
            except _NoReply as error:
                if await trio.to_thread.run_sync(self._end_lost_clone, failed_read):
                    raise OSError(0, str(error)) from None
                raise SpawnerUnavailable(str(error)) from None
            finally:
                os.close(failed_read)
            failure = _failure(data, eof)
            if failure:  # killed too: a clone that failed may have been stopped first
                await trio.to_thread.run_sync(_reap, pid, self.reply_timeout)
                raise _spawn_error(failure)
        return pid

    def _request(
        self,
        path: str,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        rlimits: list[tuple[int, int, int]],
        v1_tasks: list[str],
        dropped: tuple[int, ...],
        cgroup: str | None,
        switch: UidSwitch | None,
        seccomp: bytes | None,
        counts: UserCounts,
    ) -> bytes:
        """The request `spawn` sends (`SpawnerUnavailable` when it is too large)."""
        if switch is not None:
            dropped = self._unit_bounding
        request = (path, argv, env, cwd, rlimits, v1_tasks, dropped, cgroup, switch)
        payload = marshal.dumps((*request, seccomp, counts))
        if len(payload) > self.largest_request:
            raise SpawnerUnavailable("the request is larger than the spawn server takes")
        return payload

    def _cloned(self, reply: tuple[int, int, str, bool]) -> int:
        """The clone's pid from the server's reply; raises when there is no clone."""
        pid, number, message, unsupported = reply
        if unsupported:  # no clone: the kernel's clone3 lacks what we need
            self.broken = True
            raise SpawnerUnavailable(message)
        if not pid:
            raise OSError(number, message)
        return pid

    def uid_switch(self, uid: int) -> UidSwitch:
        """The `spawn` argument that runs a command as ``uid`` with only
        `UNIT_UID_CAPABILITIES` (the ``setpriv`` step of a root evolane's launcher chain)."""
        return uid, self._kept

    def _ask(self, payload: bytes, fds: tuple[int, ...]) -> tuple[int, int, str, bool]:
        """Send one request and wait for its reply (`SpawnerUnavailable` when unsent,
        `_NoReply` when sent but unanswered: the server is then killed)."""
        with self._lock:
            self._send(payload, fds)
            try:
                return self._reply(self._socket.recv(_REPLY_BYTES))
            except OSError as error:
                raise self._lost(error) from error

    async def _ask_from_trio(
        self, payload: bytes, fds: tuple[int, ...]
    ) -> tuple[int, int, str, bool] | None:
        """`_ask`, the reply awaited on the loop; None, with nothing sent, while a worker
        thread's request holds the connection."""
        async with self._trio_lock:  # the loop's tasks, one at a time
            if not self._lock.acquire(blocking=False):
                return None
            try:
                self._send(payload, fds)  # a request fits the send buffer: this does not wait
                data = None
                with trio.move_on_after(self.reply_timeout):
                    await trio.lowlevel.wait_readable(self._socket)
                    try:
                        data = self._socket.recv(_REPLY_BYTES)  # readable: at once
                    except OSError as error:
                        raise self._lost(error) from error
                if data is None:
                    raise self._lost(TimeoutError())
                return self._reply(data)
            finally:
                self._lock.release()

    def _send(self, payload: bytes, fds: tuple[int, ...]) -> None:
        """Send one request (the connection's lock held)."""
        if self.broken:
            raise SpawnerUnavailable("the spawn server broke earlier")
        if self._socket.gettimeout() != self.reply_timeout:  # each set is an ioctl
            self._socket.settimeout(self.reply_timeout)
        try:
            socket.send_fds(self._socket, [payload], list(fds))
        except OSError as error:
            if error.errno not in _NOT_SENT:  # this request's size, not the server
                self._break()
            raise SpawnerUnavailable(str(error)) from error

    def _reply(self, data: bytes) -> tuple[int, int, str, bool]:
        """The server's reply decoded (`_NoReply` when it is not one)."""
        try:
            pid, number, message, unsupported = marshal.loads(data)
            return int(pid), int(number), str(message), bool(unsupported)
        except (ValueError, EOFError, TypeError) as error:
            raise self._lost(error) from error

    def _lost(self, error: Exception) -> _NoReply:
        """A sent request whose reply never came: the server is killed."""
        self._break()
        why = "timed out" if isinstance(error, TimeoutError) else "failed"
        return _NoReply(f"the spawn server {why} during this spawn")

    def _break(self) -> None:
        """Stop using the server for good, and kill it: no request it holds may run later."""
        self.broken = True
        with contextlib.suppress(OSError):
            self._process.kill()

    def _end_lost_clone(self, failed_read: int) -> bool:
        """After a reply that never came (the server is dead now): whether a clone may have
        run. A clone writes its pid first on the error pipe: it is killed with its process
        group (its unit's cgroup, when it has one, ends the rest) and reaped. EOF before a
        pid means none was made; a pipe still silent at the timeout counts as one."""
        pid, eof = _read_pid(failed_read, self.reply_timeout)
        if pid is None:
            return not eof
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        _reap(pid, self.reply_timeout)
        return True

    @property
    def pid(self) -> int:
        """The server's pid."""
        return self._process.pid

    def close(self) -> None:
        """Stop taking requests, close the connection (the server exits at EOF) and reap
        the server (killed if it does not leave in time). Never raises."""
        with self._lock:
            self.broken = True
            with contextlib.suppress(OSError):
                if self._socket.fileno() >= 0:
                    close_fd(self._socket.detach())
            if self._devnull >= 0:  # a second close must not close a reused number
                with contextlib.suppress(OSError):
                    os.close(self._devnull)
                self._devnull = -1
        try:
            self._process.wait(timeout=SERVER_EXIT_WAIT)
        except subprocess.TimeoutExpired:
            self._process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=SERVER_EXIT_WAIT)


def _failure(data: bytes, eof: bool) -> bytes:
    """What a clone's error pipe (read to EOF, or to the timeout) says: b"" when the clone
    exec'd; else its failure (at most `_FAILURE_BYTES`), or that it never reached its exec
    in time when the pipe stayed open with nothing but the pid on it."""
    failure = data[_spawnd.PID_BYTES :]
    return failure if eof or failure else b"0:the command did not reach its exec in time"


def _spawn_error(failure: bytes) -> OSError:
    """The error a clone's failure (``errno:text``) raises."""
    code, _, text = failure.decode(errors="replace").partition(":")
    return OSError(int(code) if code.isdigit() else 0, text or "spawn failed")


async def _read_from_trio(fd: int, timeout: float) -> tuple[bytes, bool]:
    """A clone's error pipe read on the loop as `_read` reads it to EOF: up to
    `_PIPE_BYTES` within ``timeout`` seconds, and whether EOF came."""
    data = b""
    with trio.move_on_after(timeout):
        while True:
            await trio.lowlevel.wait_readable(fd)
            chunk = os.read(fd, 4096)
            if not chunk:
                return data, True
            data += chunk[: _PIPE_BYTES - len(data)]
    return data, False


def _read_pid(fd: int, timeout: float) -> tuple[int | None, bool]:
    """A clone's pid from its error pipe as soon as it is there (None: not within
    ``timeout``), and whether the pipe reached EOF first."""
    data, eof = _read(fd, timeout, _spawnd.PID_BYTES, until_eof=False)
    return _pid_of(data), eof


def _read(fd: int, timeout: float, keep: int, until_eof: bool) -> tuple[bytes, bool]:
    """Up to ``keep`` bytes of ``fd`` within ``timeout`` seconds, reading on to EOF when
    ``until_eof`` (else stopping once ``keep`` are in); and whether EOF came."""
    data, poller = b"", select.poll()
    poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout
    while (until_eof or len(data) < keep) and (left := deadline - time.monotonic()) > 0:
        if not poller.poll(left * 1000):
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            return data, True
        data += chunk[: keep - len(data)]
    return data, False


def _reap(pid: int, timeout: float, kill: bool = True) -> int | None:
    """The wait status of ``pid``, a clone of ours, reaped within ``timeout`` seconds
    (SIGKILLed first when ``kill``, and once the timeout is out otherwise). None when it is
    not ours to reap, or outlives even SIGKILL (stuck in the kernel): then a daemon thread
    reaps it whenever it ends, and no caller waits without end."""
    if kill:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline, pause = time.monotonic() + timeout, 0.0002
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return status
        if time.monotonic() >= deadline:
            if not kill:
                return _reap(pid, timeout)
            threading.Thread(target=_reap_whenever, args=(pid,), daemon=True).start()
            return None
        time.sleep(pause)
        pause = min(2 * pause, _REAP_PAUSE_MAX)


def _reap_whenever(pid: int) -> None:
    """Reap a killed clone still stuck in the kernel once it ends (a daemon thread's job)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _pid_of(data: bytes) -> int | None:
    if len(data) < _spawnd.PID_BYTES:
        return None
    return int.from_bytes(data[: _spawnd.PID_BYTES], sys.byteorder)
