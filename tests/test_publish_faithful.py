"""Faithful publish (issue 17 item 5): only the candidate's diff reaches the target, with the
target's modes, owners, times and empty folders kept; a concurrent edit is never
overwritten; a crash between swaps is undone exactly; readers never see half a file; and
one run at a time holds a target."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest
import trio

from evolane.campaign import RunRequest, _apply, run_campaign
from evolane.campaign._apply import ApplyJournal, ApplyOutcome, apply_candidate, recover_apply
from evolane.campaign._lock import lock_path, lock_target
from evolane.inputs import InputError
from evolane.sandbox import SandboxHost
from evolane.store import BlobStore, snapshot_tree
from tests.campaign_helpers import (
    apply_layout,
    shared_folder,
    toy_config,
    toy_flags,
    wait_for,
    write_toy,
)

EVOLANE = [sys.executable, "-m", "evolane"]
OTHER_UID = 12345
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")
Entry = tuple[object, ...]
T = TypeVar("T")


class Crash(BaseException):
    """A simulated crash: no cleanup code catches it."""


def write(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(mode)


def entries(root: Path) -> dict[str, Entry]:
    """Every entry under ``root``: kind and content, mode, owner and mtime."""

    def one(entry: Path) -> Entry:
        info = entry.lstat()
        if stat.S_ISLNK(info.st_mode):
            content: object = ("link", os.readlink(entry))
        elif stat.S_ISDIR(info.st_mode):
            content = ("folder",)
        else:
            content = entry.read_bytes()
        return (content, stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid, info.st_mtime_ns)

    found = {str(p.relative_to(root)): one(p) for p in sorted(root.rglob("*"))}
    return {".": one(root)} | found


class Site:
    """A target full of what a snapshot normalises or ignores, and a candidate of it that
    changes ``prompt.md`` (0600, owned by another uid), ``flip.sh`` (0640, made executable)
    and ``unx.sh`` (0700, made non-executable), adds ``new/deep/added.md``, removes
    ``old.txt``, and leaves the rest (among them an empty folder and a foreign file) alone."""

    def __init__(self, root: Path, store: BlobStore, *, foreign: bool) -> None:
        self.store, self.run_dir = store, root / "run"
        self.target = target = root / "site" / "skill"
        write(target / "prompt.md", "old prompt\n", 0o600)
        write(target / "keep600.txt", "secret\n", 0o600)
        write(target / "tool.sh", "#!/bin/sh\n", 0o750)
        write(target / "flip.sh", "echo flip\n", 0o640)
        write(target / "unx.sh", "echo unx\n", 0o700)
        write(target / "old.txt", "gone soon\n", 0o664)
        write(target / "sub" / "z.md", "zed\n")
        (target / "empty" / "nested").mkdir(parents=True)
        (target / "empty").chmod(0o700)
        if foreign:
            write(target / "theirs.txt", "not mine\n", 0o640)
            os.chown(target / "theirs.txt", OTHER_UID, OTHER_UID)
            os.chown(target / "prompt.md", OTHER_UID, OTHER_UID)
        self.parent = snapshot_tree(store, target)
        work = root / "work"
        shutil.copytree(target, work, symlinks=True)
        write(work / "prompt.md", "new prompt\n")
        (work / "flip.sh").chmod(0o755)
        (work / "unx.sh").chmod(0o644)
        write(work / "new" / "deep" / "added.md", "added\n")
        (work / "old.txt").unlink()
        write(work / "sub" / "z.md", "zed 2\n")
        self.candidate = snapshot_tree(store, work)

    async def apply(self, host: SandboxHost, **extra: Any) -> ApplyOutcome:
        return await apply_layout(self, host, **({"policy": "auto_verified"} | extra))


TOUCHED = {"prompt.md", "flip.sh", "unx.sh", "old.txt", "sub/z.md", "new", "new/deep"}
TOUCHED |= {"new/deep/added.md"}
FOLDERS_CHANGED = {".", "sub"}  # folders whose entries a publish renames (their mtime moves)


def hidden(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.startswith("."))


def on_journal(monkeypatch: pytest.MonkeyPatch, hook: Any) -> None:
    """Call ``hook(record)`` after each apply journal write."""
    real = _apply._write_journal

    def write_then_hook(path: Path, record: ApplyJournal) -> None:
        real(path, record)
        hook(record)

    monkeypatch.setattr(_apply, "_write_journal", write_then_hook)


# -- what a publish keeps ----------------------------------------------------------------


@pytest.mark.parametrize("foreign", [pytest.param(True, marks=as_root), False])
async def test_a_publish_changes_only_the_diff_and_keeps_modes_owners_times_and_folders(
    tmp_path: Path, store: BlobStore, host: SandboxHost, foreign: bool
) -> None:
    site = Site(tmp_path, store, foreign=foreign)
    before = entries(site.target)
    with trio.fail_after(30):
        outcome = await site.apply(host)
    assert outcome.status == "applied", outcome.message
    after = entries(site.target)
    untouched = set(before) - TOUCHED - FOLDERS_CHANGED
    assert {name: after[name] for name in untouched} == {name: before[name] for name in untouched}
    assert "empty/nested" in after and after["empty"][1] == 0o700  # empty folders stay
    assert "old.txt" not in after  # removed
    assert after["prompt.md"][:4] == (b"new prompt\n", 0o600, *before["prompt.md"][2:4])
    assert after["flip.sh"][:2] == (b"echo flip\n", 0o750)  # +x where the target had r
    assert after["unx.sh"][:2] == (b"echo unx\n", 0o600)  # every x gone, the rest kept
    assert after["sub/z.md"][:2] == (b"zed 2\n", 0o644)
    assert after["new/deep/added.md"][:2] == (b"added\n", 0o644)
    if foreign:
        assert after["theirs.txt"][2:4] == (OTHER_UID, OTHER_UID)
        assert after["prompt.md"][2:4] == (OTHER_UID, OTHER_UID)  # a changed file keeps its owner
    assert hidden(site.target.parent) == [] and hidden(site.target) == []
    assert snapshot_tree(store, site.target) == site.candidate


async def test_an_edit_of_an_untouched_file_does_not_block_the_publish_and_stays(
    tmp_path: Path, store: BlobStore, host: SandboxHost
) -> None:
    site = Site(tmp_path, store, foreign=False)
    write(site.target / "keep600.txt", "the user's edit\n", 0o600)
    with trio.fail_after(30):
        outcome = await site.apply(host)
    assert outcome.status == "applied", outcome.message
    assert (site.target / "keep600.txt").read_text() == "the user's edit\n"
    assert (site.target / "prompt.md").read_text() == "new prompt\n"


# -- concurrent edits ---------------------------------------------------------------------


async def test_a_concurrent_edit_of_a_touched_file_refuses_the_publish(
    tmp_path: Path, store: BlobStore, host: SandboxHost
) -> None:
    site = Site(tmp_path, store, foreign=False)
    write(site.target / "sub" / "z.md", "the user's edit\n")  # after the run began
    before = entries(site.target)
    with trio.fail_after(30):
        outcome = await site.apply(host)
    assert outcome.status == "refused"
    assert "'sub/z.md' changed in the target since the run began" in outcome.message
    assert entries(site.target) == before
    assert not (site.run_dir / "apply.json").exists()


@pytest.mark.parametrize("kind", ["file", "symlink"])
async def test_a_candidate_that_makes_a_file_or_link_a_folder_is_refused_as_its_doing(
    tmp_path: Path, store: BlobStore, host: SandboxHost, kind: str
) -> None:
    """Found by review: the refusal said the target changed since the run began (it had not:
    the candidate replaced the parent's ``cfg`` with a folder)."""
    site = Site(tmp_path, store, foreign=False)
    work = tmp_path / "work2"
    shutil.copytree(site.target, work, symlinks=True)
    for root in (site.target, work):
        if kind == "file":
            write(root / "cfg", "a file\n")
        else:
            (root / "cfg").symlink_to("sub")
    site.parent = snapshot_tree(store, site.target)
    (work / "cfg").unlink()
    write(work / "cfg" / "a.md", "now a folder\n")
    site.candidate = snapshot_tree(store, work)
    before = entries(site.target)
    with trio.fail_after(30):
        outcome = await site.apply(host)
    assert outcome.status == "refused", outcome.message
    assert "the candidate replaces 'cfg'" in outcome.message, outcome.message
    assert "since the run began" not in outcome.message, outcome.message
    assert entries(site.target) == before


async def test_an_edit_during_the_publish_refuses_it_and_undoes_the_paths_already_swapped(
    tmp_path: Path, store: BlobStore, host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = Site(tmp_path, store, foreign=False)
    before = entries(site.target)

    def edit_once_staged(record: ApplyJournal) -> None:
        if record.state == "swapping" and record.done == 2:  # sub/z.md is swapped 5th of 6
            write(site.target / "sub" / "z.md", "the user's edit\n")

    on_journal(monkeypatch, edit_once_staged)
    with trio.fail_after(30):
        outcome = await site.apply(host)
    assert outcome.status == "refused", outcome.message
    assert "'sub/z.md' was changed in the target during the publish" in outcome.message
    after = entries(site.target)
    assert after.pop("sub/z.md")[0] == b"the user's edit\n"  # theirs stays
    expected = {k: v for k, v in before.items() if k not in ("sub/z.md", "sub")}
    assert {k: v for k, v in after.items() if k != "sub"} == expected  # the rest undone exactly
    assert hidden(site.target.parent) == [] and hidden(site.target) == []


# -- crashes ------------------------------------------------------------------------------


def crash_at(monkeypatch: pytest.MonkeyPatch, state: str, done: int, *, written: bool) -> None:
    """Crash when the journal reaches ``state`` with ``done`` paths swapped."""
    real = _apply._write_journal

    def write_then_crash(path: Path, record: ApplyJournal) -> None:
        if record.state == state and record.done == done:
            if written:
                real(path, record)
            raise Crash(f"{state} {done}")
        real(path, record)

    monkeypatch.setattr(_apply, "_write_journal", write_then_crash)


# The site's diff touches 6 paths: a crash after each step and each swap, recorded or not.
STEPS = [
    *(("started", 0), ("backed_up", 0), ("staged", 0)),
    *[("swapping", n) for n in range(1, 7)],
    ("swapped", 6),
]


@as_root
@pytest.mark.parametrize(("state", "done"), STEPS)
@pytest.mark.parametrize("written", [True, False])
async def test_a_crash_at_each_step_is_undone_exactly_on_the_next_start(
    tmp_path: Path,
    store: BlobStore,
    host: SandboxHost,
    monkeypatch: pytest.MonkeyPatch,
    state: str,
    done: int,
    written: bool,
) -> None:
    site = Site(tmp_path, store, foreign=True)
    before = entries(site.target)
    crash_at(monkeypatch, state, done, written=written)
    with trio.fail_after(30), pytest.raises(Crash):
        await site.apply(host)
    monkeypatch.undo()
    outcome = recover_apply(store, site.run_dir)
    if (state, written) == ("started", False):  # died before its first write: nothing to undo
        assert outcome is None
    else:
        assert outcome is not None and outcome.status == "recovered"
    assert entries(site.target) == before  # content, modes, owners, mtimes, folders
    assert hidden(site.target.parent) == [] and hidden(site.target) == []
    assert recover_apply(store, site.run_dir) is None


# -- readers ------------------------------------------------------------------------------


class Sampler(Generic[T]):
    """Takes a sample over and over in a thread (a live agent reading the target while a
    publish runs), keeping every sample; ``with`` stops and joins it."""

    def __init__(self, sample: Callable[[], T]) -> None:
        self.sample, self.samples = sample, list[T]()
        self.stop = threading.Event()
        self.more = threading.Condition()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler[T]:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)

    def _loop(self) -> None:
        while not self.stop.is_set():
            taken = self.sample()
            with self.more:
                self.samples.append(taken)
                self.more.notify_all()

    def await_samples(self, count: int) -> None:
        """Block until ``count`` more samples have been taken."""
        with self.more:
            wanted = len(self.samples) + count
            assert self.more.wait_for(lambda: len(self.samples) >= wanted, timeout=30)


async def test_a_reader_sees_the_old_or_the_new_file_never_part_of_one(
    tmp_path: Path, store: BlobStore, host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "big"
    old, new = b"a" * (4 << 20), b"b" * (6 << 20)
    write(target / "data.bin", old)
    parent = snapshot_tree(store, target)
    work = tmp_path / "work"
    write(work / "data.bin", new)
    candidate = snapshot_tree(store, work)
    with Sampler((target / "data.bin").read_bytes) as reader:  # a missing file would raise
        on_journal(monkeypatch, lambda _record: reader.await_samples(3))  # between all steps
        with trio.fail_after(60):
            outcome = await apply_candidate(
                policy="auto_verified",
                store=store,
                host=host,
                target=target,
                parent_ref=parent,
                candidate_ref=candidate,
                run_dir=tmp_path / "run",
            )
    assert outcome.status == "applied", outcome.message
    assert set(reader.samples) == {old, new}


# -- one run per target -------------------------------------------------------------------


def test_the_lock_names_its_holder_and_is_gone_once_released(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    held = lock_target(target, "r-first")
    assert held.path == tmp_path / ".target.evolane-lock" == lock_path(target)
    with pytest.raises(InputError) as refused:
        lock_target(tmp_path / "." / "target")  # the same resolved path
    assert str(refused.value) == (
        f"target {target} is locked by run r-first (pid {os.getpid()}); wait for it to end "
        "(or stop it), then start again"
    )
    assert os.listdir(target) == []  # nothing inside the target
    held.release()
    assert not held.path.exists()
    lock_target(target, "r-second").release()


DIE_HOLDING = """
import os, sys
from pathlib import Path
from evolane.campaign._lock import lock_target
lock_target(Path(sys.argv[1]), "r-dead")
os._exit(0)
"""


def test_a_lock_left_by_a_dead_holder_does_not_block(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    died = subprocess.run([sys.executable, "-c", DIE_HOLDING, str(target)], timeout=60)
    assert died.returncode == 0
    assert lock_path(target).exists()  # the file stays; its flock went with the process
    lock_target(target, "r-alive").release()


async def test_a_run_on_a_locked_target_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"default": "noop"})
    config = toy_config(paths, iterations=1, population=1)
    held = lock_target(paths["target"], "r-other")
    try:
        with trio.fail_after(60):
            for resume in (None, "r-resumed"):  # --resume takes the lock too
                with pytest.raises(InputError, match=r"is locked by run r-other \(pid"):
                    await run_campaign(RunRequest(config, resume_run=resume))
            assert not paths["store"].exists()
            dry = await run_campaign(RunRequest(config, dry_run=True))  # a dry run takes none
            assert dry.report is None
    finally:
        held.release()
    with trio.fail_after(120):
        outcome = await run_campaign(RunRequest(config))
    assert outcome.report is not None and outcome.report.status == "finished"
    assert not lock_path(paths["target"]).exists()


def _blocking_replay(root: Path, release: Path, started: Path) -> str:
    script = root / "replay.sh"
    script.write_text(
        textwrap.dedent(
            f"""\
            touch {started}
            while [ ! -e {release} ]; do sleep 0.05; done
            cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"
            """
        )
    )
    return f"sh {script} {{candidate}} {{output_dir}}"


def _flags(paths: dict[str, Path], store: Path, replay: str) -> list[str]:
    flags = toy_flags(paths, store)
    for name, value in (("--replay", replay), ("--iterations", "1"), ("--population", "1")):
        flags[flags.index(name) + 1] = value
    return [*flags, "--isolation", "process"]


def test_a_second_optimize_on_the_same_target_exits_2_naming_the_first_run(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"default": "noop"})
    signals = shared_folder(tmp_path / "signals")
    release, started = signals / "release", signals / "started"
    replay = _blocking_replay(tmp_path, release, started)
    first = subprocess.Popen(
        [*EVOLANE, "optimize", *_flags(paths, paths["store"], replay)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(started, first, "the first run replayed")
        (run_dir,) = (paths["store"] / "runs").iterdir()
        other_store = tmp_path / "other-store"  # a lock on the target, whatever the store
        second = subprocess.run(
            [*EVOLANE, "optimize", *_flags(paths, other_store, replay)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 2, second.stderr
        (line,) = second.stderr.strip().splitlines()
        assert f"target {paths['target']} is locked by run {run_dir.name}" in line
        assert f"(pid {first.pid})" in line
        assert not (other_store / "runs").exists()
        dry = subprocess.run(
            [*EVOLANE, "optimize", *_flags(paths, other_store, replay), "--dry-run"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert dry.returncode == 0, dry.stderr  # a dry run takes no lock
        release.touch()
        _, err = first.communicate(timeout=120)
        assert first.returncode == 0, err
    finally:
        release.touch()
        if first.poll() is None:
            first.kill()
        first.wait()
    assert not lock_path(paths["target"]).exists()


async def test_a_journal_ended_under_the_whole_folder_publish_is_nothing_pending(
    tmp_path: Path, store: BlobStore, host: SandboxHost
) -> None:
    site = Site(tmp_path, store, foreign=False)
    site.run_dir.mkdir()
    legacy = {  # as earlier versions wrote it once committed
        "state": "committed",
        "kind": "dir",
        "target": str(site.target),
        "old_path": f"{site.target}-old",
        "new_path": f"{site.target}-new",
        "trash_path": f"{site.target}-trash",
        "backup_ref": site.parent.model_dump(),
        "candidate_ref": site.candidate.model_dump(),
        "parent_ref": site.parent.model_dump(),
        "label": "best",
        "proposal_dir": str(site.run_dir),
        "updated": "2025-01-01T00:00:00.000+00:00",
    }
    (site.run_dir / "apply.json").write_text(json.dumps(legacy))
    assert recover_apply(store, site.run_dir) is None
    assert _apply.journal_state(site.run_dir / "apply.json") == ("committed", site.candidate)
    with trio.fail_after(30):
        outcome = await site.apply(host)
    assert outcome.status == "applied", outcome.message


def _refused_beside(monkeypatch: pytest.MonkeyPatch, runtime: Path) -> None:
    """The target's folder refuses the lock file (as a read-only one does): the per-user
    fallback under ``runtime`` is used."""
    from evolane.campaign import _lock

    real = _lock._take

    def take(target: Path, path: Path, run_id: str | None = None) -> object:
        if path == _lock.lock_path(target):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real(target, path, run_id)

    monkeypatch.setattr(_lock, "_take", take)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))


def test_the_fallback_lock_folder_is_made_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _refused_beside(monkeypatch, tmp_path / "runtime")
    (tmp_path / "target").mkdir()
    lock_target(tmp_path / "target", "r-first").release()
    mine = tmp_path / "runtime" / f"evolane-{os.getuid()}"
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700
    assert stat.S_IMODE((mine / "locks").stat().st_mode) == 0o700


@pytest.mark.parametrize("made", ["open to all", "another user's", "a symlink"])
def test_a_fallback_lock_folder_someone_else_could_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, made: str
) -> None:
    """Found by hostile review: in a shared temp folder a command's unit uid could make
    ``evolane-0`` first, then remove or hold every root run's lock there (two runs
    publishing to one target, or none)."""
    _refused_beside(monkeypatch, tmp_path / "runtime")
    (tmp_path / "target").mkdir()
    mine = tmp_path / "runtime" / f"evolane-{os.getuid()}"
    mine.parent.mkdir()
    if made == "a symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        mine.symlink_to(tmp_path / "elsewhere")
    else:
        mine.mkdir()
        mine.chmod(0o777)  # mkdir's mode goes through the umask
        if made == "another user's":
            if os.geteuid() != 0:
                pytest.skip("needs root to give the folder to another uid")
            mine.chmod(0o700)
            os.chown(mine, 65534, 65534)
    with pytest.raises(InputError, match="per-user lock folder is not this user's own"):
        lock_target(tmp_path / "target", "r-first")
    assert not (mine / "locks").exists()
