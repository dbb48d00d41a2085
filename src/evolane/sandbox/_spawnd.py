"""The spawn server: a single-threaded helper that starts commands for evolane (issue 22).

Run as ``python -I -S _spawnd.py FD`` with its end of a ``SOCK_SEQPACKET`` pair as FD; it
imports only the standard library. For each request it calls ``clone3`` with CLONE_PARENT,
so the command is born a child of evolane (which waits for it, reaps it and owns its pid
exactly as if it had forked it), and, given a cgroup v2 directory, CLONE_INTO_CGROUP, so the
command is born inside its unit's cgroup: no launcher shell exec'd to join it, and no
migration (each of which waits for an RCU grace period). The clone is a copy of this
process, which has one thread, so the Python code it runs before ``execve`` cannot meet a
lock another thread held (the hazard of ``preexec_fn`` in evolane's own threaded process).

A request is ``marshal`` data plus file descriptors; see `evolane.sandbox._spawner`.
A reply is ``(pid, 0, "", False)`` or ``(0, errno, message, unsupported)``; ``unsupported``
says clone3 itself refused (no such call, or no CLONE_INTO_CGROUP): then no clone exists and
the launcher chain may run the request instead. A clone first writes its pid on the request's
error pipe (so evolane can end it even if the reply never comes), then, if it cannot exec,
its failure. The server exits at EOF, so it never outlives evolane, and it is non-dumpable,
so a command cannot read other units' environments from its memory.
"""

from __future__ import annotations

import array
import ctypes
import marshal
import os
import resource
import signal
import socket
import struct
import sys

SYS_CLONE3 = 435  # the same number on every architecture Linux gives clone3
CLONE_PARENT = 0x00008000
CLONE_INTO_CGROUP = 0x200000000
CLONE_NEWUSER = 0x10000000
_ARGS_SIZE = 88  # struct clone_args up to ``cgroup`` (CLONE_ARGS_SIZE_VER2)
_SYS_KEYCTL = {  # older system calls are numbered per architecture (of this interpreter)
    ("x86_64", 8): 250, ("x86_64", 4): 288, ("i686", 4): 288, ("aarch64", 8): 219,
    ("riscv64", 8): 219, ("loongarch64", 8): 219, ("ppc64le", 8): 280, ("s390x", 8): 280,
}.get((os.uname().machine, struct.calcsize("P")))  # fmt: skip
_KEYCTL_JOIN_SESSION_KEYRING = 1
_NO_KEYRINGS = (1, 38)  # EPERM, ENOSYS: keyrings blocked here (seccomp): the command's too
_PR_SET_DUMPABLE = 4
_PR_SET_KEEPCAPS = 8
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE = 47, 2
_CAPABILITY_VERSION_3 = 0x20080522
_UNSUPPORTED = (38, 7, 22)  # ENOSYS, E2BIG (5.3-5.4), EINVAL (5.5-5.6): an older clone3
PID_BYTES = 8  # the clone's pid, first on its error pipe (native byte order)
MAX_REQUEST = 1 << 20
"""Bytes of one request at most (argv and environment); a larger one is refused by the
client before it is sent."""
_MAX_FDS = 4  # stdin, stdout, stderr, the exec-error pipe
_INT_SIZE = array.array("i").itemsize


class CloneRefused(OSError):
    """clone3 itself failed: no clone exists."""


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Filter(ctypes.Structure):  # struct sock_fprog
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _CapData(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint32) for name in ("effective", "permitted", "inheritable")]


def _clone(libc: ctypes.CDLL, cgroup_fd: int | None) -> int:
    """clone3 into the caller's parent (and ``cgroup_fd``); 0 in the child, its pid here."""
    flags = CLONE_PARENT | (CLONE_INTO_CGROUP if cgroup_fd is not None else 0)
    args = struct.pack("=11Q", flags, 0, 0, 0, 0, 0, 0, 0, 0, 0, cgroup_fd or 0)
    buffer = ctypes.create_string_buffer(args, _ARGS_SIZE)
    pid = libc.syscall(SYS_CLONE3, buffer, ctypes.c_size_t(_ARGS_SIZE))
    if pid < 0:
        number = ctypes.get_errno()
        raise CloneRefused(number, f"clone3: {os.strerror(number)}")
    return int(pid)


def _child(libc: ctypes.CDLL, request: tuple, fds: list[int]) -> None:
    """In the clone: its pid on the error pipe, session, v1 cgroups, capabilities, stdio,
    cwd, rlimits, the unit uid, then exec. Never returns: the exec replaces it, or its
    failure goes to the error pipe and it exits (whatever is raised, even by the reporting
    itself)."""
    failed = fds[3]
    try:
        os.write(failed, os.getpid().to_bytes(PID_BYTES, sys.byteorder))
        _prepare_and_exec(libc, request, fds)
    except BaseException as error:  # everything goes to the parent, which reaps the clone
        number, text = _described(error)
        os.write(failed, f"{number}:{text}".encode(errors="replace")[:2048])
    finally:
        os._exit(127)


def _prepare_and_exec(libc: ctypes.CDLL, request: tuple, fds: list[int]) -> None:
    path, argv, env, cwd, rlimits, v1_tasks, dropped, _, switch, seccomp, counts = request
    stdin, stdout, stderr, failed = fds
    os.setsid()
    _new_session_keyring(libc)
    for tasks in v1_tasks:  # "0" moves this (only) thread: joined before anything runs
        _write_file(tasks, b"0", f"cannot join cgroup {os.fsdecode(tasks)}")
    for number in dropped:
        _prctl(libc, f"cannot drop capability {number}", _PR_CAPBSET_DROP, number)
    if counts:  # a confined command's: bwrap's own namespace is made inside this one
        _cap_user_counts(libc, counts)
    os.set_inheritable(failed, False)  # whatever happens, the exec closes it
    os.dup2(stdin, 0)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    os.closerange(3, failed)
    os.closerange(failed + 1, 1 << 20)
    os.chdir(cwd)
    for limit, soft, hard in rlimits:  # RLIMIT_NOFILE may be below our fds
        resource.setrlimit(limit, (soft, hard))
    if switch is not None:  # last: the steps above may need root
        _switch_uid(libc, *switch)
    if seccomp:  # a confined command's (`evolane.sandbox._seccomp`); bwrap runs under it
        _install_filter(libc, seccomp)
    try:
        os.execve(path, argv, env)
    except OSError as error:  # a script without "#!": run by sh, as execvp and sh would
        if error.errno != 8 or not os.path.exists("/bin/sh"):  # ENOEXEC
            raise
    os.execve("/bin/sh", ["sh", path, *argv[1:]], env)


def _new_session_keyring(libc: ctypes.CDLL) -> None:
    """Leave evolane's session keyring for a new, empty one (what ``keyctl new_session``
    does): a process possesses its session keyring whatever its uid, so a command would
    read every secret kept there (Kerberos caches, credential helpers; found by review).
    A command of evolane's own uid still reaches that uid's user and persistent keyrings;
    a unit uid (a root evolane) or a confined view does not."""
    if _SYS_KEYCTL is None:  # an architecture without a known number: as the launcher
        return
    # The arguments as typed for clone3 (`main`): the operation, then a NULL name.
    if libc.syscall(_SYS_KEYCTL, _KEYCTL_JOIN_SESSION_KEYRING, 0) < 0:
        number = ctypes.get_errno()
        if number not in _NO_KEYRINGS:
            raise OSError(number, "cannot join a new session keyring")


def _cap_user_counts(libc: ctypes.CDLL, counts: list[tuple[str, int]]) -> None:
    """Enter a user namespace of this clone's own, mapped onto its uid and gid as root
    there, and set its ``counts`` (``/proc/sys/user/max_*`` files, each to its cap): what
    the command makes (inotify instances, watches) is charged to this namespace and to
    evolane's user above it, so the command takes at most these caps of that user's counts
    (`evolane.sandbox._ucounts`; the launcher's ``unshare --map-root-user`` step does the
    same)."""
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "cannot make the command's user namespace")
    maps = (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1"))
    for name, text in maps:
        _write_file(f"/proc/self/{name}", text.encode(), f"cannot write /proc/self/{name}")
    for path, cap in counts:
        _write_file(path, str(cap).encode(), f"cannot set {path}")


def _write_file(path: str | bytes, data: bytes, why: str) -> None:
    """Write ``data`` to ``path`` (a file that exists); OSError(errno, ``why``) if not."""
    try:
        handle = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(handle, data)
        finally:
            os.close(handle)
    except OSError as error:
        raise OSError(error.errno, why) from None


def _switch_uid(libc: ctypes.CDLL, uid: int, kept: tuple[int, ...]) -> None:
    """Become ``uid`` (and gid) with no supplementary group, keeping only the capabilities
    ``kept`` across the exec (inheritable and ambient; the bounding set was cut to them
    already) and no_new_privs: what ``setpriv --reuid --regid --clear-groups --inh-caps
    --ambient-caps --no-new-privs`` does, without its exec. As under setpriv, the exec
    itself still runs with root's capabilities (a program only root may execute starts),
    and what it starts holds ``kept`` alone."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    _prctl(libc, "cannot keep capabilities", _PR_SET_KEEPCAPS, 1)  # cleared by the exec
    os.setresuid(uid, uid, uid)
    _prctl(libc, "cannot stay undumpable", _PR_SET_DUMPABLE, 0)  # the uid change reset it
    header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "cannot read capabilities")
    for word in data:  # the uid change cleared the effective set; permitted was kept
        word.effective, word.inheritable = word.permitted, 0
    for number in kept:
        data[number // 32].inheritable |= 1 << number % 32
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "cannot set capabilities")
    for number in kept:
        why = f"cannot raise ambient capability {number}"
        _prctl(libc, why, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE, number)
    _prctl(libc, "cannot set no_new_privs", _PR_SET_NO_NEW_PRIVS, 1)


def _install_filter(libc: ctypes.CDLL, program: bytes) -> None:
    """Install the seccomp ``program`` (classic BPF) for this process and all it starts;
    without root's CAP_SYS_ADMIN the kernel asks for no_new_privs first."""
    if os.geteuid() != 0:
        _prctl(libc, "cannot set no_new_privs", _PR_SET_NO_NEW_PRIVS, 1)
    code = ctypes.create_string_buffer(program, len(program))
    fprog = _Filter(len(program) // 8, ctypes.addressof(code))
    why = "cannot install the seccomp filter"
    _prctl(libc, why, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog))


def _prctl(libc: ctypes.CDLL, why: str, option: int, *args: int) -> None:
    padded = (*args, 0, 0, 0, 0)[:4]
    if libc.prctl(option, *padded) != 0:
        raise OSError(ctypes.get_errno(), why)


def _described(error: BaseException) -> tuple[int, str]:
    """(errno or 0, one line) of a failure, without Python's ``[Errno N]`` prefix."""
    number = getattr(error, "errno", None) or 0
    text = getattr(error, "strerror", None) or str(error) or type(error).__name__
    filename = getattr(error, "filename", None)
    if filename is not None:
        text = f"{text}: {os.fsdecode(filename)}"
    return number, text.encode(errors="replace")[:2048].decode(errors="ignore")  # bytes, bounded


def _receive(server: socket.socket) -> tuple[bytes, list[int]]:
    """One request and its descriptors, each close-on-exec (``socket.recv_fds`` of 3.11
    drops its flags, and an inherited error pipe would outlive the exec)."""
    room = socket.CMSG_SPACE(_MAX_FDS * _INT_SIZE)
    data, ancillary, _flags, _ = server.recvmsg(MAX_REQUEST, room, socket.MSG_CMSG_CLOEXEC)
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % _INT_SIZE])
    return data, list(fds)


def _serve_one(libc: ctypes.CDLL, server: socket.socket) -> bool:
    """Handle one request; False at EOF."""
    data, fds = _receive(server)
    if not data:
        return False
    cgroup_fd = None
    try:
        request = marshal.loads(data)
        if len(fds) != _MAX_FDS:
            raise OSError(0, f"expected {_MAX_FDS} descriptors, got {len(fds)}")
        cgroup = request[7]
        if cgroup is not None:
            cgroup_fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        pid = _clone(libc, cgroup_fd)
        if pid == 0:
            _child(libc, request, fds)
        reply: tuple = (pid, 0, "", False)
    except (OSError, ValueError, EOFError, TypeError, IndexError) as error:
        number, text = _described(error)
        unsupported = isinstance(error, CloneRefused) and number in _UNSUPPORTED
        reply = (0, number, text, unsupported)
    finally:
        for fd in fds:
            os.close(fd)
        if cgroup_fd is not None:
            os.close(cgroup_fd)
    server.send(marshal.dumps(reply))
    return True


def _default_signals() -> None:
    """Every signal at its default and none blocked, for the server and so for its clones:
    an exec keeps ignored signals and the mask, and Python ignores SIGPIPE and SIGXFSZ, as a
    ``nohup`` or ``trap ''`` that started evolane may ignore SIGTERM (which the kill ladder
    sends first). At EOF a SIGPIPE ends the server, as it should."""
    for number in range(1, signal.NSIG):
        if number not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(number, signal.SIG_DFL)
            except (OSError, ValueError):  # a number with no signal behind it
                continue
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def main() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.syscall.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_size_t]
    libc.prctl.argtypes = [
        ctypes.c_int,
        ctypes.c_ulong,
        ctypes.c_ulong,
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    libc.capget.argtypes = libc.capset.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    _default_signals()
    server = socket.socket(fileno=int(sys.argv[1]))
    try:
        while _serve_one(libc, server):
            pass
    except (ConnectionError, OSError):
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
