"""Every request the model backends send is metered, against the server's own log (a real
HTTP server on 127.0.0.1; the SDK is not mocked): a request retried after a 5xx or cut at
its timeout counts its input like the last one, a 429 (refused unread) counts nothing; and
the estimate counts the model requests of a judge that samples its model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from evolane.lanes import Endpoint, llm_judge
from evolane.lanes._llm_usage import request_tokens
from evolane.testing import ChatStub
from tests.campaign_helpers import toy_flags, write_toy
from tests.test_llm_backends import RUBRIC, _judge_call, _run, _usage


def run_cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``evolane ARGS`` in a subprocess (a guard against a hang, not a timing figure)."""
    return subprocess.run(
        [sys.executable, "-m", "evolane", *args], capture_output=True, text=True, timeout=300
    )


def _inputs(stub: ChatStub, unanswered: int) -> int:
    """The input estimate of the first ``unanswered`` requests the server logged."""
    return sum(request_tokens(body) for body in stub.stats.bodies[:unanswered])


async def test_a_retried_request_is_metered_like_the_last_one(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    # Found by review: two 500s then an answer were charged the answer alone, and three
    # requests cut at --llm-timeout one request's input: a provider bills a request cut
    # after it was sent, and a run spent past its ceilings uncounted.
    chat_stub.script.fail_count = 2  # two 500s, then an answer (10 + 5 tokens)
    endpoint = Endpoint("m", base_url=chat_stub.base_url, retries=2)
    call = _judge_call(tmp_path / "retried")
    outcome = await _run(llm_judge(endpoint, RUBRIC), call)
    assert outcome.ok, outcome.stderr.head
    assert chat_stub.stats.requests == 3
    usage = _usage(call)
    assert usage["partial"] is True and usage["output_tokens"] == 5
    assert usage["input_tokens"] == 10 + _inputs(chat_stub, 2)

    chat_stub.stats.bodies.clear()
    chat_stub.script.latency = 5.0  # each request cut at its timeout, asked again twice
    endpoint = Endpoint("m", base_url=chat_stub.base_url, retries=2, timeout=0.3)
    call = _judge_call(tmp_path / "cut")
    outcome = await _run(llm_judge(endpoint, RUBRIC), call)
    # and the canary (the judgement without the output) too, cut and asked again twice
    assert not outcome.ok and len(chat_stub.stats.bodies) == 6
    usage = _usage(call)
    assert usage["partial"] is True and usage["input_tokens"] == _inputs(chat_stub, 6)


async def test_a_429_is_not_metered(chat_stub: ChatStub, tmp_path: Path) -> None:
    chat_stub.script.rate_limit_count, chat_stub.script.retry_after = 3, 0.01
    call = _judge_call(tmp_path)
    outcome = await _run(llm_judge(Endpoint("m", base_url=chat_stub.base_url), RUBRIC), call)
    assert outcome.ok, outcome.stderr.head
    assert chat_stub.stats.requests == 4
    assert _usage(call)["tokens"] == 15 and "partial" not in _usage(call)


def test_the_estimate_counts_the_model_judges_samples(tmp_path: Path) -> None:
    # Found by review: "84 judge calls" for a judge asking its model 5 times a call.
    paths = write_toy(tmp_path, {})
    rubric = tmp_path / "rubric.md"
    rubric.write_text("1 when the output is the expected one\n")
    flags = [
        "estimate", *toy_flags(paths, tmp_path / "store"), "--judge", "llm:judge-m",
        "--rubric", str(rubric), "--llm-base-url", "http://127.0.0.1:9/v1",
        "--iterations", "1", "--population", "1", "--judge-samples", "5",
    ]  # fmt: skip
    done = run_cli(flags)
    assert done.returncode == 0, done.stderr
    calls = json.loads(run_cli([*flags, "--json"]).stdout)["judge_calls_max"]
    assert f"{calls} judge calls x 5 samples = {calls * 5} model requests" in done.stdout
