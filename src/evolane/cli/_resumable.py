"""Whether ``--resume`` can work for a run: `report` suggests it only then, and otherwise
says why not (an ended run, a run still going on, or a damaged journal or blob: ``evolane
fsck`` finds those); and, after a failed run, the advice that names a command that works."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evolane.campaign import CampaignConfig, RunRecord, StoreLayout

RESUMABLE = ("running", "interrupted")
"""The run statuses `--resume` accepts."""


_LOOK = object()
"""`resume_blocker`'s default ``live``: find out here whether a process runs the run."""


def resume_blocker(
    layout: StoreLayout, record: RunRecord, store: Path, *, live: object = _LOOK
) -> str | None:
    """Why ``--resume`` of ``record`` cannot work (one plain line), or None when it can: the
    run has not ended, no process runs it, its journal reads whole and the trees it starts
    from are intact. ``live``: the caller's own `live_note` of the run, when it has one."""
    from evolane.campaign import after_failure

    if record.status == "failed":
        return after_failure(record.campaign_id)
    if record.status not in RESUMABLE:
        return f"the run ended {record.status}; start a new run (or --resume-campaign)"
    note = live_note(layout, record, store) if live is _LOOK else live
    return (note if isinstance(note, str) else None) or _damage(layout, record, store)


def _damage(layout: StoreLayout, record: RunRecord, store: Path) -> str | None:
    """A damaged journal or a corrupt tree the run starts from, with the command that finds it."""
    from evolane.campaign import read_resume_state
    from evolane.store import CorruptBlobError, StoreError

    fsck = f"run `evolane fsck --store {store}`"
    try:
        read_resume_state(layout.run_dir(record.run_id) / "journal.jsonl")
    except (OSError, ValueError, StoreError) as error:
        # what is wrong, and where: the class name alone said neither (found by review)
        why = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        why = " ".join(why.split()).split("; run `evolane fsck", 1)[0]  # said once, below
        return f"its journal is damaged ({why[:300]}); {fsck}"
    blobs = layout.blobs()
    for ref in (record.seed_ref, record.parent_ref):
        if not blobs.has(ref):
            continue
        try:
            blobs.verify(ref)
        except CorruptBlobError:
            return f"blob {ref.digest} it starts from is corrupt; {fsck}"
        except OSError as error:
            return f"blob {ref.digest} cannot be read ({error.strerror}); {fsck}"
    return None


def ended_outcome(flags: dict[str, Any]) -> Any:
    """The outcome of the session's run (``flags["run_id"]``) when a second Ctrl-C cancelled
    the session after the run had ended (its ``run.json`` says so: the report it summarises
    was written): its report and folder, as `RunOutcome`; else None. Found by review: a
    second Ctrl-C while the report was written said "interrupted", printed a ``--resume``
    that is refused, and exited 130, of a run recorded ``finished``."""
    from evolane.campaign import ENDED_RUNS, Report, RunOutcome, StoreLayout, load_run
    from evolane.store import StoreError, read_json

    if flags.get("run_id") is None or not flags.get("store"):
        return None
    layout = StoreLayout(Path(flags["store"]).absolute())
    try:
        record = load_run(layout, flags["run_id"])
        if record.status not in ENDED_RUNS or record.summary is None:
            return None
        run_dir = layout.run_dir(record.run_id)
        report = Report.model_validate(read_json(run_dir / "report.json"))
    except (OSError, ValueError, StoreError):  # no report to stand on: as cancelled
        return None
    return RunOutcome(estimate=report.estimate, report=report, run_dir=run_dir)  # type: ignore[arg-type]


def recorded_run(store: Path, started: float, resuming: str | None = None) -> str | None:
    """The run a session that began at ``started`` left resumable, if any, read off the store
    (its ``session_started``; only run folders written since are read); for a ``--resume``
    (``resuming``), that run while it is still resumable, whether or not the session had
    written it yet. A Ctrl-C that aborts the start of a run once its ``run.json`` is written
    leaves it ``interrupted``: the command says how to resume it (found by review: it
    printed no resume command)."""
    from evolane.campaign import StoreLayout, load_run
    from evolane.store import StoreError

    layout = StoreLayout(Path(store))
    if resuming is not None:
        try:
            record = load_run(layout, resuming)
        except (OSError, ValueError, StoreError):  # not a run: the start said so, or will
            return None
        return record.run_id if record.status in RESUMABLE else None
    try:
        folders = [p for p in (layout.root / "runs").iterdir() if p.stat().st_mtime >= started - 1]
    except OSError:
        return None
    for folder in sorted(folders, reverse=True):
        try:
            record = load_run(layout, folder.name)
        except (OSError, ValueError, StoreError):  # not a run of this session: not ours
            continue
        if record.session_started == started and record.status in RESUMABLE:
            return record.run_id
    return None


def resume_command(run_id: str, store: Path) -> str:
    """The command that continues an interrupted run."""
    return f"evolane optimize --resume {shlex.quote(run_id)} --store {shlex.quote(str(store))}"


def live_note(layout: StoreLayout, record: RunRecord, store: Path) -> str | None:
    """ "it is running (pid N) ...: follow it with `evolane watch ...`" (with how long it
    has been silent, past `QUIET_AFTER` seconds), or None when no process runs ``record``'s
    run (it holds the run's journal while it runs)."""
    from evolane.campaign import holder_pid, run_is_live

    if record.status != "running" or not run_is_live(layout, record.run_id):
        return None
    from evolane.cli._amounts import duration
    from evolane.cli._output import written_ago
    from evolane.cli._view import QUIET_AFTER

    pid = holder_pid(Path(record.config.target), record.run_id)
    held = f" (pid {pid})" if pid else ""
    silent = written_ago(layout.run_dir(record.run_id) / "events.jsonl")
    quiet = f", no event for {duration(silent)}" if silent >= QUIET_AFTER else ""
    watch = watch_command(record.run_id, store)
    return f"it is running{held} in another process{quiet}: follow it with `{watch}`"


def watch_command(run_id: str, store: Path) -> str:
    """The command that follows a run from any terminal."""
    return f"evolane watch {shlex.quote(run_id)} --store {shlex.quote(str(store))}"


SCRIPT_SUFFIXES = (".py", ".sh", ".bash", ".js", ".mjs", ".ts", ".rb", ".pl", ".R")
"""Words of a command that name a script even without a slash."""


def relative_paths(config: CampaignConfig) -> Iterator[tuple[str, str]]:
    """(role, word) for each word of a command that names a file by a relative path: the
    commands run in a folder of their own, where such a path names nothing."""
    commands = {
        "replay": config.measure.replay,
        "judge": config.measure.judge,
        "optimizer": config.propose.optimizer,
        "check": config.check,
        "validator": config.validator,
    }
    for role, command in commands.items():
        try:
            words = shlex.split(command or "")
        except ValueError:
            continue
        for word in words:
            if os.path.isabs(word) or word.startswith("-") or any(c in word for c in "{}$ \n"):
                continue
            if "/" in word or word.endswith(SCRIPT_SUFFIXES):
                yield role, word


def failed_advice(config: CampaignConfig, campaign_id: str) -> list[str]:
    """What to do after a failed run: a hint per relative script path, then a command that
    works (a changed replay or judge cannot continue the campaign: a new one must start)."""
    lines, changed = [], []
    for role, word in relative_paths(config):
        found = Path.cwd() / word
        absolute = f" ({found})" if found.exists() else ""
        lines.append(
            f"hint: the {role} command names {word} by a relative path, but commands run in a "
            f"folder of their own: give its absolute path{absolute}"
        )
        changed.append(role)
    if {"replay", "judge"} & set(changed):
        fixed = " and ".join(dict.fromkeys(r for r in changed if r in ("replay", "judge")))
        lines.append(
            f"then: evolane optimize <the same flags, the {fixed} fixed> (a new campaign: "
            f"--resume-campaign {campaign_id} refuses a changed {fixed})"
        )
    else:
        lines.append(
            "fix what failed, then: evolane optimize <the same flags> (a new campaign), or add "
            f"--resume-campaign {campaign_id} if the target, dataset, replay and judge stay "
            "the same"
        )
    return lines
