"""Read-only views of the store: ``evolane report`` and ``evolane schema``.

Nothing here writes to the store. The campaign modules are imported inside the commands so
that ``import evolane.cli`` stays cheap.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from rich.table import Table
from rich.text import Text

from evolane.cli._exits import fail_usage
from evolane.cli._output import (
    StoreOption,
    open_store,
    reader_may_leave,
    resolve_run,
    stamp,
    store_of,
    test_delta_text,
    wide_console,
    write_json,
)
from evolane.cli._resumable import live_note, resume_blocker, resume_command
from evolane.cli._runs import KILLED, run_opening

if TYPE_CHECKING:
    from evolane.campaign import Report, RunRecord, StoreLayout

FORMATS = ("text", "json", "md", "html")
SCHEMAS = ("messages", "events", "report", "trajectory")
TERMINALS = ("selected", "rejected", "blocked", "not_run")


def _why(error: BaseException) -> str:
    """The first line of an error (the first field error of a validation), for one line."""
    from pydantic import ValidationError

    if isinstance(error, ValidationError) and error.errors():
        from evolane.inputs import first_problem

        return f"{first_problem(error, 'value')} ({error.error_count()} error(s) in {error.title})"
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _damaged(path: Path, error: BaseException) -> str:
    """One line for a run's record (``STORE/runs/RUN/NAME``) that cannot be read, pointing
    to ``evolane fsck`` as the README says (found by review: only campaign.json's did)."""
    return f"cannot read {path}: {_why(error)}; run `evolane fsck --store {path.parents[2]}`"


def _short(digest: str) -> str:
    return digest[:19]


def _load_record(layout: StoreLayout, run_id: str) -> RunRecord:
    from evolane.campaign import load_run

    try:
        return load_run(layout, run_id)
    except (OSError, ValueError) as error:
        fail_usage(_damaged(layout.run_dir(run_id) / "run.json", error))


def _load_report(path: Path) -> Report:
    from evolane.campaign import Report
    from evolane.store import read_json

    try:
        return Report.model_validate(read_json(path))
    except (OSError, ValueError) as error:
        fail_usage(_damaged(path, error))


def report(
    run_id: Annotated[str, typer.Argument(help="The run id (or a prefix of exactly one run).")],
    store: StoreOption = None,
    fmt: Annotated[str, typer.Option("--format", help="text | json | md | html")] = "text",
    follow: Annotated[
        bool, typer.Option("--follow", help="Watch the run until it ends (as `watch`) first.")
    ] = False,
) -> None:
    """Show a run's report; a run without one shows its journal and how to resume it.

    `--format html` (re)draws the run's self-contained `report.html` beside its
    report.json and prints the page.

    With `--follow` the run is watched to its end first (`evolane watch`), the report is
    then shown and the command exits with the run's own exit code; Ctrl-C detaches (exit 0).
    """
    if fmt not in FORMATS:
        fail_usage(f"unknown format {fmt!r}; choose from: {', '.join(FORMATS)}")
    store = store_of(store)
    layout = open_store(store)
    run_id = resolve_run(layout, run_id)
    if follow:
        from evolane.cli._watch import follow_run

        shown = (sys.stdout, "auto") if fmt == "text" else (sys.stderr, "plain")  # stdout: data
        ending = follow_run(layout, run_id, store, shown[1], out=shown[0])
        if ending.detached:
            raise typer.Exit(ending.exit_code)
        with reader_may_leave():  # the run's code, read or not
            _show_report(layout, run_id, store, fmt)
        raise typer.Exit(ending.exit_code)
    _show_report(layout, run_id, store, fmt)


def _show_report(layout: StoreLayout, run_id: str, store: Path, fmt: str) -> None:
    """Print the report of run ``run_id`` in ``fmt`` (or what is known of it without one)."""
    record = _load_record(layout, run_id)
    run_dir = layout.run_dir(run_id)
    report_json = run_dir / "report.json"
    if fmt == "html":
        _show_html(layout, run_dir)
        return
    if not report_json.is_file():
        _show_unfinished(unfinished_summary(layout, record, store), fmt)
        return
    if fmt == "json":
        from evolane.store import read_json

        try:
            write_json(read_json(report_json))
        except (OSError, ValueError) as error:
            fail_usage(_damaged(report_json, error))
    elif fmt == "md":
        report_md = run_dir / "report.md"
        if report_md.is_file():
            sys.stdout.write(report_md.read_text(encoding="utf-8", errors="replace"))
        else:
            from evolane.campaign import case_rows, render_markdown

            rep = _load_report(report_json)
            sys.stdout.write(render_markdown(rep, case_rows(rep, layout.blobs())))
    else:
        blocked = resume_blocker(layout, record, store)
        _print_report(_load_report(report_json), run_dir, store, blocked)


def _show_html(layout: StoreLayout, run_dir: Path) -> None:
    """Draw the run's report.html again (an older run may have none) and print it; a
    report.json its model refuses is one error line."""
    from evolane.views import ReportPageError, write_report_html

    def warn(message: str) -> None:
        print(f"evolane: warning: {message}", file=sys.stderr)

    report_json = run_dir / "report.json"
    if not report_json.is_file():
        fail_usage(f"cannot draw report.html: {report_json}: no report (the run has not finished)")
    report = _load_report(report_json).model_dump(mode="json")
    try:
        path = write_report_html(run_dir, layout.blobs(), warn, report)
    except (ReportPageError, OSError) as error:
        fail_usage(f"cannot draw report.html: {_why(error)}")
    sys.stdout.write(path.read_text(encoding="utf-8"))


# -- a run without report.json ---------------------------------------------------------------


def unfinished_summary(layout: StoreLayout, record: RunRecord, store: Path) -> dict[str, Any]:
    """What run.json, the journal and the event stream say about a run that has no report."""
    from evolane.campaign import publish_note, read_resume_state
    from evolane.store import StoreError

    run_dir = layout.run_dir(record.run_id)
    live = live_note(layout, record, store)  # a process runs it: watch, never resume
    blocked = resume_blocker(layout, record, store, live=live)
    journal: dict[str, Any] = {"units": 0, "proposals": 0, "torn": False, "error": None}
    try:
        state = read_resume_state(run_dir / "journal.jsonl")
        journal.update(units=len(state.units), proposals=len(state.proposals), torn=state.torn)
    except (OSError, ValueError, StoreError) as error:
        journal["error"] = _why(error)
    status = record.status  # a "running" run no process holds is killed, as `runs` lists it
    if status == "running" and live is None and not run_opening(layout, record.run_id):
        status = KILLED
    return {
        "run_id": record.run_id,
        "campaign_id": record.campaign_id,
        "cycle": record.cycle,
        "status": status,
        "created": record.created,
        "resumed": record.resumed,
        "report": None,
        "journal": journal,
        "events": _event_summary(run_dir / "events.jsonl"),
        "publish": publish_note(run_dir),
        "resume": None if blocked else resume_command(record.run_id, store),
        "resume_blocked": blocked,
        "live": live is not None,  # as `runs --json`'s (found by review: it was the sentence)
        "live_note": live,
    }


def _event_summary(path: Path) -> dict[str, Any]:
    """How many events the run published, its last phase and the time of its last event
    (`EventTail`'s bounded lines; a FIFO or device in its place is not waited on)."""
    from evolane.store import StoreError
    from evolane.views import EventTail

    count, phase, last_t = 0, None, None
    tail, at_end = EventTail(path), not path.is_file()
    while not at_end:
        try:
            lines, at_end = tail.read()
        except (OSError, StoreError):  # unreadable, or no longer a file: what was read so far
            break
        for line in lines:
            try:
                event = orjson.loads(line) if line is not None else None  # None: overlong
            except orjson.JSONDecodeError:
                continue  # a torn final line of a killed run
            if not isinstance(event, dict):
                continue
            count += 1
            last_t = event.get("t", last_t)
            if event.get("kind") == "event.phase":
                phase = event.get("phase")
    return {"count": count, "last_phase": phase, "last_t": last_t}


def _unfinished_lines(summary: dict[str, Any]) -> list[tuple[str, str]]:
    status = summary["status"]
    if summary["live_note"]:
        status = summary["live_note"].split(":")[0]  # "it is running (pid N) in another process"
    elif status in ("running", KILLED):
        status = "killed: no process runs it (or it is only starting)"
    journal, events = summary["journal"], summary["events"]
    if journal["error"]:
        journaled = f"unreadable: {journal['error']}"
    else:
        journaled = f"{journal['units']} units, {journal['proposals']} proposals" + (
            " (torn final line)" if journal["torn"] else ""
        )
    last = events["last_phase"] or "-"
    if events["last_t"] is not None:
        last += f" at {events['last_t']:.1f} s"
    publish = [("publish", summary["publish"])] if summary["publish"] else []
    return [
        ("status", status),
        ("campaign", f"{summary['campaign_id']} (cycle {summary['cycle']})"),
        ("created", stamp(summary["created"])),
        ("resumed", f"{summary['resumed']}x" if summary["resumed"] else "never"),
        ("journal", journaled),
        ("events", f"{events['count']} (last phase: {last})"),
        *publish,
        ("report", "none"),
        ("resume", summary["resume"] or f"not possible: {summary['resume_blocked']}"),
    ]


def _show_unfinished(summary: dict[str, Any], fmt: str) -> None:
    if fmt == "json":
        write_json(summary)
        return
    lines = _unfinished_lines(summary)
    if fmt == "md":
        out = [f"# evolane run {summary['run_id']}", ""]
        out += [
            f"- {name}: `{value}`" if name == "resume" else f"- {name}: {value}"
            for name, value in lines
        ]
        sys.stdout.write("\n".join(out) + "\n")
        return
    console = wide_console()
    table = Table(title=f"evolane run {summary['run_id']}", show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for name, value in lines[:-1]:
        table.add_row(name, Text(value))
    console.print(table)
    if summary["live_note"]:
        note = f"This run has no report yet: {summary['live_note']}"
        console.print(Text(note), soft_wrap=True)
        return
    if summary["resume"] is None:
        console.print(
            Text(f"This run has no report and cannot resume: {summary['resume_blocked']}")
        )
        return
    console.print("This run has no report. Continue it with:")
    console.print(Text(f"  {summary['resume']}"), soft_wrap=True)


# -- the text view of a report ---------------------------------------------------------------


def _summary_rows(rep: Report) -> list[tuple[str, str]]:
    from evolane.campaign import ci_text as _ci
    from evolane.cli._summary import val_note
    from evolane.views import isolation_text, token_count

    spent, total = rep.budget.spent, rep.budget.campaign_spent
    best = _short(rep.best.digest)
    best += " (the seed: nothing was accepted)" if rep.selected is None else " (selected)"
    rows = [
        ("status", rep.status),
        ("campaign", f"{rep.campaign_id}: {rep.campaign_status} (cycle {rep.cycle})"),
        ("started", stamp(rep.started)),
        (
            "wall",
            rep.wall_text() + (f"; resumed {rep.resumed}x" if rep.resumed else ""),
        ),
        ("isolation", isolation_text(rep.isolation or "n/a")),
        ("limits", rep.limits or "n/a"),
        ("best", best),
        ("val", f"{_ci(rep.scores.baseline_val)} -> {_ci(rep.scores.best_val)}{val_note(rep)}"),
        ("test (sealed)", f"{_ci(rep.scores.baseline_test)} -> {_ci(rep.scores.best_test)}"),
    ]
    if rep.test is not None:
        confirmed = rep.confirmation is not None
        delta = test_delta_text(rep.test, rep.confirmation)
        # beside a confirmation, the gate's own call on the test cases ("accept") read as a
        # contradiction of "not confirmed" (found by review): the confirmation is the verdict
        said = "" if confirmed else f" {rep.test.decision}: {rep.test.reason}"
        rows.append(("test delta", f"{delta}{said}"))
    if rep.confirmation is not None:
        rows.append(("confirmation", rep.confirmation.sentence))
    if rep.error_control:
        rows.append(("error control", rep.error_control))
    rows.append(
        (
            "budget spent",
            f"tokens {token_count(spent.tokens)}, cost ${spent.cost_usd or 0:.4f}, "
            f"command time {spent.wall_seconds or 0:.1f} s "
            f"(campaign: tokens {token_count(total.tokens)}, cost ${total.cost_usd or 0:.4f})",
        )
    )
    if rep.ceilings_text():
        rows.append(("ceilings", f"{rep.ceilings_text()} (the campaign's)"))
    if rep.apply is not None:
        applied = f"{rep.apply.policy}: {rep.apply.status} {rep.apply.message}".strip()
        if rep.apply.proposal_dir and rep.apply.proposal_dir not in applied:
            applied += f" ({rep.apply.proposal_dir})"
        rows.append(("apply", applied))
    if rep.message:
        rows.append(("note", rep.message))
    funnel = Counter(entry.terminal for entry in rep.funnel)
    rows.append(("funnel", ", ".join(f"{name} {funnel.get(name, 0)}" for name in TERMINALS)))
    if rep.failures:
        rows.append(("failures", str(len(rep.failures))))
    return rows


def _shown(value: str) -> Text:
    """A report's words as text: an apply's reason quotes the ``--check`` command's stderr,
    which the candidate under check can write (found by review: ``ESC ]0;...`` in it set the
    terminal's title through ``evolane report``)."""
    from evolane.messages import printable

    return Text(printable(value))


def _print_report(rep: Report, run_dir: Path, store: Path, blocked: str | None) -> None:
    console = wide_console()
    table = Table(title=f"evolane run {rep.run_id}", show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for name, value in _summary_rows(rep):
        table.add_row(name, _shown(value))
    console.print(table)
    if rep.decisions:
        from evolane.campaign import candidate_cell

        slots = {(f.cycle, f.iteration, f.slot): f for f in rep.funnel}
        decisions = Table(title="decisions")
        for column in ("cycle", "iteration", "slot", "candidate", "decision", "reason"):
            decisions.add_column(column, no_wrap=column != "reason", overflow="fold")
        for d in rep.decisions:
            decisions.add_row(
                str(d.cycle),
                str(d.iteration),
                str(d.slot),
                _shown(
                    candidate_cell(d.digest, slots.get((d.cycle, d.iteration, d.slot))).strip("`")
                ),
                Text(d.decision),
                _shown(d.reason),
            )
        console.print(decisions)
    else:
        console.print("decisions: none")
    for name in ("report.json", "report.md", "report.html"):
        if (run_dir / name).is_file():
            console.print(Text(f"{name}: {run_dir / name}"), soft_wrap=True)
    if rep.status == "interrupted" and blocked is None:
        console.print("Continue this run with:")
        console.print(Text(f"  {resume_command(rep.run_id, store)}"), soft_wrap=True)
    elif rep.status == "interrupted":
        console.print(Text(f"This run cannot resume: {blocked}"))


# -- evolane schema --------------------------------------------------------------------------


def schema_document(which: str) -> dict[str, Any]:
    """The JSON Schema document named ``which`` (one of `SCHEMAS`); KeyError otherwise."""
    if which == "messages":
        from evolane.messages import message_schemas

        return message_schemas()
    if which == "events":
        from evolane.messages import event_schemas

        return event_schemas()
    if which == "report":
        from evolane.campaign import Report

        return Report.model_json_schema()
    if which == "trajectory":
        from evolane.inputs import trajectory_schema

        return trajectory_schema()
    raise KeyError(which)


def schema(
    which: Annotated[
        str, typer.Argument(help="messages | events | report | trajectory")
    ] = "messages",
) -> None:
    """Print a JSON Schema: the messages, the progress events (by kind), report.json or a
    trajectory record (one line of a --from-trajectory file)."""
    if which not in SCHEMAS:
        fail_usage(f"unknown schema {which!r}; choose from: {', '.join(SCHEMAS)}")
    write_json(schema_document(which))
