"""A cycle a wall-clock stop cut short, run again with ``--resume-campaign``, through the real
CLI (``evolane`` runs as a subprocess, replays are real commands that log each start): the
units the stopped run finished are reused, not paid for again, the decisions are an
uninterrupted run's, and the campaign's books count every replay that ran once."""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import sys
import time
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


def _campaign(root: Path, paths: dict[str, Path] | None = None) -> tuple[list[str], Path]:
    """The toy campaign's flags (one iteration of one slot; ``paths``: the toy `write_toy`
    wrote, else a new one) and the folder its replays log to."""
    log = root / "log"
    log.mkdir(parents=True)
    paths = paths or write_toy(root / "toy", {"default": "fix:2"})
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


def _journaled_succeeded(run_dir: Path) -> int:
    """How many succeeded units the journal of a run still going holds so far (its last
    line may be half written)."""
    journal = run_dir / "journal.jsonl"
    lines = journal.read_bytes().split(b"\n")[:-1] if journal.exists() else []
    records = [json.loads(line) for line in lines]
    return sum(r.get("type") == "unit" and r["status"] == "succeeded" for r in records)


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
    report = _books_match(tmp_path / "cut" / "st", uninterrupted, first, second)
    assert sum(m["units_reused"] for m in report["measurements"]) >= len(finished)


JUDGED_BEFORE_HANG = 2
"""Judgements that end before the rest hang (while the ``hang`` file exists)."""
JUDGE = (
    # each judgement takes its own number (mkdir is atomic): counting the log's lines after
    # appending raced judges that began together, which all read 3 and all hung
    'sh -c \'i=1; while [ "$i" -lt 9999 ] && ! mkdir "$3/ticket.$i" 2>/dev/null; '
    "do i=$((i + 1)); done; "
    'echo x >> "$3/judged"; '
    'if [ -e "$3/hang" ] && [ "$i" -gt ' + str(JUDGED_BEFORE_HANG) + " ]; "
    "then sleep 3600; fi; "
    'if grep -q yes "$2/output.json"; then echo "{{\\"score\\": 1.0}}"; '
    'else echo "{{\\"score\\": 0.0}}"; fi\' '
    "judge {case_file} {output_dir} LOG"
)


def _judged_campaign(root: Path) -> tuple[list[str], Path]:
    """`_campaign` whose replays never hang and whose judge command hangs after the first
    `JUDGED_BEFORE_HANG` while the log folder's ``hang`` file exists."""
    args, log = _campaign(root)
    args[args.index("--replay") + 1] = args[args.index("--replay") + 1].replace(
        'if [ -e "$3/hang" ]', 'if [ -e "$3/never" ]'
    )
    return [*args, "--judge", JUDGE.replace("LOG", str(log))], log


def _unjudged_names(run_dir: Path) -> set[str]:
    """The replay names of the run's journaled replays that no succeeded unit record judged."""
    replays = set()
    for line in (run_dir / "journal.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("type") == "replay":
            replays.add(record["replay"]["name"])
    return replays - _succeeded_names(run_dir)


def _stop_with_judges_hanging(root: Path) -> tuple[list[str], Path, str]:
    """`_judged_campaign` run to a wall-clock stop while its judges hang: its flags, log
    folder and campaign id (the ``hang`` file stays)."""
    args, log = _judged_campaign(root)
    (log / "hang").touch()
    stopped = _run([*args, "--wall-clock-budget", "8"])
    assert stopped.returncode == 3, stopped.stderr
    (run_dir,) = (root / "st" / "runs").iterdir()
    assert _unjudged_names(run_dir), "the stop left no replay unjudged: nothing to judge only"
    return args, log, json.loads((run_dir / "run.json").read_text())["campaign_id"]


def test_replays_a_wall_clock_stop_left_unjudged_are_judged_not_replayed(tmp_path: Path) -> None:
    """A replay that ended but whose judgement the wall-clock stop cut is journaled; the next
    ``--resume-campaign`` judges it without replaying it (it replayed each again: 12 of 12
    baselines twice) or charging it again; decisions and books are an uninterrupted run's."""
    whole_args, whole_log = _judged_campaign(tmp_path / "whole")
    whole = _run(whole_args)
    assert whole.returncode == 0, whole.stderr
    (uninterrupted,) = _reports(tmp_path / "whole" / "st")

    args, log, campaign = _stop_with_judges_hanging(tmp_path / "cut")
    first = _started(log)
    (run_dir,) = (tmp_path / "cut" / "st" / "runs").iterdir()
    unjudged = _unjudged_names(run_dir)
    (log / "hang").unlink()
    rerun = _run([*args, "--resume-campaign", campaign, "--wall-clock-budget", "600"])
    assert rerun.returncode == 0, rerun.stderr
    second = _started(log)[len(first) :]

    assert not unjudged & set(second), "a replay the stopped run finished was replayed again"
    assert max(collections.Counter(first + second).values()) == 1
    assert len(first) + len(second) == len(_started(whole_log))
    _books_match(tmp_path / "cut" / "st", uninterrupted, first, second)


def _books_match(
    store: Path, uninterrupted: dict[str, Any], first: list[str], second: list[str]
) -> dict[str, Any]:
    """Check the stopped run's and its rerun's reports in ``store`` against the
    ``uninterrupted`` one (same decisions and scores) and the replays each session started
    (each charged once, in its own session); the rerun's report."""
    stop_report, report = _reports(store)
    assert stop_report["status"] == "budget_limited"
    assert _decisions(report) == _decisions(uninterrupted)
    assert report["scores"] == uninterrupted["scores"]
    assert stop_report["budget"]["spent"]["tokens"] == len(first) * TOKENS
    assert report["budget"]["spent"]["tokens"] == len(second) * TOKENS
    assert report["budget"]["campaign_spent"]["tokens"] == (len(first) + len(second)) * TOKENS
    return report


def test_a_resumed_rerun_does_not_charge_again_the_replays_it_judged(tmp_path: Path) -> None:
    """The rerun judges the stopped run's replays, a Ctrl-C cuts it once some are judged,
    its ``--resume`` restores those units: their replays were charged by the stopped run
    only, so the books count each replay that ran once (they counted those again)."""
    args, log, campaign = _stop_with_judges_hanging(tmp_path)
    first = _started(log)
    (log / "judged").write_text("")  # the rerun's first judgements end, the next hang
    for ticket in log.glob("ticket.*"):
        ticket.rmdir()
    rerun = subprocess.Popen(
        [*EVOLANE, *args, "--resume-campaign", campaign, "--wall-clock-budget", "600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 240
    runs_dir = tmp_path / "st" / "runs"
    # the next judgement hangs and the first ones are journaled (a judge that has begun
    # is not one that has ended: a Ctrl-C at the third judge's start raced the second's end)
    while (
        len((log / "judged").read_text().split()) <= JUDGED_BEFORE_HANG
        or _journaled_succeeded(max(runs_dir.iterdir())) < JUDGED_BEFORE_HANG
    ):
        assert rerun.poll() is None and time.monotonic() < deadline, "no judgement hangs"
        time.sleep(0.05)
    rerun.send_signal(signal.SIGINT)
    rerun.communicate(timeout=120)
    assert rerun.returncode == 130
    (log / "hang").unlink()
    runs = sorted((tmp_path / "st" / "runs").iterdir())
    assert len(_succeeded_names(runs[-1])) >= JUDGED_BEFORE_HANG  # restored by the resume
    resumed = _run(["optimize", "--resume", runs[-1].name, "--store", str(tmp_path / "st")])
    assert resumed.returncode == 0, resumed.stderr
    rest = _started(log)[len(first) :]

    assert max(collections.Counter(first + rest).values()) == 1
    _, report = _reports(tmp_path / "st")
    assert report["budget"]["spent"]["tokens"] == len(rest) * TOKENS
    assert report["budget"]["campaign_spent"]["tokens"] == (len(first) + len(rest)) * TOKENS


def test_the_rerun_takes_the_proposals_the_stopped_run_paid_for(tmp_path: Path) -> None:
    """The stop cuts the candidates' measurement after both slots proposed: the next
    ``--resume-campaign`` takes those proposals (same slot, same parent) instead of asking
    the optimizer again (it asked both again: 4 calls for 2), and decides as one run."""
    decisions = []
    for name, stop in (("whole", False), ("cut", True)):
        paths = write_toy(tmp_path / name / "toy", {"default": "fix:2"})
        calls = tmp_path / name / "calls" / "log"
        calls.parent.mkdir(parents=True)
        plan = json.loads(paths["plan"].read_text())
        paths["plan"].write_text(json.dumps({**plan, "_record": str(calls)}))
        args, log = _campaign(tmp_path / name, paths)
        args += ["--population", "2"]  # the last one counts
        if stop:  # the 12 baselines and the first candidates end, the rest hang
            (log / "hang").touch()
            args[args.index("--replay") + 1] = args[args.index("--replay") + 1].replace(
                f"-gt {DONE_BEFORE_HANG}", "-gt 14"
            )
            stopped = _run([*args, "--wall-clock-budget", "10"])
            assert stopped.returncode == 3, stopped.stderr
            assert len(calls.read_text().splitlines()) == 2, "the stop came before the proposals"
            (run_dir,) = (tmp_path / name / "st" / "runs").iterdir()
            campaign = json.loads((run_dir / "run.json").read_text())["campaign_id"]
            (log / "hang").unlink()
            args += ["--resume-campaign", campaign]
        done = _run([*args, "--wall-clock-budget", "600"])
        assert done.returncode == 0, done.stderr
        assert len(calls.read_text().splitlines()) == 2  # one call a slot, over both runs
        decisions.append(_decisions(_reports(tmp_path / name / "st")[-1]))
    assert decisions[0] == decisions[1]
