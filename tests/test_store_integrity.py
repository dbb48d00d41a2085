"""Store integrity (issue 17 item 6): a store and a target that contain each other are
refused, a write error or a corrupt blob ends the run ``failed`` with one clear line, and
``evolane fsck`` finds and quarantines damaged objects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

import evolane
from evolane.embed import BackendCall, Backends, OptimizeRequest
from tests.campaign_helpers import toy_config, toy_flags, write_toy
from tests.test_embed import judge_backend, optimizer_backend, replay_backend

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


def _patched_optimize(
    paths: dict[str, Path], source: str, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """`evolane optimize` on the toy through a script that patches evolane first (``source``,
    given ``args`` before the command's own)."""
    script = paths["store"].parent / "patched_evolane.py"
    script.write_text(source)
    return subprocess.run(
        [sys.executable, str(script), *args, "optimize", *toy_flags(paths, paths["store"])],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def _ended_failed_on_a_full_disk(paths: dict[str, Path], done: Any) -> None:
    """The run said the disk was full, without a traceback, and ended failed."""
    told = done.stdout + done.stderr
    assert "No space left on device" in told and "Traceback" not in told, told
    (run_dir,) = (paths["store"] / "runs").iterdir()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"


def _optimize_on_a_full_disk(paths: dict[str, Path], tmp_path: Path, **env: str) -> Any:
    """`evolane optimize` on the toy with the journal's disk full after 3 records."""
    return _patched_optimize(paths, FULL_DISK, "3", **env)


def test_a_full_disk_ends_the_run_failed_naming_the_journal(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    done = _optimize_on_a_full_disk(paths, tmp_path)
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
    done = _optimize_on_a_full_disk(paths, tmp_path, FULL_DISK_REPORT="1")
    (run_dir,) = (paths["store"] / "runs").iterdir()
    line = _one_line(done, 1)
    report = run_dir / "report.json"
    assert line == (
        f"evolane: error: cannot write {report}: No space left on device; once fixed, "
        f"continue the run with --resume {run_dir.name}"
    )  # no report: left resumable (tests/test_store_full_resume.py)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"


RUN_JSON_ON_A_FULL_DISK = """
import errno, os
import evolane.campaign._runs as runs
real = runs.write_json_atomic
def refuse(path, value):
    if os.path.basename(path) != "run.json":  # campaign.json is written first
        return real(path, value)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
runs.write_json_atomic = refuse
from evolane.cli import main
main()
"""


def test_a_full_disk_before_the_run_starts_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """run.json cannot be written: nothing ran, and the error names the file (it used to be
    "internal error" with the exception's repr)."""
    paths = write_toy(tmp_path, PLAN)
    done = _patched_optimize(paths, RUN_JSON_ON_A_FULL_DISK)
    line = _one_line(done, 1)
    assert line.startswith("evolane: error: cannot write ") and "internal error" not in line
    assert line.endswith("/run.json: No space left on device"), line
    assert not list(paths["store"].glob("runs/*/run.json"))


def test_debug_shows_a_full_disks_traceback_before_its_line(tmp_path: Path) -> None:
    """Found by review: --debug printed the one line alone for a store that refused a write,
    where every other internal failure gets its traceback."""
    paths = write_toy(tmp_path, PLAN)
    script = paths["store"].parent / "patched_evolane.py"
    script.write_text(RUN_JSON_ON_A_FULL_DISK)
    flags = [*toy_flags(paths, paths["store"]), "--debug"]
    done = subprocess.run(
        [sys.executable, str(script), "optimize", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" in done.stderr and "OSError" in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("evolane: error: cannot write ") and "No space left" in last


async def _corrupting_run(paths: dict[str, Path]) -> Any:
    """A run whose optimizer overwrites every object of the store (as a hostile one could
    without confinement): the next read of one ends the run."""
    config = toy_config(
        paths, replay="backend:replay", judge="backend:judge", optimizer="backend:optimizer"
    )

    async def corrupting(call: BackendCall) -> str:
        for blob in (paths["store"] / "objects" / "sha256").glob("*/*"):
            blob.chmod(0o644)
            blob.write_bytes(b"garbage")
        return await optimizer_backend(call)

    backends = Backends(replay=replay_backend, judge=judge_backend, optimizer=corrupting)
    with trio.fail_after(60):
        async with evolane.open_runtime(store=paths["store"]) as runtime:
            handle = await runtime.start_optimize(OptimizeRequest(config=config), backends=backends)
            return await handle.result()


async def test_a_corrupt_blob_fails_the_run_and_fsck_finds_and_quarantines_it(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, PLAN)
    store = paths["store"]
    outcome = await _corrupting_run(paths)
    assert outcome.report.status == "failed"
    assert outcome.report.message.startswith("corrupt blob sha256:")
    assert f"run `evolane fsck --store {store}`" in outcome.report.message
    (run_dir,) = (store / "runs").iterdir()
    run_id = run_dir.name
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"
    fresh = [p for p in store.glob("objects/sha256/*/*") if p.read_bytes() != b"garbage"]
    assert fresh and all(p.stat().st_mode & 0o777 == 0o444 for p in fresh)

    done = _run(["fsck", "--store", str(store)])
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    bad = [line for line in lines if line.startswith("bad object ")]
    assert bad and all("its bytes hash to sha256:" in line for line in bad)
    assert any(line.endswith(f"used by run {run_id}") for line in bad)
    assert lines[-1].endswith("problems found (run with --repair to quarantine bad objects)")

    done = _run(["fsck", "--store", str(store), "--repair"])
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    moved = [line.rpartition("; moved to ")[2] for line in done.stdout.splitlines()[:-1]]
    assert len(moved) == len(bad) and all(Path(p).read_bytes() == b"garbage" for p in moved)
    assert all(Path(p).parent.parent == store / "quarantine" for p in moved)
    done = _run(["fsck", "--store", str(store)])
    assert done.returncode == 0, done.stdout
    assert done.stdout.splitlines()[-1].endswith(": clean")


async def test_report_suggests_resume_only_when_a_resume_can_work(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    store = paths["store"]
    await _corrupting_run(paths)
    (run_dir,) = (store / "runs").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    done = _run(["report", run_dir.name, "--store", str(store)])
    assert done.returncode == 0 and "--resume" not in done.stdout
    # As a run killed after its seed blob was overwritten: no report, status running.
    (run_dir / "run.json").write_text(json.dumps({**record, "status": "running"}))
    (run_dir / "report.json").unlink()
    done = _run(["report", run_dir.name, "--store", str(store)])
    assert done.returncode == 0, done.stderr
    assert "--resume" not in done.stdout and "cannot resume" in done.stdout
    assert f"evolane fsck --store {store}" in done.stdout.replace("\n", "")
    done = _run(["report", run_dir.name, "--store", str(store), "--format", "json"])
    summary = json.loads(done.stdout)
    assert summary["resume"] is None and "is corrupt" in summary["resume_blocked"]


def test_fsck_names_a_damaged_journal_line_and_its_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "store" / "runs" / "r-1"
    run_dir.mkdir(parents=True)
    (run_dir / "journal.jsonl").write_bytes(b'{"a": 1}\nforged\n{"b": 2}\n')
    done = _run(["fsck", "--store", str(tmp_path / "store")])
    assert done.returncode == 1
    first, last = done.stdout.splitlines()
    assert first.startswith(f"damaged journal {run_dir / 'journal.jsonl'}: ")
    assert first.endswith("; used by run r-1")
    assert last == f"0 objects checked in {tmp_path / 'store'}: 1 problem found" + (
        " (run with --repair to quarantine bad objects)"
    )


def test_fsck_of_a_clean_store_exits_0_and_of_no_store_exits_2(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    done = _run(["fsck", "--store", str(tmp_path / "store")])
    assert done.returncode == 0 and done.stdout.strip().endswith(": clean")
    line = _one_line(_run(["fsck", "--store", str(tmp_path / "nope")]), 2)
    assert str(tmp_path / "nope") in line


# Found by review: a candidate filling the disk either tore the events journal (the run died
# as an "internal error" with no report) or crashed a replay lane storing its output (a
# framework failure of one unit: the run ended "finished", exit 0). Both end the run failed
# now, in one line naming what could not be written.
SHORT_WRITE = """
import os, sys, types
import evolane.store._journal as journal
def write(fd, data):
    if os.readlink(f"/proc/self/fd/{fd}").endswith("events.jsonl") and len(data) > 1:
        return os.write(fd, bytes(data)[: len(data) // 2])  # the disk took half
    return os.write(fd, data)
journal.os = types.SimpleNamespace(**{**vars(os), "write": write})
from evolane.cli import main
main()
"""

FULL_WHILE_STORING_OUTPUT = """
import errno, os, sys
import evolane.lanes._replay as replay
LEFT = [int(sys.argv.pop(1))]
real = replay.store_scan
def scan(*args, **kwargs):
    LEFT[0] -= 1
    if LEFT[0] < 0:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "objects")
    return real(*args, **kwargs)
replay.store_scan = scan
from evolane.cli import main
main()
"""


def test_a_torn_events_journal_ends_the_run_failed_in_one_line(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    done = _patched_optimize(paths, SHORT_WRITE)
    assert done.returncode == 1, (done.stdout, done.stderr)
    told = done.stdout + done.stderr
    assert "internal error" not in told and "Traceback" not in told, told
    assert "events.jsonl: a short write" in told or "events.jsonl: an earlier write" in told


def test_a_full_disk_while_a_replay_stores_its_output_ends_the_run_failed(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, PLAN)
    done = _patched_optimize(paths, FULL_WHILE_STORING_OUTPUT, "6")
    assert done.returncode == 1, (done.stdout, done.stderr)
    _ended_failed_on_a_full_disk(paths, done)


FULL_WHILE_PREPARING_A_SLOT = """
import errno, os
import evolane.lanes._scratch as scratch
def prepare(self, store, job):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "sandbox/context")
scratch.SlotScratch.prepare = prepare
from evolane.cli import main
main()
"""


def test_a_full_disk_while_an_optimizer_slot_is_prepared_ends_the_run_failed(
    tmp_path: Path,
) -> None:
    """Found by crash-point enumeration (ENOSPC at a write of the optimizer's context folder
    in the store): the slot was lost as ``prepare_failed`` and the run ended ``complete``,
    exit 0; a full store now ends the run failed, as a replay's full disk does."""
    paths = write_toy(tmp_path, PLAN)
    done = _patched_optimize(paths, FULL_WHILE_PREPARING_A_SLOT)
    assert done.returncode == 1, (done.stdout, done.stderr)
    _ended_failed_on_a_full_disk(paths, done)


THREAD_REFUSED_WHILE_PREPARING_A_SLOT = """
import evolane.lanes._scratch as scratch
def prepare(self, store, job):
    raise RuntimeError("can't start new thread")  # the host refused a worker thread
scratch.SlotScratch.prepare = prepare
from evolane.cli import main
main()
"""


def test_a_thread_the_host_refused_inside_the_cycle_pauses_the_run_resumable(
    tmp_path: Path,
) -> None:
    """Found by CI (a full pids.max, 1 run in 5): a thread the host refused while the cycle
    prepared a slot was caught as the store's failure and ended the run ``failed``, its
    report's note naming the limit, where the same refusal a moment earlier or later left it
    ``interrupted`` with one line and ``--resume``: a refusal is the host's, never damage."""
    paths = write_toy(tmp_path, PLAN)
    done = _patched_optimize(paths, THREAD_REFUSED_WHILE_PREPARING_A_SLOT)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stdout + done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("evolane: error:")]
    assert "the host refused evolane a thread" in line, line
    (run_dir,) = (paths["store"] / "runs").iterdir()
    assert line.endswith(f"continue the run with --resume {run_dir.name}"), line
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    resume = ["optimize", "--resume", run_dir.name, "--store", str(paths["store"])]
    again = subprocess.run(
        [sys.executable, "-m", "evolane", *resume],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"


async def test_a_new_run_and_campaign_folder_are_fsynced_into_their_parents(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Found by crash review (strace of a run): ``runs/<id>/`` and ``campaigns/<id>/`` were
    made and only the files inside them fsynced, so a power loss could lose the folders'
    entries, run.json and campaign.json with them."""
    from evolane.campaign._run import RunRequest, run_campaign

    paths = write_toy(tmp_path, PLAN)
    synced: set[int] = set()
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.add(os.fstat(fd).st_ino), real(fd)))
    with trio.fail_after(120):
        await run_campaign(RunRequest(toy_config(paths, iterations=1, population=1)))
    store = paths["store"]
    for folder in (store, store / "runs", store / "campaigns"):
        assert folder.stat().st_ino in synced, folder
