"""A run or campaign id from the user is one path component of the id alphabet (hostile
review #4): ``--resume ../../../x`` never reads a run outside the store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from evolane.campaign._runs import StoreLayout, check_id
from evolane.inputs import InputError


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
