"""Per-user kernel counts: what one command may take of evolane's user's share.

The kernel counts some objects per user, host-wide: inotify instances (128 by default) and
watches, fanotify groups and marks, POSIX message queue bytes, queued signals. A command
that takes them all stops evolane's user from making any more until it ends: a confined
replay took all 128 inotify instances of root (found by review), and every program of that
user then failed with EMFILE.

Since Linux 5.11 those counts (``/proc/sys/user/max_*``) are kept per user namespace and
charged to every namespace above too, each against its own limit. So a confined command
runs in a user namespace of its own (made by the spawn server's clone, or by ``unshare
--map-root-user`` in the launcher chain, before bwrap makes its own inside it) whose limits
are a share of evolane's: the command can take no more, whatever it runs. Message queue
bytes and queued signals are capped by rlimits (a user namespace is born with its
creator's), for every command at every level.

RLIMIT_NPROC (``ulimit -u``) counts every process and thread of a user, and a non-root
evolane is one of them: a command's fork bomb took them all, and evolane could start no
thread or process more (found by review). Each command's RLIMIT_NPROC is evolane's own less
`evolane_reserve` (`user_process_cap`), set before any user namespace is made (whose
creator's RLIMIT_NPROC bounds what the namespace holds): a bomb is refused there, and
evolane keeps its reserve. Within that shared ceiling a confined command's tree gets a
share of its own (`tree_process_share`): RLIMIT_NPROC set inside its user namespace counts
that tree alone (the kernel keeps the count per user namespace, and charges every level
above against the limit its creator had), so one tree's bomb no longer fails another's
forks. Root is not held to RLIMIT_NPROC in any namespace.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from evolane.sandbox._procfs import proc_status

USER_COUNT_SHARE = 16
"""A command takes at most 1/16 of each of evolane's `CAPPED_COUNTS` (at least one)."""
RLIMIT_SHARE = 8
"""A command takes at most 1/8 of each of evolane's `CAPPED_RLIMITS`: 100 KiB of message
queues of the default 800 KiB, one queue of the default size (80 KiB)."""
CAPPED_COUNTS = ("inotify_instances", "inotify_watches", "fanotify_groups", "fanotify_marks")
"""The ``/proc/sys/user/max_<name>`` counts a confined command's own namespace caps."""
CAPPED_RLIMITS = ("RLIMIT_MSGQUEUE", "RLIMIT_SIGPENDING")
"""Per-user counts an rlimit caps: every command's is a share of evolane's own."""
_USER_SYSCTLS = Path("/proc/sys/user")
# Pairs "FILE CAP" (a count), "-p N" (RLIMIT_NPROC, soft and hard: `ulimit -u` in bash,
# busybox and ksh, `-p` in dash, whose -u is no option) or "-m FILE" (a byte to stdin, the
# marker pipe, then stdin from FILE: dash redirects no descriptor above 9), then "--" and
# the chain's rest.
_SET_COUNTS = (
    'while [ "$1" != "--" ]; do if [ "$1" = -p ]; then '
    '{ ulimit -u "$2" || ulimit -p "$2"; } 2>/dev/null; elif [ "$1" = -m ]; then '
    'echo 1 >&0 && exec <"$2"; else echo "$2" > "$1"; fi || exit 125; '
    'shift 2; done; shift; exec "$@"'
)


def share(limit: int, parts: int = USER_COUNT_SHARE) -> int:
    """What one command may take of a per-user ``limit``: one of its ``parts``."""
    return max(1, limit // parts)


@cache
def user_count_caps() -> tuple[tuple[str, int], ...]:
    """(``/proc/sys/user/max_*`` file, cap) for each count in `CAPPED_COUNTS` this kernel
    has, read in evolane's own user namespace (read once)."""
    caps = []
    for name in CAPPED_COUNTS:
        path = _USER_SYSCTLS / f"max_{name}"
        try:
            caps.append((str(path), share(int(path.read_text()))))
        except (OSError, ValueError):
            continue
    return tuple(caps)


@cache
def rlimit_caps() -> tuple[tuple[str, int], ...]:
    """(rlimit name, cap) for each of `CAPPED_RLIMITS` whose soft limit here is finite."""
    caps = []
    for name in CAPPED_RLIMITS:
        soft = resource.getrlimit(getattr(resource, name))[0]
        if soft != resource.RLIM_INFINITY:
            caps.append((name, share(soft, RLIMIT_SHARE)))
    return tuple(caps)


def count_caps_argv(unshare: str, sh: str, caps: tuple[tuple[str, int], ...]) -> list[str]:
    """The launcher step that runs the rest of its argv in a user namespace of its own,
    root there mapped onto evolane's uid, with ``caps`` set (what the spawn server's clone
    does in `evolane.sandbox._spawnd._cap_user_counts`)."""
    pairs = [word for path, cap in caps for word in (path, str(cap))]
    step = [unshare, "--user", "--map-root-user", "--", sh, "-c", _SET_COUNTS, "evolane-counts"]
    return [*step, *pairs, "--"]


def with_step_pairs(step: tuple[str, ...], processes: int | None) -> list[str]:
    """The count caps step ``step`` (`count_caps_argv`) that also sets RLIMIT_NPROC to
    ``processes`` inside the tree's user namespace (`tree_process_share`; None: not), then
    writes a byte to its stdin, a pipe the sandbox reads, and gives the command /dev/null
    instead. ``unshare`` failing to make the namespace (ENOSPC at ``max_user_namespaces``,
    ENOMEM) exits 1, as a command may: the byte missing says the command never ran (found
    by review: such a replay was scored as the candidate's failure)."""
    share = ("-p", str(processes)) if processes is not None else ()
    return [*step[:-1], *share, "-m", "/dev/null", step[-1]]


def tree_process_share(processes: int | None, bounded: bool, extra: int) -> int | None:
    """The RLIMIT_NPROC a confined command's tree gets inside its own user namespace under
    a non-root evolane: its ``processes`` limit (``--max-procs``, a campaign's share of the
    user's room) plus the ``extra`` launcher processes, as for ``pids.max``, within the
    ceiling set before the namespace is made (`user_process_cap`). None: root, no limit, or
    a pids cgroup bounds the tree (``bounded``: its limit is the one hit and said so)."""
    if processes is None or bounded or os.geteuid() == 0:
        return None
    wanted = processes + extra
    user = user_process_cap()
    if user is None:  # no finite ulimit: nothing above to stay under
        return wanted
    return min(wanted, user.cap if user.cap is not None else user.soft)


RESERVE = (16, 64)
"""Tasks a room of processes shared with evolane's commands keeps for evolane itself (its
threads, its spawn server): a quarter of the room, within these bounds."""


def evolane_reserve(left: int) -> int:
    """What a room of ``left`` more tasks (processes and threads) keeps for evolane itself."""
    return min(max(left // 4, RESERVE[0]), RESERVE[1])


@dataclass(frozen=True)
class UserProcessCap:
    """A non-root evolane's RLIMIT_NPROC (``soft``), the tasks its user held when it was
    read (``used``), and the RLIMIT_NPROC each command gets (``cap``; None: no room above
    ``used`` once evolane's reserve is kept, so its commands get none and share it all)."""

    cap: int | None
    soft: int
    used: int


@cache
def user_process_cap() -> UserProcessCap | None:
    """The RLIMIT_NPROC of every command below a non-root evolane's own finite one, read
    once; None for root (the kernel does not hold root to it) or no limit."""
    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if os.geteuid() == 0 or soft == resource.RLIM_INFINITY:
        return None
    used = user_tasks(os.getuid())
    cap = soft - evolane_reserve(soft - used)
    return UserProcessCap(cap if cap > used else None, soft, used)


def user_tasks(uid: int) -> int:
    """The processes and threads of real uid ``uid`` this process can see in /proc."""
    count = 0
    for name in os.listdir("/proc"):
        found = proc_status(name) if name.isdigit() else None
        if found is not None and found.uid == uid:
            count += found.threads
    return count
