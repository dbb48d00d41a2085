"""Per-unit cgroups: membership that no setsid escapes, one-shot kill, pids and memory bounds.

Uses a cgroup v2 hierarchy for membership and ``cgroup.kill`` where a child cgroup can be
created, and the v1 ``pids`` / ``memory`` controllers where those are mounted and writable
(hybrid hosts). Everything degrades to "not available", never to an error.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from evolane.sandbox._lifeline import kill_cgroup_tree, read_cgroup_file, read_pids
from evolane.sandbox._spec import Limits


def _mounts() -> list[tuple[str, str, str, str]]:
    """(mount root, mount point, fstype, super options) of every cgroup mount we can see."""
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as lines:
        for line in lines:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                found.append((_unescape(fields[3]), _unescape(fields[4]), tail[0], tail[2]))
    return found


def _unescape(field: str) -> str:
    """Undo mountinfo's octal escapes (``\\040`` for a space, and so on)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per hierarchy: '' for v2, else the controller names."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as lines:
        for line in lines:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _inside(mount_root: str, mount_point: str, own_path: str) -> Path:
    """Our own cgroup's directory in a mount whose root is ``mount_root``."""
    relative = own_path
    if mount_root != "/" and own_path.startswith(mount_root):
        relative = own_path[len(mount_root) :]
    return Path(mount_point + "/" + relative.lstrip("/"))


def _try_mkdir(path: Path) -> bool:
    """Create one cgroup directory under an existing parent (never intermediate cgroups)."""
    try:
        path.mkdir(exist_ok=True)
        return True
    except OSError:
        return False


@dataclass(frozen=True)
class CgroupRoots:
    """Where this runtime may create unit cgroups, per mechanism (None: not available)."""

    unified: Path | None
    pids: Path | None
    memory: Path | None
    unified_name: str | None = None
    """``unified`` as ``/proc/PID/cgroup`` names it (its ``0::`` line): `UnitCgroups.holds`."""

    @classmethod
    def detect(cls, lease: str) -> CgroupRoots:
        """Find writable hierarchies and create ``evolane-<lease>`` in each."""
        own = _own_paths()
        unified = pids = memory = unified_name = None
        for root, mount, fstype, options in _mounts():
            if fstype == "cgroup2" and unified is None:
                base = _inside(root, mount, own.get("", "/"))
                candidate = base / f"evolane-{lease}"
                if (base / "cgroup.procs").exists() and _try_mkdir(candidate):
                    unified = candidate
                    unified_name = own.get("", "/").rstrip("/") + "/" + candidate.name
            elif fstype == "cgroup":
                opts = options.split(",")
                for name in ("pids", "memory"):
                    if name in opts:
                        base = _inside(root, mount, own.get(name, "/"))
                        candidate = base / f"evolane-{lease}"
                        if _try_mkdir(candidate):
                            pids, memory = (
                                (candidate, memory) if name == "pids" else (pids, candidate)
                            )
        return cls(unified, pids, memory, unified_name)

    @property
    def mechanisms(self) -> tuple[str, ...]:
        names = []
        if self.unified is not None:
            names.append("cgroup_v2")
        if self.pids is not None:
            names.append("pids_cgroup")
        if self.memory is not None:
            names.append("memory_cgroup")
        return tuple(names)

    def roots(self) -> list[Path]:
        return [root for root in (self.unified, self.pids, self.memory) if root is not None]

    def unit(self, name: str, limits: Limits, extra_processes: int = 0) -> UnitCgroups | None:
        """Create the cgroups of one unit and apply its limits; None when none could be made.

        ``extra_processes`` are launcher processes counted on top of the pids limit.
        """
        wanted = [self.unified]
        if limits.processes is not None:
            wanted.append(self.pids)
        if limits.memory_bytes is not None:
            wanted.append(self.memory)
        # v1 controllers only when their limit is asked for: each join costs a few ms.
        made = [root / name for root in wanted if root is not None and _try_mkdir(root / name)]
        if not made:
            return None
        unit = UnitCgroups(made, self)
        unit.apply(limits, extra_processes)
        return unit

    def remove(self) -> None:
        """Remove this runtime's (empty) cgroup directories."""
        for root in self.roots():
            kill_cgroup_tree(root)


class UnitCgroups:
    """The cgroups of one sandboxed tree."""

    def __init__(self, paths: list[Path], roots: CgroupRoots) -> None:
        self.paths = paths
        self._unified = next(
            (p for p in paths if roots.unified and p.parent == roots.unified), None
        )
        self._pids = next((p for p in paths if roots.pids and p.parent == roots.pids), None)
        self._memory = next((p for p in paths if roots.memory and p.parent == roots.memory), None)
        self._unified_name = None  # as /proc/PID/cgroup names it
        if self._unified is not None and roots.unified_name is not None:
            self._unified_name = f"{roots.unified_name}/{self._unified.name}"

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a launcher writes its pid to before it execs."""
        return [str(path / "cgroup.procs") for path in self.paths]

    @property
    def unified_dir(self) -> str | None:
        """The cgroup v2 directory a spawn server's clone is born in (CLONE_INTO_CGROUP)."""
        return str(self._unified) if self._unified is not None else None

    @property
    def v1_tasks_files(self) -> list[str]:
        """The v1 ``tasks`` files a spawn server's (single-threaded) clone writes "0" to.
        Moving only the writing thread skips the kernel's global threadgroup lock, whose
        write side waits out an RCU grace period (5-15 ms) on every ``cgroup.procs`` write."""
        return [str(p / "tasks") for p in (self._pids, self._memory) if p is not None]

    @property
    def bounds_processes(self) -> bool:
        """Whether a pids cgroup of the unit's counts its processes (``pids.max``)."""
        return self._pids is not None

    @property
    def mechanisms(self) -> tuple[str, ...]:
        names = []
        if self._unified is not None:
            names.append("cgroup_v2_kill")
        if self._pids is not None:
            names.append("pids_cgroup")
        if self._memory is not None:
            names.append("memory_cgroup")
        return tuple(names)

    def apply(self, limits: Limits, extra_processes: int = 0) -> None:
        if self._pids is not None and limits.processes is not None:
            _write(self._pids / "pids.max", str(limits.processes + extra_processes))
        if self._memory is not None and limits.memory_bytes is not None:
            _write(self._memory / "memory.limit_in_bytes", str(limits.memory_bytes))

    def pids(self) -> set[int]:
        """Every pid in any of the unit's cgroups (exited processes leave at once)."""
        found: set[int] = set()
        for path in self.paths:
            found |= read_pids(path)
        return found

    def holds(self, pid: int) -> bool:
        """Whether ``pid`` is (or, a zombie, was) in the unit's cgroup v2 or one below it.
        A zombie keeps its v2 cgroup in ``/proc/PID/cgroup``; on a v1 hierarchy the kernel
        names the root for any exiting process, so v1 cgroups cannot tell (checked on 6.18)."""
        if self._unified_name is None:
            return False
        for line in read_cgroup_file(Path(f"/proc/{pid}/cgroup")).splitlines():
            if line.startswith("0::"):
                path = line[3:]
                return path == self._unified_name or path.startswith(self._unified_name + "/")
        return False

    def charged(self) -> int | None:
        """The tasks the unit's v1 pids cgroup counts, zombies too until they are reaped
        (``pids.current``); None without one."""
        if self._pids is None:
            return None
        text = read_cgroup_file(self._pids / "pids.current").strip()
        return int(text) if text.isdigit() else None

    def populated(self) -> bool:
        if self._unified is not None:
            text = read_cgroup_file(self._unified / "cgroup.events")
            return "populated 1" in text
        return bool(self.pids())

    def kill(self) -> int:
        """SIGKILL every member (``cgroup.kill`` where it exists); returns how many were seen."""
        members = self.pids()
        if self._unified is not None and _write(self._unified / "cgroup.kill", "1"):
            return len(members)
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return len(members)

    def pids_refused(self) -> str | None:
        """Whose limit refused a fork of the tree, if one was refused: ``processes`` (the
        unit's own ``pids.max``) or ``host_processes`` (an enclosing cgroup's).

        The v1 kernel counts a refusal in the forking cgroup's ``pids.events`` whichever
        level refused it, so the count alone blamed the tree for the host's limit (found by
        review: a candidate that fixed 8 of 12 cases was rejected under a container's
        ``pids.max``). ``pids.peak`` tells them apart: the tree reached its own limit only
        if its high-water mark did (a refusal further up raises it by one at most)."""
        if self._pids is None:
            return None
        counts = dict(
            line.partition(" ")[::2]
            for line in read_cgroup_file(self._pids / "pids.events").splitlines()
        )
        if counts.get("max", "").strip() in ("", "0"):
            return None
        peak = read_cgroup_file(self._pids / "pids.peak").strip()
        limit = read_cgroup_file(self._pids / "pids.max").strip()
        if peak.isdigit() and limit.isdigit() and int(peak) < int(limit):
            return "host_processes"
        return "processes"  # no high-water mark on this kernel: the count, as before

    def memory_peak(self) -> int:
        if self._memory is None:
            return 0
        text = read_cgroup_file(self._memory / "memory.max_usage_in_bytes").strip()
        return int(text) if text.isdigit() else 0

    def oom_killed(self) -> bool:
        if self._memory is None:
            return False
        for line in read_cgroup_file(self._memory / "memory.oom_control").splitlines():
            name, _, count = line.partition(" ")
            if name == "oom_kill" and count.strip() not in ("", "0"):
                return True
        return False

    def cpu_seconds(self) -> float | None:
        if self._unified is None:
            return None
        for line in read_cgroup_file(self._unified / "cpu.stat").splitlines():
            name, _, value = line.partition(" ")
            if name == "usage_usec" and value.strip().isdigit():
                return int(value) / 1e6
        return None

    def remove_empty(self) -> bool:
        """Remove the unit's cgroups when each is empty (one ``rmdir`` each, nothing waited
        for): False at the first that is not, the rest left to `remove`."""
        for path in self.paths:
            try:
                path.rmdir()
            except FileNotFoundError:
                continue
            except OSError:
                return False
        return True

    def remove(self) -> None:
        """Remove the unit's cgroups, killing what is left in them first. The common case,
        an empty cgroup with none below it, is one ``rmdir`` (which refuses any other)."""
        for path in self.paths:
            try:
                path.rmdir()
            except FileNotFoundError:
                continue
            except OSError:  # members, or cgroups of its own below: kill, then remove all
                kill_cgroup_tree(path)


def _write(path: Path, text: str) -> bool:
    try:
        with open(path, "w") as handle:
            handle.write(text)
        return True
    except OSError:
        return False


_MAX_LEVELS = 64  # cgroup levels walked up from this process's own


def process_headroom() -> tuple[int, Path] | None:
    """How many more processes (tasks) the pids cgroups enclosing this process allow: the
    smallest ``pids.max - pids.current`` from its own cgroup up to its hierarchy's root (v2,
    or the v1 ``pids`` controller), and that cgroup; None where none sets a limit. A fork
    refused there fails inside whichever command tree made it, and the kernel counts it in
    that tree's own ``pids.events`` (v1, and v2 before 6.12) as if its own limit was hit."""
    own, best = _own_paths(), None
    for root, mount, fstype, options in _mounts():
        if fstype == "cgroup2" and "" in own:
            folder = _inside(root, mount, own[""])
        elif fstype == "cgroup" and "pids" in options.split(",") and "pids" in own:
            folder = _inside(root, mount, own["pids"])
        else:
            continue
        for _ in range(_MAX_LEVELS):
            limit = read_cgroup_file(folder / "pids.max").strip()
            current = read_cgroup_file(folder / "pids.current").strip()
            if limit.isdigit() and current.isdigit():
                left = max(0, int(limit) - int(current))
                if best is None or left < best[0]:
                    best = (left, folder)
            if folder == Path(mount) or folder.parent == folder:
                break
            folder = folder.parent
    return best
