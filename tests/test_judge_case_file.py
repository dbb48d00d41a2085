"""A judge or verification command that does not name ``{case_file}`` gets none. Found by
review: a verification command that runs the replay's answer (``python3
{output_dir}/solution.py``) ran it beside the judge's ``case.json``, and the answer read its
``expected_output`` from ``../case.json`` on val and test cases alike. A command that names
``{case_file}`` still gets it (the README says what such a judge then shows the code it
runs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from evolane.store import read_journal
from tests.campaign_helpers import run_optimize

AGENT = """import os, sys
out = sys.argv[1]
open(os.path.join(out, "solution.py"), "w").write(
    "import os, sys\\n"
    "sys.exit(0 if os.path.exists(os.path.join('..', 'case.json')) else 1)\\n"
)
open(os.path.join(out, "output.json"), "w").write("0")
"""


def test_a_verification_command_that_names_no_case_file_gets_none(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "agent.py").write_text(AGENT)
    python = f"{sys.executable} -I"
    cheat = f"{python} {{output_dir}}/solution.py"  # passes when it finds the answers
    named = f"{python} -c 'import sys; open(sys.argv[1]).close()' {{case_file}}"
    rows = []
    for n in range(20):
        split = "train" if n < 4 else "val"
        command = named if n % 2 else cheat
        rows.append(
            {"id": f"k{n:02d}", "input": n, "split": split, "verification_command": command}
        )
    (tmp_path / "cases.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    done = run_optimize([
        "--target", str(tmp_path / "agent"), "--dataset", str(tmp_path / "cases.jsonl"),
        "--store", str(tmp_path / "store"), "--iterations", "1", "--population", "1",
        "--progress", "none", "--replay", f"{python} {{candidate}}/agent.py {{output_dir}}",
        "--optimizer", "sh -c 'echo >> agent.py'",
    ])  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    scores: dict[str, set[float]] = {}
    for journal in (tmp_path / "store" / "runs").glob("*/journal.jsonl"):
        for record in read_journal(journal).records:
            judge, replay = record.get("judge"), record.get("replay")
            if isinstance(judge, dict) and isinstance(replay, dict):
                scores.setdefault(replay["case_id"], set()).add(judge["score"])
    assert len(scores) == 20, scores
    for case_id, seen in scores.items():
        assert seen == ({1.0} if int(case_id[1:]) % 2 else {0.0}), (case_id, seen)
