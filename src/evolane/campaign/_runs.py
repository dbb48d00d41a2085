"""The durable layout of runs and campaigns under the store directory (DESIGN §7).

``runs/<id>/run.json`` is the frozen request, ``journal.jsonl`` the resume source,
``events.jsonl`` the progress stream, ``report.json``/``report.md`` the result;
``campaigns/<id>/campaign.json`` carries the state shared by a campaign's cycles.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import Field, JsonValue, ValidationError, model_validator

from evolane.campaign._config import CampaignConfig, with_stored_defaults
from evolane.campaign._layout import StoreLayout
from evolane.campaign._online import OnlineBudget
from evolane.campaign._splits import SplitPlan
from evolane.inputs import InputError, first_problem
from evolane.messages import (
    ArtifactRef,
    Digest,
    Name,
    Record,
    ShortText,
    Text,
    Usage,
)
from evolane.store import (
    StoreError,
    make_folders_durable,
    read_json,
    write_json_atomic,
)

if TYPE_CHECKING:  # the publish itself (trio, the sandbox) loads where a journal is read
    from evolane.campaign._apply import ApplyOutcome

RunStatus = Literal["running", "finished", "budget_limited", "interrupted", "failed"]
ENDED_RUNS: frozenset[str] = frozenset({"finished", "budget_limited", "failed"})
"""The statuses of a run that ended for good: ``--resume`` refuses it, so nothing repairs
its journal's tail any more."""
CampaignStatus = Literal["active", "paused", "budget_limited", "exhausted", "complete"]
TERMINAL_CAMPAIGN: frozenset[str] = frozenset({"budget_limited", "exhausted", "complete"})
REJECTED_KEPT = 32
"""How many rejected edits the campaign remembers (the optimizer sees them, newest last)."""
SEEN_KEPT = 10_000
"""How many candidate tree digests the duplicate gate remembers across a campaign's cycles."""


class ResolvedSetting(Record):
    """One setting of a run as it was resolved: its value and where it came from
    (``default``, ``flag``, ``example NAME``, ``--fast-verified``, or a config file's path)."""

    value: JsonValue
    source: Text


class ReportSummary(Record):
    """The fields of a run's ``report.json`` that ``evolane runs`` lists, kept in ``run.json``
    by the write that records the run's end (the report is written just before it), so a
    listing reads no report (found by soak review: ``runs`` parsed every report, 37 s for
    3,000 runs of 750 KB). ``report_bytes`` is the size of the report as written: a
    ``report.json`` of another size is not the one summarised, and ``evolane fsck`` reports a
    summary that disagrees with its report."""

    baseline_val: float | None = None
    best_val: float | None = None
    wall_seconds: float | None = Field(default=None, ge=0)
    report_bytes: int = Field(ge=0)

    @classmethod
    def of(cls, report: Any, report_bytes: int) -> ReportSummary:
        """The summary of ``report`` (``report.json`` as a JSON object, as written or read;
        a field of the wrong type is left out, as a listing shows it). The wall is the
        run's over all its sessions (``run_wall_seconds``) when the report keeps it, as the
        session that wrote the report listed it (found by review: `evolane fsck` called
        every resumed run's summary wrong, and ``--repair`` put the last session's in)."""
        report = report if isinstance(report, dict) else {}
        scores = report.get("scores") if isinstance(report.get("scores"), dict) else {}

        def number(value: Any) -> float | None:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            return float(value) if ok and math.isfinite(value) else None

        def mean(name: str) -> float | None:
            score = scores.get(name)
            return number(score.get("mean")) if isinstance(score, dict) else None

        wall = number(report.get("run_wall_seconds"))
        wall = number(report.get("wall_seconds")) if wall is None else wall
        return cls(
            baseline_val=mean("baseline_val"),
            best_val=mean("best_val"),
            wall_seconds=None if wall is None or wall < 0 else wall,
            report_bytes=report_bytes,
        )


class RunRecord(Record):
    """``run.json``: the request as given, where it stands, and what a resume must match."""

    run_id: Name
    campaign_id: Name
    cycle: int = Field(ge=0)
    created: float
    config: CampaignConfig
    dataset_digest: ShortText
    seed_ref: ArtifactRef  # the target's tree when the campaign began
    parent_ref: ArtifactRef  # the best tree when this cycle began
    status: RunStatus = "running"
    resumed: int = Field(default=0, ge=0)  # how many times the run was resumed
    elapsed_seconds: float = Field(default=0.0, ge=0)  # wall of its sessions that have ended
    session_started: float | None = None  # time.time() the current (or last) session began
    splits: SplitPlan | None = None  # which split fed the optimizer, and the carve (None: val)
    settings: dict[Name, ResolvedSetting] | None = None
    """The resolved settings with their sources (`evolane config show`); None when the run
    was not started from the command line, or before they were recorded."""
    summary: ReportSummary | None = None
    """What ``evolane runs`` lists of the report the session that ended the run wrote; None
    while the run is running (a resume clears it), when it ended with no report, or in a
    run.json written before summaries existed (``runs`` then reads the report)."""

    @model_validator(mode="before")
    @classmethod
    def _as_it_ran(cls, data: Any) -> Any:
        """A run.json written before ``feedback_split`` or ``error_control`` existed resumes
        as it ran: val feedback, ``legacy`` error control (confirm with test cases, else
        none)."""
        if isinstance(data, dict) and "config" in data:
            return {**data, "config": with_stored_defaults(data["config"])}
        return data


class RejectedEdit(Record):
    """One entry of the rejected-edit memory: what was tried and why it lost."""

    slot: Name
    diff: Annotated[str, Field(max_length=4096)]
    reason: ShortText


class CampaignState(Record):
    """``campaign.json``: what carries across cycles (best tree, stall count, spent budget)."""

    campaign_id: Name
    status: CampaignStatus = "active"
    identity: dict[Name, Text | None] = Field(default_factory=dict, max_length=16)
    cycles: int = Field(default=0, ge=0)
    max_cycles: int = Field(default=1, ge=1)  # --max-improvement-cycles when it began
    runs: tuple[Name, ...] = Field(default=(), max_length=100_000)
    seed_ref: ArtifactRef
    best_ref: ArtifactRef
    applied_ref: ArtifactRef | None = None  # what the last publish put in the target (or None)
    best_val: float | None = None
    stalled: int = Field(default=0, ge=0)
    spent: Usage = Usage()
    elapsed_seconds: float = Field(default=0.0, ge=0)  # wall of its runs that have ended
    rejected: tuple[RejectedEdit, ...] = Field(default=(), max_length=REJECTED_KEPT)
    seen: tuple[Digest, ...] = Field(default=(), max_length=SEEN_KEPT)  # for the duplicate gate
    splits: SplitPlan | None = None  # the carve its cycles share (set by its first carve)
    online: OnlineBudget | None = None
    """The online error budget, once a cycle ran in ``online`` mode: later cycles continue it."""
    confirmations: OnlineBudget | None = None
    """The confirmation budget, once a cycle confirmed a best: later cycles continue it."""
    updated: float = 0.0


def save_run(layout: StoreLayout, record: RunRecord) -> None:
    """Write ``run.json`` atomically."""
    make_folders_durable(layout.run_dir(record.run_id))
    write_json_atomic(layout.run_dir(record.run_id) / "run.json", record)


def load_run(layout: StoreLayout, run_id: str) -> RunRecord:
    """Read ``run.json``; raises FileNotFoundError for an unknown run, and ValueError for a
    record that is not this folder's (`_own_record`)."""
    record = RunRecord.model_validate(read_json(layout.run_dir(run_id) / "run.json"))
    return _own_record(record, record.run_id, run_id, "run")


def _own_record(record: _R, named: str, folder: str, what: str) -> _R:
    """``record`` when the id it holds (``named``) is its ``folder``'s name, else ValueError:
    every write of a record goes to the folder its id names (found by hostile review: a
    run.json naming another run made `evolane fsck --repair` write it over that run's, or
    into a new folder of that name, and one naming ``../x`` failed fsck with a traceback)."""
    if named != folder:
        raise ValueError(f"its {what}_id {named[:80]!r} is not its folder's name {folder!r}")
    return record


def newest_run(layout: StoreLayout, campaign_id: str) -> RunRecord | None:
    """The newest run of ``campaign_id``; None when it has none or its records cannot be
    read (refused where they are read). A listed run with no ``run.json`` (a kill came
    between its campaign's record and its own) never ran and is skipped."""
    try:
        for run_id in reversed(load_campaign(layout, campaign_id).runs):
            with contextlib.suppress(FileNotFoundError):
                return load_run(layout, run_id)
    except (OSError, ValueError):
        pass
    return None


def last_run_plugins(layout: StoreLayout, campaign_id: str) -> dict[str, str]:
    """The plugins the newest run of ``campaign_id`` recorded (`CampaignConfig.plugins`);
    empty when there is none (`newest_run`)."""
    run = newest_run(layout, campaign_id)
    return {} if run is None else dict(run.config.plugins)


class StagedCampaign(Record):
    """``campaign.next.json``: the campaign state a run's end carries over, written before
    that run's ``run.json``, which is the commit point: it holds once ``run.json`` reads as
    ``run``. A crash between the two files then loses no cycle, spend or confirmation (the
    next cycle started from the old state and spent them again)."""

    run: RunRecord
    state: CampaignState


def _staged_file(layout: StoreLayout, campaign_id: str) -> Path:
    return layout.campaign_file(campaign_id).with_name("campaign.next.json")


def save_campaign(layout: StoreLayout, state: CampaignState) -> None:
    """Write ``campaign.json`` atomically, stamped with the time; a staged state is then
    spent (it was committed into this one, or its run never reached its end)."""
    stamped = state.model_copy(update={"updated": time.time()})
    make_folders_durable(layout.campaign_file(state.campaign_id).parent)
    write_json_atomic(layout.campaign_file(state.campaign_id), stamped)
    _staged_file(layout, state.campaign_id).unlink(missing_ok=True)


def end_run(layout: StoreLayout, run: RunRecord, state: CampaignState) -> None:
    """Record a run's end and the campaign state it leaves as one step: the state staged,
    then ``run.json``, then ``campaign.json`` (`load_campaign` reads a staged state whose
    run reached ``run.json``)."""
    staged = StagedCampaign(run=run, state=state)
    make_folders_durable(layout.campaign_file(state.campaign_id).parent)
    write_json_atomic(_staged_file(layout, state.campaign_id), staged)
    save_run(layout, run)
    save_campaign(layout, state)


_R = TypeVar("_R", bound=Record)


def load_campaign(layout: StoreLayout, campaign_id: str) -> CampaignState:
    """Read ``campaign.json``, or the state a run's end staged when that run's ``run.json``
    shows the end (a crash came between); raises FileNotFoundError for an unknown campaign
    and `InputError` (one line naming the file, pointing to ``evolane fsck``) for one that
    cannot be read or does not validate."""
    path = layout.campaign_file(campaign_id)
    state = _read_record(layout, path, CampaignState)
    try:
        _own_record(state, state.campaign_id, campaign_id, "campaign")
    except ValueError as error:
        fsck = f"run `evolane fsck --store {layout.root}`"
        raise InputError(f"cannot read {path}: {error}; {fsck}") from None
    staged_file = _staged_file(layout, campaign_id)
    if not staged_file.is_file():
        return state
    staged = _read_record(layout, staged_file, StagedCampaign)
    try:
        committed = load_run(layout, staged.run.run_id) == staged.run
    except (OSError, ValueError):  # its run.json is unreadable: the end never committed
        committed = False
    if committed and staged.state.campaign_id == campaign_id:
        return staged.state
    return state


def _read_record(layout: StoreLayout, path: Path, model: type[_R]) -> _R:
    """``path`` validated as ``model``; FileNotFoundError as is, any other failure one
    `InputError` line naming the file."""
    try:
        return model.model_validate(read_json(path))
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as error:
        raise InputError(
            f"cannot read {path}: {record_problem(error)}; run `evolane fsck --store {layout.root}`"
        ) from None


def record_problem(error: BaseException) -> str:
    """The first line of why a record could not be read (a validation's first field error)."""
    if isinstance(error, ValidationError) and error.errors():
        return f"{first_problem(error, 'value')} ({error.error_count()} error(s))"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


@dataclass(frozen=True)
class RecoveredApply:
    """An interrupted publish that `recover_interrupted_applies` undid, and in which run."""

    run_id: str
    outcome: ApplyOutcome

    @property
    def note(self) -> str:
        """The warning the start that undid it publishes."""
        return f"run {self.run_id}: {self.outcome.message}"[:256]


def recover_interrupted_applies(layout: StoreLayout) -> list[RecoveredApply]:
    """Undo every publish a crash left half done: ``runs/*/apply.json`` not in a final state.

    Runs at every start, before the target is read, whichever run the start is for (a crash
    mid-apply can leave the target missing, or holding an unchecked candidate). Only apply
    journals are read; a run whose ``journal.jsonl`` another process holds open is live and
    left alone. One that cannot be undone (unreadable, or its backup lost) is an `InputError`
    naming it: nothing may read a target that could be half published.
    """
    from evolane.campaign._apply import JOURNAL_NAME, recover_apply

    runs = layout.root / "runs"
    if not runs.is_dir():
        return []
    recovered, store = [], layout.blobs()
    for path in sorted(runs.glob(f"*/{JOURNAL_NAME}")):
        run_dir = path.parent
        try:
            with _unless_live(run_dir / "journal.jsonl") as idle:
                outcome = recover_apply(store, run_dir) if idle else None
        except (OSError, ValueError, StoreError) as error:  # the target may be half published
            raise InputError(
                f"{path}: an interrupted publish could not be undone ({type(error).__name__}: "
                f"{error}); restore its target by hand, then remove this file"
            ) from None
        if outcome is not None:
            recovered.append(RecoveredApply(run_dir.name, outcome))
    return recovered


def publish_note(run_dir: Path) -> str | None:
    """What a run's apply journal says of its publish, for a run that has no report (one
    killed during or after its publish); None when it began none. A committed publish
    stands (the target holds the candidate); any other state but a final one is undone by
    the next ``evolane optimize`` on the store (`recover_interrupted_applies`)."""
    from evolane.campaign._apply import JOURNAL_NAME, journal_state

    path = run_dir / JOURNAL_NAME
    if not path.exists():
        return None
    try:
        state, candidate = journal_state(path)
    except (OSError, ValueError, StoreError) as error:
        return f"{path}: not readable ({type(error).__name__}): the target may be half published"
    if state == "committed":
        return f"published {candidate.digest[:19]}: the target holds it (committed before the stop)"
    if state in ("rolled_back", "recovered"):
        return f"{state.replace('_', ' ')}: the target holds what it held before"
    return (
        f"interrupted in state {state!r}: the target may be half published until the next "
        "evolane optimize on this store puts it back"
    )


@contextlib.contextmanager
def _unless_live(journal: Path) -> Iterator[bool]:
    """Hold the run journal's lock (False if a live run holds it) for the block's length."""
    try:
        fd = os.open(journal, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO: no wait
    except FileNotFoundError:
        fd = None
    if fd is None:
        yield True
        return
    try:
        idle = True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            idle = False
        yield idle
    finally:
        os.close(fd)
