"""Sandbox input and output: environment, capture, bad input, workspaces, isolation levels."""

from __future__ import annotations

import os
import sys
import threading
from functools import partial
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from evolane.sandbox import (
    OutputCaps,
    Overlay,
    SandboxHost,
    SandboxSpec,
    WorkspaceError,
    _capture,
    _host,
    lease_holders,
)
from evolane.sandbox._capture import BoundedCapture, drain, open_pipe
from evolane.store import BlobStore, snapshot_tree
from tests.sandbox_helpers import sh


async def test_parent_secrets_never_reach_the_child(
    host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("EVOLANE_TOKEN", "also-secret")
    monkeypatch.setenv("PASSED_THROUGH", "yes")
    spec = SandboxSpec(argv=("env",), pass_env=("PASSED_THROUGH",), env={"EXPLICIT": "1"})
    outcome = await host.run(spec, timeout=10)
    env = dict(line.split("=", 1) for line in outcome.stdout.text().splitlines())
    assert "OPENAI_API_KEY" not in env and "EVOLANE_TOKEN" not in env
    assert env["PASSED_THROUGH"] == "yes" and env["EXPLICIT"] == "1"
    unit = Path(env["EVOLANE_WORKSPACE"]).parent
    assert env["HOME"] == str(unit / "home") and env["TMPDIR"] == str(unit / "tmp")
    assert host.lease in env["EVOLANE_LEASE"]
    allowed = {"PATH", "LANG", "TZ", "HOME", "TMPDIR", "PWD", "SHLVL", "_"}
    assert {k for k in env if not k.startswith(("LC_", "EVOLANE_"))} - allowed == {
        "PASSED_THROUGH",
        "EXPLICIT",
    }


async def test_stdin_is_closed_and_cwd_is_the_workspace(host: SandboxHost) -> None:
    outcome = await host.run(SandboxSpec(**sh("cat; pwd")), timeout=10)
    assert outcome.ok
    assert outcome.stdout.text().strip().endswith("/work")


async def test_missing_executable_is_spawn_failed_without_an_exception(host: SandboxHost) -> None:
    outcome = await host.run(SandboxSpec(argv=("no-such-program-xyz", "--flag")), timeout=10)
    assert outcome.status == "spawn_failed"
    assert "No such file or directory" in outcome.error
    outcome = await host.run(SandboxSpec(argv=("./not-here.sh",)), timeout=10)
    assert outcome.status == "spawn_failed"


async def test_non_utf8_output_is_kept_as_bytes(host: SandboxHost) -> None:
    outcome = await host.run(SandboxSpec(**sh(r"printf '\377\376ok\200'")), timeout=10)
    assert outcome.stdout.head == b"\xff\xfeok\x80"


async def test_capture_keeps_head_tail_and_total_and_stores_a_capped_copy(
    host: SandboxHost, store: BlobStore
) -> None:
    caps = OutputCaps(head_bytes=10, tail_bytes=10, stored_bytes=1000)
    script = "i=0; while [ $i -lt 500 ]; do echo line$i; i=$((i+1)); done"
    outcome = await host.run(SandboxSpec(**sh(script), output=caps), timeout=10)
    out = outcome.stdout
    assert out.head == b"line0\nline"
    assert out.tail == b"line498\nline499\n"[-10:]
    assert out.total_bytes == sum(len(f"line{i}\n") for i in range(500))
    assert out.truncated
    assert out.ref is not None and out.ref.size == 1000
    assert store.read_bytes(out.ref).startswith(b"line0\nline1\n")


async def test_a_drain_lets_other_tasks_run_between_chunks_and_closes_its_pipe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A drain reads the pipe itself (no FdStream): a writer always ahead of it must not
    # hold the loop (the deadlines of every other unit wait on it).
    monkeypatch.setattr(_capture, "_READ_BYTES", 1)
    read_fd, write_fd = open_pipe()
    assert not os.get_blocking(read_fd) and os.get_blocking(write_fd)  # the command's blocks
    os.write(write_fd, b"x" * 50)
    os.close(write_fd)
    capture, ticks = BoundedCapture(OutputCaps(), None), []

    async def other() -> None:
        while True:
            ticks.append(1)
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        await trio.lowlevel.checkpoint()
        await drain(read_fd, capture)
        nursery.cancel_scope.cancel()
    assert capture.total == 50 and len(ticks) >= 25, (capture.total, len(ticks))
    with pytest.raises(OSError):
        os.fstat(read_fd)  # closed by the drain


async def test_both_streams_flooding_at_once_never_block_the_child(host: SandboxHost) -> None:
    flood = "head -c 20000000 /dev/zero & head -c 20000000 /dev/zero >&2; wait"
    with trio.fail_after(20):
        outcome = await host.run(SandboxSpec(**sh(flood)), timeout=15)
    assert outcome.ok
    assert outcome.stdout.total_bytes == outcome.stderr.total_bytes == 20_000_000


async def test_workspace_outside_the_root_is_refused(host: SandboxHost, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with pytest.raises(WorkspaceError, match="not a directory inside"):
        await host.run(SandboxSpec(argv=("true",), workspace=str(outside)), timeout=5)
    with pytest.raises(WorkspaceError):
        await host.run(SandboxSpec(argv=("true",), workspace="/"), timeout=5)


async def test_setup_lays_out_a_workspace_in_the_spawning_thread(host: SandboxHost) -> None:
    import threading

    work = host.lease_dir / "laid-out"
    seen: list[str] = []

    def lay_out() -> None:
        seen.append(threading.current_thread().name)
        work.mkdir()
        (work / "input.txt").write_text("from setup")

    spec = SandboxSpec(**sh("cat input.txt"), workspace=str(work))
    outcome = await host.run(spec, timeout=10, setup=lay_out)
    assert outcome.ok and outcome.stdout.text() == "from setup"
    assert seen and seen[0] != threading.current_thread().name  # off the event loop

    def broken() -> None:
        raise OSError("no room for the scratch files")

    await trio.to_thread.run_sync(host.settle)
    before = set(os.listdir(host.lease_dir))
    spec = SandboxSpec(argv=("true",), workspace=str(host.lease_dir / "never-made"))
    with pytest.raises(OSError, match="no room"):  # the caller's error, not a spawn failure
        await host.run(spec, timeout=10, setup=broken)
    await trio.to_thread.run_sync(host.settle)
    assert set(os.listdir(host.lease_dir)) == before  # no unit directory left behind


async def test_a_run_cancelled_while_it_is_laid_out_never_starts(
    host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    import evolane.sandbox._start as start_module
    from evolane.sandbox._spawner import Spawner

    spawned: list[object] = []
    real_launch, real_spawn = start_module.launch, Spawner.spawn
    real_from_trio = Spawner.spawn_from_trio

    def counting_launch(*args: object) -> object:
        spawned.append(args)
        return real_launch(*args)  # type: ignore[arg-type]

    def counting_spawn(*args: object) -> object:
        spawned.append(args)
        return real_spawn(*args)  # type: ignore[arg-type]

    async def counting_from_trio(*args: object) -> object:
        spawned.append(args)
        return await real_from_trio(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(start_module, "launch", counting_launch)  # every way a command starts
    monkeypatch.setattr(Spawner, "spawn", counting_spawn)
    monkeypatch.setattr(Spawner, "spawn_from_trio", counting_from_trio)
    laying_out = trio.Event()

    def slow_setup() -> None:
        trio.from_thread.run_sync(laying_out.set)
        time.sleep(0.5)

    spec = SandboxSpec(**sh("sleep 30"), kill_grace=5.0)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(host.run, spec, timeout=60, setup=slow_setup))
            await laying_out.wait()
            nursery.cancel_scope.cancel()
    assert spawned == []  # cancelled during the layout: the command never started
    await trio.to_thread.run_sync(host.settle)
    assert [p.name for p in host.lease_dir.iterdir() if p.name.startswith("unit")] == []
    assert lease_holders(host.lease) == set()


async def test_a_given_workspace_is_used_exactly_as_it_was_checked(host: SandboxHost) -> None:
    # "link/.." is the link target's parent, not "a": the directory that passed the inside-
    # the-root check must be the one the command runs in.
    base = host.lease_dir / "ws"
    (base / "a").mkdir(parents=True)
    (base / "b" / "c").mkdir(parents=True)
    (base / "b" / "w").mkdir()
    (base / "a" / "link").symlink_to(base / "b" / "c")
    spec = SandboxSpec(**sh('pwd -P; echo "$EVOLANE_WORKSPACE"'), workspace=f"{base}/a/link/../w")
    outcome = await host.run(spec, timeout=10)
    assert outcome.ok, outcome.stderr.text()
    expected = str((base / "b" / "w").resolve())
    assert outcome.stdout.text().split() == [expected, expected]


async def test_seed_and_overlay_are_materialised_writable_and_removed_after(
    host: SandboxHost, store: BlobStore, tmp_path: Path
) -> None:
    seed_dir, skill_dir = tmp_path / "seed", tmp_path / "skill"
    (seed_dir / "skill").mkdir(parents=True)
    (seed_dir / "grader.py").write_text("seed grader")
    (seed_dir / "skill" / "SKILL.md").write_text("old rules")
    skill_dir.mkdir()
    (skill_dir / "SKILL.md").write_text("new rules")
    seed, overlay = snapshot_tree(store, seed_dir), snapshot_tree(store, skill_dir)
    spec = SandboxSpec(
        **sh("cat grader.py skill/SKILL.md; echo more >> skill/SKILL.md && echo writable"),
        seed=seed,
        overlays=(Overlay(path="skill", tree=overlay),),
    )
    outcome = await host.run(spec, timeout=10)
    assert outcome.stdout.text() == "seed gradernew ruleswritable\n"
    store.verify(overlay)  # writing in the workspace never touched the store
    await trio.to_thread.run_sync(host.settle)  # unit directories are removed in the background
    assert [p.name for p in host.lease_dir.iterdir() if p.is_dir() and p.name != ".spool"] == []


async def test_keep_failed_keeps_the_workspace_of_a_failed_run(host: SandboxHost) -> None:
    outcome = await host.run(
        SandboxSpec(**sh("echo x > note; exit 3"), keep_failed=True), timeout=10
    )
    assert outcome.exit_code == 3 and outcome.workspace
    assert (Path(outcome.workspace) / "work" / "note").read_text() == "x\n"


async def test_symlink_escaping_the_workspace_is_refused(
    host: SandboxHost, store: BlobStore, tmp_path: Path
) -> None:
    evil = tmp_path / "evil"
    evil.mkdir()
    os.symlink("/etc/passwd", evil / "passwd")
    with pytest.raises(Exception, match="passwd"):
        await host.run(SandboxSpec(argv=("true",), seed=snapshot_tree(store, evil)), timeout=5)


async def test_namespace_isolation_has_no_network_and_its_own_pids(host: SandboxHost) -> None:
    from evolane.sandbox._confine import confinement_problem
    from evolane.sandbox._launch import namespaces_available

    if not namespaces_available():
        pytest.skip("this host does not allow PID + network namespaces")
    probe = (
        "import os, socket\nprint(os.getpid())\ns = socket.socket()\ntry:\n"
        "    s.connect(('127.0.0.1', 9)); print('connected')\n"
        "except OSError as e:\n    print(e.errno)"
    )
    spec = SandboxSpec(argv=(sys.executable, "-c", probe), isolation="namespace")
    outcome = await host.run(spec, timeout=10)
    pid, connect = outcome.stdout.text().split()
    assert outcome.isolation == "namespace" and "net_namespace" in outcome.enforcement
    assert int(pid) <= 3  # a fresh PID namespace
    assert connect != "connected"  # no usable network, not even loopback
    auto = await host.run(SandboxSpec(argv=("true",), isolation="auto"), timeout=10)
    assert auto.isolation == ("confined" if confinement_problem() is None else "namespace")


async def test_a_command_cannot_pass_its_failure_off_as_a_spawn_failure(host: SandboxHost) -> None:
    """The launcher's "cannot join cgroup" line carries a per-unit secret: a command that
    prints the line (without it) and exits 125 has simply failed."""
    forged = "echo 'evolane-launch: cannot join cgroup /sys/fs/cgroup/x' >&2; exit 125"
    outcome = await host.run(
        SandboxSpec(argv=("sh", "-c", forged), isolation="process"), timeout=10
    )
    assert outcome.status == "exited" and outcome.exit_code == 125, outcome


async def test_namespace_tree_dies_at_the_deadline(host: SandboxHost) -> None:
    from evolane.sandbox._launch import namespaces_available

    if not namespaces_available():
        pytest.skip("this host does not allow PID + network namespaces")
    from evolane.testing import EVIL_TREE_SH

    spec = SandboxSpec(**sh(EVIL_TREE_SH, kill_grace=0.2), isolation="namespace")
    outcome = await host.run(spec, timeout=1.0)
    assert outcome.status == "timed_out" and outcome.survivors == 0
    assert lease_holders(host.lease) == set()


async def test_two_hundred_concurrent_sandboxes_leave_nothing(host: SandboxHost) -> None:
    outcomes = []

    async def one() -> None:
        outcomes.append(await host.run(SandboxSpec(argv=("sleep", "0.2")), timeout=30))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for _ in range(200):
                nursery.start_soon(one)
    assert len(outcomes) == 200 and all(o.ok for o in outcomes)
    assert lease_holders(host.lease) == set()


async def _capture_flood(host: SandboxHost, size: int) -> tuple[float, int]:
    spec = SandboxSpec(argv=("head", "-c", str(size), "/dev/zero"))
    start = trio.current_time()
    outcome = await host.run(spec, timeout=60)
    assert outcome.ok
    assert outcome.stdout.truncated and len(outcome.stdout.head) == 16 << 10
    return trio.current_time() - start, outcome.stdout.total_bytes


async def test_a_large_flood_is_counted_in_full_and_kept_bounded(host: SandboxHost) -> None:
    _, total = await _capture_flood(host, 64 << 20)
    assert total == 64 << 20


@pytest.mark.slow
async def test_one_gibibyte_of_stdout_is_captured(host: SandboxHost) -> None:
    took, total = await _capture_flood(host, 1 << 30)
    assert total == 1 << 30
    assert took < 30  # a hang guard only; the speed figure comes from benchmarks/kill.py


@given(
    chunks=st.lists(st.binary(min_size=1, max_size=300), max_size=12),
    head=st.integers(0, 400),
    tail=st.integers(0, 400),
    stored=st.integers(0, 1500),
)
@settings(max_examples=150, deadline=None)
def test_capture_keeps_exactly_its_head_tail_and_stored_prefix(
    tmp_path_factory: pytest.TempPathFactory,
    chunks: list[bytes],
    head: int,
    tail: int,
    stored: int,
) -> None:
    """Head, tail and the stored copy are exact prefixes and suffixes of the stream, whether
    the stored copy fit in the head (no temporary file made) or spilled to one."""
    spool = tmp_path_factory.mktemp("spool")
    store = BlobStore(tmp_path_factory.mktemp("store"))
    capture = BoundedCapture(
        OutputCaps(head_bytes=head, tail_bytes=tail, stored_bytes=stored), spool
    )
    for chunk in chunks:
        capture.feed(chunk)
    whole = b"".join(chunks)
    result = capture.result()
    assert result.head == whole[:head] and capture.total == len(whole)
    assert result.head + result.tail == whole or (
        result.truncated and len(result.tail) == tail and whole.endswith(result.tail)
    )
    spilled = capture._spool is not None
    assert spilled == (min(len(whole), stored) > head)
    ref = capture.store(store)
    kept = whole[:stored]
    assert (store.read_bytes(ref) if ref is not None else b"") == kept
    capture.close()


def test_a_cgroup_file_past_its_cap_is_read_in_whole_lines(tmp_path: Path) -> None:
    """``cgroup.procs`` longer than the cap: the pids read are whole (a pid cut in half is
    another process, which the kill ladder would signal)."""
    from evolane.sandbox._lifeline import CGROUP_FILE_BYTES, read_cgroup_file, read_pids

    pids = [10_000_000 + n for n in range(CGROUP_FILE_BYTES // 9 + 1000)]  # 9 bytes a line
    (tmp_path / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in pids))
    text = read_cgroup_file(tmp_path / "cgroup.procs")
    assert text.endswith("\n") and len(text) <= CGROUP_FILE_BYTES
    read = read_pids(tmp_path)
    assert read and read <= set(pids) and len(read) == CGROUP_FILE_BYTES // 9


def test_a_spool_that_cannot_be_made_costs_the_stored_copy_never_the_capture(
    tmp_path: Path,
) -> None:
    caps = OutputCaps(head_bytes=4, tail_bytes=4, stored_bytes=100)
    capture = BoundedCapture(caps, tmp_path / "no-such-folder")
    for chunk in (b"0123", b"456789", b"abcdef"):
        capture.feed(chunk)
    result = capture.result()
    assert capture.spool_failed and capture.store(BlobStore(tmp_path / "store")) is None
    assert (result.head, result.tail, result.total_bytes) == (b"0123", b"cdef", 16)


def test_deferred_cleanups_wait_for_a_batch_then_run_in_order() -> None:
    # The first cleanup of a batch waits (a unit ends as its lane starts the next one);
    # what is queued meanwhile runs with it, in order; settle waits for all of them.
    waiting, release, ran = threading.Event(), threading.Event(), []

    def delay(seconds: float) -> None:
        assert seconds == _host.CLEANUP_DELAY
        waiting.set()
        assert release.wait(30)

    janitor = _host._Janitor()
    janitor._delay = delay
    janitor.put(lambda: ran.append("a"))
    assert waiting.wait(30) and ran == []  # held back, not run at once
    janitor.put(lambda: ran.append("b"))
    waiting.clear()
    release.set()
    janitor.settle()
    assert ran == ["a", "b"] and not waiting.is_set()  # b went with a's batch, no 2nd wait
    janitor.close()


def test_a_cleanup_delay_that_fails_delays_nothing_and_stops_nothing() -> None:
    janitor, ran = _host._Janitor(), []

    def broken(seconds: float) -> None:
        raise RuntimeError("no delay today")

    janitor._delay = broken
    for name in ("a", "b"):  # each starts a batch: its delay fails, it runs all the same
        done = threading.Event()
        janitor.put(lambda name=name, done=done: (ran.append(name), done.set()))
        assert done.wait(30), ran  # the janitor's thread lives on
    assert ran == ["a", "b"]
    janitor.close()
