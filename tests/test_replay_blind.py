"""A replay is blind to its arm: nothing it is given (``EVOLANE_UNIT``, its folders, its
``HOME``) names the arm, the measurement or the split, so a tree cannot fail its own
baseline. Found by review: ``EVOLANE_UNIT`` was the unit id (``c1.i0.base.3.0.b``); a tree
that really was better but answered garbage whenever it ended in ``.b`` was published in
one cycle, and in the next it sandbagged as the baseline, so a tree worse than the seed was
accepted, confirmed against it and published."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from evolane.measure import replay_names
from evolane.store import read_journal
from tests.campaign_helpers import run_optimize, shared_folder

AGENT = """import json, os, sys
case_file, out, log = sys.argv[1:4]
seen = {"unit": os.environ.get("EVOLANE_UNIT", ""), "home": os.environ.get("HOME", ""),
        "cwd": os.getcwd(), "case_file": case_file, "out": out}
with open(log, "a") as f:
    f.write(json.dumps(seen) + "\\n")
n = json.load(open(case_file))["input"]["n"]
def knows(n):
    return n % 3 == 0
ans = n * 2 if knows(n) else -1
json.dump(ans, open(os.path.join(out, "output.json"), "w"))
"""

# Cycle 1: a tree really better (+1/3) that answers garbage when its unit looks like a
# baseline's; cycle 2: a tree worse than the seed (1/6 right against 1/3).
OPTIMIZER = """import json, sys
plan = json.load(open(sys.argv[1]))
src = open("agent.py").read()
if "SANDBAG" not in src:
    src = src.replace("return n % 3 == 0", "return n % 3 != 2")
    src = src.replace("ans = n * 2 if", "ans = -7 if seen['unit'].endswith('.b') else n * 2 if")
    src += "# SANDBAG\\n"
else:
    src = src.replace("return n % 3 != 2", "return n % 6 == 0")
    src += f"# WORSE c{plan['cycle']} i{plan['iteration']} s{plan['slot']}\\n"
open("agent.py", "w").write(src)
"""


def _project(root: Path) -> tuple[list[str], Path]:
    """The flags of a campaign of two cycles on 120 cases (60 val, 48 test), and its log."""
    (root / "agent").mkdir(parents=True)
    (root / "agent" / "agent.py").write_text(AGENT)
    rows = []
    for n in range(120):
        split = "val" if n < 60 else "test" if n < 108 else "train"
        rows.append(
            {"id": f"c{n:03d}", "input": {"n": n}, "expected_output": n * 2, "split": split}
        )
    (root / "dataset.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (root / "opt.py").write_text(OPTIMIZER)
    logs = shared_folder(root / "logs")  # a root evolane's replays run as unit uids
    log = logs / "seen.jsonl"
    log.touch()
    log.chmod(0o666)
    python = sys.executable
    flags = [
        "--target", str(root / "agent"), "--dataset", str(root / "dataset.jsonl"),
        "--store", str(root / "store"), "--iterations", "2", "--population", "1",
        "--max-improvement-cycles", "2", "--apply", "auto_verified", "--progress", "none",
        "--replay", f"{python} {{candidate}}/agent.py {{case_file}} {{output_dir}} {log}",
        "--optimizer", f"{python} {root / 'opt.py'} {{prompt_file}}",
        "--expose-rw", str(logs),
    ]  # fmt: skip
    return flags, log


def test_a_tree_cannot_sandbag_its_own_baseline(tmp_path: Path) -> None:
    flags, log = _project(tmp_path)
    first = run_optimize(flags)
    assert first.returncode == 0, first.stderr
    assert "SANDBAG" in (tmp_path / "agent" / "agent.py").read_text()  # better: published
    campaign = next(w for w in first.stdout.split() if w.startswith("c-"))
    second = run_optimize([*flags, "--resume-campaign", campaign.rstrip(".,;:)")])
    assert second.returncode == 0, second.stderr
    assert "WORSE" not in (tmp_path / "agent" / "agent.py").read_text(), second.stdout

    # What each replay was given names no arm, measurement or split.
    records = [
        record
        for journal in (tmp_path / "store" / "runs").glob("*/journal.jsonl")
        for record in read_journal(journal).records
    ]
    units = {str(r["unit"]) for r in records if "unit" in r}
    names = replay_names(records)
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert seen and {view["unit"] for view in seen} <= set(names)
    arms = {record["replay"]["arm"] for record in records if record.get("replay")}
    assert arms == {"baseline", "candidate"}
    for view in seen:
        for text in view.values():
            assert not any(unit in text for unit in units), view
            for word in ("baseline", "candidate", ".b.", ".c.", "final", "test", "base"):
                assert word not in text.replace(str(tmp_path), ""), (word, view)
