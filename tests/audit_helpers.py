"""A toy project whose candidates have a known true effect, run through the real
`evolane optimize`, for the decision audit (tests/audit_oracle.py reads back its runs).

The toy: the target holds ``shift.txt`` (a number, then the slot that wrote it). Case
``vNN`` passes with probability ``base(case) + shift`` (``base`` in 0.2-0.8, drawn from the
case id), so a candidate's true effect over its parent is the difference of their shifts;
each replay's draw is a digest of the tree's text, the case and ``EVOLANE_SEED``
(deterministic: a rerun with the same seed scores the same). The optimizer writes the
shift its plan gives ``{cycle}.{iteration}.{slot}`` (else ``default``); a shift written
``0.3/0.2`` also breaks a fifth of the cases (they never pass). An optional judge command
fails on some outputs every time (an infrastructure failure a retry does not mend) and on
others once in a while (one a retry mends): a draw from the audit seed and the judge call's
folder (its unit's opaque name and attempt). The commands are given inline (``python3 -c``),
so no path is in them and the run's fingerprint, which keys each unit's name and the drawn
repetitions of the arm with fewer, is the same wherever the toy is written: one audit seed
replays one run (``EVOLANE_AUDIT_SEED``, see `audit_seed`).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
"""The toy commands' interpreter: a system one, which a confined command can run."""


def draw(*parts: str) -> float:
    """A uniform number in [0, 1) drawn from ``parts`` (the same parts, the same number)."""
    digest = hashlib.sha256("|".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def pass_chance(case: str, shift: float, mixture: str) -> float:
    """The chance that ``case`` passes for a tree of this ``shift``: the case's own chance
    (``flaky``: uniform in 0.2-0.8; ``readme``: benchmarks/decisions.py's mixture, 35% solid
    at 0.97, 35% hard at 0.03, 30% flaky) raised by ``shift`` (``readme``: by 2 shift (1 - p),
    so the mean gain over that mixture is ``shift``)."""
    if mixture == "flaky":
        return min(1.0, 0.2 + 0.6 * draw("base", case) + shift)
    kind, p = draw("kind", case), 0.2 + 0.6 * draw("base", case)
    p = 0.97 if kind < 0.35 else 0.03 if kind < 0.7 else p
    return min(1.0, max(0.0, p + 2 * shift * (1 - p)))


REPLAY = (
    "import hashlib, json, os, sys, pathlib\n"
    + inspect.getsource(draw)
    + inspect.getsource(pass_chance)
    + """
candidate, output, mode, crash, log, mixture = sys.argv[1:7]
text = pathlib.Path(candidate, "shift.txt").read_text()
case, seed = os.environ["EVOLANE_CASE_ID"], os.environ["EVOLANE_SEED"]
shift, _, breaks = text.split()[0].partition("/")
chance = pass_chance(case, float(shift), mixture)
if draw("breaks", case) < float(breaks or 0):
    chance = 0.0  # a case this tree breaks
if draw("crash", text, case, seed) < float(crash):
    sys.exit(3)  # the tree broke its replay: the case scores 0
u = draw("draw", text, case, seed)
if mode == "graded":
    score = min(1.0, max(0.0, round(4 * (chance + u - 0.5)) / 4))
else:
    score = 1.0 if u < chance else 0.0
answer = {"case": case, "score": score} if mode != "exact" else ("yes" if score else "no")
pathlib.Path(output, "output.json").write_text(json.dumps(answer))
if log != "-":
    with open(log, "a") as out:
        out.write(os.environ["EVOLANE_UNIT"] + "\\n")
"""
)

JUDGE = (
    "import hashlib, json, os, sys, pathlib\n"
    + inspect.getsource(draw)
    + """
output, hard, flaky, seed = sys.argv[1:5]
text = pathlib.Path(output, "output.json").read_text()
if draw("judge", text) < float(hard):
    sys.exit(5)  # fails on this output whatever the retry
call = pathlib.Path(output).parent.name  # the unit's opaque name and this attempt's number
if draw("flaky", seed, call) < float(flaky):
    sys.exit(6)  # a transient failure a retry mends
print(json.dumps({"score": json.loads(text)["score"]}))
"""
)

OPTIMIZER = """
import json, sys, pathlib
workdir, prompt_file, plan_file = sys.argv[1:4]
prompt, plan = json.load(open(prompt_file)), json.load(open(plan_file))
key = f"{prompt['cycle']}.{prompt['iteration']}.{prompt['slot']}"
shift = plan.get(key, plan.get("default", 0.0))
pathlib.Path(workdir, "shift.txt").write_text(f"{shift}\\n{key}\\n")
print(f"shift {shift}")
"""


@dataclass(frozen=True)
class Toy:
    """Knobs of one toy project (see the module docstring)."""

    cases: int = 16
    cluster_size: int = 1
    test_cases: int = 0
    graded: bool = False
    """Scores in quarters (needs ``judge``); else pass/fail."""
    replay_crash: float = 0.0
    judge: bool = False
    judge_hard: float = 0.0
    judge_flaky: float = 0.0
    mixture: str = "flaky"
    """How the cases' own pass chances are spread (see `pass_chance`)."""
    plan: dict[str, float | str] = field(default_factory=lambda: {"default": 0.0})


JUDGE_FAILURES = (
    Toy(cases=24, cluster_size=2, judge=True, judge_hard=0.1, judge_flaky=0.3,
        replay_crash=0.05, plan={"default": -0.2, "0.0.1": 0.5}),
    ["--seed", "23", "--candidate-replay-repetitions", "2", "--baseline-replay-repetitions",
     "1", "--iterations", "1"],
)  # fmt: skip
"""The slow audit's campaign of clusters and judge failures: a candidate worse by 0.2 and one
better by +0.5. Its power is low: the judge fails every time on the failing output of 4 of
its 24 cases (there the baseline is left out when it fails and kept when it passes, so the
candidate can only lose) and on the passing one of 1, replays break on 5% of the units, the
baseline has one repetition a case. With a null and a +0.35 candidate at ``--seed 4`` the
README's decisions rejected the better one on ~40% of audit seeds (at ``--seed 10``, +0.5,
they accepted the null on ~60%); on ``--seed 23`` they decided both as meant on every audit
seed tried (`benchmarks/decision_audit.py seeds`)."""


def audit_seed() -> str:
    """The seed of the toy judge's transient failures: ``EVOLANE_AUDIT_SEED`` when set (to
    replay a run), else a fresh one; a test names it in what it reports."""
    return os.environ.get("EVOLANE_AUDIT_SEED") or os.urandom(4).hex()


def inline(code: str) -> str:
    """``code`` as one word of a command template: ``python3 -I -c`` runs it."""
    return shlex.quote(code.replace("{", "{{").replace("}", "}}"))


def write_project(root: Path, toy: Toy, log: Path | None = None, seed: str = "0") -> list[str]:
    """Write the toy under ``root`` and return the ``evolane optimize`` flags that run it
    (``log`` gets one line per finished replay: its ``EVOLANE_UNIT``; ``seed`` draws the
    judge's transient failures)."""
    (root / "target").mkdir(parents=True)
    (root / "target" / "shift.txt").write_text("0.0\nseed\n")
    rows = [
        {"id": f"t{i}", "input": {"t": i}, "expected_output": "yes", "split": "train"}
        for i in (0, 1)
    ]
    for i in range(toy.cases):
        row: dict[str, Any] = {"id": f"v{i:02d}", "input": {"v": i}, "expected_output": "yes"}
        if toy.cluster_size > 1:
            row["metadata"] = {"cluster": f"k{i // toy.cluster_size}"}
        rows.append({**row, "split": "val"})
    rows += [
        {"id": f"x{i:02d}", "input": {"x": i}, "expected_output": "yes", "split": "test"}
        for i in range(toy.test_cases)
    ]
    (root / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (root / "opt.py").write_text(OPTIMIZER)
    (root / "plan.json").write_text(json.dumps(toy.plan))
    crash, mode = (
        f"{toy.replay_crash}",
        "graded" if toy.graded else "binary" if toy.judge else "exact",
    )
    words = f"{mode} {crash} {log or '-'} {toy.mixture}"
    replay = f"{PYTHON} -I -c {inline(REPLAY)} {{candidate}} {{output_dir}} {words}"
    flags = [
        "--target", str(root / "target"), "--dataset", str(root / "data.jsonl"),
        "--replay", replay, "--progress", "none", "--kill-grace", "0.3",
        "--optimizer", f"{PYTHON} -I {root}/opt.py {{workdir}} {{prompt_file}} {root}/plan.json",
    ]  # fmt: skip
    if toy.judge:
        words = f"{toy.judge_hard} {toy.judge_flaky} {seed}"
        flags += ["--judge", f"{PYTHON} -I -c {inline(JUDGE)} {{output_dir}} {words}"]
    if log is not None:
        flags += ["--expose-rw", str(log.parent)]
    return flags


def optimize(flags: list[str]) -> subprocess.CompletedProcess[str]:
    """``evolane optimize`` in a subprocess, to its end (a guard against a hang only)."""
    command = [sys.executable, "-m", "evolane", "optimize", *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)


def journal_records(store: Path) -> list[dict[str, Any]]:
    """The records of the store's run journal (a torn last line left out)."""
    lines = [
        line
        for path in (store / "runs").glob("*/journal.jsonl")
        for line in path.read_text().splitlines()
        if line.endswith("}")
    ]
    return [json.loads(line) for line in lines]


def journaled_units(store: Path) -> list[dict[str, Any]]:
    """The unit records of the store's run journal (a torn last line left out)."""
    return [record for record in journal_records(store) if record["type"] == "unit"]


def kill_and_resume(flags: list[str], store: Path, kill_after: int) -> list[dict[str, Any]]:
    """Run ``evolane optimize`` with ``flags`` (its store ``store``), SIGKILL it once
    ``kill_after`` units are journaled, then ``--resume`` it to its end; return the units
    journaled at the kill."""
    command = [sys.executable, "-m", "evolane", "optimize", *flags]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300  # a guard against a hang, not a timing figure
    while len(journaled_units(store)) < kill_after:
        assert process.poll() is None, "the run ended before the kill point"
        assert time.monotonic() < deadline, "the run never reached the kill point"
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    before = journaled_units(store)
    (run,) = (store / "runs").iterdir()
    resumed = optimize(["--resume", run.name, "--store", str(store), "--progress", "none"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    return before
