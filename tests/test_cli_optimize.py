"""``evolane optimize`` as a user runs it: the live view under a pseudo-terminal, the JSONL
event stream against the exported schema, exit codes, Ctrl-C once and twice then --resume,
and ``report``/``runs`` on a real run."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from evolane.store import read_journal
from tests.campaign_helpers import toy_flags, usage_replay, with_flag, write_toy

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
    # The toy campaign (sh replays): what is drawn does not depend on the workload, and the
    # self-evolution example (80 cases, a python process per replay and judge) cost ~45 CPU-s.
    flags = with_flag(toy_flags(write_toy(tmp_path, PLAN), tmp_path / "st"), "--progress", "auto")
    process = subprocess.Popen(
        [*EVOLANE, "optimize", *flags], stdin=slave, stdout=slave, stderr=slave, env=env
    )
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
    whole = jsonschema.Draft202012Validator(schemas)  # the document, not only its kinds
    for event in streamed + journaled:
        jsonschema.validate(event, schemas[event["kind"]])
        whole.validate(event)
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
    for edge in ("0.9999995", "1e-7"):  # alpha = 1 - confidence would round to 0 or 1
        _one_error_line(_run(["optimize", *base, "--confidence", edge]), "--confidence")
    _one_error_line(_run(["optimize", *flag("--replay", "cat {nope}")]), "replay command")
    _one_error_line(_run(["optimize", *base, "--resume", "r-missing"]), "r-missing")
    assert not (tmp_path / "store").exists()  # nothing written for bad input
    dry = _run(["optimize", *base, "--dry-run"])
    assert dry.returncode == 0 and "at most" in dry.stdout
    assert not (tmp_path / "store" / "runs").exists()
    limited = _run(["optimize", *flag("--replay", usage_replay(tmp_path)), "--max-tokens", "1500"])
    assert limited.returncode == 3, limited.stderr
    assert "continue:" not in limited.stdout  # a spent token ceiling ends the campaign
    # each ceiling set, beside what the campaign spent of it (the wall clock was shown nowhere)
    assert re.search(r"^ceilings \(the campaign's\): tokens \S+ of 1,500$", limited.stdout, re.M)
    paused = _run(["optimize", *flag("--replay", "sleep 30"), "--wall-clock-budget", "1"])
    assert paused.returncode == 3, paused.stderr
    (again,) = [line for line in paused.stdout.splitlines() if line.startswith("continue: ")]
    assert re.fullmatch(
        r"continue: evolane optimize <the same flags> --resume-campaign c-\S+ "
        r"--wall-clock-budget <larger>",
        again,
    )
    (ceilings,) = [line for line in paused.stdout.splitlines() if line.startswith("ceilings ")]
    assert re.fullmatch(r"ceilings \(the campaign's\): wall clock \d+\.\d s of 1\.0 s", ceilings)
    (md,) = [line.split()[-1] for line in paused.stdout.splitlines() if "report.md" in line]
    assert f"- {ceilings}" in Path(md).read_text()
    finished = _run(["optimize", *base])
    assert finished.returncode == 0, finished.stderr
    (path,) = [line[8:] for line in finished.stdout.splitlines() if line.startswith("report: ")]
    stored = json.loads(Path(path).read_text())
    test = stored["test"]  # the sealed test result, in the summary
    assert test is not None
    interval = f"[{test['ci_low']:+.3f}, {test['ci_high']:+.3f}]"
    shown = f"test delta: {test['mean_delta']:+.3f} over {test['n']} cases"
    assert f"{shown} (the gate's bootstrap interval {interval};" in finished.stdout
    # the confirmation made on it, and the campaign's error control, in words
    assert f"confirmation: {stored['confirmation']['sentence']}" in finished.stdout
    assert "error control: confirm before publish" in finished.stdout


def test_bad_inputs_exit_2_in_one_line_and_run_nothing(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    store = tmp_path / "store"
    base = toy_flags(paths, store)
    resume = ["--resume", "r-1", "--store", str(store)]
    estimated = "only a new run can be estimated"
    _one_error_line(_run(["estimate", *resume]), f"evolane estimate with --resume: {estimated}")
    _one_error_line(
        _run(["optimize", *resume, "--dry-run"]), f"--dry-run with --resume: {estimated}"
    )
    rerun = ["--from-run", "r-1", "--rerun-evaluator", "--store", str(store)]
    _one_error_line(_run(["optimize", *rerun, "--dry-run"]), "--dry-run with --from-run")
    _one_error_line(_run(["optimize", *resume, "--progress", "fancy"]), "--progress fancy")
    not_example = tmp_path / "not-example"
    not_example.mkdir()
    (not_example / "notes.txt").write_text("mine")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "example.json").write_text("{not json")
    for directory, needle in (
        (not_example, f"--example-dir {not_example}: exists and is not an evolane example"),
        (a_file, f"--example-dir {a_file}: is not a directory"),
        (corrupt, "example.json: not an evolane example"),
    ):
        done = _run(["optimize", "--example", "sleeper", "--example-dir", str(directory),
                     "--store", str(store), "--progress", "none"])  # fmt: skip
        _one_error_line(done, needle)
    assert sorted(p.name for p in not_example.iterdir()) == ["notes.txt"]  # nothing written
    assert (corrupt / "example.json").read_text() == "{not json"
    for command in ("optimize", "estimate"):  # --store naming a file, or a path under one
        for where in (a_file, a_file / "store"):
            args = [command, *base]
            args[args.index("--store") + 1] = str(where)
            _one_error_line(_run(args), f"--store {where}: not a directory")
    assert not store.exists()  # nothing ran, nothing was written


def test_a_store_that_is_a_file_is_bad_input_to_the_probe_and_doctor(tmp_path: Path) -> None:
    """``estimate --probe`` and ``doctor`` refuse a ``--store`` naming a file (or a path
    under one) as ``optimize`` does: exit 2 in one line (found by review: exit 1,
    "internal error: NotADirectoryError" as the probe wrote the seed's blobs)."""
    paths = write_toy(tmp_path, PLAN)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    base = toy_flags(paths, a_file)
    at = base.index("--progress")
    del base[at : at + 2]  # doctor has no view
    for command in (["estimate", "--probe"], ["doctor"]):
        for where in (a_file, a_file / "store"):
            args = [*command, *base]
            args[args.index("--store") + 1] = str(where)
            _one_error_line(_run(args), f"--store {where}: not a directory")
    assert a_file.read_text() == "x"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no procfs")
def test_a_store_or_example_dir_evolane_cannot_write_in_is_bad_input(tmp_path: Path) -> None:
    """``--store /proc/self`` (or a path under it, or ``--example-dir`` there) is one line
    naming the path, exit 2 (found by review: exit 1, "internal error: FileNotFoundError"
    as the example or the seed's blobs were written). procfs refuses root too."""
    paths = write_toy(tmp_path, PLAN)
    for where in ("/proc/self", "/proc/self/store"):
        args = toy_flags(paths, Path(where))
        for command in (["optimize"], ["estimate"], ["optimize", "--dry-run"]):
            _one_error_line(_run([*command, *args]), f"--store {where}: cannot make a store there")
        example = ["optimize", "--example", "sleeper", "--store", where, "--dry-run"]
        _one_error_line(_run(example), f"--store {where}: cannot make a store there")
    example_dir = ["--example", "sleeper", "--example-dir", "/proc/self/ws"]
    store = tmp_path / "store"
    done = _run(["estimate", *example_dir, "--store", str(store)])
    _one_error_line(done, "--example-dir /proc/self/ws: cannot write the example there")
    good = _run(["estimate", *toy_flags(paths, store)])  # a store that can be made still is
    assert good.returncode == 0, good.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".evolane-probe-")]


def test_a_corrupt_or_invalid_run_record_is_bad_input(tmp_path: Path) -> None:
    store = tmp_path / "store"
    for run_id, content in (("r-corrupt", "{not json"), ("r-invalid", '{"run_id": 3}')):
        record = store / "runs" / run_id / "run.json"
        record.parent.mkdir(parents=True)
        record.write_text(content)
        for flags in (["--resume", run_id], ["--from-run", run_id, "--rerun-evaluator"]):
            done = _run(["optimize", *flags, "--store", str(store), "--progress", "none"])
            _one_error_line(done, f"{record}: ")
            assert record.read_text() == content  # untouched
            assert {p.name for p in (store / "runs").iterdir()} <= {"r-corrupt", "r-invalid"}


@pytest.mark.parametrize(
    "given",
    [
        ["--resume-campaign", "c-1", "--from-run", "r-1", "--rerun-evaluator"],
        ["--resume", "r-1", "--resume-campaign", "c-1"],
        ["--resume", "r-1", "--from-run", "r-1", "--rerun-evaluator"],
        ["--drain-pending", "--resume", "r-1"],
        ["--drain-pending", "--resume-campaign", "c-1"],
    ],
)
def test_two_ways_on_are_one_line_and_start_nothing(tmp_path: Path, given: list[str]) -> None:
    """Found by hostile review: ``--resume-campaign C --from-run R`` re-judged R as a new
    campaign (exit 0), and ``--drain-pending --resume R`` drained the store's jobs, the other
    flag dropped without a word."""
    store = tmp_path / "store"
    args = [*toy_flags(write_toy(tmp_path, PLAN), store), *given]
    done = _run(["optimize", *args])
    _one_error_line(done, ": give one of them")
    named = [word for word in given if word.startswith("--") and word != "--rerun-evaluator"]
    assert all(flag in done.stderr for flag in named), done.stderr
    assert not store.exists()


def test_a_rerun_of_a_run_whose_journal_holds_nothing_is_bad_input(tmp_path: Path) -> None:
    """Found by hostile review: ``--from-run`` of a run whose journal was missing, empty or
    torn whole started a campaign whose run judged nothing and ended ``failed``, exit 1."""
    store = tmp_path / "store"
    flags = with_flag(toy_flags(write_toy(tmp_path, PLAN), store), "--iterations", "1")
    assert _run(["optimize", *flags]).returncode == 0
    (run_dir,) = (store / "runs").iterdir()
    journal = run_dir / "journal.jsonl"
    rerun = ["optimize", "--from-run", run_dir.name, "--rerun-evaluator", "--store", str(store)]
    for damage, needle in ((b"", "holds no record"), (b'{"type": "un', "holds only a torn line")):
        journal.write_bytes(damage)
        kept = sorted(store.rglob("*"))
        _one_error_line(_run(rerun), f"--from-run {run_dir.name}: {journal} {needle}")
        assert sorted(store.rglob("*")) == kept  # no run, no campaign
    journal.unlink()
    _one_error_line(_run(rerun), f"--from-run {run_dir.name}: {journal} is missing")


STALLING = {"0.0": "harm:1", "0.1": "noop", "1.0": "fix:2", "1.1": "harm:2", "2.0": "fix:1"}
"""Iteration 0 accepts nothing: a resume that counted the stall twice would decide otherwise."""


def _decisions(report: dict) -> list[tuple]:
    return [(d["iteration"], d["slot"], d["digest"], d["decision"]) for d in report["decisions"]]


class _Lines:
    """A pipe read line by line in a thread, so a test can wait for a line to appear."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line)

    def text(self) -> str:
        self._thread.join(timeout=60)
        return "".join(self.lines)

    def has(self, needle: str) -> bool:
        return any(needle in line for line in list(self.lines))


def _wait(condition: Any, process: subprocess.Popen[str], err: _Lines, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert process.poll() is None, f"the run ended first: {err.text()}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _interrupt(tmp_path: Path, signals: int) -> tuple[Path, Path, str]:
    """Run the toy, and once a replay that ignores SIGTERM is in flight, press Ctrl-C
    ``signals`` times: the second only once the first one's "stopping" line was printed,
    while the kill ladder still waits out the kill grace on that replay."""
    paths = write_toy(tmp_path, STALLING)
    store, hold, inflight = tmp_path / "store", tmp_path / "hold", tmp_path / "inflight"
    inflight.mkdir()
    flags = toy_flags(paths, store)
    flags[flags.index("--kill-grace") + 1] = "3"
    # Replays started once `hold` exists ignore SIGTERM and sleep: the stop must kill them.
    script = tmp_path / "replay.sh"
    script.write_text(
        f'trap "" TERM\nif [ -e {hold} ]; then touch {inflight}/$$; sleep 60; fi\n'
        'cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\n'
    )
    replay = f"sh {script} {{candidate}} {{output_dir}}"
    flags[flags.index("--replay") + 1] = replay
    command = [*EVOLANE, "optimize", *flags, "--stall", "2", "--expose-rw", str(inflight)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = _Lines(process.stdout), _Lines(process.stderr)

    def second_iteration_began() -> bool:  # iteration 0 (no accept: stall 1) is behind us
        journals = list(store.glob("runs/*/journal.jsonl"))
        records = read_journal(journals[0]).records if journals else []
        return any(r.get("slot") == "c0.i1.s0" for r in records)

    try:
        _wait(second_iteration_began, process, err)
        hold.touch()
        _wait(lambda: any(inflight.iterdir()), process, err)
        process.send_signal(signal.SIGINT)
        _wait(lambda: err.has("evolane: stopping now"), process, err)
        if signals == 2:
            process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 130, (out.text(), err.text())
    finally:
        process.kill()
        process.wait()
        hold.unlink(missing_ok=True)  # from now on replays answer at once
    (run_dir,) = (store / "runs").iterdir()
    printed = out.text() + err.text()
    assert f"--resume {run_dir.name}" in printed
    return store, run_dir, printed


@pytest.mark.parametrize("signals", [1, 2])
def test_ctrl_c_then_resume_completes(tmp_path: Path, signals: int) -> None:
    store, run_dir, printed = _interrupt(tmp_path, signals)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "interrupted"
    if signals == 1:  # stopped now, the in-flight replays killed, and the report written
        assert json.loads((run_dir / "report.json").read_text())["status"] == "interrupted"
        assert f"report: {run_dir / 'report.json'}" in printed
        assert "cancelled at once" not in printed
    else:  # the second Ctrl-C cancelled the stop itself: no report
        assert not (run_dir / "report.json").exists()
        assert "cancelled at once" in printed and "report:" not in printed
    # the first session's --progress none is kept when the resume does not give one (it drew
    # the live view: found by review), and one given beside --resume is honoured
    view = ["--progress", "none"] if signals == 1 else []
    resumed = _run(
        ["optimize", "--resume", run_dir.name, "--store", str(store), *view,
         "--iterations", "7", "--seed", "3", "--no-network"]
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith("finished  campaign"), resumed.stdout  # no live view
    assert resumed.stderr.startswith(  # found by review: ignored without a word
        f"evolane: warning: --resume {run_dir.name} keeps the run's stored settings; "
        "ignored: --iterations, --no-network, --seed\n"  # as typed, not --network
    )
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


def test_a_ctrl_c_that_cuts_the_close_short_keeps_the_runs_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by review: after the summary, a first Ctrl-C is ignored and a second aborts the
    # runtime's close, as it should; but the session then exited 130, "interrupted", for a
    # run that had finished (and under --apply auto_verified published): a script reading
    # the code took it for a run cut short.
    import trio
    import trio.testing
    from typer.testing import CliRunner

    from evolane.cli import _summary
    from evolane.cli._app import app
    from evolane.cli._signals import CLOSE_CUT_SHORT
    from evolane.embed import _runtime

    printed = _summary.print_summary

    def print_after_a_ctrl_c(outcome: object, flags: dict) -> None:
        signal.raise_signal(signal.SIGINT)  # ignored: the run has ended
        printed(outcome, flags)

    async def a_slow_close(observers: object) -> list[str]:
        await trio.testing.wait_all_tasks_blocked()  # the first Ctrl-C is taken
        signal.raise_signal(signal.SIGINT)  # the second cuts the close short
        await trio.sleep_forever()
        raise AssertionError("never reached")

    monkeypatch.setattr(_summary, "print_summary", print_after_a_ctrl_c)
    monkeypatch.setattr(_runtime, "close_observers", a_slow_close)
    paths = write_toy(tmp_path, PLAN)
    store = tmp_path / "store"
    done = CliRunner().invoke(app, ["optimize", *toy_flags(paths, store)])
    assert CLOSE_CUT_SHORT in done.output
    assert done.exit_code == 0, done.output
    assert "interrupted" not in done.output
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


def test_the_summary_says_why_a_publish_was_rolled_back(tmp_path: Path) -> None:
    """Found by crash review (ENOSPC injected into a publish): the summary said
    ``apply (auto_verified): rolled_back`` and nothing more; the reason was in report.json
    only."""
    paths = write_toy(tmp_path, {"default": "fix:8"})
    flags = toy_flags(paths, paths["store"])
    flags += ["--iterations", "1", "--population", "1", "--apply", "auto_verified"]
    done = subprocess.run(
        [*EVOLANE, "optimize", *flags, "--check", "sh -c 'exit 4'"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("apply (")]
    assert line.startswith("apply (auto_verified): rolled_back: post-apply check failed"), line
    assert "exit code 4" in line


def test_the_summary_prints_notes_and_paths_as_they_are(tmp_path: Path) -> None:
    """Found by review: the summary passed the note and the report paths through rich markup,
    so ``pip install 'evolane[llm]'`` in a note lost ``[llm]`` and a store under
    ``s[bold]x`` was printed as ``sx`` (a path that does not exist)."""
    paths = write_toy(tmp_path, {"default": "noop"})
    flags = toy_flags(paths, tmp_path / "s[bold]x")
    broken = "sh -c 'echo \"[red]boom[/red] evolane[llm]\" >&2; exit 3'"
    flags = [*with_flag(flags, "--replay", broken), "--iterations", "1", "--population", "1"]
    done = _run(["optimize", *flags], timeout=300)
    assert done.returncode == 1, done.stderr  # the parent could not be measured
    assert "note: no case of the parent could be scored" in done.stdout
    assert "[red]boom[/red] evolane[llm]" in done.stdout
    (report,) = [line for line in done.stdout.splitlines() if line.startswith("report: ")]
    assert Path(report.removeprefix("report: ")).is_file()
    assert str(tmp_path / "s[bold]x" / "runs") in report


def test_a_run_out_of_open_files_fails_in_one_line_naming_the_limit(tmp_path: Path) -> None:
    """Found by review (``ulimit -n 32``): evolane's own EMFILE was a replay's failure (a
    candidate's case scored 0 for the store's ``Too many open files``), a lane's crash, and
    the run ended failed saying ``not run: shared_failure``. Now it ends failed with one
    line naming the limit to raise, and no unit is charged for it."""
    import resource

    paths = write_toy(tmp_path, {"default": "fix:8"})
    flags = [*toy_flags(paths, paths["store"], lanes=16), "--iterations", "1"]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # 16 replays at once need more
    done = subprocess.run(
        [*EVOLANE, "optimize", *flags],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (32, hard)),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "Too many open files: evolane's open-file limit (`ulimit -n`) is 32" in (
        done.stdout + done.stderr
    )
    for journal in Path(paths["store"]).glob("runs/*/journal.jsonl"):
        charged = [r for r in read_journal(journal).records if "open files" in json.dumps(r)]
        assert charged == [], charged[:1]
