"""The free-disk floor under the sandbox: a run stops before its commands fill the disk.

Nothing bounds what a command writes in all (RLIMIT_FSIZE bounds one file): found by review,
one candidate's replay filled the store's file system with files each under the limit, and
the run then ended ``finished`` or died with a torn journal, and the host's disk was full.
While a command runs its watch checks the free space under the sandbox root every
`CHECK_SECONDS`; below the floor (`default_floor`: 1 GiB, or 5% of a smaller file system,
or half of what was free when the host opened) the command's tree is killed and the run
ends ``failed`` with one line (`DiskLow`): the unit's folder goes with it, so the space
comes back. A writer faster than the check may
still reach the end of the disk first; the run then fails on the store's own write error.

Free inodes have a floor of their own (`default_inode_floor`): empty files take no space,
and a replay that made them by the million ran the store's file system out of inodes with
gigabytes still free (found by review), unseen by the byte floor, every file the host then
tried to create refused until the command ended.
"""

from __future__ import annotations

import os
from pathlib import Path

from evolane.store import StorageFailure

CHECK_SECONDS = 0.25
"""How often a running command's watch checks the free space."""
FLOOR_BYTES = 1 << 30
FLOOR_SHARE = 0.05
FLOOR_INODES = 100_000


class DiskLow(StorageFailure):
    """The disk under the sandbox fell below its floor while a command ran."""

    resumable = True


def free_space(path: Path) -> tuple[int | None, int | None]:
    """`free_bytes` and `free_inodes` of ``path``'s file system from one ``statvfs``."""
    try:
        info = os.statvfs(path)
    except OSError:
        return None, None
    return info.f_bavail * info.f_frsize, (info.f_favail if info.f_files > 0 else None)


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on ``path``'s file system (None: unknown)."""
    return free_space(path)[0]


def default_floor(path: Path) -> int:
    """1 GiB, or 5% of ``path``'s file system when that is less (a small disk), or half
    the space free now when that is less still (a run is not stopped for a floor it
    started below: only for what its commands took)."""
    try:
        info = os.statvfs(path)
    except OSError:
        return 0
    floor = min(FLOOR_BYTES, int(info.f_blocks * info.f_frsize * FLOOR_SHARE))
    return min(floor, info.f_bavail * info.f_frsize // 2)


def free_inodes(path: Path) -> int | None:
    """Inodes an unprivileged writer may still use on ``path``'s file system (None:
    unknown, or a file system that has no fixed number of them, as btrfs)."""
    return free_space(path)[1]


def default_inode_floor(path: Path) -> int:
    """`FLOOR_INODES`, or 5% of ``path``'s file system's inodes when that is less, or half
    those free now when that is less still (as `default_floor`); 0 where the file system
    has no fixed number of inodes."""
    try:
        info = os.statvfs(path)
    except OSError:
        return 0
    if info.f_files <= 0:
        return 0
    floor = min(FLOOR_INODES, int(info.f_files * FLOOR_SHARE))
    return min(floor, info.f_favail // 2)


class DiskFloor:
    """The floors of free bytes and free inodes under ``path``; `low` says when either
    is crossed, and `failure` names the floor `low` saw crossed (read again after the
    command's kill, its files gone, it would name the wrong one: found by the suite)."""

    def __init__(
        self, path: Path, floor: int | None = None, inode_floor: int | None = None
    ) -> None:
        self.path = path
        self.floor = default_floor(path) if floor is None else floor
        self.inode_floor = default_inode_floor(path) if inode_floor is None else inode_floor
        self.crossed: tuple[str, int] | None = None  # ("bytes" | "inodes", what was left)

    def low(self) -> bool:
        """Whether the free space or the free inodes under ``path`` are below their floor
        (one ``statvfs`` tells both: a command's watch asks at its start and its end)."""
        free, inodes = free_space(self.path)
        if free is not None and free < self.floor:
            self.crossed = ("bytes", free)
            return True
        if inodes is not None and self.inode_floor > 0 and inodes < self.inode_floor:
            self.crossed = ("inodes", inodes)
            return True
        return False

    def failure(self) -> DiskLow:
        """The run's failure, in one line, naming the floor `low` last saw crossed."""
        kind, left = self.crossed or ("bytes", free_bytes(self.path))
        if kind == "inodes":
            what = f"{self.inode_floor} free inodes ({left} left)"
            cause = "a command making files by the many?"
        else:
            shown = "?" if left is None else _size(left)
            what = f"{_size(self.floor)} free ({shown} left)"
            cause = "a command filling the disk?"
        return DiskLow(
            f"the disk under {self.path} fell below {what} while a command ran: it was "
            f"killed and the run stopped ({cause}); free some space and start it again"
        )


def _size(count: int) -> str:
    """``count`` bytes in MiB, or in KiB below one (found by review: a small disk's floor
    read "fell below 0 MiB free (0 MiB left)")."""
    return f"{count >> 20} MiB" if count >= 1 << 20 else f"{count >> 10} KiB"
