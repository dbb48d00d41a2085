"""Found by review: a judge that runs a program of the target (``python3 {candidate}/judge.py``)
was the candidate's to edit. An optimizer that rewrote ``judge.py`` to print a score of 1
and changed nothing else was accepted, confirmed on the test split and published. The file
the judge (or the validator) runs as its program is now protected whatever ``--protected``
says: such an edit is a tampering candidate (``protected_paths``), never scored."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from evolane.inputs import JUDGE_PLACEHOLDERS, CommandTemplate, tree_program
from tests.campaign_helpers import run_optimize, toy_config, toy_flags, with_flag, write_toy

JUDGE = """
import json, sys
case = json.load(open(sys.argv[1]))
answer = json.load(open(sys.argv[2] + "/output.json"))
print(json.dumps({"score": float(answer == case["expected_output"])}))
"""

# Fixes nothing: it only makes the target's judge give every answer full marks.
OPTIMIZER = """
import pathlib, sys
(pathlib.Path(sys.argv[1]) / "judge.py").write_text('print(\\'{"score": 1.0}\\')\\n')
print("a generous judge")
"""


def test_an_edit_of_the_judges_own_program_is_never_accepted(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {}, val=12, test=6, passing=4)
    (paths["target"] / "judge.py").write_text(JUDGE)
    script = tmp_path / "edit.py"
    script.write_text(OPTIMIZER)
    flags = toy_flags(paths, paths["store"])
    at = flags.index("--protected")
    flags = flags[:at] + flags[at + 2 :]  # nothing protected by the user
    flags = with_flag(flags, "--optimizer", f"{sys.executable} -I {script} {{workdir}}")
    flags = with_flag(with_flag(flags, "--iterations", "1"), "--population", "1")
    flags = with_flag(flags, "--gate", "paired")
    judge = f"{sys.executable} {{candidate}}/judge.py {{case_file}} {{output_dir}}"
    flags += ["--judge", judge, "--isolation", "process"]
    done = run_optimize(flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (report_file,) = paths["store"].glob("runs/*/report.json")
    report = json.loads(report_file.read_text())
    assert report["selected"] is None, report["selected"]
    assert "'judge.py'" in json.dumps(report)


def test_the_program_a_template_runs_from_the_tree_is_found() -> None:
    def program(text: str) -> str | None:
        template = CommandTemplate.parse(text, role="judge", allowed=JUDGE_PLACEHOLDERS)
        return tree_program(template)

    assert program("/usr/bin/python3 -u {candidate}/./grading/judge.py {case_file}") == (
        "grading/judge.py"
    )
    assert program("{candidate}/run.sh {output_dir}") == "run.sh"
    assert program("bash -e {candidate}/g[1]*.sh") == "g[[]1][*].sh"  # a literal path
    # the program lies elsewhere, runs inline code, or climbs out of the tree: nothing
    assert program("python3 /opt/judge.py {candidate}/SKILL.md") is None
    assert program("sh -c 'python3 {candidate}/judge.py'") is None
    assert program("python3 -m grader {candidate}/x.py") is None
    assert program("{candidate}/../judge.py") is None


def test_the_validators_and_the_checks_programs_are_protected_too(tmp_path: Path) -> None:
    # A publish check (``--check``) that runs a script of the target checked the candidate's
    # own copy of it: a candidate could rewrite it to pass (found by review).
    config = toy_config(
        write_toy(tmp_path, {}),
        judge="python3 /opt/judge.py {case_file} {output_dir}",  # not the tree's: nothing
        validator="sh {candidate}/tools/validate.sh {candidate}",
        check="{candidate}/tests/check.sh",
    )
    assert config.guarded == ("grader/**", "tools/validate.sh", "tests/check.sh")
