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
"""

from __future__ import annotations

import os
from pathlib import Path

from evolane.store import StorageFailure

CHECK_SECONDS = 0.25
"""How often a running command's watch checks the free space."""
FLOOR_BYTES = 1 << 30
FLOOR_SHARE = 0.05


class DiskLow(StorageFailure):
    """The disk under the sandbox fell below its floor while a command ran."""


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on ``path``'s file system (None: unknown)."""
    try:
        info = os.statvfs(path)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


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


class DiskFloor:
    """The floor of free bytes under ``path``; `low` says when it is crossed."""

    def __init__(self, path: Path, floor: int | None = None) -> None:
        self.path = path
        self.floor = default_floor(path) if floor is None else floor

    def low(self) -> bool:
        """Whether the free space under ``path`` is below the floor now."""
        free = free_bytes(self.path)
        return free is not None and free < self.floor

    def failure(self) -> DiskLow:
        """The run's failure, in one line."""
        free = free_bytes(self.path)
        shown = "?" if free is None else f"{free >> 20} MiB"
        return DiskLow(
            f"the disk under {self.path} fell below {self.floor >> 20} MiB free ({shown} left) "
            "while a command ran: it was killed and the run stopped (a command filling the "
            "disk?); free some space and start it again"
        )
