"""``evolane optimize`` as a user runs it: the live view under a pseudo-terminal, the JSONL
event stream against the exported schema, exit codes, Ctrl-C once and twice then --resume,
and ``report``/``runs`` on a real run."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jsonschema
import pytest

from evolane.store import read_journal
from tests.campaign_helpers import toy_flags, write_toy

PLAN = {
    "0.0": "fix:2",
    "0.1": "harm:1",
    "1.0": "fix:1",
    "1.1": "noop",
    "2.0": "harm:2",
    "2.1": "fix:3",
}
EVOLANE = [sys.executable, "-m", "evolane"]


def _run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVOLANE, *args], capture_output=True, text=True, timeout=timeout)


def _one_error_line(done: subprocess.CompletedProcess[str], needle: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evolane: error:"), done.stderr
    assert needle in lines[0]
    assert "Traceback" not in done.stderr + done.stdout


def test_the_live_view_renders_under_a_pseudo_terminal(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "LINES": "40", "TERM": "xterm-256color"}
    args = ["optimize", "--example", "self-evolution", "--example-dir", str(tmp_path / "ex"),
            "--store", str(tmp_path / "st"), "--iterations", "1", "--population", "2"]  # fmt: skip
    process = subprocess.Popen([*EVOLANE, *args], stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    assert process.wait(timeout=180) == 0
    reader.join(timeout=10)
    os.close(master)
    screen = b"".join(chunks).decode("utf-8", "replace")
    assert "\x1b[" in screen  # a live, redrawn view, not plain lines
    assert "iteration" in screen and "budget" in screen.lower()
    assert "report:" in screen and "val:" in screen  # the final summary


def test_jsonl_events_validate_against_the_exported_schema(tmp_path: Path) -> None:
    schemas = json.loads(_run(["schema", "events"]).stdout)
    paths = write_toy(tmp_path, PLAN)
    flags = toy_flags(paths, tmp_path / "store")
    flags[flags.index("--progress") + 1] = "jsonl"
    done = _run(["optimize", *flags])
    assert done.returncode == 0, done.stderr
    streamed = [json.loads(line) for line in done.stdout.splitlines()]
    (run_dir,) = (tmp_path / "store" / "runs").iterdir()
    journaled = read_journal(run_dir / "events.jsonl").records
    assert [e["seq"] for e in journaled] == list(range(1, len(journaled) + 1))  # none lost
    kinds = ("run_started", "estimate", "phase", "slot", "measure", "decision", "run_finished")
    assert {e["kind"] for e in journaled} >= {f"event.{kind}" for kind in kinds}
    for event in streamed + journaled:
        jsonschema.validate(event, schemas[event["kind"]])
    seqs = [e["seq"] for e in streamed]
    assert seqs == sorted(seqs) and seqs[-1] == journaled[-1]["seq"]
    assert "report:" in done.stderr  # the summary keeps stdout a pure event stream


def test_exit_codes_and_one_line_errors(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    base = toy_flags(paths, tmp_path / "store")

    def flag(name: str, value: str) -> list[str]:
        args = list(base)
        args[args.index(name) + 1] = value
        return args

    _one_error_line(_run(["optimize", *flag("--target", str(tmp_path / "nope"))]), "--target")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    _one_error_line(_run(["optimize", *flag("--dataset", str(empty))]), "empty.jsonl")
    rows = paths["dataset"].read_text().splitlines()
    dup = tmp_path / "dup.jsonl"
    dup.write_text(f"{rows[0]}\n{rows[0]}\n")
    _one_error_line(_run(["optimize", *flag("--dataset", str(dup))]), "dup.jsonl:2")
    test_only = tmp_path / "test-only.jsonl"
    test_only.write_text("".join(r + "\n" for r in rows if '"test"' in r))
    _one_error_line(_run(["optimize", *flag("--dataset", str(test_only))]), "val split is empty")
    _one_error_line(_run(["optimize", *base, "--no-such-flag"]), "--no-such-flag")
    _one_error_line(_run(["optimize", *flag("--gate", "fancy")]), "--gate fancy")
    _one_error_line(_run(["optimize", *flag("--replay", "cat {nope}")]), "replay command")
    _one_error_line(_run(["optimize", *base, "--resume", "r-missing"]), "r-missing")
    assert not (tmp_path / "store").exists()  # nothing written for bad input
    dry = _run(["optimize", *base, "--dry-run"])
    assert dry.returncode == 0 and "at most" in dry.stdout
    assert not (tmp_path / "store" / "runs").exists()
    script = tmp_path / "replay.sh"
    script.write_text(
        'cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\n'
        'echo \'{"tokens": 100, "cost_usd": 0.01}\' > "$2/usage.json"\n'
    )
    limited = _run(["optimize", *flag("--replay", f"sh {script} {{candidate}} {{output_dir}}"),
                    "--max-tokens", "1500"])  # fmt: skip
    assert limited.returncode == 3, limited.stderr
    finished = _run(["optimize", *base])
    assert finished.returncode == 0, finished.stderr


STALLING = {"0.0": "harm:1", "0.1": "noop", "1.0": "fix:2", "1.1": "harm:2", "2.0": "fix:1"}
"""Iteration 0 accepts nothing: a resume that counted the stall twice would decide otherwise."""


def _decisions(report: dict) -> list[tuple]:
    return [(d["iteration"], d["slot"], d["digest"], d["decision"]) for d in report["decisions"]]


def _interrupt(tmp_path: Path, signals: int) -> tuple[Path, Path]:
    paths = write_toy(tmp_path, STALLING)
    store = tmp_path / "store"
    flags = toy_flags(paths, store)
    slow = 'sh -c \'sleep 0.3; cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\' r'
    slow += " {candidate} {output_dir}"
    flags[flags.index("--replay") + 1] = slow
    command = [*EVOLANE, "optimize", *flags, "--stall", "2"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60

    def second_iteration_began() -> bool:  # iteration 0 (no accept: stall 1) is behind us
        journals = list(store.glob("runs/*/journal.jsonl"))
        records = read_journal(journals[0]).records if journals else []
        return any(r.get("slot") == "c0.i1.s0" for r in records)

    while not second_iteration_began():
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    for _ in range(signals):
        process.send_signal(signal.SIGINT)
        time.sleep(0.05)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, (out, err)
    (run_dir,) = (store / "runs").iterdir()
    assert f"--resume {run_dir.name}" in out + err
    return store, run_dir


@pytest.mark.parametrize("signals", [1, 2])
def test_ctrl_c_then_resume_completes(tmp_path: Path, signals: int) -> None:
    store, run_dir = _interrupt(tmp_path, signals)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "interrupted"
    resumed = _run(
        ["optimize", "--resume", run_dir.name, "--store", str(store), "--progress", "none"]
    )
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "finished" and report["resumed"] == 1
    assert sum(m["units_restored"] for m in report["measurements"]) >= 1
    reference = tmp_path / "reference"
    ref_paths = write_toy(reference, STALLING)
    ref_flags = [*toy_flags(ref_paths, reference / "store"), "--stall", "2"]
    assert _run(["optimize", *ref_flags]).returncode == 0
    (ref_dir,) = (reference / "store" / "runs").iterdir()
    expected = json.loads((ref_dir / "report.json").read_text())
    assert _decisions(report) == _decisions(expected)


def test_a_ctrl_c_after_the_run_ended_keeps_the_summary_and_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A second Ctrl-C often lands after a graceful stop already ended the run: it must be
    # ignored, not cut the summary short and turn the exit code into "interrupted".
    from typer.testing import CliRunner

    from evolane.cli import _summary
    from evolane.cli._app import app

    printed = _summary.print_summary

    def print_after_a_ctrl_c(outcome: object, flags: dict) -> None:
        signal.raise_signal(signal.SIGINT)
        printed(outcome, flags)

    monkeypatch.setattr(_summary, "print_summary", print_after_a_ctrl_c)
    paths = write_toy(tmp_path, PLAN)
    store = tmp_path / "store"
    done = CliRunner().invoke(app, ["optimize", *toy_flags(paths, store)])
    assert done.exit_code == 0, done.output
    (run_dir,) = (store / "runs").iterdir()
    assert f"report: {run_dir / 'report.json'}" in done.output


def test_report_and_runs_on_a_real_run(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    store = tmp_path / "store"
    assert _run(["optimize", *toy_flags(paths, store)]).returncode == 0
    (run_dir,) = (store / "runs").iterdir()
    for fmt in ("text", "json", "md"):
        shown = _run(["report", run_dir.name, "--store", str(store), "--format", fmt])
        assert shown.returncode == 0, shown.stderr
        assert run_dir.name in shown.stdout
    listed = json.loads(_run(["runs", "--store", str(store), "--json"]).stdout)
    assert [r["run_id"] for r in listed["runs"]] == [run_dir.name]
    assert listed["campaigns"][0]["status"] == "complete"


def test_the_exit_code_follows_a_ctrl_c_or_bad_input_among_several_errors() -> None:
    from evolane.cli._session import UsageError, _leaf
    from evolane.inputs import InputError

    bad_input, crash = InputError("dataset.jsonl:3: not JSON"), RuntimeError("closing failed")
    interrupted = KeyboardInterrupt()
    assert _leaf(BaseExceptionGroup("g", [crash, BaseExceptionGroup("h", [interrupted])])) is (
        interrupted
    )
    assert _leaf(ExceptionGroup("g", [crash, ExceptionGroup("h", [bad_input])])) is bad_input
    usage = UsageError("--lanes 0")
    assert _leaf(ExceptionGroup("g", [ExceptionGroup("h", [usage])])) is usage
    group = ExceptionGroup("g", [crash, RuntimeError("another")])
    assert _leaf(group) is group  # no single cause: reported as the group
