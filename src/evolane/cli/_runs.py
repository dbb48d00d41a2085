"""``evolane runs``: the runs and campaigns in a store, one row each (read-only)."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from evolane.cli._exits import fail_usage
from evolane.cli._output import (
    StoreOption,
    number,
    stamp,
    store_of,
    wide_console,
    write_json,
    written_ago,
)
from evolane.cli._tally import Tally

if TYPE_CHECKING:
    from evolane.campaign import RunRecord, StoreLayout


LISTED_REPORT_BYTES = 16 << 20
"""The largest ``report.json`` the listing reads, for a run whose ``run.json`` holds no summary
of it (written before summaries existed, or a crash came between the two files); a larger one
is listed with a note, never read (found by soak review: ``runs`` parsed every report whole)."""


def _report_fields(record: RunRecord, report_json: Path) -> dict[str, Any] | None:
    """What the listing shows of the run's report (None when it has none): the summary in
    ``run.json`` when it is of this report (the size it was written with), else the fields
    read from the report itself, at most `LISTED_REPORT_BYTES` of it."""
    from evolane.campaign import ReportSummary
    from evolane.store import read_json

    try:
        info = os.stat(report_json)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    summary, note = record.summary, None
    if summary is None or summary.report_bytes != info.st_size:
        summary = None
        if info.st_size > LISTED_REPORT_BYTES:
            note = (
                f"report.json holds {info.st_size / (1 << 20):.1f} MiB, more than a listing "
                f"reads ({LISTED_REPORT_BYTES >> 20} MiB): `evolane report {record.run_id}`"
            )
        else:
            try:
                summary = ReportSummary.of(read_json(report_json, LISTED_REPORT_BYTES), 0)
            except (OSError, ValueError) as error:
                note = f"report.json cannot be read ({type(error).__name__}): `evolane fsck`"
    fields = summary.model_dump(exclude={"report_bytes"}) if summary is not None else {}
    return {**fields, "report": str(report_json), "note": note}


RICH_ROWS = 1_000
"""Rows up to which ``runs`` draws its tables with rich on a terminal; a longer listing,
or one not to a terminal, is laid out as plain text (`plain_table`): rich took ~9 ms a
row, 246 s for 100,000 runs (found by review)."""

KILLED = "killed"
"""The status listed for a run whose run.json still says ``running`` while no process holds
it: it was killed (SIGKILL, a crash, a reboot) and never recorded its end, so it would say
``running`` forever (found by review); ``evolane optimize --resume`` continues it."""
OPENING_GRACE = 5.0
"""Seconds after its run.json was written in which a run no process holds yet is still
``running``: a session opening its run takes its journal's lock just after."""


def run_rows(layout: StoreLayout, tally: Tally | None = None) -> list[dict[str, Any]]:
    """One row per run in the store, oldest first (an unreadable run.json is listed as such).

    ``status`` is run.json's, except that a ``running`` run no process holds is `KILLED`;
    ``live`` says whether a process holds the run now, ``silent_seconds`` (a live run's)
    how long since it wrote its newest event; the scores and wall come from the
    report's summary in run.json (`_report_fields`); ``note`` says why they are missing.
    ``tally`` is told of each run read."""
    rows: list[dict[str, Any]] = []
    run_ids = layout.run_ids()
    if tally is not None:
        tally.begin("runs", len(run_ids))
    if not run_ids:  # an empty store loads no record's model (nor what they import)
        return rows
    from evolane.campaign import load_run, run_is_live

    for run_id in run_ids:
        if tally is not None:
            tally.tick()
        row: dict[str, Any] = dict.fromkeys(
            ("campaign_id", "cycle", "created", "baseline_val", "best_val", "wall_seconds")
        )
        row.update(run_id=run_id, status="unreadable", report=None, note=None, live=False)
        row["silent_seconds"] = None
        try:
            record = load_run(layout, run_id)
        except (OSError, ValueError):
            rows.append(row)
            continue
        live = record.status == "running" and run_is_live(layout, run_id)
        killed = record.status == "running" and not live and not run_opening(layout, run_id)
        row.update(
            campaign_id=record.campaign_id,
            cycle=record.cycle,
            status=KILLED if killed else record.status,
            created=record.created,
            live=live,
            silent_seconds=_silence(layout, run_id) if live else None,
        )
        row.update(_report_fields(record, layout.run_dir(run_id) / "report.json") or {})
        rows.append(row)
    rows.sort(key=lambda row: (row["created"] or 0.0, row["run_id"]))
    return rows


def _silence(layout: StoreLayout, run_id: str) -> float:
    """Seconds since a live run wrote its newest event (its events file's time): a running
    run that has said nothing for long (a hung unit, a stopped or blocked process) must not
    be listed as one at work (found by review: `runs` said `running` alike for both)."""
    return round(written_ago(layout.run_dir(run_id) / "events.jsonl"), 1)


def run_opening(layout: StoreLayout, run_id: str) -> bool:
    """Whether the run's run.json was written within `OPENING_GRACE` seconds."""
    return written_ago(layout.run_dir(run_id) / "run.json") < OPENING_GRACE


def campaign_rows(layout: StoreLayout) -> list[dict[str, Any]]:
    """One row per campaign in the store, least recently updated first."""
    rows: list[dict[str, Any]] = []
    campaign_ids = layout.campaign_ids()
    if not campaign_ids:
        return rows
    from evolane.campaign import load_campaign

    for campaign_id in campaign_ids:
        try:
            state = load_campaign(layout, campaign_id)
        except (OSError, ValueError):
            rows.append(
                {
                    "campaign_id": campaign_id,
                    "status": "unreadable",
                    "cycles": None,
                    "best_val": None,
                    "runs": None,
                    "updated": None,
                }
            )
            continue
        rows.append(
            {
                "campaign_id": state.campaign_id,
                "status": state.status,
                "cycles": state.cycles,
                "best_val": state.best_val,
                "runs": len(state.runs),
                "updated": state.updated,
            }
        )
    rows.sort(key=lambda row: (row["updated"] or 0.0, row["campaign_id"]))
    return rows


def runs(
    store: StoreOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the lists as JSON.")] = False,
) -> None:
    """List the runs and campaigns in the store, newest last."""
    from evolane.campaign import StoreLayout

    store = store_of(store)
    if store.exists() and not store.is_dir():
        fail_usage(f"--store {store} is not a directory")
    layout = StoreLayout(store)
    with Tally("runs") as tally:
        run_list, campaigns = run_rows(layout, tally), campaign_rows(layout)
    if as_json:
        write_json({"store": str(store), "runs": run_list, "campaigns": campaigns})
        return
    console = wide_console()
    if not run_list and not campaigns:
        console.print(Text(f"No runs yet in {store}. Start one with `evolane optimize`."))
        return
    if not console.is_terminal or len(run_list) + len(campaigns) > RICH_ROWS:
        write_lines(plain_table("runs", RUN_COLUMNS, lambda: _run_cells(run_list)))
        _print_notes(console, run_list)
        write_lines(plain_table("campaigns", CAMPAIGN_COLUMNS, lambda: _campaign_cells(campaigns)))
        return
    _print_runs(console, run_list)
    _print_campaigns(console, campaigns)


def _list_table(title: str, columns: tuple[str, ...], no_wrap: tuple[str, ...]) -> Table:
    table = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        title_justify="left",
    )
    for column in columns:
        wrap = column not in no_wrap
        table.add_column(column, no_wrap=not wrap, overflow="fold", min_width=len(column))
    return table


RUN_COLUMNS = ("run", "campaign", "cycle", "status", "created", "best val", "wall")
CAMPAIGN_COLUMNS = ("campaign", "status", "cycles", "best val", "runs", "updated")


def _run_cells(rows: list[dict[str, Any]]) -> Iterator[tuple[str, ...]]:
    """The cells of the runs table (`RUN_COLUMNS`), one tuple a row, as both tables show."""
    from evolane.cli._amounts import duration
    from evolane.cli._view import QUIET_AFTER

    for row in rows:
        wall, silent = row["wall_seconds"], row["silent_seconds"]
        status = row["status"]
        if silent is not None and silent >= QUIET_AFTER:
            status += f", no event for {duration(silent)}"
        yield (
            row["run_id"],
            row["campaign_id"] or "-",
            "-" if row["cycle"] is None else str(row["cycle"]),
            status,
            stamp(row["created"], "%Y-%m-%d %H:%M"),
            number(row["best_val"]),
            "-" if wall is None else f"{wall:.1f} s",
        )


def _campaign_cells(rows: list[dict[str, Any]]) -> Iterator[tuple[str, ...]]:
    """The cells of the campaigns table (`CAMPAIGN_COLUMNS`), one tuple a row."""
    return (
        (
            row["campaign_id"],
            row["status"],
            "-" if row["cycles"] is None else str(row["cycles"]),
            number(row["best_val"]),
            "-" if row["runs"] is None else str(row["runs"]),
            stamp(row["updated"], "%Y-%m-%d %H:%M"),
        )
        for row in rows
    )


def _print_runs(console: Console, rows: list[dict[str, Any]]) -> None:
    whole = ("run", "status") if console.width >= 120 else ("status",)  # else every column fits
    table = _list_table("runs", RUN_COLUMNS, no_wrap=whole)
    for cells in _run_cells(rows):
        table.add_row(*(Text(cell) for cell in cells))
    console.print(table)
    _print_notes(console, rows)


def _print_notes(console: Console, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        if row["note"]:
            console.print(Text(f"{row['run_id']}: {row['note']}"))


def _print_campaigns(console: Console, rows: list[dict[str, Any]]) -> None:
    table = _list_table("campaigns", CAMPAIGN_COLUMNS, no_wrap=("status",))
    for cells in _campaign_cells(rows):
        table.add_row(*(Text(cell) for cell in cells))
    console.print(table)


def plain_table(
    title: str, columns: tuple[str, ...], rows: Callable[[], Iterable[tuple[str, ...]]]
) -> Iterator[str]:
    """The lines of a table laid out as plain text (cells padded to their column's widest,
    two spaces apart, nothing folded): what rich's table shows, at the cost of the rows.
    ``rows`` makes the cells anew for each of the two passes (widths, then lines), so no
    listing holds them all."""
    widths = [len(column) for column in columns]
    for row in rows():
        widths = [max(width, len(cell)) for width, cell in zip(widths, row, strict=True)]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))

    yield title
    yield ""
    yield line(columns).rstrip()
    yield "  ".join("-" * width for width in widths)
    for row in rows():
        yield line(row).rstrip()
    yield ""


def write_lines(lines: Iterator[str]) -> None:
    """Write ``lines`` on stdout (buffered by it), each ended by a newline."""
    sys.stdout.writelines(f"{text}\n" for text in lines)
