"""A finished command unit's few folders and files are removed on the event loop while they
are small and the inline gate is open, else by the cleanup thread (issue 22: in the thread
each system call hands the GIL to and from the busy loop, ~1 ms of CPU a unit against
~0.15 ms of work). `remove_small_tree` removes a small tree whole or leaves it to
`remove_tree`, through descriptors (no link followed); a unit whose cgroup or folder is not
small is left to the thread, and nothing is left behind either way."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from evolane.sandbox import (
    INLINE_BYTES,
    INLINE_FILES,
    INLINE_FOLDER_BYTES,
    InlineGate,
    SandboxHost,
    SandboxSpec,
    lease_holders,
    open_sandbox,
)
from evolane.store import BlobStore, remove_small_tree, remove_tree
from tests.sandbox_helpers import count_hops

SMALL = (INLINE_FILES, INLINE_FOLDER_BYTES, INLINE_BYTES)


def _tree(root: Path, files: int = 2) -> Path:
    """A unit-like folder: empty ``work``, ``out`` with ``files`` files and a nested folder,
    a symlink leading out of it, and a folder outside it that must survive."""
    unit = root / "unit"
    (unit / "work").mkdir(parents=True)
    (unit / "out" / "deep").mkdir(parents=True)
    for number in range(files):
        (unit / "out" / f"f{number}").write_bytes(b"x")
    (unit / "out" / "deep" / "g").write_bytes(b"y")
    (root / "outside").mkdir()
    (root / "outside" / "keep").write_bytes(b"k")
    (unit / "escape").symlink_to(root / "outside")
    (unit / "out" / "deep" / "escape").symlink_to(root / "outside" / "keep")
    return unit


def _entries(folder: Path) -> int:
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(folder))


def test_a_small_tree_goes_whole_and_no_link_is_followed(tmp_path: Path) -> None:
    unit = _tree(tmp_path)
    assert remove_small_tree(unit, *SMALL)
    assert not os.path.lexists(unit)
    assert (tmp_path / "outside" / "keep").read_bytes() == b"k"
    assert remove_small_tree(unit, *SMALL)  # already gone: True


def test_a_tree_over_a_bound_is_left_untouched_for_remove_tree(tmp_path: Path) -> None:
    unit = _tree(tmp_path, files=INLINE_FILES)
    before = _entries(unit)
    assert not remove_small_tree(unit, *SMALL)
    assert _entries(unit) == before  # the walk stopped before anything was removed
    assert remove_tree(unit) and not os.path.lexists(unit)
    heavy = tmp_path / "heavy"
    heavy.mkdir()
    (heavy / "big").write_bytes(b"x" * (INLINE_BYTES + 4096))  # blocks to free
    assert not remove_small_tree(heavy, *SMALL) and (heavy / "big").exists()
    listed = tmp_path / "listed"
    listed.mkdir()
    (listed / "a").write_bytes(b"a")
    size = os.stat(listed).st_size  # a folder that once held many entries lists more
    assert not remove_small_tree(listed, INLINE_FILES, size - 1, INLINE_BYTES)
    assert (listed / "a").exists()
    assert remove_small_tree(listed, INLINE_FILES, size, INLINE_BYTES)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "outside")
    assert not remove_small_tree(link, *SMALL)  # a link is not a folder: never entered
    assert (tmp_path / "outside" / "keep").exists()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), min_size=0, max_size=12))
def test_a_small_tree_is_removed_whole_or_not_at_all(shape: list[tuple[int, int]]) -> None:
    # Folders nested to a depth, each with some files: removed (True) exactly when the
    # entries are within the bound, else left exactly as they were.
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        unit = Path(scratch) / "unit"
        unit.mkdir()
        for index, (depth, files) in enumerate(shape):
            folder = unit.joinpath(*[f"d{index}"] * (depth + 1))
            folder.mkdir(parents=True)
            for number in range(files):
                (folder / f"f{number}").write_bytes(b"z")
        entries, bound = _entries(unit), 16
        removed = remove_small_tree(unit, bound, INLINE_FOLDER_BYTES, INLINE_BYTES)
        assert removed == (entries <= bound)
        assert os.path.lexists(unit) != removed
        if not removed:
            assert _entries(unit) == entries


def test_clean_soon_runs_inline_only_while_the_gate_is_open_and_small_succeeds() -> None:
    deferred: list[Callable[[], object]] = []
    ran: list[str] = []
    host: Any = SimpleNamespace(inline_cleanup=InlineGate(), defer=deferred.append)

    def cleanup() -> None:
        ran.append("thread")

    SandboxHost.clean_soon(host, lambda: ran.append("inline") is None, cleanup)
    assert ran == ["inline"] and deferred == []
    SandboxHost.clean_soon(host, lambda: False, cleanup)  # not small: the thread's
    assert deferred == [cleanup]

    def broken() -> bool:
        raise RuntimeError("a bug in the small path")

    SandboxHost.clean_soon(host, broken, cleanup)  # never raises: the thread retries
    assert len(deferred) == 2
    host.inline_cleanup = InlineGate(slow=-1.0, strikes=1)
    host.inline_cleanup.took(1.0, time.monotonic())  # closed
    SandboxHost.clean_soon(host, lambda: ran.append("inline") is None, cleanup)
    assert ran == ["inline"] and len(deferred) == 3  # nothing ran inline


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[SandboxHost]:
    async with open_sandbox(tmp_path / "sandbox", store=BlobStore(tmp_path / "store")) as opened:
        for gate in (opened.inline, opened.inline_cleanup):
            gate.slow = gate.stall = float("inf")  # only the bounds decide
        yield opened


async def _nothing_left(host: SandboxHost) -> None:
    await trio.to_thread.run_sync(host.settle)
    assert [p.name for p in host.lease_dir.iterdir() if p.name.startswith("unit")] == []
    assert lease_holders(host.lease) == set()
    for root in host.cgroups.roots():
        assert not [p for p in root.iterdir() if p.is_dir()], list(root.iterdir())


async def test_a_finished_units_folders_and_cgroups_go_on_the_loop(
    host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops = count_hops(monkeypatch)
    for _ in range(6):
        outcome = await host.run(SandboxSpec(argv=("sh", "-c", "echo hi > $HOME/note")))
        assert outcome.ok, outcome.error
    assert hops["defer:Unit.remove"] == 0  # every unit removed inline
    await _nothing_left(host)


async def test_a_layout_the_command_changed_goes_whole_and_no_link_is_followed(
    host: SandboxHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An empty layout goes by one rmdir a folder (issue 22: walking it took ~45 system
    # calls a command); anything else in it is walked, never through a link.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"k")
    hops = count_hops(monkeypatch)
    for script in (
        f'rmdir "$HOME" && ln -s {outside} "$HOME"',  # the home a link out
        f'rmdir "$PWD" && ln -s {outside} "$PWD"',  # the workspace too
        'echo x > "$HOME/../stray"',  # a file beside the layout
        'echo x > "$TMPDIR/t" && rmdir "$HOME"',  # one folder holding a file, one gone
        "true",
    ):
        outcome = await host.run(SandboxSpec(argv=("sh", "-c", script)))
        assert outcome.ok, (script, outcome.error)
    assert hops["defer:Unit.remove"] == 0  # each small: removed inline
    assert [p.name for p in outside.iterdir()] == ["keep"]
    assert (outside / "keep").read_bytes() == b"k"
    await _nothing_left(host)


async def test_a_unit_that_left_many_files_is_removed_by_the_cleanup_thread(
    host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops = count_hops(monkeypatch)
    many = f'for n in $(seq {INLINE_FILES + 1}); do : > "$HOME/f$n"; done'
    outcome = await host.run(SandboxSpec(argv=("sh", "-c", many)))
    assert outcome.ok, outcome.error
    assert hops["defer:Unit.remove"] == 1
    await _nothing_left(host)


async def test_a_closed_gate_sends_every_removal_to_the_cleanup_thread(
    host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops = count_hops(monkeypatch)
    host.inline_cleanup = InlineGate()
    host.inline_cleanup.took(1.0, time.monotonic())  # a stall: closed for its pause
    for _ in range(3):
        assert (await host.run(SandboxSpec(argv=("true",)))).ok
    assert hops["defer:Unit.remove"] == 3
    assert hops["_prepare_and_spawn"] == 0  # the layouts' own gate stays open
    await _nothing_left(host)


async def test_slow_removals_close_the_cleanup_gate_alone(host: SandboxHost) -> None:
    # Issue 22: on a disk mounted with ``discard`` every rmdir waits for its folder's block
    # to be discarded (0.1-20 ms), where making folders does not wait; with one gate for
    # both, three slow removals sent every layout and spawn to threads for 30 s as well.
    host.inline_cleanup = InlineGate()  # timing decides again, as on a real host
    waited: list[float] = []

    def slow_removal() -> bool:
        time.sleep(host.inline_cleanup.stall * 2)  # waits, as an rmdir on such a disk
        waited.append(1.0)
        return True

    host.clean_soon(slow_removal, lambda: None)
    assert waited and not host.inline_cleanup.open(time.monotonic())
    assert host.inline.open(time.monotonic()) and host.inline.closings == 0
    host.clean_soon(slow_removal, lambda: None)  # now the cleanup thread's
    assert len(waited) == 1
