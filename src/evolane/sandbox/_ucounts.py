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
"""

from __future__ import annotations

import resource
from functools import cache
from pathlib import Path

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
_SET_COUNTS = (
    'while [ "$1" != "--" ]; do echo "$2" > "$1" || exit 125; shift 2; done; shift; exec "$@"'
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
