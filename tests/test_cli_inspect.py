"""`evolane report`, `evolane runs` and `evolane schema` against a store built from the models."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner, Result

from evolane.campaign._config import CampaignConfig
from evolane.campaign._markdown import render_markdown
from evolane.campaign._report import (
    BudgetRecord,
    DecisionRecord,
    FunnelRecord,
    MeasurementRecord,
    Report,
    ScoreCI,
    Scores,
)
from evolane.campaign._runs import (
    CampaignState,
    RunRecord,
    StoreLayout,
    save_campaign,
    save_run,
)
from evolane.cli import app
from evolane.messages import (
    EVENT_TYPES,
    ArtifactRef,
    PhaseEvent,
    ProposalRecord,
    ProposeResult,
    UnitRecord,
    Usage,
)
from evolane.store import Journal, write_json_atomic

FINISHED = "20260101-100000-aaaaaa"
INTERRUPTED = "20260101-110000-bbbbbb"
CAMPAIGN = "c-20260101-100000"
T0 = 1_767_261_600.0  # 2026-01-01 10:00 UTC


def _ref(char: str) -> ArtifactRef:
    return ArtifactRef(digest="sha256:" + char * 64, size=123)


CONFIG = CampaignConfig(
    target="skill", dataset="cases.jsonl", replay="replay {case_file}", optimizer="opt {workdir}"
)


def _record(run_id: str, created: float, status: str) -> RunRecord:
    return RunRecord.model_validate(
        {
            "run_id": run_id,
            "campaign_id": CAMPAIGN,
            "cycle": 0,
            "created": created,
            "config": CONFIG,
            "dataset_digest": "sha256:" + "d" * 64,
            "seed_ref": _ref("a"),
            "parent_ref": _ref("a"),
            "status": status,
        }
    )


def _funnel(slot: int, terminal: str, stages: tuple[str, ...]) -> FunnelRecord:
    return FunnelRecord.model_validate(
        {
            "cycle": 0,
            "iteration": 0,
            "slot": slot,
            "slot_id": f"c0-i0-s{slot}",
            "stages": stages,
            "terminal": terminal,
            "reason": f"reason {slot}",
        }
    )


def _test_measurement() -> MeasurementRecord:
    counts = dict.fromkeys(
        ("units_run", "units_reused", "units_restored", "units_failed", "units_blocked"), 0
    )
    return MeasurementRecord(
        measurement_id="final-test",
        purpose="final_test",
        cycle=0,
        split="test",
        status="finished",
        n=6,
        n_planned=6,
        mean_delta=0.125,
        se=0.05,
        ci_low=0.02,
        ci_high=0.23,
        decision="accept",
        reason="sealed test",
        units_planned=12,
        units_not_run=0,
        wall_seconds=3.0,
        units_ref=_ref("e"),
        **counts,
    )


def _report() -> Report:
    return Report(
        run_id=FINISHED,
        campaign_id=CAMPAIGN,
        cycle=0,
        status="finished",
        campaign_status="complete",
        started=T0,
        finished=T0 + 42.5,
        wall_seconds=42.5,
        isolation="process",
        config=CONFIG,
        seed=_ref("a"),
        selected=_ref("b"),
        best=_ref("b"),
        scores=Scores(
            baseline_val=ScoreCI(mean=0.5, ci_low=0.4, ci_high=0.6, n=10),
            best_val=ScoreCI(mean=0.75, ci_low=0.65, ci_high=0.85, n=10),
        ),
        test=_test_measurement(),
        decisions=(
            DecisionRecord(
                cycle=0,
                iteration=0,
                slot=0,
                digest="sha256:" + "b" * 64,
                decision="accept",
                reason="mean delta 0.250 > 1.0 SE",
            ),
            DecisionRecord(
                cycle=0,
                iteration=0,
                slot=1,
                digest="sha256:" + "c" * 64,
                decision="reject",
                reason="worse [than] the parent",
            ),
        ),
        funnel=(
            _funnel(0, "selected", ("generated", "unique", "local_gates", "selected")),
            _funnel(1, "rejected", ("generated", "unique", "local_gates", "rejected")),
            _funnel(2, "blocked", ("generated", "blocked")),
        ),
        budget=BudgetRecord(
            ceilings=Usage(tokens=100_000),
            spent=Usage(tokens=1234, cost_usd=0.05, wall_seconds=30.0),
            campaign_spent=Usage(tokens=1234, cost_usd=0.05),
        ),
    )


@dataclass
class Store:
    root: Path
    report: Report


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """A store with a finished run (report.json + report.md), an interrupted run, a campaign."""
    root = tmp_path / "store"
    layout = StoreLayout(root)
    save_run(layout, _record(FINISHED, T0, "finished"))
    report = _report()
    write_json_atomic(layout.run_dir(FINISHED) / "report.json", report)
    (layout.run_dir(FINISHED) / "report.md").write_text(render_markdown(report))
    save_run(layout, _record(INTERRUPTED, T0 + 3600, "interrupted"))
    with Journal(layout.run_dir(INTERRUPTED) / "journal.jsonl") as journal:
        for unit in ("m1/u1", "m1/u2", "m1/u1"):  # a re-run unit is counted once
            journal.append(UnitRecord(measurement="m1", unit=unit, status="succeeded"))
        proposal = ProposeResult(slot_id="c0-i0-s0", status="failed")
        journal.append(ProposalRecord(slot="c0-i0-s0", result=proposal))
    phase = PhaseEvent(run_id=INTERRUPTED, seq=1, t=7.25, phase="measure")
    (layout.run_dir(INTERRUPTED) / "events.jsonl").write_bytes(
        orjson.dumps(phase.model_dump(mode="json")) + b"\n"
    )
    save_campaign(
        layout,
        CampaignState(
            campaign_id=CAMPAIGN,
            cycles=1,
            runs=(FINISHED, INTERRUPTED),
            seed_ref=_ref("a"),
            best_ref=_ref("b"),
            best_val=0.75,
        ),
    )
    return Store(root=root, report=report)


def _cli(*args: str) -> Result:
    runner = CliRunner(env={"COLUMNS": None})  # as when piped: ids are not folded at 80 columns
    return runner.invoke(app, list(args))


def _evolane(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "from evolane.cli import main; main()", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evolane: error:"), done.stderr
    return lines[0]


# -- report ----------------------------------------------------------------------------------


def test_report_text_summarises_a_finished_run(store: Store) -> None:
    done = _cli("report", FINISHED, "--store", str(store.root))
    assert done.exit_code == 0, done.output
    out = done.stdout
    for expected in (
        "finished",
        f"{CAMPAIGN}: complete",
        "sha256:bbbbbbbbbbbb (selected)",
        "0.500 [0.400, 0.600] (n=10) -> 0.750 [0.650, 0.850] (n=10)",
        "(the gate's bootstrap interval [+0.020, +0.230]) accept",  # no confirmation ran
        "tokens 1,234, cost $0.0500",
        "selected 1, rejected 1, blocked 1, not_run 0",
        "mean delta 0.250 > 1.0 SE",
        "worse [than] the parent",  # user text is not taken for rich markup
        str(store.root / "runs" / FINISHED / "report.json"),
    ):
        assert expected in out, (expected, out)
    assert "resume" not in out


def test_a_confirmed_runs_test_line_shows_no_gate_call_beside_the_verdict(store: Store) -> None:
    """Found by audit: the test delta line showed the gate's own call on the test cases
    ("accept") beside a confirmation row that said "not confirmed"."""
    from evolane.campaign._confirm import ConfirmationRecord

    verdict = ConfirmationRecord(
        decision="unconfirmed", n=10, n_planned=10, repetitions=1, mean_delta=0.1,
        p_value=0.2, level=0.05, confidence=0.95, reason="no evidence of a true gain",
        sentence="the best was not confirmed on the 10 held-out test cases",
    )  # fmt: skip
    report = store.report.model_copy(update={"confirmation": verdict})
    write_json_atomic(store.root / "runs" / FINISHED / "report.json", report)
    out = _cli("report", FINISHED, "--store", str(store.root)).stdout
    line = next(line for line in out.splitlines() if "the gate's bootstrap interval" in line)
    assert "the confirmation is the verdict" in line and "accept" not in line, line
    assert "not confirmed on the 10 held-out test cases" in out


def test_token_counts_read_as_whole_numbers_past_a_million(store: Store) -> None:
    """Found by audit: tokens printed with ``:g``: ``16511.5`` (an estimate for units cut
    short) and, past a million, ``1.23457e+06``, in the summary, report.md, ``report`` and
    ``compare`` alike."""
    big = Usage(tokens=2_345_678.5, cost_usd=12.5, wall_seconds=30.0)
    budget = store.report.budget.model_copy(
        update={"spent": big, "campaign_spent": big, "spent_by_role": {"replay": big}}
    )
    report = store.report.model_copy(update={"budget": budget})
    write_json_atomic(store.root / "runs" / FINISHED / "report.json", report)
    shown = _cli("report", FINISHED, "--store", str(store.root)).stdout + render_markdown(report)
    assert "tokens 2,345,679, cost" in shown and "| replay | 2,345,679 |" in shown, shown
    assert "e+06" not in shown and "2345678.5" not in shown


def test_report_json_is_report_json_as_written(store: Store) -> None:
    done = _cli("report", FINISHED, "--store", str(store.root), "--format", "json")
    assert done.exit_code == 0, done.output
    assert Report.model_validate(orjson.loads(done.stdout)) == store.report
    assert done.stdout.startswith("{\n  ")  # pretty


def test_report_md_prints_report_md_or_renders_it(store: Store) -> None:
    report_md = store.root / "runs" / FINISHED / "report.md"
    report_md.write_text("# as written\n")
    done = _cli("report", FINISHED, "--store", str(store.root), "--format", "md")
    assert done.exit_code == 0 and done.stdout == "# as written\n"
    report_md.unlink()
    done = _cli("report", FINISHED, "--store", str(store.root), "--format", "md")
    assert done.exit_code == 0 and done.stdout == render_markdown(store.report)


def test_a_unique_prefix_names_a_run_and_an_ambiguous_one_is_refused(store: Store) -> None:
    done = _cli("report", "20260101-10", "--store", str(store.root), "--format", "json")
    assert done.exit_code == 0 and orjson.loads(done.stdout)["run_id"] == FINISHED
    done = _cli("report", "20260101", "--store", str(store.root))
    assert done.exit_code == 2
    assert "matches 2 runs" in done.stderr and done.stdout == ""


def test_report_on_an_interrupted_run_shows_the_journal_and_the_resume_command(
    store: Store,
) -> None:
    resume = f"evolane optimize --resume {INTERRUPTED} --store {store.root}"
    done = _cli("report", INTERRUPTED, "--store", str(store.root))
    assert done.exit_code == 0, done.output
    assert "interrupted" in done.stdout
    assert "2 units, 1 proposals" in done.stdout
    assert "last phase: measure at 7.2 s" in done.stdout
    assert resume in done.stdout
    done = _cli("report", INTERRUPTED, "--store", str(store.root), "--format", "json")
    summary = orjson.loads(done.stdout)
    assert summary["report"] is None and summary["status"] == "interrupted"
    assert summary["journal"]["units"] == 2 and summary["journal"]["proposals"] == 1
    assert summary["resume"] == resume
    done = _cli("report", INTERRUPTED, "--store", str(store.root), "--format", "md")
    assert f"`{resume}`" in done.stdout


def test_a_damaged_report_or_run_json_points_to_fsck(store: Store) -> None:
    fsck = f"; run `evolane fsck --store {store.root}`"
    report_json = store.root / "runs" / FINISHED / "report.json"
    report_json.write_bytes(report_json.read_bytes() + b"{")
    for args in (["report", FINISHED], ["compare", FINISHED, FINISHED], ["diff", FINISHED]):
        line = _one_error_line(_evolane(*args, "--store", str(store.root)))
        assert line.startswith(f"evolane: error: cannot read {report_json}: "), line
        assert line.endswith(fsck), line
    (store.root / "runs" / FINISHED / "run.json").write_text("[]")
    line = _one_error_line(_evolane("report", FINISHED, "--store", str(store.root)))
    assert "run.json: " in line and line.endswith(fsck), line


def test_a_damaged_journal_blocks_the_resume_naming_its_line(store: Store) -> None:
    journal = store.root / "runs" / INTERRUPTED / "journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join([lines[0], lines[1][:20] + b"\n", *lines[2:]]))
    done = _cli("report", INTERRUPTED, "--store", str(store.root), "--format", "json")
    blocked = orjson.loads(done.stdout)["resume_blocked"]
    assert f"{journal}:2: corrupt journal line" in blocked, blocked
    assert "Error" not in blocked and blocked.count("evolane fsck") == 1
    assert blocked.endswith(f"); run `evolane fsck --store {store.root}`")


def test_a_killed_run_without_journal_or_events_still_reports(tmp_path: Path) -> None:
    layout = StoreLayout(tmp_path / "s")
    save_run(layout, _record(FINISHED, T0, "running"))
    done = _cli("report", FINISHED, "--store", str(layout.root), "--format", "json")
    assert done.exit_code == 0, done.output
    summary = orjson.loads(done.stdout)
    assert summary["status"] == "running"
    assert summary["journal"]["units"] == 0 and summary["events"]["count"] == 0
    assert summary["resume"].startswith(f"evolane optimize --resume {FINISHED}")
    run_json = layout.run_dir(FINISHED) / "run.json"
    os.utime(run_json, (T0, T0))  # long written, and no process holds it: killed
    summary = orjson.loads(
        _cli("report", FINISHED, "--store", str(layout.root), "--format", "json").stdout
    )
    listed = orjson.loads(_cli("runs", "--store", str(layout.root), "--json").stdout)["runs"]
    assert summary["status"] == listed[0]["status"] == "killed"  # found by review: "running"


def test_unknown_run_missing_store_and_bad_format_are_one_line_exit_2(store: Store) -> None:
    line = _one_error_line(_evolane("report", "nope", "--store", str(store.root)))
    assert "'nope'" in line and str(store.root) in line
    line = _one_error_line(_evolane("report", FINISHED, "--store", str(store.root / "missing")))
    assert str(store.root / "missing") in line
    done = _cli("report", FINISHED, "--store", str(store.root), "--format", "pdf")
    assert done.exit_code == 2 and "pdf" in done.stderr


def test_a_corrupt_run_json_is_one_line_naming_the_file(store: Store) -> None:
    run_json = store.root / "runs" / FINISHED / "run.json"
    run_json.write_text('{"run_id": ')
    line = _one_error_line(_evolane("report", FINISHED, "--store", str(store.root)))
    assert str(run_json) in line
    run_json.write_text('{"run_id": "x"}')
    done = _cli("report", FINISHED, "--store", str(store.root))
    assert done.exit_code == 2 and isinstance(done.exception, SystemExit)  # not a crash
    assert str(run_json) in done.stderr and "campaign_id: Field required" in done.stderr


# -- runs ------------------------------------------------------------------------------------


def test_runs_lists_runs_and_campaigns_newest_last(store: Store) -> None:
    done = _cli("runs", "--store", str(store.root))
    assert done.exit_code == 0, done.output
    out = done.stdout
    assert out.index(FINISHED) < out.index(INTERRUPTED)
    assert "interrupted" in out and "0.750" in out and "42.5 s" in out
    assert "campaigns" in out and out.count(CAMPAIGN) >= 3  # two runs and the campaign row


def test_runs_json(store: Store) -> None:
    done = _cli("runs", "--store", str(store.root), "--json")
    assert done.exit_code == 0, done.output
    listing = orjson.loads(done.stdout)
    finished, interrupted = listing["runs"]
    assert finished["run_id"] == FINISHED and interrupted["run_id"] == INTERRUPTED
    assert finished["status"] == "finished" and finished["best_val"] == 0.75
    assert finished["baseline_val"] == 0.5 and finished["wall_seconds"] == 42.5
    assert finished["report"].endswith("report.json")
    assert interrupted["status"] == "interrupted"
    assert interrupted["best_val"] is None and interrupted["report"] is None
    (campaign,) = listing["campaigns"]
    assert campaign["campaign_id"] == CAMPAIGN and campaign["runs"] == 2
    assert campaign["best_val"] == 0.75 and campaign["cycles"] == 1


def test_runs_orders_by_creation_and_lists_an_unreadable_run(store: Store) -> None:
    layout = StoreLayout(store.root)
    save_run(layout, _record("00-older-by-time-only", T0 + 7200, "finished"))
    broken = layout.run_dir("zz-broken")
    broken.mkdir(parents=True)
    (broken / "run.json").write_text("not json")
    listing = orjson.loads(_cli("runs", "--store", str(store.root), "--json").stdout)
    ids = [row["run_id"] for row in listing["runs"]]
    assert ids == ["zz-broken", FINISHED, INTERRUPTED, "00-older-by-time-only"]
    assert listing["runs"][0]["status"] == "unreadable"


def test_runs_on_an_empty_or_absent_store_is_a_friendly_line(tmp_path: Path) -> None:
    for root in (tmp_path, tmp_path / "absent"):
        done = _cli("runs", "--store", str(root))
        assert done.exit_code == 0, done.output
        assert done.stdout.startswith("No runs yet in") and done.stderr == ""
        listing = orjson.loads(_cli("runs", "--store", str(root), "--json").stdout)
        assert listing["runs"] == [] and listing["campaigns"] == []


# -- schema ----------------------------------------------------------------------------------


def test_schema_events_has_every_kind() -> None:
    done = _evolane("schema", "events")
    assert done.returncode == 0, done.stderr
    schemas = orjson.loads(done.stdout)
    kinds = {cls.model_fields["kind"].default for cls in EVENT_TYPES}
    assert {key for key in schemas if key.startswith("event.")} == kinds
    assert "event.run_finished" in kinds
    for kind in kinds:
        assert schemas[kind]["properties"]["kind"]["const"] == kind
        assert "run_id" in schemas[kind]["required"]


def test_the_schema_documents_validate_what_they_describe_and_nothing_else() -> None:
    """Found by review: ``schema events`` and ``schema messages`` had no rule at their top
    level, so any document at all (``{}``, ``[]``, an unknown kind) was valid against them;
    a consumer validating a line against the document checked nothing."""
    import jsonschema

    from evolane.messages import LedgerQuery, PhaseEvent

    events = jsonschema.Draft202012Validator(orjson.loads(_evolane("schema", "events").stdout))
    messages = jsonschema.Draft202012Validator(orjson.loads(_evolane("schema", "messages").stdout))
    phase = PhaseEvent(run_id="r-1", phase="baseline").model_dump(mode="json")
    assert events.is_valid(phase)
    assert messages.is_valid(phase) and messages.is_valid(LedgerQuery().model_dump(mode="json"))
    for bad in ({}, [], 3, {**phase, "kind": "event.nope"}, {**phase, "phase": "nope"}):
        assert not events.is_valid(bad), bad
        assert not messages.is_valid(bad), bad


def test_schema_report_describes_report_json() -> None:
    done = _cli("schema", "report")
    assert done.exit_code == 0, done.output
    schema = orjson.loads(done.stdout)
    assert schema["title"] == "Report"
    for field in ("run_id", "status", "scores", "decisions", "funnel", "budget"):
        assert field in schema["properties"]
    assert {"DecisionRecord", "FunnelRecord", "ScoreCI"} <= set(schema["$defs"])


def test_schema_messages_lists_every_message_and_journal_record_kind() -> None:
    """Every Message subclass anywhere in evolane lives in evolane.messages and is listed, and
    so is every journal record type (the schema a reader of journal.jsonl needs)."""
    import importlib
    import pkgutil

    import evolane
    from evolane.messages import JOURNAL_RECORDS, Message

    for module in pkgutil.walk_packages(evolane.__path__, "evolane."):
        if ".examples." in module.name or module.name.endswith("__main__"):
            continue
        importlib.import_module(module.name)
    pending, concrete = list(Message.__subclasses__()), []
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if not cls.abstract and cls.__module__.startswith("evolane."):
            concrete.append(cls)
    assert len(concrete) > 30
    outside = [c.__qualname__ for c in concrete if not c.__module__.startswith("evolane.messages")]
    assert outside == []
    done = _evolane("schema", "messages")
    assert done.returncode == 0, done.stderr
    schema = orjson.loads(done.stdout)
    listed = set(schema["kinds"].values())
    assert {c.__name__ for c in concrete} <= listed
    assert {"measure.request", "measure.summary", "campaign.run", "lane.stop"} <= set(
        schema["kinds"]
    )
    assert set(schema["journal_records"]) == set(JOURNAL_RECORDS) == {"unit", "replay", "proposal"}
    assert {"UnitRecord", "ReplayRecord", "ProposalRecord"} <= set(schema["$defs"])


def test_schema_messages_is_still_the_default() -> None:
    done = _cli("schema")
    assert done.exit_code == 0 and "kinds" in orjson.loads(done.stdout)


def test_unknown_schema_is_exit_2() -> None:
    line = _one_error_line(_evolane("schema", "nope"))
    assert "'nope'" in line and "events" in line


# -- a killed run ------------------------------------------------------------------------------

_HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def _held(journal: Path) -> Iterator[None]:
    """A real process holds ``journal``'s lock (as a live run does) for the block's length."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(journal)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield
    finally:
        holder.communicate("")


def test_runs_lists_a_running_run_no_process_holds_as_killed(tmp_path: Path) -> None:
    """run.json says ``running`` forever after a SIGKILL: `runs` must not believe it; while a
    real process holds the run's journal, the run is ``running``."""
    root = tmp_path / "store"
    layout = StoreLayout(root)
    run_id = "20260101-120000-cccccc"
    save_run(layout, _record(run_id, T0, "running"))
    journal = layout.run_dir(run_id) / "journal.jsonl"
    journal.write_bytes(b"")
    written = layout.run_dir(run_id) / "run.json"
    os.utime(written, (T0, T0))  # long ago: not a session opening its run
    listing = orjson.loads(_evolane("runs", "--store", str(root), "--json").stdout)
    (row,) = listing["runs"]
    assert row["status"] == "killed" and row["live"] is False
    assert "killed" in _evolane("runs", "--store", str(root)).stdout
    with _held(journal):
        listing = orjson.loads(_evolane("runs", "--store", str(root), "--json").stdout)
        (row,) = listing["runs"]
        assert row["status"] == "running" and row["live"] is True
        held = _evolane("report", run_id, "--store", str(root), "--format", "json").stdout
        summary = orjson.loads(held)  # `live` a boolean as in `runs --json` (found by review)
        assert summary["live"] is True and summary["resume"] is None
        assert summary["live_note"].startswith("it is running") and "evolane watch" in held
    gone = _evolane("report", run_id, "--store", str(root), "--format", "json").stdout
    summary = orjson.loads(gone)
    assert summary["live"] is False and summary["live_note"] is None


def test_runs_says_how_long_a_running_run_has_been_silent(tmp_path: Path) -> None:
    """Found by review: `runs` listed a run whose units hung (or whose process was stopped)
    as `running`, like one at work. A live run says how long since its newest event."""
    root = tmp_path / "store"
    layout = StoreLayout(root)
    run_id = "20260101-120000-eeeeee"
    save_run(layout, _record(run_id, T0, "running"))
    journal = layout.run_dir(run_id) / "journal.jsonl"
    journal.write_bytes(b"")
    events = layout.run_dir(run_id) / "events.jsonl"
    events.write_bytes(b"")
    past = time.time() - 300
    os.utime(events, (past, past))
    with _held(journal):
        listing = orjson.loads(_evolane("runs", "--store", str(root), "--json").stdout)
        (row,) = listing["runs"]
        assert row["status"] == "running" and row["silent_seconds"] >= 300, row
        assert "running, no event for 5m" in _evolane("runs", "--store", str(root)).stdout
        shown = _evolane("report", run_id, "--store", str(root)).stdout
        assert "in another process, no event for 5m" in " ".join(shown.split()), shown


@pytest.mark.parametrize("errno_name", ["ENOLCK", "EBADF"])
def test_a_store_whose_locks_cannot_be_probed_lists_its_runs_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errno_name: str
) -> None:
    """Found by review: on NFS without lock support the liveness probe's flock fails with
    ENOLCK (or EBADF), which ``runs`` raised: the listing crashed. A probe that cannot tell
    calls the run live, so it is never listed killed on a guess."""
    import errno
    import fcntl

    from evolane.cli._runs import run_rows

    root = tmp_path / "store"
    layout = StoreLayout(root)
    run_id = "20260101-120000-dddddd"
    save_run(layout, _record(run_id, T0, "running"))
    (layout.run_dir(run_id) / "journal.jsonl").write_bytes(b"")
    os.utime(layout.run_dir(run_id) / "run.json", (T0, T0))

    def refuse(fd: int, operation: int) -> None:
        raise OSError(getattr(errno, errno_name), os.strerror(getattr(errno, errno_name)))

    monkeypatch.setattr(fcntl, "flock", refuse)
    (row,) = run_rows(layout)
    assert row["status"] == "running" and row["live"] is True
