"""The commands that walk every run of a store (``fsck``, ``runs``) tell how far they are on
stderr, and ``runs`` lays a long listing out as plain text (found by review: ``fsck`` on
10,000 runs was silent for 82 s, ``runs`` on 100,000 for 246 s, rich drawing ~9 ms a row)."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from evolane.campaign import CampaignConfig, ReportSummary, RunRecord, StoreLayout, save_run
from evolane.cli._runs import CAMPAIGN_COLUMNS, RUN_COLUMNS, _print_runs, plain_table, run_rows
from evolane.cli._tally import AFTER_ENV, Tally, TallySettings
from evolane.messages import ArtifactRef
from tests.campaign_helpers import read_terminal

RUNS = 40
T0 = 1_767_261_600.0  # 2026-01-01 10:00 UTC
CONFIG = CampaignConfig(
    target="skill", dataset="cases.jsonl", replay="replay {case_file}", optimizer="opt {workdir}"
)


def _record(index: int) -> RunRecord:
    """A run of its own campaign: finished with a summary, interrupted, or running (killed)."""
    status = ("finished", "interrupted", "running")[index % 3]
    summary = ReportSummary(best_val=index / RUNS, wall_seconds=index + 0.5, report_bytes=0)
    return RunRecord(
        run_id=f"r-{index:04d}",
        campaign_id=f"c-{index % 4}",
        cycle=index % 2,
        created=T0 + 60 * index,
        config=CONFIG,
        dataset_digest="sha256:" + "d" * 64,
        seed_ref=ArtifactRef(digest="sha256:" + "a" * 64, size=1),
        parent_ref=ArtifactRef(digest="sha256:" + "a" * 64, size=1),
        status=status,  # type: ignore[arg-type]
        summary=summary if status == "finished" else None,
        session_started=None,
    )


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A store of `RUNS` runs, one of them with an unreadable run.json and one with a
    damaged journal line (fsck has damage to count)."""
    root = tmp_path / "store"
    layout = StoreLayout(root)
    for index in range(RUNS):
        save_run(layout, _record(index))
    (layout.run_dir("r-0007") / "run.json").write_text("not json")
    (layout.run_dir("r-0010") / "events.jsonl").write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    for path in root.glob("runs/*/run.json"):
        os.utime(path, (T0, T0))  # long written: no run is within its opening grace
    return root


def _evolane(*args: str, after: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, AFTER_ENV: after}
    env.pop("COLUMNS", None)
    command = [sys.executable, "-m", "evolane", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize(
    "args",
    [("fsck",), ("runs",), ("runs", "--json")],
    ids=["fsck", "runs", "runs-json"],
)
def test_a_store_walk_tells_its_progress_on_stderr_and_stdout_is_unchanged(
    store: Path, args: tuple[str, ...]
) -> None:
    """With the first line due at once (``EVOLANE_PROGRESS_AFTER=0``), stderr counts the
    runs (and fsck's damage); stdout is byte for byte what a walk that shows none prints.
    Found by review: both commands were silent however long they took."""
    shown = _evolane(*args, "--store", str(store), after="0")
    quiet = _evolane(*args, "--store", str(store), after="3600")
    assert shown.returncode == quiet.returncode == (1 if args == ("fsck",) else 0), shown.stderr
    assert shown.stdout == quiet.stdout and shown.stdout
    assert quiet.stderr == ""
    lines = shown.stderr.splitlines()
    command = args[0]
    assert lines and all(line.startswith(f"{command}: ") for line in lines), shown.stderr
    if command == "fsck":
        printed = shown.stdout.splitlines()
        assert len(set(printed)) == len(printed)  # each problem once
        found = re.search(r"(\d+) problems found", shown.stdout)
        assert found is not None and int(found[1]) > 2
        assert lines[-1] == f"fsck: {RUNS} of {RUNS} runs, {found[1]} damaged"
        assert re.fullmatch(r"fsck: \d+ objects, 0 damaged so far", lines[0])
    else:
        assert lines[0] == f"runs: 0 of {RUNS} runs" and lines[-1] == f"runs: {RUNS} of {RUNS} runs"


def test_a_plain_line_comes_at_most_every_interval_and_a_last_one_at_the_end() -> None:
    stream = io.StringIO()
    settings = TallySettings(after=0, plain_interval=3600)
    with Tally("fsck", counts_damage=True, settings=settings, stream=stream) as tally:
        tally.begin("runs", 100_000)
        for _ in range(12_000):
            tally.tick()
        tally.tick(damaged=3)
    assert stream.getvalue().splitlines() == [
        "fsck: 0 of 100,000 runs, 0 damaged so far",
        "fsck: 12,001 of 100,000 runs, 3 damaged",
    ]
    silent = io.StringIO()
    with Tally("runs", settings=TallySettings(after=3600), stream=silent) as tally:
        tally.begin("runs", 10)
        tally.tick(10)
    assert silent.getvalue() == ""  # a walk shorter than `after` says nothing


def test_a_progress_delay_that_is_no_number_is_one_error_line(store: Path) -> None:
    done = _evolane("runs", "--store", str(store), after="soon")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"evolane: error: {AFTER_ENV}='soon': not a number of seconds (>= 0)\n"


def _cells(lines: list[str]) -> list[list[str]]:
    """The rows of a table as printed (a title, a blank line, a header, a rule, rows)."""
    return [re.split(r" {2,}", line.strip()) for line in lines if line.strip()]


def test_the_plain_table_lists_the_same_runs_as_the_rich_one(store: Path) -> None:
    """Found by review: rich's layout took ~9 ms a row (246 s for 100,000 runs). A listing
    not to a terminal (or longer than `RICH_ROWS`) is plain text with the same cells."""
    rows = run_rows(StoreLayout(store))
    assert {row["status"] for row in rows} == {"finished", "interrupted", "killed", "unreadable"}
    out = io.StringIO()
    _print_runs(Console(file=out, width=200, force_terminal=False), rows)
    rich_rows = [cells for cells in _cells(out.getvalue().splitlines()) if len(cells) > 1]
    rich_rows = [cells for cells in rich_rows if not set(cells[0]) <= {"─"}]
    done = _evolane("runs", "--store", str(store), after="3600")
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    runs_table = printed[: printed.index("campaigns")]
    assert runs_table[:2] == ["runs", ""]
    plain_rows = [cells for cells in _cells(runs_table[1:]) if not set(cells[0]) <= {"-"}]
    assert plain_rows == rich_rows and len(plain_rows) == RUNS + 1  # and the header
    assert plain_rows[0] == list(RUN_COLUMNS)
    assert [cells[0] for cells in plain_rows[1:]] == [row["run_id"] for row in rows]
    campaigns = _cells(printed[printed.index("campaigns") + 1 :])
    assert campaigns[0] == list(CAMPAIGN_COLUMNS)  # the store holds no campaign.json


def test_plain_table_pads_each_column_to_its_widest_cell() -> None:
    lines = list(plain_table("t", ("a", "bb"), lambda: iter([("xyz", "1"), ("-", "22222")])))
    assert lines == ["t", "", "a    bb", "---  -----", "xyz  1", "-    22222", ""]


def test_on_a_terminal_stderr_the_progress_is_a_live_line_that_is_gone_at_the_end(
    store: Path,
) -> None:
    """stderr a terminal (stdout a pipe): the line is drawn and erased (rich's live view,
    transient), and stdout is what it is without it."""
    master, slave = pty.openpty()
    env = {**os.environ, AFTER_ENV: "0"}
    command = [sys.executable, "-m", "evolane", "fsck", "--store", str(store)]
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=env
    )
    os.close(slave)
    written = read_terminal(master)
    assert process.stdout is not None
    stdout = process.stdout.read().decode()
    assert process.wait(timeout=120) == 1
    drawn = written.decode()
    assert "fsck: " in drawn and " runs, " in drawn and "damaged so far" in drawn
    assert "\x1b[" in drawn  # cursor moves: the line is redrawn in place, then erased
    assert stdout == _evolane("fsck", "--store", str(store), after="3600").stdout
