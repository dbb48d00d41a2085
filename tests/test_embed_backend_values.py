"""What an in-process judge backend returns is its verdict as a command's stdout would be:
a number type of a numeric library (``np.mean(...)``) is the score it stands for, and a
verdict too long to keep whole keeps its score."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import trio

import evolane
from evolane.embed import BackendCall, Backends, OptimizeRequest
from evolane.lanes import MalformedVerdictError, parse_judge_output, parse_verdict
from tests.campaign_helpers import toy_config, write_toy
from tests.test_embed import PLAN, optimizer_backend, replay_backend


async def _judged(tmp_path: Path, judge: Any) -> list[dict[str, Any]]:
    """Run the toy campaign (one cycle) with ``judge`` in-process; each unit's judge result."""
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(
        paths, replay="backend:r", judge="backend:j", optimizer="backend:o", iterations=1
    )
    backends = Backends(replay=replay_backend, judge=judge, optimizer=optimizer_backend)
    with trio.fail_after(120):  # a hang guard, not a timing figure
        async with evolane.open_runtime(store=paths["store"]) as runtime:
            report = await runtime.optimize(OptimizeRequest(config=config), backends=backends)
    assert report is not None
    journal = paths["store"] / "runs" / report.run_id / "journal.jsonl"
    units = [orjson.loads(line) for line in journal.read_bytes().splitlines()]
    return [unit["judge"] for unit in units if unit["type"] == "unit"]


async def test_a_numpy_score_is_a_score(tmp_path: Path) -> None:
    # Found by review: np.float64 (a float), np.float32 failed every judgement with
    # "TypeError: Type is not JSON serializable: numpy.float64" (judge_exit_1).
    async def judge(call: BackendCall) -> Any:
        assert call.output_dir is not None
        answer = orjson.loads((call.output_dir / "output.json").read_bytes())
        right = np.array([answer == "yes"], dtype=np.float32)
        return np.mean(right) if call.case and call.case["id"] < "val06" else right.mean()

    verdicts = await _judged(tmp_path, judge)
    assert verdicts and {v["status"] for v in verdicts} == {"succeeded"}
    assert {v["score"] for v in verdicts} == {0.0, 1.0}


async def test_a_long_verdict_keeps_its_score(tmp_path: Path) -> None:
    # Found by review: a verdict dict over the 16 KiB of output kept (a long rationale) lost
    # its score: "the judge printed over 16384 bytes" (judge_output_too_long).
    async def judge(call: BackendCall) -> dict[str, Any]:
        assert call.output_dir is not None
        answer = orjson.loads((call.output_dir / "output.json").read_bytes())
        return {"rationale": "because " * 10_000, "score": 1.0 if answer == "yes" else 0.0}

    verdicts = await _judged(tmp_path, judge)
    assert verdicts and {v["status"] for v in verdicts} == {"succeeded"}
    assert {v["score"] for v in verdicts} == {0.0, 1.0}


async def test_a_score_json_cannot_hold_is_named_in_the_failure(tmp_path: Path) -> None:
    # Found by review: a NaN or infinite score (a mean of nothing) was refused as a judge
    # failure, but its message showed {"score":null}: what orjson writes for NaN.
    async def judge(call: BackendCall) -> Any:
        return np.float64("nan") if call.case and call.case["id"] < "val06" else float("-inf")

    verdicts = await _judged(tmp_path, judge)
    assert verdicts and {v["status"] for v in verdicts} == {"failed"}
    assert all(v["score"] is None for v in verdicts)  # refused, never scored
    messages = {v["failure"]["message"] for v in verdicts}
    assert {v["failure"]["code"] for v in verdicts} == {"judge_bad_score"}
    assert messages == {
        f'the judge\'s score is not a number in [0, 1]: \'{{"score":"{shown}"}}\''
        for shown in ("nan", "-inf")
    }


async def test_a_score_an_ulp_outside_the_unit_interval_is_read_as_its_bound(
    tmp_path: Path,
) -> None:
    # Found by review: a judge that sums nine checks worth 1/9 each scores a perfect answer
    # 1.0000000000000002; it was refused (judge_bad_score), and a refused judgement of a
    # candidate's output counts 0: its perfect answers scored as its worst.
    async def judge(call: BackendCall) -> float:
        assert call.output_dir is not None
        answer = orjson.loads((call.output_dir / "output.json").read_bytes())
        checks = [1.0 / 9] * 9 if answer == "yes" else [0.3, -0.1, -0.2]  # 1 + 2e-16, -3e-17
        return sum(checks)

    verdicts = await _judged(tmp_path, judge)
    assert verdicts and {v["status"] for v in verdicts} == {"succeeded"}
    assert {v["score"] for v in verdicts} == {0.0, 1.0}


def test_only_rounding_is_forgiven_of_a_score_outside_the_unit_interval() -> None:
    assert parse_judge_output(b'{"score": 1.0000000000000002}').score == 1.0
    assert parse_verdict('{"score": -2.7e-17}') == (0.0, "")
    for shown in (b"1.001", b"-0.01", b"2", b"true", b'"1"'):
        verdict = parse_judge_output(b'{"score": ' + shown + b"}")
        assert verdict.score is None and verdict.failure is not None
        assert verdict.failure.code == "judge_bad_score"
    with pytest.raises(MalformedVerdictError, match="outside"):
        parse_verdict('{"score": 1.001}')


async def test_a_plain_def_backend_is_told_to_be_async(tmp_path: Path) -> None:
    # Found by review: a synchronous `def` judge failed every unit with "object float can't
    # be used in 'await' expression", naming neither the backend nor the fix.
    def judge(call: BackendCall) -> float:
        return 1.0

    verdicts = await _judged(tmp_path, judge)
    assert verdicts and {v["status"] for v in verdicts} == {"failed"}
    said = {v["failure"]["message"] for v in verdicts}
    assert all("backend" in m and "returned float, not an awaitable" in m for m in said), said
    assert all("async def" in m for m in said), said


async def test_a_lambda_returning_a_coroutine_is_a_backend(tmp_path: Path) -> None:
    async def score(call: BackendCall) -> float:
        await trio.lowlevel.checkpoint()
        assert call.output_dir is not None
        return 1.0 if orjson.loads((call.output_dir / "output.json").read_bytes()) == "yes" else 0

    verdicts = await _judged(tmp_path, lambda call: score(call))
    assert verdicts and {v["status"] for v in verdicts} == {"succeeded"}
