"""What to run in a sandbox (`SandboxSpec`) and what happened (`ProcessOutcome`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from evolane.messages import ArtifactRef, Name, Record, ShortText, Text

Isolation = Literal["auto", "confined", "process", "namespace"]
"""`process`: session, rlimits, cgroups, lease; `namespace` adds PID and network namespaces;
`confined` runs the command in a bubblewrap view (`View`); `auto`: confined where the host
can, else namespace, else process."""
IsolationInForce = Literal["process", "namespace", "confined"]
Status = Literal["exited", "timed_out", "cancelled", "limit_exceeded", "spawn_failed"]


def _no_nul(text: str) -> str:
    if "\0" in text:
        raise ValueError("must not contain a NUL byte (exec cannot pass it)")
    return text


ENV_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"
"""What an environment variable's name may be (`EnvName`), unanchored."""
EnvName = Annotated[str, Field(pattern=f"^{ENV_NAME_PATTERN}$", max_length=128)]
Arg = Annotated[str, Field(max_length=65_536), AfterValidator(_no_nul)]
PathText = Annotated[str, Field(min_length=1, max_length=4096)]
MAX_HIDDEN = 336
"""Paths a command may be kept from seeing at most: a campaign's store, target and dataset,
or up to 256 trajectory files (``--from-trajectory``), and up to 64 copies of held-out
cases found in the folders commands are shown, with room to spare."""


class Limits(Record):
    """Per-process resource limits; ``None`` leaves the host's default in place."""

    address_space_bytes: int | None = Field(default=None, ge=16 << 20)
    memory_bytes: int | None = Field(default=None, ge=8 << 20)
    cpu_seconds: int | None = Field(default=None, ge=1)
    file_size_bytes: int | None = Field(default=None, ge=0)
    open_files: int | None = Field(default=None, ge=8)
    processes: int | None = Field(default=None, ge=1)
    """Enforced by a pids cgroup where the host has one (RLIMIT_NPROC is per user, not per
    tree), else by `uid_processes` for a tree that runs as a unit uid of its own, or by the
    RLIMIT_NPROC a non-root evolane's confined tree gets in its own user namespace
    (`evolane.sandbox._ucounts.tree_process_share`)."""
    processes_asked: int | None = Field(default=None, ge=1)
    """The limit asked for, when ``processes`` is below it as a command tree's share of a
    pid limit enclosing evolane: a limit hit's reason says so (`evolane.lanes.limit_reason`)."""
    uid_processes: int | None = Field(default=None, ge=1)
    """RLIMIT_NPROC: set by the sandbox alone, for a tree that runs as a unit uid of its own
    (a root evolane's ``drop_root`` command) where no pids cgroup bounds it: the uid's
    processes are then the tree's (`evolane.sandbox._launch.uid_process_cap`)."""


class OutputCaps(Record):
    """How much of each stream is kept: head and tail in the outcome, a capped copy in the store."""

    head_bytes: int = Field(default=16 << 10, ge=0, le=1 << 20)
    tail_bytes: int = Field(default=16 << 10, ge=0, le=1 << 20)
    stored_bytes: int = Field(default=8 << 20, ge=0, le=1 << 30)


class Overlay(Record):
    """A tree laid over the workspace seed at ``path`` (``.`` for the root); it wins conflicts."""

    path: PathText = "."
    tree: ArtifactRef


class View(Record):
    """What a confined command sees besides the system folders, the interpreters and its
    own unit directory (`evolane.sandbox._confine`)."""

    read_only: tuple[PathText, ...] = Field(default=(), max_length=256)
    """Folders (or files) shown read-only: those a command template names, ``--expose``."""
    read_write: tuple[PathText, ...] = Field(default=(), max_length=64)
    """Folders shown writable (``--expose-rw``)."""
    hidden: tuple[PathText, ...] = Field(default=(), max_length=MAX_HIDDEN)
    """Never shown, even under a shown folder: the store, the target, the dataset."""
    own: tuple[tuple[PathText, bool], ...] = Field(default=(), max_length=64)
    """The command's own paths (path, writable), shown last, over any mask: its scratch
    directory, a read-only candidate or context folder inside it."""
    network: bool = False
    """Whether the command may use the network (``--network``): its own network namespace
    behind an outbound NAT (`evolane.sandbox._netns`), or the host's with ``host_network``."""
    host_network: bool = False
    """Whether a command given the network shares the host's network namespace, its
    loopback services and abstract sockets included (``--host-network-for ROLE``)."""
    tmp_bytes: int = Field(default=256 << 20, ge=1 << 20, le=1 << 40)
    """The size of the private ``/tmp``."""


class SandboxSpec(Record):
    """One command to run: argv (never a shell), its workspace, environment, limits, deadlines."""

    argv: tuple[Arg, ...] = Field(min_length=1, max_length=4096)
    workspace: PathText | None = None
    seed: ArtifactRef | None = None
    overlays: tuple[Overlay, ...] = Field(default=(), max_length=64)
    env: dict[EnvName, Arg] = Field(default_factory=dict, max_length=256)
    pass_env: tuple[EnvName, ...] = Field(default=(), max_length=256)
    limits: Limits = Limits()
    output: OutputCaps = OutputCaps()
    kill_grace: float = Field(default=2.0, ge=0.0, le=600.0)
    isolation: Isolation = "process"
    view: View = View()
    """What the command sees under ``confined`` (ignored by the other levels)."""
    drop_root: bool = False
    """When evolane runs as root, run the command (``process``/``namespace`` levels) under
    its own unprivileged uid that may read but not write what root owns (see
    `evolane.sandbox._secrets.unit_uid_argv`); where this host cannot switch uids (no
    working ``setpriv``), it runs as any root command does. Campaign commands set it."""
    keep_failed: bool = False
    label: Name = "unit"


class StreamCapture(Record):
    """A captured stream: its first and last bytes, its total size, and the stored capped copy."""

    head: bytes = Field(default=b"", max_length=1 << 20)
    tail: bytes = Field(default=b"", max_length=1 << 20)
    total_bytes: int = Field(default=0, ge=0)
    truncated: bool = False
    ref: ArtifactRef | None = None
    """The first ``stored_bytes`` of the stream in the store; None when nothing was kept."""

    def text(self) -> str:
        """Head and tail decoded for display (undecodable bytes replaced, a gap marked)."""
        if not self.truncated:  # nothing dropped: the tail, if any, continues the head
            return (self.head + self.tail).decode("utf-8", "replace")
        head = self.head.decode("utf-8", "replace")
        return f"{head}\n[... {self.total_bytes - len(self.head) - len(self.tail)} bytes ...]\n" + (
            self.tail.decode("utf-8", "replace")
        )


class ProcessOutcome(Record):
    """Everything known about one sandboxed run once its whole process tree is gone."""

    status: Status
    exit_code: int | None = None
    signal: int | None = None
    error: Text = ""
    spawn_errno: int | None = None
    """A ``spawn_failed`` outcome's errno from evolane's own spawn (the clone, exec, cgroup
    or layout call that failed); None when none was read, and never from the command's
    output, so no command can pass its failure off as the host refusing a spawn."""
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_rss_bytes: int = 0
    stdout: StreamCapture = StreamCapture()
    stderr: StreamCapture = StreamCapture()
    pids_killed: int = 0
    escaped_found: int = 0
    survivors: int = 0
    kill_latency_seconds: float | None = None
    isolation: IsolationInForce = "process"
    enforcement: tuple[ShortText, ...] = Field(default=(), max_length=32)
    limits_hit: tuple[ShortText, ...] = Field(default=(), max_length=16)
    lease: ShortText = ""
    workspace: Text = ""

    @property
    def ok(self) -> bool:
        """True for a clean exit with code 0."""
        return self.status == "exited" and self.exit_code == 0
