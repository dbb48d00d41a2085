"""The default resource limits of every campaign command (replay, judge, verification,
optimizer, validator gate, apply check), declared once: `CommandLimits`.

Each limit is a flag (``--max-procs``, ``--max-memory``, ``--max-file-size``,
``--max-open-files``) and a flat key of ``run.json``; ``0`` or ``none`` lifts it. Sizes are
bytes or a number with a binary unit (``512M`` = 512 MiB, ``4G``, ``1.5G``; ``K M G T``,
optionally followed by ``B`` or ``iB``).

How each is enforced (what a host lacks is recorded, never silently assumed):

- processes: a pids cgroup (``pids.max``) per command tree. Without a writable pids cgroup
  the limit is not enforced: RLIMIT_NPROC counts every process of the user and root ignores
  it, so it cannot bound one tree.
- memory: a memory cgroup per command tree (the OOM killer ends the tree past the limit).
  There is deliberately no RLIMIT_AS fallback: an address-space limit counts reserved, not
  used, memory and breaks runtimes that reserve large virtual ranges up front (the JVM, Go,
  V8, numpy/BLAS thread arenas), so without a writable memory cgroup no memory bound is in
  force and the report says so.
- file size: RLIMIT_FSIZE (a write past it fails with EFBIG or raises SIGXFSZ).
- open files: RLIMIT_NOFILE (an open past it fails with EMFILE), never above the hard limit
  evolane itself runs under.
"""

from __future__ import annotations

import re
import resource
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from evolane.lanes import format_size
from evolane.messages import Record
from evolane.sandbox import Limits

DEFAULT_MAX_PROCS = 512
"""Processes (and threads: the pids cgroup counts tasks) per command tree. An agent replay
runs a shell, an interpreter, a few tool subprocesses and their thread pools: tens of tasks,
rarely a hundred or two (a JVM or a parallel test runner). 512 leaves that room while a fork
bomb stops within milliseconds instead of taking the host's pid space."""
DEFAULT_MAX_MEMORY = 4 << 30
"""Bytes of memory (RSS plus page cache charged to the tree) per command tree: an agent, a
language runtime and a mid-size test suite fit in 4 GiB, and with the default 4 replay lanes
a runaway replay cannot take more than its share of a 16 GiB machine."""
DEFAULT_MAX_FILE_SIZE = 1 << 30
"""Bytes of any one file a command writes: outputs, logs and build artefacts of a replay stay
far below 1 GiB (the replay's output folder is itself capped at 256 MiB), so only a runaway
writer hits it, before it fills the disk."""
DEFAULT_MAX_OPEN_FILES = 4096
"""Open file descriptors per process: four times the common 1024 default, enough for
language servers, watchers and connection pools; a descriptor leak stops there."""

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_NO_LIMIT = ("none", "0", "unlimited")


def parse_size(value: Any) -> int | None:
    """``value`` (bytes, or a string such as ``512M``, ``4G``, ``none``) as bytes; None for no
    limit (``0``, ``none``, ``unlimited``). Raises ``ValueError`` for anything else."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("a size must be bytes or a number with K, M, G or T")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"{value}: a size cannot be negative (0 or none: no limit)")
        return int(value) or None
    text = str(value).strip()
    if text.lower() in _NO_LIMIT:
        return None
    if text.startswith("-"):
        raise ValueError(f"{text}: a size cannot be negative (0 or none: no limit)")
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(
            f"{text!r} is not a size: give bytes or a number with K, M, G or T (512M, 4G), "
            "or 0 / none for no limit"
        )
    number, unit = match.groups()
    return int(Decimal(number) * _UNITS[unit.upper()]) or None


def parse_count(value: Any) -> int | None:
    """``value`` (a whole number, or ``none``) as a count; None for no limit (``0``,
    ``none``, ``unlimited``). Raises ``ValueError`` for anything else."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in _NO_LIMIT:
            return None
        if not re.fullmatch(r"-?\d+", text):
            raise ValueError(f"{text!r} is not a whole number (0 or none: no limit)")
        value = int(text)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("must be a whole number (0 or none: no limit)")
    if value < 0:
        raise ValueError(f"{value}: a count cannot be negative (0 or none: no limit)")
    return value or None


def _hard_limit(which: int) -> int | None:
    """The hard rlimit evolane runs under (None: unlimited); its commands cannot go above."""
    hard = resource.getrlimit(which)[1]
    return None if hard == resource.RLIM_INFINITY else hard


_MINIMUM = {"max_procs": 1, "max_memory": 8 << 20, "max_file_size": 1, "max_open_files": 8}
MAX_LIMIT = 2**63 - 1
"""The largest limit of any kind: a signed 64-bit integer, what run.json stores and what the
kernel takes (found by hostile review: ``--max-memory 99999999999999999999999G`` passed the
flags, then ended in an internal error writing run.json, exit 1, an empty run folder and an
``active`` campaign of no cycle left in the store; 400 digits raised an OverflowError)."""


def _at_least(value: int | None, name: str | None, shown: Callable[[int], str]) -> int | None:
    """``value`` if it is no limit or at least the field's minimum and at most `MAX_LIMIT`
    (friendlier errors than the bounds' own)."""
    least = _MINIMUM.get(name or "", 1)
    if value is not None and value < least:
        raise ValueError(f"{shown(value)} is below the minimum of {shown(least)}")
    if value is not None and value > MAX_LIMIT:
        raise ValueError(f"over the maximum of {MAX_LIMIT} (0 or none: no limit)")
    return value


class CommandLimits(Record):
    """Resource limits of every campaign command's process tree; None: no limit.

    See the module docstring for how each is enforced and what a host without a cgroup
    gets; `CommandSettings` carries these fields, so each is a flat ``run.json`` key.
    """

    max_procs: int | None = Field(default=DEFAULT_MAX_PROCS, ge=1)
    """``--max-procs``: processes and threads of one command tree (pids cgroup)."""
    max_memory: int | None = Field(default=DEFAULT_MAX_MEMORY, ge=8 << 20)
    """``--max-memory``: bytes of memory of one command tree (memory cgroup), at least 8 MiB."""
    max_file_size: int | None = Field(default=DEFAULT_MAX_FILE_SIZE, ge=1)
    """``--max-file-size``: bytes of any one file a command writes (RLIMIT_FSIZE)."""
    max_open_files: int | None = Field(default=DEFAULT_MAX_OPEN_FILES, ge=8)
    """``--max-open-files``: open descriptors per process (RLIMIT_NOFILE), at least 8."""
    max_procs_asked: int | None = Field(default=None, ge=1)
    """``--max-procs`` as given, when ``max_procs`` is each command tree's share of a pid
    limit enclosing evolane below it (`evolane.campaign.share_host_pids`, taken at each
    start: run.json keeps the flag and never this); a limit hit and the report say so."""

    @field_validator("max_memory", "max_file_size", mode="before")
    @classmethod
    def _size(cls, value: Any, info: ValidationInfo) -> int | None:
        return _at_least(parse_size(value), info.field_name, format_size)

    @field_validator("max_procs", "max_open_files", mode="before")
    @classmethod
    def _count(cls, value: Any, info: ValidationInfo) -> int | None:
        return _at_least(parse_count(value), info.field_name, str)

    def sandbox_limits(self) -> Limits:
        """These limits as the sandbox's `Limits`; open files and file size are capped at
        the hard limits evolane runs under (a command cannot be given more than it has)."""
        open_files, file_size = self.max_open_files, self.max_file_size
        hard_files = _hard_limit(resource.RLIMIT_NOFILE)
        if open_files is not None and hard_files is not None:
            open_files = min(open_files, hard_files)
        hard_size = _hard_limit(resource.RLIMIT_FSIZE)
        if file_size is not None and hard_size is not None:
            file_size = min(file_size, hard_size)
        return Limits(
            processes=self.max_procs,
            memory_bytes=self.max_memory,
            file_size_bytes=file_size,
            open_files=open_files,
            processes_asked=self.max_procs_asked,
        )


STORED_LIMITS: dict[str, None] = {name: None for name in CommandLimits.model_fields}
"""What a stored config without the limit keys ran with: no limits (it predates them)."""


def describe_limits(limits: CommandLimits, cgroups: tuple[str, ...], unit_uids: bool) -> str:
    """The limits in force and what enforces each, in one line for the report; ``cgroups``
    are the host's cgroup mechanisms (``pids_cgroup``, ``memory_cgroup``); ``unit_uids``:
    each tree has an RLIMIT_NPROC of its own, which bounds it where no pids cgroup does (a
    unit uid's, or a non-root evolane's confined tree's in its own user namespace:
    `evolane.sandbox.trees_own_process_limit`). A limit the host cannot enforce says so."""
    by_cgroup = "pids_cgroup" in cgroups
    procs = "pids_cgroup" if by_cgroup or not unit_uids else "rlimit_nproc"
    if limits.max_procs_asked is not None:
        procs += f", the host's share of --max-procs {limits.max_procs_asked}"
    rows = (
        ("processes", limits.max_procs, str, by_cgroup or unit_uids, procs),
        ("memory", limits.max_memory, format_size, "memory_cgroup" in cgroups, "memory_cgroup"),
        ("file size", limits.max_file_size, format_size, True, "rlimit_fsize"),
        ("open files", limits.max_open_files, str, True, "rlimit_nofile"),
    )
    parts = []
    for name, value, shown, enforced, mechanism in rows:
        if value is None:
            parts.append(f"{name} unlimited")
        elif enforced:
            parts.append(f"{name} {shown(value)} ({mechanism})")
        else:
            parts.append(f"{name} {shown(value)} NOT ENFORCED (no writable {mechanism})")
    return "; ".join(parts)
