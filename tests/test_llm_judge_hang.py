"""A model endpoint that stops answering (found by review): it accepted the judge's requests
and never answered, every candidate unit ended ``judge_timed_out``, counted as 0, and a
better candidate was rejected, the campaign ``complete``. A judgement whose request timed
out now asks the canary (the same judgement without the output) in time kept back before
the deadline: unanswered too, the timeout is the endpoint's (`judge_endpoint_failed`, left
out); answered, it stays the output's (a 0: an output can ask the judge to write at
length). The optimizer's proposals timed out alike, and the run ended ``finished`` with no
word of why; a short probe now tells. On a real HTTP server; the campaign through the real
CLI or API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evolane.lanes import Endpoint, llm_judge, llm_optimizer
from evolane.lanes._backends import ENDPOINT_EXIT
from evolane.lanes._judge import command_verdict
from evolane.measure._table import unscored_counts_as_zero
from evolane.messages import FailureEvent, JudgeResult, ReplayResult
from evolane.testing import ChatStub
from tests.campaign_helpers import run_optimize
from tests.test_llm_backends import RUBRIC, _judge_call, _last_user, _optimizer_call, _run
from tests.test_llm_hostile import _campaign
from tests.test_llm_rate_limits import _campaign_flags, _report

JUDGE_SECONDS = 4.0


def _counts_as_zero(failure: FailureEvent | None) -> bool:
    """Whether a candidate unit whose judge failed so scores 0 in the comparison."""
    assert failure is not None
    judged = JudgeResult(unit_id="u", status="failed", source="command", failure=failure)
    replayed = ReplayResult(
        unit_id="u", case_id="c", arm="candidate", repetition=0, status="succeeded"
    )
    return unscored_counts_as_zero(replayed, judged)


async def test_a_hung_endpoint_is_the_judges_endpoint_failure(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    # The request and the canary both hang: the endpoint's failure, reported before the
    # deadline cuts the judge (cut, it was a timeout, a 0 for a candidate).
    chat_stub.script.hang = True
    call = _judge_call(tmp_path)
    outcome = await _run(
        llm_judge(Endpoint("m", base_url=chat_stub.base_url), RUBRIC), call, JUDGE_SECONDS
    )
    assert outcome.status == "exited" and outcome.exit_code == ENDPOINT_EXIT, outcome.stderr.head
    assert b"did not answer the same judgement without the output" in outcome.stderr.head
    verdict = command_verdict(outcome, backend=True)
    assert verdict.failure is not None and verdict.failure.code == "judge_endpoint_failed"
    assert not _counts_as_zero(verdict.failure)
    canary = _last_user(chat_stub.stats.bodies[-1])
    assert "(no output)" in canary and "Paris" not in canary


async def test_an_output_that_makes_the_judge_time_out_still_counts_against_it(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    # The gaming guard: the endpoint answers the same judgement without the output, so the
    # timeout is the output's (one that asks the judge to write at length on every case it
    # would fail must not have them left out). Cut at --llm-timeout or at the time kept
    # back for the canary alike.
    chat_stub.script.hang_on = "WRITE FOREVER"
    for timeout in (1.0, None):
        call = _judge_call(tmp_path / str(timeout))
        assert call.output_dir is not None
        (call.output_dir / "output.json").write_text('"WRITE FOREVER"')
        endpoint = Endpoint("m", base_url=chat_stub.base_url, retries=0, timeout=timeout)
        outcome = await _run(llm_judge(endpoint, RUBRIC), call, JUDGE_SECONDS)
        assert outcome.status == "exited" and outcome.exit_code == 1, outcome.stderr.head
        assert b"the output caused the failure" in outcome.stderr.head
        verdict = command_verdict(outcome, backend=True)
        assert _counts_as_zero(verdict.failure)
        canary = _last_user(chat_stub.stats.bodies[-1])
        assert "(no output)" in canary and "WRITE FOREVER" not in canary


@pytest.mark.slow  # some 30 s: the test split's judgements hang too
def test_a_judge_endpoint_that_stops_answering_never_rejects_the_candidate(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    # The endpoint hangs once the seed's 12 val cases are judged: every judgement of the
    # candidate (a better one) hangs. It ended judge_timed_out, scored 0, and the candidate
    # was rejected ("candidate < baseline on 4 case(s)"); now its units are left out and
    # the coverage guard makes the measurement indecisive.
    chat_stub.script.grade, chat_stub.script.hang_after = [], 12
    done = run_optimize(_campaign_flags(tmp_path, chat_stub))
    assert done.returncode == 0, done.stderr[-2000:]
    report = _report(tmp_path / "store")
    assert [d["decision"] for d in report["decisions"]] == ["indecisive"], report["decisions"]
    mine = [f["failure"] for f in report["failures"] if f["where"].endswith(".c")]
    assert mine and {(f["code"], f["owner"]) for f in mine} == {
        ("judge_endpoint_failed", "infrastructure")
    }, report["failures"]
    assert "did not answer the same judgement without the output" in mine[0]["message"]


async def test_an_optimizer_endpoint_that_stops_answering_fails_the_run_naming_it(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    # Every proposal timed out, and the run ended "finished", the campaign "complete",
    # having tried nothing, its message empty.
    chat_stub.script.hang = True
    report: Any = await _campaign(
        chat_stub, tmp_path, iterations=2, population=2, optimizer_timeout=JUDGE_SECONDS
    )
    assert report.status == "failed" and report.campaign_status == "paused", report.message
    assert "optimizer's model endpoint failed on every call" in report.message
    assert "did not answer a short request either" in report.message
    assert {f.failure.code for f in report.failures} == {"endpoint_failed"}


async def test_an_optimizer_model_slow_on_its_proposal_alone_stays_a_timeout(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    # The endpoint answers a short request: the model is slow on this proposal, not down.
    chat_stub.script.hang_on = "be brief"
    for timeout in (1.0, None):
        endpoint = Endpoint("m", base_url=chat_stub.base_url, retries=0, timeout=timeout)
        call = _optimizer_call(tmp_path / str(timeout))
        outcome = await _run(llm_optimizer(endpoint), call, JUDGE_SECONDS)
        assert outcome.status == "exited" and outcome.exit_code == 1, outcome.stderr.head
        assert _last_user(chat_stub.stats.bodies[-1]) == "Answer with the one word: ok"
