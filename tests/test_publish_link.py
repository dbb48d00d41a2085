"""Tree-atomic publish for a target that is a symlink to a version folder (``current ->
releases/v1``): the new version is built beside the current one, checked there, and the link
swapped in one rename; a reader that resolves the link once sees the old tree or the new
one, never a mix, never a temp name, and never a candidate its check rejected (found by
review: the per-path publish let readers see a mix of old and new files in 404 of 8,556
snapshots, the temp files in 632, and the candidate during a failing check)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from evolane.campaign._apply import ApplyJournal, ApplyOutcome, recover_apply
from evolane.campaign._target import target_tree
from evolane.inputs import CommandTemplate, InputError
from evolane.sandbox import SandboxHost
from evolane.store import BlobStore, snapshot_tree
from tests.campaign_helpers import apply_layout, toy_flags, with_flag, write_toy
from tests.test_publish_faithful import Sampler, entries, hidden, on_journal, write

EVOLANE = [sys.executable, "-m", "evolane"]


class Releases:
    """``app/current -> releases/v1``, v1 holding files, a subfolder, an empty folder, a
    symlink and a ``.git`` folder; a candidate that changes, adds and removes files."""

    def __init__(self, root: Path, store: BlobStore) -> None:
        self.store, self.run_dir = store, root / "run"
        self.app = root / "app"
        self.v1 = self.app / "releases" / "v1"
        write(self.v1 / "prompt.md", "old prompt\n", 0o640)
        write(self.v1 / "keep.md", "kept\n")
        write(self.v1 / "old.txt", "gone soon\n")
        write(self.v1 / "sub" / "z.md", "zed\n")
        write(self.v1 / ".git" / "HEAD", "ref: refs/heads/main\n")
        (self.v1 / "empty").mkdir()
        (self.v1 / "sub").chmod(0o555)  # read-only: the new version is filled before its mode
        os.symlink("keep.md", self.v1 / "alias.md")
        self.target = self.app / "current"
        os.symlink("releases/v1", self.target)
        self.parent = target_tree(store, self.target)
        self.candidate = self.edit(root / "work", self.v1, "new prompt\n")

    def edit(self, work: Path, base: Path, prompt: str) -> Any:
        """A candidate of ``base`` with ``prompt``, ``new/added.md`` and no ``old.txt``."""
        shutil.copytree(base, work, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        write(work / "prompt.md", prompt)
        write(work / "new" / "added.md", "added\n")
        (work / "old.txt").unlink(missing_ok=True)
        return snapshot_tree(self.store, work)

    def versions(self) -> list[str]:
        return sorted(os.listdir(self.app / "releases"))

    async def apply(self, host: SandboxHost, **extra: Any) -> ApplyOutcome:
        return await apply_layout(self, host, **({"policy": "auto_verified"} | extra))


@pytest.fixture
def releases(tmp_path: Path, store: BlobStore) -> Releases:
    return Releases(tmp_path, store)


def check(text: str) -> CommandTemplate:
    return CommandTemplate.parse(text, role="check", allowed=("candidate", "workspace"))


async def test_a_link_target_gets_a_new_version_folder_and_the_link_swapped(
    releases: Releases, host: SandboxHost
) -> None:
    before = entries(releases.v1)
    with trio.fail_after(60):
        outcome = await releases.apply(host, check=check("grep -q new {candidate}/prompt.md"))
    assert outcome.status == "applied", outcome.message
    (new,) = [name for name in releases.versions() if name != "v1"]
    assert new.startswith("v1.evolane-")
    assert os.readlink(releases.target) == f"releases/{new}"
    assert target_tree(releases.store, releases.target) == releases.candidate
    assert entries(releases.v1) == before  # the previous version is kept exactly
    folder = releases.app / "releases" / new
    assert (folder / ".git" / "HEAD").exists() and (folder / "empty").is_dir()
    assert (folder / "keep.md").stat().st_ino == (releases.v1 / "keep.md").stat().st_ino
    kept = {k: v for k, v in before.items() if k not in ("prompt.md", "old.txt")}
    assert {k: v for k, v in entries(folder).items() if k in kept} == kept  # modes, times
    assert (folder / "prompt.md").stat().st_mode & 0o777 == 0o640  # the target's bits
    assert hidden(releases.app) == []


async def test_the_check_reads_the_new_version_while_the_link_points_at_the_old(
    releases: Releases, host: SandboxHost
) -> None:
    link = releases.target
    script = f'test "$(readlink {link})" = releases/v1 && grep -q new {{candidate}}/prompt.md'
    with trio.fail_after(60):
        outcome = await releases.apply(host, check=check(f"sh -c '{script}'"))
    assert outcome.status == "applied", outcome.message


async def test_a_failing_check_never_moves_the_link(releases: Releases, host: SandboxHost) -> None:
    before = entries(releases.app)
    with trio.fail_after(60):
        outcome = await releases.apply(host, check=check("false"))
    assert outcome.status == "rolled_back" and outcome.check_exit_code == 1
    assert entries(releases.app) == before  # the link, v1, and no new version folder
    assert releases.versions() == ["v1"]


STEPS = [("started", True), ("started", False), ("staged", True), ("staged", False)]
STEPS += [("swapped", True), ("swapped", False)]


class Crash(BaseException):
    """A simulated crash: no cleanup code catches it."""


@pytest.mark.parametrize(("step", "written"), STEPS)
async def test_a_crash_at_each_step_is_undone_exactly(
    releases: Releases,
    host: SandboxHost,
    monkeypatch: pytest.MonkeyPatch,
    step: str,
    written: bool,
) -> None:
    from evolane.campaign import _apply

    before = entries(releases.app)
    real = _apply._write_journal

    def write_then_crash(path: Path, record: ApplyJournal) -> None:
        if record.state == step:
            if written:
                real(path, record)
            raise Crash(step)
        real(path, record)

    monkeypatch.setattr(_apply, "_write_journal", write_then_crash)
    with trio.fail_after(60), pytest.raises(Crash):
        await releases.apply(host)
    monkeypatch.undo()
    outcome = recover_apply(releases.store, releases.run_dir)
    if (step, written) == ("started", False):
        assert outcome is None
    else:
        assert outcome is not None and outcome.status == "recovered"
    assert entries(releases.app) == before  # the link, v1, and nothing else
    assert recover_apply(releases.store, releases.run_dir) is None


async def test_old_versions_are_bounded_to_the_previous_one(
    releases: Releases, host: SandboxHost, tmp_path: Path
) -> None:
    names = []
    parent = releases.parent
    for round_ in range(3):
        live = Path(os.path.realpath(releases.target))
        candidate = releases.edit(tmp_path / f"w{round_}", live, f"prompt {round_}\n")
        with trio.fail_after(60):
            outcome = await releases.apply(
                host, parent_ref=parent, candidate_ref=candidate, label=f"r{round_}"
            )
        assert outcome.status == "applied", outcome.message
        names.append(os.readlink(releases.target).removeprefix("releases/"))
        parent = candidate
    assert releases.versions() == sorted(["v1", names[1], names[2]])  # the user's v1 stays
    assert all(name.count(".evolane-") == 1 for name in names)


def _files(root: Path) -> dict[str, bytes]:
    return {
        os.path.relpath(os.path.join(folder, name), root): Path(folder, name).read_bytes()
        for folder, _, files in os.walk(root)
        for name in files
    }


async def test_a_reader_sees_the_old_tree_or_the_new_one_never_a_mix(
    releases: Releases, host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = _files(releases.v1)
    # each sample resolves the link once and reads the whole tree it points to
    with Sampler(lambda: _files(Path(os.path.realpath(releases.target)))) as reader:
        on_journal(monkeypatch, lambda _record: reader.await_samples(2))
        with trio.fail_after(60):
            outcome = await releases.apply(host, check=check("sh -c 'sleep 0.2'"))
    assert outcome.status == "applied", outcome.message
    new = _files(releases.target)
    kinds = {"old" if tree == old else "new" if tree == new else "other" for tree in reader.samples}
    assert kinds == {"old", "new"}


@pytest.mark.parametrize("kind", ["outside", "file", "chain", "dangling"])
def test_a_link_evolane_may_not_publish_through_is_refused(
    tmp_path: Path, store: BlobStore, kind: str
) -> None:
    app, elsewhere = tmp_path / "app", tmp_path / "elsewhere"
    write(elsewhere / "v1" / "a.md", "a\n")
    write(app / "releases" / "v1" / "a.md", "a\n")
    write(app / "releases" / "file.md", "a\n")
    os.symlink("v1", app / "releases" / "latest")
    text = {
        "outside": str(elsewhere / "v1"),
        "file": "releases/file.md",
        "chain": "releases/latest",
        "dangling": "releases/v9",
    }[kind]
    os.symlink(text, app / "current")
    with pytest.raises(InputError, match=r"^--target .*current: a symlink to "):
        target_tree(store, app / "current")


def test_the_cli_publishes_into_a_link_target_and_refuses_a_bad_link(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "fix:8"})
    releases = tmp_path / "app" / "releases"
    releases.mkdir(parents=True)
    paths["target"].rename(releases / "v1")
    link = tmp_path / "app" / "current"
    os.symlink("releases/v1", link)
    flags = toy_flags(paths | {"target": link}, paths["store"])
    flags = with_flag(with_flag(flags, "--iterations", "1"), "--population", "1")
    done = subprocess.run(
        [*EVOLANE, "optimize", *flags, "--apply", "auto_verified"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "apply (auto_verified): applied" in done.stdout, done.stdout
    assert os.readlink(link).startswith("releases/v1.evolane-")
    os.replace(link, tmp_path / "app" / "old-link")
    os.symlink(str(tmp_path / "elsewhere"), link)
    (tmp_path / "elsewhere").mkdir()
    bad = subprocess.run(
        [*EVOLANE, "optimize", *flags, "--apply", "auto_verified"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2, bad.stderr
    (line,) = bad.stderr.strip().splitlines()
    assert f"--target {link}: a symlink to " in line and "outside the link's folder" in line


def _save_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as an editor saves: a temp file renamed over it."""
    temp = path.with_name(f".{path.name}.swp")
    temp.write_text(text)
    os.replace(temp, path)


LIVE_EDITS = {
    "added": lambda v1: write(v1 / "added.md", "x\n"),
    "added-deep": lambda v1: write(v1 / ".git" / "refs" / "heads" / "topic", "abc\n"),
    "replaced": lambda v1: _save_atomically(v1 / "keep.md", "saved\n"),
    "removed": lambda v1: (v1 / "keep.md").unlink(),
    "folder-added": lambda v1: write(v1 / "new" / "mine.md", "mine\n"),
}


async def publish_editing_during_the_check(
    releases: Releases, host: SandboxHost, gate: Path, edit: Any
) -> ApplyOutcome:
    """Publish with a check that signals it runs (the new version is built), then waits
    until ``edit(v1)`` has been done to the live version."""
    gate.mkdir()
    gate.chmod(0o777)  # the check may run as a unit uid of its own
    started, go = gate / "started", gate / "go"
    wait = f"touch {started}; while ! test -e {go}; do sleep 0.05; done"

    async def edit_the_live_version() -> None:
        while not started.exists():
            await trio.sleep(0.05)
        edit(releases.v1)
        go.touch()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(edit_the_live_version)
            return await releases.apply(host, check=check(f"sh -c '{wait}'"))


@pytest.mark.parametrize("edit", sorted(LIVE_EDITS))
async def test_a_live_version_edited_during_the_check_is_not_swapped_away(
    releases: Releases, host: SandboxHost, tmp_path: Path, edit: str
) -> None:
    """Found by review: a file added to the live version, or replaced there by an atomic
    save, while the new version was built or checked was missing from it, so after the
    swap it vanished from ``current/`` (kept only in the previous folder)."""
    outcome = await publish_editing_during_the_check(
        releases, host, tmp_path / "gate", LIVE_EDITS[edit]
    )
    assert outcome.status == "refused", outcome.message
    assert "the target changed during the publish" in outcome.message, outcome.message
    assert os.readlink(releases.target) == "releases/v1"  # the link never moved
    assert releases.versions() == ["v1"] and hidden(releases.app) == []
    assert recover_apply(releases.store, releases.run_dir) is None
    if edit == "added":
        assert (releases.target / "added.md").read_text() == "x\n"
    if edit == "replaced":
        assert (releases.target / "keep.md").read_text() == "saved\n"


def _edit_in_place(v1: Path) -> None:
    with (v1 / "keep.md").open("r+") as file:
        file.write("KEPT\n")


@pytest.mark.parametrize("edit", [lambda v1: None, _edit_in_place], ids=["none", "in-place"])
async def test_an_unchanged_or_in_place_edited_live_version_is_published(
    releases: Releases, host: SandboxHost, tmp_path: Path, edit: Any
) -> None:
    """An untouched file edited in place is shared through the hard link: the swap goes on."""
    before = (releases.v1 / "keep.md").read_text()
    outcome = await publish_editing_during_the_check(releases, host, tmp_path / "gate", edit)
    assert outcome.status == "applied", outcome.message
    assert os.readlink(releases.target) != "releases/v1"
    kept = "KEPT\n" if edit is _edit_in_place else before
    assert (releases.target / "keep.md").read_text() == kept
    assert (releases.target / "new" / "added.md").read_text() == "added\n"
