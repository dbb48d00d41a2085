"""A ``--judge`` program gone mid-run, through the real CLI: the host's failure, shared by
every unit, so the measurement stops and the run ends ``failed`` (exit 1), its campaign
``paused`` for a ``--resume-campaign``, as a replay whose program is gone does. Found by
hostile review: each candidate unit was left out, the candidate was ``indecisive``, and the
run ended ``finished`` (exit 0) with its campaign ``complete``, as if the search had found
nothing better than the seed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from evolane.lanes._program import (
    JUDGE_PROGRAM_UNRUNNABLE,
    VERIFICATION_PROGRAM_UNRUNNABLE,
    judge_program_fault,
    verification_program_fault,
)
from tests.campaign_helpers import run_optimize, shared_folder, toy_flags, with_flag, write_toy

JUDGE = """#!/bin/sh
if [ "$(cat "$1/output.json")" = '"yes"' ]; then echo '{"score": 1}'; else echo '{"score": 0}'; fi
"""


def test_a_judge_program_gone_mid_run_fails_the_run_and_decides_nothing(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "fix:3"})
    folder = shared_folder(tmp_path / "judges")
    judge = folder / "judge"
    judge.write_text(JUDGE)
    judge.chmod(0o755)
    # The optimizer runs once the parent is measured: it takes the judge away, then edits.
    toy = f"{sys.executable} -I {paths['script']} {{workdir}} {{prompt_file}} {paths['plan']}"
    optimizer = f"sh -c 'rm -f {judge}; exec \"$@\"' optimizer {toy}"
    flags = with_flag(toy_flags(paths, paths["store"]), "--optimizer", optimizer)
    flags = with_flag(flags, "--judge", f"{judge} {{output_dir}}")
    flags = with_flag(with_flag(flags, "--iterations", "1"), "--population", "1")
    flags += ["--expose-rw", f"optimizer={folder}"]
    done = run_optimize(flags, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert not judge.exists()
    (report_file,) = (paths["store"] / "runs").glob("*/report.json")
    report = json.loads(report_file.read_text())
    assert report["status"] == "failed" and report["campaign_status"] == "paused"
    assert "judge could not start" in done.stdout
    assert all(d["decision"] != "indecisive" for d in report["decisions"]), report["decisions"]


def test_a_judge_program_of_the_tree_that_cannot_run_is_the_trees_fault(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "judge.sh").write_text(JUDGE)  # not executable
    fault = judge_program_fault((str(tree / "judge.sh"), "out"), tree)
    assert fault is not None and fault.code == JUDGE_PROGRAM_UNRUNNABLE
    elsewhere = tmp_path / "judge.sh"
    assert judge_program_fault((str(elsewhere), "out"), tree) is None  # the host's


def test_a_cases_verification_program_missing_fails_the_run_as_a_judges_does(
    tmp_path: Path,
) -> None:
    """A case's ``verification_command`` whose program the host lacks is the host's failure,
    as a ``--judge`` program gone is (found by review: its cases were left out of every
    comparison, silently, and the run ended ``finished``, exit 0)."""
    paths = write_toy(tmp_path, {"default": "fix:3"})
    rows = [json.loads(line) for line in paths["dataset"].read_text().splitlines()]
    for row in rows[2:4]:  # two val cases of twelve
        del row["expected_output"]
        row["verification_command"] = f"{tmp_path / 'no-such-checker'} {{output_dir}}"
    paths["dataset"].write_text("".join(json.dumps(row) + "\n" for row in rows))
    flags = with_flag(toy_flags(paths, paths["store"]), "--iterations", "1")
    done = run_optimize(with_flag(flags, "--population", "1"), tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    (report_file,) = (paths["store"] / "runs").glob("*/report.json")
    report = json.loads(report_file.read_text())
    assert report["status"] == "failed" and report["campaign_status"] == "paused"
    assert "baseline verification command could not start: " in done.stdout
    assert "no-such-checker" in done.stdout


def test_a_verification_program_the_replay_wrote_that_cannot_run_is_the_trees_fault(
    tmp_path: Path,
) -> None:
    output = tmp_path / "out"
    output.mkdir()
    fault = verification_program_fault((str(output / "check.sh"),), output)  # not written
    assert fault is not None and fault.code == VERIFICATION_PROGRAM_UNRUNNABLE
    (output / "check.sh").write_text(JUDGE)  # written, not executable
    assert verification_program_fault((str(output / "check.sh"),), output) is not None
    assert verification_program_fault((str(tmp_path / "check.sh"),), output) is None  # the host's
