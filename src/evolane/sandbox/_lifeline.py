"""The lifeline: a watchdog process that kills a runtime's sandboxed trees when the runtime dies.

Run as ``python -I -S _lifeline.py LEASE DIR...`` with the read end of a pipe as stdin; the
runtime holds the write end. When the runtime exits for any reason, SIGKILL included, the
kernel closes the write end, the read returns EOF, and the watchdog kills every process of
the lease (by its cgroups, then by the lease marker in /proc) and removes the directories.
Standard library only, so it starts in milliseconds; the runtime imports its helpers too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __package__:
    from evolane.store import remove_tree
else:  # run as a script (python -I -S): only the standard library is importable

    def _load_remove_tree() -> Callable[[Path | str], bool]:
        """`evolane.store.remove_tree`, loaded from its (standard library only) file."""
        path = Path(__file__).resolve().parents[1] / "store" / "_remove.py"
        spec = importlib.util.spec_from_file_location("_evolane_remove", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.remove_tree  # type: ignore[no-any-return]

    remove_tree = _load_remove_tree()

LEASE_VARIABLE = "EVOLANE_LEASE"
_MARKER = LEASE_VARIABLE.encode() + b"="
OWNER_FILE = "owner.json"
LOCK_FILE = "owner.lock"
"""Held locked (``flock``, exclusive) by the lease's owner for as long as it lives."""
LEASE_FILES = frozenset({OWNER_FILE, LOCK_FILE})
"""The files a lease's folder holds besides its units' folders and the host's spool."""


def lease_of(pid: int) -> str | None:
    """The lease marker in the environment ``pid`` started with (None if absent or gone)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    for item in data.split(b"\0"):
        if item.startswith(_MARKER):
            return item[len(_MARKER) :].decode("utf-8", "replace")
    return None


def is_zombie(pid: int) -> bool:
    """True when ``pid`` has exited but is not reaped yet (or is gone entirely)."""
    fields = stat_fields(pid)
    return not fields or fields[0] in (b"Z", b"X")


def stat_fields(pid: int) -> list[bytes]:
    """The fields of /proc/PID/stat after the command name: state, ppid, pgrp, ..."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return []
    return stat[stat.rfind(b")") + 2 :].split()


def process_group_of(pid: int) -> int | None:
    """The process group of ``pid`` (None when it is gone)."""
    fields = stat_fields(pid)
    return int(fields[2]) if len(fields) > 2 else None


def group_members(pgid: int) -> set[int]:
    """Live (not zombie) processes in the process group ``pgid``, found by scanning /proc."""
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat_fields(int(entry))
            if (
                len(fields) > 2
                and fields[2] == str(pgid).encode()
                and fields[0] not in (b"Z", b"X")
            ):
                found.add(int(entry))
    return found


def lease_matches(value: str, lease: str) -> bool:
    """True when ``lease`` is a whole run of ``/``-separated components of the marker ``value``."""
    return f"/{lease}/" in f"/{value}/"


def lease_holders(fragment: str) -> set[int]:
    """Live processes whose lease marker holds the lease ``fragment`` (this process excluded)."""
    found: set[int] = set()
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        lease = lease_of(int(entry))
        if lease is not None and lease_matches(lease, fragment) and not is_zombie(int(entry)):
            found.add(int(entry))
    return found


CGROUP_FILE_BYTES = 1 << 20
"""Bytes of a cgroup file read at most (``cgroup.procs`` of ~100,000 members)."""
_CGROUP_READ = 64 << 10  # per read: a larger buffer is an mmap and munmap each time


def read_cgroup_file(path: Path) -> str:
    """A cgroup file's text, '' when it cannot be read: plain ``open``/``read`` calls (a
    unit reads several per run, on the event loop), at most `CGROUP_FILE_BYTES`, in whole
    lines. Not `evolane.store.read_at_most`: cgroup files say their size is 0 or 4096."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    chunks: list[bytes] = []
    size = 0
    try:
        while size < CGROUP_FILE_BYTES and (
            chunk := os.read(fd, min(_CGROUP_READ, CGROUP_FILE_BYTES - size))
        ):
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return ""
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if size >= CGROUP_FILE_BYTES:  # cut at the cap: never hand on half a line (a pid)
        data = data[: data.rfind(b"\n") + 1]
    return data.decode("ascii", errors="replace")


def read_pids(cgroup: Path) -> set[int]:
    """Members of one cgroup directory."""
    return {int(pid) for pid in read_cgroup_file(cgroup / "cgroup.procs").split() if pid.isdigit()}


def kill_cgroup_tree(path: Path, patience: float = 2.0) -> None:
    """SIGKILL everything under a cgroup directory, then remove its directories.

    The whole subtree is killed before any removal waits, so a hundred unit cgroups cost one
    wait for their processes to exit rather than a hundred in turn."""
    if not path.is_dir():
        return
    _kill_subtree(path)
    deadline = time.monotonic() + patience
    while not _remove_subtree(path) and time.monotonic() < deadline:
        time.sleep(0.01)
        _kill_subtree(path)  # anything forked while the first kill landed


CGROUP_WALK_MAX = 100_000
"""Cgroup directories one kill or removal visits at most (a walk never runs unbounded)."""


def cgroup_dirs(path: Path) -> list[Path]:
    """``path`` and every cgroup below it (at most `CGROUP_WALK_MAX`), each after all of
    its descendants: an iterative walk whose entries say their type (no stat each)."""
    found, pending = [path], [path]
    while pending and len(found) < CGROUP_WALK_MAX:
        with contextlib.suppress(OSError), os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False) and len(found) < CGROUP_WALK_MAX:
                    found.append(Path(entry.path))
                    pending.append(found[-1])
    return found[::-1]  # a parent is found before its children: reversed, deepest first


def _kill_subtree(path: Path) -> None:
    kill_file = path / "cgroup.kill"
    if kill_file.exists():  # cgroup v2: one write kills every descendant cgroup too
        with contextlib.suppress(OSError):
            kill_file.write_text("1")
            return
    for directory in cgroup_dirs(path):  # v1, or a v2 kill refused: each member in turn
        for pid in read_pids(directory):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _remove_subtree(path: Path) -> bool:
    """Remove the empty cgroups under ``path``, deepest first; True once ``path`` is gone."""
    for directory in cgroup_dirs(path):
        with contextlib.suppress(OSError):
            directory.rmdir()
    return not path.exists()


def kill_lease(fragment: str, rounds: int = 5) -> int:
    """SIGKILL every process carrying the lease, repeating while new ones appear."""
    killed = 0
    for _ in range(rounds):
        holders = lease_holders(fragment)
        if not holders:
            break
        for pid in holders:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.01)
        for pid in holders:  # reap those that were orphaned to us (a subreaper)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
    return killed


def remove_lease_folder(path: Path) -> bool:
    """Remove a lease's folder (or any folder), its owner files last, the lock file the
    very last: a remover killed part way (a lifeline the kernel ends with the pid namespace
    it cleans up for) leaves a lease whose free lock says its owner is dead, swept at once,
    not one without owner files a sweep must leave for a minute (found by CI: the lifeline
    of a killed container removed owner.json and died). True once gone."""
    try:
        names = os.listdir(path)  # a lease's folder: its units, its spool, its owner files
    except FileNotFoundError:
        return True
    except OSError:
        return remove_tree(path)
    for name in names:
        if name not in LEASE_FILES:
            remove_tree(path / name)
    for name in (OWNER_FILE, LOCK_FILE):
        with contextlib.suppress(OSError):
            os.unlink(path / name)
    return remove_tree(path)


def sweep(lease: str, directories: list[Path]) -> None:
    """Kill the lease's processes and remove its cgroups and workspace directories."""
    for path in directories:
        if (path / "cgroup.procs").exists():
            kill_cgroup_tree(path)
    kill_lease(lease)
    for path in directories:
        if path.exists() and not (path / "cgroup.procs").exists():
            remove_lease_folder(path)  # iterative: a 1,500-deep chain must not stop the sweep


END_UNIT_UIDS = "--end-unit-uids"
"""The first argument when the runtime runs commands as unit uids (a root evolane)."""
CLOSED = b"closed"
"""What the runtime writes to the pipe as its host closes (rather than dies)."""
UID_SWEEP_SECONDS = 120.0
UID_SWEEP = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from evolane.sandbox._host import sweep_stale_uid_claims; sweep_stale_uid_claims()"
)


def end_unit_uids() -> None:
    """End what the dead runtime's unit uids left (their processes, IPC objects and claim
    files: `evolane.sandbox._host.sweep_stale_uid_claims`), in a full interpreter of this
    one: this process has the standard library alone, and the runtime is gone."""
    source = Path(__file__).resolve().parents[2]  # the folder evolane is imported from
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [sys.executable, "-I", "-c", UID_SWEEP, str(source)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=UID_SWEEP_SECONDS,
            check=False,
        )


def main(argv: list[str]) -> int:
    """Wait for EOF on stdin (the runtime is gone or done), then sweep the lease; where the
    runtime died holding unit uids (it never said `CLOSED`), end what they left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    uids = argv[1:2] == [END_UNIT_UIDS]
    lease, directories = argv[1 + uids], [Path(arg) for arg in argv[2 + uids :]]
    closed = False
    while True:
        try:
            data = os.read(0, 4096)
        except InterruptedError:
            continue
        except OSError:
            break
        if not data:
            break
        closed = True
    sweep(lease, directories)
    if uids and not closed:
        end_unit_uids()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
