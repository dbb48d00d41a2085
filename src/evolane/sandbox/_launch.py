"""The launcher chain: join cgroups, set rlimits, enter namespaces, then exec the command.

Where the spawn server works (`evolane.sandbox._spawner`), its clone does the first steps
and only the namespace and privilege steps stay in the chain (`Cloned`). Otherwise, with no
``preexec_fn`` (it deadlocks with threads and costs ~15 ms), a ``/bin/sh`` one-liner writes
its own pid into the unit's cgroups and execs util-linux ``prlimit`` (limits), which execs
``unshare`` (namespaces), which execs the command. Each step is an exec of a small binary.
When evolane runs as root, util-linux ``setpriv`` comes last and drops the capabilities that
would let the command read evolane's memory or environment (`evolane.sandbox._secrets`).
"""

from __future__ import annotations

import errno
import resource
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from evolane.sandbox._secrets import dropped_capabilities_argv, probe_succeeds, unit_uid_argv
from evolane.sandbox._spec import Limits
from evolane.sandbox._ucounts import rlimit_caps, user_process_cap


def join_failed_marker(nonce: str) -> bytes:
    """What the launcher prints when it cannot join a cgroup. ``nonce`` is the unit's own
    secret: it is only in the launcher shell's environment (`launcher_env`), which it
    unsets before its exec, so a command cannot print it to pass its own failure off as a
    spawn failure. Not in its argv: ``/proc/PID/cmdline`` is world-readable, and another
    unit's command read it there while the shell lived (found by review)."""
    return f"evolane-launch-{nonce}: cannot join cgroup".encode()


def step_failed_marker(nonce: str) -> bytes:
    """What the network step (`NET_STEP`) prints when it cannot give the command its
    network: ``nonce`` reaches it in `NET_NONCE_VARIABLE`, which it drops before its exec,
    so no command can print it to pass its own failure off as the step's."""
    return f"evolane-net-{nonce}: ".encode()


NET_NONCE_VARIABLE = "EVOLANE_NET_NONCE"
"""The unit's nonce in the network step's environment (`step_failed_marker`)."""
_NONCE_VARIABLE = "EVOLANE_LAUNCH_NONCE"
_JOIN_CGROUPS = (
    'while [ "$1" != "--" ]; do { echo $$ > "$1"; } 2>/dev/null || '
    f'{{ echo "$0-${_NONCE_VARIABLE}: cannot join cgroup $1" >&2; exit 125; }}; shift; done; '
    f'shift; unset {_NONCE_VARIABLE}; ulimit -c 0; exec "$@"'
)
# PID 1 of a namespace ignores signals it has no handler for; so the command runs as PID 2
# under a shell that only waits (the trailing "exit" keeps dash from exec'ing the command).
_NAMESPACE_INIT = '"$@"; exit $?'
NAMESPACE_EXTRA_PROCESSES = 2
"""unshare and the namespace's init shell, counted against the pids limit on top."""
# Fallback when prlimit is missing: the same limits from a tiny isolated Python.
_SET_RLIMITS = (
    "import os,resource,sys\n"
    "for name,soft,hard in zip(*[iter(sys.argv[1].split(','))]*3):\n"
    "    name and resource.setrlimit(getattr(resource,name),(int(soft),int(hard)))\n"
    "os.execvp(sys.argv[2],sys.argv[2:])\n"
)
_NAMESPACE = ("--pid", "--net", "--mount-proc", "--fork", "--kill-child")
NET_STEP = str(Path(__file__).with_name("_netstep.py"))
"""The script of the step that gives a networked confined command a network namespace of
its own (`evolane.sandbox._netns`), run by path."""


@dataclass(frozen=True)
class HostTools:
    """The helper binaries this host has."""

    sh: str | None
    prlimit: str | None
    unshare: str | None


@cache
def host_tools() -> HostTools:
    """Look the helper binaries up once per process."""
    return HostTools(
        sh=shutil.which("sh", path="/bin:/usr/bin"),
        prlimit=shutil.which("prlimit", path="/usr/bin:/bin:/usr/sbin:/sbin"),
        unshare=shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin"),
    )


@cache
def namespaces_available() -> bool:
    """Whether this host lets us create PID + network + mount namespaces (probed once)."""
    tools = host_tools()
    if tools.unshare is None or tools.sh is None:
        return False
    return probe_succeeds([tools.unshare, *_NAMESPACE, "true"])


def rlimit_triples(limits: Limits) -> list[tuple[str, int, int]]:
    """(resource name, soft, hard) for every limit set; core dumps are always off, and
    message queue bytes and queued signals are a share of evolane's (`rlimit_caps`).

    ``processes`` is not an rlimit here: RLIMIT_NPROC counts every process of the user (and
    root ignores it), so the pids cgroup bounds a tree instead; ``uid_processes`` is, for a
    tree whose uid is its own (`uid_process_cap`); else, under a non-root evolane's finite
    one, the cap that keeps evolane's reserve (`evolane.sandbox._ucounts.user_process_cap`).
    """
    triples = [("RLIMIT_CORE", 0, 0), *((name, cap, cap) for name, cap in rlimit_caps())]
    user = user_process_cap()
    if limits.uid_processes is not None:
        triples.append(("RLIMIT_NPROC", limits.uid_processes, limits.uid_processes))
    elif user is not None and user.cap is not None:
        triples.append(("RLIMIT_NPROC", user.cap, user.cap))
    if limits.address_space_bytes is not None:
        triples.append(("RLIMIT_AS", limits.address_space_bytes, limits.address_space_bytes))
    if limits.cpu_seconds is not None:
        # SIGXCPU at the soft limit, SIGKILL one second later.
        triples.append(("RLIMIT_CPU", limits.cpu_seconds, limits.cpu_seconds + 1))
    if limits.file_size_bytes is not None:
        triples.append(("RLIMIT_FSIZE", limits.file_size_bytes, limits.file_size_bytes))
    if limits.open_files is not None:
        triples.append(("RLIMIT_NOFILE", limits.open_files, limits.open_files))
    return triples


def uid_process_cap(limits: Limits, pids_cgroup: bool, uid: int | None, extra: int) -> Limits:
    """``limits`` with `Limits.uid_processes` set when a tree's processes would otherwise be
    unbounded: ``--max-procs`` asked, no pids cgroup of the unit's (``pids_cgroup`` False:
    a cgroup v2-only host, where the pids controller is not delegated to evolane), and the
    tree runs as unit uid ``uid``, whose processes are the tree's alone. RLIMIT_NPROC is
    checked at each fork against the uid's count, as ``pids.max`` is against the cgroup's;
    ``extra``: launcher processes counted on top, as for ``pids.max``. Without it such a
    host bounded no tree at all: a candidate's fork bomb took every pid of the host."""
    unbounded = uid is not None and limits.processes is not None and not pids_cgroup
    cap = limits.processes + extra if unbounded and limits.processes is not None else None
    if cap == limits.uid_processes:  # the common case: None, as given
        return limits
    return limits.model_copy(update={"uid_processes": cap})  # never taken from the spec


def rlimit_numbers(limits: Limits) -> list[tuple[int, int, int]]:
    """`rlimit_triples` with resource numbers, as the spawn server's clone sets them."""
    return [(getattr(resource, name), soft, hard) for name, soft, hard in rlimit_triples(limits)]


def launch(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    output: tuple[int, int],
    keep: tuple[int, ...] = (),
    stdin: int | None = None,
) -> int:
    """Start the launcher chain ``argv`` in a session of its own, stdin from /dev/null (or
    ``stdin``: the marker pipe of a user counts step, which gives the command /dev/null),
    stdout and stderr to ``output``, the descriptors ``keep`` open at their numbers; its pid
    (`evolane.sandbox._tree.ProcessTree` reaps it)."""
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL if stdin is None else stdin,
        stdout=output[0],
        stderr=output[1],
        cwd=cwd,
        env=env,
        start_new_session=True,
        close_fds=True,
        pass_fds=keep,
    )
    process.returncode = -signal.SIGKILL  # Popen must never poll or reap a pid that is ours
    return process.pid


_PRLIMIT_FLAGS = {
    "RLIMIT_CORE": "--core",
    "RLIMIT_AS": "--as",
    "RLIMIT_CPU": "--cpu",
    "RLIMIT_FSIZE": "--fsize",
    "RLIMIT_NOFILE": "--nofile",
    "RLIMIT_NPROC": "--nproc",
    "RLIMIT_MSGQUEUE": "--msgqueue",
    "RLIMIT_SIGPENDING": "--sigpending",
}


def launcher_argv(
    command: tuple[str, ...],
    procs_files: list[str],
    limits: Limits,
    namespace: bool,
    confine: list[str] | None = None,
    uid: int | None = None,
    cloned: Cloned | None = None,
) -> tuple[list[str], tuple[str, ...]]:
    """The full argv that runs ``command`` confined, and the mechanisms it puts in force.

    ``confine`` is a bwrap prefix (`evolane.sandbox._confine.bwrap_argv`): it replaces the
    ``unshare`` step, and drops root itself. ``uid``: a root evolane's command runs as that
    uid (`evolane.sandbox._secrets.unit_uid_argv`); it starts with `launcher_env`.
    ``cloned``: the spawn server's clone already did these steps (no exec for them)."""
    tools = host_tools()
    argv: list[str] = []
    mechanisms: list[str] = ["session", "env_allowlist"]
    if cloned is None:
        argv += _join_and_limit(procs_files, limits)
    mechanisms.append("rlimits")
    if confine is not None:
        return [*argv, *confine, *command], (*mechanisms, *confined_mechanisms(confine))
    if namespace:
        assert tools.unshare is not None and tools.sh is not None
        argv += [tools.unshare, *_NAMESPACE, "--", tools.sh, "-c", _NAMESPACE_INIT, "evolane-init"]
        mechanisms += ["pid_namespace", "net_namespace"]
    # Last: unshare above still needs CAP_SYS_ADMIN.
    switch = unit_uid_argv(uid) if uid is not None else None
    if uid is not None and switch is None:  # never run a drop_root command as root unasked
        raise OSError(errno.EPERM, f"cannot run the command as unit uid {uid}: no setpriv")
    if switch is not None:
        if not (cloned is not None and cloned.uid_switched):
            argv += switch
        mechanisms.append("unprivileged_uid")
    elif cloned is not None and cloned.capabilities_dropped:
        mechanisms.append("root_caps_dropped")
    elif drop := dropped_capabilities_argv():
        argv += drop
        mechanisms.append("root_caps_dropped")
    return [*argv, *command], tuple(mechanisms)


@dataclass(frozen=True)
class Cloned:
    """What the spawn server's clone does before it execs (`evolane.sandbox._spawner`):
    the cgroups and rlimits always; when root at the ``process`` level, the capability drop
    or (a ``drop_root`` command) the switch to its unit uid."""

    capabilities_dropped: bool
    uid_switched: bool = False


def launcher_env(env: dict[str, str], procs_files: list[str], nonce: str) -> dict[str, str]:
    """The environment the launcher chain starts with: ``env``, and the unit's ``nonce``
    (`join_failed_marker`) for its shell that joins ``procs_files``, which unsets it."""
    if not _joins_cgroups(procs_files):
        return env
    return {**env, _NONCE_VARIABLE: nonce}


def _joins_cgroups(procs_files: list[str]) -> bool:
    """Whether the launcher chain starts with the shell that joins ``procs_files``."""
    return bool(procs_files) and host_tools().sh is not None


def _join_and_limit(procs_files: list[str], limits: Limits) -> list[str]:
    """The launcher steps that join the unit's cgroups and set its rlimits."""
    tools = host_tools()
    argv: list[str] = []
    if _joins_cgroups(procs_files):
        assert tools.sh is not None
        argv += [tools.sh, "-c", _JOIN_CGROUPS, "evolane-launch", *procs_files, "--"]
    triples = rlimit_triples(limits)
    if procs_files and tools.sh is not None and len(triples) == 1:
        pass  # only "no core dumps": the launcher shell's own `ulimit -c 0` did it
    elif tools.prlimit is not None:
        flags = [f"{_PRLIMIT_FLAGS[name]}={soft}:{hard}" for name, soft, hard in triples]
        argv += [tools.prlimit, *flags, "--"]
    else:
        spec = ",".join(f"{name},{soft},{hard}" for name, soft, hard in triples)
        argv += [sys.executable, "-I", "-S", "-c", _SET_RLIMITS, spec]
    return argv


def confined_mechanisms(confine: list[str]) -> tuple[str, ...]:
    """The names of what a bwrap prefix puts in force (recorded with each outcome)."""
    names = ["pid_namespace", "mount_view", "private_tmp", "no_new_privs"]
    if "--unshare-net" in confine:
        names.append("net_namespace")
    elif NET_STEP in confine:
        names += ["net_namespace", "nat_network"]
    names.append("user_namespace")
    return tuple(names)
