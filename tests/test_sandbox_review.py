"""Regressions from the sandbox review: cross-talk, namespaces, status rules, fds, races."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pydantic
import pytest
import trio

from evolane.sandbox import Limits, SandboxHost, SandboxSpec, lease_holders, open_sandbox
from evolane.sandbox._launch import namespaces_available
from evolane.testing import EVIL_TREE_SH, POLITE_TREE_SH

needs_namespaces = pytest.mark.skipif(
    not namespaces_available(), reason="this host does not allow PID + network namespaces"
)


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[SandboxHost]:
    async with open_sandbox(tmp_path / "sandbox") as opened:
        yield opened


async def test_concurrent_units_never_see_each_others_exit_status(host: SandboxHost) -> None:
    # Units exiting with distinct codes run beside hostile trees that time out and escape;
    # every unit must get its own status back (no reaping of another unit's leader).
    results: dict[int, int | None] = {}

    async def exits_with(code: int) -> None:
        outcome = await host.run(SandboxSpec(argv=("sh", "-c", f"exit {code}")), timeout=30)
        results[code] = outcome.exit_code

    async def hostile() -> None:
        await host.run(SandboxSpec(argv=("sh", "-c", EVIL_TREE_SH), kill_grace=0.1), timeout=0.3)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(hostile)
            for code in range(1, 61):
                nursery.start_soon(exits_with, code)
    assert results == {code: code for code in range(1, 61)}
    assert lease_holders(host.lease) == set()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_no_descriptor_leaks_on_any_path(host: SandboxHost) -> None:
    await host.run(SandboxSpec(argv=("true",)), timeout=5)  # warm caches and threads
    await trio.to_thread.run_sync(host.settle)  # the cleanup thread's rmtree holds dir fds
    before = _open_fds()
    for _ in range(5):
        await host.run(SandboxSpec(argv=("true",)), timeout=5)
        await host.run(SandboxSpec(argv=("no-such-binary",)), timeout=5)
        await host.run(SandboxSpec(argv=("sleep", "10"), kill_grace=0.1), timeout=0.05)
        with trio.move_on_after(0.05):
            await host.run(SandboxSpec(argv=("sleep", "10"), kill_grace=0.1), timeout=5)
        await host.run(SandboxSpec(argv=("sh", "-c", "exec 1>&-; sleep 0.01")), timeout=5)
    await trio.to_thread.run_sync(host.settle)
    assert _open_fds() == before


def test_nul_bytes_are_refused_in_the_spec() -> None:
    with pytest.raises(pydantic.ValidationError, match="NUL"):
        SandboxSpec(argv=("echo", "a\0b"))
    with pytest.raises(pydantic.ValidationError, match="NUL"):
        SandboxSpec(argv=("env",), env={"X": "a\0b"})


async def test_a_timed_out_spinner_with_a_cpu_limit_is_timed_out_not_a_cpu_limit(
    host: SandboxHost,
) -> None:
    spinners = "for i in 1 2 3 4; do (trap '' TERM; while :; do :; done) & done; wait"
    spec = SandboxSpec(argv=("sh", "-c", spinners), limits=Limits(cpu_seconds=30), kill_grace=0.1)
    outcome = await host.run(spec, timeout=1.0)
    assert outcome.status == "timed_out" and outcome.limits_hit == ()


async def test_a_limit_signal_reported_by_a_shell_exit_code_counts(host: SandboxHost) -> None:
    spec = SandboxSpec(
        argv=("sh", "-c", "head -c 10000000 /dev/zero > big; exit $?"),
        limits=Limits(file_size_bytes=1 << 20),
    )
    outcome = await host.run(spec, timeout=10)
    assert outcome.exit_code == 128 + 25
    assert outcome.status == "limit_exceeded" and outcome.limits_hit == ("file_size",)


async def test_kept_workspaces_outlive_the_host(tmp_path: Path) -> None:
    async with open_sandbox(tmp_path / "sandbox") as host:
        outcome = await host.run(
            SandboxSpec(argv=("sh", "-c", "echo kept > note; exit 1"), keep_failed=True),
            timeout=10,
        )
    assert (Path(outcome.workspace) / "work" / "note").read_text() == "kept\n"


async def test_hosts_opening_and_closing_together_on_one_root_do_not_trip(tmp_path: Path) -> None:
    async def churn() -> None:
        for _ in range(8):
            async with open_sandbox(tmp_path / "shared") as host:
                await host.run(SandboxSpec(argv=("true",)), timeout=5)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(churn)


@needs_namespaces
async def test_namespace_mode_keeps_signal_semantics(host: SandboxHost) -> None:
    # The TERM ends it: a KILL would come only after the 600 s grace, past the hang guard.
    spec = SandboxSpec(argv=("sh", "-c", POLITE_TREE_SH), isolation="namespace", kill_grace=600)
    with trio.fail_after(60):
        outcome = await host.run(spec, timeout=0.5)
    assert outcome.status == "timed_out"
    assert outcome.kill_latency_seconds is not None


@needs_namespaces
async def test_namespace_mode_enforces_the_cpu_limit(host: SandboxHost) -> None:
    spec = SandboxSpec(
        argv=(sys.executable, "-c", "while True: pass"),
        limits=Limits(cpu_seconds=1),
        isolation="namespace",
    )
    outcome = await host.run(spec, timeout=15)
    assert outcome.status == "limit_exceeded" and outcome.limits_hit == ("cpu",)


@needs_namespaces
async def test_namespace_mode_counts_its_own_processes_outside_the_pids_limit(
    host: SandboxHost,
) -> None:
    spec = SandboxSpec(argv=("true",), limits=Limits(processes=1), isolation="namespace")
    outcome = await host.run(spec, timeout=10)
    assert outcome.ok, outcome.stderr.text()
