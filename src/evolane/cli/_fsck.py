"""``evolane fsck``: verify the store, quarantine bad objects, name the runs they touch."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from evolane.cli._exits import EXIT_INTERNAL, EXIT_OK, fail_usage
from evolane.cli._output import StoreOption, store_of

if TYPE_CHECKING:
    from evolane.campaign import ReportSummary, RunRecord, StoreLayout
    from evolane.store import Problem

EXIT_DAMAGED = EXIT_INTERNAL
"""``fsck``'s exit code when it found damage (repaired or not); 0 means clean."""


def fsck(
    store: StoreOption = None,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help=(
                "Move bad objects to quarantine/ inside the store; make objects read-only; "
                "write the listing's summary into each ended run's run.json that lacks it; "
                "remove the temp files a kill left in ended runs' folders."
            ),
        ),
    ] = False,
) -> None:
    """Verify every object's digest and every run journal; exit 0 when clean, 1 on damage."""
    from evolane.cli._tally import Tally
    from evolane.store import check_store

    store = store_of(store)
    if not store.is_dir():
        fail_usage(f"--store {store}: no evolane store there")
    try:
        with Tally("fsck", counts_damage=True) as tally:
            records = RecordCheck(store, [] if repair else None)
            result = check_store(store, repair=repair, per_run=records.run, tally=tally)
            result.problems.extend(records.problems())
            tally.damaged = len(result.problems)  # the last line says what the summary says
    except OSError as error:
        fail_usage(f"--store {store}: cannot be checked: {error.strerror or error}")
    for line in report_lines(result.problems):
        typer.echo(line)
    filled = records.filled
    if filled:
        typer.echo(f"wrote the listing's summary into the run.json of {len(filled)} runs")
    found = len(result.problems)
    summary = f"{result.objects} objects checked in {store}: "
    if not found:
        typer.echo(summary + "clean")
        raise typer.Exit(EXIT_OK)
    hint = "" if repair else " (run with --repair to quarantine bad objects)"
    typer.echo(summary + f"{found} problem{'s' if found != 1 else ''} found{hint}")
    raise typer.Exit(EXIT_DAMAGED)


class RecordCheck:
    """Every ``run.json``, ``report.json`` and ``campaign.json`` that does not read as its
    record (as ``report``, ``--resume`` and ``--resume-campaign`` read them), a run at a
    time: `run` as a store walk reaches each run folder (`check_store`'s ``per_run``), then
    `problems` lists them all by id (runs not reached, a symlinked folder, checked there).
    With ``filled`` (a repair), an ended run whose ``run.json`` lacks its report's summary,
    or holds a wrong one, gets it (`_fill_summary`) and its id is added to ``filled``."""

    def __init__(self, store: Path, filled: list[str] | None) -> None:
        from evolane.campaign import StoreLayout

        self.layout, self.filled = StoreLayout(store), filled
        self.run_ids = set(self.layout.run_ids())
        self.checked: set[str] = set()
        self.found: dict[str, list[Problem]] = {}  # runs with problems only

    def run(self, run_id: str) -> int:
        """How many problems one run's records have (kept for `problems`)."""
        if run_id not in self.run_ids or run_id in self.checked:
            return 0
        self.checked.add(run_id)
        found = _run_problems(self.layout, run_id, self.filled)
        if found:
            self.found[run_id] = found
        return len(found)

    def problems(self) -> list[Problem]:
        """Misnamed folders, then every run's problems by id, then every campaign's."""
        from evolane.campaign import load_campaign, record_problem
        from evolane.inputs import InputError
        from evolane.store import Problem

        layout, problems = self.layout, []
        for path in layout.misnamed():
            why = "its name is not an id (letters, digits, '.', '_', '-'): no command reads it"
            problems.append(Problem("name", path, why))
        for run_id in sorted(self.run_ids - self.checked):
            self.run(run_id)
        for run_id in sorted(self.found):
            problems.extend(self.found[run_id])
        for campaign_id in layout.campaign_ids():
            try:
                load_campaign(layout, campaign_id)
            except (OSError, ValueError) as error:
                path = layout.campaign_file(campaign_id)
                why = str(error) if isinstance(error, InputError) else record_problem(error)
                why = why.removeprefix(f"cannot read {path}: ").partition("; run `evolane fsck")[0]
                problems.append(Problem("record", path, why))
        return problems


def _run_problems(layout: StoreLayout, run_id: str, filled: list[str] | None) -> list[Problem]:
    """The problems of one run's ``run.json`` and ``report.json`` (see `RecordCheck`)."""
    from evolane.campaign import ENDED_RUNS, Report, load_run, record_problem
    from evolane.store import Problem, read_json

    path = layout.run_dir(run_id) / "run.json"
    report, problems = None, []
    try:
        record = load_run(layout, run_id)
        path = path.with_name("report.json")
        if path.exists():
            report = read_json(path)
            Report.model_validate(report)
    except (OSError, ValueError) as error:
        return [Problem("record", path, record_problem(error), runs=(run_id,))]
    summary = record.summary
    wrong = _summary_problem(path, run_id, summary, report) if summary is not None else None
    if wrong is not None:
        problems.append(wrong)
    stale = report is not None and (summary is None or wrong is not None)
    if filled is not None and stale and _fill_summary(layout, record, report, path):
        filled.append(run_id)
    if record.status in ENDED_RUNS and (torn := _torn_after_end(layout, run_id, record.status)):
        problems.append(torn)
    if record.status in ENDED_RUNS:
        problems.extend(_left_temps(layout, record, repair=filled is not None))
    return problems


def _fill_summary(layout: StoreLayout, record: RunRecord, report: Any, path: Path) -> bool:
    """Write the summary of the report at ``path`` into an ended run's ``run.json``, which
    `evolane runs` then lists without reading the report (a store older than summaries
    listed 3,000 runs in about 30 s): False for a run that may still change (not ended, or
    held by a process), whose own session writes it."""
    from evolane.campaign import ENDED_RUNS, ReportSummary, run_is_live, save_run

    if record.status not in ENDED_RUNS or run_is_live(layout, record.run_id):
        return False
    summary = ReportSummary.of(report, path.stat().st_size)
    save_run(layout, record.model_copy(update={"summary": summary}))
    return True


def _left_temps(layout: StoreLayout, record: RunRecord, repair: bool) -> list[Problem]:
    """The temp files a kill left in an ended run's folder (a record cut between its write
    and its rename: report.html is written after the run ended, so no resume removes it);
    a repair removes them. None for a run still held by a process (it may be writing)."""
    from evolane.campaign import run_is_live
    from evolane.store import Problem, atomic_temps

    if run_is_live(layout, record.run_id):
        return []
    problems = []
    for path in atomic_temps(layout.run_dir(record.run_id)):
        if repair:
            path.unlink(missing_ok=True)
        why = "a kill cut the write of a record short" + (" (removed)" if repair else "")
        problems.append(Problem("temp", path, why, runs=(record.run_id,)))
    return problems


def _summary_problem(
    path: Path, run_id: str, summary: ReportSummary, report: Any
) -> Problem | None:
    """``run.json``'s ``summary`` (what ``evolane runs`` lists) when it is not that of the
    report at ``path`` (``report``: that file as read, None when there is none)."""
    from evolane.campaign import ReportSummary
    from evolane.store import Problem

    run_json = path.with_name("run.json")
    if report is None:
        why = "its summary is of a report.json that is missing"
        return Problem("record", run_json, why, runs=(run_id,))
    actual = ReportSummary.of(report, path.stat().st_size)
    for name in ReportSummary.model_fields:
        listed, real = getattr(summary, name), getattr(actual, name)
        if listed != real:
            why = f"its summary disagrees with report.json ({name} {listed} against {real})"
            return Problem("record", run_json, why, runs=(run_id,))
    return None


def _torn_after_end(layout: StoreLayout, run_id: str, status: str) -> Problem | None:
    """A torn last journal line in a run that ended (`campaign.ENDED_RUNS`): what a kill
    leaves, and a resume repairs, in a running or interrupted run; after the run's end it is
    damage, and its last record is lost (found by review: fsck called such a store clean)."""
    from evolane.store import JournalCorruptError, Problem, torn_tail

    path = layout.run_dir(run_id) / "journal.jsonl"
    try:
        torn = torn_tail(path)
    except (OSError, JournalCorruptError):
        return None  # told by the store's own check
    if torn is None:
        return None
    ended = "finished" if status == "finished" else f"ended ({status})"
    reason = f"a torn last line (line {torn.line}), though the run {ended}: its last record is lost"
    return Problem("journal", path, reason, runs=(run_id,))


def report_lines(problems: list[Problem]) -> list[str]:
    """One plain line per problem: what and where, why, which runs use it, where it went."""
    lines = []
    for problem in problems:
        what = {
            "object": "bad object",
            "mode": "object",
            "journal": "damaged journal",
            "missing": "missing object",
            "record": "damaged record",
            "temp": "leftover temp file",
            "name": "misnamed folder",
            "folder": "unreadable folder",
        }
        line = f"{what.get(problem.kind, problem.kind)} {problem.path}: {problem.reason}"
        if problem.runs:
            line += f"; used by run {', '.join(problem.runs)}"
        elif problem.kind in ("object", "missing"):
            line += "; no run uses it"
        if problem.quarantined is not None:
            line += f"; moved to {problem.quarantined}"
        lines.append(line)
    return lines
