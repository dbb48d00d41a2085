"""Found by review: under ``process`` isolation a unit uid's command left System V shared
memory, message queues and semaphores and POSIX shared memory behind; they outlived the unit
and evolane, later units could use them, and they pinned memory outside its memory cgroup.
A unit's IPC objects now go with it."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from evolane.sandbox import SandboxSpec, open_sandbox
from evolane.sandbox._litter import sysv_objects_of
from evolane.sandbox._secrets import commands_run_unprivileged
from evolane.store import BlobStore

MAKE = textwrap.dedent(
    """
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    tag = int(sys.argv[1])
    ids = [
        libc.shmget(tag, 1 << 20, 0o1666),      # IPC_CREAT | 0666: open to every later unit
        libc.msgget(tag + 1, 0o1666),
        libc.semget(tag + 2, 1, 0o1666),
    ]
    with open(f"/dev/shm/evolane-test-{tag}", "wb") as handle:
        handle.write(b"x" * 4096)
    print(*ids, os.getuid())
    """
)


def _tables() -> dict[str, str]:
    return {t: Path(f"/proc/sysvipc/{t}").read_text() for t in ("shm", "msg", "sem")}


@pytest.mark.skipif(not commands_run_unprivileged(), reason="needs root and a unit uid")
async def test_a_units_ipc_objects_go_with_it(tmp_path: Path) -> None:
    tag = 0x5EED0000 + os.getpid() % 0xFFFF
    async with open_sandbox(tmp_path / "sandbox", store=BlobStore(tmp_path / "store")) as host:
        spec = SandboxSpec(
            argv=(sys.executable, "-I", "-c", MAKE, str(tag)), isolation="process", drop_root=True
        )
        outcome = await host.run(spec, timeout=50)
        assert outcome.ok, outcome.stderr.text()
        *ids, uid = (int(word) for word in outcome.stdout.text().split())
        assert all(ident >= 0 for ident in ids) and uid != 0
        await trio.to_thread.run_sync(host.settle)
    tables = _tables()
    for table in ("shm", "msg", "sem"):
        assert sysv_objects_of(uid, table, tables[table]) == [], (table, tables[table])
    assert not os.path.exists(f"/dev/shm/evolane-test-{tag}")


def test_the_tables_are_read_by_their_header() -> None:
    text = (
        "       key      shmid perms  size  cpid  lpid nattch   uid   gid  cuid  cgid\n"
        "        42         7   666  4096   100   100      0  2000000005  0  2000000005  0\n"
        "        43         8   666  4096   100   100      0     0     0     0     0\n"
    )
    assert sysv_objects_of(2000000005, "shm", text) == [7]
    assert sysv_objects_of(0, "shm", text) == [8]
    assert sysv_objects_of(5, "shm", "no header here\n1 2 3\n") == []


@pytest.mark.skipif(not commands_run_unprivileged(), reason="needs root and a unit uid")
async def test_a_big_leftover_goes_in_the_cleanup_thread_not_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by review: a unit that left a folder of a million files in /dev/shm stalled the
    # event loop for 3 s (its removal ran inline). A folder of its own, or more entries than
    # an inline sweep looks at, goes to the cleanup thread; all of it goes either way.
    from tests.sandbox_helpers import count_hops

    hops = count_hops(monkeypatch)
    tag = 0x5EED0000 + os.getpid() % 0xFFFF
    folder = f"/dev/shm/evolane-test-{tag}"
    many = f"mkdir {folder} && for n in $(seq 100); do : > {folder}/f$n; done"
    async with open_sandbox(tmp_path / "sandbox", store=BlobStore(tmp_path / "store")) as host:
        for gate in (host.inline, host.inline_cleanup):
            gate.slow = gate.stall = float("inf")  # only the bounds decide
        spec = SandboxSpec(argv=("sh", "-c", many), isolation="process", drop_root=True)
        assert (await host.run(spec, timeout=50)).ok
        await trio.to_thread.run_sync(host.settle)
    assert hops["defer:Unit.remove"] == 1
    assert not os.path.exists(folder)
