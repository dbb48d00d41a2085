"""Store integrity (issue 17 item 6): a store and a target that contain each other are
refused, a write error or a corrupt blob ends the run ``failed`` with one clear line, and
``evolane fsck`` finds and quarantines damaged objects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.campaign_helpers import toy_flags, write_toy

PLAN = {"0.0": "fix:2", "0.1": "harm:1", "1.0": "fix:1"}
EVOLANE = [sys.executable, "-m", "evolane"]


def _run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVOLANE, *args], capture_output=True, text=True, timeout=timeout)


def _one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evolane: error:"), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    return lines[0]


def test_a_store_inside_the_target_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    store = paths["target"] / "sub" / ".." / ".evolane"
    line = _one_line(_run(["optimize", *toy_flags(paths, store)]), 2)
    assert "--store" in line and "--target" in line and str(paths["target"]) in line
    assert not (paths["target"] / ".evolane").exists()
    assert not (paths["target"] / "sub").exists()


def test_a_target_inside_the_store_through_a_symlink_exits_2(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    store = tmp_path / "store"
    store.mkdir()
    (paths["target"]).rename(store / "target")
    link = tmp_path / "link"
    link.symlink_to(store / "target")
    flags = toy_flags({**paths, "target": link}, store)
    line = _one_line(_run(["optimize", *flags]), 2)
    assert "inside --store" in line and str(link) in line and str(store) in line
    assert sorted(p.name for p in store.iterdir()) == ["target"]


# Runs the real CLI with ``os.write`` failing ENOSPC on the run journal after ``LEFT``
# records: what a full disk does to the journal, without mounting a small filesystem.
FULL_DISK = """
import errno, os, sys, types
import evolane.store._journal as journal
LEFT = int(sys.argv.pop(1))
def write(fd, data):
    global LEFT
    if os.readlink(f"/proc/self/fd/{fd}").endswith("journal.jsonl"):
        LEFT -= 1
        if LEFT < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return os.write(fd, data)
journal.os = types.SimpleNamespace(**{**vars(os), "write": write})
if os.environ.get("FULL_DISK_REPORT"):  # the report cannot be written either
    import evolane.campaign._finish as finish
    def refuse(path, value):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    finish.write_json_atomic = refuse
from evolane.cli import main
main()
"""


def test_a_full_disk_ends_the_run_failed_naming_the_journal(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    script = tmp_path / "full_disk.py"
    script.write_text(FULL_DISK)
    done = subprocess.run(
        [sys.executable, str(script), "3", "optimize", *toy_flags(paths, paths["store"])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stdout + done.stderr
    (run_dir,) = (paths["store"] / "runs").iterdir()
    journal = run_dir / "journal.jsonl"
    line = f"cannot write {journal}: No space left on device"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "failed" and report["message"] == line
    assert report["campaign_status"] != "complete"
    assert [x for x in done.stdout.splitlines() if "No space" in x] == [f"note: {line}"]


def test_a_run_whose_report_cannot_be_written_fails_in_one_line(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    script = tmp_path / "full_disk.py"
    script.write_text(FULL_DISK)
    done = subprocess.run(
        [sys.executable, str(script), "3", "optimize", *toy_flags(paths, paths["store"])],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FULL_DISK_REPORT": "1"},
    )
    (run_dir,) = (paths["store"] / "runs").iterdir()
    line = _one_line(done, 1)
    report = run_dir / "report.json"
    assert line == f"evolane: error: cannot write {report}: No space left on device"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"
