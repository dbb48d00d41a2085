"""The sandbox host: one per runtime process; owns the lease, the lifeline and the cgroups."""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Literal

import psutil
import trio

from evolane.sandbox import _lifeline
from evolane.sandbox._cgroups import CgroupRoots
from evolane.sandbox._disk import DiskFloor
from evolane.sandbox._host_flags import hold_host_flags, release_host_flags
from evolane.sandbox._inline import (
    INLINE_BYTES,
    INLINE_FILES,
    INLINE_FOLDER_BYTES,
    INLINE_WORK,
    InlineGate,
)
from evolane.sandbox._lease_owner import (
    CGROUP_NAME,
    claim,
    holds_foreign_processes,
    namespace_tag,
    owner_is_dead,
)
from evolane.sandbox._lifeline import LEASE_VARIABLE, kill_cgroup_tree, kill_lease
from evolane.sandbox._litter import end_uid, end_uids, kill_claim_openers
from evolane.sandbox._run import run_unit
from evolane.sandbox._secrets import UNIT_UID_BASE, UNIT_UID_SPAN
from evolane.sandbox._spawner import Spawner
from evolane.sandbox._spec import ProcessOutcome, SandboxSpec
from evolane.sandbox._start import ProgramCache
from evolane.sandbox._stop import Stop
from evolane.sandbox._uids import UidClaim, claim_uid, claims_folder, sweep_stale_claims
from evolane.store import (
    BlobStore,
    close_fd,
    close_in_forks,
    remove_small_tree,
    remove_tree,
)

LIFELINE_EXIT_WAIT = 5.0
"""Seconds the lifeline process gets to exit once its pipe closes (it kills the lease and
leaves at once); past them it is killed."""


CLEANUP_DELAY = 0.03
"""Seconds deferred cleanups wait when they start a batch (those queued meanwhile go with
them): a unit ends as its lane starts the next, and cleaning then would compete with that
start, which is on the critical path, for the GIL, the cores and the disk."""


class _Janitor:
    """One background thread that runs deferred cleanups in order (bounded queue), in
    batches that start `CLEANUP_DELAY` after their first cleanup was queued."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Callable[[], object] | None] = queue.Queue(maxsize=4096)
        self._thread: threading.Thread | None = None
        self._delay: Callable[[float], object] = time.sleep

    def put(self, cleanup: Callable[[], object]) -> None:
        if self._thread is None:
            thread = threading.Thread(target=self._run, name="evolane-janitor", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # the host refused a thread (its pid limit): clean up now
                self._now(cleanup)  # (found by review: an unstarted thread kept, its join
                return  # at close raised, a settle waited for a queue nothing drained)
            self._thread = thread
        try:
            self._queue.put_nowait(cleanup)
        except queue.Full:  # cleaning is behind: do this one now rather than wait
            self._now(cleanup)

    @staticmethod
    def _now(cleanup: Callable[[], object]) -> None:
        with contextlib.suppress(Exception):  # as in the thread: litter, not damage
            cleanup()

    def _run(self) -> None:
        while (cleanup := self._next()) is not None:
            self._now(cleanup)  # a cleanup failure leaves litter, not damage
            self._queue.task_done()

    def _next(self) -> Callable[[], object] | None:
        """The next cleanup; one that had to be waited for starts a batch, after the delay."""
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            cleanup = self._queue.get()
        if cleanup is not None:
            with contextlib.suppress(Exception):  # a delay that fails is no delay
                self._delay(CLEANUP_DELAY)
        return cleanup

    def settle(self) -> None:
        """Block until every cleanup queued so far has run."""
        if self._thread is not None:
            self._queue.join()

    def close(self, timeout: float = 30.0) -> None:
        """Finish every queued cleanup, then stop the thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None


class SandboxHost:
    """Runs sandboxed commands for one runtime; see `open_sandbox`.

    Every tree it starts carries its lease; if the runtime dies, the lifeline process kills
    them all, and the next host opened on the same root removes what is left.
    """

    def __init__(
        self, root: Path, store: BlobStore | None, use_cgroups: bool, use_spawner: bool = True
    ) -> None:
        self.root = root.resolve()
        self.store = store
        self.lease = f"rt-{os.getpid()}{namespace_tag()}-{secrets.token_hex(4)}"
        self.inherited_lease = os.environ.get(LEASE_VARIABLE) or None
        self.lease_dir = self.root / self.lease
        self.spool_dir = self.lease_dir / ".spool"
        self.subreaper = False  # set by `start`: sweeping alone must not adopt orphans
        self._flags_held = False  # `start` took the process-wide flags; `close` gives them back
        self.undumpable = False  # set by `start`: /proc/<our pid>/ closed to our commands
        self.cgroups = (
            CgroupRoots.detect(self.lease) if use_cgroups else CgroupRoots(None, None, None)
        )
        # Hosts rarely share a uid: each starts at its own random place in the span.
        self._uids = itertools.count(secrets.randbelow(UNIT_UID_SPAN))
        self._uid_claims: Path | Literal[False] | None = False  # False: not looked for yet
        self.active_leaders: set[int] = set()
        """The leaders of this host's trees, each from its spawn until it is reaped
        (`evolane.sandbox._tree.ProcessTree.leaders`)."""
        self._use_spawner = use_spawner
        self.spawner: Spawner | None = None
        """The spawn server's client (`evolane.sandbox._spawner`), set by `start` where a
        server works here; None: every command starts through the launcher chain."""
        self._lifeline: subprocess.Popen[bytes] | None = None
        self._lifeline_fd: int | None = None
        self._lease_lock: int | None = None  # `claim`'s lock: held while the lease is
        self.stale_swept = 0
        self._janitor = _Janitor()
        inline = INLINE_WORK.get()  # off in an asyncio host's guest
        self.inline = InlineGate(enabled=inline)
        """Whether small file work of in-process units may run on the event loop now."""
        self.inline_cleanup = InlineGate(enabled=inline)
        """Whether a finished unit's small cleanup (`clean_soon`) may run on the loop now:
        a gate of its own, as removing is slow where making is not (issue 22: on a disk
        mounted with ``discard`` each folder's rmdir waits for its block's discard, 0.1 to
        20 ms, and closing `inline` for it sent every layout and spawn to threads too)."""
        self.disk: DiskFloor | None = None
        """The free-disk floor under the root (set once the root exists, by `start`)."""
        self.programs = ProgramCache()
        """Where the programs of recent spawns were found (a loop's spawn never looks)."""

    def defer(self, cleanup: Callable[[], object]) -> None:
        """Run ``cleanup`` (removing a finished unit's empty cgroups and directories) off the
        critical path, in the host's cleanup thread; `close` waits for every one."""
        self._janitor.put(cleanup)

    def clean_soon(self, small: Callable[[], bool], cleanup: Callable[[], object]) -> None:
        """Run ``small`` now, on the event loop, while the inline gate is open; when it is
        closed, or ``small`` says False (too big, refused: what it left stays), `defer`
        ``cleanup``. Call it from the event loop. A finished unit's few folders and files
        go inline: in the cleanup thread each system call hands the GIL to and from the busy
        loop (issue 22: ~1 ms of CPU a subprocess unit, against ~0.15 ms of work)."""
        try:
            done = self.inline_cleanup.attempt(small)
        except Exception:  # as in the cleanup thread: litter for the cleanup, not damage
            done = False
        if not done:
            self.defer(cleanup)

    def remove_soon(self, folder: Path, small: bool = True) -> None:
        """Remove ``folder`` (a finished unit's scratch): inline while it is small, else in
        the cleanup thread (`clean_soon`); not ``small`` (the caller knows it is big, such
        as a copy of a candidate): in the cleanup thread at once."""
        if not small:
            self.defer(partial(remove_tree, folder))
            return
        bounds = (INLINE_FILES, INLINE_FOLDER_BYTES, INLINE_BYTES)
        bounded = partial(remove_small_tree, folder, *bounds)
        self.clean_soon(bounded, partial(remove_tree, folder))

    def settle(self) -> None:
        """Block until every deferred cleanup has run (blocking: call it from a thread)."""
        self._janitor.settle()

    def unit_name(self, label: str) -> str:
        """A unique, filesystem- and lease-safe name for the next unit: its label and 80
        random bits, never a count (a command sees its name in ``HOME`` and
        ``EVOLANE_LEASE``: a count of the commands before it told an optimizer how many val
        units the last candidates were measured on, the early stop's verdict in part;
        found by review)."""
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in label)[:40] or "unit"
        return f"{safe}-{secrets.token_hex(10)}"

    def claim_uid(self) -> UidClaim:
        """The uid the next ``drop_root`` command runs as when evolane is root: one per live
        unit on the host (`evolane.sandbox._uids`), so units can neither signal nor write
        one another; `release_uid` once its litter is gone."""
        if self._uid_claims is False:
            self._uid_claims = claims_folder()
        return claim_uid(self._uid_claims, self._draw_uid, self._end_stale_uid)

    def _end_stale_uid(self, uid: int) -> bool:
        """End what a dead holder of ``uid`` left (`end_uid`), if small; else leave it to
        the cleanup thread, which frees the uid once done, and draw another."""
        if end_uid(uid, small=True):
            return True
        self.defer(partial(sweep_stale_claims, self._uid_claims, end_uids, range(uid, uid + 1)))
        return False

    def _draw_uid(self, jump: bool) -> int:
        if jump:  # taken by another host's live unit: its neighbours likely are too
            self._uids = itertools.count(secrets.randbelow(UNIT_UID_SPAN))
        return UNIT_UID_BASE + next(self._uids) % UNIT_UID_SPAN

    @property
    def mechanisms(self) -> tuple[str, ...]:
        """Host-wide mechanisms in force (per-unit ones are added by each run)."""
        names = ["lease_sweep"]
        if self.subreaper:
            names.append("subreaper")
        if self.undumpable:
            names.append("non_dumpable")
        if self._lifeline is not None:
            names.append("lifeline")
        return tuple(names)

    # ----- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Become the reaper of escapees and non-dumpable (before any command runs: see
        `evolane.sandbox._secrets`; `close` puts both back once no host is open), sweep
        stale leases, lay out this lease, start the lifeline."""
        self.undumpable, self.subreaper = hold_host_flags()  # put back by the last `close`
        self._flags_held = True
        self.root.mkdir(parents=True, exist_ok=True)
        self.stale_swept = self._sweep_stale()
        if self.store is not None:  # a killed runtime's half-written blobs (found by review)
            self.store.remove_stale_temp()
        self.lease_dir.mkdir()
        self.spool_dir.mkdir(mode=0o700)
        self.disk = DiskFloor(self.root)
        self._lease_lock = claim(self.lease_dir)  # held until `close` removes the lease
        if self._lease_lock is not None:  # a forked child lets go of it (`close_in_forks`)
            close_in_forks(self._lease_lock)
        self._start_lifeline()
        if self._use_spawner:  # now, like the lifeline: a helper of the host's whole life
            self.spawner = self._start_spawner()

    def _start_lifeline(self) -> None:
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        directories = [str(p) for p in self.cgroups.roots()] + [str(self.lease_dir)]
        uids = [_lifeline.END_UNIT_UIDS] if os.geteuid() == 0 else []  # no probe: below
        try:
            self._lifeline = subprocess.Popen(
                [sys.executable, "-I", "-S", _lifeline.__file__, *uids, self.lease, *directories],
                stdin=read_fd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
                env={"PATH": os.defpath},
            )
            self._lifeline_fd = close_in_forks(write_fd)  # its EOF: this process is gone
        except OSError:
            os.close(write_fd)
        finally:
            os.close(read_fd)

    def _start_spawner(self) -> Spawner | None:
        """A spawn server probed as units will use it: into a cgroup v2 when units get one."""
        if self.cgroups.unified is None:
            return Spawner.start()
        probe = self.cgroups.unified / "spawn-probe"
        try:
            probe.mkdir()
        except OSError:
            return Spawner.start()
        try:
            return Spawner.start(str(probe))
        finally:
            kill_cgroup_tree(probe)

    def close(self) -> None:
        """Kill anything left of this host's lease and remove its directories."""
        self._janitor.close()
        if self.spawner is not None:
            self.spawner.close()  # never raises: the kills below always run
            self.spawner = None
        for root in self.cgroups.roots():
            kill_cgroup_tree(root)
        kill_lease(self.lease)
        _lifeline.remove_lease_folder(self.lease_dir)
        if self._lease_lock is not None:  # only now may a sweep take the lease for dead
            close_fd(self._lease_lock)
            self._lease_lock = None
        if self._lifeline_fd is not None:
            with contextlib.suppress(OSError):  # closed, not died: no unit uid is left
                os.write(self._lifeline_fd, _lifeline.CLOSED)
            close_fd(self._lifeline_fd)
            self._lifeline_fd = None
        if self._lifeline is not None:
            try:
                self._lifeline.wait(timeout=LIFELINE_EXIT_WAIT)
            except subprocess.TimeoutExpired:
                self._lifeline.kill()
                self._lifeline.wait(timeout=LIFELINE_EXIT_WAIT)
            self._lifeline = None
        if self._flags_held:  # nothing of this host runs any more
            self._flags_held = False
            release_host_flags()

    def _sweep_stale(self) -> int:
        """Kill the trees and remove the workspaces and cgroups of leases whose runtime died."""
        swept = 0
        for lease_dir in list(self.root.iterdir()):
            if not lease_dir.name.startswith("rt-") or lease_dir == self.lease_dir:
                continue
            if not owner_is_dead(lease_dir):
                continue
            _lifeline.sweep(lease_dir.name, [*self._cgroup_dirs_of(lease_dir.name), lease_dir])
            swept += 1
        swept += sweep_stale_uid_claims()  # the uids dead runtimes' units held, any root
        return swept + self._sweep_orphan_cgroups()

    def _sweep_orphan_cgroups(self) -> int:
        """Remove cgroups of runtimes (under any root) whose process no longer exists: only
        of runtimes of this pid namespace (`namespace_tag`; found by review: a run in a
        container sharing the cgroup tree killed a live run's replays, which ended
        `signal_9` as if they had crashed), or of an older evolane's untagged name, and
        never one holding a process of another pid namespace (`holds_foreign_processes`:
        found by review, an evolane in a pid namespace of its own killed every running
        command of the host's)."""
        dead: dict[str, list[Path]] = {}
        tag = namespace_tag()
        for base in {root.parent for root in self.cgroups.roots()}:
            for path in base.glob("evolane-rt-*"):
                found = CGROUP_NAME.fullmatch(path.name)
                if found is None or (found[2] and found[2] != tag):
                    continue
                if path.is_dir() and not psutil.pid_exists(int(found[1])):
                    dead.setdefault(path.name, []).append(path)
        swept = 0
        for paths in dead.values():
            if any(holds_foreign_processes(path) for path in paths):
                continue
            for path in paths:
                kill_cgroup_tree(path)
                swept += 1
        return swept

    def _cgroup_dirs_of(self, lease: str) -> list[Path]:
        return [root.parent / f"evolane-{lease}" for root in self.cgroups.roots()]

    # ----- running ---------------------------------------------------------------------

    async def run(
        self,
        spec: SandboxSpec,
        *,
        timeout: float | None = None,
        deadline: float | None = None,
        stop: Stop | None = None,
        activity: Callable[[], object] | None = None,
        setup: Callable[[], object] | None = None,
        small_layout: bool = False,
    ) -> ProcessOutcome:
        """Run ``spec`` to completion; returns only when its whole process tree is gone.

        ``timeout`` (seconds) and ``deadline`` (trio clock) bound it, the earlier wins; setting
        ``stop`` ends it with status ``cancelled``; ``activity`` is called whenever the tree
        writes to stdout or stderr; ``setup`` (blocking, e.g. laying out the files the command
        reads) runs right before the unit's own directories are made, in the worker thread
        that spawns the tree. ``small_layout``: the caller vouches that its setup, workspace
        and own paths are small file work (within `INLINE_FILES` and `INLINE_BYTES`). Such a
        unit, or one with none of these, and no seed or overlays, is laid out on the event
        loop while `inline` is open, and spawned from it too where the spawn server takes it
        and its program was found lately (else in a thread). Trio cancellation
        kills the tree and propagates. Raises `WorkspaceError` for a workspace outside the
        root.
        """
        limit = float("inf") if deadline is None else deadline
        if timeout is not None:
            limit = min(limit, trio.current_time() + timeout)
        return await run_unit(self, spec, limit, stop, activity, setup, small_layout)


@asynccontextmanager
async def open_sandbox(
    root: Path | str = ".evolane/sandbox",
    *,
    store: BlobStore | None = None,
    use_cgroups: bool = True,
    use_spawner: bool = True,
) -> AsyncIterator[SandboxHost]:
    """Open a sandbox host under ``root``: sweep stale leases, start the lifeline, yield it.

    ``use_spawner=False`` starts every command through the launcher chain, never through a
    spawn server (`evolane.sandbox._spawner`)."""
    host = SandboxHost(Path(root), store, use_cgroups, use_spawner)
    try:
        await trio.to_thread.run_sync(host.start)
        yield host
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(host.close)


def sweep_stale_uid_claims() -> int:
    """End what the units of runtimes that died holding unit uids left (their processes and
    IPC objects: `end_uids`), and free those uids; how many. A root evolane's host does it
    as it starts, and its lifeline once it has died (found by review: until then, with no
    other root evolane to start, their IPC objects pinned memory outside any cgroup)."""
    if os.geteuid() != 0:  # only root claims; not `commands_run_unprivileged`, whose probe
        return 0  # forks (found by CI: under a full pids.max it failed at every start)
    uids = range(UNIT_UID_BASE, UNIT_UID_BASE + UNIT_UID_SPAN)
    folder = claims_folder()
    if folder is not None:  # a unit holding a claim file open has no business there
        kill_claim_openers(str(folder), uids)
    return sweep_stale_claims(folder, end_uids, uids)


def sweep_stale_leases(root: Path | str) -> None:
    """Clean up after runtimes that died without closing their host (what `open_sandbox` does)."""
    host = SandboxHost(Path(root), None, use_cgroups=True)
    host.root.mkdir(parents=True, exist_ok=True)
    host._sweep_stale()
    with contextlib.suppress(OSError):
        host.cgroups.remove()
