"""Online error control under a drifting world (README "Online error control"): a parent's
val replays serve every later candidate of a run, so a judge (or endpoint) that starts
scoring higher mid-run lifts every later candidate alike. Online control measures a
candidate it would accept again beside fresh replays of the parent and decides on those
pairs. Campaigns through `run_campaign` with in-process backends whose every candidate has
no true gain (a reworded prompt the replay ignores) and a judge that adds ``shift`` to every
score after its first ``after`` calls (the parent's train and val measurements)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
import trio

from evolane.campaign import Report
from evolane.campaign._config import CampaignConfig
from evolane.campaign._estimate import estimate_run
from evolane.campaign._online import RECHECKED, earlier_window
from evolane.campaign._run import Backends, RunRequest, run_campaign
from evolane.embed import BackendCall

TRAIN = 8
ALPHA = 0.05


def _workload(root: Path, val: int, seed: int) -> tuple[dict[str, Path], dict[str, float]]:
    """A target (one prompt file), ``TRAIN`` train and ``val`` val cases (no test split: online
    control), and each case's score without drift."""
    target = root / "target"
    target.mkdir(parents=True)
    (target / "prompt.txt").write_text("be helpful\n")
    rows = [{"id": f"t{i:02d}", "split": "train"} for i in range(TRAIN)]
    rows += [{"id": f"v{i:02d}", "split": "val"} for i in range(val)]
    dataset = root / "cases.jsonl"
    with dataset.open("w") as out:
        for row in rows:
            out.write(json.dumps({**row, "input": row["id"], "expected_output": "x"}) + "\n")
    rng = random.Random(seed)
    base = {row["id"]: rng.uniform(0.25, 0.55) for row in rows}
    return {"target": target, "dataset": dataset, "store": root / "store"}, base


class _World:
    """The in-process replay, judge and optimizer; ``judged`` counts the judge's calls."""

    def __init__(
        self, base: dict[str, float], shift: float, noise: float, seed: int, gain: bool
    ) -> None:
        self.base, self.shift, self.noise, self.gain = base, shift, noise, gain
        self.after = len(base)  # the parent's train and val units: the drift starts after them
        self.judged = 0
        self.rng = random.Random(seed)

    async def replay(self, call: BackendCall) -> dict[str, Any]:
        assert call.case is not None and call.output_dir is not None
        assert call.candidate is not None
        better = "better" in (call.candidate / "prompt.txt").read_text()  # a true gain
        answer = {"case": call.case["id"], "better": better}
        (call.output_dir / "output.json").write_text(json.dumps(answer))
        return {"tokens": 1, "cost_usd": 0.0}

    async def judge(self, call: BackendCall) -> float:
        assert call.output_dir is not None
        self.judged += 1
        answer = json.loads((call.output_dir / "output.json").read_text())
        score = self.base[answer["case"]] + 0.4 * answer["better"]
        score += self.shift if self.judged > self.after else 0.0
        score += self.rng.gauss(0.0, self.noise) if self.noise else 0.0
        return min(1.0, max(0.0, score))

    async def optimizer(self, call: BackendCall) -> str:
        assert call.workdir is not None
        words = "better" if self.gain else "reworded"  # reworded: the replay ignores it
        (call.workdir / "prompt.txt").write_text(f"be helpful, {words} {call.seed}\n")
        return words


async def _campaign(
    tmp: Path,
    *,
    shift: float,
    noise: float = 0.0,
    val: int = 16,
    seed: int = 0,
    gain: bool = False,
    **extra: Any,
) -> tuple[Report, _World]:
    paths, base = _workload(tmp, val, seed)
    world = _World(base, shift, noise, seed, gain)
    settings: dict[str, Any] = {
        "target": str(paths["target"]),
        "dataset": str(paths["dataset"]),
        "store": str(paths["store"]),
        "replay": "backend:replay",
        "judge": "backend:judge",
        "optimizer": "backend:optimizer",
        "iterations": 1,
        "population": 1,
        "stall": 10,
        "error_control": "online",
        "baseline_replay_repetitions": 1,
        "candidate_replay_repetitions": 1,
        "replay_concurrency": 4,
        "judge_concurrency": 4,
        "seed": seed,
        **extra,
    }
    backends = Backends(replay=world.replay, judge=world.judge, optimizer=world.optimizer)
    with trio.fail_after(300):  # a guard against a hang, not a timing figure
        outcome = await run_campaign(RunRequest(CampaignConfig(**settings)), backends=backends)
    assert outcome.report is not None and outcome.report.status == "finished"
    return outcome.report, world


async def test_a_judge_that_drifts_up_mid_run_publishes_no_useless_candidate(
    tmp_path: Path,
) -> None:
    """A judge that scores +0.3 higher once the parent's replays are judged: the candidate
    (no true gain) was paired with the parent's earlier replays, every delta +0.3, and online
    control accepted it (p far below its level 0.05); nothing else guarded the publish."""
    report, world = await _campaign(tmp_path, shift=0.3)
    (first,) = report.online.tests if report.online else ()
    assert first.decision == "reject" and report.online.accepted == 0
    assert report.selected is None
    by_id = {m.measurement_id: m for m in report.measurements}
    assert by_id["c0.i0.s0"].units_reused == 16  # the parent's baselines: an earlier window
    recheck = by_id["c0.i0.s0.recheck"]
    assert (recheck.units_reused, recheck.units_run, recheck.decision) == (0, 32, "reject")
    (decision,) = report.decisions
    assert decision.reason.startswith(RECHECKED) and decision.decision == "reject"
    assert world.judged == 24 + 16 + 32  # the parent, the candidate, the pair again


async def test_a_true_gain_is_still_accepted_at_the_cost_of_one_measurement(
    tmp_path: Path,
) -> None:
    """No drift, a candidate that truly gains +0.4 on every case: measured again (its
    baselines were reused), accepted on the fresh pairs; the extra cost is one paired val
    measurement, charged like any other."""
    report, _ = await _campaign(tmp_path, shift=0.0, gain=True)
    assert report.online is not None and report.online.accepted == 1
    recheck = next(m for m in report.measurements if m.measurement_id == "c0.i0.s0.recheck")
    assert recheck.units_run == 32 and recheck.decision == "accept"
    assert report.decisions[0].reason.startswith(RECHECKED)


def test_only_pairs_of_one_window_need_no_second_measurement() -> None:
    def unit(case: str, reused: bool = False, restored: bool = False) -> dict[str, Any]:
        return {"case": case, "reused": reused, "restored": restored, "score": 0.5}

    fresh = [unit("a"), unit("a"), unit("b", restored=True), unit("b", restored=True)]
    assert not earlier_window(fresh)
    assert earlier_window([*fresh, unit("c", reused=True), unit("c")])
    assert earlier_window([unit("a", restored=True), unit("a")])  # a resume mixed sessions
    unscored = {**unit("c", reused=True), "score": None}  # took no part in the decision
    assert not earlier_window([*fresh, unscored])


def test_the_estimate_counts_a_second_measurement_of_every_candidate_in_online_mode() -> None:
    config = CampaignConfig(target="t", dataset="d", replay="r", optimizer="o", iterations=3)
    online = estimate_run(config, val_cases=32, test_cases=0)  # no test split: online
    none = estimate_run(config.model_copy(update={"error_control": "none"}), 32, 0)
    assert online.replays_max - none.replays_max == 3 * 2 * 32 * 2  # both arms, every slot


@pytest.mark.slow
@pytest.mark.parametrize("shift", [0.3, 0.0])
async def test_the_false_publish_rate_stays_within_alpha_with_and_without_drift(
    tmp_path: Path, shift: float
) -> None:
    """Whole campaigns (3 iterations x 2 slots, 32 val cases, graded scores with noise),
    every candidate useless. Before the guard, with the +0.3 drift every campaign accepted
    one (30 of 30); now the share stays within alpha, and without a drift the guard costs
    only the rare second measurement of a would-be accept (none in 30 campaigns)."""
    campaigns, published, rechecks = 30, 0, 0
    for seed in range(campaigns):
        report, _ = await _campaign(
            tmp_path / str(seed), shift=shift, noise=0.1, val=32, seed=seed, iterations=3,
            population=2,
        )  # fmt: skip
        assert report.online is not None
        published += report.online.accepted > 0
        rechecks += sum(m.measurement_id.endswith(".recheck") for m in report.measurements)
    margin = 3 * math.sqrt(ALPHA * (1 - ALPHA) / campaigns)  # Monte Carlo error, 3 SE
    assert published / campaigns <= ALPHA + margin
    if shift == 0.0:
        assert rechecks <= 2  # would-be accepts of useless candidates are rare
