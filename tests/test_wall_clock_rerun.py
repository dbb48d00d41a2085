"""A cycle a wall-clock stop cut short, run again with ``--resume-campaign``, through the real
CLI (``evolane`` runs as a subprocess, replays are real commands that log each start): the
units the stopped run finished are reused, not paid for again, the decisions are an
uninterrupted run's, and the campaign's books count every replay that ran once."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.campaign_helpers import toy_flags, write_toy

EVOLANE = [sys.executable, "-m", "evolane"]
TOKENS = 1000
DONE_BEFORE_HANG = 8
"""Replays that end before the rest hang (while the ``hang`` file exists): the wall clock
then stops the run with them journaled."""
REPLAY = (
    'sh -c \'echo "$EVOLANE_UNIT" >> "$3/started"; '
    'echo "{{\\"tokens\\": 1000}}" > "$2/usage.json"; '
    'if [ -e "$3/hang" ] && [ "$(wc -l < "$3/started")" -gt ' + str(DONE_BEFORE_HANG) + " ]; "
    "then sleep 3600; fi; "
    'cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\' '
    "replay {candidate} {output_dir} LOG"
)


def _campaign(root: Path) -> tuple[list[str], Path]:
    """The toy campaign's flags (one iteration of one slot) and the folder its replays log to."""
    log = root / "log"
    log.mkdir(parents=True)
    paths = write_toy(root / "toy", {"default": "fix:2"})
    flags = toy_flags(paths, root / "st")
    flags[flags.index("--replay") + 1] = REPLAY.replace("LOG", str(log))
    args = ["optimize", *flags, "--iterations", "1", "--population", "1"]
    return [*args, "--expose-rw", str(log), "--progress", "none"], log


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVOLANE, *args], capture_output=True, text=True, timeout=300)


def _started(log: Path) -> list[str]:
    path = log / "started"
    return path.read_text().split() if path.exists() else []


def _reports(store: Path) -> list[dict[str, Any]]:
    runs = sorted((store / "runs").iterdir())
    return [json.loads((run / "report.json").read_text()) for run in runs]


def _succeeded_names(run_dir: Path) -> set[str]:
    """The replay names (``EVOLANE_UNIT``) of the units the run's journal holds succeeded."""
    names = set()
    for line in (run_dir / "journal.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("type") == "unit" and record["status"] == "succeeded":
            names.add(record["replay"]["name"])
    return names


def _decisions(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    keys = ("cycle", "iteration", "slot", "digest", "decision", "reason")
    return [tuple(d[key] for key in keys) for d in report["decisions"]]


def test_the_cycle_a_wall_clock_stop_cut_short_reuses_what_it_finished(tmp_path: Path) -> None:
    """The stopped run journals the units it finished; the next ``--resume-campaign`` runs
    none of them again (it replayed every one: 24 of 24 paid twice), only the units the stop
    cut; its decisions are the uninterrupted run's and the campaign spent what ran."""
    whole_args, whole_log = _campaign(tmp_path / "whole")
    whole = _run(whole_args)
    assert whole.returncode == 0, whole.stderr
    (uninterrupted,) = _reports(tmp_path / "whole" / "st")

    args, log = _campaign(tmp_path / "cut")
    (log / "hang").touch()
    stopped = _run([*args, "--wall-clock-budget", "8"])
    assert stopped.returncode == 3, stopped.stderr
    first = _started(log)
    (run_dir,) = (tmp_path / "cut" / "st" / "runs").iterdir()
    finished = _succeeded_names(run_dir)
    assert finished, "the stopped run finished no unit: nothing to reuse"
    (log / "hang").unlink()
    campaign = json.loads((run_dir / "run.json").read_text())["campaign_id"]
    rerun = _run([*args, "--resume-campaign", campaign, "--wall-clock-budget", "600"])
    assert rerun.returncode == 0, rerun.stderr
    second = _started(log)[len(first) :]

    assert not finished & set(second), "a unit the stopped run finished was replayed again"
    assert max(collections.Counter(second).values()) == 1
    assert len(first) + len(second) <= len(_started(whole_log)) + len(first) - len(finished)
    stop_report, report = _reports(tmp_path / "cut" / "st")
    assert stop_report["status"] == "budget_limited"
    assert _decisions(report) == _decisions(uninterrupted)
    assert report["scores"] == uninterrupted["scores"]
    assert stop_report["budget"]["spent"]["tokens"] == len(first) * TOKENS
    assert report["budget"]["spent"]["tokens"] == len(second) * TOKENS
    assert report["budget"]["campaign_spent"]["tokens"] == (len(first) + len(second)) * TOKENS
    assert sum(m["units_reused"] for m in report["measurements"]) >= len(finished)
