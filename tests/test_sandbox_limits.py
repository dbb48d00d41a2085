"""Each resource limit stops its hog, and the outcome says what bounded it."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from evolane.sandbox import Limits, SandboxHost, SandboxSpec, lease_holders, open_sandbox

PY = sys.executable


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[SandboxHost]:
    async with open_sandbox(tmp_path / "sandbox") as opened:
        yield opened


def python(code: str, **limits: int) -> SandboxSpec:
    return SandboxSpec(argv=(PY, "-c", code), limits=Limits(**limits), kill_grace=0.2)


MEMORY_HOG = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))"


async def test_memory_hog_is_stopped_by_the_address_space_limit(host: SandboxHost) -> None:
    with trio.fail_after(20):
        outcome = await host.run(python(MEMORY_HOG, address_space_bytes=256 << 20), timeout=15)
    assert outcome.status == "exited" and outcome.exit_code != 0
    assert "MemoryError" in outcome.stderr.text()


async def test_memory_hog_is_oom_killed_by_the_memory_cgroup(host: SandboxHost) -> None:
    if "memory_cgroup" not in host.cgroups.mechanisms:
        pytest.skip("this host has no writable memory cgroup")
    with trio.fail_after(20):
        outcome = await host.run(python(MEMORY_HOG, memory_bytes=128 << 20), timeout=15)
    assert outcome.status == "limit_exceeded"
    assert "memory" in outcome.limits_hit
    assert "memory_cgroup" in outcome.enforcement


async def test_cpu_spinner_is_stopped_by_the_cpu_limit(host: SandboxHost) -> None:
    # A wall timeout far beyond the CPU second: at load 17 on 2 cores the spinner gets a
    # tenth of a core; a 15 s timeout could end it first (timed_out, not the limit).
    with trio.fail_after(120):
        outcome = await host.run(python("while True: pass", cpu_seconds=1), timeout=90)
    assert outcome.status == "limit_exceeded"
    assert outcome.limits_hit == ("cpu",)
    # RLIMIT_CPU fires after 1 s of CPU; the reading is the cgroup's or rusage's, which can
    # trail it by a few scheduler ticks on a loaded host (0.898 s seen at load 5).
    assert outcome.cpu_seconds >= 0.8


async def test_file_size_flood_is_stopped_by_the_file_size_limit(host: SandboxHost) -> None:
    flood = "exec head -c 100000000 /dev/zero > big"
    spec = SandboxSpec(argv=("sh", "-c", flood), limits=Limits(file_size_bytes=1 << 20))
    with trio.fail_after(20):
        outcome = await host.run(spec, timeout=15)
    assert outcome.status == "limit_exceeded"
    assert outcome.limits_hit == ("file_size",)


async def test_python_file_flood_gets_efbig_and_writes_no_more_than_the_limit(
    host: SandboxHost,
) -> None:
    # Python ignores SIGXFSZ, so the limit shows up as EFBIG (errno 27) instead of a signal.
    code = (
        "import os\ntry:\n    with open('big', 'wb') as f:\n"
        "        while True: f.write(b'x' * 65536)\n"
        "except OSError as e:\n    print(e.errno, os.path.getsize('big')); raise SystemExit(4)"
    )
    outcome = await host.run(python(code, file_size_bytes=1 << 20), timeout=15)
    assert outcome.exit_code == 4
    errno, size = outcome.stdout.head.split()
    assert int(errno) == 27 and int(size) <= 1 << 20


async def test_descriptor_flood_is_stopped_by_the_open_files_limit(host: SandboxHost) -> None:
    code = (
        "import os\nn = 0\ntry:\n    while True:\n"
        "        os.open('/dev/null', os.O_RDONLY); n += 1\n"
        "except OSError as e:\n    print(n, e.errno); raise SystemExit(3)"
    )
    outcome = await host.run(python(code, open_files=64), timeout=15)
    assert outcome.exit_code == 3
    opened, errno = outcome.stdout.head.split()
    assert int(opened) < 64 and int(errno) == 24  # EMFILE


async def test_fork_bomb_is_bounded_and_leaves_nothing(host: SandboxHost) -> None:
    bomb = "bomb() { bomb | bomb & }; bomb; sleep 5"
    spec = SandboxSpec(argv=("sh", "-c", bomb), limits=Limits(processes=64), kill_grace=0.2)
    with trio.fail_after(30):
        outcome = await host.run(spec, timeout=2)
    if "pids_cgroup" in host.cgroups.mechanisms:
        assert outcome.status == "limit_exceeded"
        assert "processes" in outcome.limits_hit
        assert "pids_cgroup" in outcome.enforcement
    assert outcome.survivors == 0
    assert lease_holders(host.lease) == set()


async def test_the_memory_of_a_process_its_leader_never_waited_for_is_sampled(
    host: SandboxHost,
) -> None:
    # The leader's own rusage counts only what it reaped: a child it left running is seen
    # by the watch's samples alone (taken while it waits for the leader, issue 22).
    hold = f"{PY} -c 'import time; held = b\"x\" * (96 << 20); time.sleep(5)'"
    spec = SandboxSpec(argv=("sh", "-c", f"{hold} & sleep 1.2"), kill_grace=0.2)
    outcome = await host.run(spec, timeout=20)
    assert outcome.ok, outcome.error
    assert outcome.peak_rss_bytes >= 96 << 20


async def test_a_command_run_without_a_stop_starts_no_task_beside_its_two_drains(
    host: SandboxHost,
) -> None:
    # Issue 22: a racer task for the leader's exit, one for the disk floor and a memory
    # sampler were started and cancelled for every command, ~0.1 ms of CPU each.
    spawned: list[str] = []

    class Spawns(trio.abc.Instrument):
        def task_spawned(self, task: trio.lowlevel.Task) -> None:
            spawned.append(task.name)

    trio.lowlevel.add_instrument(Spawns())
    outcome = await host.run(SandboxSpec(argv=("true",)), timeout=20)
    assert outcome.ok, outcome.error
    assert [name.rsplit(".", 1)[-1] for name in spawned] == ["drain", "drain"]
