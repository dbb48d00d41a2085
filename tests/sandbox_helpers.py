"""Shared pieces of the sandbox tests."""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from evolane.sandbox import SandboxHost, SandboxSpec, View, _spawnd, lease_holders, open_sandbox
from evolane.sandbox._spec import ProcessOutcome
from evolane.store import BlobStore
from evolane.testing import descendants


def sh(script: str, **fields: object) -> dict[str, object]:
    """Keyword arguments for a SandboxSpec that runs ``script`` with ``sh -c``."""
    return {"argv": ("sh", "-c", script), **fields}


def survivors(host: SandboxHost, before: set[int] | None = None) -> set[int]:
    """Processes of this host's lease, plus new descendants, that are still alive."""
    alive = lease_holders(host.lease)
    if before is not None:
        alive |= descendants() - before
    return alive


def altered_server(tmp_path: Path, after: str, insert: str) -> str:
    """A copy of the real server with ``insert`` after the line ``after`` (fault injection:
    an older kernel, a server descheduled at the worst moment)."""
    source = Path(_spawnd.__file__).read_text()
    assert after in source
    copy = tmp_path / "_spawnd_altered.py"
    copy.write_text(source.replace(after, after + insert, 1))
    return str(copy)


def zombies() -> set[int]:
    """This process's children that have exited and wait to be reaped."""
    return {p.pid for p in psutil.Process().children() if p.status() == psutil.STATUS_ZOMBIE}


async def run_sh(host: SandboxHost, script: str, **fields: object) -> ProcessOutcome:
    """Run ``script`` with ``sh -c`` on ``host`` (kill grace 0.2 s, 30 s at most)."""
    spec = SandboxSpec(argv=("sh", "-c", script), kill_grace=0.2, **fields)  # type: ignore[arg-type]
    return await host.run(spec, timeout=30)


def count_hops(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every thread hop, by the name of the function it carried; cleanups deferred to the
    host's cleanup thread count as ``defer:<name>``."""
    hops: Counter[str] = Counter()
    real, real_defer = trio.to_thread.run_sync, SandboxHost.defer

    def name(fn: Callable[..., Any]) -> str:
        fn = getattr(fn, "func", fn)  # a partial: what it calls
        return getattr(fn, "__qualname__", type(fn).__name__)

    async def counted(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        hops[name(fn)] += 1
        return await real(fn, *args, **kwargs)

    def deferred(host: SandboxHost, cleanup: Callable[[], object]) -> None:
        hops[f"defer:{name(cleanup)}"] += 1
        real_defer(host, cleanup)

    monkeypatch.setattr(trio.to_thread, "run_sync", counted)
    monkeypatch.setattr(SandboxHost, "defer", deferred)
    return hops


def in_a_thread(call: Callable[[], Any], wait: float) -> tuple[bool, list[Any]]:
    """Run ``call`` in a daemon thread, waiting ``wait`` seconds: whether it still hangs
    then, and what it returned or raised (a hang that cannot be cancelled, such as a
    shielded or blocking spawn, fails the test instead of hanging it)."""
    ended: list[Any] = []

    def run() -> None:
        try:
            ended.append(call())
        except BaseException as error:
            ended.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(wait)
    return thread.is_alive(), ended


def as_uid(uid: int, folder: Path, action: Callable[[], bool]) -> bool:
    """``action()`` in ``folder``, in a forked child running as ``uid`` when root (the
    folders above may be closed to it), else here."""
    if os.geteuid() != 0:
        os.chdir(folder)
        return action()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            os.chdir(folder)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            code = 0 if action() else 1
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


async def run_confined(tmp_path: Path, code: str, spawner: bool, view: View) -> ProcessOutcome:
    """``code`` run by this Python, confined with ``view``, on a fresh host started with the
    spawn server (``spawner``) or the launcher chain (60 s at most)."""
    store = BlobStore(tmp_path / "store")
    async with open_sandbox(tmp_path / "sandbox", store=store, use_spawner=spawner) as host:
        spec = SandboxSpec(argv=(sys.executable, "-I", "-c", code), isolation="confined", view=view)
        with trio.fail_after(60):
            return await host.run(spec, timeout=50)


def host_address() -> str | None:
    """This host's own address on the interface its default route leaves by (no packet is
    sent), or None without one: a server there is no loopback service, and a confined
    command given the network reaches it through slirp4netns' NAT."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.123", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address
