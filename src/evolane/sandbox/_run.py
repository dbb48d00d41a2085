"""One sandboxed run, from workspace to outcome: spawn, wait, kill ladder, capture, clean up."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import trio

from evolane.sandbox._capture import BoundedCapture, drain, open_pipe
from evolane.sandbox._cgroups import UnitCgroups
from evolane.sandbox._env import build_environment, child_lease
from evolane.sandbox._launch import launcher_argv, namespaces_available
from evolane.sandbox._spec import IsolationInForce, ProcessOutcome, SandboxSpec
from evolane.sandbox._tree import KillReport, ProcessTree, kill_ladder
from evolane.sandbox._workspace import WorkspaceError, inside, materialize_workspace

if TYPE_CHECKING:
    from evolane.sandbox._host import SandboxHost

_DRAIN_AFTER_KILL_SECONDS = 1.0
_SAMPLE_FIRST, _SAMPLE_MAX = 0.05, 1.0


def _isolation(spec: SandboxSpec) -> IsolationInForce:
    if spec.isolation == "process":
        return "process"
    if namespaces_available():
        return "namespace"
    if spec.isolation == "namespace":
        raise WorkspaceError("isolation 'namespace' is not available on this host")
    return "process"


def _resolve_executable(argv0: str, cwd: Path, path: str) -> str | None:
    """Where argv[0] would be found, or None (so a missing command never gets spawned)."""
    if "/" in argv0:
        target = (cwd / argv0) if not argv0.startswith("/") else Path(argv0)
        return str(target) if os.access(target, os.X_OK) and target.is_file() else None
    return shutil.which(argv0, path=path)


class _Unit:
    """The directories and bookkeeping of one run."""

    def __init__(self, host: SandboxHost, spec: SandboxSpec) -> None:
        self.host, self.spec = host, spec
        self.name = host.unit_name(spec.label)
        self.dir = host.lease_dir / self.name
        self.lease = child_lease(host.inherited_lease, host.lease, self.name)
        self.tree_lease = f"{host.lease}/{self.name}"
        self.cgroups: UnitCgroups | None = None

    def prepare(self) -> Path:
        """Create the unit directories and the workspace; returns the working directory."""
        spec, host = self.spec, self.host
        if spec.workspace is not None:
            work = Path(spec.workspace)
            if not inside(host.root, work) or not work.is_dir():
                raise WorkspaceError(
                    f"workspace {spec.workspace!r} is not a directory inside {host.root}"
                )
        self.dir.mkdir()
        for sub in ("home", "tmp"):
            (self.dir / sub).mkdir()
        if spec.workspace is not None:
            return Path(spec.workspace).resolve()
        work = self.dir / "work"
        materialize_workspace(host.store, spec.seed, spec.overlays, work)
        return work

    def remove(self, keep: bool) -> None:
        if self.cgroups is not None:
            self.cgroups.remove()
        if keep:
            for spool in self.dir.glob("*.spool"):
                spool.unlink(missing_ok=True)
            return
        try:  # the common case, an untouched workspace, costs four rmdir calls
            for name in ("stdout.spool", "stderr.spool"):
                (self.dir / name).unlink(missing_ok=True)
            for name in ("work", "home", "tmp", ""):
                (self.dir / name).rmdir()
        except OSError:
            shutil.rmtree(self.dir, ignore_errors=True)


async def run_unit(
    host: SandboxHost, spec: SandboxSpec, deadline: float, stop: trio.Event | None
) -> ProcessOutcome:
    """The body of `SandboxHost.run`."""
    unit = _Unit(host, spec)
    isolation = _isolation(spec)
    try:
        work = await trio.to_thread.run_sync(unit.prepare)
    except FileExistsError as error:
        raise WorkspaceError(str(error)) from error
    keep = False
    try:
        outcome = await _run_prepared(unit, work, isolation, deadline, stop)
        keep = spec.keep_failed and not outcome.ok
        if keep:
            outcome = outcome.model_copy(update={"workspace": str(unit.dir)})
        return outcome
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(unit.remove, keep)


async def _run_prepared(
    unit: _Unit, work: Path, isolation: IsolationInForce, deadline: float, stop: trio.Event | None
) -> ProcessOutcome:
    spec, host = unit.spec, unit.host
    env = build_environment(
        spec,
        home=str(unit.dir / "home"),
        tmp=str(unit.dir / "tmp"),
        workspace=str(work),
        lease=unit.lease,
    )
    base = {"isolation": isolation, "lease": unit.lease}
    if _resolve_executable(spec.argv[0], work, env["PATH"]) is None:
        error = f"{spec.argv[0]}: [Errno 2] No such file or directory (or not executable)"
        return ProcessOutcome(status="spawn_failed", error=error, **base)
    if host.cgroups.roots():
        unit.cgroups = host.cgroups.unit(unit.name, spec.limits)
    procs = unit.cgroups.procs_files if unit.cgroups is not None else []
    argv, mechanisms = launcher_argv(spec.argv, procs, spec.limits, isolation == "namespace")
    if unit.cgroups is not None:
        mechanisms += unit.cgroups.mechanisms
    base["enforcement"] = (*mechanisms, *host.mechanisms)
    captures = {
        name: BoundedCapture(spec.output, unit.dir / f"{name}.spool" if host.store else None)
        for name in ("stdout", "stderr")
    }
    pipes = {name: open_pipe() for name in captures}
    started = trio.current_time()
    try:
        popen = await trio.to_thread.run_sync(_spawn, argv, work, env, pipes)
    except OSError as error:
        for capture in captures.values():
            capture.close_spool()
        return ProcessOutcome(status="spawn_failed", error=str(error)[:2048], **base)
    finally:
        for _, write_fd in pipes.values():
            os.close(write_fd)
    tree = ProcessTree(popen.pid, unit.cgroups, unit.tree_lease)
    streams = {name: trio.lowlevel.FdStream(fds[0]) for name, fds in pipes.items()}
    watch = _Watch(tree, spec.kill_grace, set())
    host.active_leaders.add(popen.pid)
    try:
        async with trio.open_nursery() as nursery:
            for name, stream in streams.items():
                nursery.start_soon(watch.drain, stream, captures[name])
            nursery.start_soon(watch.sample_memory)
            try:
                await watch.wait(deadline, stop)
            finally:
                with trio.CancelScope(shield=True):
                    watch.protected = host.active_leaders - {popen.pid}
                    await watch.finish(nursery)
    finally:
        host.active_leaders.discard(popen.pid)
    popen.returncode = _returncode(tree.status)
    return await _outcome(unit, tree, watch, captures, started, base)


def _spawn(
    argv: list[str], work: Path, env: dict[str, str], pipes: dict[str, tuple[int, int]]
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=pipes["stdout"][1],
        stderr=pipes["stderr"][1],
        cwd=work,
        env=env,
        start_new_session=True,
        close_fds=True,
    )


def _returncode(status: int | None) -> int | None:
    if status is None:
        return None
    return os.waitstatus_to_exitcode(status)


class _Watch:
    """Waits for the leader, then runs the kill ladder; samples memory meanwhile."""

    def __init__(self, tree: ProcessTree, grace: float, protected: set[int]) -> None:
        self.tree, self.grace, self.protected = tree, grace, protected
        self.reason = "exited"
        self.kill = KillReport()
        self.kill_latency: float | None = None
        self.peak_rss = 0
        self._draining = 0
        self._drained = trio.Event()

    async def drain(self, stream: trio.lowlevel.FdStream, capture: BoundedCapture) -> None:
        """Drain one stream; the last drain to reach EOF wakes `finish`."""
        self._draining += 1
        try:
            await drain(stream, capture)
        finally:
            self._draining -= 1
            if self._draining == 0:
                self._drained.set()

    async def wait(self, deadline: float, stop: trio.Event | None) -> None:
        pidfd = os.pidfd_open(self.tree.pid)
        try:
            with trio.move_on_at(deadline):
                async with trio.open_nursery() as racers:
                    racers.start_soon(self._leader_exit, pidfd, racers.cancel_scope)
                    if stop is not None:
                        racers.start_soon(self._stopped, stop, racers.cancel_scope)
                return
            self.reason = "timed_out"
        except trio.Cancelled:
            self.reason = "cancelled"
            raise
        finally:
            os.close(pidfd)

    async def _leader_exit(self, pidfd: int, scope: trio.CancelScope) -> None:
        await trio.lowlevel.wait_readable(pidfd)
        scope.cancel()

    async def _stopped(self, stop: trio.Event, scope: trio.CancelScope) -> None:
        await stop.wait()
        self.reason = "cancelled"
        scope.cancel()

    async def finish(self, nursery: trio.Nursery) -> None:
        """Kill what is left (shielded), then let the drains reach EOF, bounded."""
        forced = self.reason != "exited"
        started = trio.current_time()
        self.kill = await kill_ladder(self.tree, self.grace, forced, self.protected)
        if forced:
            self.kill_latency = trio.current_time() - started
        with trio.move_on_after(_DRAIN_AFTER_KILL_SECONDS):
            await self._drained.wait()
        nursery.cancel_scope.cancel()

    async def sample_memory(self) -> None:
        """Sample the tree's RSS with a growing interval (a short run costs no sampling)."""
        interval = _SAMPLE_FIRST
        while True:
            await trio.sleep(interval)
            interval = min(interval * 2, _SAMPLE_MAX)
            pids = self.tree.targets() | {self.tree.pid}
            self.peak_rss = max(self.peak_rss, _rss_of(pids))


def _rss_of(pids: set[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_info().rss
    return total


async def _outcome(
    unit: _Unit,
    tree: ProcessTree,
    watch: _Watch,
    captures: dict[str, BoundedCapture],
    started: float,
    base: dict[str, Any],
) -> ProcessOutcome:
    host = unit.host
    refs = {}
    for name, capture in captures.items():
        capture.close_spool()
        refs[name] = None
        if host.store is not None and capture.spool_path is not None and capture.total:
            refs[name] = await trio.to_thread.run_sync(host.store.put_file, capture.spool_path)
    status = tree.status or 0
    exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    rusage: Any = tree.rusage
    cpu = unit.cgroups.cpu_seconds() if unit.cgroups is not None else None
    if cpu is None and rusage is not None:
        cpu = rusage.ru_utime + rusage.ru_stime
    limits_hit = _limits_hit(unit, signum, cpu or 0.0)
    reason = watch.reason
    if limits_hit and reason in ("exited", "timed_out") and exit_code != 0:
        reason = "limit_exceeded"
    peak = max(watch.peak_rss, (rusage.ru_maxrss * 1024) if rusage is not None else 0)
    return ProcessOutcome(
        status=reason,  # type: ignore[arg-type]
        exit_code=exit_code,
        signal=signum,
        wall_seconds=round(trio.current_time() - started, 6),
        cpu_seconds=round(cpu or 0.0, 6),
        peak_rss_bytes=peak,
        stdout=captures["stdout"].result(refs["stdout"]),
        stderr=captures["stderr"].result(refs["stderr"]),
        pids_killed=watch.kill.pids_killed,
        escaped_found=watch.kill.escaped_found,
        survivors=watch.kill.survivors,
        kill_latency_seconds=watch.kill_latency,
        limits_hit=limits_hit,
        **base,
    )


def _limits_hit(unit: _Unit, signum: int | None, cpu: float) -> tuple[str, ...]:
    limits, hit = unit.spec.limits, []
    if signum == signal.SIGXCPU or (
        signum == signal.SIGKILL and limits.cpu_seconds is not None and cpu >= limits.cpu_seconds
    ):
        hit.append("cpu")
    if signum == signal.SIGXFSZ:
        hit.append("file_size")
    if unit.cgroups is not None:
        if unit.cgroups.oom_killed():
            hit.append("memory")
        if unit.cgroups.pids_limit_hit():
            hit.append("processes")
    return tuple(hit)
