"""A command unit's small layout runs on the event loop, its spawn in a thread only while its
program must be looked up (issue 22): a worker thread doing a few folders pays more in GIL
hand-offs than the work itself. Which
layouts qualify, that a closed gate or a seed sends the layout to the thread as before, that
a run cancelled after an inline layout never starts and leaves nothing, and that a replay lane
vouches for its layout only when it is small."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

import pytest
import trio

from evolane.measure import CommandSettings, MeasureContext, MeasureSettings, RunJournal
from evolane.messages import ArtifactRef
from evolane.sandbox import (
    Overlay,
    SandboxHost,
    SandboxSpec,
    View,
    lease_holders,
    open_sandbox,
)
from evolane.sandbox._secrets import commands_run_unprivileged
from evolane.store import BlobStore, read_journal, snapshot_tree
from tests.pipeline_helpers import two_trees
from tests.sandbox_helpers import count_hops, sh


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[SandboxHost]:
    async with open_sandbox(tmp_path / "sandbox", store=BlobStore(tmp_path / "store")) as opened:
        yield opened


def _tree(host: SandboxHost, folder: Path, text: str) -> ArtifactRef:
    """``folder`` made with one file, input.txt holding ``text``, and stored as a tree."""
    folder.mkdir()
    (folder / "input.txt").write_text(text)
    assert host.store is not None
    return snapshot_tree(host.store, folder)


def _units(host: SandboxHost) -> list[str]:
    return [p.name for p in host.lease_dir.iterdir() if p.name.startswith("unit")]


async def _assert_nothing_left(host: SandboxHost) -> None:
    """No unit folder, no process of the lease, no cgroup left once cleanups have run."""
    await trio.to_thread.run_sync(host.settle)
    assert _units(host) == [] and lease_holders(host.lease) == set()
    for root in host.cgroups.roots():
        assert not [p for p in root.iterdir() if p.is_dir()], list(root.iterdir())


def _layout_recorder(folder: Path) -> tuple[list[int], Callable[[], None]]:
    """A setup that lays out ``folder`` (one file) and records the thread it ran in."""
    threads: list[int] = []

    def lay_out() -> None:
        threads.append(threading.get_ident())
        folder.mkdir()
        (folder / "input.txt").write_text("laid out")

    return threads, lay_out


async def test_a_small_layout_runs_on_the_event_loop_and_only_the_spawn_hops(
    host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops = count_hops(monkeypatch)
    work = host.lease_dir / "small"
    threads, lay_out = _layout_recorder(work)
    spec = SandboxSpec(**sh("cat input.txt"), workspace=str(work))
    outcome = await host.run(spec, timeout=30, setup=lay_out, small_layout=True)
    assert outcome.ok and outcome.stdout.text() == "laid out", outcome
    assert threads == [threading.get_ident()]  # the event loop's own thread
    assert hops["_spawn_unless_cancelled"] == 1 and hops["_prepare_and_spawn"] == 0


async def test_a_unit_with_only_its_own_folders_is_laid_out_inline(
    host: SandboxHost, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hops = count_hops(monkeypatch)
    outcome = await host.run(SandboxSpec(**sh("pwd; echo $HOME")), timeout=30)
    assert outcome.ok and outcome.stdout.text().split("\n")[0].endswith("/work"), outcome
    assert hops["_spawn_unless_cancelled"] == 1 and hops["_prepare_and_spawn"] == 0
    mine = tmp_path / "mine"  # a writable own path: the caller's, of unknown size
    mine.mkdir()
    view = View(own=((str(mine), True),))
    outcome = await host.run(SandboxSpec(**sh("true"), view=view), timeout=30)
    assert outcome.ok and hops["_prepare_and_spawn"] == 1


async def test_a_layout_not_vouched_small_runs_in_the_spawning_thread(
    host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops = count_hops(monkeypatch)
    work = host.lease_dir / "unvouched"
    threads, lay_out = _layout_recorder(work)
    spec = SandboxSpec(**sh("cat input.txt"), workspace=str(work))
    outcome = await host.run(spec, timeout=30, setup=lay_out)
    assert outcome.ok and threads and threads[0] != threading.get_ident()
    assert hops["_prepare_and_spawn"] == 1 and hops["_spawn_unless_cancelled"] == 0


async def test_a_seeded_workspace_or_a_closed_gate_lays_out_in_the_thread(
    host: SandboxHost, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hops = count_hops(monkeypatch)
    seeded = SandboxSpec(**sh("cat input.txt"), seed=_tree(host, tmp_path / "seed", "seeded"))
    outcome = await host.run(seeded, timeout=30, small_layout=True)  # a copy to make: big
    assert outcome.ok and outcome.stdout.text() == "seeded", outcome
    assert hops["_prepare_and_spawn"] == 1
    host.inline.pause = float("inf")  # closed for good by slow pieces in a row
    for _ in range(host.inline.strikes):
        host.inline.took(host.inline.slow * 2, time.monotonic())
    assert not host.inline.open(time.monotonic())
    work = host.lease_dir / "gate-closed"
    threads, lay_out = _layout_recorder(work)
    spec = SandboxSpec(**sh("cat input.txt"), workspace=str(work))
    outcome = await host.run(spec, timeout=30, setup=lay_out, small_layout=True)
    assert outcome.ok and threads[0] != threading.get_ident()
    assert hops["_prepare_and_spawn"] == 2 and hops["_spawn_unless_cancelled"] == 0


async def test_overlays_lay_out_in_the_thread(
    host: SandboxHost, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hops = count_hops(monkeypatch)
    overlay = Overlay(tree=_tree(host, tmp_path / "layer", "overlaid"))
    spec = SandboxSpec(**sh("cat input.txt"), overlays=(overlay,))
    outcome = await host.run(spec, timeout=30, small_layout=True)  # a copy to make
    assert outcome.ok and outcome.stdout.text() == "overlaid", outcome
    assert hops["_prepare_and_spawn"] == 1 and hops["_spawn_unless_cancelled"] == 0


async def test_a_run_cancelled_while_its_spawn_waits_for_a_thread_never_starts(
    host: SandboxHost, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    threads = trio.to_thread.current_default_thread_limiter()
    held = [object() for _ in range(int(threads.total_tokens))]
    for borrower in held:  # every worker thread busy: the spawn's hop must wait
        threads.acquire_on_behalf_of_nowait(borrower)
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(host.run, SandboxSpec(**sh(f"touch {marker}"))))
                while not _units(host):
                    await trio.sleep(0.001)  # laid out inline; its spawn waits for a thread
                nursery.cancel_scope.cancel()
                for borrower in held:  # its cleanup needs a thread too
                    threads.release_on_behalf_of(borrower)
                held = []
    finally:
        for borrower in held:
            threads.release_on_behalf_of(borrower)
    assert not marker.exists()
    await _assert_nothing_left(host)


async def test_a_run_cancelled_after_its_inline_layout_never_starts_and_leaves_nothing(
    host: SandboxHost, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    work = host.lease_dir / "cancelled"
    with trio.CancelScope() as scope:

        def lay_out_then_cancel() -> None:
            work.mkdir()
            scope.cancel()  # the layout is done; the spawn's hop is the next checkpoint

        spec = SandboxSpec(**sh(f"touch {marker}"), workspace=str(work))
        await host.run(spec, timeout=30, setup=lay_out_then_cancel, small_layout=True)
    assert scope.cancelled_caught and not marker.exists()
    await _assert_nothing_left(host)  # its cgroups went with it


async def test_a_replay_lane_lays_out_inline_exactly_when_its_candidate_is_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops = count_hops(monkeypatch)
    rows = [{"id": f"c{i}", "input": i, "expected_output": 1} for i in range(3)]
    script = 'test -f "$2" && echo 1 > "$1"/output.json'  # the case file was laid out
    settings = MeasureSettings(
        replay=f"sh -c '{script}' replay {{output_dir}} {{case_file}}", replay_concurrency=2
    )
    journal = RunJournal(tmp_path / "journal.jsonl")
    commands = CommandSettings(kill_grace=0.2, isolation="process")
    async with two_trees(tmp_path, rows, settings, MeasureContext(journal), commands) as bench:
        bench.host.inline.slow = float("inf")  # timing aside: only what is vouched decides
        summary = await bench.pipeline.measure(bench.request)
    journal.close()
    units = [r for r in read_journal(tmp_path / "journal.jsonl").records if r["type"] == "unit"]
    assert summary.units_run == len(units) >= 6
    assert all(u["judge"]["score"] == 1.0 for u in units), units  # each case file was there
    # Shared (read-only) only where the command cannot write to it: see `ReplayLane._share`.
    shared = commands_run_unprivileged()
    threaded = hops["_prepare_and_spawn"]
    assert threaded == (0 if shared else len(units))
    if shared:  # spawned from the loop once its program was found (`ProgramCache`)
        assert 1 <= hops["_spawn_unless_cancelled"] < len(units), hops
