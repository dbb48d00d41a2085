"""Keep evolane's own secrets out of its commands' reach (DESIGN §5, issue 17 item 2).

A command gets an allowlisted environment (`evolane.sandbox._env`), but evolane's own
environment, memory and file descriptors stay readable through ``/proc/<evolane pid>/``
(``environ``, ``mem``, ``fd/``) by any process of the same uid, and by root. Two measures:

* `make_undumpable`: ``prctl(PR_SET_DUMPABLE, 0)``. The kernel then owns evolane's
  ``/proc/<pid>/`` files as root and allows ``environ``, ``mem``, ``ptrace`` and
  ``process_vm_readv`` only to a caller with CAP_SYS_PTRACE over it. It is called by
  `SandboxHost.start`, the one place every process that runs commands goes through (the CLI,
  the embedded API, stress harnesses, Dask workers), before the first command is spawned.
  Side effects while a host is open (`evolane.sandbox._host_flags` puts the flag back when
  the last one closes): no core dump of evolane, and a debugger or ``py-spy`` of the same
  non-root user can no longer attach (root can: ``sudo py-spy dump --pid PID``). Commands are not
  affected: the flag is reset when they exec.
* `dropped_capabilities_argv`: when evolane runs as root its commands would run as root
  too, and root holds CAP_SYS_PTRACE. The launcher chain then ends with util-linux
  ``setpriv`` removing the capabilities that read another process's memory or the kernel's
  (ptrace, admin, BPF, perf, raw I/O, modules, checkpoint/restore, file handles) from the
  command's bounding set: its tree can never get them back, so evolane's ``/proc`` files
  stay closed to it. The command keeps uid 0 and so its access to files (a different uid
  is the confined level's job: a user namespace over an allowlisted mount view).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import signal
import subprocess
import time
from functools import cache

_PR_SET_DUMPABLE = 4

DROPPED_CAPABILITIES = {
    "sys_ptrace": 19,
    "sys_admin": 21,
    "bpf": 39,
    "perfmon": 38,
    "sys_rawio": 17,
    "sys_module": 16,
    "checkpoint_restore": 40,
    "dac_read_search": 2,
}
"""Capabilities a command started by root never holds (name: linux/capability.h number):
each reads or writes another process's memory or the kernel's, or opens files by handle
past every mount."""
_ESSENTIAL = ("sys_ptrace",)  # what an older setpriv or kernel must at least drop
PROBE_TIMEOUT = 5.0
"""Seconds a one-off capability probe (`setpriv ... true`, `unshare ... true`) may take before
the host counts as unable to do it."""


def probe_succeeds(argv: list[str]) -> bool:
    """Whether ``argv`` runs and exits 0 (`probe_outcome`; a refused spawn: False)."""
    return probe_outcome(argv) is True


def probe_outcome(argv: list[str]) -> bool | None:
    """Whether ``argv`` runs and exits 0 (quietly, bounded by `PROBE_TIMEOUT`); None when
    the host refused it a process (EAGAIN, ENOMEM: a pid or memory limit reached), which
    says nothing of ``argv``. It runs in a process group of its own, reaped whole: a
    probe's orphans (bubblewrap's inner process) come to this process when it is a
    subreaper, and must not stay zombies in it."""
    try:
        probe = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            process_group=0,
        )
    except OSError as error:
        return None if error.errno in (errno.EAGAIN, errno.ENOMEM) else False
    try:
        code = probe.wait(timeout=PROBE_TIMEOUT)
    except subprocess.TimeoutExpired:
        code = None
        with contextlib.suppress(OSError):
            os.killpg(probe.pid, signal.SIGKILL)
        probe.wait()
    _reap_group(probe.pid)
    return code == 0


def _reap_group(pgid: int, polls: int = 50) -> None:
    """Reap what is left of process group ``pgid`` among our children: ``polls`` waits of
    20 ms for members still running, then SIGKILL to the group and a blocking reap (a
    member not yet reaped keeps the pgid allocated, so the signal reaches only the probe's)."""
    for attempt in range(polls + 1):
        try:
            found = os.waitid(os.P_PGID, pgid, os.WEXITED | os.WNOHANG)
        except ChildProcessError:  # no child of ours is left in the group
            return
        if found is None and attempt < polls:  # a member still runs: give it a moment
            time.sleep(0.02)
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)
    while True:
        try:
            os.waitid(os.P_PGID, pgid, os.WEXITED)
        except ChildProcessError:
            return


def make_undumpable() -> bool:
    """Make this process non-dumpable (Linux); True when the flag is set."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


@cache
def _setpriv_flags() -> tuple[str, ...] | None:
    """The ``setpriv`` argv prefix that drops the capabilities this host knows (probed once);
    None without a working ``setpriv``."""
    setpriv, true = _setpriv(), shutil.which("true", path="/usr/bin:/bin")
    if setpriv is None or true is None:
        return None
    for names in (DROPPED_CAPABILITIES, _ESSENTIAL):
        argv = (setpriv, "--bounding-set=" + ",".join("-" + name for name in names), "--")
        if probe_succeeds([*argv, true]):
            return argv
    return None


UNIT_UID_BASE = 2_000_000_000
"""The first uid a root evolane runs a ``drop_root`` command as under the ``process`` and
``namespace`` levels (one per unit, modulo `UNIT_UID_SPAN`): far above the ranges
distributions give users and container subuids."""
UNIT_UID_SPAN = 65_536


@cache
def _setpriv() -> str | None:
    return shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")


def unit_uid_argv(uid: int) -> tuple[str, ...] | None:
    """The launcher step that runs a command as ``uid`` (and gid) with no capability but
    CAP_DAC_READ_SEARCH, which it keeps across exec, and ``no_new_privs``: it reads what
    root may read (an interpreter under /root, a folder made by ``mkdtemp``; what ``process``
    never hid), but writes only what ``uid`` owns (its own directories, handed over), and
    cannot signal or trace evolane, the store's files or another unit's. None without a
    usable ``setpriv``: evolane then gives no unit uid (its command is a root command)."""
    setpriv = _setpriv()
    if setpriv is None or not _uid_switch_works(setpriv):
        return None
    return _uid_switch(setpriv, uid)


def commands_run_unprivileged() -> bool:
    """Whether a ``drop_root`` command runs as a unit uid of its own here (evolane is root
    and ``setpriv`` switches uids): it can then write nothing root owns, such as the
    store's read-only blobs."""
    return os.geteuid() == 0 and unit_uid_argv(UNIT_UID_BASE) is not None


def trees_run_as_unit_uids(isolation: str) -> bool:
    """Whether a ``drop_root`` command at ``isolation`` (the level in force) runs as a unit
    uid of its own: its RLIMIT_NPROC then bounds its tree where no pids cgroup does
    (`evolane.sandbox._launch.uid_process_cap`). A confined command has no unit uid."""
    return isolation != "confined" and commands_run_unprivileged()


UNIT_UID_CAPABILITIES = {"dac_read_search": 2}
"""The only capabilities a ``drop_root`` command keeps as its unit uid (name: number):
inheritable, ambient and bounding, so it reads what root may read but writes only its own."""


def _uid_switch(setpriv: str, uid: int) -> tuple[str, ...]:
    caps = ",".join(["-all", *(f"+{name}" for name in UNIT_UID_CAPABILITIES)])
    return (
        setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", f"--inh-caps={caps}",
        f"--ambient-caps={caps}", f"--bounding-set={caps}", "--no-new-privs", "--",
    )  # fmt: skip


@cache
def _uid_switch_works(setpriv: str) -> bool:
    """Whether ``setpriv`` switches uids here, probed once. A probe the host refused a
    process (`probe_outcome` None: a pid or memory limit reached for a moment) proves
    nothing, and counts as a switch that works: a ``drop_root`` command then still runs as
    a unit uid (it fails to start, visibly, if the switch does not work), never as root for
    a moment's refusal (found by CI: under a full pids.max the refused probe counted as "no
    switch", and the run's commands ran as root). Not probed again: a probe per command
    would take a process each under the very limit that refused it."""
    true = shutil.which("true", path="/usr/bin:/bin")
    if true is None:
        return False
    return probe_outcome([*_uid_switch(setpriv, UNIT_UID_BASE), true]) is not False


def dropped_capabilities_argv() -> tuple[str, ...] | None:
    """The launcher step that drops `DROPPED_CAPABILITIES` from a command's bounding set
    when evolane runs as root; ``()`` when not root (nothing to drop); None when root but
    this host has no working ``setpriv`` (the caller records that nothing was dropped)."""
    if os.geteuid() != 0:
        return ()
    return _setpriv_flags()
