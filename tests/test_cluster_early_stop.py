"""Early stop on clustered cases: the reading order keeps each cluster's cases together in a
seeded order of the clusters, early stop reads one mean delta per complete cluster, and its
decisions keep the clustered gate's level and agree with the full clustered evaluation.
Without two cases of one cluster, the order and every decision are as before."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evolane.lanes import BackendCall
from evolane.measure import MeasureContext, MeasureSettings
from evolane.measure._plan import MeasurePlan
from evolane.messages import GateConfig
from evolane.stats import case_order, cluster_ends, cluster_order, clustered, decide, together
from tests.pipeline_helpers import two_trees
from tests.test_measure_plan import (
    OUTPUT,
    Driver,
    Outcome,
    build,
    make_request,
    make_settings,
    shapes,
)

names = st.lists(st.text("abcdefghij", min_size=1, max_size=4), unique=True, max_size=30)


@st.composite
def clustered_ids(draw: st.DrawFn) -> tuple[list[str], dict[str, str]]:
    """Case ids and a cluster for some of them (a few names, so clusters are shared)."""
    ids = draw(names)
    groups = draw(st.lists(st.sampled_from(["A", "B", "C", "D", None]), min_size=len(ids)))
    clusters = {case: group for case, group in zip(ids, groups, strict=False) if group}
    return ids, clusters


@settings(max_examples=200, deadline=None)
@given(clustered_ids(), st.integers(0, 2**32), st.randoms(use_true_random=False))
def test_the_cluster_order_keeps_clusters_together_in_a_seeded_order(
    data: tuple[list[str], dict[str, str]], seed: int, rng: random.Random
) -> None:
    ids, clusters = data
    order = cluster_order(ids, seed, clusters)
    assert sorted(order) == sorted(ids)
    shuffled = list(ids)
    rng.shuffle(shuffled)
    assert cluster_order(shuffled, seed, clusters) == order  # the set and the seed alone
    ends = cluster_ends(order, clusters)  # refuses a cluster that comes back
    assert len(ends) == len({clusters.get(c, "case:" + c) for c in ids})
    plain = case_order(ids, seed)
    if not clustered(ids, clusters):
        assert order == plain  # nothing shared: today's order
    for name in set(clusters.values()):  # each cluster's cases in their seeded order
        mine = [case for case in order if clusters.get(case) == name]
        assert mine == [case for case in plain if clusters.get(case) == name]


def test_the_clusters_order_depends_on_the_seed_not_on_their_size() -> None:
    """A large cluster comes first about as often as a small one: the order of the clusters
    is a seeded key of their names (a cluster ranked by its first case would come first
    the more cases it has)."""
    clusters = {f"big{i}": "big" for i in range(20)} | {"small0": "small"}
    first = [cluster_order(clusters, seed, clusters)[0] == "small0" for seed in range(400)]
    assert 0.4 < sum(first) / len(first) < 0.6


def test_named_cases_keep_their_order_with_each_cluster_at_its_first() -> None:
    clusters = {"a": "X", "c": "X"}
    assert together(["b", "a", "d", "c"], clusters) == ["b", "a", "c", "d"]
    assert together(["b", "a", "d"], clusters) == ["b", "a", "d"]
    with pytest.raises(ValueError, match="not read in one run"):
        cluster_ends(["a", "b", "c"], clusters)


def singletons(ids: tuple[str, ...], how: str) -> dict[str, str]:
    return {case: case if how == "self" else f"cluster-{n}" for n, case in enumerate(ids)}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=shapes,
    how=st.sampled_from(["self", "renamed"]),
    gate=st.sampled_from(["paired", "bootstrap", "strict"]),
)
def test_without_shared_clusters_the_order_and_the_decisions_are_as_before(
    shape: dict[str, Any], how: str, gate: str
) -> None:
    """Each case a cluster of its own (named after itself or not): the same reading order,
    cutoff, early stop and result as with no clusters at all."""
    results = []
    for named in (False, True):
        plan, outcomes = build(shape, sequential=True, journaled=True)
        plan = MeasurePlan(
            make_request(gate=gate, reps=shape["reps"]),
            make_settings(
                shape["cases"],
                min_cases=8,
                clusters=singletons(tuple(plan.case_ids), how) if named else {},
            ),
            lanes=shape["lanes"],
            journaled=True,
        )
        Driver(plan, outcomes).run(random.Random(shape["seed"] + 1))
        summary = plan.summary(OUTPUT, 0.0)
        results.append((plan.case_ids, plan.cutoff, plan.early, summary))
    assert results[0] == results[1]
    assert results[0][0] == case_order(results[0][0], 0)


# ----- against known truth --------------------------------------------------------------


def sessions_of(rng: np.random.Generator, count: int) -> dict[str, str]:
    """``count`` sessions of 2 to 6 turns each, as case id -> session."""
    sizes = rng.integers(2, 7, count)
    return {f"c{n}": f"s{s}" for n, s in enumerate(np.repeat(np.arange(count), sizes))}


def scores_of(
    plan: MeasurePlan, rng: np.random.Generator, effect: float, icc: float, sd: float
) -> tuple[dict[str, Outcome], dict[str, list[float]], dict[str, list[float]]]:
    """Each unit's score: a case's delta is ``effect`` plus a session's shift and the case's
    own noise (sd ``sd`` in all, intra-class correlation ``icc``), graded; and each arm's
    scores by case."""
    clusters = plan.settings.clusters
    shift = {name: rng.normal(0.0, math.sqrt(icc)) for name in sorted(set(clusters.values()))}
    outcomes: dict[str, Outcome] = {}
    arms: tuple[dict[str, list[float]], dict[str, list[float]]] = ({}, {})
    deltas = {}
    for case in sorted(clusters):
        latent = shift[clusters[case]] + rng.normal(0.0, math.sqrt(1.0 - icc))
        deltas[case] = float(np.clip(effect + latent * sd, -1.0, 1.0))
    for unit in plan.units:
        delta = deltas[unit.case_id]
        score = (1.0 + delta) / 2.0 if unit.arm == "candidate" else (1.0 - delta) / 2.0
        outcomes[unit.unit_id] = Outcome(score=score)
        arms[unit.arm == "candidate"].setdefault(unit.case_id, []).append(score)
    return outcomes, arms[0], arms[1]


def simulate(
    effect: float, icc: float, trials: int, sd: float, sessions: int = 30
) -> dict[str, float]:
    """Early-stopped clustered measurements through `MeasurePlan` against the full clustered
    evaluation of the same scores (what a clustered measurement was before: it ran in
    full): each one's accept rate, their agreement and the share of pairs early stop read."""
    rng = np.random.default_rng(int(1000 * icc) + int(100 * effect) + 7)
    early = full = agree = 0
    pairs = 0.0
    for trial in range(trials):
        clusters = sessions_of(rng, sessions)
        request = make_request(min_cases=8, bootstrap_samples=1)
        cases = len(clusters)
        plan = MeasurePlan(request, make_settings(cases, clusters=clusters), lanes=4)
        outcomes, baseline, candidate = scores_of(plan, rng, effect, icc, sd)
        Driver(plan, outcomes, checking=False).run(random.Random(trial))
        got = plan.summary(OUTPUT, 0.0).gate.decision
        whole = decide(baseline, candidate, request.gate, cases, clusters=clusters).decision
        early += got == "accept"
        full += whole == "accept"
        agree += got == whole
        pairs += (plan.cutoff or cases) / cases
    return {
        "early": early / trials,
        "full": full / trials,
        "agree": agree / trials,
        "pairs": pairs / trials,
    }


def upper(rate: float, trials: int) -> float:
    """3 binomial sd over ``rate`` at ``trials``."""
    return rate + 3.0 * math.sqrt(max(rate, 0.01) * (1.0 - rate) / trials)


@pytest.mark.slow
@pytest.mark.parametrize("icc", [0.5, 0.9])
def test_early_stop_by_cluster_keeps_the_clustered_gates_level_and_decision(icc: float) -> None:
    """Sessions of 2-6 turns, paired gate at k = 1 (level 0.159): with no true effect (30
    sessions, case deltas of sd 1/3) the early-stopped measurements accept no more often
    than the full clustered evaluation and agree with it on >= 95%; at +-0.15 (64 sessions,
    sd 0.07, as benchmarks/stats_figures.py) they agree on >= 95% and read at most 60% of
    the pairs. Measured (6 min): at 0, 15.3% and 16.3% accepted early and in full alike
    (icc 0.5, 0.9), 100% agreement; at +-0.15, 100% agreement on 50% of the pairs."""
    null = simulate(0.0, icc, 300, sd=1 / 3)
    print(f"icc {icc} effect 0: {null}")
    assert null["early"] <= upper(null["full"], 300)
    assert null["agree"] >= 0.95
    for effect in (0.15, -0.15):
        found = simulate(effect, icc, 60, sd=0.07, sessions=64)
        print(f"icc {icc} effect {effect:+}: {found}")
        assert found["agree"] >= 0.95
        assert found["pairs"] <= 0.6


async def test_a_clustered_measurement_stops_early_by_sessions_through_the_pipeline(
    tmp_path: Path,
) -> None:
    """Through the measurement pipeline (in-process replays and judge): 10 sessions of 4
    turns, the candidate right on every turn and the baseline wrong: the measurement stops
    at a session's end, having compared whole sessions, and says so in sessions."""
    rows = [
        {"id": f"c{i}", "input": i, "expected_output": i, "metadata": {"cluster": f"s{i // 4}"}}
        for i in range(40)
    ]

    async def replay(call: BackendCall) -> None:
        assert call.candidate is not None and call.output_dir is not None and call.case
        right = (call.candidate / "skill.md").read_text() == "rules of t2"
        answer = call.case["input"] if right else -1
        (call.output_dir / "output.json").write_bytes(orjson.dumps(answer))

    async def judge(call: BackendCall) -> float:
        assert call.output_dir is not None and call.case is not None
        answer = orjson.loads((call.output_dir / "output.json").read_bytes())
        return 1.0 if answer == call.case["expected_output"] else 0.0

    context = MeasureContext(replay_backend=replay, judge_backend=judge)
    settings = MeasureSettings(replay="true", judge="true", replay_concurrency=2)
    gate = GateConfig(min_cases=2, bootstrap_samples=100)
    async with two_trees(tmp_path, rows, settings, context) as bench:
        summary = await bench.pipeline.measure(bench.request.model_copy(update={"gate": gate}))
    assert summary.status == "early_stopped" and summary.gate.decision == "accept"
    assert summary.cases_compared % 4 == 0 and summary.cases_compared < 40
    sessions = summary.cases_compared // 4
    assert summary.gate.reason.startswith(f"early stop after {sessions} of 10 clusters")
