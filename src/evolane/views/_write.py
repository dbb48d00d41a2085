"""Writing ``report.html``: gather a finished run's report, events and unit records (each
read bounded), fold the events through the view's reducer, draw the page, write it whole.

The one place the page touches files; `render_html` itself is pure.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from evolane.store import BlobStore, StoreError, read_at_most, write_bytes_atomic
from evolane.views._data import PageData, best_path, candidates_of, case_changes, heat_cells
from evolane.views._events import read_events
from evolane.views._page import render_html
from evolane.views._state import ViewState

MAX_REPORT_BYTES = 64 << 20
"""A ``report.json`` larger than this is not read (reports are summary-sized)."""
MAX_UNITS_BYTES = 128 << 20
"""Unit records read at most over all measurements; beyond, the page says what is missing."""
MAX_DIFF_BYTES = 256 << 10
"""The page shows at most this much of the seed-to-best diff (the whole one is linked)."""

Warn = Callable[[str], None]


class ReportPageError(RuntimeError):
    """The run has no readable report to draw (one line naming the file)."""


def _read_report(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "report.json"
    try:
        if path.stat().st_size > MAX_REPORT_BYTES:
            raise ReportPageError(f"{path}: larger than {MAX_REPORT_BYTES} bytes")
        report = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise ReportPageError(f"{path}: no report (the run has not finished)") from None
    except orjson.JSONDecodeError as error:
        raise ReportPageError(f"{path}: not JSON ({error})") from None
    if not isinstance(report, dict):
        raise ReportPageError(f"{path}: not a report object")
    return report


def _read_blob(blobs: BlobStore, digest: str, limit: int) -> bytes | None:
    """A blob's bytes, read at most ``limit`` (None when longer or not what its digest
    says: a ref's recorded size is not trusted)."""
    with blobs.open(digest) as source:
        data = read_at_most(source, limit)
    if len(data) > limit or "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        return None
    return data


def _read_units(
    report: dict[str, Any], blobs: BlobStore, notes: list[str]
) -> dict[str, list[dict[str, Any]]]:
    units: dict[str, list[dict[str, Any]]] = {}
    budget = MAX_UNITS_BYTES
    for m in report.get("measurements") or []:
        name, digest = m.get("measurement_id"), (m.get("units_ref") or {}).get("digest")
        if not digest:
            continue
        try:
            data = _read_blob(blobs, digest, budget)
            loaded = orjson.loads(data) if data is not None else None
        except (StoreError, OSError, orjson.JSONDecodeError, ValueError) as error:
            notes.append(f"unit records of {name} unreadable: {error}")
            continue
        if data is None:
            notes.append(f"unit records of {name} not read (over the size cap, or corrupt)")
            continue
        budget -= len(data)
        if isinstance(loaded, list):
            units[str(name)] = [_slim(u) for u in loaded if isinstance(u, dict)]
    return units


_UNIT_FIELDS = ("unit", "case", "arm", "score", "status")


def _slim(unit: dict[str, Any]) -> dict[str, Any]:
    """The fields of a unit record the page reads (`views._data`, `views.run_kind`). Whole
    records, held for every unit of the run, were the page's memory peak at the end of a
    long run: 4 KiB a unit (74 MiB for 19,000 units, ~470 MiB under `MAX_UNITS_BYTES`),
    1 KiB slim."""
    slim = {key: unit[key] for key in _UNIT_FIELDS if key in unit}
    replay, judge = unit.get("replay"), unit.get("judge")
    if isinstance(replay, dict):
        failure = replay.get("failure")
        slim["replay"] = {
            "status": replay.get("status"),
            "failure": {"owner": failure.get("owner")} if isinstance(failure, dict) else None,
        }
    if isinstance(judge, dict):
        slim["judge"] = {"status": judge.get("status")}
    return slim


def _read_diff(report: dict[str, Any], blobs: BlobStore) -> tuple[str, bool]:
    ref = ((report.get("artifacts") or {}).get("best_diff")) or {}
    if not ref.get("digest"):
        return "", False
    try:
        with blobs.open(ref["digest"]) as source:
            data = read_at_most(source, MAX_DIFF_BYTES)
    except (StoreError, OSError):
        return "", False
    cut = len(data) > MAX_DIFF_BYTES
    return data[:MAX_DIFF_BYTES].decode("utf-8", "replace"), cut


def _links(report: dict[str, Any], run_dir: Path, blobs: BlobStore) -> dict[str, str]:
    links: dict[str, str] = {}
    artifacts = report.get("artifacts") or {}
    for name in ("seed_tree", "best_tree", "best_diff"):
        ref = artifacts.get(name) or {}
        if ref.get("digest"):
            links[name.replace("_", " ")] = os.path.relpath(blobs.path_of(ref["digest"]), run_dir)
    proposal = (report.get("apply") or {}).get("proposal_dir")
    if proposal:
        links["proposal"] = os.path.relpath(Path(proposal), run_dir)
    for name in ("report.json", "report.md", "events.jsonl"):
        links[name] = name
    return links


def page_data(
    run_dir: Path, blobs: BlobStore, warn: Warn, report: dict[str, Any] | None = None
) -> tuple[PageData, dict[str, str]]:
    """Everything the page of the run in ``run_dir`` draws, and its artifact links.
    ``report``: report.json as validated by its model (read raw from the file if None)."""
    report = _read_report(run_dir) if report is None else report
    state = ViewState()
    for event in read_events(run_dir / "events.jsonl", warn):
        state.fold(event)
    notes: list[str] = []
    units = _read_units(report, blobs, notes)
    candidates = candidates_of(report)
    columns, kinds, means = heat_cells(report, units)
    diff, cut = _read_diff(report, blobs)
    data = PageData(
        report=report,
        history=state.history,
        candidates=candidates,
        best_path=best_path(report, candidates, units),
        heatmap=kinds,
        heat_scores=means,
        columns=columns,
        changes={
            c.measurement_id: case_changes(units.get(c.measurement_id, []))
            for c in candidates
            if c.outcome == "accept" and c.measurement_id
        },
        diff=diff,
        diff_cut=cut,
        notes=notes,
    )
    if state.history.decisions_dropped:
        notes.append(f"{state.history.decisions_dropped} decisions past the plot's cap")
    return data, _links(report, run_dir, blobs)


def write_report_html(
    run_dir: Path, blobs: BlobStore, warn: Warn, report: dict[str, Any] | None = None
) -> Path:
    """Draw ``report.html`` beside the run's ``report.json`` (atomically) and say where."""
    data, links = page_data(run_dir, blobs, warn, report)
    path = run_dir / "report.html"
    write_bytes_atomic(path, render_html(data, links).encode("utf-8"))
    return path
