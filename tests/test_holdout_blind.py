"""What a command is given tells it neither the split of its case, nor the arm and
measurement of its unit, nor how many commands ran before it. Found by review (hostile
commands run through ``evolane optimize``):

- a replay's ``{case_file}`` held ``"split": "val"`` or ``"test"``: a tree could answer
  well only where the gate or the confirmation looks;
- a judge's folder (its working directory, ``{case_file}``, ``{output_dir}``,
  ``EVOLANE_USAGE_FILE``) was named by the unit id (``c1.i0.base.3.0.b-judge.1``): a judge
  that runs the candidate's code or the replay's answer (``pytest {candidate}``, a
  verification command running the output) handed it the arm, so a tree could fail as its
  own baseline, as replays could before their names were made opaque;
- every command's ``HOME`` and ``EVOLANE_LEASE`` counted the commands the run had started
  (``optimizer-153-4fa08b``): an optimizer that kept its count in its edit (a rejected edit
  comes back as its diff) learnt how many val units the last candidates took, the early
  stop's verdict in part, which honest splits withhold.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from evolane.store import read_journal
from tests.campaign_helpers import run_optimize, shared_folder

SPY = textwrap.dedent(
    """
    import json, os, sys, tempfile, time
    def spy(role, **seen):
        seen.update(role=role, cwd=os.getcwd(), argv=sys.argv[1:], at=time.time(),
                    env={k: v for k, v in os.environ.items() if k.startswith(("EVOLANE", "HOME"))})
        handle, _ = tempfile.mkstemp(dir=LOG, prefix=role + ".", suffix=".json")
        os.write(handle, json.dumps(seen).encode())
        os.close(handle)
    """
)

AGENT = """import json, os, sys
from spy import spy
case_file, out = sys.argv[1:3]
text = open(case_file).read()
spy("replay", case=text, known=KNOWN)
n = json.loads(text)["input"]["n"]
ans = n * 2 if n % 3 != KNOWN else -1
json.dump(ans, open(os.path.join(out, "output.json"), "w"))
"""

JUDGE = """import json, os, sys
from spy import spy
spy("judge")
case = json.load(open(sys.argv[1]))
answer = json.load(open(os.path.join(sys.argv[2], "output.json")))
print(json.dumps({"score": 1.0 if answer == case["expected_output"] else 0.0}))
"""

OPTIMIZER = """import sys
from spy import spy
spy("optimizer")
src = open("agent.py").read()
open("agent.py", "w").write(src.replace("KNOWN = 2", "KNOWN = 9") + "# edit\\n")
"""


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, object]]]:
    """One campaign (train 8, val 12, test 8; two iterations), what each command saw."""
    return _spied(tmp_path_factory.mktemp("holdout"), "--iterations", "2")


def _spied(root: Path, *flags: str) -> tuple[Path, list[dict[str, object]]]:
    """A campaign run with ``flags`` by spying commands, and what each of them saw."""
    log, tools = shared_folder(root / "log"), root / "tools"
    tools.mkdir()
    (tools / "spy.py").write_text(f"LOG = {str(log)!r}\n{SPY}")
    reach = f"import sys\nsys.path.insert(0, {str(tools)!r})\n"  # python -I: no script folder
    (tools / "judge.py").write_text(reach + JUDGE)
    (tools / "opt.py").write_text(reach + OPTIMIZER)
    (root / "agent").mkdir()
    (root / "agent" / "agent.py").write_text(f"{reach}KNOWN = 2\n{AGENT}")
    rows = []
    for n in range(28):  # k00-k07 train, k08-k19 val, k20-k27 test
        split = "train" if n < 8 else "val" if n < 20 else "test"
        row = {"id": f"k{n:02d}", "input": {"n": n}, "expected_output": 2 * n, "split": split}
        rows.append(row)
    (root / "cases.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    python = f"{sys.executable} -I"
    done = run_optimize([
        "--target", str(root / "agent"), "--dataset", str(root / "cases.jsonl"),
        "--store", str(root / "store"), *flags, "--population", "1",
        "--progress", "none", "--expose", str(tools), "--expose-rw", str(log),
        "--replay", f"{python} {{candidate}}/agent.py {{case_file}} {{output_dir}}",
        "--judge", f"{python} {tools / 'judge.py'} {{case_file}} {{output_dir}}",
        "--optimizer", f"{python} {tools / 'opt.py'}",
    ])  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    seen = [json.loads(path.read_text()) for path in sorted(log.glob("*.json"))]
    return root, seen


def _of(seen: list[dict[str, object]], role: str) -> list[dict[str, object]]:
    views = [view for view in seen if view["role"] == role]
    assert views, f"no {role} ran"
    return views


def test_a_replay_is_not_told_the_split_of_its_case(campaign: tuple[Path, list]) -> None:
    _, seen = campaign
    cases = [json.loads(str(view["case"])) for view in _of(seen, "replay")]
    assert {case["id"] for case in cases} >= {"k00", "k08", "k20"}  # train, val, test
    for case in cases:
        assert set(case) <= {"id", "input", "metadata"}, case


def test_a_judge_is_not_told_the_arm_measurement_or_split_of_its_unit(
    campaign: tuple[Path, list],
) -> None:
    root, seen = campaign
    units = {
        str(record["unit"])
        for journal in (root / "store" / "runs").glob("*/journal.jsonl")
        for record in read_journal(journal).records
        if "unit" in record
    }
    assert any(unit.endswith(".b") for unit in units) and any(u.endswith(".c") for u in units)
    views = _of(seen, "judge")
    assert {view["env"]["EVOLANE_CASE_ID"] for view in views} >= {"k00", "k08", "k20"}
    for view in views:
        text = json.dumps(view)
        assert not [unit for unit in units if unit in text], view


def test_no_command_is_told_how_many_commands_ran_before_it(campaign: tuple[Path, list]) -> None:
    _, seen = campaign
    assert len(_of(seen, "optimizer")) == 2
    for view in seen:
        env = view["env"]
        for name in (Path(env["HOME"]).parent.name, env["EVOLANE_LEASE"].rsplit("/", 1)[-1]):
            label, *rest = name.split("-")
            assert label == view["role"], name
            counts = [part for part in rest if part.isdecimal() and len(part) < 20]
            assert not counts, name  # the random part is 20 hex digits


def test_a_replay_told_its_repetition_is_not_told_its_arm(tmp_path: Path) -> None:
    # Found by review: with fewer baseline than candidate repetitions, a replay told
    # repetition 1 (EVOLANE_REPETITION, and the seed made from it) was a candidate's: a tree
    # could answer well only as a candidate and fail as its own baseline. The arm with fewer
    # repetitions is told numbers drawn from the other's, per case, by the run's secret.
    flags = ("--iterations", "1", "--baseline-replay-repetitions", "1")
    _, seen = _spied(tmp_path, *flags, "--candidate-replay-repetitions", "2")
    told: dict[tuple[object, str], list[str]] = {}
    for view in sorted(_of(seen, "replay"), key=lambda view: float(view["at"])):
        case = json.loads(str(view["case"]))["id"]
        if case <= "k19":  # train and val: the seed tree the baseline alone
            told.setdefault((view["known"], case), []).append(view["env"]["EVOLANE_REPETITION"])
    # The seed's first replay of each case is its measurement alone (1 repetition, told as
    # the gate's baseline is, and reused by it); a later measurement may replay the other.
    seed = {case: reps for (known, case), reps in told.items() if known == 2}
    assert len(seed) == 20, seed  # (all told 0 or all 1 by chance: 2 in 2**20)
    assert {reps[0] for reps in seed.values()} == {"0", "1"}, seed  # as a candidate's are
    candidate = {rep for (known, _), reps in told.items() if known == 9 for rep in reps}
    assert candidate == {"0", "1"}, told
