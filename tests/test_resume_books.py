"""What a resumed run's books hold, through the real CLI (``evolane`` runs as a subprocess):
every token spent is counted once across the sessions of a run, including what the units a
Ctrl-C cut off had spent: a model judge's requests to a real chat-completions server
(`evolane.testing.ChatStub`, in this process), charged their input as estimated, and a replay
command's usage document."""

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

from evolane.lanes._llm_usage import request_tokens
from evolane.testing._chat_stub import ChatStub
from tests.campaign_helpers import toy_flags, write_toy

pytest.importorskip("openai")

EVOLANE = [sys.executable, "-m", "evolane"]
PER_ANSWER = 10 + 5  # the stub's default usage of an answered call
JUDGE_LANES, SAMPLES = 2, 2
HANGING = JUDGE_LANES * SAMPLES
"""Requests that hang once every judge lane is stuck: each lane's unit asks its samples at once."""
QUIET = 5.0
"""Seconds without a new request after which hanging requests on the lanes mean every lane
is stuck (a guard against a lane about to send, not a timing figure)."""


def _flags(tmp_path: Path, stub: ChatStub) -> list[str]:
    """The toy campaign (the toy's own optimizer script: free) with a model judge asked twice
    a unit, graded by exact match."""
    paths = write_toy(tmp_path / "toy", {"default": "fix:2"})
    rubric = tmp_path / "rubric.md"
    rubric.write_text("1 when the output is the expected one\n")
    stub.script.grade = []
    return [
        "optimize", *toy_flags(paths, tmp_path / "st"), "--judge", "llm:judge-m",
        "--rubric", str(rubric), "--llm-base-url", stub.base_url, "--judge-samples", str(SAMPLES),
        "--judge-concurrency", str(JUDGE_LANES), "--iterations", "1", "--population", "1",
    ]  # fmt: skip


def _interrupt_once_requests_hang(
    args: list[str], stub: ChatStub, after: int, hanging: int = HANGING
) -> None:
    """Run ``evolane args`` until the stub has had ``after`` more requests (0: from the
    run's first), then make every new request hang and Ctrl-C the run once ``hanging`` hang
    (every judge lane stuck; exit 130): the requests in flight, all received, are cut off (a
    request cut while it was still being sent is charged too, as the server may have read
    it: not what this test counts)."""
    start = stub.stats.requests
    stub.script.hang = after == 0
    process = subprocess.Popen([*EVOLANE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while stub.stats.requests < start + after:
            assert process.poll() is None and time.monotonic() < deadline, "no progress"
            time.sleep(0.01)
        stub.script.hang = True
        seen, since = stub.stats.requests, time.monotonic()
        while stub.stats.in_flight < hanging:
            # or one at least on each lane and no new one for QUIET s: a resumed run asks
            # again only the samples a Ctrl-C cut, so a lane's unit may hang on one sample
            # (found by CI: the test waited for 4 until the judge's 120 s timeout)
            if stub.stats.requests != seen:
                seen, since = stub.stats.requests, time.monotonic()
            elif stub.stats.in_flight >= JUDGE_LANES and time.monotonic() - since >= QUIET:
                break
            assert process.poll() is None and time.monotonic() < deadline, "nothing hangs"
            time.sleep(0.01)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
        assert process.returncode == 130, (out, err)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    deadline = time.monotonic() + 30
    while stub.stats.in_flight and time.monotonic() < deadline:  # the server saw them leave
        time.sleep(0.02)
    stub.script.hang = False


def _report(store: Path) -> dict[str, Any]:
    (path,) = (store / "runs").glob("*/report.json")
    return json.loads(path.read_text())


def test_a_resumed_run_counts_the_requests_every_ctrl_c_cut_off(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    """Two sessions are cut by Ctrl-C while judge requests hang (the second cuts the same
    units again: their judgements are asked again first), the third finishes: the run's and
    the campaign's spend is every answered call's usage plus every cut request's input as
    estimated, sent over the three sessions (it held only the last session's and what the
    journal restored: the cut requests dropped out of the books)."""
    flags = _flags(tmp_path, chat_stub)
    _interrupt_once_requests_hang(flags, chat_stub, after=8)
    (run_id,) = os.listdir(tmp_path / "st" / "runs")
    resume = ["optimize", "--resume", run_id, "--store", str(tmp_path / "st"), "--progress", "none"]
    _interrupt_once_requests_hang(resume, chat_stub, after=1)
    done = subprocess.run([*EVOLANE, *resume], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    stats = chat_stub.stats
    assert stats.in_flight == 0 and len(stats.cut) >= 2
    assert stats.answered + len(stats.cut) == stats.requests  # no 429s, no failures
    sent = stats.answered * PER_ANSWER + sum(request_tokens(body) for body in stats.cut)
    budget = _report(tmp_path / "st")["budget"]
    assert budget["spent"]["tokens"] == sent
    assert budget["spent_by_role"]["judge"]["tokens"] == sent
    assert budget["campaign_spent"]["tokens"] == sent


REPLAY_TOKENS = 1000
REPLAY = (
    'sh -c \'echo "{{\\"tokens\\": 1000, \\"partial\\": true}}" > "$2/usage.json"; '
    'echo "$EVOLANE_UNIT" >> "$3/started"; sleep 0.3; '
    'cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"; '
    'echo "{{\\"tokens\\": 1000}}" > "$2/usage.json"\' '
    "replay {candidate} {output_dir} LOG"
)


def test_a_resumed_run_counts_what_the_replays_a_ctrl_c_cut_off_reported(tmp_path: Path) -> None:
    """Replays that wrote a partial usage document are cut by Ctrl-C; the resumed run's
    spend is every replay's usage, the cut ones' too (it left them out: only the replays
    that ended, restored or run again, were in the books)."""
    log = tmp_path / "log"
    log.mkdir()
    paths = write_toy(tmp_path / "toy", {"default": "fix:2"})
    flags = toy_flags(paths, tmp_path / "st")
    flags[flags.index("--replay") + 1] = REPLAY.replace("LOG", str(log))
    args = ["optimize", *flags, "--iterations", "1", "--population", "1", "--expose-rw", str(log)]
    started = log / "started"
    process = subprocess.Popen([*EVOLANE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while _lines(started) < 6:
            assert process.poll() is None and time.monotonic() < deadline, "no progress"
            time.sleep(0.01)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
        assert process.returncode == 130, (out, err)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    (run_id,) = os.listdir(tmp_path / "st" / "runs")
    resume = ["optimize", "--resume", run_id, "--store", str(tmp_path / "st"), "--progress", "none"]
    done = subprocess.run([*EVOLANE, *resume], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    budget = _report(tmp_path / "st")["budget"]
    assert budget["spent"]["tokens"] == _lines(started) * REPLAY_TOKENS
    assert budget["spent_by_role"]["replay"]["tokens"] == _lines(started) * REPLAY_TOKENS


def _lines(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


def test_an_optimizer_call_a_ctrl_c_cut_off_is_in_both_sessions_books(
    chat_stub: ChatStub, tmp_path: Path
) -> None:
    """An ``llm:`` optimizer's request hangs and a Ctrl-C cuts it: the interrupted run's
    books hold its input as estimated, the resume's hold it too beside the call it asks
    again, whose answer is the slot's (it was charged in neither session: the cut call was
    neither debited nor journaled)."""
    paths = write_toy(tmp_path / "toy", {})
    flags = toy_flags(paths, tmp_path / "st")
    flags[flags.index("--optimizer") + 1] = "llm:opt-m"
    args = ["optimize", *flags, "--llm-base-url", chat_stub.base_url, "--iterations", "1"]
    # The optimizer's is the run's first request.
    _interrupt_once_requests_hang([*args, "--population", "1"], chat_stub, after=0, hanging=1)
    (cut,) = chat_stub.stats.cut
    interrupted = _report(tmp_path / "st")
    assert interrupted["budget"]["spent_by_role"]["optimizer"]["tokens"] == request_tokens(cut)
    (run_id,) = os.listdir(tmp_path / "st" / "runs")
    resume = ["optimize", "--resume", run_id, "--store", str(tmp_path / "st"), "--progress", "none"]
    done = subprocess.run([*EVOLANE, *resume], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr

    stats = chat_stub.stats
    assert stats.requests == 2 and stats.answered == 1  # the slot was asked again
    sent = PER_ANSWER + request_tokens(cut)
    report = _report(tmp_path / "st")
    assert report["budget"]["spent"]["tokens"] == sent
    assert report["budget"]["spent_by_role"]["optimizer"]["tokens"] == sent
    assert report["budget"]["campaign_spent"]["tokens"] == sent
    (decision,) = report["decisions"]
    assert "cancelled" not in decision["reason"]  # the new answer is the slot's
