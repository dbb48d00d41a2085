"""Found by review (the store's disk filled while a run wrote its report): the run was marked
``failed`` with no report, so ``--resume`` refused it ("its report says why": there was none)
and ``--resume-campaign`` ran the cycle again from nothing (it reuses only runs whose end
reached the campaign's books): every replay and judge call the run had journaled was paid
again, and their spend was in no book. The same full disk a moment earlier or later left the
run resumable or reported. A run whose store refused a write before its report was written
now stays resumable: one line says so, and ``--resume`` finishes it, running nothing again."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from evolane.sandbox._disk import DiskLow
from evolane.store import CorruptBlobError, StorageFailure, refused_write
from tests.campaign_helpers import toy_flags, write_toy

EVOLANE = [sys.executable, "-m", "evolane"]
FULL_AT_REPORT = textwrap.dedent(
    """
    import errno, os
    from evolane.campaign import _finish
    real = _finish.write_json_atomic
    def full(path, record, *args, **kwargs):
        if path.name == "report.json":  # the disk is full when the report is written
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, record, *args, **kwargs)
    _finish.write_json_atomic = full
    from evolane.cli import main
    main()
    """
)


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def test_a_run_whose_store_filled_before_its_report_resumes_paying_nothing_again(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"0.0": "fix:2"})
    store, log = tmp_path / "store", tmp_path / "replays.log"
    flags = [*toy_flags(paths, store, log=log), "--iterations", "1", "--population", "1"]
    first = _run([sys.executable, "-c", FULL_AT_REPORT, "optimize", *flags])
    assert first.returncode == 1, first.stdout + first.stderr
    assert "Traceback" not in first.stderr
    (line,) = [x for x in first.stderr.splitlines() if x.startswith("evolane: error:")]
    assert "report.json: No space left on device" in line, line
    run_id = line.rsplit("--resume ", 1)[1]
    run = json.loads((store / "runs" / run_id / "run.json").read_text())
    assert run["status"] == "interrupted"
    launched = log.read_text().splitlines()
    assert launched

    second = _run([*EVOLANE, "optimize", "--resume", run_id, "--store", str(store)])
    assert second.returncode == 0, second.stdout + second.stderr
    assert json.loads((store / "runs" / run_id / "run.json").read_text())["status"] == "finished"
    assert log.read_text().splitlines() == launched  # no replay ran again
    assert (store / "runs" / run_id / "report.json").is_file()


def test_what_leaves_a_run_resumable_is_room_not_damage() -> None:
    """A disk short of room (a refused write, the floor crossed while a command ran, open
    files run out) loses nothing journaled; a blob that is not what was written does."""
    assert refused_write(OSError(errno.ENOSPC, "No space left on device", "x"))
    assert refused_write(OSError(errno.EMFILE, "Too many open files"))
    assert refused_write(DiskLow("the disk under s fell below 1 MiB free"))
    assert not refused_write(CorruptBlobError("sha256:00 does not match"))
    assert not refused_write(StorageFailure("cannot read back"))


DIE_AFTER_RUN_RECORD = textwrap.dedent(
    """
    import os, sys, trio
    from evolane.campaign import _prepare
    from evolane.campaign._config import CampaignConfig
    from evolane.campaign._run import RunRequest, run_campaign
    real = _prepare.save_run
    def save_then_die(layout, record):
        real(layout, record)
        os._exit(9)  # as a SIGKILL right after run.json was written
    _prepare.save_run = save_then_die
    trio.run(run_campaign, RunRequest(CampaignConfig.model_validate_json(sys.argv[1])))
    """
)


def test_a_resume_runs_in_the_store_it_is_given_not_the_one_the_run_began_in(
    tmp_path: Path,
) -> None:
    # Found by review: a store moved (or copied) elsewhere resumed with the settings of its
    # old place, so a full disk was said of the old path ("cannot write <old store>: No
    # space left on device") and an --llm-cache would have been written there.
    from evolane.campaign._prepare import prepare_run
    from tests.campaign_helpers import toy_config

    paths = write_toy(tmp_path, {"0.0": "fix:1"})
    config = toy_config(paths, iterations=1, population=1)
    died = _run([sys.executable, "-c", DIE_AFTER_RUN_RECORD, config.model_dump_json()])
    assert died.returncode == 9, died.stderr
    moved = tmp_path / "moved"
    paths["store"].rename(moved)
    (run_dir,) = (moved / "runs").iterdir()
    here = config.model_copy(update={"store": str(moved)})
    prepared = prepare_run(here, resume_run=run_dir.name)
    assert prepared.config.store == str(moved)
    assert not paths["store"].exists()
