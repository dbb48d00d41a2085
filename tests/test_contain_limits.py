"""Issue 17, item 3: default limits on every campaign command.

Through the real CLI (``evolane optimize --isolation process``): a replay that forks without
end, allocates past ``--max-memory``, writes past ``--max-file-size`` or opens past
``--max-open-files`` is stopped by that limit, the run ends normally, and the unit is a
failure of the tree the replay ran (the task's for the baseline: not comparable; the
candidate's: scored 0, so a candidate cannot drop the cases it fails from the comparison by
exhausting a limit) whose reason names the limit and its flag, in the journal and the
report. The values in force are in run.json and the report; a bad value
is one line and exit 2; a run.json from before the limits resumes as it ran (no limits).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evolane.campaign._gates import _validator_verdict
from evolane.lanes import limit_reason, limits_hit, note_limits
from evolane.measure import CommandLimits, parse_size
from evolane.sandbox import Limits, ProcessOutcome, StreamCapture
from tests.campaign_helpers import shared_folder, start_optimize, toy_flags, wait_for, write_toy

# The replay answers every case from the candidate; on case val00 it first misbehaves as
# its mode says (on a resume, "pause" answers at once: the marker exists).
REPLAY = textwrap.dedent(
    """
    import os, shutil, sys, time
    candidate, out, mode = sys.argv[1:4]
    case = os.environ["EVOLANE_CASE_ID"]
    if case == "val00" and mode == "fork":
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
        except OSError as error:
            print(f"fork failed: {error}", file=sys.stderr)
            sys.exit(1)
    elif case == "val00" and mode == "memory":
        hog = bytearray(200 << 20)  # zero-filled: every page is touched
        print(len(hog))
    elif case == "val00" and mode == "fsize":
        with open(os.path.join(out, "big.bin"), "wb") as big:
            big.write(b"x" * (2 << 20))
    elif case == "val00" and mode == "nofile":
        held = [open(os.devnull) for _ in range(200)]
    elif case == "val00" and mode.startswith("pause="):
        marker = mode.partition("=")[2]
        if not os.path.exists(marker):
            open(marker, "w").close()
            time.sleep(120)
    shutil.copy(os.path.join(candidate, case), os.path.join(out, "output.json"))
    """
)
LIMIT_KEYS = ("max_procs", "max_memory", "max_file_size", "max_open_files")


def _flags(root: Path, mode: str, *extra: str, isolation: str = "process") -> list[str]:
    paths = write_toy(root, {"default": "fix:2"}, val=8, test=2)
    script = root / "replay.py"
    script.write_text(REPLAY)
    flags = toy_flags(paths, root / "store")
    flags[flags.index("--replay") + 1] = (
        f"{sys.executable} -I {script} {{candidate}} {{output_dir}} {mode}"
    )
    flags[flags.index("--iterations") + 1] = "1"
    flags[flags.index("--population") + 1] = "1"
    return [*flags, "--isolation", isolation, "--replay-timeout", "60", *extra]


def _evolane(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "evolane", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def _run_dir(root: Path) -> Path:
    (run_dir,) = (root / "store" / "runs").iterdir()
    return run_dir


def _val00_failures(run_dir: Path) -> list[dict]:
    """The replay failures of case val00's units in the journal."""
    failures = []
    for line in (run_dir / "journal.jsonl").read_text().splitlines():
        record = json.loads(line)
        replay = record.get("replay") or {}
        if record.get("type") == "unit" and replay.get("case_id") == "val00":
            failures.append(replay["failure"])
            assert record["judge"] is None  # not judged: never a score
    return failures


def _assert_limit_failure(root: Path, code: str, reason: str) -> Path:
    """Every unit of val00 is a failure ``code`` of the tree it ran (owner ``task`` for the
    baseline, ``candidate`` for a candidate) whose message is ``reason``, in the journal and
    in report.md; returns the run's folder."""
    run_dir = _run_dir(root)
    failures = _val00_failures(run_dir)
    assert failures, "no unit of val00 was journaled"
    for failure in failures:
        assert failure["owner"] in ("task", "candidate"), failure
        assert failure["code"] == code, failure
        assert failure["message"].startswith(reason), failure
    assert f"/replay {code} {reason}" in (run_dir / "report.md").read_text()
    return run_dir


@pytest.mark.parametrize("isolation", ["process", "auto"])
def test_a_fork_bomb_replay_is_bounded_by_max_procs(tmp_path: Path, isolation: str) -> None:
    flags = _flags(tmp_path, "fork", "--max-procs", "20", isolation=isolation)
    done = _evolane("optimize", *flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    _assert_limit_failure(tmp_path, "limit_processes", "processes limit 20 hit (--max-procs)")


def test_a_replay_past_max_memory_gets_the_memory_reason(tmp_path: Path) -> None:
    done = _evolane("optimize", *_flags(tmp_path, "memory", "--max-memory", "64M"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads((_run_dir(tmp_path) / "report.json").read_text())
    if "memory 64 MiB (memory_cgroup)" not in report["limits"]:
        pytest.skip(f"no writable memory cgroup on this host: {report['limits']}")
    _assert_limit_failure(tmp_path, "limit_memory", "memory limit 64 MiB hit (--max-memory)")


def test_a_replay_writing_past_max_file_size_gets_the_file_size_reason(tmp_path: Path) -> None:
    flags = _flags(tmp_path, "fsize", "--max-file-size", "1M")
    done = _evolane("optimize", *flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    reason = "file size limit 1 MiB hit (--max-file-size)"
    _assert_limit_failure(tmp_path, "limit_file_size", reason)


def test_a_replay_opening_past_max_open_files_gets_its_reason_and_defaults_are_recorded(
    tmp_path: Path,
) -> None:
    flags = _flags(tmp_path, "nofile", "--max-open-files", "64")
    done = _evolane("optimize", *flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    reason = "open files limit 64 hit (--max-open-files)"
    run_dir = _assert_limit_failure(tmp_path, "limit_open_files", reason)
    stored = json.loads((run_dir / "run.json").read_text())["config"]
    assert {key: stored[key] for key in LIMIT_KEYS} == {
        "max_procs": 512,
        "max_memory": 4 << 30,
        "max_file_size": 1 << 30,
        "max_open_files": 64,
    }
    report = json.loads((run_dir / "report.json").read_text())
    assert "file size 1 GiB (rlimit_fsize)" in report["limits"]
    assert "open files 64 (rlimit_nofile)" in report["limits"]
    assert "processes 512" in report["limits"] and "memory 4 GiB" in report["limits"]
    assert f"- limits per command: {report['limits']}" in (run_dir / "report.md").read_text()
    shown = _evolane("report", run_dir.name, "--store", str(tmp_path / "store"), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "rlimit_nofile" in " ".join(shown.stdout.split())


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-memory", "12Q"),
        ("--max-memory", "-1"),
        ("--max-file-size", "2X"),
        ("--max-procs", "-3"),
        ("--max-open-files", "many"),
        ("--max-open-files", "4"),
    ],
)
def test_a_bad_limit_is_one_line_naming_the_flag_and_exit_2(
    tmp_path: Path, flag: str, value: str
) -> None:
    done = _evolane("optimize", *_flags(tmp_path, "plain", flag, value), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], done.stderr
    assert not (tmp_path / "store" / "runs").exists() or not any(
        (tmp_path / "store" / "runs").iterdir()
    )


def test_an_old_run_json_without_the_limits_resumes_and_reports_without_limits(
    tmp_path: Path,
) -> None:
    marker = shared_folder(tmp_path / "shared") / "paused"
    flags = _flags(tmp_path, f"pause={marker}")
    process = start_optimize(flags, tmp_path)
    try:
        wait_for(marker, process, "the replay paused")
    finally:
        os.kill(process.pid, signal.SIGKILL)  # our own child, by its pid
        process.wait(timeout=60)
    run_dir = _run_dir(tmp_path)
    record = json.loads((run_dir / "run.json").read_text())
    for key in LIMIT_KEYS:  # as a run.json written before the limits existed
        del record["config"][key]
    (run_dir / "run.json").write_text(json.dumps(record))
    store = str(tmp_path / "store")
    resume = ("optimize", "--resume", run_dir.name, "--store", store, "--progress", "none")
    done = _evolane(*resume, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert report["resumed"] == 1
    assert all(report["config"][key] is None for key in LIMIT_KEYS)  # it resumed as it ran
    assert report["limits"].startswith("processes unlimited; memory unlimited")
    shown = _evolane("report", run_dir.name, "--store", store, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr


# -- the pieces, without a run ---------------------------------------------------------------


def _failed(stderr: bytes, **fields: object) -> ProcessOutcome:
    values: dict = {"status": "exited", "exit_code": 1, "stderr": StreamCapture(head=stderr)}
    return ProcessOutcome(**{**values, **fields})


def test_sizes_and_counts_parse_with_units_and_none() -> None:
    assert parse_size("512M") == 512 << 20 and parse_size("4g") == 4 << 30
    assert parse_size("1.5GiB") == 3 << 29 and parse_size(1024) == 1024
    assert parse_size("none") is None and parse_size("0") is None and parse_size(0) is None
    limits = CommandLimits(max_procs="none", max_memory="1G", max_open_files=0)
    assert (limits.max_procs, limits.max_memory, limits.max_open_files) == (None, 1 << 30, None)
    sandbox = limits.sandbox_limits()
    assert sandbox.processes is None and sandbox.memory_bytes == 1 << 30
    assert sandbox.address_space_bytes is None  # never RLIMIT_AS: it breaks runtimes


def test_efbig_and_emfile_on_stderr_count_only_when_that_limit_is_set() -> None:
    limits = Limits(file_size_bytes=1 << 20, open_files=64)
    too_large = _failed(b"OSError: [Errno 27] File too large\n")
    too_many = _failed(b"OSError: [Errno 24] Too many open files: '/dev/null'\n")
    assert limits_hit(too_large, limits) == ("file_size",)
    assert limits_hit(too_many, limits) == ("open_files",)
    assert limits_hit(too_large, Limits()) == ()  # no limit set: the command's own failure
    ok = _failed(b"Too many open files", exit_code=0)
    assert limits_hit(ok, limits) == ()  # it recovered: not a failure
    noted = note_limits(_failed(b"", limits_hit=("memory",)), Limits(memory_bytes=4 << 30))
    assert noted.status == "limit_exceeded"
    assert noted.error == "memory limit 4 GiB hit (--max-memory)"
    both = limit_reason(("processes", "cpu"), Limits(processes=512, cpu_seconds=9))
    assert both == "processes limit 512 hit (--max-procs); cpu limit 9 s hit"


def test_a_validator_that_hits_a_limit_is_indecisive_not_a_rejection() -> None:
    outcome = _failed(
        b"", status="limit_exceeded", exit_code=None, signal=9, limits_hit=("memory",)
    )
    verdict = _validator_verdict(outcome, 60.0, Limits(memory_bytes=64 << 20))
    assert verdict.outcome == "indecisive"
    assert "memory limit 64 MiB hit (--max-memory)" in verdict.reason
