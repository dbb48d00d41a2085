"""Apply policies for an accepted candidate: propose it, keep it, or publish it to the target.

Every policy writes proposal artifacts under ``run_dir/proposals/<label>/``. Only
``auto_verified`` touches the target, and only through a journaled publish
(``run_dir/apply.json``) of the candidate's diff, path by path (`evolane.campaign._publish`:
what a publish keeps, and how each step is undone): plan, back up, stage, swap, run the
post-apply check, then commit or roll back. A target that is a symlink to a version folder
is published tree-atomically instead (`evolane.campaign._publish_link`): plan, build the new
version beside the current one, check it, swap the link, then commit or remove it.
`recover_apply` undoes a publish a crash interrupted. This module holds the policies, that
journal and its recovery; the proposal artifacts are written by `evolane.campaign._proposal`,
the target's tree is read by `evolane.campaign._target`.
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

from evolane.campaign._apply_check import check_failure, check_spec, run_check
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
from evolane.campaign._publish_link import (
    LinkPlan,
    build,
    clean_link,
    plan_link,
    prune,
    restore_link,
    switch,
)
from evolane.inputs import CommandTemplate, InputError
from evolane.lanes import scratch_dir
from evolane.messages import ArtifactRef, Name, Record, ShortText, Text
from evolane.sandbox import Isolation, Limits, SandboxHost, SandboxSpec, View
from evolane.store import (
    BlobStore,
    FileEntry,
    StoreError,
    TreeManifest,
    diff_trees,
    load_manifest,
    read_json,
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
    kind: Literal["dir", "file", "link"]
    target: _PathText
    plan: PublishPlan | LinkPlan
    """The paths to publish, where their originals are kept, and what undoing needs (for a
    link target: the new version folder and the link's text before and after)."""
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
    pass_env: tuple[str, ...] = (),
) -> ApplyOutcome:
    """Write the proposal artifacts, then keep or publish the candidate as ``policy`` says.

    A publish that would touch a path matching a ``protected`` glob, or version-control
    metadata, is refused before anything is written: the gates compare each candidate
    with its own parent under that run's globs, while a publish writes every cycle's edits
    at once (found by review: a glob added at ``--resume-campaign`` did not stop an earlier
    cycle's edit of that path from being published).

    ``check`` (placeholders ``{candidate}`` = the target, ``{workspace}``) runs in the sandbox
    after an ``auto_verified`` publish, under ``limits`` (default none) and ``isolation``
    (confined: it sees ``view`` and the published target read-only), with the variables
    ``pass_env`` names; a non-zero exit,
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
    spec = check_spec(check, target, workspace, kill_grace, limits, isolation, view, pass_env)
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
    plan = prepared.journal.plan
    if isinstance(plan, LinkPlan):  # checked before the link moves: the new version folder
        new = Path(plan.new_version)
        spec = check_spec(check, new, workspace, kill_grace, limits, isolation, view, pass_env)
    return await _publish_and_check(store, host, prepared, spec, check_timeout, base)


def recover_apply(store: BlobStore, run_dir: Path) -> ApplyOutcome | None:
    """Undo an interrupted ``auto_verified`` publish recorded in ``run_dir/apply.json``.

    Every path that holds what the publish put there gets its original back (content,
    mode, owner, mtime), added files and the folders made for them go, temps and the stash
    are removed (a link target points where it did, its new version folder is removed), and
    the journal records state ``recovered``; None when nothing was pending
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
        _clean(journal.plan)
        return None
    interrupted = journal.state
    _restore(store, journal.plan)
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
    """Publish, check, (for a link target: swap the link,) then commit or roll back; never
    left half published."""
    refused = await _step(store, publish, _publish, base)
    if refused is not None:
        return refused
    failure, code = None, None
    if check is not None:
        try:
            plan = publish.journal.plan
            stash = plan.diff.stash if isinstance(plan, LinkPlan) else plan.stash
            outcome = await run_check(host, check, check_timeout, stash)
        except BaseException:
            await _undo(store, publish, "interrupted during the post-apply check")
            raise
        code = outcome.exit_code
        failure = None if outcome.ok else check_failure(outcome, check_timeout, check.limits)
    if failure is not None:
        await _undo(store, publish, failure)
        return ApplyOutcome(
            **base, status="rolled_back", check_exit_code=code, message=_clip_head(failure)
        )
    if isinstance(publish.journal.plan, LinkPlan):
        refused = await _step(store, publish, _switch, base)
        if refused is not None:
            return refused
    with trio.CancelScope(shield=True):
        await trio.to_thread.run_sync(_commit, publish)
    message = "published; post-apply check passed" if check else "published (no check given)"
    return ApplyOutcome(**base, status="applied", check_exit_code=code, message=message)


async def _step(
    store: BlobStore, publish: _Publish, step: Any, base: dict[str, Any]
) -> ApplyOutcome | None:
    """Run a writing step of the publish, shielded; undo it all if it fails (the outcome
    that says so; None when it went through)."""
    try:
        await trio.lowlevel.checkpoint_if_cancelled()
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(step, store, publish)
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
    return None


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
    planned = _plan(store, target, parent_ref, candidate_ref)
    if isinstance(planned, _Refusal):
        return planned
    kind, plan = planned
    touched = touched_entries(plan.diff if isinstance(plan, LinkPlan) else plan)
    journal = ApplyJournal(
        state="started",
        kind=kind,
        target=str(target),
        plan=plan,
        backup_ref=store_manifest(store, TreeManifest(touched)),
        candidate_ref=candidate_ref,
        parent_ref=parent_ref,
        label=label,
        proposal_dir=str(proposal_dir),
        updated=_now(),
    )
    publish = _Publish(journal_path, journal)
    publish.record("started")
    return publish


def _plan(
    store: BlobStore, target: Path, parent_ref: ArtifactRef, candidate_ref: ArtifactRef
) -> tuple[Literal["dir", "file", "link"], PublishPlan | LinkPlan] | _Refusal:
    """The target's kind and the plan of its publish, or why it is refused."""
    token = secrets.token_hex(4)
    if target.is_symlink():
        try:
            plan: PublishPlan | LinkPlan | str = plan_link(
                store, target, parent_ref, candidate_ref, token
            )
        except InputError as error:
            return _Refusal(str(error).removeprefix("--target "))
        kind: Literal["dir", "file", "link"] = "link"
    elif not target.exists():
        return _Refusal(f"target {target} does not exist")
    else:
        kind = "dir" if target.is_dir() else "file"
        if kind == "file":
            entries = load_manifest(store, candidate_ref)
            if list(entries) != [target.name] or not isinstance(entries[target.name], FileEntry):
                return _Refusal(f"a file target needs a candidate holding just {target.name!r}")
        stash = target.parent / f".{target.name[:100]}.evolane-{token}"
        root = target if kind == "dir" else target.parent
        plan = plan_publish(store, root, parent_ref, candidate_ref, token=token, stash=stash)
    if isinstance(plan, str):
        return _Refusal(f"{plan}; nothing written")  # each reason says whose doing it is
    return kind, plan


def _publish(store: BlobStore, publish: _Publish) -> None:
    """Back up the originals, stage the new versions, swap path by path, journaling each
    (for a link target: build the new version folder)."""
    plan = publish.journal.plan
    if isinstance(plan, LinkPlan):
        build(store, plan)
        publish.record("staged")
        return
    back_up(plan)
    publish.record("backed_up")
    stage(store, plan)
    publish.record("staged")
    for index in range(len(plan.ops)):
        swap(plan, index)
        publish.record("swapping", done=index + 1)
    publish.record("swapped")


def _switch(store: BlobStore, publish: _Publish) -> None:
    """Point a link target at its new version (checked already)."""
    plan = publish.journal.plan
    assert isinstance(plan, LinkPlan)
    switch(plan)
    publish.record("swapped")


def _commit(publish: _Publish) -> None:
    publish.record("committed")
    plan = publish.journal.plan
    _clean(plan)
    if isinstance(plan, LinkPlan):
        prune(plan)


def _clean(plan: PublishPlan | LinkPlan) -> None:
    if isinstance(plan, LinkPlan):
        clean_link(plan)
    else:
        clean(plan)


def _restore(store: BlobStore, plan: PublishPlan | LinkPlan) -> None:
    if isinstance(plan, LinkPlan):
        restore_link(plan)
    else:
        restore(store, plan)


def _roll_back(store: BlobStore, publish: _Publish, reason: str) -> None:
    """Undo the publish; the target is restored even when the journal cannot record it (a
    full store: found by crash review, the target stayed half published until the next
    run), and that journal error is raised after (recovery finds nothing left to undo)."""
    try:
        publish.record("rolling_back", reason)
    finally:
        _restore(store, publish.journal.plan)
    publish.record("rolled_back", reason)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _clip_tail(text: str, limit: int = 256) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


def _clip_head(text: str, limit: int = 2048) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
