"""The built-in model backends against a real chat-completions server on 127.0.0.1 (the
stub; the SDK is not mocked), run through `run_backend` as a lane runs them."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from evolane.lanes import (
    AdaptiveLimiter,
    BackendCall,
    Endpoint,
    LimiterSettings,
    ModelError,
    chat,
    limiter_snapshot,
    llm_judge,
    llm_optimizer,
    parse_judge_output,
    run_backend,
)
from evolane.lanes._backends import ENDPOINT_EXIT
from evolane.lanes._llm_limit import limiter_for
from evolane.sandbox import ProcessOutcome
from evolane.testing import ChatStub, StubRule

RUBRIC = "Full marks when the answer is the capital of France."
LIMIT = 30.0  # seconds a test may take before it fails (never a timing assertion)


def _judge_call(tmp_path: Path, seed: int = 7) -> BackendCall:
    out = tmp_path / "out"
    out.mkdir(parents=True)
    (out / "output.json").write_text('{"answer": "Paris"}')
    (out / "trace.bin").write_bytes(b"\x00\x01binary")
    return BackendCall(
        role="judge",
        workspace=tmp_path,
        seed=seed,
        case={"id": "c1", "input": "What is the capital of France?"},
        output_dir=out,
        usage_file=tmp_path / "judge-usage.json",
    )


def _optimizer_call(tmp_path: Path) -> BackendCall:
    work, context = tmp_path / "work", tmp_path / "context"
    (work / "skill").mkdir(parents=True)
    (work / "skill" / "SKILL.md").write_text("# Skill\nbe brief\n")
    (work / "logo.png").write_bytes(b"\x89PNG\x00\x00")
    context.mkdir()
    (context / "index.json").write_text('{"failing": ["c1"]}')
    prompt = {"instructions": "Make the skill answer in full sentences.", "iteration": 1}
    return BackendCall(
        role="optimizer",
        workspace=context,
        seed=3,
        workdir=work,
        prompt=prompt,
        context_dir=context,
        usage_file=tmp_path / "usage.json",
    )


async def _run(backend: Any, call: BackendCall, seconds: float = LIMIT) -> ProcessOutcome:
    with trio.fail_after(LIMIT + 5):
        return await run_backend(backend, call, trio.current_time() + seconds, trio.Event())


def _usage(call: BackendCall) -> dict[str, Any]:
    assert call.usage_file is not None
    return orjson.loads(call.usage_file.read_bytes())


def _last_user(body: dict[str, Any]) -> str:
    return [m["content"] for m in body["messages"] if m["role"] == "user"][-1]


async def _until(condition: Any) -> None:
    with trio.fail_after(LIMIT):
        while not condition():
            await trio.sleep(0.01)


async def test_the_judge_scores_and_meters_its_usage(chat_stub: ChatStub, tmp_path: Path) -> None:
    script = chat_stub.script
    script.default_content = '```json\n{"score": 0.75, "reason": "right city"}\n```'
    script.prompt_tokens, script.completion_tokens, script.cached_tokens = 100, 20, 30
    call = _judge_call(tmp_path)
    outcome = await _run(llm_judge(Endpoint("judge-m", base_url=chat_stub.base_url), RUBRIC), call)
    assert outcome.ok, outcome.stderr.head
    verdict = parse_judge_output(outcome.stdout.head)
    assert verdict.score == 0.75 and verdict.failure is None
    assert orjson.loads(outcome.stdout.head)["reason"] == "right city"
    assert _usage(call) == {
        "model": "judge-m",
        "input_tokens": 100,
        "output_tokens": 20,
        "cached_input_tokens": 30,
        "tokens": 120,
        "cached": False,
    }
    (body,) = chat_stub.stats.bodies
    assert body["model"] == "judge-m" and isinstance(body["seed"], int)
    asked = _last_user(body)
    assert RUBRIC in asked and "capital of France" in asked and '"answer": "Paris"' in asked
    assert "trace.bin" in asked and "not shown" in asked  # binary output listed, not sent


async def test_samples_are_averaged_and_a_rerun_is_served_from_the_cache(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    chat_stub.script.contents = [f'{{"score": {s}, "reason": "r{s}"}}' for s in (0.2, 0.6, 1.0)]
    endpoint = Endpoint("m", base_url=chat_stub.base_url, cache_dir=tmp_path / "cache")
    judge = llm_judge(endpoint, RUBRIC, samples=3)
    call = _judge_call(tmp_path / "first")
    outcome = await _run(judge, call)
    assert outcome.ok, outcome.stderr.head
    verdict = orjson.loads(outcome.stdout.head)
    assert verdict["score"] == pytest.approx(0.6) and verdict["samples"] == 3
    assert chat_stub.stats.requests == 3
    assert len({body["seed"] for body in chat_stub.stats.bodies}) == 3  # not one sample thrice
    assert _usage(call)["tokens"] == 45 and _usage(call)["cached"] is False

    again = _judge_call(tmp_path / "again")  # same case, output and seed
    outcome = await _run(judge, again)
    assert orjson.loads(outcome.stdout.head)["score"] == pytest.approx(0.6)
    assert chat_stub.stats.requests == 3  # nothing asked
    assert _usage(again) == {
        "model": "m",
        "input_tokens": 0,
        "output_tokens": 0,
        "cached_input_tokens": 0,
        "tokens": 0,
        "cached": True,
    }
    entries = list((tmp_path / "cache").rglob("*"))
    assert len([p for p in entries if p.suffix == ".json"]) == 3
    assert not [p for p in entries if p.name.endswith(".tmp")]


async def test_a_malformed_verdict_is_asked_again(chat_stub: ChatStub, tmp_path: Path) -> None:
    chat_stub.script.contents = ["I think it is good.", '{"score": 2}', '{"score": 0.5}']
    call = _judge_call(tmp_path)
    endpoint = Endpoint("m", base_url=chat_stub.base_url, cache_dir=tmp_path / "cache")
    outcome = await _run(llm_judge(endpoint, RUBRIC), call)
    assert orjson.loads(outcome.stdout.head)["score"] == 0.5
    assert chat_stub.stats.requests == 3
    assert _usage(call)["tokens"] == 45  # the rejected answers cost tokens too
    assert len(list((tmp_path / "cache").rglob("*.json"))) == 1  # only the valid one is kept


async def test_a_judge_that_never_answers_validly_fails_and_meters(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    chat_stub.script.default_content = '{"reason": "no score here"}'
    call = _judge_call(tmp_path)
    outcome = await _run(llm_judge(Endpoint("m", base_url=chat_stub.base_url), RUBRIC), call)
    assert outcome.status == "exited" and outcome.exit_code == 1  # a failure, never a score
    assert outcome.stdout.total_bytes == 0
    assert b"MalformedVerdictError" in outcome.stderr.head
    assert b"no valid verdict in 3 answers" in outcome.stderr.head
    assert chat_stub.stats.requests == 3
    assert _usage(call)["tokens"] == 45


async def test_a_429_storm_shrinks_the_limit_and_it_recovers(chat_stub: ChatStub) -> None:
    chat_stub.script.rate_limit_count = 12
    endpoint = Endpoint("m", base_url=chat_stub.base_url, initial_concurrency=8)
    messages = [{"role": "user", "content": "hi"}]
    answers: list[str] = []

    async def ask(index: int) -> None:
        answer = await chat(endpoint, messages, seed=1, sample=index, deadline=math.inf)
        answers.append(answer.text)

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            for index in range(32):
                nursery.start_soon(ask, index)
        limiter = limiter_for(endpoint.key, LimiterSettings())  # the endpoint's, made by chat
        low = min(limiter.history)
        assert low < 8 and chat_stub.stats.rate_limited == 12
        limit = trio.CapacityLimiter(8)

        async def paced(index: int) -> None:
            async with limit:
                await ask(index)

        async with trio.open_nursery() as nursery:
            for index in range(32, 132):
                nursery.start_soon(paced, index)
    assert len(answers) == 132
    history = list(limiter.history)
    assert history[0] == 8 and history.index(low) > 0
    assert history[-1] >= 8  # grown back after the storm
    assert chat_stub.stats.max_in_flight <= 8
    assert limiter_snapshot()[endpoint.key]["rate_limited"] == 12


async def test_a_hanging_endpoint_is_cut_by_the_deadline(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    chat_stub.script.hang = True
    call = _judge_call(tmp_path)
    outcome = await _run(llm_judge(Endpoint("m", base_url=chat_stub.base_url), RUBRIC), call, 1.0)
    # cut before the deadline, and its canary too: the endpoint's failure (test_llm_judge_hang)
    assert outcome.status == "exited" and outcome.exit_code == ENDPOINT_EXIT, outcome.stderr.head
    await _until(lambda: chat_stub.stats.disconnects == 2 and chat_stub.stats.in_flight == 0)

    with pytest.raises(ModelError, match="no answer from m by the deadline"):  # no outer scope
        with trio.fail_after(LIMIT):
            await chat(
                Endpoint("m", base_url=chat_stub.base_url),
                [{"role": "user", "content": "hi"}],
                seed=0,
                sample=0,
                deadline=trio.current_time() + 0.3,
            )
    await _until(lambda: chat_stub.stats.disconnects == 3)


async def test_a_cancel_ends_the_call_in_flight(chat_stub: ChatStub, tmp_path: Path) -> None:
    chat_stub.script.hang = True
    endpoint = Endpoint("m", base_url=chat_stub.base_url)
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: chat(
                    endpoint,
                    [{"role": "user", "content": "x"}],
                    seed=0,
                    sample=0,
                    deadline=math.inf,
                )
            )
            await _until(lambda: chat_stub.stats.in_flight == 1)
            nursery.cancel_scope.cancel()
    await _until(lambda: chat_stub.stats.disconnects == 1 and chat_stub.stats.in_flight == 0)
    assert limiter_snapshot()[endpoint.key]["in_flight"] == 0

    stop = trio.Event()  # the lane's stop event does the same through run_backend
    call = _judge_call(tmp_path)
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _stop_when_in_flight(chat_stub, stop))
            outcome = await run_backend(
                llm_judge(endpoint, RUBRIC), call, trio.current_time() + LIMIT, stop
            )
    assert outcome.status == "cancelled"
    await _until(lambda: chat_stub.stats.disconnects == 2)


async def _stop_when_in_flight(stub: ChatStub, stop: trio.Event) -> None:
    await _until(lambda: stub.stats.in_flight == 1)
    stop.set()


EDITS = """SUMMARY: answer in full sentences
=== EDIT: skill/SKILL.md ===
<<<<<<< SEARCH
be brief
=======
answer in full sentences
>>>>>>> REPLACE
=== END EDIT ===
=== FILE: skill/examples.md ===
Q: capital of France? A: The capital of France is Paris.
=== END FILE ===
"""


async def test_the_optimizer_applies_the_edits(chat_stub: ChatStub, tmp_path: Path) -> None:
    chat_stub.script.rules = [StubRule(match="Make the skill answer", content=EDITS)]
    call = _optimizer_call(tmp_path)
    outcome = await _run(llm_optimizer(Endpoint("opt-m", base_url=chat_stub.base_url)), call)
    assert outcome.ok, outcome.stderr.head
    assert outcome.stdout.head == b"answer in full sentences\n"
    assert call.workdir is not None
    assert (
        call.workdir / "skill" / "SKILL.md"
    ).read_text() == "# Skill\nanswer in full sentences\n"
    assert "Paris" in (call.workdir / "skill" / "examples.md").read_text()
    assert _usage(call)["model"] == "opt-m" and _usage(call)["tokens"] == 15
    (body,) = chat_stub.stats.bodies
    asked = _last_user(body)
    assert "--- file: skill/SKILL.md ---\n# Skill\nbe brief" in asked
    assert "logo.png" in asked and "not shown" in asked
    assert "index.json" in asked  # the context folder
    assert "=== END FILE ===" in body["messages"][0]["content"]  # the format is told


@pytest.mark.parametrize(
    ("path", "why"),
    [("../outside.md", "'..'"), ("/tmp/abs.md", "absolute"), ("link.md", "symlink")],
)
async def test_a_refused_edit_is_shown_once_then_fails_the_proposal(
    chat_stub: ChatStub, tmp_path: Path, path: str, why: str
) -> None:
    chat_stub.script.default_content = f"SUMMARY: x\n=== FILE: {path} ===\nevil\n=== END FILE ===\n"
    call = _optimizer_call(tmp_path)
    assert call.workdir is not None
    (tmp_path / "target.md").write_text("keep\n")
    (call.workdir / "link.md").symlink_to(tmp_path / "target.md")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    outcome = await _run(llm_optimizer(Endpoint("m", base_url=chat_stub.base_url)), call)
    assert outcome.exit_code == 1
    assert b"EditError" in outcome.stderr.head and why.encode() in outcome.stderr.head
    assert f"edit 1 (whole file {path!r}".encode() in outcome.stderr.head
    _, second = chat_stub.stats.bodies
    assert "Nothing was applied: edit 1" in _last_user(second)
    assert (tmp_path / "target.md").read_text() == "keep\n"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.name != "usage.json") == before
    assert _usage(call)["tokens"] == 30  # both answers metered


async def test_a_missing_key_for_a_remote_endpoint_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("EVOLANE_TEST_NO_KEY", raising=False)
    endpoint = Endpoint(
        "m", base_url="https://models.invalid/v1", api_key_env="EVOLANE_TEST_NO_KEY"
    )
    with pytest.raises(ModelError, match="EVOLANE_TEST_NO_KEY is not set"):
        await chat(endpoint, [{"role": "user", "content": "x"}], seed=0, sample=0, deadline=1e9)


async def test_without_the_extra_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, chat_stub: ChatStub
) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)
    endpoint = Endpoint("m", base_url=chat_stub.base_url)
    with pytest.raises(ModelError, match=r"pip install 'evolane\[llm\]'"):
        await chat(endpoint, [{"role": "user", "content": "x"}], seed=0, sample=0, deadline=1e9)


async def test_the_stub_runs_as_a_process(tmp_path: Path) -> None:
    script = {"rules": [{"match": "ping", "content": "pong"}], "prompt_tokens": 3}
    (tmp_path / "script.json").write_bytes(orjson.dumps(script))
    port_file, record = tmp_path / "port", tmp_path / "requests.jsonl"
    argv = [sys.executable, "-m", "evolane.testing._chat_stub", "--port-file", str(port_file)]
    argv += ["--script", str(tmp_path / "script.json"), "--record", str(record)]
    process = subprocess.Popen(argv)
    try:
        await _until(port_file.exists)
        endpoint = Endpoint("m", base_url=f"http://127.0.0.1:{port_file.read_text()}/v1")
        with trio.fail_after(LIMIT):
            answer = await chat(
                endpoint, [{"role": "user", "content": "ping?"}], seed=0, sample=0, deadline=1e9
            )
        assert answer.text == "pong" and answer.usage["input_tokens"] == 3
        (line,) = record.read_text().splitlines()
        assert orjson.loads(line)["body"]["model"] == "m"
    finally:
        process.terminate()
        process.wait(timeout=LIMIT)
    assert process.returncode == 0


async def test_a_transient_failure_is_retried_and_a_bad_request_is_not(
    chat_stub: ChatStub,
) -> None:
    messages = [{"role": "user", "content": "x"}]
    chat_stub.script.fail_count = 2  # two 500s, then an answer
    answer = await chat(
        Endpoint("m", base_url=chat_stub.base_url, retries=2),
        messages,
        seed=0,
        sample=0,
        deadline=trio.current_time() + LIMIT,
    )
    assert answer.usage["tokens"] == 15 and chat_stub.stats.requests == 3
    chat_stub.script.fail_count, chat_stub.script.fail_status = 5, 503
    with pytest.raises(ModelError, match=r"failed \(HTTP 503\)"):
        await chat(
            Endpoint("m", base_url=chat_stub.base_url, retries=1),
            messages,
            seed=0,
            sample=1,
            deadline=trio.current_time() + LIMIT,
        )
    assert chat_stub.stats.requests == 5
    chat_stub.script.fail_count, chat_stub.script.fail_status = 1, 400
    with pytest.raises(ModelError, match=r"failed \(HTTP 400\)"):
        await chat(
            Endpoint("m", base_url=chat_stub.base_url),
            messages,
            seed=0,
            sample=2,
            deadline=trio.current_time() + LIMIT,
        )
    assert chat_stub.stats.requests == 6  # not retried


async def test_the_limiter_halves_once_per_window_and_honours_retry_after() -> None:
    limiter = AdaptiveLimiter("unit", LimiterSettings(initial=8, maximum=9, minimum=1))
    async with limiter.slot() as first, limiter.slot() as second:
        assert limiter.in_flight == 2
        limiter.rate_limited(first, None)
        limiter.rate_limited(second, None)  # admitted before the decrease: no second halving
    assert list(limiter.history) == [8, 4]
    for _ in range(4):
        limiter.succeeded()
    assert limiter.limit == 5
    async with limiter.slot() as third:
        limiter.rate_limited(third, 30.0)  # Retry-After: 30 s
    assert limiter.limit == 2 and limiter.snapshot()["paused_for"] > 0
    with trio.move_on_after(0.2) as waited:
        async with limiter.slot():
            pass
    assert waited.cancelled_caught  # a new caller waits for the pause (far longer than 0.2 s)
    assert limiter.in_flight == 0
    limiter.resume_at = 0.0
    async with limiter.slot(), limiter.slot():
        with trio.move_on_after(0.2) as full:
            async with limiter.slot():
                pass
        assert full.cancelled_caught  # a third caller waits while the limit is 2


async def test_a_campaign_runs_on_the_model_backends(chat_stub: ChatStub, tmp_path: Path) -> None:
    """End to end through the embedding API: the stub's optimizer answer fixes every val case
    (whole files), its judge gives 1 to an output of "yes" and 0 otherwise."""
    import evolane
    from evolane.embed import Backends, OptimizeRequest
    from tests.campaign_helpers import toy_config, write_toy

    paths = write_toy(tmp_path, {})
    fixes = "".join(_file_block(f"val{index:02d}", '"yes"') for index in range(12))
    chat_stub.script.rules = [
        StubRule(match="--- file: REQUIRED", content=f"SUMMARY: all yes\n{fixes}"),
        StubRule(match='output.json ---\n"yes"', content='{"score": 1, "reason": "yes"}'),
        StubRule(match="output.json ---", content='{"score": 0, "reason": "no"}'),
    ]
    endpoint = Endpoint("m", base_url=chat_stub.base_url)
    config = toy_config(paths, judge="backend:llm", optimizer="backend:llm", iterations=1)
    backends = Backends(
        judge=llm_judge(endpoint, "1 when the output is yes"), optimizer=llm_optimizer(endpoint)
    )
    with trio.fail_after(120):
        async with evolane.open_runtime(store=paths["store"]) as runtime:
            report = await runtime.optimize(OptimizeRequest(config=config), backends=backends)
    assert report.status == "finished"
    assert report.scores.best_val is not None and report.scores.baseline_val is not None
    assert report.scores.best_val.mean > report.scores.baseline_val.mean
    assert [f.optimizer for f in report.funnel] == ["all yes"] * len(report.funnel)


def _file_block(path: str, content: str) -> str:
    return f"=== FILE: {path} ===\n{content}\n=== END FILE ===\n"


def _stub_answers(monkeypatch: pytest.MonkeyPatch, change: Any) -> None:
    """Let ``change(completion, script)`` alter each answer the stub sends (the real server,
    its answer edited: e.g. no ``usage`` field, or hang from then on)."""
    from evolane.testing import _chat_stub

    made = _chat_stub._completion

    def edited(body: dict[str, Any], content: str, script: Any) -> dict[str, Any]:
        completion = made(body, content, script)
        change(completion, script)
        return completion

    monkeypatch.setattr(_chat_stub, "_completion", edited)


async def test_an_answer_without_usage_is_metered_by_its_text_never_as_zero(
    chat_stub: ChatStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by review: metered as unknown, usage-less answers were charged 0 (no reservation
    # existed without a complete sample), and no token or dollar ceiling ever stopped a run.
    from evolane.inputs import PriceTable, read_usage_document

    def drop(completion: dict[str, Any], script: Any) -> None:
        said = completion["choices"][0]["message"]["content"]
        if "no usage" in said:
            del completion["usage"]
        elif "lies" in said:
            completion["usage"] = {"prompt_tokens": -100, "completion_tokens": 10**18}

    _stub_answers(monkeypatch, drop)
    answer_text = '{"score": 1, "reason": "no usage"}'
    chat_stub.script.contents = [answer_text, '{"score": 0.5}']
    endpoint = Endpoint("m", base_url=chat_stub.base_url)
    answer = await chat(
        endpoint, [{"role": "user", "content": "x" * 30}], seed=0, sample=0, deadline=1e9
    )
    inputs, outputs = 10 + 4, -(-len(answer_text) // 3)  # bytes / 3, the message's overhead
    assert answer.usage["input_tokens"] == inputs and answer.usage["output_tokens"] == outputs
    assert answer.usage["estimated"] is True and "partial" not in answer.usage
    prices = PriceTable.model_validate({"models": {"m": {"input": 1.0, "output": 1.0}}})
    reading = read_usage_document(answer.usage, prices)
    assert reading.complete and reading.tokens == inputs + outputs and reading.cost_usd

    chat_stub.script.contents = ['{"score": 1, "reason": "lies"}']
    lied = await chat(endpoint, [{"role": "user", "content": "x"}], seed=1, sample=0, deadline=1e9)
    assert lied.usage["estimated"] is True and lied.usage["input_tokens"] == 5

    chat_stub.script.contents = [answer_text, '{"score": 0.5}']
    call = _judge_call(tmp_path)
    outcome = await _run(llm_judge(endpoint, RUBRIC, samples=2), call)
    assert outcome.ok, outcome.stderr.head
    usage = _usage(call)
    assert usage["tokens"] > 15 and "partial" not in usage  # the other answer's 15 and more
    assert usage["estimated"] is True  # the sum says some of it was estimated


@pytest.mark.parametrize(("prompt", "completion"), [(0, 0), (0, 7), (12, 0)])
async def test_an_answer_reporting_zero_tokens_is_metered_by_its_text(
    chat_stub: ChatStub, prompt: int, completion: int
) -> None:
    # Found by review: a server (or a proxy) reporting zeros was charged $0 a call, and no
    # cost ceiling ever stopped the run: no request is 0 tokens, nor is any text.
    chat_stub.script.prompt_tokens, chat_stub.script.completion_tokens = prompt, completion
    endpoint = Endpoint("m", base_url=chat_stub.base_url)
    answer = await chat(
        endpoint, [{"role": "user", "content": "x" * 30}], seed=0, sample=0, deadline=1e9
    )
    assert answer.usage["estimated"] is True
    assert answer.usage["input_tokens"] == 10 + 4  # bytes / 3, the message's overhead
    assert answer.usage["output_tokens"] == -(-len(answer.text) // 3) > 0


async def test_a_call_cut_off_or_failed_makes_the_usage_partial(
    chat_stub: ChatStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from evolane.inputs import read_usage_document

    def hang_after(completion: dict[str, Any], script: Any) -> None:
        script.hang = True  # this answer is sent; the next request hangs

    _stub_answers(monkeypatch, hang_after)
    chat_stub.script.contents = ["not a verdict"]  # answered, then asked again: no answer
    call = _judge_call(tmp_path / "judge")
    endpoint = Endpoint("m", base_url=chat_stub.base_url)
    outcome = await _run(llm_judge(endpoint, RUBRIC), call, 1.0)
    assert outcome.exit_code == ENDPOINT_EXIT  # its canary hangs too: the endpoint's failure
    usage = _usage(call)  # the answer's 10 + 5, and at least the input of the request cut off
    assert usage["output_tokens"] == 5 and usage["partial"] is True
    assert usage["input_tokens"] >= 10 + 100 and usage["tokens"] == usage["input_tokens"] + 5
    assert not read_usage_document(_usage(call), None).complete

    chat_stub.script.hang = False
    chat_stub.script.default_content = "SUMMARY: x\n=== FILE: ../out ===\nx\n=== END FILE ===\n"
    call = _optimizer_call(tmp_path / "optimizer")
    outcome = await _run(llm_optimizer(endpoint), call, 1.0)
    assert outcome.exit_code == ENDPOINT_EXIT  # its probe hangs too: the endpoint's failure
    assert _usage(call)["tokens"] > 15 and _usage(call)["partial"] is True

    chat_stub.script.hang = False
    chat_stub.script.fail_count, chat_stub.script.fail_status = 1, 400  # sent, then refused
    call = _judge_call(tmp_path / "refused")
    outcome = await _run(llm_judge(endpoint, RUBRIC), call)
    assert outcome.exit_code == 1 and b"HTTP 400" in outcome.stderr.head  # content's: not 75
    refused = _usage(call)  # the request's input, no answer
    assert refused["partial"] is True and refused["input_tokens"] > 0
    assert "output_tokens" not in refused


async def test_429s_without_retry_after_back_off(chat_stub: ChatStub) -> None:
    chat_stub.script.rate_limit_count = 10**6
    chat_stub.script.retry_after = 0.0  # "Retry-After: 0": no pause from the server
    endpoint = Endpoint("m", base_url=chat_stub.base_url)
    with pytest.raises(ModelError, match="by the deadline"), trio.fail_after(LIMIT):
        await chat(
            endpoint,
            [{"role": "user", "content": "x"}],
            seed=0,
            sample=0,
            deadline=trio.current_time() + 1.0,
        )
    assert 2 <= chat_stub.stats.requests <= 10  # backed off: not ~100 in a second


async def test_the_credentials_of_a_base_url_never_show_in_messages(
    chat_stub: ChatStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = chat_stub.base_url.replace("http://", "http://user:s3cret@")
    chat_stub.script.fail_count, chat_stub.script.fail_status = 1, 400
    endpoint = Endpoint("m", base_url=url)
    with pytest.raises(ModelError) as caught:
        await chat(endpoint, [{"role": "user", "content": "x"}], seed=0, sample=0, deadline=1e9)
    assert "s3cret" not in str(caught.value) and "127.0.0.1" in str(caught.value)
    assert chat_stub.stats.requests == 1
    assert not [key for key in limiter_snapshot() if "s3cret" in key]

    monkeypatch.delenv("EVOLANE_TEST_NO_KEY", raising=False)
    remote = Endpoint(
        "m", base_url="https://t0ken:s3cret@models.invalid/v1", api_key_env="EVOLANE_TEST_NO_KEY"
    )
    with pytest.raises(ModelError, match="EVOLANE_TEST_NO_KEY is not set") as caught:
        await chat(remote, [{"role": "user", "content": "x"}], seed=0, sample=0, deadline=1e9)
    assert "s3cret" not in str(caught.value) and "t0ken" not in str(caught.value)


async def test_the_cache_tells_apart_the_servers_openai_base_url_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: without a base URL every answer was cached under "sdk-default", so
    once ``OPENAI_BASE_URL`` named another server, a rerun was served the first one's."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    endpoint = Endpoint("m", cache_dir=tmp_path / "cache")  # no base URL: the SDK's
    scores = []
    with ChatStub() as first, ChatStub() as second:
        first.script.contents = ['{"score": 0.25, "reason": "first"}']
        second.script.contents = ['{"score": 0.75, "reason": "second"}']
        for stub in (first, second, first):
            monkeypatch.setenv("OPENAI_BASE_URL", stub.base_url)
            call = _judge_call(tmp_path / f"call{len(scores)}")
            outcome = await _run(llm_judge(endpoint, RUBRIC), call)
            assert outcome.ok, outcome.stderr.head
            scores.append(orjson.loads(outcome.stdout.head)["score"])
        assert scores == [0.25, 0.75, 0.25]
        assert first.stats.requests == 1 and second.stats.requests == 1  # the last: cached
