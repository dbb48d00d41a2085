"""Apply policies for an accepted candidate: propose it, keep it, or publish it to the target.

Every policy writes proposal artifacts under ``run_dir/proposals/<label>/``. Only
``auto_verified`` touches the target, and only through a journaled publish
(``run_dir/apply.json``) of the candidate's diff, path by path (`evolane.campaign._publish`:
what a publish keeps, and how each step is undone): plan, back up, stage, swap, run the
post-apply check, then commit or roll back. `recover_apply` undoes a publish a crash
interrupted. This module holds the policies, that journal and its recovery; the proposal
artifacts are written by `evolane.campaign._proposal`.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import trio
from pydantic import Field

from evolane.campaign._files import remove_path
from evolane.campaign._gates import untouchable
from evolane.campaign._proposal import write_proposal
from evolane.campaign._publish import (
    PublishPlan,
    TargetChanged,
    back_up,
    clean,
    plan_publish,
    restore,
    stage,
    swap,
    touched_entries,
)
from evolane.campaign._vcs import VCS_FOLDERS
from evolane.inputs import CommandTemplate, InputError
from evolane.lanes import limit_reason, limits_hit, scratch_dir
from evolane.messages import ArtifactRef, Name, Record, ShortText, Text
from evolane.sandbox import Isolation, Limits, ProcessOutcome, SandboxHost, SandboxSpec, View
from evolane.store import (
    BlobStore,
    FileEntry,
    StoreError,
    TreeLimitError,
    TreeManifest,
    UnsafeEntryError,
    UnsupportedEntryError,
    diff_trees,
    load_manifest,
    read_json,
    snapshot_tree,
    store_manifest,
    store_refused,
    write_json_atomic,
)

ApplyPolicy = Literal["proposal", "verified_only", "auto_verified"]
"""What happens to an accepted candidate (CLI ``--apply``)."""
ApplyStatus = Literal["proposed", "kept", "applied", "rolled_back", "refused", "recovered"]
APPLY_POLICIES: Final[tuple[ApplyPolicy, ...]] = ("proposal", "verified_only", "auto_verified")
JOURNAL_NAME: Final = "apply.json"
"""The apply journal, directly under the run directory."""

JournalState = (
    Literal["started", "backed_up", "staged", "swapping", "swapped"]
    | Literal["rolling_back", "committed", "rolled_back", "recovered"]
)
"""Publish steps in order (``swapping`` once per path swapped), then the ways out (each
recorded once the step is done)."""
_TERMINAL: Final = frozenset({"committed", "rolled_back", "recovered"})
_LABEL_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_PathText = Annotated[str, Field(min_length=1, max_length=4096)]


class ApplyOutcome(Record):
    """What applying one accepted candidate did, under which policy."""

    policy: ApplyPolicy
    status: ApplyStatus
    candidate_ref: ArtifactRef
    target: ShortText
    """The target path as given (its tail, if longer than the bound)."""
    proposal_dir: ShortText = ""
    diff_ref: ArtifactRef | None = None
    """The unified diff parent -> candidate, stored as a blob."""
    backup_ref: ArtifactRef | None = None
    """The target's versions of the paths the publish changes or removes, as a tree: what
    undoing it puts back (the rest of the target is never touched)."""
    check_exit_code: int | None = None
    message: Text = ""


class ApplyJournal(Record):
    """``run_dir/apply.json``: enough to finish or undo a publish that was interrupted."""

    state: JournalState
    kind: Literal["dir", "file"]
    target: _PathText
    plan: PublishPlan
    """The paths to publish, where their originals are kept, and what undoing needs."""
    done: int = Field(default=0, ge=0)
    """Paths swapped so far (informative: undoing looks at the paths themselves)."""
    backup_ref: ArtifactRef
    candidate_ref: ArtifactRef
    parent_ref: ArtifactRef
    label: Name
    proposal_dir: _PathText
    updated: ShortText
    message: Text = ""


# -- public entry points ------------------------------------------------------------------


def target_tree(store: BlobStore, target: Path) -> ArtifactRef:
    """Snapshot the target: a directory as is, a single file as a tree of exactly that file.

    Version-control metadata (`VCS_FOLDERS`: a ``.git`` folder or file, at any depth) is
    left out: it is not what a campaign improves, every optimizer and replay gets a copy of
    the tree (found by review: a remote's token in ``.git/config`` and the whole history
    went to each of them), and a publish never touches what the tree does not hold.
    `InputError` (one line naming ``--target``) for a target that is neither a regular file
    nor a directory, a tree holding an entry it cannot record (a device, FIFO, socket, a name
    that is not UTF-8), over a tree cap, or holding a symlink that points outside it: each
    refused before anything of the tree is stored."""
    target = Path(target)
    try:
        if target.is_dir():
            return snapshot_tree(store, target, contained=True, skip=VCS_FOLDERS)
    except (UnsafeEntryError, UnsupportedEntryError, TreeLimitError) as error:
        raise InputError(f"--target {target}: {error}") from None
    if not target.is_file():
        why = "not a regular file or a directory" if target.exists() else "no such file"
        raise InputError(f"--target {target}: {why}")
    ref = store.put_file(target)
    mode = 0o755 if target.stat().st_mode & 0o111 else 0o644
    entry = FileEntry(digest=ref.digest, mode=mode, size=ref.size)
    return store_manifest(store, TreeManifest({target.name: entry}))


async def apply_candidate(
    *,
    policy: ApplyPolicy,
    store: BlobStore,
    host: SandboxHost,
    target: Path,
    parent_ref: ArtifactRef,
    candidate_ref: ArtifactRef,
    run_dir: Path,
    check: CommandTemplate | None = None,
    check_timeout: float = 120.0,
    kill_grace: float = 2.0,
    label: str = "best",
    limits: Limits | None = None,
    isolation: Isolation = "process",
    view: View | None = None,
    protected: tuple[str, ...] = (),
) -> ApplyOutcome:
    """Write the proposal artifacts, then keep or publish the candidate as ``policy`` says.

    A publish that would touch a path matching a ``protected`` glob, or version-control
    metadata, is refused before anything is written: the gates compare each candidate
    with its own parent under that run's globs, while a publish writes every cycle's edits
    at once (found by review: a glob added at ``--resume-campaign`` did not stop an earlier
    cycle's edit of that path from being published).

    ``check`` (placeholders ``{candidate}`` = the target, ``{workspace}``) runs in the sandbox
    after an ``auto_verified`` publish, under ``limits`` (default none) and ``isolation``
    (confined: it sees ``view`` and the published target read-only); a non-zero exit,
    timeout, kill or limit hit rolls it back.
    Store errors (a corrupt or missing candidate blob) raise.
    """
    if policy not in APPLY_POLICIES:
        raise ValueError(f"unknown apply policy {policy!r} (expected one of {APPLY_POLICIES})")
    if not _LABEL_RE.fullmatch(label):
        raise ValueError(f"invalid proposal label {label!r}")
    given, target = str(target), Path(os.path.abspath(target))
    run_dir = Path(os.path.abspath(run_dir))
    workspace = scratch_dir(host, "apply", f"{label}-{secrets.token_hex(4)}")
    # Rendered before anything is written, so a bad template costs nothing.
    spec = _check_spec(check, target, workspace, kill_grace, limits, isolation, view)
    # Materialising the candidate (verify=True) reads every blob once: the integrity check.
    proposal_dir, diff_ref = await trio.to_thread.run_sync(
        partial(
            write_proposal, store, run_dir, label, policy, target, parent_ref, candidate_ref, _now()
        )
    )
    base: dict[str, Any] = {
        "policy": policy,
        "candidate_ref": candidate_ref,
        "target": _clip_tail(given),
        "proposal_dir": _clip_tail(str(proposal_dir)),
        "diff_ref": diff_ref,
    }
    if policy == "proposal":
        return ApplyOutcome(**base, status="proposed", message=f"proposal in {proposal_dir}")
    if policy == "verified_only":
        return ApplyOutcome(**base, status="kept", message="candidate tree intact in the store")
    with trio.CancelScope(shield=True):
        prepared = await trio.to_thread.run_sync(
            partial(
                _prepare,
                store,
                target,
                parent_ref,
                candidate_ref,
                run_dir,
                label,
                proposal_dir,
                protected,
            )
        )
    if isinstance(prepared, _Refusal):
        return ApplyOutcome(**base, status="refused", message=_clip_head(prepared.reason))
    base["backup_ref"] = prepared.journal.backup_ref
    return await _publish_and_check(store, host, prepared, spec, check_timeout, base)


def _check_spec(
    check: CommandTemplate | None,
    target: Path,
    workspace: Path,
    kill_grace: float,
    limits: Limits | None,
    isolation: Isolation,
    view: View | None,
) -> SandboxSpec | None:
    """The post-publish check's sandbox spec (None: no check): it sees ``view``, its own
    ``workspace`` and the published ``target`` read-only."""
    if check is None:
        return None
    argv = check.render({"candidate": str(target), "workspace": str(workspace)})
    shown = (view or View()).model_copy(
        update={"own": ((str(workspace), True), (str(target), False))}
    )
    return SandboxSpec(
        argv=argv,
        workspace=str(workspace),
        kill_grace=kill_grace,
        limits=limits or Limits(),
        isolation=isolation,
        view=shown,
        drop_root=True,
        label="apply-check",
    )


def recover_apply(store: BlobStore, run_dir: Path) -> ApplyOutcome | None:
    """Undo an interrupted ``auto_verified`` publish recorded in ``run_dir/apply.json``.

    Every path that holds what the publish put there gets its original back (content,
    mode, owner, mtime), added files and the folders made for them go, temps and the stash
    are removed, and the journal records state ``recovered``; None when nothing was pending
    (no journal, or a committed / rolled back / recovered one).
    """
    path = Path(run_dir) / JOURNAL_NAME
    if not path.exists():
        return None
    raw = read_json(path)
    if isinstance(raw, dict) and raw.get("state") in _TERMINAL and "plan" not in raw:
        return None  # ended under the whole-folder publish of earlier versions: nothing pending
    journal = ApplyJournal.model_validate(raw)
    if journal.state in _TERMINAL:
        clean(journal.plan)
        return None
    interrupted = journal.state
    restore(store, journal.plan)
    message = f"an apply interrupted in state {interrupted!r} was undone: target restored"
    update = {"state": "recovered", "updated": _now(), "message": message}
    _write_journal(path, journal.model_copy(update=update))
    return ApplyOutcome(
        policy="auto_verified",
        status="recovered",
        candidate_ref=journal.candidate_ref,
        target=_clip_tail(journal.target),
        proposal_dir=_clip_tail(journal.proposal_dir),
        backup_ref=journal.backup_ref,
        message=message,
    )


def journal_state(path: Path) -> tuple[str, ArtifactRef]:
    """The state and candidate of the apply journal at ``path``, in this version's format or
    the whole-folder one of earlier versions (`ValueError` for neither)."""
    raw = read_json(path)
    try:
        return str(raw["state"]), ArtifactRef.model_validate(raw["candidate_ref"])
    except (KeyError, TypeError) as error:
        raise ValueError(f"{path}: not an apply journal ({error})") from None


# -- the publish ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Refusal:
    reason: str


@dataclass(slots=True)
class _Publish:
    """The journal file and its current record; every step is recorded before the next."""

    path: Path
    journal: ApplyJournal

    def record(self, state: JournalState, message: str = "", done: int | None = None) -> None:
        update: dict[str, Any] = {"state": state, "updated": _now(), "message": _clip_head(message)}
        if done is not None:
            update["done"] = done
        self.journal = self.journal.model_copy(update=update)
        _write_journal(self.path, self.journal)


def _write_journal(path: Path, journal: ApplyJournal) -> None:
    write_json_atomic(path, journal)


async def _publish_and_check(
    store: BlobStore,
    host: SandboxHost,
    publish: _Publish,
    check: SandboxSpec | None,
    check_timeout: float,
    base: dict[str, Any],
) -> ApplyOutcome:
    """Swap the candidate's paths in, check, commit or roll back; never left half published."""
    try:
        await trio.lowlevel.checkpoint_if_cancelled()
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(_publish, store, publish)
    except TargetChanged as exc:  # someone edited the target meanwhile: theirs stays
        reason = f"{exc}; the publish was undone, nothing of the edit overwritten"
        await _undo(store, publish, reason)
        return ApplyOutcome(**base, status="refused", message=_clip_head(reason))
    except (OSError, StoreError) as exc:
        reason = f"publishing failed: {type(exc).__name__}: {exc}"
        await _undo(store, publish, reason)
        if any(store_refused(exc, at) for at in (store.root, publish.path.parent)):
            raise  # undone; the run ends failed (README), and --resume-campaign publishes
        return ApplyOutcome(**base, status="rolled_back", message=_clip_head(reason))
    except (Exception, trio.Cancelled):
        await _undo(store, publish, "publishing failed or was cancelled")
        raise
    failure, code = None, None
    if check is not None:
        try:
            outcome = await _run_check(host, check, check_timeout)
        except BaseException:
            await _undo(store, publish, "interrupted during the post-apply check")
            raise
        code = outcome.exit_code
        failure = None if outcome.ok else _check_failure(outcome, check_timeout, check.limits)
    if failure is not None:
        await _undo(store, publish, failure)
        return ApplyOutcome(
            **base, status="rolled_back", check_exit_code=code, message=_clip_head(failure)
        )
    with trio.CancelScope(shield=True):
        await trio.to_thread.run_sync(_commit, publish)
    message = "published; post-apply check passed" if check else "published (no check given)"
    return ApplyOutcome(**base, status="applied", check_exit_code=code, message=message)


async def _undo(store: BlobStore, publish: _Publish, reason: str) -> None:
    """Roll back in a shielded scope: a cancellation cannot leave the target half restored."""
    with trio.CancelScope(shield=True):
        await trio.to_thread.run_sync(_roll_back, store, publish, reason)


def _prepare(
    store: BlobStore,
    target: Path,
    parent_ref: ArtifactRef,
    candidate_ref: ArtifactRef,
    run_dir: Path,
    label: str,
    proposal_dir: Path,
    protected: tuple[str, ...],
) -> _Publish | _Refusal:
    """Plan the publish, refuse if it touches a protected path or the target moved on, and
    journal ``started`` before any write (the plan holds what undoing needs)."""
    journal_path = run_dir / JOURNAL_NAME
    if journal_path.exists():
        state, _ = journal_state(journal_path)
        if state not in _TERMINAL:
            return _Refusal(f"an apply interrupted in state {state!r} awaits recover_apply")
    parent, candidate = load_manifest(store, parent_ref), load_manifest(store, candidate_ref)
    changed = diff_trees(store, parent_ref, candidate_ref)
    offending = untouchable(
        (*changed.added, *changed.removed, *changed.changed), protected, parent, candidate
    )
    if offending:
        named = ", ".join(repr(path) for path in offending[:4])
        return _Refusal(f"the publish would touch protected paths ({named}); nothing written")
    if target.is_symlink():
        return _Refusal(f"target {target} is a symlink; refusing to replace it")
    if not target.exists():
        return _Refusal(f"target {target} does not exist")
    kind: Literal["dir", "file"] = "dir" if target.is_dir() else "file"
    if kind == "file":
        entries = load_manifest(store, candidate_ref)
        if list(entries) != [target.name] or not isinstance(entries[target.name], FileEntry):
            return _Refusal(f"a file target needs a candidate holding just {target.name!r}")
    token = secrets.token_hex(4)
    stash = target.parent / f".{target.name[:100]}.evolane-{token}"
    root = target if kind == "dir" else target.parent
    plan = plan_publish(store, root, parent_ref, candidate_ref, token=token, stash=stash)
    if isinstance(plan, str):
        return _Refusal(f"the target changed since the run began: {plan}; nothing written")
    backup = store_manifest(store, TreeManifest(touched_entries(plan)))
    journal = ApplyJournal(
        state="started",
        kind=kind,
        target=str(target),
        plan=plan,
        backup_ref=backup,
        candidate_ref=candidate_ref,
        parent_ref=parent_ref,
        label=label,
        proposal_dir=str(proposal_dir),
        updated=_now(),
    )
    publish = _Publish(journal_path, journal)
    publish.record("started")
    return publish


def _publish(store: BlobStore, publish: _Publish) -> None:
    """Back up the originals, stage the new versions, swap path by path, journaling each."""
    plan = publish.journal.plan
    back_up(plan)
    publish.record("backed_up")
    stage(store, plan)
    publish.record("staged")
    for index in range(len(plan.ops)):
        swap(plan, index)
        publish.record("swapping", done=index + 1)
    publish.record("swapped")


def _commit(publish: _Publish) -> None:
    publish.record("committed")
    clean(publish.journal.plan)


def _roll_back(store: BlobStore, publish: _Publish, reason: str) -> None:
    """Undo the publish; the target is restored even when the journal cannot record it (a
    full store: found by crash review, the target stayed half published until the next
    run), and that journal error is raised after (recovery finds nothing left to undo)."""
    try:
        publish.record("rolling_back", reason)
    finally:
        restore(store, publish.journal.plan)
    publish.record("rolled_back", reason)


# -- check --------------------------------------------------------------------------------


async def _run_check(host: SandboxHost, spec: SandboxSpec, timeout: float) -> ProcessOutcome:
    assert spec.workspace is not None
    workspace = Path(spec.workspace)
    await trio.to_thread.run_sync(partial(workspace.mkdir, parents=True))
    try:
        return await host.run(spec, timeout=timeout)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(remove_path, workspace)


def _check_failure(outcome: ProcessOutcome, timeout: float, limits: Limits) -> str:
    stderr = next((line for line in outcome.stderr.text().splitlines() if line.strip()), "")
    detail = f": {stderr.strip()}" if stderr else ""
    hit = limits_hit(outcome, limits)
    if hit:  # the check ran out of room: say which limit and the flag that raises it
        return f"post-apply check stopped: {limit_reason(hit, limits)}{detail}"
    if outcome.status == "exited":
        return f"post-apply check failed with exit code {outcome.exit_code}{detail}"
    if outcome.status == "timed_out":
        return f"post-apply check timed out after {timeout:g}s{detail}"
    why = outcome.error or ", ".join(outcome.limits_hit) or f"signal {outcome.signal}"
    return f"post-apply check {outcome.status.replace('_', ' ')} ({why}){detail}"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _clip_tail(text: str, limit: int = 256) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


def _clip_head(text: str, limit: int = 2048) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
