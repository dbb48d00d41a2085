"""``evolane drain`` and ``evolane optimize --drain-pending``: pending background jobs of a
store, run from the CLI; a process killed with pending and half-run jobs is drained."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from evolane.campaign import StoreLayout
from evolane.embed import PendingJob, PendingJobs
from tests.evolve_helpers import replay_command, trace_config, trace_record, write_trace_target

REPO = Path(__file__).resolve().parent.parent
EVOLANE = [sys.executable, "-m", "evolane"]

AGENT = textwrap.dedent(
    """
    import json, sys
    import trio
    import evolane
    from evolane.embed import EvolvePolicy, ServiceSettings, open_evolve_service

    config, records, marker = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]

    async def main():
        policy = EvolvePolicy(every=len(records) // 2)
        async with evolane.open_runtime(store=config["store"]) as runtime:
            async with open_evolve_service(
                runtime, config, ServiceSettings(policy=policy)
            ) as service:
                half = len(records) // 2
                for batch in (records[:half], records[half:]):  # each batch: one job
                    for record in batch:
                        await service.record(record)
                    while service.queued:  # its job is made (record no longer waits for it)
                        await trio.sleep(0.02)
                while service.running is None or service.running.run_id is None:
                    await trio.sleep(0.02)
                with open(marker + ".tmp", "w") as out:
                    out.write(service.running.run_id)
                import os
                os.replace(marker + ".tmp", marker)
                await trio.sleep_forever()

    trio.run(main)
    """
)


def drain(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EVOLANE, "drain", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )


def _queued_job(paths: dict[str, Path], config: dict[str, Any] | None = None) -> PendingJob:
    """A shadow job of four trace records, made through the service's queue (closed after)."""
    from evolane.embed._pending import RecordQueue, StoreDirs
    from evolane.embed._service import trajectory_config

    campaign = trace_config(paths) if config is None else config
    queue = RecordQueue.open(StoreDirs(paths["store"]), 10)
    for index in range(4):
        queue.append(json.dumps(trace_record(index)).encode() + b"\n", False)
    job = queue.take("shadow", lambda path: trajectory_config(campaign, path), 10)
    queue.close()
    return job


def test_a_killed_agent_leaves_pending_and_half_run_jobs_that_drain_finishes(
    tmp_path: Path,
) -> None:
    """SIGKILL while the first of two jobs runs: nothing is lost; ``evolane drain`` resumes
    the half-run job's own run (not a new one) and runs the waiting one."""
    paths = write_trace_target(tmp_path, 24)
    config = trace_config(paths, replay=replay_command(0.05))
    records = [trace_record(index) for index in range(24)]
    marker = tmp_path / "started"
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, json.dumps(config), json.dumps(records), str(marker)],
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert agent.poll() is None, "the agent ended before its first job started"
            assert time.monotonic() < deadline, "no job ever started"
            time.sleep(0.05)
        run_id = marker.read_text()
        journal = StoreLayout(paths["store"]).run_dir(run_id) / "journal.jsonl"
        while not (journal.exists() and journal.read_text().count("\n") >= 1):
            assert agent.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.wait()
    jobs = PendingJobs(paths["store"]).list()
    assert [job.state for job in jobs] == ["started", "pending"]
    assert jobs[0].run_id == run_id
    assert sum(job.records for job in jobs) == 24

    result = drain("--store", str(paths["store"]), "--progress", "none")
    assert result.returncode == 0, result.stderr
    assert f"resuming run {run_id}" in result.stdout
    assert PendingJobs(paths["store"]).list() == []
    done = sorted((paths["store"] / "evolve" / "done").iterdir())
    finished = [json.loads((folder / "job.json").read_text()) for folder in done]
    assert [job["state"] for job in finished] == ["done", "done"]
    assert finished[0]["run_id"] == run_id  # resumed, not started over
    assert all(job["status"] == "finished" for job in finished)


def test_drain_with_nothing_pending_says_so(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    result = drain("--store", str(store))
    assert result.returncode == 0 and "no pending jobs" in result.stdout
    optimize = subprocess.run(
        [*EVOLANE, "optimize", "--drain-pending", "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert optimize.returncode == 0 and "no pending jobs" in optimize.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--store", "{tmp}/missing"], "no such folder"),
        (["--store", "{tmp}/file"], "not a directory"),
        (["--store", "{tmp}", "--max-jobs", "0"], "--max-jobs must be at least 1"),
        (["--store", "{tmp}", "--progress", "loud"], "--progress loud: choose from"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "file").write_text("x")
    result = drain(*[arg.format(tmp=tmp_path) for arg in args])
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert result.stderr.startswith("evolane: error: ")


def test_a_damaged_job_file_is_bad_input_naming_it(tmp_path: Path) -> None:
    folder = tmp_path / "store" / "pending" / "job-0000000000001-abcdef"
    folder.mkdir(parents=True)
    (folder / "job.json").write_text("{not json")
    result = drain("--store", str(tmp_path / "store"))
    assert result.returncode == 2
    assert str(folder / "job.json") in result.stderr and result.stderr.count("\n") == 1
    assert not folder.exists()  # set aside, so it stops nothing again
    assert (tmp_path / "store" / "evolve" / "damaged" / folder.name / "job.json").is_file()


def test_a_damaged_job_is_set_aside_and_the_next_job_still_runs(tmp_path: Path) -> None:
    """Found by review: one damaged job.json stopped every later job (drain refused them
    all; the service retried forever while records piled up)."""
    from evolane.embed._pending import RecordQueue, StoreDirs

    paths = write_trace_target(tmp_path, 4)
    job = _queued_job(paths)
    damaged = paths["store"] / "pending" / "job-0000000000001-abcdef"  # sorts first
    damaged.mkdir(parents=True)
    (damaged / "job.json").write_text("{not json")
    result = drain("--store", str(paths["store"]), "--progress", "none")
    assert result.returncode == 2, result.stdout + result.stderr  # the damage is told
    assert str(damaged / "job.json") in result.stderr and "set aside in" in result.stderr
    assert f"evolane drain: job {job.job_id}" in result.stdout  # and the next job ran
    assert (paths["store"] / "evolve" / "done" / job.job_id / "job.json").is_file()
    # A service opening the queue sets such a job aside too, and says so in its faults.
    damaged.mkdir()
    (damaged / "job.json").write_text("{not json")
    reopened = RecordQueue.open(StoreDirs(paths["store"]), 10)
    reopened.close()
    (reason,) = reopened.damaged
    assert reason.startswith(f"{damaged / 'job.json'}: ") and not damaged.exists()


@pytest.mark.parametrize("errno_", [24, 5])  # EMFILE, EIO
def test_a_job_that_cannot_be_read_is_left_in_place_not_set_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errno_: int
) -> None:
    """Found by review: a job.json that could not be read for a while (the agent's process
    at its open-files limit, an I/O error) was set aside as damaged, the healthy job never
    to run; and one retired by another process between the listing and the read was told
    as damaged (drain exit 2). Only damage read in the file sets a job aside."""
    from evolane.embed import _pending
    from evolane.embed._pending import RecordQueue, StoreDirs, load_jobs
    from evolane.embed._service import trajectory_config

    paths = write_trace_target(tmp_path, 2)
    dirs = StoreDirs(paths["store"])
    queue = RecordQueue.open(dirs, 10)
    queue.append(json.dumps(trace_record(0)).encode() + b"\n", False)
    job = queue.take("shadow", lambda path: trajectory_config(trace_config(paths), path), 10)
    queue.close()
    real = _pending.read_json

    def failing(path: Path) -> object:
        raise OSError(errno_, os.strerror(errno_))

    monkeypatch.setattr(_pending, "read_json", failing)
    damaged: list[str] = []
    assert load_jobs(dirs, damaged=damaged) == []
    (reason,) = damaged
    assert "left in place" in reason and (dirs.pending / job.job_id / "job.json").is_file()
    assert not dirs.damaged.exists()

    def retired_meanwhile(path: Path) -> object:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(_pending, "read_json", retired_meanwhile)
    damaged.clear()
    assert load_jobs(dirs, damaged=damaged) == [] and damaged == []
    monkeypatch.setattr(_pending, "read_json", real)
    assert [found.job_id for found in load_jobs(dirs, damaged=damaged)] == [job.job_id]
    assert damaged == []


def test_a_refused_job_is_retired_as_failed_and_exits_2(tmp_path: Path) -> None:
    """A job whose campaign is refused (its target is gone) fails alone, named, exit 2."""
    paths = write_trace_target(tmp_path, 4)
    job = _queued_job(paths, trace_config(paths, target=str(tmp_path / "gone")))
    result = drain("--store", str(paths["store"]), "--progress", "none")
    assert result.returncode == 2, result.stderr
    assert job.job_id in result.stderr and "gone" in result.stderr
    retired = json.loads((paths["store"] / "evolve" / "done" / job.job_id / "job.json").read_text())
    assert retired["state"] == "failed" and retired["exit_code"] == 2
    assert not os.listdir(paths["store"] / "pending")


def test_a_job_another_process_holds_is_skipped_and_drain_exits_0(tmp_path: Path) -> None:
    """Every pending job held by another live process: nothing failed here, so exit 0, the
    job named and left pending for its holder."""
    import fcntl

    paths = write_trace_target(tmp_path, 4)
    job = _queued_job(paths)
    lock = paths["store"] / "pending" / job.job_id / ".lock"
    with lock.open("a") as held:  # as the job's running process holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = drain("--store", str(paths["store"]), "--progress", "none")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"job {job.job_id} is running in another process" in result.stdout
    assert (paths["store"] / "pending" / job.job_id / "job.json").is_file()


def test_a_job_whose_target_another_run_holds_stays_pending_and_exits_2(tmp_path: Path) -> None:
    """Another run holds the job's target (a command-line run, another agent's service):
    the job is named with that run and stays pending, not retired as failed."""
    from evolane.campaign._lock import lock_target

    paths = write_trace_target(tmp_path, 4)
    job = _queued_job(paths)
    held = lock_target(paths["target"], "r-other-run")
    try:
        result = drain("--store", str(paths["store"]), "--progress", "none")
    finally:
        held.release()
    assert result.returncode == 2, result.stdout + result.stderr
    assert job.job_id in result.stderr and "r-other-run" in result.stderr
    assert "stays pending" in result.stderr
    assert [left.state for left in PendingJobs(paths["store"]).list()] == ["pending"]


def test_a_deep_half_made_job_folder_goes_when_the_queue_opens(tmp_path: Path) -> None:
    """Found by review: a job folder with no job.json (a crash as the job was made) is
    removed when the queue opens; one holding a chain of 3,000 folders made the open fail
    with RecursionError (``shutil.rmtree`` recurses once per level)."""
    from evolane.embed._pending import RecordQueue, StoreDirs
    from evolane.store import remove_tree

    dirs = StoreDirs(tmp_path / "store")
    deep = dirs.pending / "job-half-made"
    deep.mkdir(parents=True)
    fd = os.open(deep, os.O_RDONLY)
    for _ in range(3000):  # each level made through its parent's descriptor: no long path
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    try:
        RecordQueue.open(dirs, 10).close()
        assert not deep.exists()
    finally:  # pytest's own clean-up of its folders recurses too
        remove_tree(deep)
