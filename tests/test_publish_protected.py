"""Found by review: the gates compare each candidate with its own parent under the globs of
its run, while a publish writes the diff from the target to the best, every cycle's edits
at once. A campaign whose first cycle (no ``--protected``) accepted an edit of
``grader/rubric.txt`` published that edit from a later ``--resume-campaign`` cycle run with
``--protected 'grader/**' --apply auto_verified``. A publish now checks its own diff."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.campaign_helpers import toy_flags, with_flag, write_toy

EVOLANE = [sys.executable, "-m", "evolane"]

# Fixes every failing case of the toy and, once, edits the grader's rubric.
OPTIMIZER = """
import pathlib, sys
workdir = pathlib.Path(sys.argv[1])
failing = [p for p in workdir.iterdir() if p.is_file() and p.read_text().strip() == '"no"']
for case in failing:
    case.write_text('"yes"')
if failing:
    (workdir / "grader" / "rubric.txt").write_text("anything goes\\n")
else:
    (workdir / "notes.txt").write_text("nothing left to fix\\n")
print("fixed every case")
"""


def _run(flags: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EVOLANE, "optimize", *flags], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_a_publish_never_writes_a_path_its_run_protects(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {}, val=12, test=10, passing=2)  # confirmed at alpha / 2
    script = tmp_path / "edit.py"
    script.write_text(OPTIMIZER)
    flags = toy_flags(paths, paths["store"])
    flags = with_flag(flags, "--optimizer", f"{sys.executable} -I {script} {{workdir}}")
    flags = with_flag(with_flag(flags, "--iterations", "1"), "--population", "1")
    flags = with_flag(flags, "--max-improvement-cycles", "2")
    at = flags.index("--protected")
    unprotected = flags[:at] + flags[at + 2 :]
    first = _run(unprotected, tmp_path)  # cycle 0 accepts the fix and the rubric's edit
    assert first.returncode == 0, first.stderr
    (campaign,) = (p.name for p in (paths["store"] / "campaigns").iterdir())
    rubric = (paths["target"] / "grader" / "rubric.txt").read_bytes()
    second = _run([*flags, "--resume-campaign", campaign, "--apply", "auto_verified"], tmp_path)
    assert second.returncode == 0, second.stderr
    assert (paths["target"] / "grader" / "rubric.txt").read_bytes() == rubric
    reports = [json.loads(p.read_text()) for p in paths["store"].glob("runs/*/report.json")]
    (applied,) = [r["apply"] for r in reports if r["apply"]["policy"] == "auto_verified"]
    assert applied["status"] == "refused", applied
    assert "'grader/rubric.txt'" in applied["message"]
