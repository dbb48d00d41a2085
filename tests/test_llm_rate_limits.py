"""A rate-limited model endpoint up to a call's deadline (found by review): a 429 storm
kept the judge's calls waiting in the endpoint's limiter until the deadline cut them, and
the unit ended ``judge_timed_out``, which counts as 0 for a candidate: an outage rejected a
better candidate. A wait for the endpoint that would reach the deadline now ends before it,
as the endpoint's failure (`judge_endpoint_failed`, left out of the comparison). The
limiter's own rules run on trio's fake clock; the rest on a real HTTP server, the campaign
through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from evolane.lanes import (
    AdaptiveLimiter,
    Endpoint,
    LimiterSettings,
    NoSlot,
    llm_judge,
    llm_optimizer,
)
from evolane.lanes._backends import ENDPOINT_EXIT
from evolane.testing import ChatStub
from tests.campaign_helpers import run_optimize, toy_flags, write_toy
from tests.test_llm_backends import RUBRIC, _judge_call, _optimizer_call, _run, _usage


def _limiter(limit: int = 1) -> AdaptiveLimiter:
    settings = LimiterSettings(initial=limit, maximum=limit, minimum=1)
    return AdaptiveLimiter("unit", settings, clock=trio.current_time)


async def test_a_pause_that_runs_past_by_gives_up_at_once(autojump_clock: Any) -> None:
    limiter = _limiter(4)
    async with limiter.slot() as ticket:
        limiter.rate_limited(ticket, 30.0)  # Retry-After: 30 s
    start = trio.current_time()
    with pytest.raises(NoSlot, match="Retry-After"):
        async with limiter.slot(by=start + 30.0):
            pass
    assert trio.current_time() == start and limiter.in_flight == 0  # no wait at all
    async with limiter.slot(by=start + 30.5):  # a pause that ends before by is waited for
        assert trio.current_time() >= start + 30.0
    async with limiter.slot() as ticket:
        limiter.rate_limited(ticket, 30.0)
    start = trio.current_time()
    async with limiter.slot(by=start + 1.0, past_pause=True):  # a probe: at once
        assert trio.current_time() == start


async def test_a_wait_for_a_place_gives_up_at_by_only_after_a_429(autojump_clock: Any) -> None:
    limiter = _limiter(1)
    ended: list[str] = []

    async def waiter(by: float) -> None:
        try:
            async with limiter.slot(by=by):
                ended.append(f"admitted at {trio.current_time():.0f}")
        except NoSlot:
            ended.append(f"gave up at {trio.current_time():.0f}")

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        async with limiter.slot() as held:
            nursery.start_soon(waiter, start + 10.0)
            await trio.sleep(20.0)  # a slow answer in flight, no 429: the wait goes on
            assert ended == []
            limiter.rate_limited(held, None)  # a 429, past the waiter's by: it gives up
            await trio.sleep(0)
            await trio.sleep(0)
        assert ended == [f"gave up at {start + 20:.0f}"]
    ended.clear()
    async with trio.open_nursery() as nursery, limiter.slot() as held:
        nursery.start_soon(waiter, start + 30.0)
        await trio.sleep(1.0)
        limiter.rate_limited(held, None)  # a 429 before by: it gives up at by
        await trio.sleep(40.0)
    assert ended == [f"gave up at {start + 30:.0f}"]
    assert limiter.in_flight == 0


async def test_a_429_storm_to_the_deadline_is_the_judges_endpoint_failure(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    # Cut by its deadline while waiting out the storm, the judge timed out (a 0 for a
    # candidate); a storm's 429s bill nothing, so the usage is not partial either.
    chat_stub.script.rate_limit_count, chat_stub.script.retry_after = 10**6, 2.0
    endpoint = Endpoint("m", base_url=chat_stub.base_url)
    call = _judge_call(tmp_path)
    outcome = await _run(llm_judge(endpoint, RUBRIC), call, 4.0)
    assert outcome.status == "exited" and outcome.exit_code == ENDPOINT_EXIT, outcome.stderr.head
    assert b"rate limited (HTTP 429)" in outcome.stderr.head
    assert "partial" not in _usage(call) and _usage(call)["tokens"] == 0
    chat_stub.script.retry_after = 0.0  # no Retry-After: the call's own backoff
    optimizer = await _run(llm_optimizer(endpoint), _optimizer_call(tmp_path), 4.0)
    assert optimizer.exit_code == ENDPOINT_EXIT, optimizer.stderr.head


async def test_the_canary_goes_past_a_pause_the_outputs_own_429s_made(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    # An endpoint that answers 429 with a Retry-After to a request for its size alone (an
    # output written long on the cases a candidate fails) pauses every call: a canary held
    # back by that pause could not show the output's doing, and those cases were left out.
    chat_stub.script.refuse, chat_stub.script.refuse_status = "LONG OUTPUT", 429
    chat_stub.script.retry_after = 1.0
    call = _judge_call(tmp_path)
    assert call.output_dir is not None
    (call.output_dir / "output.json").write_text('"LONG OUTPUT"')
    outcome = await _run(llm_judge(Endpoint("m", base_url=chat_stub.base_url), RUBRIC), call, 6.0)
    assert outcome.exit_code == 1, outcome.stderr.head
    assert b"the output caused the failure" in outcome.stderr.head


async def test_a_429_storm_on_every_proposal_fails_the_run_naming_the_endpoint(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    # Cut by their deadline, the proposals timed out and the run ended "finished", the
    # campaign "complete", having tried nothing; an optimizer's endpoint down on every call
    # fails the run (paused), naming it.
    from tests.test_llm_hostile import _campaign

    chat_stub.script.rate_limit_count, chat_stub.script.retry_after = 10**6, 1.0
    report: Any = await _campaign(chat_stub, tmp_path, optimizer_timeout=4.0)
    assert report.status == "failed" and report.campaign_status == "paused", report.message
    assert "optimizer's model endpoint failed on every call" in report.message
    assert "rate limited (HTTP 429)" in report.message


def _campaign_flags(tmp_path: Path, stub: ChatStub) -> list[str]:
    paths = write_toy(tmp_path / "toy", {"default": "fix:2"})
    rubric = tmp_path / "rubric.md"
    rubric.write_text("1 when the output equals the expected output\n")
    return [
        *toy_flags(paths, tmp_path / "store", lanes=6), "--judge", "llm:judge-m",
        "--rubric", str(rubric), "--llm-base-url", stub.base_url,
        "--iterations", "1", "--population", "1",
        "--judge-timeout", "3", "--judge-failure-retries", "0",
    ]  # fmt: skip


def _report(store: Path) -> dict[str, Any]:
    (run,) = (store / "runs").iterdir()
    return json.loads((run / "report.json").read_text())


@pytest.mark.parametrize("retry_after", [1.0, pytest.param(0.0, marks=pytest.mark.slow)])
def test_a_429_storm_on_the_candidates_judge_never_rejects_it(
    chat_stub: ChatStub, tmp_path: Path, retry_after: float
) -> None:
    # The storm starts once the seed's 12 val cases are judged: every judgement of the
    # candidate (a better one) is rate limited to its deadline. It ended judge_timed_out,
    # scored 0, and the candidate was rejected; now its units are left out and the
    # coverage guard makes it indecisive. With or without a Retry-After (a pause of every
    # call, or each call's own backoff).
    chat_stub.script.grade = []
    chat_stub.script.rate_limit_after, chat_stub.script.retry_after = 12, retry_after
    done = run_optimize(_campaign_flags(tmp_path, chat_stub))
    assert done.returncode == 0, done.stderr[-2000:]
    report = _report(tmp_path / "store")
    assert [d["decision"] for d in report["decisions"]] == ["indecisive"]
    mine = [f["failure"] for f in report["failures"] if f["where"].endswith(".c")]
    assert mine and {(f["code"], f["owner"]) for f in mine} == {
        ("judge_endpoint_failed", "infrastructure")
    }, report["failures"]
    assert "rate limited (HTTP 429)" in mine[0]["message"]


@pytest.mark.slow
def test_a_429_storm_on_the_seeds_judge_fails_the_run_naming_the_endpoint(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    chat_stub.script.rate_limit_count, chat_stub.script.retry_after = 10**6, 1.0
    done = run_optimize(_campaign_flags(tmp_path, chat_stub))
    assert done.returncode == 1, done.stderr[-2000:]
    report = _report(tmp_path / "store")
    assert report["status"] == "failed" and report["campaign_status"] == "paused"
    assert "judge_endpoint_failed" in report["message"], report["message"]
    assert {f["failure"]["code"] for f in report["failures"]} == {"judge_endpoint_failed"}
