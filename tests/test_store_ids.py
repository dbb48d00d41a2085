"""A run or campaign id from the user is one path component of the id alphabet (hostile
review #4): ``--resume ../../../x`` never reads a run outside the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evolane.campaign._layout import StoreLayout, check_id
from evolane.cli._tally import AFTER_ENV
from evolane.inputs import InputError
from tests.campaign_helpers import toy_flags, write_toy


@pytest.mark.parametrize(
    "bad", ["", ".", "..", "../x", "a/b", "-r", ".hidden", "a\x00b", "x" * 129]
)
def test_an_id_that_is_not_one_path_component_is_refused(tmp_path: Path, bad: str) -> None:
    layout = StoreLayout(tmp_path)
    with pytest.raises(InputError, match="is not a run id"):
        layout.run_dir(bad)
    with pytest.raises(InputError, match="is not a campaign id"):
        layout.campaign_file(bad)


def test_ids_evolane_makes_and_users_give_pass(tmp_path: Path) -> None:
    for good in ("r-20261205-053012-f3c4c7", "c-20261205-053012-f3c4c7", "camp_1.v2", "x" * 128):
        assert check_id(good) == good
    assert StoreLayout(tmp_path).run_dir("r-1") == tmp_path / "runs" / "r-1"


def test_resume_of_a_path_outside_the_store_is_one_line_exit_2(tmp_path: Path) -> None:
    store = tmp_path / "project" / ".evolane"
    (store / "runs").mkdir(parents=True)
    foreign = tmp_path / "x"
    foreign.mkdir()
    (foreign / "run.json").write_text("{not json")  # read by the old code: an internal error
    command = [sys.executable, "-m", "evolane", "optimize", "--resume", "../../x"]
    command += ["--store", str(store), "--progress", "none"]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=60, cwd=tmp_path / "project"
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "'../../x' is not a run id" in lines[0], done.stderr


def _evolane(*args: str | bytes) -> subprocess.CompletedProcess[str]:
    """The CLI with no store-walk progress on stderr (a loaded host makes a walk of a few
    folders last past the first line's second: stderr is then not empty)."""
    return subprocess.run(
        [sys.executable, "-m", "evolane", *args],
        capture_output=True,
        encoding="utf-8",
        errors="surrogateescape",  # a path printed as its bytes
        timeout=120,
        env={**os.environ, AFTER_ENV: "3600"},
    )


def test_a_folder_named_by_no_id_is_named_by_fsck_and_read_by_no_command(tmp_path: Path) -> None:
    # Found by review: a run folder copied to `bad name` (or named by bytes that are not
    # UTF-8) made `fsck` and `report bad` fail with a traceback (exit 1), and a store path
    # not UTF-8 did the same to `runs --json`.
    store = tmp_path / "st\udcffore"  # the bytes b"st\xffore"
    for folder in ("runs/bad name", "runs/x\udcff", "campaigns/.hidden"):
        (store / folder).mkdir(parents=True)
        (store / folder / f"{folder.split('/')[0][:-1]}.json").write_text("{}")
    checked = _evolane("fsck", "--store", os.fsencode(store))
    assert checked.returncode == 1 and not checked.stderr, checked.stderr
    lines = checked.stdout.splitlines()
    assert len(lines) == 4 and all(line.startswith("misnamed folder ") for line in lines[:3])
    assert "bad name: its name is not an id" in lines[0], lines
    for args in (("report", "bad"), ("watch", "x"), ("diff", "bad")):
        done = _evolane(*args, "--store", os.fsencode(store))
        assert done.returncode == 2 and "unknown run" in done.stderr, done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr
    listed = _evolane("runs", "--json", "--store", os.fsencode(store))
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == {
        "store": str(store).replace("\udcff", "\ufffd"),
        "runs": [],
        "campaigns": [],
    }


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--resume", "", "--resume is empty: name the run"),  # an unset "$RUN_ID"
        ("--resume-campaign", " ", "--resume-campaign is empty: name the campaign"),
        ("--from-run", "", "--from-run is empty: name the run"),
        ("--resume", "r" * 129, "--resume: 'rrr"),
        ("--resume-campaign", "c" * 129, "--resume-campaign: 'ccc"),
        ("--from-run", "r" * 129, "--from-run: 'rrr"),
        ("--resume", "r-\udcff", "--resume: 'r-\\udcff' is not a run id"),  # bytes not UTF-8
    ],
)
def test_a_continued_id_empty_or_too_long_is_one_line_exit_2_and_starts_nothing(
    tmp_path: Path, flag: str, value: str, needle: str
) -> None:
    """Found by hostile review: ``--resume ""`` started a new campaign (exit 0), and
    ``--resume-campaign ""`` or an id of 129 characters was an internal error, exit 1."""
    paths = write_toy(tmp_path, {"default": "noop"})
    store = tmp_path / "store"
    args = [*toy_flags(paths, store), "--iterations", "1", flag, value]
    if flag == "--from-run":
        args.append("--rerun-evaluator")
    done = subprocess.run(
        [sys.executable, "-m", "evolane", "optimize", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith(f"evolane: error: {needle}"), done.stderr
    assert not store.exists()


def test_a_record_naming_another_folder_is_damage_and_never_written_there(
    tmp_path: Path,
) -> None:
    """Found by hostile review: every write of a record goes to the folder its id names, so
    a run.json naming another run made ``fsck --repair`` write it there (a new run folder,
    or over that run's record), and a campaign.json naming another campaign made
    ``--resume-campaign`` run a cycle into that campaign's folder."""
    paths = write_toy(tmp_path, {"default": "noop"})
    store = tmp_path / "store"
    flags = [*toy_flags(paths, store), "--iterations", "1", "--max-improvement-cycles", "2"]
    first = subprocess.run(
        [sys.executable, "-m", "evolane", "optimize", *flags],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr
    (run_dir,) = (store / "runs").iterdir()
    (campaign_dir,) = (store / "campaigns").iterdir()
    for path, key, ghost in (
        (run_dir / "run.json", "run_id", "r-ghost"),
        (campaign_dir / "campaign.json", "campaign_id", "c-ghost"),
    ):
        record = json.loads(path.read_text())
        record.pop("summary", None)  # what fsck --repair fills in
        path.write_text(json.dumps({**record, key: ghost}))
    checked = _evolane("fsck", "--repair", "--store", str(store))
    assert checked.returncode == 1, checked.stdout
    for path, what, ghost in ((run_dir, "run", "r-ghost"), (campaign_dir, "campaign", "c-ghost")):
        why = f"its {what}_id '{ghost}' is not its folder's name '{path.name}'"
        assert f"damaged record {path / (what + '.json')}: {why}" in checked.stdout
    resume = ["--resume-campaign", campaign_dir.name]
    resumed = subprocess.run(
        [sys.executable, "-m", "evolane", "optimize", *flags, *resume],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert resumed.returncode == 2, resumed.stderr
    assert "its campaign_id 'c-ghost' is not its folder's name" in resumed.stderr
    assert sorted(p.name for p in (store / "runs").iterdir()) == [run_dir.name]
    assert sorted(p.name for p in (store / "campaigns").iterdir()) == [campaign_dir.name]
