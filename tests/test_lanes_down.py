"""A lane pool whose supervisor gave up is the framework's failure, shared by every unit
after it: the measurement stops on it, and no candidate is decided on units it failed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import trio

from evolane import _faults
from evolane.campaign._run import RunRequest, run_campaign
from evolane.store import read_journal
from evolane.testing import ChaosFault
from tests.campaign_helpers import toy_config, write_toy


class _JudgesCrashAfter:
    """Every judge job after the first ``spared`` crashes its lane (as an output that a
    judge lane cannot handle would), so the judge lanes' supervisor gives up."""

    def __init__(self, spared: int) -> None:
        self.spared, self.delivered = spared, 0

    async def before_handler(self, actor: str, kind: str) -> None:
        if ".judge-" in actor and kind == "judge.job":
            self.delivered += 1
            if self.delivered > self.spared:
                raise ChaosFault(f"judge lane crash {self.delivered}")

    def before_spawn(self, label: str) -> None:
        return None


@contextmanager
def _installed(injector: _JudgesCrashAfter) -> Iterator[None]:
    _faults.INSTALLED.append(injector)
    try:
        yield
    finally:
        _faults.INSTALLED.remove(injector)


async def test_judges_down_stop_the_run_as_the_frameworks_failure(tmp_path: Path) -> None:
    """Found by hostile review: once a judge pool's supervisor gave up, every later judge
    failed at once (``lane_error``, "is down"), each a unit left out (a candidate's at 0),
    and the run went on deciding and testing on them and ended "finished", exit 0. Now the
    first such unit stops its measurement as a shared failure (``lanes_down``): the run
    fails on the framework's failure and decides nothing on it."""
    paths = write_toy(tmp_path, {"default": "fix:2"})
    injector = _JudgesCrashAfter(spared=12)  # the parent's val measurement is judged
    with _installed(injector), trio.fail_after(120):
        outcome = await run_campaign(RunRequest(toy_config(paths, iterations=2, population=2)))
    report = outcome.report
    assert report is not None and injector.delivered > 12
    assert report.status == "failed", (report.status, report.message)
    assert "its supervisor gave up" in report.message, report.message
    assert "not a candidate's" in report.message, report.message
    assert any(m.status == "shared_failure" for m in report.measurements)
    records = read_journal(outcome.run_dir / "journal.jsonl").records
    failures = [
        failure
        for record in records
        if record.get("type") == "unit"
        for failure in ((record.get("judge") or {}).get("failure"),)
        if failure and "is down" in failure["message"]
    ]
    assert failures and {f["code"] for f in failures} == {"lanes_down"}, failures
