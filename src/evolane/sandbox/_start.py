"""Starting a laid-out unit's command: its program looked up, its confinement prefix, and the
spawn server (awaited on the event loop, or in a worker thread) or the launcher chain."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import trio

from evolane._faults import INSTALLED
from evolane.sandbox._cgroups import UnitCgroups, process_headroom
from evolane.sandbox._confine import (
    bwrap_argv,
    bwrap_wants_privileges,
    interpreter_folders,
    outermost,
    program_folders,
    user_counts_step,
)
from evolane.sandbox._launch import (
    NAMESPACE_EXTRA_PROCESSES,
    NET_NONCE_VARIABLE,
    NET_STEP,
    Cloned,
    launch,
    launcher_argv,
    launcher_env,
    rlimit_numbers,
)
from evolane.sandbox._netns import own_network_args
from evolane.sandbox._seccomp import no_set_id_filter
from evolane.sandbox._spawner import Spawner, SpawnerUnavailable, UidSwitch
from evolane.sandbox._spec import IsolationInForce, Limits, SandboxSpec
from evolane.sandbox._ucounts import tree_process_share, user_count_caps, with_step_pairs
from evolane.store import HOST_ERRNOS

Spawned = tuple[int, tuple[str, ...]]
"""A started command's pid and the mechanisms in force for it."""

PROGRAM_SECONDS = 1.0
"""How long a program found in PATH (or at its absolute path) is taken as found without
looking again: an event-loop spawn never looks (PATH may list a folder on a stalled network
mount), so the lookups of a busy host's worker threads keep its answers this fresh."""
_PROGRAMS_KEPT = 256  # programs remembered at most (the cache starts over when full)


class ProgramCache:
    """Where each recently spawned program was found (`PROGRAM_SECONDS`); one per host."""

    def __init__(self, seconds: float = PROGRAM_SECONDS) -> None:
        self.seconds = seconds
        self._found: dict[tuple[str, str], tuple[str, float]] = {}

    def get(self, argv0: str, path: str) -> str | None:
        """Where ``argv0`` was found with ``path`` as PATH, if lately; None: look (in a
        thread). A name relative to the unit's workspace is never remembered."""
        found = self._found.get((argv0, path))
        if found is None or time.monotonic() - found[1] > self.seconds:
            return None
        return found[0]

    def put(self, argv0: str, path: str, program: str) -> None:
        """Remember where ``argv0`` was just found."""
        if "/" in argv0 and not argv0.startswith("/"):
            return
        if len(self._found) >= _PROGRAMS_KEPT:
            self._found = {}
        self._found[argv0, path] = (program, time.monotonic())


class _Host(Protocol):
    programs: ProgramCache

    @property
    def spawner(self) -> Spawner | None: ...


class LaidOut(Protocol):
    """What a launch needs of its laid-out unit (`evolane.sandbox._run.Unit` is the one)."""

    spec: SandboxSpec
    dir: Path
    work: Path
    nonce: str
    cgroups: UnitCgroups | None
    step_marker: int | None
    """The read end of the pipe the launcher's user counts step writes a byte to once the
    command's user namespace is made (`evolane.sandbox._ucounts.with_step_pairs`)."""

    @property
    def host(self) -> _Host: ...


@dataclass(frozen=True)
class SpawnError:
    """Why evolane could not start a command: the message of its ``spawn_failed`` outcome,
    and the errno of evolane's own call that failed (None: none, or not an OSError)."""

    message: str
    errno: int | None = None


def spawn_error(error: OSError | ValueError) -> SpawnError:
    """The failure of a spawn that failed with ``error``; one the host refused a process
    (EAGAIN) names its pid limit (found by review: a run stopped saying only ``[Errno 11]
    clone3: Resource temporarily unavailable``, under a full ``pids.max``)."""
    said = str(error)
    if isinstance(error, OSError) and error.errno == errno.EAGAIN:
        headroom = process_headroom()
        where = (
            f"{headroom[1]}/pids.max" if headroom is not None else "its `ulimit -u`, or a pid limit"
        )
        said += f": the host refused a process ({where} enclosing evolane), not --max-procs"
    return SpawnError(said[:2048], error.errno if isinstance(error, OSError) else None)


def resolve_executable(argv0: str, cwd: Path, path: str) -> str | None:
    """Where argv[0] would be found, or None (so a missing command never gets spawned)."""
    if "/" in argv0:
        target = (cwd / argv0) if not argv0.startswith("/") else Path(argv0)
        return str(target) if os.access(target, os.X_OK) and target.is_file() else None
    return shutil.which(argv0, path=path)


@dataclass
class Launch:
    """A laid-out unit's command, ready to start (what `_run._prepare` returns)."""

    unit: LaidOut
    isolation: IsolationInForce
    env: dict[str, str]
    output: tuple[int, int]
    uid: int | None
    limits: Limits
    """The spec's limits, with `Limits.uid_processes` where the unit uid bounds the tree."""
    _hooked: bool = field(default=False, init=False)  # the fault hook ran (once a spawn)

    def in_thread(self) -> Spawned | SpawnError:
        """Start the command through the spawn server, else the launcher chain (blocking:
        a worker thread's); errors return as the message of a ``spawn_failed`` outcome."""
        unit = self.unit
        argv0, path = unit.spec.argv[0], self.env["PATH"]
        program = resolve_executable(argv0, unit.work, path)
        if program is None:
            said = f"{argv0}: [Errno 2] No such file or directory (or not executable)"
            return SpawnError(said, errno.ENOENT)
        unit.host.programs.put(argv0, path, program)
        try:
            self._hook()
            confine = _confinement(unit, program) if self.isolation == "confined" else None
            started, spawner = None, unit.host.spawner
            if spawner is not None and not spawner.broken:
                with contextlib.suppress(SpawnerUnavailable):
                    args, mechanisms = self._request(spawner, program, confine)
                    started = spawner.spawn(*args), mechanisms
            if started is None:  # no server, or it did not take this one: the launcher chain
                started = self._launch_chain(confine)
        except (OSError, ValueError) as error:
            if isinstance(error, OSError) and error.errno in HOST_ERRNOS:
                raise  # evolane's own open files ran out: the run cannot go on
            return spawn_error(error)
        return self._spawned(*started)

    async def from_loop(self) -> Spawned | SpawnError | None:
        """`in_thread` with no thread: when the program was found lately (`ProgramCache`)
        and the spawn server takes the request, awaited on the event loop. None when it
        cannot be (confined, no server, a program to look up, the server busy with a
        thread's spawn): call `in_thread` then. Once it spawns it is not cancellable."""
        unit = self.unit
        spawner, argv0 = unit.host.spawner, unit.spec.argv[0]
        if self.isolation == "confined" or spawner is None or spawner.broken:
            return None  # a confined view is worked out from folders anywhere
        program = unit.host.programs.get(argv0, self.env["PATH"])
        if program is None:
            return None
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled run never starts
        try:
            self._hook()
            args, mechanisms = self._request(spawner, program, None)
            pid = await spawner.spawn_from_trio(*args)
        except SpawnerUnavailable:
            return None
        except (OSError, ValueError) as error:
            if isinstance(error, OSError) and error.errno in HOST_ERRNOS:
                raise  # evolane's own open files ran out: the run cannot go on
            return spawn_error(error)
        return None if pid is None else self._spawned(pid, mechanisms)

    def _hook(self) -> None:
        """The fault injector's spawn hook, once per spawn however it starts."""
        if INSTALLED and not self._hooked:
            self._hooked = True
            INSTALLED[0].before_spawn(self.unit.spec.label)

    def _launch_chain(self, confine: list[str] | None) -> tuple[int, tuple[str, ...]]:
        """Start the launcher chain; a confined one gets the seccomp filter from a memfd
        bwrap reads (``--seccomp FD``), as a clone of the spawn server installs it, and its
        user counts step a pipe to say it ran (`LaidOut.step_marker`)."""
        program = no_set_id_filter() if confine is not None else None
        cgroups = self.unit.cgroups
        env = launcher_env(self.env, cgroups.procs_files if cgroups else [], self.unit.nonce)
        env = self._with_step_nonce(env, confine)
        step = user_counts_step() if confine is not None else None
        added: tuple[str, ...] = ()
        keep: list[int] = []
        marker: tuple[int, int] | None = None
        try:
            if confine is not None and step:
                share = self._tree_processes(confine)
                marker = os.pipe2(os.O_CLOEXEC)
                confine = [*with_step_pairs(step, share), *confine]
                added = ("user_counts", "tree_nproc_rlimit") if share else ("user_counts",)
            if confine is not None and program is not None:
                keep.append(os.memfd_create("evolane-seccomp", os.MFD_CLOEXEC))
                os.write(keep[-1], program)
                os.lseek(keep[-1], 0, os.SEEK_SET)
                confine = [*confine[:-1], "--seccomp", str(keep[-1]), confine[-1]]  # before "--"
                added += ("no_set_id",)
            argv, mechanisms = self._chain(confine)
            stdin = marker[1] if marker is not None else None
            pid = launch(argv, self.unit.work, env, self.output, keep=tuple(keep), stdin=stdin)
        except BaseException:
            if marker is not None:
                os.close(marker[0])
            raise
        finally:
            for fd in (*keep, *(marker[1:] if marker is not None else ())):
                os.close(fd)
        self.unit.step_marker = marker[0] if marker is not None else None
        return pid, (*mechanisms, *added)

    def _tree_processes(self, confine: list[str]) -> int | None:
        """The RLIMIT_NPROC of this confined tree inside its own user namespace (a non-root
        evolane's; `evolane.sandbox._ucounts.tree_process_share`): its launcher's two
        processes on top, and slirp4netns where the network step starts one."""
        cgroups = self.unit.cgroups
        bounded = cgroups is not None and cgroups.bounds_processes
        extra = NAMESPACE_EXTRA_PROCESSES + (NET_STEP in confine)
        return tree_process_share(self.limits.processes, bounded, extra)

    def _chain(
        self, confine: list[str] | None, cloned: Cloned | None = None
    ) -> tuple[list[str], tuple[str, ...]]:
        """The launcher chain's argv and mechanisms (``cloned``: what the clone did)."""
        spec, cgroups = self.unit.spec, self.unit.cgroups
        procs = cgroups.procs_files if cgroups is not None else []
        namespace = self.isolation == "namespace"
        return launcher_argv(
            spec.argv, procs, self.limits, namespace, confine, self.uid, cloned=cloned
        )

    def _request(
        self, spawner: Spawner, program: str, confine: list[str] | None
    ) -> tuple[tuple, tuple[str, ...]]:
        """The spawn server's arguments for this command, and the mechanisms in force. The
        clone may drop root's capabilities when no later step needs them, and switches to
        the unit uid itself when it can (a given uid: the chain switches, or raises)."""
        unit, spec, cgroups = self.unit, self.unit.spec, self.unit.cgroups
        drops = self.isolation == "process" and self.uid is None
        dropped = spawner.dropped if drops else ()
        uid = self.uid if self.isolation == "process" else None  # unshare would need root
        switch: UidSwitch | None = None
        if uid is not None and spawner.switches_uid:
            switch = spawner.uid_switch(uid)
        cloned = Cloned(bool(dropped), uid_switched=switch is not None)
        argv, mechanisms = self._chain(confine, cloned=cloned)
        path = program if len(argv) == len(spec.argv) else argv[0]
        seccomp = no_set_id_filter() if confine is not None else None
        if seccomp and bwrap_wants_privileges():  # bwrap takes the filter (`_launch_chain`)
            raise SpawnerUnavailable("a set-uid bwrap installs the seccomp filter itself")
        counts = user_count_caps() if confine is not None and user_counts_step() else ()
        if counts and os.geteuid() != 0:
            # The clone is the non-dumpable server's copy: its /proc/self is root's, so a
            # non-root clone cannot map the namespace it makes (EACCES on setgroups), and
            # made dumpable a process of the uid could read the server's memory through
            # it. The launcher's ``unshare`` step, a fresh exec, maps it (found by review:
            # no confined command of a non-root evolane started, "[Errno 13] cannot write
            # /proc/self/setgroups", and the run stopped).
            raise SpawnerUnavailable("a non-root clone cannot map its user namespace")
        env = self._with_step_nonce(self.env, confine)
        args = (
            path, argv, env, str(unit.work), self.output, rlimit_numbers(self.limits),
            cgroups.v1_tasks_files if cgroups else [], dropped,
            cgroups.unified_dir if cgroups else None, switch, seccomp, counts,
        )  # fmt: skip
        mechanisms = (*mechanisms, "user_counts") if counts else mechanisms
        return args, (*mechanisms, "no_set_id") if seccomp else mechanisms

    def _with_step_nonce(self, env: dict[str, str], confine: list[str] | None) -> dict[str, str]:
        """``env`` with the unit's nonce for the network step where it runs (it drops it
        before its exec: `evolane.sandbox._launch.step_failed_marker`)."""
        if confine is None or NET_STEP not in confine:
            return env
        return {**env, NET_NONCE_VARIABLE: self.unit.nonce}

    def _spawned(self, pid: int, mechanisms: tuple[str, ...]) -> Spawned:
        cgroups = self.unit.cgroups
        if cgroups is not None:
            mechanisms = (*mechanisms, *cgroups.mechanisms)
        if self.limits.uid_processes is not None:
            mechanisms = (*mechanisms, "uid_nproc_rlimit")
        return pid, tuple(mechanisms)


def _confinement(unit: LaidOut, program: str) -> list[str]:
    """The bwrap prefix of a confined unit: its view plus the interpreters and the program's
    prefix read-only, its unit directory and workspace writable."""
    spec = unit.spec
    own = [(str(unit.dir), True), (str(unit.work), True), *spec.view.own]
    shown = (*interpreter_folders(), *program_folders(program), *spec.view.read_only)
    view = spec.view.model_copy(update={"read_only": outermost(shown)})
    step, mounts = own_network_args(view)
    confine = bwrap_argv(view, own=own, workspace=unit.work)
    return [*step, *confine[:-1], *mounts, confine[-1]]
