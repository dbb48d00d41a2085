"""The optimizer lane: real optimizer subprocesses through the sandbox, its idle watchdog,
the sandbox's activity hook, and the `disallowed_entries` gate."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import trio

from evolane.campaign._prompt import build_prompt, edit_diff, encode_prompt
from evolane.examples.selfevolve._defaults import FAULT_RATES
from evolane.examples.selfevolve._optimizer import optimize
from evolane.examples.selfevolve._workspace import commands, write_workspace
from evolane.inputs import OPTIMIZER_PLACEHOLDERS, CommandTemplate
from evolane.lanes._entries import check_entries
from evolane.lanes._optimizer import (
    OptimizerLane,
    OptimizerSettings,
    workdir_signature,
)
from evolane.messages import ArtifactRef, ProposeJob, ProposeResult, StopUnits
from evolane.sandbox import SandboxHost, SandboxSpec, lease_holders
from evolane.store import BlobStore, FileEntry, diff_trees, load_manifest, snapshot_tree
from evolane.supervisors import open_runtime as open_actor_runtime
from tests.sandbox_helpers import as_uid


def lane(host: SandboxHost, store: BlobStore, command: str, **extra: object) -> OptimizerLane:
    template = CommandTemplate.parse(command, role="optimizer", allowed=OPTIMIZER_PLACEHOLDERS)
    settings = OptimizerSettings(template=template, kill_grace=0.2, **extra)  # type: ignore[arg-type]
    return OptimizerLane(host, store, settings)


def parent_tree(store: BlobStore, root: Path) -> ArtifactRef:
    folder = root / "parent"
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.md").write_text("one\ntwo\n")
    (folder / "sub" / "data.txt").write_text("x\n")
    return snapshot_tree(store, folder)


def job(
    store: BlobStore,
    parent: ArtifactRef,
    *,
    prompt: bytes = b"{}",
    context: ArtifactRef | None = None,
    timeout: float = 20.0,
    idle: float = 20.0,
    seed: int = 0,
    slot: str = "s1",
) -> ProposeJob:
    return ProposeJob(
        slot_id=slot,
        parent_ref=parent,
        prompt_ref=store.put_bytes(prompt),
        context_ref=context,
        seed=seed,
        timeout_seconds=timeout,
        idle_seconds=idle,
    )


def sh(script: str) -> str:
    """A template running ``script`` with ``sh -c`` (placeholders are substituted first)."""
    return f"sh -c '{script}'"


def scratch_left(host: SandboxHost) -> list[str]:
    folder = host.lease_dir / "optimizer"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


async def propose(lane_: OptimizerLane, message: ProposeJob) -> ProposeResult:
    return await lane_.receive(message)


# -- the example optimizer, end to end --------------------------------------------------------


def _editing_seed(tmp_path: Path) -> int:
    """A seed for which the example optimizer edits the rules (not one of its faults)."""
    for seed in range(50):
        write_workspace(tmp_path / f"probe{seed}")
        done = optimize(tmp_path / f"probe{seed}" / "target", tmp_path / "none", seed, FAULT_RATES)
        if done.startswith("edit:"):
            return seed
    raise AssertionError("no editing seed")


async def test_the_example_optimizer_proposes_a_changed_tree(
    host: SandboxHost, store: BlobStore, tmp_path: Path
) -> None:
    write_workspace(tmp_path / "ex")
    parent = snapshot_tree(store, tmp_path / "ex" / "target")
    seed = _editing_seed(tmp_path)
    prompt = build_prompt(
        iteration=0,
        cycle=0,
        slot=0,
        focus="all",
        convergence="ok",
        standings=[],
        rejected=[],
        protected=["grader/**"],
    )
    optimizer = lane(host, store, commands()["optimizer"])
    with trio.fail_after(60):
        result = await propose(
            optimizer, job(store, parent, prompt=encode_prompt(prompt), seed=seed)
        )
    assert result.status == "succeeded", result
    assert result.summary.startswith("edit: ") and result.tree_ref is not None
    changes = diff_trees(store, parent, result.tree_ref)
    assert changes.changed == ("skill/SKILL.md",) and not changes.added and not changes.removed
    assert edit_diff(store, parent, result.tree_ref).startswith("skill/SKILL.md\n-")
    assert result.stdout_ref is not None and store.read_bytes(result.stdout_ref).startswith(b"edit")
    assert result.usage.wall_seconds is not None and result.wall_seconds > 0
    assert scratch_left(host) == []
    # The in-place edit went to a copy: every blob of the parent still verifies.
    for entry in load_manifest(store, parent).values():
        assert isinstance(entry, FileEntry)
        store.verify(entry.ref)


# -- failures cost the slot only ----------------------------------------------------------------


async def test_a_non_zero_exit_fails_the_slot_with_the_stderr_tail(
    host: SandboxHost, store: BlobStore, tmp_path: Path
) -> None:
    optimizer = lane(host, store, sh("echo first line; echo oops >&2; exit 3"))
    with trio.fail_after(20):
        result = await propose(optimizer, job(store, parent_tree(store, tmp_path)))
    assert result.status == "failed" and result.tree_ref is None
    assert result.failure is not None
    assert (result.failure.owner, result.failure.stage, result.failure.code) == (
        "candidate",
        "optimizer",
        "exit_3",
    )
    assert "oops" in result.failure.message and result.stderr_ref is not None
    assert scratch_left(host) == []


async def test_a_hang_past_the_deadline_times_out_and_leaves_no_process(
    host: SandboxHost, store: BlobStore, tmp_path: Path
) -> None:
    optimizer = lane(host, store, sh("sleep 60 & sleep 60 & while :; do echo .; sleep 0.1; done"))
    with trio.fail_after(20):
        result = await propose(optimizer, job(store, parent_tree(store, tmp_path), timeout=1.0))
    assert result.status == "timed_out"
    assert result.failure is not None and result.failure.owner == "infrastructure"
    assert result.failure.code == "timeout" and result.wall_seconds >= 1.0
    assert lease_holders(host.lease) == set()
    assert scratch_left(host) == []


async def test_an_idle_optimizer_is_stopped_quickly(
    host: SandboxHost, store: BlobStore, tmp_path: Path
) -> None:
    optimizer = lane(host, store, "sleep 30")
    started = trio.current_time()
    with trio.fail_after(20):
        result = await propose(
            optimizer, job(store, parent_tree(store, tmp_path), timeout=25, idle=0.5)
        )
    assert result.status == "idle_killed"
    assert result.failure is not None and result.failure.code == "idle"
    assert trio.current_time() - started < 8  # well before its 25 s timeout
    assert lease_holders(host.lease) == set()


@pytest.mark.parametrize(
    "script",
    [
        "while :; do echo thinking; sleep 0.1; done",  # keeps printing
        "i=0; while :; do i=$((i+1)); echo $i > {workdir}/beat; sleep 0.1; done",  # keeps editing
    ],
    ids=["printing", "editing-silently"],
)
async def test_an_active_optimizer_is_not_idle_and_runs_to_its_deadline(
    host: SandboxHost, store: BlobStore, tmp_path: Path, script: str
) -> None:
    optimizer = lane(host, store, sh(script))
    with trio.fail_after(20):
        result = await propose(
            optimizer, job(store, parent_tree(store, tmp_path), timeout=5, idle=2.0)
        )  # idle is timed from before the launch: 2 s leaves room for a slow start
    assert result.status == "timed_out" and result.wall_seconds >= 5


@pytest.mark.parametrize("early", [False, True], ids=["in-flight", "before-the-job"])
async def test_a_stop_signal_cancels_the_slot(
    host: SandboxHost, store: BlobStore, tmp_path: Path, early: bool
) -> None:
    """The stop travels as a signal through the lane's ref, also when it overtakes the job."""
    parent = parent_tree(store, tmp_path)
    with trio.fail_after(20):
        async with open_actor_runtime() as runtime:
            settings = lane(host, store, "sleep 30").settings
            ref = await runtime.spawn(
                OptimizerLane, host, store, settings, name="optimizer", restart="temporary"
            )
            if early:
                assert ref.signal(StopUnits(unit_ids=("s9",)))
            results: list[ProposeResult] = []
            async with trio.open_nursery() as nursery:

                async def run() -> None:
                    results.append(await ref.ask(job(store, parent, slot="s9"), timeout=20))

                nursery.start_soon(run)
                if not early:
                    await trio.sleep(0.5)
                    assert ref.signal(StopUnits(unit_ids=("s9",)))
    assert results[0].status == "cancelled"
    assert scratch_left(host) == []


async def test_trio_cancellation_kills_the_tree_and_removes_the_scratch(
    host: SandboxHost, store: BlobStore, tmp_path: Path
) -> None:
    optimizer = lane(host, store, sh("sleep 60 & echo started; sleep 60"))
    with trio.fail_after(20):
        with trio.move_on_after(0.7) as scope:
            await propose(optimizer, job(store, parent_tree(store, tmp_path)))
    assert scope.cancelled_caught
    assert lease_holders(host.lease) == set() and scratch_left(host) == []


async def test_a_missing_parent_blob_fails_the_slot_without_raising(
    host: SandboxHost, store: BlobStore
) -> None:
    missing = ArtifactRef(digest="sha256:" + "0" * 64, size=3)
    optimizer = lane(host, store, "true")
    with trio.fail_after(20):
        result = await propose(optimizer, job(store, missing))
    assert result.status == "failed" and result.failure is not None
    assert (result.failure.owner, result.failure.code) == ("framework", "prepare_failed")
    assert scratch_left(host) == []


# -- what a candidate may hold ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "offender"),
    [
        ("ln -s /etc/passwd {workdir}/sub/link", "sub/link"),
        ("mkfifo {workdir}/pipe", "pipe"),
        ("cd /; rm -rf {workdir}; ln -s /etc {workdir}", "."),
    ],
)
async def test_a_symlink_or_fifo_left_in_the_workdir_is_rejected(
    host: SandboxHost, store: BlobStore, tmp_path: Path, script: str, offender: str
) -> None:
    optimizer = lane(host, store, sh(f"echo edited > {{workdir}}/notes.md; {script}"))
    with trio.fail_after(20):
        result = await propose(optimizer, job(store, parent_tree(store, tmp_path)))
    assert result.status == "rejected" and result.tree_ref is None
    assert result.gate is not None and result.gate.gate == "disallowed_entries"
    assert result.gate.outcome == "reject" and result.gate.paths == (offender,)
    assert scratch_left(host) == []


async def test_the_context_is_read_only_and_never_part_of_the_candidate(
    host: SandboxHost, store: BlobStore, tmp_path: Path
) -> None:
    folder = tmp_path / "context"
    (folder / "cases" / "c1").mkdir(parents=True)
    (folder / "cases" / "c1" / "judge.json").write_text('{"reason": "wrong_action"}')
    context = snapshot_tree(store, folder)
    script = (
        'cp "$EVOLANE_CONTEXT_DIR/cases/c1/judge.json" {workdir}/seen.json; '
        "cp {prompt_file} {workdir}/prompt-copy.json; "
        "stat -c %a {workspace} {workspace}/cases {workspace}/cases/c1/judge.json; "
        'test "$EVOLANE_CONTEXT_DIR" = {workspace} && test "$EVOLANE_SLOT" = s1 && '
        "test $(pwd) = {workdir} && echo env-ok"
    )
    optimizer = lane(host, store, sh(script))
    with trio.fail_after(20):
        result = await propose(
            optimizer,
            job(store, parent_tree(store, tmp_path), prompt=b'{"iteration": 4}', context=context),
        )
    assert result.status == "succeeded", result
    assert result.summary == "555"
    assert store.read_bytes(result.stdout_ref).decode().split() == [  # type: ignore[arg-type]
        "555",
        "555",
        "444",
        "env-ok",
    ]
    manifest = load_manifest(store, result.tree_ref)  # type: ignore[arg-type]
    assert sorted(manifest) == ["notes.md", "prompt-copy.json", "seen.json", "sub/data.txt"]
    seen, prompt = manifest["seen.json"], manifest["prompt-copy.json"]
    assert isinstance(seen, FileEntry) and isinstance(prompt, FileEntry)
    assert store.read_bytes(seen.digest) == b'{"reason": "wrong_action"}'
    assert store.read_bytes(prompt.digest) == b'{"iteration": 4}'
    assert scratch_left(host) == []


async def test_an_optimizer_may_report_its_usage(
    host: SandboxHost, store: BlobStore, tmp_path: Path
) -> None:
    script = 'echo "{{\\"tokens\\": 1200, \\"cost_usd\\": 0.25}}" > "$EVOLANE_USAGE_FILE"'
    optimizer = lane(host, store, sh(script))
    with trio.fail_after(20):
        result = await propose(optimizer, job(store, parent_tree(store, tmp_path)))
    assert result.status == "succeeded"
    assert result.usage.tokens == 1200 and result.usage.cost_usd == 0.25


# -- the sandbox's activity hook and the workdir signature --------------------------------------


async def test_the_sandbox_reports_output_activity(host: SandboxHost) -> None:
    seen: list[float] = []
    spec = SandboxSpec(argv=("sh", "-c", "echo a; sleep 0.3; echo b >&2; sleep 0.3; echo c"))
    with trio.fail_after(20):
        outcome = await host.run(
            spec, timeout=10, activity=lambda: seen.append(trio.current_time())
        )
    assert outcome.ok and outcome.stdout.text() == "a\nc\n"
    assert len(seen) == 3 and seen[2] - seen[0] >= 0.5
    silent: list[float] = []
    with trio.fail_after(20):
        await host.run(
            SandboxSpec(argv=("sleep", "0.3")), timeout=10, activity=lambda: silent.append(1)
        )
    assert silent == []


def test_the_workdir_signature_sees_every_kind_of_change(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_text("1")
    first = workdir_signature(tmp_path)
    assert workdir_signature(tmp_path) == first
    os.utime(tmp_path / "a" / "f", ns=(1, 1))
    touched = workdir_signature(tmp_path)
    assert touched != first
    (tmp_path / "a" / "g").write_text("")
    created = workdir_signature(tmp_path)
    assert created != touched
    (tmp_path / "a" / "g").unlink()
    os.utime(tmp_path / "a", ns=(5, 5))
    assert workdir_signature(tmp_path) not in (created, touched)


# -- the disallowed_entries gate ------------------------------------------------------------------


def test_plain_files_and_folders_pass_the_entries_gate(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.txt").write_text("x")
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o755)
    (tmp_path / "empty").mkdir()
    verdict = check_entries(tmp_path)
    assert verdict.passed and verdict.gate == "disallowed_entries" and verdict.paths == ()


def test_the_entries_gate_names_up_to_four_offenders_in_path_order(tmp_path: Path) -> None:
    root = tmp_path / "w"
    (root / "d").mkdir(parents=True)
    (root / "ok.txt").write_text("fine")
    os.symlink("ok.txt", root / "a-link")  # even a link inside the tree
    os.symlink("/etc", root / "d" / "escape")  # a folder link: never followed
    os.mkfifo(root / "b-fifo")
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(root / "c-sock"))
        os.mkdir(os.fsencode(root) + b"/bad-\xff")
        (root / "new\nline").write_text("")
        os.link(root / "ok.txt", root / "hard")
        verdict = check_entries(root)
    finally:
        server.close()
    assert verdict.outcome == "reject"
    assert verdict.paths == ("a-link", "b-fifo", "bad-\\xff", "c-sock")
    # eight in all: the four named, d/escape, hard and ok.txt (one inode), "new\\nline"
    assert verdict.reason == "a-link: symlink (and 7 more)"
    assert check_entries(root) == verdict  # deterministic


def test_the_entries_gate_flags_hard_links_and_devices(tmp_path: Path) -> None:
    (tmp_path / "one").write_text("1")
    os.link(tmp_path / "one", tmp_path / "two")
    verdict = check_entries(tmp_path)
    assert verdict.paths == ("one", "two") and "hard link" in verdict.reason
    (tmp_path / "two").unlink()
    assert check_entries(tmp_path).passed
    try:
        os.mknod(tmp_path / "null", 0o600 | 0o020000, os.makedev(1, 3))
    except PermissionError:
        return
    device = check_entries(tmp_path)
    assert device.paths == ("null",) and "device" in device.reason


def test_the_entries_gate_refuses_a_file_its_owner_closed(tmp_path: Path) -> None:
    # Found by review: a non-root evolane's optimizer that left a file of mode 000 had its
    # slot fail as infrastructure (snapshot_failed), not its edit refused.
    uid = 4242 if os.geteuid() == 0 else os.geteuid()
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "ok.txt").write_text("fine")
    (tmp_path / "w" / "closed").write_text("secret")
    if os.geteuid() == 0:
        for path in (tmp_path, tmp_path / "w", *(tmp_path / "w").iterdir()):
            os.chown(path, uid, uid)
    (tmp_path / "w" / "closed").chmod(0)
    here = os.getcwd()
    try:
        refused = as_uid(uid, tmp_path, lambda: check_entries(Path("w")).paths == ("closed",))
    finally:
        os.chdir(here)
    assert refused


def test_only_the_parents_own_symlinks_pass_and_only_unchanged(tmp_path: Path) -> None:
    (tmp_path / "skill").mkdir()
    (tmp_path / "skill" / "SKILL.md").write_text("rules\n")
    (tmp_path / "skill" / "alias").symlink_to("SKILL.md")
    assert check_entries(tmp_path, {"skill/alias": "SKILL.md"}).passed
    assert not check_entries(tmp_path).passed
    moved = check_entries(tmp_path, {"skill/alias": "../SKILL.md"})
    assert not moved.passed and moved.paths == ("skill/alias",)
    (tmp_path / "skill" / "other").symlink_to("SKILL.md")
    added = check_entries(tmp_path, {"skill/alias": "SKILL.md"})
    assert added.paths == ("skill/other",)
