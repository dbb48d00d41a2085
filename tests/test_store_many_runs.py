"""A store that holds many runs: what a start and a listing read of them stays bounded (found
by soak review: a start read every report in the store, 15 s in a store of 3,000 runs, and
``evolane runs`` parsed every report whole, 37 s)."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import trio

from evolane.campaign import _history
from evolane.campaign._history import HISTORY_RUNS
from evolane.campaign._prepare import prepare_run
from evolane.campaign._run import RunRequest, run_campaign
from evolane.campaign._runs import StoreLayout, load_run, save_run
from evolane.cli._runs import run_rows
from tests.campaign_helpers import toy_config, write_toy


def _earlier_runs(store: Path, count: int, replay: str) -> None:
    """``count`` finished runs of an agent with the ``replay`` command (a report each)."""
    for index in range(count):
        folder = store / "runs" / f"r-20260101-{index:06d}-aaaaaa"
        folder.mkdir(parents=True)
        (folder / "run.json").write_text("{}")
        report = {
            "config": {"replay": replay, "replay_concurrency": 1},
            "measurements": [{"units_run": 10}],
            "wall_seconds": 5.0,
            "budget": {"spent": {}},
        }
        (folder / "report.json").write_text(json.dumps(report))


def _reports_read(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The report.json files a start reads from here on (read for real)."""
    seen: list[Path] = []
    real = _history.read_json

    def spy(path: Path, *args: Any, **kwargs: Any) -> Any:
        if Path(path).name == "report.json":
            seen.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(_history, "read_json", spy)
    return seen


def test_a_start_reads_a_bounded_number_of_earlier_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_toy(tmp_path, {"default": "noop"})
    config = toy_config(paths, iterations=1, population=1)
    _earlier_runs(paths["store"], HISTORY_RUNS * 3, replay="another agent's replay")
    seen = _reports_read(monkeypatch)
    prepared = prepare_run(config)
    assert prepared.estimate.basis and "earlier runs" not in prepared.estimate.basis
    assert 0 < len(seen) <= HISTORY_RUNS


def test_a_start_still_takes_the_newest_comparable_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_toy(tmp_path, {"default": "noop"})
    config = toy_config(paths, iterations=1, population=1)
    _earlier_runs(paths["store"], HISTORY_RUNS // 2, replay=config.measure.replay)
    seen = _reports_read(monkeypatch)
    prepared = prepare_run(config)
    assert "typical unit 0.50 s from earlier runs" in prepared.estimate.basis
    assert len(seen) == 1


# -- `evolane runs`: a summary in run.json, the report read only when there is none ----------


async def _finished_run(tmp_path: Path) -> tuple[StoreLayout, str]:
    """A store holding one finished toy run (a real campaign, through the public runner)."""
    paths = write_toy(tmp_path, {"default": "fix:2"})
    with trio.fail_after(120):
        outcome = await run_campaign(RunRequest(toy_config(paths, iterations=1, population=1)))
    assert outcome.report is not None and outcome.report.status == "finished"
    return StoreLayout(paths["store"]), outcome.report.run_id


def _listed(layout: StoreLayout) -> dict[str, Any]:
    """The run's row as ``evolane runs --json`` prints it (the real CLI)."""
    command = [sys.executable, "-m", "evolane", "runs", "--json", "--store", str(layout.root)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    (row,) = json.loads(done.stdout)["runs"]
    return row


def _fsck(layout: StoreLayout) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "evolane", "fsck", "--store", str(layout.root)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


async def test_runs_lists_the_summary_in_run_json_without_reading_the_report(
    tmp_path: Path,
) -> None:
    """Found by soak review: ``runs`` parsed every run's whole report.json, 37 s for 3,000
    runs of 750 KB. The run's end writes what the listing shows into run.json."""
    layout, run_id = await _finished_run(tmp_path)
    report = json.loads((layout.run_dir(run_id) / "report.json").read_bytes())
    shown = {
        "baseline_val": report["scores"]["baseline_val"]["mean"],
        "best_val": report["scores"]["best_val"]["mean"],
        "wall_seconds": report["wall_seconds"],
    }
    assert shown["best_val"] > shown["baseline_val"]
    summary = load_run(layout, run_id).summary
    assert summary is not None and summary.model_dump(exclude={"report_bytes"}) == shown
    assert _fsck(layout).returncode == 0
    # The report made unparseable at the size it was written with: the listing still shows
    # the run's figures, so it never parsed the report (fsck names the report).
    path = layout.run_dir(run_id) / "report.json"
    path.write_bytes(b"x" * path.stat().st_size)
    row = _listed(layout)
    assert {name: row[name] for name in shown} == shown and row["note"] is None
    checked = _fsck(layout)
    assert checked.returncode == 1 and f"damaged record {path}: " in checked.stdout


async def test_a_run_json_without_summary_lists_from_its_report_up_to_a_cap(
    tmp_path: Path,
) -> None:
    """A run from before summaries lists from its report; a report over the cap (50 MB
    here) is listed with a note, never read whole."""
    layout, run_id = await _finished_run(tmp_path)
    summarised = _listed(layout)
    record = load_run(layout, run_id)
    save_run(layout, record.model_copy(update={"summary": None}))
    assert _listed(layout) == summarised and _fsck(layout).returncode == 0
    path = layout.run_dir(run_id) / "report.json"
    with path.open("r+b") as report:
        report.truncate(50 << 20)  # a report of 50 MB (sparse)
    for summary in (None, record.summary):  # none, or one of a report of another size
        save_run(layout, record.model_copy(update={"summary": summary}))
        tracemalloc.start()
        try:
            (row,) = run_rows(layout)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 4 << 20, f"the listing took {peak} bytes for a 50 MB report"
        assert row["best_val"] is None and row["report"] == str(path)
        assert row["note"].startswith("report.json holds 50.0 MiB, more than a listing reads")
    command = [sys.executable, "-m", "evolane", "runs", "--store", str(layout.root)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    assert f"{run_id}: report.json holds 50.0 MiB" in done.stdout


async def test_fsck_repair_writes_the_summary_an_older_run_json_lacks(tmp_path: Path) -> None:
    """A store older than summaries stayed slow to list (about 30 s for 3,000 runs, each
    report read): ``fsck --repair`` writes each ended run's summary into its run.json, and
    rewrites one that disagrees with the report; a plain fsck writes nothing."""
    layout, run_id = await _finished_run(tmp_path)
    record = load_run(layout, run_id)
    assert record.summary is not None
    for stored in (None, record.summary.model_copy(update={"best_val": 0.125})):
        save_run(layout, record.model_copy(update={"summary": stored}))
        _fsck(layout)
        assert load_run(layout, run_id).summary == stored  # no repair asked: untouched
        command = [sys.executable, "-m", "evolane", "fsck", "--repair", "--store", str(layout.root)]
        repaired = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert "wrote the listing's summary into the run.json of 1 runs" in repaired.stdout
        assert load_run(layout, run_id) == record
        assert _fsck(layout).returncode == 0


async def test_fsck_reports_a_summary_that_disagrees_with_its_report(tmp_path: Path) -> None:
    layout, run_id = await _finished_run(tmp_path)
    record = load_run(layout, run_id)
    assert record.summary is not None
    wrong = record.summary.model_copy(update={"best_val": 0.125})
    save_run(layout, record.model_copy(update={"summary": wrong}))
    run_json = layout.run_dir(run_id) / "run.json"
    checked = _fsck(layout)
    assert checked.returncode == 1, checked.stdout
    assert (
        f"damaged record {run_json}: its summary disagrees with report.json (best_val 0.125 "
        f"against {record.summary.best_val}); used by run {run_id}"
    ) in checked.stdout.splitlines()
    (layout.run_dir(run_id) / "report.json").unlink()
    save_run(layout, record)
    missing = _fsck(layout)
    assert missing.returncode == 1
    assert f"damaged record {run_json}: its summary is of a report.json that is missing" in (
        missing.stdout
    )
    assert _listed(layout)["best_val"] is None  # nothing listed of a report that is gone


async def test_a_resume_clears_the_summary_of_the_report_it_replaces(tmp_path: Path) -> None:
    layout, run_id = await _finished_run(tmp_path)
    record = load_run(layout, run_id)
    save_run(layout, record.model_copy(update={"status": "interrupted"}))
    prepared = prepare_run(record.config, resume_run=run_id)
    assert prepared.run.status == "running" and prepared.run.summary is None
