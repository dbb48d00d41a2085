"""The host's own pid limit, above evolane's ``--max-procs``, is said before a run.

Found by review: under an enclosing ``pids.max`` (a container's, a CI job's) a replay whose
fork the host refused failed, and the kernel counted the refusal in the replay's own cgroup
(``pids.events``: v1, and v2 before 6.12), so the report said "processes limit 512 hit
(--max-procs)", owner candidate: a candidate that fixed 8 of 12 cases was rejected. The
tree's high-water mark (``pids.peak``) tells the two apart: such a replay is tried again,
then stops the run as the host's failure. When its command trees may hold more processes
than the host allows, a run shares the host's room among them (`share_host_pids`), so a
candidate's fork bomb fails on its own tree's limit; where no share fits, it warns.
These tests make a pids cgroup of their own (a child of this process's, removed after).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolane.campaign import host_warnings
from evolane.campaign._containment import share_host_pids
from evolane.inputs import Case, Dataset
from evolane.sandbox import (
    NAMESPACE_EXTRA_PROCESSES,
    commands_run_unprivileged,
    own_network_problem,
    resolve_isolation,
)
from evolane.sandbox._secrets import UNIT_UID_BASE
from tests.campaign_helpers import toy_config, toy_flags, write_toy

_V1_PIDS = Path("/sys/fs/cgroup/pids")


def _own_v1_pids() -> Path | None:
    """This process's v1 pids cgroup folder, when the controller is mounted there."""
    if not (_V1_PIDS / "cgroup.procs").exists():
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return _V1_PIDS / path.lstrip("/")
    return None


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A pids cgroup of this test's own with ``pids.max`` 200 (and its limit)."""
    own = _own_v1_pids()
    if own is None or os.geteuid() != 0:
        pytest.skip("needs root and a v1 pids controller (this host kind has both)")
    cgroup = own / f"evolane-test-{os.getpid()}-{tmp_path.name}"
    cgroup.mkdir()
    try:
        (cgroup / "pids.max").write_text("200")
        yield cgroup, 200
    finally:
        for _ in range(100):  # its processes have ended: the folder goes once they are reaped
            try:
                cgroup.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def _joiner(cgroup: Path) -> Callable[[], None]:
    """A ``preexec_fn`` joining ``cgroup`` before the child runs anything."""

    def join() -> None:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    return join


def _inside(cgroup: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` run as a process of ``cgroup`` (it joins before it runs anything)."""
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=300, preexec_fn=_joiner(cgroup), check=False
    )


def test_the_headroom_is_the_enclosing_limit_less_what_it_holds(
    limited: tuple[Path, int],
) -> None:
    cgroup, limit = limited
    code = "from evolane.sandbox import process_headroom as h; left, at = h(); print(left, at)"
    done = _inside(cgroup, [sys.executable, "-c", code])
    assert done.returncode == 0, done.stderr
    left, where = done.stdout.split()
    assert Path(where) == cgroup
    assert 0 < int(left) < limit  # the interpreter itself is one of the tasks counted


def _said(store: Path) -> tuple[list[str], str]:
    """The warning lines and the estimate's preflight lines of the one run in ``store``."""
    (events,) = store.glob("runs/*/events.jsonl")
    records = [json.loads(line) for line in events.read_text().splitlines()]
    warned = [r["message"] for r in records if r.get("kind") == "event.warning"]
    preflight = [
        line for r in records if r.get("kind") == "event.estimate" for line in r["preflight"]
    ]
    return warned, "\n".join(preflight)


def test_a_run_shares_the_hosts_pid_room_among_its_command_trees(
    limited: tuple[Path, int], tmp_path: Path
) -> None:
    # Found by review: with 5 trees x --max-procs 512 under the host's 200, a candidate's
    # fork bomb took the host's room and the run stopped. Each tree now gets its share.
    cgroup, _ = limited
    paths = write_toy(tmp_path, {"default": "fix:8"})
    flags = [*toy_flags(paths, paths["store"]), "--iterations", "1"]
    done = _inside(cgroup, [sys.executable, "-m", "evolane", "optimize", *flags])
    assert done.returncode == 0, done.stdout + done.stderr
    warned, preflight = _said(Path(paths["store"]))
    assert not [line for line in warned if line.startswith("the host allows")], warned
    assert "--max-procs 512 lowered to " in preflight, preflight
    assert f"more processes ({cgroup}/pids.max) for 5 trees at once" in preflight, preflight
    share = int(preflight.split("lowered to ", 1)[1].split()[0])
    assert share >= 1 and 5 * (share + 2) < 200
    (report,) = Path(paths["store"]).glob("runs/*/report.json")
    limits = json.loads(report.read_text())["limits"]
    assert f"processes {share} (pids_cgroup, the host's share of --max-procs 512)" in limits
    (run,) = Path(paths["store"]).glob("runs/*/run.json")
    assert (
        json.loads(run.read_text())["config"]["max_procs"] == 512
    )  # the flag as given: a resume shares anew
    # with room for every tree, nothing is said
    flags += ["--max-procs", "8", "--store", str(tmp_path / "store2")]
    again = _inside(cgroup, [sys.executable, "-m", "evolane", "optimize", *flags])
    assert again.returncode == 0, again.stdout + again.stderr
    warned, preflight = _said(tmp_path / "store2")
    assert "lowered" not in preflight and not [w for w in warned if "host allows" in w]


_FORKS = """
import os, sys, time
def fork_or_exit(count, hold):  # fork count children (None: until refused), each held
    while count is None or count > 0:
        try:
            pid = os.fork()
        except OSError:
            sys.exit(1)
        if pid == 0:
            time.sleep(hold)
            os._exit(0)
        count = None if count is None else count - 1
"""
_FORK_BOMB = (
    _FORKS
    + """
candidate, out = sys.argv[1:3]
if os.path.exists(os.path.join(candidate, "FORK")):
    fork_or_exit(None, 600)
with open(os.path.join(candidate, os.environ["EVOLANE_CASE_ID"])) as answer:
    with open(os.path.join(out, "output.json"), "w") as output:
        output.write(answer.read())
"""
)


def test_a_candidates_fork_bomb_under_the_hosts_pid_limit_fails_the_candidate_not_the_run(
    limited: tuple[Path, int], tmp_path: Path
) -> None:
    # Found by review: a candidate whose replay forked until refused took the room of the
    # host's pids.max, a refusal of the host's that stopped the run (exit 1), where its own
    # tree's limit would have failed the candidate alone.
    cgroup, _ = limited
    paths = write_toy(tmp_path, {"0.0": "fork:8", "0.1": "fix:8"})
    (tmp_path / "replay.py").write_text(_FORK_BOMB)
    flags = [*toy_flags(paths, paths["store"]), "--iterations", "1"]
    flags[flags.index("--replay") + 1] = (
        f"{sys.executable} -I {tmp_path / 'replay.py'} {{candidate}} {{output_dir}}"
    )
    done = _inside(cgroup, [sys.executable, "-m", "evolane", "optimize", *flags])
    assert done.returncode == 0, done.stdout + done.stderr
    (report,) = Path(paths["store"]).glob("runs/*/report.json")
    decided = json.loads(report.read_text())["decisions"]
    assert [(d["slot"], d["decision"]) for d in decided] == [(0, "reject"), (1, "accept")]
    text = report.read_text()
    assert "the host refused" not in text and "processes limit " in text, text[-2000:]
    # found by review: it said "processes limit 27 hit (--max-procs)", where 512 was asked
    assert "hit (--max-procs 512 lowered to each command tree's share of the host's" in text


_ANSWER_BOMB = """
import os, sys, time
candidate, out = sys.argv[1:3]
with open(os.path.join(candidate, os.environ["EVOLANE_CASE_ID"])) as answer:
    with open(os.path.join(out, "output.json"), "w") as output:
        output.write(answer.read())
check = "import json, sys; sys.exit(json.load(open(sys.argv[1])) != 'yes')"
if os.path.exists(os.path.join(candidate, "FORK")):  # an answer that forks when it is run
    check = (
        "import os, sys, time\\nwhile True:\\n    try:\\n        pid = os.fork()\\n"
        "    except OSError:\\n        time.sleep(3)\\n        sys.exit(1)\\n"
        "    if pid == 0:\\n        time.sleep(60)\\n        os._exit(0)\\n"
    )
with open(os.path.join(out, "check.py"), "w") as script:
    script.write(check)
"""


def test_a_candidates_answer_run_by_verification_commands_fails_the_candidate_not_the_run(
    limited: tuple[Path, int], tmp_path: Path
) -> None:
    # Found by review: without --judge a case's verification command runs in a judge lane,
    # and those lanes were not counted among the trees sharing the host's room: an answer
    # that forked (held 3 s) in all 8 of them took the host's 200 and stopped the run.
    cgroup, _ = limited
    paths = write_toy(tmp_path, {"0.0": "fork:8", "0.1": "fix:8"})
    dataset = Path(paths["dataset"])
    rows = [json.loads(line) for line in dataset.read_text().splitlines()]
    verify = f"{sys.executable} -I {{output_dir}}/check.py {{output_dir}}/output.json"
    dataset.write_text(
        "".join(json.dumps({**r, "verification_command": verify}) + "\n" for r in rows)
    )
    (tmp_path / "replay.py").write_text(_ANSWER_BOMB)
    flags = [*toy_flags(paths, paths["store"], lanes=2), "--iterations", "1"]
    flags[flags.index("--replay") + 1] = (
        f"{sys.executable} -I {tmp_path / 'replay.py'} {{candidate}} {{output_dir}}"
    )
    flags += ["--judge-concurrency", "8", "--judge-failure-retries", "0"]
    done = _inside(cgroup, [sys.executable, "-m", "evolane", "optimize", *flags])
    assert done.returncode == 0, done.stdout + done.stderr
    _, preflight = _said(Path(paths["store"]))
    assert "for 12 trees at once" in preflight, preflight  # 2 replay, 8 judge lanes, 2 slots
    (report,) = Path(paths["store"]).glob("runs/*/report.json")
    decided = json.loads(report.read_text())["decisions"]
    assert [(d["slot"], d["decision"]) for d in decided] == [(0, "reject"), (1, "accept")]
    assert "the host refused" not in report.read_text()


def test_a_run_with_no_process_limit_says_so_under_the_hosts_pid_limit(
    limited: tuple[Path, int], tmp_path: Path
) -> None:
    # Found by review: with --max-procs none nothing was said, though one tree may then
    # take every process the host leaves (every sibling's fork and spawn refused).
    cgroup, _ = limited
    paths = write_toy(tmp_path, {"default": "fix:8"})
    flags = [*toy_flags(paths, paths["store"]), "--iterations", "1", "--max-procs", "none"]
    done = _inside(cgroup, [sys.executable, "-m", "evolane", "optimize", *flags])
    assert done.returncode == 0, done.stdout + done.stderr
    (events,) = Path(paths["store"]).glob("runs/*/events.jsonl")
    assert f"({cgroup}/pids.max) and --max-procs is off" in events.read_text()


_FORKER = """
import os, sys, time
kids = 0
for _ in range({count}):
    try:
        pid = os.fork()
    except OSError:
        print(kids)
        sys.exit(1)
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    kids += 1
print(kids)
"""
_WHOSE = """
import json, sys, trio
from evolane.sandbox import Limits, SandboxSpec, open_sandbox

async def main():
    seen = []
    async with open_sandbox(sys.argv[1]) as host:
        for processes in (512, 16):
            spec = SandboxSpec(argv=(sys.executable, "-c", sys.argv[2]),
                               limits=Limits(processes=processes), kill_grace=0.2)
            outcome = await host.run(spec, timeout=60)
            seen.append([outcome.status, list(outcome.limits_hit), outcome.stdout.text()])
    print(json.dumps(seen))

trio.run(main)
"""


def test_a_fork_the_host_refused_is_told_from_one_the_trees_own_limit_refused(
    limited: tuple[Path, int], tmp_path: Path
) -> None:
    # Both refusals count in the tree's own pids.events; its high-water mark tells them
    # apart: 300 forks under its own 512 meet the host's 200 first; under its own 16, its own.
    cgroup, _ = limited
    argv = [sys.executable, "-c", _WHOSE, str(tmp_path / "sb"), _FORKER.format(count=300)]
    done = _inside(cgroup, argv)
    assert done.returncode == 0, done.stderr
    host, own = json.loads(done.stdout)
    assert host[:2] == ["limit_exceeded", ["host_processes"]], host
    assert 0 < int(host[2]) < 200  # refused by the host before its own limit
    assert own[:2] == ["limit_exceeded", ["processes"]], own
    assert int(own[2]) < 16


_WAIT = (
    _FORKS
    + """
def wait_for_the_room_taken(marks):  # the test lowers the host's pids.max, then says go
    open(os.path.join(marks, "waiting"), "w").close()
    for _ in range(6000):
        if os.path.exists(os.path.join(marks, "go")):
            return
        time.sleep(0.02)
"""
)
_REPLAY = (
    _WAIT
    + """
import json, os, sys, time
candidate, out, marks, mode = sys.argv[1:5]
with open(os.path.join(out, "usage.json"), "w") as usage:
    json.dump({"tokens": 100}, usage)  # every attempt spends
mark = os.path.join(marks, os.environ["EVOLANE_UNIT"])
if mode == "always" or (mode == "once" and not os.path.exists(mark)):
    open(mark, "w").close()
    wait_for_the_room_taken(marks)
    fork_or_exit(300, 60)  # more than the host's pids.max 200 allows, within --max-procs 512
with open(os.path.join(candidate, os.environ["EVOLANE_CASE_ID"])) as answer:
    with open(os.path.join(out, "output.json"), "w") as output:
        output.write(answer.read())
"""
)


_JUDGE = (
    _WAIT
    + """
import json, os, sys, time
answer = json.load(open(sys.argv[1]))
marks, mode = sys.argv[2:4]
mark = os.path.join(marks, "judged")  # "once": the run's first judge call forks, no other
forks = 300 if mode == "always" or (mode == "once" and not os.path.exists(mark)) else 0
open(mark, "w").close()
if forks:
    wait_for_the_room_taken(marks)
    fork_or_exit(forks, 60)  # past the host's pids.max 200, within --max-procs 512
print(json.dumps({"score": 1.0 if answer == "yes" else 0.0}))
"""
)


def _forking_run(
    root: Path, mode: str, cgroup: Path | None, judge: str = "", extra: tuple[str, ...] = ()
) -> tuple[int, dict, str]:
    """A one-iteration toy run whose replays fork past the host's limit (``mode``: on
    every attempt, on each unit's first, never), and with ``judge`` (a mode too) a judge
    command that does, inside ``cgroup`` when given: its exit code, report.json and output."""
    paths = write_toy(root, {"default": "fix:8"})
    marks = root / "marks"
    marks.mkdir()
    marks.chmod(0o777)  # a replay may run as a unit uid of its own
    script = root / "replay.py"
    script.write_text(_REPLAY)
    flags = toy_flags(paths, paths["store"], lanes=1)  # one tree at the host's limit at a time
    replay = f"{sys.executable} -I {script} {{candidate}} {{output_dir}} {marks} {mode}"
    flags[flags.index("--replay") + 1] = replay
    flags += ["--iterations", "1", "--expose-rw", str(marks)]
    if judge:
        (root / "judge.py").write_text(_JUDGE)
        script = root / "judge.py"
        judging = f"{sys.executable} -I {script} {{output_dir}}/output.json {marks} {judge}"
        flags += ["--judge", judging, "--judge-concurrency", "1"]
    flags += extra
    argv = [sys.executable, "-m", "evolane", "optimize", *flags]
    if cgroup is None:
        (marks / "go").touch()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        code, said = done.returncode, done.stdout + done.stderr
    else:
        code, said = _room_taken_after_preflight(cgroup, argv, marks)
    (report,) = Path(paths["store"]).glob("runs/*/report.json")
    return code, json.loads(report.read_text()), said


def _room_taken_after_preflight(cgroup: Path, argv: list[str], marks: Path) -> tuple[int, str]:
    """``argv`` run in ``cgroup`` with no pid limit at its start (so its trees keep their
    --max-procs: `share_host_pids`), the limit lowered to 200 once a command is about to
    fork: its exit code and output."""
    (cgroup / "pids.max").write_text("max")
    log = marks.parent / "said.txt"
    with log.open("w") as out:
        running = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, text=True, preexec_fn=_joiner(cgroup)
        )
        try:
            for _ in range(3000):  # until a command waits, or the run ended without one
                if (marks / "waiting").exists() or running.poll() is not None:
                    break
                time.sleep(0.1)
            (cgroup / "pids.max").write_text("200")
            (marks / "go").touch()
            code = running.wait(timeout=300)
        finally:
            if running.poll() is None:
                running.kill()
                running.wait()
    return code, log.read_text()


def test_a_replay_the_host_refused_a_process_is_tried_again_not_scored(
    limited: tuple[Path, int], tmp_path: Path
) -> None:
    # Found by review: the refusal was read as the tree's own --max-procs, owner candidate,
    # its case scored 0: the candidate that fixed 8 of 12 cases was rejected.
    cgroup, _ = limited
    code, report, said = _forking_run(tmp_path / "limited", "once", cgroup)
    assert code == 0, said
    ref_code, reference, ref_said = _forking_run(tmp_path / "free", "never", None)
    assert ref_code == 0, ref_said
    decided = [(d["slot"], d["decision"]) for d in report["decisions"]]
    assert decided == [(d["slot"], d["decision"]) for d in reference["decisions"]]
    assert "accept" in {decision for _, decision in decided}, decided
    assert report["scores"] == reference["scores"]
    assert not [f for f in report["failures"] if "processes" in json.dumps(f)], report["failures"]
    # each unit ran twice and both attempts' model calls are paid
    spent = report["budget"]["spent_by_role"]["replay"]["tokens"]
    assert spent == 2 * reference["budget"]["spent_by_role"]["replay"]["tokens"] > 0


def test_a_host_that_keeps_refusing_processes_fails_the_run_naming_the_host(
    limited: tuple[Path, int], tmp_path: Path
) -> None:
    cgroup, _ = limited
    code, report, said = _forking_run(tmp_path / "limited", "always", cgroup)
    _failed_naming_the_host(code, report, said, "the host refused a process")
    assert "not --max-procs" in said, said
    assert not report["decisions"] or all(d["decision"] != "reject" for d in report["decisions"])


def _failed_naming_the_host(code: int, report: dict, said: str, words: str) -> None:
    """The run failed, its campaign paused (resumable), saying ``words``, never the tree's
    own --max-procs."""
    assert code == 1, said
    assert report["status"] == "failed" and report["campaign_status"] == "paused"
    assert words in said and "processes limit 512" not in said, said


def test_a_judge_the_host_refused_a_process_stops_the_run_naming_the_host(
    limited: tuple[Path, int], tmp_path: Path
) -> None:
    # The same refusal in a judge was "processes limit 512 hit", an infrastructure failure
    # of the unit: a candidate's unit so judged counts as 0.
    cgroup, _ = limited
    code, report, said = _forking_run(tmp_path / "limited", "never", cgroup, judge="always")
    _failed_naming_the_host(
        code, report, said, "judge failed: the judge: the host refused a process"
    )


def test_a_judge_the_host_refused_a_process_once_is_tried_again_whatever_its_retries(
    limited: tuple[Path, int], tmp_path: Path
) -> None:
    # Found by review: with --judge-failure-retries 0 one refusal of the host stopped the
    # run, where a replay's is tried again whatever its retries.
    cgroup, _ = limited
    retries = ("--judge-failure-retries", "0")
    code, report, said = _forking_run(tmp_path / "limited", "never", cgroup, "once", retries)
    assert code == 0, said
    free = _forking_run(tmp_path / "free", "never", None, "never", retries)
    assert free[0] == 0, free[2]
    decided = [(d["slot"], d["decision"]) for d in report["decisions"]]
    assert decided == [(d["slot"], d["decision"]) for d in free[1]["decisions"]]
    assert report["scores"] == free[1]["scores"]
    assert "accept" in {decision for _, decision in decided}, decided


_NO_THREADS = """
import sys
from pathlib import Path
from evolane.sandbox._host import _Janitor

cgroup = Path(sys.argv[1])
(cgroup / "pids.max").write_text((cgroup / "pids.current").read_text())  # not one task more
janitor, done = _Janitor(), []
janitor.put(lambda: done.append(1))
janitor.settle()
janitor.close()
print(len(done))
"""


def test_the_janitor_cleans_up_at_once_when_the_host_refuses_it_a_thread(
    limited: tuple[Path, int],
) -> None:
    # Found by review: the unstarted thread was kept; closing the host joined it and raised
    # "cannot join thread before it is started" (the run's end an internal error).
    cgroup, _ = limited
    done = _inside(cgroup, [sys.executable, "-c", _NO_THREADS, str(cgroup)])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1"]


def test_a_thread_the_host_refused_evolane_ends_the_run_in_one_line_and_resumable(
    limited: tuple[Path, int], tmp_path: Path
) -> None:
    # Found by review: under a full pids.max a trio worker thread's refusal ended the run
    # "internal error: ActorCrashed: ... RuntimeError(\"can't start new thread\")", naming
    # neither the host nor the way on. pids.max 3: the interpreter and two of its threads.
    cgroup, _ = limited
    (cgroup / "pids.max").write_text("3")
    paths = write_toy(tmp_path, {"default": "fix:8"})
    flags = [*toy_flags(paths, paths["store"]), "--iterations", "1"]
    done = _inside(cgroup, [sys.executable, "-m", "evolane", "optimize", *flags])
    assert done.returncode == 1, done.stdout + done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("evolane: error:")]
    assert "the host refused evolane a thread" in line and "pids.max" in line, line
    run_id = line.rsplit("--resume ", 1)[1]  # nothing was decided: the run goes on
    (run,) = Path(paths["store"]).glob(f"runs/{run_id}/run.json")
    assert json.loads(run.read_text())["status"] == "interrupted"
    (cgroup / "pids.max").write_text("max")
    argv = [sys.executable, "-m", "evolane", "optimize", "--resume", run_id]
    again = _inside(cgroup, [*argv, "--store", str(paths["store"])])
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(run.read_text())["status"] == "finished"


_SPAWN_REFUSED = """
import json, sys, trio
from pathlib import Path
from evolane.sandbox import SandboxSpec, open_sandbox

async def main():
    cgroup = Path(sys.argv[2])
    async with open_sandbox(sys.argv[1]) as host:
        spec = SandboxSpec(argv=(sys.executable, "-c", "pass"), kill_grace=0.2)
        first = await host.run(spec, timeout=60)  # the spawn server and a worker thread up
        (cgroup / "pids.max").write_text((cgroup / "pids.current").read_text())
        refused = await host.run(spec, timeout=60)
        print(json.dumps([first.status, refused.status, refused.error]))

trio.run(main)
"""


def test_a_spawn_the_host_refused_names_the_pid_limit(
    limited: tuple[Path, int], tmp_path: Path
) -> None:
    # Found by review: a run stopped on "baseline replay could not start: [Errno 11] clone3:
    # Resource temporarily unavailable", naming no limit to raise.
    cgroup, _ = limited
    done = _inside(
        cgroup, [sys.executable, "-c", _SPAWN_REFUSED, str(tmp_path / "sb"), str(cgroup)]
    )
    assert done.returncode == 0, done.stderr
    first, status, error = json.loads(done.stdout)
    assert (first, status) == ("exited", "spawn_failed"), error
    assert error.startswith("[Errno 11]"), error  # still tried again as a refusal for now
    assert f"the host refused a process ({cgroup}/pids.max enclosing evolane)" in error, error


_EXACT_MATCH = Dataset([Case(id="c1", input="x", expected_output="yes")])
"""Cases judged by exact match: no judge lane runs a command."""


@settings(max_examples=300, deadline=None)
@given(
    left=st.integers(0, 200_000),
    per_tree=st.integers(1, 8192),
    replays=st.integers(1, 64),
    population=st.integers(1, 64),
)
def test_each_trees_share_fits_the_hosts_room_or_the_run_is_warned(
    left: int, per_tree: int, replays: int, population: int
) -> None:
    # What the host allows is shared so that every tree at its limit, with its launcher's
    # processes, leaves evolane a reserve; where no share of 1 fits, the warning stays.
    paths = {name: Path(f"/nowhere/{name}") for name in ("target", "dataset", "store")}
    paths |= {"script": Path("/nowhere/o.py"), "plan": Path("/nowhere/plan.json")}
    config = toy_config(
        paths, max_procs=per_tree, replay_concurrency=replays, population=population
    )
    trees = replays + population
    where = (left, Path("/sys/fs/cgroup/pids/x"))
    with mock.patch("evolane.campaign._containment.process_headroom", return_value=where):
        shared, said = share_host_pids(config, _EXACT_MATCH)
        warned = host_warnings(shared, _EXACT_MATCH)
    share = shared.commands.max_procs
    assert share is not None and share <= per_tree
    if said is None:
        assert shared == config
        assert bool(warned) == (trees * per_tree > left), warned
    else:
        assert share < per_tree and f"lowered to {share} a command tree" in said
        assert trees * (share + NAMESPACE_EXTRA_PROCESSES) + min(16, left) <= left
        assert not warned


def test_judge_lanes_share_the_hosts_room_only_when_they_run_commands() -> None:
    # A model judge runs no command tree: its lanes took shares no tree used (found by
    # review); without --judge, a case's verification command runs in each judge lane.
    paths = {name: Path(f"/nowhere/{name}") for name in ("target", "dataset", "store")}
    paths |= {"script": Path("/nowhere/o.py"), "plan": Path("/nowhere/plan.json")}
    verified = Dataset([Case(id="c1", input="x", verification_command="true {output_dir}")])
    where = (200, Path("/sys/fs/cgroup/pids/x"))
    said = {}
    for name, judge, dataset in (
        ("model", "llm:some-model", _EXACT_MATCH),
        ("command", "sh judge.sh {output_dir}", _EXACT_MATCH),
        ("exact", None, _EXACT_MATCH),
        ("verified", None, verified),
    ):
        config = toy_config(paths, judge=judge, replay_concurrency=4, judge_concurrency=3)
        with mock.patch("evolane.campaign._containment.process_headroom", return_value=where):
            said[name] = share_host_pids(config, dataset)[1] or ""
    trees = {name: text.split(" for ", 1)[1].split()[0] for name, text in said.items()}
    assert trees == {"model": "6", "command": "9", "exact": "6", "verified": "9"}, said


def test_a_local_dask_clusters_workers_are_kept_out_of_the_trees_share() -> None:
    # Found by review: the workers of --cluster local:12 (nanny, worker, their threads, a
    # spawn server: ~10 tasks each) start after the share is taken, and took the reserve:
    # a candidate's fork bomb in each of the 12 replay lanes then stopped the run (400).
    paths = {name: Path(f"/nowhere/{name}") for name in ("target", "dataset", "store")}
    paths |= {"script": Path("/nowhere/o.py"), "plan": Path("/nowhere/plan.json")}
    config = toy_config(paths, cluster="local:12", replay_concurrency=12)
    where = (397, Path("/sys/fs/cgroup/pids/x"))
    with mock.patch("evolane.campaign._containment.process_headroom", return_value=where):
        shared, _ = share_host_pids(config, _EXACT_MATCH)
    share = shared.commands.max_procs
    assert share is not None
    assert 14 * (share + NAMESPACE_EXTRA_PROCESSES) + 12 * 10 + 16 <= 397, share


def test_a_networked_trees_slirp4netns_is_kept_out_of_evolanes_reserve() -> None:
    # Found by review: a confined command given the network has slirp4netns in its tree's
    # cgroups, one process beside --max-procs that the share left out: each replay lane's
    # fork bomb then took one of evolane's reserve (14 of 64 here).
    if resolve_isolation("confined")[0] != "confined" or own_network_problem() is not None:
        pytest.skip("needs bubblewrap and slirp4netns")
    paths = {name: Path(f"/nowhere/{name}") for name in ("target", "dataset", "store")}
    paths |= {"script": Path("/nowhere/o.py"), "plan": Path("/nowhere/plan.json")}
    config = toy_config(paths, replay_concurrency=12, isolation="confined", network_for=("replay",))
    where = (400, Path("/sys/fs/cgroup/pids/x"))
    with mock.patch("evolane.campaign._containment.process_headroom", return_value=where):
        shared, _ = share_host_pids(config, _EXACT_MATCH)
    share = shared.commands.max_procs
    assert share is not None
    assert 14 * (share + NAMESPACE_EXTRA_PROCESSES + 1) + 64 <= 400, share


_THREADED_CHECK = """
import os, sys, threading, time
workers = [threading.Thread(target=time.sleep, args=(0.2,)) for _ in range(40)]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
sys.exit(not os.path.exists(os.path.join(sys.argv[1], "REQUIRED")))
"""


def test_the_post_publish_check_runs_alone_with_the_room_of_every_tree(
    limited: tuple[Path, int], tmp_path: Path
) -> None:
    # Found by review: the check, run once every lane is done, kept the lanes' share (27
    # of --max-procs 512 under the host's 200, for 5 trees): a check whose 40 threads an
    # honest test suite would start rolled the publish back.
    cgroup, _ = limited
    paths = write_toy(tmp_path, {"default": "fix:8"})
    (tmp_path / "check.py").write_text(_THREADED_CHECK)
    flags = [*toy_flags(paths, paths["store"]), "--iterations", "1", "--apply", "auto_verified"]
    flags += ["--check", f"{sys.executable} -I {tmp_path / 'check.py'} {{candidate}}"]
    done = _inside(cgroup, [sys.executable, "-m", "evolane", "optimize", *flags])
    assert done.returncode == 0, done.stdout + done.stderr
    (report,) = Path(paths["store"]).glob("runs/*/report.json")
    record = json.loads(report.read_text())
    assert "processes 27 (pids_cgroup" in record["limits"]  # the lanes' share, as before
    assert record["apply"]["status"] == "applied", record["apply"]


SWITCH_PROBE = """
import os, sys, trio
from pathlib import Path
from evolane.sandbox import SandboxSpec, commands_run_unprivileged, open_sandbox
cgroup = Path(sys.argv[1])
said = [commands_run_unprivileged()]  # the probe's fork refused
(cgroup / "pids.max").write_text("200")
said.append(commands_run_unprivileged())

async def main():
    async with open_sandbox(sys.argv[2]) as host:
        spec = SandboxSpec(argv=("id", "-u"), isolation="process", drop_root=True)
        done = await host.run(spec, timeout=60)
        said.append(done.stdout.text().strip())

trio.run(main)
print(*said)
"""


def test_a_uid_switch_probe_the_host_refused_still_runs_commands_as_unit_uids(
    limited: tuple[Path, int], tmp_path: Path
) -> None:
    # Found by CI: under a full pids.max the probe of setpriv's uid switch was refused a
    # process, counted as "no switch", and every command of the run then ran as root.
    if not commands_run_unprivileged():
        pytest.skip("needs root and a setpriv that switches uids")
    cgroup, _ = limited
    (cgroup / "pids.max").write_text("1")  # the interpreter alone: its probe cannot fork
    argv = [sys.executable, "-c", SWITCH_PROBE, str(cgroup), str(tmp_path / "sb")]
    done = _inside(cgroup, argv)
    assert done.returncode == 0, done.stderr
    first, then, uid = done.stdout.split()
    assert (first, then) == ("True", "True"), done.stdout  # refused: not "no switch"
    assert int(uid) >= UNIT_UID_BASE, done.stdout  # a unit uid, never root
