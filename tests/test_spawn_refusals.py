"""A replay spawn the host refuses for the moment (EAGAIN, ENOMEM) is tried again.

Found by review: under a pid limit (a cgroup's ``pids.max``, the host's other work) a
replay's ``clone3`` failed with EAGAIN, the measurement stopped as a shared failure and the
run with it, though the next spawn a moment later would have started. No command ran, so
trying again charges nothing twice; a refusal that lasts ends the run as before.
"""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import trio

from evolane._faults import INSTALLED
from evolane.campaign import RunOutcome, RunRequest, run_campaign
from evolane.lanes._replay_failure import SPAWN_REFUSALS
from tests.campaign_helpers import toy_config, write_toy


class _PidLimit:
    """A host at its pid limit: the first ``refusals`` replay spawns fail as ``clone3``
    fails there (the runtime's fault hook, so the spawns after it are real)."""

    def __init__(self, refusals: int, after: int = 0, label: str = "replay") -> None:
        self.left, self.refused, self.spared = refusals, 0, after  # the first ``after`` start
        self.label = label
        self._lock = threading.Lock()  # spawns are decided in worker threads

    async def before_handler(self, actor: str, kind: str) -> None:
        return None

    def before_spawn(self, label: str) -> None:
        if label != self.label:
            return
        with self._lock:
            if self.spared > 0:
                self.spared -= 1
                return
            if self.left <= 0:
                return
            self.left -= 1
            self.refused += 1
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")


async def _run_under(
    limit: _PidLimit, root: Path, plan: str = "fix:8", test: int = 6, **overrides: object
) -> RunOutcome:
    paths = write_toy(root, {"default": plan}, test=test)
    INSTALLED.append(limit)
    try:
        with trio.fail_after(120):
            return await run_campaign(RunRequest(toy_config(paths, **overrides)))
    finally:
        INSTALLED.remove(limit)


async def test_a_spawn_refused_for_a_moment_is_tried_again_and_the_run_finishes(
    tmp_path: Path,
) -> None:
    # As many refusals as one unit may meet: whichever units meet them, each starts at last.
    limit = _PidLimit(SPAWN_REFUSALS)
    outcome = await _run_under(limit, tmp_path / "limited")
    assert limit.refused == SPAWN_REFUSALS
    report = outcome.report
    assert report is not None and report.status == "finished", report and report.message
    assert not [f for f in report.failures if f.failure.code == "spawn_failed"]
    reference = await _run_under(_PidLimit(0), tmp_path / "free")
    assert reference.report is not None
    decided = [(d.iteration, d.slot, d.decision) for d in report.decisions]
    assert decided == [(d.iteration, d.slot, d.decision) for d in reference.report.decisions]
    assert report.scores == reference.report.scores


async def test_a_refusal_that_lasts_fails_the_run_after_a_bounded_number_of_tries(
    tmp_path: Path,
) -> None:
    limit = _PidLimit(10**6)
    outcome = await _run_under(limit, tmp_path)
    report = outcome.report
    assert report is not None and report.status == "failed"
    assert "baseline replay could not start: [Errno 11]" in report.message
    lanes = toy_config(write_toy(tmp_path / "n", {})).measure.replay_concurrency
    assert limit.refused <= lanes * (1 + SPAWN_REFUSALS)  # each unit tried a bounded number


async def test_a_unit_an_early_stop_ends_while_its_spawn_waits_is_cancelled(
    tmp_path: Path,
) -> None:
    # Found by review: the candidate breaks its first cases and is rejected early; a unit
    # beyond the cutoff, its spawn refused, was stopped while it waited to try again and
    # ended spawn_failed: its measurement stopped as a shared failure and the run failed,
    # the campaign paused, though the decision was taken on the pairs before the cutoff.
    # The parent's 12 replays start, then the candidate's first 6 in the seeded order: enough
    # to reject it early; every spawn after them is refused (no test split: none follows).
    limit = _PidLimit(10**6, after=12 + 6)
    outcome = await _run_under(
        limit, tmp_path, "harm:4", test=0, iterations=1, population=1, replay_concurrency=2
    )
    report = outcome.report
    assert report is not None
    assert limit.refused > 0  # some unit met the refusals
    assert report.status == "finished", report.message
    assert [d.decision for d in report.decisions] == ["reject"]
    assert not [f for f in report.failures if f.failure.code == "spawn_failed"]


async def test_an_optimizer_spawn_refused_for_a_moment_is_tried_again(tmp_path: Path) -> None:
    # Found by review: an optimizer command whose spawn the host refused for a moment (a
    # full pids.max) lost its slot, unblamed but unproposed: with every proposal of an
    # iteration refused, the iteration was lost and a campaign ended complete having tried
    # nothing. No command ran, so it is tried again, as a replay's spawn is.
    limit = _PidLimit(SPAWN_REFUSALS, label="optimizer")
    outcome = await _run_under(limit, tmp_path / "limited", iterations=1)
    assert limit.refused == SPAWN_REFUSALS
    report = outcome.report
    assert report is not None and report.status == "finished", report and report.message
    assert not [f for f in report.failures if f.failure.code == "spawn_failed"], report.failures
    reference = await _run_under(_PidLimit(0), tmp_path / "free", iterations=1)
    assert reference.report is not None
    decided = [(d.iteration, d.slot, d.decision) for d in report.decisions]
    assert decided == [(d.iteration, d.slot, d.decision) for d in reference.report.decisions]
    assert "accept" in [d.decision for d in report.decisions]
