"""Apply policies: proposal artifacts, verified keep, journaled publish, rollback, recovery."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import stat
import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from evolane.campaign import _apply, _diff, _publish
from evolane.campaign._apply import ApplyJournal, ApplyOutcome, recover_apply
from evolane.campaign._target import target_tree
from evolane.inputs import CommandTemplate, InputError, TemplateError
from evolane.messages import ArtifactRef, unbounded_fields
from evolane.sandbox import SandboxHost, SandboxSpec
from evolane.store import BlobStore, CorruptBlobError, load_manifest, snapshot_tree
from tests.campaign_helpers import apply_layout

CHECK_NAMES = ("candidate", "workspace")
State = dict[str, tuple[object, ...]]


class Crash(BaseException):
    """A simulated crash: no cleanup code catches it."""


def write(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(mode)


def make_target(root: Path) -> Path:
    target = root / "site" / "prompts"
    write(target / "prompt.md", "line one\nline two\n")
    write(target / "sub" / "notes.txt", "keep\n")
    write(target / "old.txt", "gone soon\n")
    write(target / "blob.bin", b"\x00\x01\x02")
    write(target / "run.sh", "#!/bin/sh\necho hi\n", 0o755)
    os.symlink("prompt.md", target / "link.md")
    return target


def make_candidate(store: BlobStore, target: Path, work: Path) -> ArtifactRef:
    shutil.copytree(target, work, symlinks=True)
    write(work / "prompt.md", "line one\nline 2\n")
    write(work / "new.md", "brand new")  # no trailing newline
    (work / "old.txt").unlink()
    write(work / "blob.bin", b"\x00\x09")
    return snapshot_tree(store, work)


def state(path: Path) -> State:
    """Every entry's kind, content, mode and mtime: equal states mean an untouched target."""

    def one(entry: Path) -> tuple[object, ...]:
        info = entry.lstat()
        if stat.S_ISLNK(info.st_mode):
            content: object = os.readlink(entry)
        elif stat.S_ISDIR(info.st_mode):
            content = None
        else:
            content = entry.read_bytes()
        return (content, stat.S_IMODE(info.st_mode), info.st_mtime_ns)

    if not path.is_dir():
        return {".": one(path)}
    return {".": one(path)} | {str(p.relative_to(path)): one(p) for p in sorted(path.rglob("*"))}


def hidden(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.startswith("."))


def journal(run_dir: Path) -> ApplyJournal:
    return ApplyJournal.model_validate(orjson.loads((run_dir / "apply.json").read_bytes()))


def touched(setup: Setup) -> dict[str, object]:
    """The parent's entries of the paths the candidate changes or removes."""
    parent = load_manifest(setup.store, setup.parent)
    return {path: parent[path] for path in ("blob.bin", "old.txt", "prompt.md")}


def check(text: str) -> CommandTemplate:
    return CommandTemplate.parse(text, role="check", allowed=CHECK_NAMES)


class Setup:
    """A directory target, its parent tree and an edited candidate."""

    def __init__(self, root: Path, store: BlobStore) -> None:
        self.store, self.run_dir = store, root / "run"
        self.target = make_target(root)
        self.parent = target_tree(store, self.target)
        self.candidate = make_candidate(store, self.target, root / "work")

    async def apply(self, host: SandboxHost, policy: Any, **extra: Any) -> ApplyOutcome:
        return await apply_layout(self, host, policy=policy, **extra)


@pytest.fixture
def setup(tmp_path: Path, store: BlobStore) -> Setup:
    return Setup(tmp_path, store)


def crash_at(monkeypatch: pytest.MonkeyPatch, state_name: str, *, written: bool) -> None:
    """Crash when the journal reaches ``state_name``: after recording it, or just before."""
    real = _apply._write_journal

    def write_then_crash(path: Path, record: ApplyJournal) -> None:
        if record.state == state_name:
            if written:
                real(path, record)
            raise Crash(state_name)
        real(path, record)

    monkeypatch.setattr(_apply, "_write_journal", write_then_crash)


# -- target_tree and the proposal artifacts -------------------------------------------------


def test_target_tree_of_a_file_holds_exactly_that_file(tmp_path: Path, store: BlobStore) -> None:
    write(tmp_path / "x.md", "hello\n", 0o755)
    manifest = load_manifest(store, target_tree(store, tmp_path / "x.md"))
    assert list(manifest) == ["x.md"]
    assert store.read_bytes(manifest["x.md"].ref) == b"hello\n"  # type: ignore[union-attr]
    target = make_target(tmp_path)
    assert target_tree(store, target) == snapshot_tree(store, target)
    with pytest.raises(InputError, match="missing: no such file"):
        target_tree(store, tmp_path / "missing")
    with pytest.raises(InputError, match="/dev/null: not a regular file or a directory"):
        target_tree(store, Path("/dev/null"))


def test_the_diff_names_binaries_modes_symlinks_and_empty_files(
    tmp_path: Path, store: BlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    write(old / "tool.bin", b"\x00bin")
    write(new / "tool.bin", b"\x00bin", 0o755)
    write(old / "big.txt", "a\n" * 40)
    write(new / "big.txt", "b\n" * 40)
    os.symlink("x", old / "link")
    os.symlink("y", new / "link")
    write(new / "empty", b"")
    monkeypatch.setattr(_diff, "MAX_DIFF_FILE_BYTES", 64)
    diff = _diff.unified_tree_diff(
        store, snapshot_tree(store, old), snapshot_tree(store, new)
    ).decode()
    assert diff.splitlines() == [
        "Binary files a/big.txt and b/big.txt differ",
        "Empty file added: b/empty",
        "Symbolic link a/link -> x",
        "Symbolic link b/link -> y",
        "Mode of tool.bin changed from 644 to 755",
    ]


def test_outcome_is_bounded() -> None:
    assert unbounded_fields(ApplyOutcome) == []


async def test_proposal_writes_artifacts_and_never_touches_the_target(
    setup: Setup, host: SandboxHost
) -> None:
    with trio.fail_after(30):
        before, siblings = state(setup.target), sorted(os.listdir(setup.target.parent))
        outcome = await setup.apply(host, "proposal")
    assert outcome.status == "proposed" and outcome.policy == "proposal"
    assert state(setup.target) == before
    assert sorted(os.listdir(setup.target.parent)) == siblings
    assert not (setup.run_dir / "apply.json").exists()
    proposal = setup.run_dir / "proposals" / "best"
    assert outcome.proposal_dir == str(proposal)
    assert sorted(os.listdir(proposal)) == ["candidate", "changes.diff", "proposal.json"]
    assert hidden(proposal.parent) == []
    assert snapshot_tree(setup.store, proposal / "candidate") == setup.candidate
    assert os.stat(proposal / "candidate" / "prompt.md").st_mode & 0o200  # an ordinary copy
    diff = (proposal / "changes.diff").read_text()
    assert outcome.diff_ref is not None
    assert setup.store.read_bytes(outcome.diff_ref) == diff.encode()
    assert "--- a/prompt.md\n+++ b/prompt.md\n" in diff
    assert "-line two\n+line 2\n" in diff
    assert "--- a/old.txt\n+++ b/old.txt\n" in diff and "-gone soon\n" in diff
    assert "+brand new\n\\ No newline at end of file\n" in diff
    assert "Binary files a/blob.bin and b/blob.bin differ\n" in diff
    assert "notes.txt" not in diff and "run.sh" not in diff
    record = orjson.loads((proposal / "proposal.json").read_bytes())
    assert record["policy"] == "proposal" and record["label"] == "best"
    assert record["digests"] == {
        "parent": setup.parent.digest,
        "candidate": setup.candidate.digest,
        "diff": outcome.diff_ref.digest,
    }
    assert record["changes"] == {
        "added": ["new.md"],
        "removed": ["old.txt"],
        "changed": ["blob.bin", "prompt.md"],
    }
    assert record["created"]


async def test_the_diff_patches_the_parent_into_the_candidate_text(
    setup: Setup, host: SandboxHost
) -> None:
    with trio.fail_after(30):
        await setup.apply(host, "proposal")
        copy = host.lease_dir / "patched"
        shutil.copytree(setup.target, copy, symlinks=True)
        diff = setup.run_dir / "proposals" / "best" / "changes.diff"
        spec = SandboxSpec(argv=("patch", "-p1", "-E", "-s", "-i", str(diff)), workspace=str(copy))
        outcome = await host.run(spec, timeout=20)
    assert outcome.ok, outcome.stderr.text()
    assert (copy / "prompt.md").read_text() == "line one\nline 2\n"
    assert (copy / "new.md").read_text() == "brand new"
    assert not (copy / "old.txt").exists()


async def test_a_new_proposal_with_the_same_label_replaces_the_old_one(
    setup: Setup, host: SandboxHost, tmp_path: Path
) -> None:
    with trio.fail_after(30):
        await setup.apply(host, "proposal")
        write(tmp_path / "work" / "prompt.md", "third\n")
        second = snapshot_tree(setup.store, tmp_path / "work")
        await setup.apply(host, "proposal", candidate_ref=second)
    proposal = setup.run_dir / "proposals" / "best"
    assert snapshot_tree(setup.store, proposal / "candidate") == second
    assert "+third\n" in (proposal / "changes.diff").read_text()
    assert hidden(proposal.parent) == []


async def test_verified_only_keeps_the_candidate_and_never_touches_the_target(
    setup: Setup, host: SandboxHost
) -> None:
    with trio.fail_after(30):
        before = state(setup.target)
        outcome = await setup.apply(host, "verified_only")
    assert outcome.status == "kept" and outcome.backup_ref is None
    assert state(setup.target) == before
    assert not (setup.run_dir / "apply.json").exists()
    assert (setup.run_dir / "proposals" / "best" / "proposal.json").exists()


async def test_a_corrupt_candidate_raises_and_leaves_no_proposal(
    setup: Setup, host: SandboxHost
) -> None:
    entry = load_manifest(setup.store, setup.candidate)["new.md"]
    blob = setup.store.path_of(entry.digest)  # type: ignore[union-attr]
    blob.chmod(0o644)
    blob.write_bytes(b"brand NEW")
    before = state(setup.target)
    with trio.fail_after(30), pytest.raises(CorruptBlobError):
        await setup.apply(host, "verified_only")
    assert state(setup.target) == before
    assert os.listdir(setup.run_dir / "proposals") == []


async def test_bad_inputs_are_refused_before_anything_is_written(
    setup: Setup, host: SandboxHost
) -> None:
    seeded = CommandTemplate.parse("true {seed}", role="check", allowed=("seed",))
    with trio.fail_after(30):
        with pytest.raises(TemplateError):
            await setup.apply(host, "auto_verified", check=seeded)
        with pytest.raises(ValueError, match="label"):
            await setup.apply(host, "proposal", label="../escape")
        with pytest.raises(ValueError, match="policy"):
            await setup.apply(host, "yolo")
    assert not setup.run_dir.exists()


# -- auto_verified --------------------------------------------------------------------------


async def test_auto_verified_publishes_a_candidate_that_passes_its_check(
    setup: Setup, host: SandboxHost
) -> None:
    probe = "test -f {candidate}/new.md && test ! -e {candidate}/old.txt && touch {workspace}/ok"
    with trio.fail_after(30):
        outcome = await setup.apply(host, "auto_verified", check=check(f"sh -c '{probe}'"))
    assert outcome.status == "applied", outcome.message
    assert outcome.check_exit_code == 0
    assert target_tree(setup.store, setup.target) == setup.candidate
    assert outcome.backup_ref is not None
    assert dict(load_manifest(setup.store, outcome.backup_ref)) == touched(setup)
    assert os.stat(setup.target / "prompt.md").st_mode & 0o777 == 0o644
    assert os.stat(setup.target / "run.sh").st_mode & 0o777 == 0o755
    assert os.readlink(setup.target / "link.md") == "prompt.md"
    assert journal(setup.run_dir).state == "committed"
    assert hidden(setup.target.parent) == []
    assert (setup.run_dir / "proposals" / "best" / "proposal.json").exists()
    assert recover_apply(setup.store, setup.run_dir) is None


async def test_a_failing_check_rolls_back_to_exactly_the_old_tree(
    setup: Setup, host: SandboxHost
) -> None:
    failing = check("sh -c 'test -f {candidate}/new.md && echo \"no good\" >&2 && exit 3'")
    with trio.fail_after(30):
        before = state(setup.target)
        outcome = await setup.apply(host, "auto_verified", check=failing)
    assert outcome.status == "rolled_back"
    assert outcome.check_exit_code == 3
    assert "exit code 3" in outcome.message and "no good" in outcome.message
    assert state(setup.target) == before
    assert journal(setup.run_dir).state == "rolled_back"
    assert hidden(setup.target.parent) == []
    assert recover_apply(setup.store, setup.run_dir) is None


async def test_a_check_that_times_out_rolls_back(setup: Setup, host: SandboxHost) -> None:
    with trio.fail_after(30):
        before = state(setup.target)
        outcome = await setup.apply(
            host, "auto_verified", check=check("sleep 30"), check_timeout=0.5, kill_grace=0.2
        )
    assert outcome.status == "rolled_back" and "timed out" in outcome.message
    assert outcome.check_exit_code is None
    assert state(setup.target) == before


async def test_a_target_edited_during_the_campaign_is_refused(
    setup: Setup, host: SandboxHost
) -> None:
    write(setup.target / "prompt.md", "someone else's edit\n")
    with trio.fail_after(30):
        before = state(setup.target)
        outcome = await setup.apply(host, "auto_verified", check=check("true"))
    assert outcome.status == "refused" and "changed" in outcome.message
    assert "'prompt.md'" in outcome.message and outcome.backup_ref is None
    assert state(setup.target) == before
    assert not (setup.run_dir / "apply.json").exists()
    assert hidden(setup.target.parent) == []


async def test_cancellation_during_the_check_leaves_the_old_tree(
    setup: Setup, host: SandboxHost
) -> None:
    with trio.fail_after(30):
        before = state(setup.target)
        with trio.move_on_after(1.0) as scope:
            await setup.apply(host, "auto_verified", check=check("sleep 30"), check_timeout=60)
    assert scope.cancelled_caught
    assert state(setup.target) == before
    assert journal(setup.run_dir).state == "rolled_back"
    assert hidden(setup.target.parent) == []


async def test_cancellation_mid_swap_still_finishes_the_swap_then_rolls_back(
    setup: Setup, host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _apply._write_journal
    seen: list[tuple[str, bool]] = []
    scope = trio.CancelScope()

    def cancel_midway(path: Path, record: ApplyJournal) -> None:
        real(path, record)
        if record.state == "swapping" and record.done == 1:
            trio.from_thread.run_sync(scope.cancel)
        seen.append((record.state, setup.target.exists()))

    monkeypatch.setattr(_apply, "_write_journal", cancel_midway)
    with trio.fail_after(30):
        before = state(setup.target)
        with scope:
            await setup.apply(host, "auto_verified", check=check("true"))
    assert scope.cancelled_caught
    assert [name for name, _ in seen] == [
        *("started", "backed_up", "staged", *["swapping"] * 4, "swapped"),
        *("rolling_back", "rolled_back"),
    ]
    assert state(setup.target) == before
    assert hidden(setup.target.parent) == []


def full_store_from(monkeypatch: pytest.MonkeyPatch, done: int, *, once: bool) -> None:
    """The apply journal cannot be written from its ``swapping`` record ``done`` on (a full
    store): once, or every write after it too."""
    real, failed = _apply._write_journal, []

    def full(path: Path, record: ApplyJournal) -> None:
        if (record.state == "swapping" and record.done == done) or (failed and not once):
            failed.append(record.state)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, record)

    monkeypatch.setattr(_apply, "_write_journal", full)


async def _publish_into_a_full_store(
    setup: Setup, host: SandboxHost, monkeypatch: pytest.MonkeyPatch, *, once: bool
) -> None:
    """A publish whose 3rd apply.json write (``once``) or every one from it fails with
    ENOSPC: it raises, and the target is as it was, nothing left beside it."""
    full_store_from(monkeypatch, 2, once=once)
    with trio.fail_after(30):
        before = state(setup.target)
        with pytest.raises(OSError, match="No space left"):
            await setup.apply(host, "auto_verified", check=check("true"))
    assert state(setup.target) == before
    assert hidden(setup.target.parent) == []


async def test_a_store_full_mid_publish_still_restores_the_target(
    setup: Setup, host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by crash-point enumeration (ENOSPC on every write from the 3rd apply.json on):
    the rollback's own journal record failed first, so the target stayed half published
    (and the stash and temps beside it) until the next run in the store recovered it."""
    await _publish_into_a_full_store(setup, host, monkeypatch, once=False)


async def test_a_store_refusing_one_write_mid_publish_undoes_it_and_raises(
    setup: Setup, host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by crash-point enumeration (ENOSPC once, at the 3rd write of apply.json): the
    publish was rolled back and the run ended complete (exit 0), though the README says a
    run that cannot write its store ends failed; its campaign, complete, could never publish
    the best. Now the error is raised once the target is restored (the run fails, and
    ``--resume-campaign`` publishes)."""
    await _publish_into_a_full_store(setup, host, monkeypatch, once=True)
    assert journal(setup.run_dir).state == "rolled_back"


async def test_a_pending_journal_blocks_a_new_apply_until_recovered(
    setup: Setup, host: SandboxHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    crash_at(monkeypatch, "swapped", written=True)
    with trio.fail_after(30):
        with pytest.raises(Crash):
            await setup.apply(host, "auto_verified")
        monkeypatch.undo()
        blocked = await setup.apply(host, "auto_verified")
        assert blocked.status == "refused" and "recover_apply" in blocked.message
        assert target_tree(setup.store, setup.target) == setup.candidate  # not touched again
        assert recover_apply(setup.store, setup.run_dir) is not None
        again = await setup.apply(host, "auto_verified")
    assert again.status == "applied"
    assert target_tree(setup.store, setup.target) == setup.candidate


# -- crashes and recovery -------------------------------------------------------------------

PUBLISH_CRASHES = [
    ("started", True),
    ("backed_up", False),
    ("backed_up", True),
    ("staged", False),
    ("staged", True),
    ("swapping", False),
    ("swapping", True),
    ("swapped", False),
    ("swapped", True),
]


@pytest.mark.parametrize(("step", "written"), PUBLISH_CRASHES)
async def test_recovery_after_a_crash_at_each_publish_step_restores_the_old_tree(
    setup: Setup, host: SandboxHost, monkeypatch: pytest.MonkeyPatch, step: str, written: bool
) -> None:
    crash_at(monkeypatch, step, written=written)
    with trio.fail_after(30):
        before = state(setup.target)
        with pytest.raises(Crash):
            await setup.apply(host, "auto_verified", check=check("true"))
    monkeypatch.undo()
    recovered = recover_apply(setup.store, setup.run_dir)
    assert recovered is not None and recovered.status == "recovered"
    assert recovered.backup_ref is not None
    assert dict(load_manifest(setup.store, recovered.backup_ref)) == touched(setup)
    assert state(setup.target) == before
    assert hidden(setup.target.parent) == []
    assert journal(setup.run_dir).state == "recovered"
    assert recover_apply(setup.store, setup.run_dir) is None


@pytest.mark.parametrize(
    ("step", "written", "passes", "expected"),
    [
        ("rolling_back", True, False, "old"),
        ("rolled_back", False, False, "old"),
        ("committed", False, True, "old"),
        ("committed", True, True, "new"),
    ],
)
async def test_recovery_after_a_crash_while_finishing(
    setup: Setup,
    host: SandboxHost,
    monkeypatch: pytest.MonkeyPatch,
    step: str,
    written: bool,
    passes: bool,
    expected: str,
) -> None:
    crash_at(monkeypatch, step, written=written)
    with trio.fail_after(30):
        before = state(setup.target)
        with pytest.raises(Crash):
            await setup.apply(host, "auto_verified", check=check("true" if passes else "false"))
    monkeypatch.undo()
    recovered = recover_apply(setup.store, setup.run_dir)
    if expected == "old":
        assert recovered is not None and recovered.status == "recovered"
        assert state(setup.target) == before
    else:
        assert recovered is None
        assert target_tree(setup.store, setup.target) == setup.candidate
    assert hidden(setup.target.parent) == []


@pytest.mark.parametrize("step", ["swapping", "swapped"])
async def test_recovery_uses_the_store_backup_when_the_old_copy_is_gone(
    setup: Setup, host: SandboxHost, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    crash_at(monkeypatch, step, written=True)
    with trio.fail_after(30):
        before = state(setup.target)
        with pytest.raises(Crash):
            await setup.apply(host, "auto_verified")
    monkeypatch.undo()
    pending = journal(setup.run_dir)
    shutil.rmtree(pending.plan.stash)
    leftover = _publish.temp_path(pending.plan, 0)  # as a crash mid-copy leaves
    leftover.parent.mkdir(exist_ok=True)
    leftover.write_bytes(b"half")
    outcome = recover_apply(setup.store, setup.run_dir)
    assert outcome is not None and outcome.status == "recovered"
    assert state(setup.target) == before  # rewritten with the recorded modes and mtimes
    assert target_tree(setup.store, setup.target).digest == setup.parent.digest
    assert hidden(setup.target.parent) == []


CHILD = """
import os, signal, sys
from pathlib import Path
from evolane.campaign import _apply
from evolane.messages import ArtifactRef
from evolane.store import BlobStore

store, target, run_dir, parent, candidate, step = sys.argv[1:]
real = _apply._write_journal

def write_then_die(path, record):
    real(path, record)
    if record.state == step:
        os.kill(os.getpid(), signal.SIGKILL)

_apply._write_journal = write_then_die
parent = ArtifactRef.model_validate_json(parent)
candidate = ArtifactRef.model_validate_json(candidate)
publish = _apply._prepare(
    BlobStore(store), Path(target), parent, candidate, Path(run_dir), "best", Path(run_dir), ()
)
_apply._publish(BlobStore(store), publish)
"""


@pytest.mark.parametrize("step", ["started", "backed_up", "staged", "swapping", "swapped"])
async def test_recovery_after_a_sigkill_at_each_step(
    setup: Setup, host: SandboxHost, step: str
) -> None:
    before = state(setup.target)
    argv = (
        sys.executable,
        "-c",
        textwrap.dedent(CHILD),
        str(setup.store.root),
        str(setup.target),
        str(setup.run_dir),
        setup.parent.model_dump_json(),
        setup.candidate.model_dump_json(),
        step,
    )
    setup.run_dir.mkdir()
    (host.lease_dir / "child").mkdir()
    with trio.fail_after(30):
        code = str(Path(_apply.__file__).parents[2])  # the child runs the code under test
        spec = SandboxSpec(
            argv=argv, workspace=str(host.lease_dir / "child"), env={"PYTHONPATH": code}
        )
        died = await host.run(spec)
    assert died.signal == signal.SIGKILL, died.stderr.text()
    if step == "swapping":
        assert (setup.target / "blob.bin").read_bytes() == b"\x00\x09"  # the first path is in
        assert (setup.target / "old.txt").exists()  # the rest is not
    assert [p for p in state(setup.target) if ".evolane-" in p] == []  # never a temp in it
    outcome = recover_apply(setup.store, setup.run_dir)
    assert outcome is not None and outcome.status == "recovered"
    assert state(setup.target) == before
    assert hidden(setup.target.parent) == []


# -- a single-file target -------------------------------------------------------------------


class FileSetup(Setup):
    """A single file target ``x.md`` (mode 0o600) and an edited candidate of it."""

    def __init__(self, root: Path, store: BlobStore) -> None:
        self.store, self.run_dir = store, root / "run"
        self.target = root / "docs" / "x.md"
        write(self.target, "old text\n", 0o600)
        self.parent = target_tree(store, self.target)
        write(root / "work" / "x.md", "new text\n")
        self.candidate = snapshot_tree(store, root / "work")


@pytest.fixture
def file_setup(tmp_path: Path, store: BlobStore) -> FileSetup:
    return FileSetup(tmp_path, store)


async def test_a_file_target_is_published_in_place(
    file_setup: FileSetup, host: SandboxHost
) -> None:
    with trio.fail_after(30):
        outcome = await file_setup.apply(
            host, "auto_verified", check=check("grep -q 'new text' {candidate}")
        )
    assert outcome.status == "applied", outcome.message
    assert file_setup.target.read_text() == "new text\n"
    assert os.stat(file_setup.target).st_mode & 0o777 == 0o600  # the user's mode is kept
    diff = (file_setup.run_dir / "proposals" / "best" / "changes.diff").read_text()
    assert "--- a/x.md\n+++ b/x.md\n" in diff and "-old text\n+new text\n" in diff
    assert hidden(file_setup.target.parent) == []


async def test_a_file_target_rolls_back_exactly(file_setup: FileSetup, host: SandboxHost) -> None:
    with trio.fail_after(30):
        before = state(file_setup.target)
        outcome = await file_setup.apply(host, "auto_verified", check=check("false"))
    assert outcome.status == "rolled_back" and outcome.check_exit_code == 1
    assert state(file_setup.target) == before
    assert hidden(file_setup.target.parent) == []


@pytest.mark.parametrize(
    ("step", "written"), [("backed_up", True), ("staged", True), ("swapped", False)]
)
async def test_a_file_target_recovers_after_a_crash(
    file_setup: FileSetup,
    host: SandboxHost,
    monkeypatch: pytest.MonkeyPatch,
    step: str,
    written: bool,
) -> None:
    crash_at(monkeypatch, step, written=written)
    with trio.fail_after(30):
        before = state(file_setup.target)
        with pytest.raises(Crash):
            await file_setup.apply(host, "auto_verified")
    monkeypatch.undo()
    outcome = recover_apply(file_setup.store, file_setup.run_dir)
    assert outcome is not None and outcome.status == "recovered"
    assert state(file_setup.target) == before
    assert hidden(file_setup.target.parent) == []


async def test_a_file_target_refuses_a_candidate_with_other_files(
    file_setup: FileSetup, host: SandboxHost, tmp_path: Path
) -> None:
    write(tmp_path / "work" / "extra.md", "more\n")
    wider = snapshot_tree(file_setup.store, tmp_path / "work")
    with trio.fail_after(30):
        before = state(file_setup.target)
        outcome = await file_setup.apply(host, "auto_verified", candidate_ref=wider)
    assert outcome.status == "refused" and "x.md" in outcome.message
    assert state(file_setup.target) == before


async def test_untouched_policies_keep_a_file_target_as_is(
    file_setup: FileSetup, host: SandboxHost
) -> None:
    with trio.fail_after(30):
        before = state(file_setup.target)
        for policy in ("proposal", "verified_only"):
            outcome = await file_setup.apply(host, policy, label=f"as-{policy}")
            assert outcome.status in ("proposed", "kept")
    assert state(file_setup.target) == before
    assert os.listdir(file_setup.target.parent) == ["x.md"]


def test_recover_apply_without_a_journal_is_a_no_op(tmp_path: Path, store: BlobStore) -> None:
    assert recover_apply(store, tmp_path) is None


_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS, _FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10


def _set_immutable(path: Path, on: bool) -> None:
    """Set or clear ``path``'s immutable attribute (``chattr +i``): every write into it is
    refused, whoever writes; skips the test where the file system or user cannot."""
    import fcntl
    import struct

    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = struct.unpack("i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, struct.pack("i", 0)))[0]
        flags = flags | _FS_IMMUTABLE_FL if on else flags & ~_FS_IMMUTABLE_FL
        fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("i", flags))
    except OSError as error:
        pytest.skip(f"cannot change the immutable attribute here: {error}")
    finally:
        os.close(fd)


async def test_a_target_that_refuses_writes_rolls_back(setup: Setup, host: SandboxHost) -> None:
    """Found by review (a read-only or immutable target at publish): the rollback set the
    target folder's times back, which the target refused too, so the run died with
    `internal error: PermissionError` (or, for EROFS, a failure blamed on the store), its
    apply.json left `rolling_back`, and every later run in the store refused to start
    ("restore its target by hand") though nothing had been written. Now the publish rolls
    back (status rolled_back) and nothing awaits recovery."""
    before = state(setup.target)
    _set_immutable(setup.target, True)
    try:
        with trio.fail_after(30):
            outcome = await setup.apply(host, "auto_verified", check=check("true"))
    finally:
        _set_immutable(setup.target, False)
    assert outcome.status == "rolled_back", outcome.message
    assert "Operation not permitted" in outcome.message
    assert state(setup.target) == before
    assert journal(setup.run_dir).state == "rolled_back"
    assert hidden(setup.target.parent) == []
    assert recover_apply(setup.store, setup.run_dir) is None
