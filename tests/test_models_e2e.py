"""Models in the loop through the real CLI against a real chat-completions server on
127.0.0.1 (`evolane.testing.ChatStub`, in this process; ``evolane`` runs as a subprocess):
the built-in optimizer and judge improve the self-evolution example, their spend is metered by
role and priced, the API key is never stored, a cached run reproduces its decisions without a
call, a SIGKILL then ``--resume`` pays no finished call twice, a hanging endpoint is cut by the
judge's deadline and Ctrl-C ends the calls in flight."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from evolane.testing._chat_stub import ChatStub, StubRule
from tests.campaign_helpers import toy_flags, write_toy

pytest.importorskip("openai")

EVOLANE = [sys.executable, "-m", "evolane"]
SECRET = "sk-test-NEVER-STORED-7f3a"
PROMPT_TOKENS, COMPLETION_TOKENS = 1000, 50
PRICES = {"opt-m": {"input": 2.0, "output": 8.0}, "judge-m": {"input": 0.5, "output": 1.0}}
EDIT = """SUMMARY: stricter rules, each with its reason
=== EDIT: skill/SKILL.md ===
<<<<<<< SEARCH
- when injection: none
=======
- when injection: none (injection)
- when preference_contradicted: none (contradicted)
>>>>>>> REPLACE
<<<<<<< SEARCH
- when known_skill: refine
=======
- when fix_verified: refine (fixed)
- when rollback_verified: refine (rollback)
>>>>>>> REPLACE
<<<<<<< SEARCH
- when successes_any >= 1: create
=======
- when successes_verified >= 2: create (repeated)
>>>>>>> REPLACE
<<<<<<< SEARCH
- when preference: memory
=======
- when unverified >= 1: none (unverified)
- when preference_confirmed: memory (preference)
>>>>>>> REPLACE
<<<<<<< SEARCH
- otherwise: none
=======
- otherwise: none (one-off)
>>>>>>> REPLACE
=== END EDIT ===
"""


def _script(stub: ChatStub) -> None:
    """The stub as a model that proposes the helpful edit and judges by the decision."""
    script = stub.script
    script.rules = [StubRule(match="--- file: skill/SKILL.md", content=EDIT)]
    script.grade = ["action"]
    script.prompt_tokens, script.completion_tokens = PROMPT_TOKENS, COMPLETION_TOKENS


def _flags(tmp_path: Path, stub: ChatStub, store: str = "st", *extra: str) -> list[str]:
    rubric = tmp_path / "rubric.md"
    rubric.write_text("Score 1 when the decided action is the expected one, else 0.\n")
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps(PRICES))
    return [
        "optimize", "--example", "self-evolution", "--example-dir", str(tmp_path / "ex"),
        "--store", str(tmp_path / store), "--optimizer", "llm:opt-m", "--judge", "llm:judge-m",
        "--rubric", str(rubric), "--llm-base-url", stub.base_url,
        "--llm-api-key-env", "EVOLANE_TEST_KEY", "--prices", str(prices),
        "--max-cost-usd", "50", "--iterations", "1", "--population", "1", "--progress", "none",
        *extra,
    ]  # fmt: skip


def _toy_flags(tmp_path: Path, stub: ChatStub, store: str, *extra: str) -> list[str]:
    """The toy campaign (12 val cases answering "yes" or "no") with the built-in optimizer,
    whose scripted answer turns every val case to "yes", and the built-in judge grading by
    exact match."""
    paths = write_toy(tmp_path / f"{store}-toy", {})
    fixes = "".join(f'=== FILE: val{i:02d} ===\n"yes"\n=== END FILE ===\n' for i in range(12))
    stub.script.rules = [StubRule(match="--- file: REQUIRED", content=f"SUMMARY: all yes\n{fixes}")]
    stub.script.grade = []
    flags = toy_flags(paths, tmp_path / store)
    flags[flags.index("--optimizer") + 1] = "llm:opt-m"
    rubric = tmp_path / "rubric.md"
    rubric.write_text("1 when the output is the expected one\n")
    return [
        "optimize", *flags, "--judge", "llm:judge-m", "--rubric", str(rubric),
        "--llm-base-url", stub.base_url, "--iterations", "2", *extra,
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "EVOLANE_TEST_KEY": SECRET}


def _run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EVOLANE, *args], capture_output=True, text=True, timeout=timeout, env=_env()
    )


def _reports(store: Path) -> list[dict[str, Any]]:
    runs = sorted((store / "runs").iterdir())
    return [json.loads((run / "report.json").read_text()) for run in runs]


def _judge_requests(stub: ChatStub) -> list[dict[str, Any]]:
    return [b for b in stub.stats.bodies if "The case:" in b["messages"][-1]["content"]]


def test_the_built_in_optimizer_and_judge_improve_the_example_and_meter_by_role(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    _script(chat_stub)
    done = _run(_flags(tmp_path, chat_stub))
    assert done.returncode == 0, done.stderr
    (report,) = _reports(tmp_path / "st")
    scores = report["scores"]
    assert scores["best_val"]["mean"] > scores["baseline_val"]["mean"]
    assert report["selected"] is not None
    assert report["funnel"][0]["optimizer"] == "stricter rules, each with its reason"
    by_role = report["budget"]["spent_by_role"]
    asked = len(chat_stub.stats.bodies)
    judged = len(_judge_requests(chat_stub))
    proposals = asked - judged
    assert proposals >= 1 and judged >= 32
    per_call = PROMPT_TOKENS + COMPLETION_TOKENS
    assert by_role["optimizer"]["tokens"] == proposals * per_call
    assert by_role["judge"]["tokens"] == judged * per_call
    judge_call = (PROMPT_TOKENS * 0.5 + COMPLETION_TOKENS * 1.0) / 1e6
    assert by_role["judge"]["cost_usd"] == pytest.approx(judged * judge_call)
    optimizer_call = (PROMPT_TOKENS * 2.0 + COMPLETION_TOKENS * 8.0) / 1e6
    assert by_role["optimizer"]["cost_usd"] == pytest.approx(proposals * optimizer_call)
    for path in (tmp_path / "st").rglob("*"):  # the key is read at call time, never stored
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_a_cached_run_reproduces_its_decisions_without_a_call(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    flags = _toy_flags(tmp_path, chat_stub, "st", "--llm-cache")
    first = _run(flags)
    assert first.returncode == 0, first.stderr
    asked = chat_stub.stats.requests
    second = _run(flags)
    assert second.returncode == 0, second.stderr
    assert chat_stub.stats.requests == asked  # every answer from the cache
    one, two = _reports(tmp_path / "st")
    assert [d["decision"] for d in two["decisions"]] == [d["decision"] for d in one["decisions"]]
    assert two["scores"] == one["scores"]
    cached = two["budget"]["cached"]
    assert cached["judge"] >= 12 and cached["optimizer"] >= 1
    assert one["selected"] is not None  # the scripted edit was accepted
    assert two["budget"]["spent_by_role"]["judge"]["tokens"] == 0  # cached answers are free


def test_a_resume_after_sigkill_pays_no_finished_call_twice(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    """The same run twice: once whole, once SIGKILLed mid-measurement and resumed. Decisions
    do not depend on timing, so the second asks the model at most for the calls that were in
    flight at the kill more than the first."""
    whole = _run(_toy_flags(tmp_path, chat_stub, "whole"))
    assert whole.returncode == 0, whole.stderr
    calls_whole = chat_stub.stats.requests
    chat_stub.script.latency = 0.05
    flags = _toy_flags(tmp_path, chat_stub, "killed")
    process = subprocess.Popen([*EVOLANE, *flags], env=_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while chat_stub.stats.requests < calls_whole + 12 and process.poll() is None:
            assert time.monotonic() < deadline, "the run made no progress"
            time.sleep(0.02)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    (run_id,) = os.listdir(tmp_path / "killed" / "runs")
    resumed = _run(["optimize", "--resume", run_id, "--store", str(tmp_path / "killed"),
                    "--progress", "none"])  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    calls_killed = chat_stub.stats.requests - calls_whole
    in_flight_at_kill = 2 + 2  # judge lanes x samples, plus the two optimizer slots
    assert calls_whole <= calls_killed <= calls_whole + in_flight_at_kill
    first, second = _reports(tmp_path / "whole")[0], _reports(tmp_path / "killed")[0]
    assert [d["decision"] for d in second["decisions"]] == [
        d["decision"] for d in first["decisions"]
    ]


def test_a_hanging_endpoint_is_cut_by_the_judge_deadline(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    flags = _toy_flags(tmp_path, chat_stub, "st", "--judge-timeout", "2")
    chat_stub.script.hang = True  # the judge's model never answers, nor its canary
    flags += ["--judge-failure-retries", "0"]
    done = _run(flags)
    assert done.returncode == 1, done.stderr  # nothing could be scored: the run failed
    (report,) = _reports(tmp_path / "st")
    assert report["status"] == "failed" and "judge_endpoint_failed" in report["message"]
    assert chat_stub.stats.disconnects >= 1  # the call was ended, not left hanging


def test_ctrl_c_ends_the_model_calls_in_flight(chat_stub: ChatStub, tmp_path: Path) -> None:
    flags = _toy_flags(tmp_path, chat_stub, "st")
    chat_stub.script.hang = True
    process = subprocess.Popen([*EVOLANE, *flags], env=_env())
    try:
        deadline = time.monotonic() + 120
        while chat_stub.stats.in_flight == 0:
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 130
    finally:
        if process.poll() is None:
            process.kill()
    deadline = time.monotonic() + 30
    while chat_stub.stats.in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert chat_stub.stats.in_flight == 0 and chat_stub.stats.disconnects >= 1


def test_a_rejudge_with_a_model_judge_pays_its_judgements_and_only_those(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    """``--from-run RUN --rerun-evaluator --judge llm:MODEL``: the new judge's rubric and
    endpoint come from the new flags; every judgement is asked and charged under ``judge``,
    nothing is replayed, and the optimizer is never asked."""
    flags = _toy_flags(tmp_path, chat_stub, "st")
    at = flags.index("--judge")
    first = _run([*flags[:at], *flags[at + 4 :]])  # the exact-match judge, a model optimizer
    assert first.returncode == 0, first.stderr
    (run_id,) = os.listdir(tmp_path / "st" / "runs")
    asked = chat_stub.stats.requests
    rubric = tmp_path / "rubric.md"
    again = _run([
        "optimize", "--from-run", run_id, "--rerun-evaluator", "--judge", "llm:judge-m",
        "--rubric", str(rubric), "--llm-base-url", chat_stub.base_url,
        "--store", str(tmp_path / "st"), "--progress", "none",
    ])  # fmt: skip
    assert again.returncode == 0, again.stderr
    rejudged = next(r for r in _reports(tmp_path / "st") if r["run_id"] != run_id)
    bodies = chat_stub.stats.bodies[asked:]
    assert bodies and all("The case:" in b["messages"][-1]["content"] for b in bodies)
    per_call = 10 + 5  # the stub's default usage
    assert rejudged["budget"]["spent_by_role"]["judge"]["tokens"] == len(bodies) * per_call
    assert rejudged["config"]["rubric"] == rubric.read_text()


def test_a_rejudge_keeps_the_model_settings_it_is_not_given_and_takes_its_own_ceiling(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    """Only ``--judge-samples 2`` and a ceiling are given: the run's rubric and endpoint are
    kept (every request still goes to the stub), each judgement asks twice, the new ceiling
    is in force, and the proposals it reads are not charged to it."""
    first = _run(_toy_flags(tmp_path, chat_stub, "st"))
    assert first.returncode == 0, first.stderr
    (run_id,) = os.listdir(tmp_path / "st" / "runs")
    asked = chat_stub.stats.requests
    again = _run([
        "optimize", "--from-run", run_id, "--rerun-evaluator", "--judge-samples", "2",
        "--max-tokens", "100000", "--store", str(tmp_path / "st"), "--progress", "none",
    ])  # fmt: skip
    assert again.returncode == 0, again.stderr
    rejudged = next(r for r in _reports(tmp_path / "st") if r["run_id"] != run_id)
    judged = chat_stub.stats.requests - asked
    assert judged > 0 and judged % 2 == 0  # two samples per judgement
    assert rejudged["config"]["judge_samples"] == 2 and rejudged["config"]["rubric"]
    assert rejudged["budget"]["ceilings"]["tokens"] == 100000
    roles = rejudged["budget"]["spent_by_role"]
    assert roles["judge"]["tokens"] == judged * 15
    assert roles.get("optimizer", {}).get("tokens", 0) == 0  # it proposed nothing
