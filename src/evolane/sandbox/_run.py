"""One sandboxed run, from workspace to outcome: spawn, wait, kill ladder, capture, clean up.

A run sees its host only as a `UnitHost` (what `SandboxHost` offers), so the host imports
this module and never the reverse.
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import trio

from evolane.messages import ArtifactRef
from evolane.sandbox._capture import BoundedCapture, OwnedPipes
from evolane.sandbox._cgroups import CgroupRoots, UnitCgroups
from evolane.sandbox._confine import resolve_isolation
from evolane.sandbox._disk import DiskFloor
from evolane.sandbox._env import build_environment, child_lease
from evolane.sandbox._inline import INLINE_BYTES, INLINE_FILES, INLINE_FOLDER_BYTES, InlineGate
from evolane.sandbox._launch import (
    NAMESPACE_EXTRA_PROCESSES,
    join_failed_marker,
    step_failed_marker,
    uid_process_cap,
)
from evolane.sandbox._litter import end_uid, remove_litter
from evolane.sandbox._netns import own_network_args
from evolane.sandbox._secrets import commands_run_unprivileged
from evolane.sandbox._spawner import Spawner
from evolane.sandbox._spec import IsolationInForce, ProcessOutcome, SandboxSpec
from evolane.sandbox._start import Launch, ProgramCache, Spawned, SpawnError
from evolane.sandbox._stop import Stop
from evolane.sandbox._tree import ProcessTree
from evolane.sandbox._uids import UidClaim, release_uid
from evolane.sandbox._watch import Watch
from evolane.sandbox._workspace import (
    WorkspaceError,
    hand_over,
    inside,
    materialize_workspace,
    take_back,
)
from evolane.store import BlobStore, remove_small_tree, remove_tree

_STREAMS = ("stdout", "stderr")
_LAYOUT = ("home", "tmp", "work")  # the folders `Unit.prepare` makes in a unit's folder


class UnitHost(Protocol):
    """What one run needs of the host it runs on (`SandboxHost` is the one host)."""

    root: Path  # resolved; workspaces must lie inside it; kept units go to ``root/kept``
    store: BlobStore | None  # seeds the workspace; a spooled capture goes here
    lease: str
    inherited_lease: str | None
    lease_dir: Path  # the parent of every unit directory
    spool_dir: Path
    cgroups: CgroupRoots
    inline: InlineGate  # whether small file work may run on the event loop now
    active_leaders: set[int]  # its trees' unreaped leaders (`ProcessTree.leaders`)
    disk: DiskFloor | None  # the free-disk floor a running command's watch checks
    programs: ProgramCache  # where the programs of recent spawns were found

    @property
    def spawner(self) -> Spawner | None:
        """The spawn server's client; None: every command starts through the launcher chain."""
        ...

    @property
    def mechanisms(self) -> tuple[str, ...]:
        """Host-wide mechanisms in force."""
        ...

    def unit_name(self, label: str) -> str:
        """A unique, filesystem- and lease-safe name for the next unit."""
        ...

    def claim_uid(self) -> UidClaim:
        """The uid the next ``drop_root`` command runs as when evolane is root, claimed."""
        ...

    def defer(self, cleanup: Callable[[], object]) -> None:
        """Run ``cleanup`` later, off the critical path."""
        ...

    def clean_soon(self, small: Callable[[], bool], cleanup: Callable[[], object]) -> None:
        """Run ``small`` now on the loop if it may and can, else `defer` ``cleanup``."""
        ...


def _isolation(spec: SandboxSpec) -> IsolationInForce:
    level, problem = resolve_isolation(spec.isolation)
    if problem is not None and spec.isolation != "auto":
        raise WorkspaceError(f"isolation {spec.isolation!r} is not available: {problem}")
    return level


class Unit:
    """The directories and bookkeeping of one run."""

    def __init__(
        self,
        host: UnitHost,
        spec: SandboxSpec,
        setup: Callable[[], object] | None = None,
        activity: Callable[[], object] | None = None,
        small_layout: bool = False,
    ) -> None:
        self.host, self.spec = host, spec
        self.setup, self.activity = setup, activity  # the caller's hooks: before, during
        # Small file work (`InlineGate`): the unit's own fresh folders alone, or with what its
        # caller vouched small; never a seed or overlays to copy.
        own_only = setup is None and spec.workspace is None and not spec.view.own
        self.small_layout = (small_layout or own_only) and spec.seed is None and not spec.overlays
        self.name = host.unit_name(spec.label)
        self.dir = host.lease_dir / self.name
        self.lease = child_lease(host.inherited_lease, host.lease, self.name)
        self.tree_lease = f"{host.lease}/{self.name}"
        self.nonce = secrets.token_hex(8)  # see `join_failed_marker`
        self.cgroups: UnitCgroups | None = None
        self.step_marker: int | None = None  # see `evolane.sandbox._start.LaidOut`
        self.uid: int | None = None  # a unit uid's: its IPC objects go with the unit
        self.uid_claim: UidClaim | None = None  # held until they are gone (`release_uid`)
        self.survivors = False  # the kill ladder left some of the tree alive
        self.handed: list[Path] = []  # what `hand_over` gave the unit uid (`take_back`)
        self.created = False
        self.work = self.dir / "work"  # a given workspace is resolved by `prepare`

    def prepare(self) -> None:
        """Run the caller's setup, then create the unit directories and the workspace
        (blocking I/O)."""
        spec, host = self.spec, self.host
        if self.setup is not None:
            self.setup()
        if spec.workspace is not None:  # checked as resolved, and used as checked
            work = Path(spec.workspace).resolve()  # the host's root is resolved already
            if not work.is_relative_to(host.root) or not work.is_dir():
                raise WorkspaceError(
                    f"workspace {spec.workspace!r} is not a directory inside {host.root}"
                )
            self.work = work
        try:
            self.dir.mkdir()
        except FileExistsError as error:
            raise WorkspaceError(str(error)) from error
        self.created = True
        try:
            for sub in ("home", "tmp"):
                (self.dir / sub).mkdir()
            if spec.workspace is None:
                materialize_workspace(host.store, spec.seed, spec.overlays, self.work)
        except BaseException:
            self.created = False
            remove_tree(self.dir)
            raise

    def remove_small(self) -> bool:
        """`remove` of a unit not kept, when it is small (empty cgroups, a folder within the
        inline bounds): True once done; False leaves the rest to `remove`."""
        if not self.created:
            return True
        if self.cgroups is not None:
            if not self.cgroups.remove_empty():
                return False
            self.cgroups = None
        uid = self.uid  # what the unit uid left, when that is small too
        if uid is not None and (self.survivors or not remove_litter(uid, small=True)):
            return False
        if not self._remove_empty_layout() and not remove_small_tree(
            self.dir, INLINE_FILES, INLINE_FOLDER_BYTES, INLINE_BYTES
        ):
            return False
        if uid is not None:  # the folders it was handed beside its own, taken back
            if take_back(self.handed, uid, INLINE_FILES):
                self._uid_free()
            else:  # a big workspace: in the cleanup thread, the uid held until then
                self.host.defer(self._hand_back)
        return True

    def _remove_empty_layout(self) -> bool:
        """Remove the unit's folder when it holds nothing but the empty folders `prepare`
        made: one ``rmdir`` each, no listing (issue 22: walking four empty folders took ~45
        system calls a command). An ``rmdir`` never follows a symlink and refuses a folder
        that is not empty; False (what was removed stays removed) leaves the rest to a walk."""
        whole = True
        for name in _LAYOUT:
            try:
                os.rmdir(self.dir / name)
            except FileNotFoundError:  # a given workspace: no "work" here
                continue
            except OSError:  # not empty, not a folder: the walk takes it
                whole = False
        if not whole:
            return False
        try:
            os.rmdir(self.dir)
        except OSError:
            return False
        return True

    def _release_uid(self) -> None:
        """Remove what the unit uid left outside the unit's folders (`remove_litter`): its
        tree is dead (its cgroups are gone), so nothing of it is in use. A tree the kill
        ladder could not end (`survivors`): its uid's processes are killed first
        (`end_uid`), and where some still live the uid stays claimed by its file, for the
        next claim or host to end (found by review: it went back to the pool with them).
        What it was handed is taken back first (`_hand_back`)."""
        if self.uid is None:
            return
        if self.survivors and self.owns_uid:
            ended = end_uid(self.uid)
        else:
            remove_litter(self.uid)
            ended = True
        self._hand_back(ended)

    def _hand_back(self, ended: bool = True) -> None:
        """`take_back` what the unit uid was handed, then free it (``ended``: see
        `release_uid`); past the walk's bound the uid stays this process's claim until it
        exits, never served again meanwhile."""
        if self.uid is not None and not take_back(self.handed, self.uid):
            self.uid, self.uid_claim = None, None  # its lock held, unreleased
            return
        self._uid_free(ended)

    @property
    def owns_uid(self) -> bool:
        """Whether the unit uid is claimed host-wide for this unit (not where claims are
        unavailable): every process of it is then the unit's, to kill."""
        return self.uid_claim is not None and self.uid_claim.fd is not None

    def _uid_free(self, ended: bool = True) -> None:
        """The unit uid's litter is gone (``ended``) and what it was handed taken back
        (`take_back`): another unit on the host may have it."""
        release_uid(self.uid_claim, ended)
        self.uid, self.uid_claim = None, None

    def remove(self, keep: bool) -> Path | None:
        """Remove the unit's cgroups and directories; a kept unit moves out of the lease."""
        if not self.created:  # prepare failed (and cleaned up) or never ran
            return None
        if self.cgroups is not None:
            self.cgroups.remove()
            self.cgroups = None
        if not keep:  # before the uid is taken back: nothing of it left to walk
            remove_tree(self.dir)
        self._release_uid()
        if keep:
            kept = self.host.root / "kept" / self.name
            kept.parent.mkdir(exist_ok=True)
            self.dir.rename(kept)
            return kept
        return None


async def run_unit(
    host: UnitHost,
    spec: SandboxSpec,
    deadline: float,
    stop: Stop | None,
    activity: Callable[[], object] | None = None,
    setup: Callable[[], object] | None = None,
    small_layout: bool = False,
) -> ProcessOutcome:
    """The body of `SandboxHost.run`."""
    unit = Unit(host, spec, setup, activity, small_layout)
    try:
        outcome = await _run_prepared(unit, deadline, stop)
    except BaseException:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(unit.remove, False)
        raise
    keep = spec.keep_failed and not outcome.ok
    kept = None
    if keep:
        with trio.CancelScope(shield=True):
            kept = await trio.to_thread.run_sync(unit.remove, keep)
    else:  # the tree is gone: its empty cgroups and few folders go now, on the loop, or
        host.clean_soon(unit.remove_small, partial(unit.remove, False))  # in a thread
    if kept is not None:
        outcome = outcome.model_copy(update={"workspace": str(kept)})
    return outcome


async def _run_prepared(unit: Unit, deadline: float, stop: Stop | None) -> ProcessOutcome:
    spec, host = unit.spec, unit.host
    isolation = _isolation(spec)
    base: dict[str, Any] = {"isolation": isolation, "lease": unit.lease}
    spool_dir = host.spool_dir if host.store is not None else None
    with ExitStack() as owned:
        captures = {}
        for name in _STREAMS:
            captures[name] = BoundedCapture(spec.output, spool_dir)
            owned.callback(captures[name].close)
        pipes = OwnedPipes()
        owned.callback(pipes.close_all)
        fds = {name: pipes.open() for name in _STREAMS}
        started = trio.current_time()
        spawned = await _start(unit, isolation, fds)
        if isinstance(spawned, SpawnError):
            error, number = spawned.message, spawned.errno
            return ProcessOutcome(status="spawn_failed", error=error, spawn_errno=number, **base)
        pid, mechanisms = spawned
        if unit.step_marker is not None:
            owned.callback(os.close, unit.step_marker)
        base["enforcement"] = (*mechanisms, *host.mechanisms)
        for _, write_fd in fds.values():
            pipes.close(write_fd)  # the child holds its own copies now
        tree = ProcessTree(
            pid,
            unit.cgroups,
            unit.tree_lease,
            uid=unit.uid,
            owns_uid=unit.owns_uid,
            leaders=host.active_leaders,
        )
        watch = Watch(tree, spec.kill_grace, unit.activity)
        async with trio.open_nursery() as nursery:
            for name, (read_fd, _) in fds.items():  # each drain closes its pipe
                nursery.start_soon(watch.drain, pipes.hand_over(read_fd), captures[name])
            try:
                await watch.wait(deadline, stop, host.disk.low if host.disk else None)
            finally:
                with trio.CancelScope(shield=True):
                    await watch.finish(nursery)
                unit.survivors = watch.kill.survivors > 0
        if host.disk is not None and (watch.disk_low or host.disk.low()):
            raise host.disk.failure()  # killed, or a short one crossed it: the run stops
        return await _outcome(unit, tree, watch, captures, started, base)


async def _start(unit: Unit, isolation: IsolationInForce, fds: dict) -> Spawned | SpawnError:
    """Lay the unit out and spawn its command in one worker thread; or, for a small layout
    while the host's `InlineGate` is open, lay it out on the event loop (a thread's GIL
    hand-offs cost more than a few folders) and spawn it from the loop too when it can
    (`Launch.from_loop`), else in a worker thread."""
    if unit.small_layout:
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled run lays nothing out
        launch = unit.host.inline.attempt(partial(_prepare, unit, isolation, fds))
        if isinstance(launch, SpawnError):
            return launch
        if launch is not None:
            started = await launch.from_loop()
            if started is not None:
                return started
            return await trio.to_thread.run_sync(_spawn_unless_cancelled, launch)
    return await trio.to_thread.run_sync(_prepare_and_spawn, unit, isolation, fds)


def _prepare_and_spawn(unit: Unit, isolation: IsolationInForce, fds: dict) -> Spawned | SpawnError:
    """In a worker thread: `_prepare`, then the spawn it returns."""
    launch = _prepare(unit, isolation, fds)
    return launch if isinstance(launch, SpawnError) else _spawn_unless_cancelled(launch)


def _spawn_unless_cancelled(launch: Launch) -> Spawned | SpawnError:
    """In a worker thread: ``launch``, unless the run was cancelled meanwhile."""
    trio.from_thread.check_cancelled()
    return launch.in_thread()


def _prepare(unit: Unit, isolation: IsolationInForce, fds: dict) -> Launch | SpawnError:
    """Lay the unit out and make its cgroups (errors raise, or return as the message of a
    ``spawn_failed`` outcome): file work under the sandbox root and in the cgroup tree
    only. Returns the launch (it looks the program up in PATH, whose folders may be
    anywhere, in a worker thread)."""
    unit.prepare()
    spec = unit.spec
    env = build_environment(
        spec,
        home=str(unit.dir / "home"),
        tmp="/tmp" if isolation == "confined" else str(unit.dir / "tmp"),
        workspace=str(unit.work),
        lease=unit.lease,
    )
    try:
        extra = NAMESPACE_EXTRA_PROCESSES if isolation != "process" else 0
        if isolation == "confined" and own_network_args(spec.view)[0]:
            extra += 1  # slirp4netns, in the tree's cgroups beside it
        unit.cgroups = unit.host.cgroups.unit(unit.name, spec.limits, extra)
        uid = _unit_uid(unit) if isolation != "confined" else None  # confined: no unit uid
    except (OSError, ValueError) as error:
        return SpawnError(str(error)[:2048], error.errno if isinstance(error, OSError) else None)
    pids_cgroup = unit.cgroups is not None and unit.cgroups.bounds_processes
    limits = uid_process_cap(spec.limits, pids_cgroup, uid, extra)
    output = (fds["stdout"][1], fds["stderr"][1])
    return Launch(unit, isolation, env, output, uid, limits)


def _unit_uid(unit: Unit) -> int | None:
    """The uid a ``drop_root`` command of a root evolane runs as (None: evolane's own),
    with its unit directory and its writable own paths (inside the root) handed to it."""
    if not unit.spec.drop_root or not commands_run_unprivileged():
        return None  # not root; or no way to switch: root then (caps dropped where it can)
    unit.uid_claim = unit.host.claim_uid()
    uid = unit.uid = unit.uid_claim.uid
    writable = [Path(path) for path, rw in unit.spec.view.own if rw]
    unit.handed = [unit.dir, unit.work, *(p for p in writable if inside(unit.host.root, p))]
    hand_over(unit.handed, uid)
    return uid


async def _outcome(
    unit: Unit,
    tree: ProcessTree,
    watch: Watch,
    captures: dict[str, BoundedCapture],
    started: float,
    base: dict[str, Any],
) -> ProcessOutcome:
    host = unit.host
    refs: dict[str, ArtifactRef | None] = {name: None for name in captures}
    store = host.store
    if store is not None and any(capture.spooled for capture in captures.values()):
        refs = await trio.to_thread.run_sync(
            lambda: {name: capture.store(store) for name, capture in captures.items()}
        )
    stdout, stderr = (captures[name].result(refs[name]) for name in _STREAMS)
    rusage: Any = tree.rusage
    cpu = unit.cgroups.cpu_seconds() if unit.cgroups is not None else None
    if cpu is None and rusage is not None:
        cpu = rusage.ru_utime + rusage.ru_stime
    peak = max(watch.peak_rss, (rusage.ru_maxrss * 1024) if rusage is not None else 0)
    common = {
        "wall_seconds": round(trio.current_time() - started, 6),
        "cpu_seconds": round(cpu or 0.0, 6),
        "peak_rss_bytes": peak,
        "stdout": stdout,
        "stderr": stderr,
        "pids_killed": watch.kill.pids_killed,
        "escaped_found": watch.kill.escaped_found,
        "survivors": watch.kill.survivors,
        "kill_latency_seconds": watch.kill_latency,
        **base,
    }
    if tree.status is None:
        error = "the leader could not be reaped; its exit status is unknown"
        return ProcessOutcome(status=watch.reason, error=error, **common)  # type: ignore[arg-type]
    exit_code = os.WEXITSTATUS(tree.status) if os.WIFEXITED(tree.status) else None
    signum = os.WTERMSIG(tree.status) if os.WIFSIGNALED(tree.status) else None
    markers = (join_failed_marker(unit.nonce), step_failed_marker(unit.nonce))
    if exit_code == 125 and stderr.head.startswith(markers):
        return ProcessOutcome(status="spawn_failed", error=stderr.text()[:2048], **common)
    if exit_code is not None and unit.step_marker is not None and not _step_ran(unit):
        said = f"the command's user namespace step failed (exit {exit_code}): {stderr.text()}"
        return ProcessOutcome(status="spawn_failed", error=said[:2048], **common)
    limits_hit = _limits_hit(unit, signum, exit_code, watch.kill.escalated, cpu or 0.0)
    reason = watch.reason
    if limits_hit and reason in ("exited", "timed_out") and exit_code != 0:
        reason = "limit_exceeded"
    return ProcessOutcome(
        status=reason,  # type: ignore[arg-type]
        exit_code=exit_code,
        signal=signum,
        limits_hit=limits_hit,
        **common,
    )


def _step_ran(unit: Unit) -> bool:
    """Whether the launcher's user counts step wrote its byte (`Unit.step_marker`): it runs
    only once the command's user namespace is made, and the command never has the pipe."""
    assert unit.step_marker is not None
    os.set_blocking(unit.step_marker, False)
    try:
        return os.read(unit.step_marker, 1) != b""
    except BlockingIOError:  # empty, and a process of the chain still holds it
        return False


def _limits_hit(
    unit: Unit, signum: int | None, exit_code: int | None, we_killed: bool, cpu: float
) -> tuple[str, ...]:
    """Which limits ended the run: by the leader's signal, or a shell's 128+signal exit code."""
    limits, hit = unit.spec.limits, []
    died_of = (
        signum if signum is not None else (exit_code - 128 if (exit_code or 0) > 128 else None)
    )
    if limits.cpu_seconds is not None and (
        died_of == signal.SIGXCPU
        or (died_of == signal.SIGKILL and not we_killed and cpu >= limits.cpu_seconds)
    ):
        hit.append("cpu")
    if limits.file_size_bytes is not None and died_of == signal.SIGXFSZ:
        hit.append("file_size")
    if unit.cgroups is not None:
        if unit.cgroups.oom_killed():
            hit.append("memory")
        refused = unit.cgroups.pids_refused()
        if refused is not None:
            hit.append(refused)
    return tuple(hit)
