"""An optimizer whose command cannot run (found by review): a missing agent CLI or a wrong
script path failed every call, and the run ended finished, its campaign complete, exit 0,
having tried nothing. Now, as for a model endpoint down on every call, it ends failed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import evolane
from evolane.campaign._types import optimizer_down
from evolane.embed import BackendCall, Backends, OptimizeRequest
from evolane.messages import FailureEvent, ProposeResult
from evolane.testing import Chaos
from tests.campaign_helpers import toy_flags, with_flag, write_toy

EVOLANE = [sys.executable, "-m", "evolane"]


def _run(tmp_path: Path, optimizer: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    paths = write_toy(tmp_path, {"0.0": "fix:1"})
    script = tmp_path / "tools" / "optimize.sh"  # a script without its exec bit
    script.parent.mkdir()
    script.write_text("#!/bin/sh\nexit 0\n")
    optimizer = optimizer.replace("{not_executable}", str(script))
    args = with_flag(toy_flags(paths, paths["store"]), "--optimizer", optimizer)
    args = with_flag(with_flag(args, "--iterations", "2"), "--isolation", "process")
    done = subprocess.run(
        [*EVOLANE, "optimize", *args], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    reports = list((paths["store"] / "runs").glob("*/report.json"))
    assert len(reports) == 1, done.stderr
    return done, json.loads(reports[0].read_text())


@pytest.mark.parametrize(
    ("optimizer", "said"),
    [
        ("sh -c 'no-such-agent-cli --go'", "exit 127 on every call (|no-such-agent-cli"),
        ("/no/such/optimize.sh {workdir}", "did not start on every call ("),
        ("sh -c '{not_executable}'", "exit 126 on every call ("),
    ],
)
def test_an_optimizer_that_cannot_run_fails_the_run(
    tmp_path: Path, optimizer: str, said: str
) -> None:
    done, report = _run(tmp_path, optimizer)
    assert done.returncode == 1, done.stderr
    assert report["status"] == "failed" and report["campaign_status"] == "paused"
    assert "the optimizer's command cannot run: " in report["message"], report["message"]
    assert all(part in report["message"] for part in said.split("|")), report["message"]


def test_an_optimizer_that_fails_otherwise_still_only_costs_its_slots(tmp_path: Path) -> None:
    done, report = _run(tmp_path, "sh -c 'echo out of credits >&2; exit 1'")
    assert done.returncode == 0, done.stderr
    assert report["status"] == "finished"
    failures = [item["failure"] for item in report["failures"]]
    assert failures and all(f["code"] == "exit_1" for f in failures), failures
    calls = len(report["funnel"])  # the summary says so, not only report.json
    said = f"proposals lost: {calls} of {calls} optimizer calls failed; the first: exit_1: "
    assert said in done.stdout and "lane broke" not in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("message", "number", "down"),
    [
        ("no-such-agent: [Errno 2] No such file or directory (or not executable)", 2, True),
        ("[Errno 13] Permission denied: '/opt/agent'", 13, True),
        ("[Errno 11] Resource temporarily unavailable", 11, False),  # fork under a pids limit
        ("[Errno 24] Too many open files", 24, False),
        ("chaos: refused to spawn optimizer", None, False),  # evolane.testing.Chaos
        # its own stderr through the launcher's join failure line (exit 125): no errno
        ("evolane-launch-0123: cannot join cgroup [Errno 2] No such file", None, False),
    ],
)
def test_only_a_missing_program_makes_a_spawn_failure_cannot_run(
    message: str, number: int | None, down: bool
) -> None:
    """Found by review: every spawn failure counted as 'cannot run', so a transient one
    (EAGAIN, EMFILE, a Chaos refusal) on every call of an iteration failed the run. Read
    from the spawn's errno, never from its message's text (a command's, through the join
    failure line, could say ``[Errno 2]``: found by review)."""
    failure = FailureEvent(
        owner="infrastructure",
        stage="optimizer",
        code="spawn_failed",
        message=message,
        spawn_errno=number,
    )
    results = [ProposeResult(slot_id=f"s{n}", status="failed", failure=failure) for n in (0, 1)]
    said = optimizer_down(results)
    assert (said is not None) == down, said
    if down:
        assert said is not None and "did not start on every call" in said


async def test_an_optimizer_refused_by_chaos_on_every_call_costs_its_slots_only(
    tmp_path: Path,
) -> None:
    """The chaos harness's spawn refusal is an infrastructure failure (its docs, and the
    pytest plugin's user-style test): the run still finishes, every proposal lost."""
    target = tmp_path / "target"
    target.mkdir()
    rows = []
    for i in range(8):
        (target / f"c{i}").write_text("yes" if i < 3 else "no")
        rows.append({"id": f"c{i}", "input": {}, "expected_output": "yes", "split": "val"})
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = evolane.CampaignConfig(
        target=str(target), dataset=str(tmp_path / "data.jsonl"), store=str(tmp_path / "s"),
        replay="backend:toy", optimizer="sh -c 'exit 0'", iterations=2, population=2,
        kill_grace=0.2,
    )  # fmt: skip

    async def replay(call: BackendCall) -> None:
        answer = (call.candidate / call.case["id"]).read_text().strip()
        (call.output_dir / "output.json").write_text(json.dumps(answer))

    with trio.fail_after(120), Chaos(spawn_failure=1.0).installed() as chaos:
        async with evolane.open_runtime(store=tmp_path / "s") as runtime:
            report = await runtime.optimize(
                OptimizeRequest(config=config), backends=Backends(replay=replay)
            )
    assert report.status == "finished", report.message
    assert chaos.injected["spawn_failure"] == 4
    assert all(f.failure.code == "spawn_failed" for f in report.failures)


async def test_optimizer_lanes_their_supervisor_gave_up_on_fail_the_run(tmp_path: Path) -> None:
    """Found by review: an optimizer lane crashing on every call (a bug in evolane) past what
    its pool absorbs left the pool down; every later slot failed "is down: its supervisor
    gave up", and the run ended finished, its campaign complete, exit 0: "nothing accepted",
    as if the optimizer had found nothing. A crash alone still costs its slot only
    (test_campaign's crashing optimizer lane); a pool that is down ends the run failed."""
    from evolane.campaign._run import RunRequest, run_campaign
    from tests.campaign_helpers import toy_config

    paths = write_toy(tmp_path, {"default": "fix:2"})
    chaos = Chaos(seed=1, handler_crash=1.0, only=(".optimizer-",))
    config = toy_config(paths, iterations=8, population=2)  # 16 calls: > 2 lanes x 3 crashes
    with chaos.installed(), trio.fail_after(120):
        outcome = await run_campaign(RunRequest(config))
    report = outcome.report
    assert report is not None and report.status == "failed", report
    assert report.campaign_status == "paused"
    assert "the optimizer lanes are down: their supervisor gave up" in report.message
    assert "the last crash: " in report.message and "chaos: " in report.message
    assert chaos.injected["handler_crash"] > 6  # the pool absorbed 2 x 3 before it gave up
    assert len(report.decisions) < 16  # it stopped there, not after every slot failed alike


CRASHING_LANES = """
from evolane.testing import Chaos
from evolane.cli import main
with Chaos(seed=1, handler_crash=1.0, only=(".optimizer-",)).installed():
    main()
"""


def test_a_summary_names_the_proposals_lost_to_evolanes_own_lanes(tmp_path: Path) -> None:
    """Found by review: every optimizer call lost to a crashing lane (a bug of evolane's,
    restarted each time) printed "best: the seed (nothing accepted)" and nothing else, as
    if the optimizer had found nothing."""
    paths = write_toy(tmp_path, {"default": "fix:2"})
    script = tmp_path / "crashing.py"
    script.write_text(CRASHING_LANES)
    args = with_flag(toy_flags(paths, paths["store"]), "--iterations", "2")
    argv = [sys.executable, str(script), "optimize", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr  # 4 crashes: within what the pool absorbs
    said = "proposals lost: 4 of 4 optimizer calls failed, 4 because evolane's lane broke"
    assert said in done.stdout and "the first: ActorCrashed: " in done.stdout, done.stdout
