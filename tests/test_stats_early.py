"""EarlyStop (issue 16): the gate's own level, the coverage rule, reasons, agreement."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from evolane.messages import GateConfig
from evolane.stats import EarlyStop, case_order, decide, required_cases, sequential_level

FAST = {"bootstrap_samples": 1}


def arms(deltas: list[float | None]) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Arms whose per-case deltas are ``deltas``; None is a case the candidate never scored."""
    base = {f"c{i:04d}": [max(0.0, -d)] for i, d in enumerate(deltas) if d is not None}
    cand = {f"c{i:04d}": [max(0.0, d)] for i, d in enumerate(deltas) if d is not None}
    base |= {f"c{i:04d}": [0.5] for i, d in enumerate(deltas) if d is None}
    return base, cand


def full_decision(deltas: list[float | None], config: GateConfig) -> str:
    """The full evaluation of every planned case (None: not comparable)."""
    return decide(*arms(deltas), config, n_planned=len(deltas)).decision


def early(deltas: list[float | None], config: GateConfig, **kwargs: bool) -> EarlyStop:
    """An EarlyStop fed ``deltas`` until it decides."""
    stop = EarlyStop(config, len(deltas), **kwargs)
    for d in deltas:
        if stop.update(d) is not None:
            break
    return stop


# --- the level -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "level"),
    [
        (GateConfig(), 0.05),  # 1 - Phi(1) = 0.159, capped by sequential_alpha 0.05
        (GateConfig(sequential_alpha=0.5), 1 - 0.841344746),
        (GateConfig(k_se=2.0), 0.0227501319),
        (GateConfig(k_se=3.0), 0.0013498980),
        (GateConfig(k_se=3.0, sequential_alpha=0.001), 0.001),
        (GateConfig(gate="bootstrap"), 0.025),
        (GateConfig(gate="bootstrap", confidence=0.99), 0.005),
        (GateConfig(gate="strict"), None),
    ],
)
def test_sequential_level_is_the_gates_own_capped_by_sequential_alpha(
    config: GateConfig, level: float | None
) -> None:
    got = sequential_level(config)
    assert got == (None if level is None else pytest.approx(level, rel=1e-6))


def test_k3_does_not_stop_on_evidence_a_005_test_would_take() -> None:
    # Ten +1 deltas then zeros: the betting test at 0.05 (k = 1, capped) shows mean > 0 at
    # n = 8; at k = 3 (level 0.00135, whatever sequential_alpha says) it never does.
    stream = [1.0] * 10 + [0.0] * 54
    loose = early(stream, GateConfig(min_coverage=0.0))
    assert (loose.decision, loose.source, loose.n) == ("accept", "sequential", 8)
    for cap in (0.05, 0.5):
        strict = EarlyStop(GateConfig(k_se=3.0, min_coverage=0.0, sequential_alpha=cap), 64)
        assert all(strict.update(d) is None for d in stream[:20])


# --- coverage and minimum n ------------------------------------------------------------------


def test_no_decision_before_the_coverage_minimum_of_the_plan() -> None:
    config = GateConfig()  # min_cases 8, min_coverage 0.5
    stop = EarlyStop(config, 22)
    assert stop.required == 11
    for _ in range(10):
        assert stop.update(1.0) is None  # 10 of 22 comparable: the full one could be indecisive
    assert stop.update(1.0) == "accept"
    assert stop.n == 11
    six = EarlyStop(GateConfig(min_coverage=0.0), 6)
    assert six.update(1.0) == "indecisive"  # 6 planned < min_cases 8: never decidable
    assert full_decision([1.0] * 6, GateConfig(min_coverage=0.0)) == "indecisive"


def test_non_comparable_cases_count_against_coverage_and_end_as_indecisive() -> None:
    stop = EarlyStop(GateConfig(), 20)  # needs 10 comparable
    for _ in range(10):
        assert stop.update(None) is None
    assert stop.update(None) == "indecisive"  # at most 9 comparable can remain
    assert (stop.source, stop.seen, stop.n) == ("coverage", 11, 0)
    assert stop.reason.startswith("early stop after 11 of 20 cases, coverage: at most 9")
    assert full_decision([None] * 11 + [1.0] * 9, GateConfig()) == "indecisive"


def test_exact_coverage_in_early_stop() -> None:
    config = GateConfig(min_coverage=0.28, min_cases=2, sequential=False)
    assert required_cases(25, config) == 7  # 0.28 * 25 is 7.000000000000001 in floats
    stream: list[float | None] = [1.0] * 7 + [None] * 18
    stop = early(stream, config)
    assert stop.decision == "accept" == full_decision(stream, config)


def test_other_rules_and_reasons() -> None:
    vetoable = EarlyStop(GateConfig(no_regression=True), 64)
    assert all(vetoable.update(1.0) is None for _ in range(60))
    online = EarlyStop(GateConfig(), 64, allow_accept=False)
    assert all(online.update(1.0) is None for _ in range(64))
    rejecting = EarlyStop(GateConfig(), 64, allow_accept=False)
    decisions = [rejecting.update(-1.0) for _ in range(32)]
    assert decisions[-1] == "reject" and decisions[-2] is None
    assert rejecting.source == "sequential"
    assert "e-value" in rejecting.reason and "shows mean < 0" in rejecting.reason
    plain = EarlyStop(GateConfig(sequential=False), 16)
    decisions = [plain.update(-1.0) for _ in range(8)]
    assert decisions[-1] == "reject" and plain.source == "settled"
    assert plain.reason.startswith("early stop after 8 of 16 cases, settled: even if the 8")
    strict = EarlyStop(GateConfig(gate="strict", min_cases=1, min_coverage=0.0), 10)
    assert strict.update(-0.5) == "reject" and "strict" in strict.reason
    full = EarlyStop(GateConfig(gate="threshold", min_cases=1, min_coverage=0.0), 2)
    full.update(0.0)
    full.update(None)
    with pytest.raises(ValueError):
        full.update(0.0)
    with pytest.raises(ValueError):
        EarlyStop(GateConfig(), 4).update(1.5)


# --- early == full -----------------------------------------------------------------------

cells = st.one_of(
    st.none(),
    st.sampled_from([-1.0, 0.0, 1.0]),
    st.floats(-1, 1).map(lambda x: round(x, 2)),
)
settle_configs = st.builds(
    GateConfig,
    k_se=st.sampled_from([0.0, 1.0, 2.0]),
    min_effect=st.sampled_from([-0.1, 0.0, 0.05]),
    min_cases=st.sampled_from([2, 8]),
    min_coverage=st.sampled_from([0.0, 0.28, 0.5, 1.0]),
    no_regression=st.booleans(),
    sequential=st.just(False),
    gate=st.sampled_from(["paired", "strict"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(cells, max_size=40), settle_configs)
def test_early_decisions_without_the_sequential_test_always_equal_the_full_one(
    deltas: list[float | None], config: GateConfig
) -> None:
    # settled and the coverage rule are certain: whatever the stream, including non-comparable
    # cases anywhere, an early decision is the full evaluation's decision.
    config = config.model_copy(update=FAST)
    stop = early(deltas, config)
    event(f"early: {stop.decision}")
    if stop.decision is not None:
        assert stop.decision == full_decision(deltas, config)
        if stop.decision != "indecisive":
            assert stop.n >= required_cases(len(deltas), config)


@settings(max_examples=100, deadline=None)
@given(st.integers(4, 30), st.floats(0.05, 1.0), st.integers(0, 2**16))
def test_adversarial_order_cannot_fool_the_settled_rule(half: int, x: float, seed: int) -> None:
    # Helps the first half of the file by x, hurts the second by x: zero effect overall.
    deltas = [round(x, 3)] * half + [-round(x, 3)] * half
    config = GateConfig(sequential=False, **FAST)
    assert full_decision(deltas, config) == "reject"
    ids = [f"c{i:04d}" for i in range(2 * half)]
    ordered = [deltas[int(c[1:])] for c in case_order(ids, seed)]
    for stream in (deltas, ordered):
        assert early(stream, config).decision in (None, "reject")


def test_adversarial_order_with_the_sequential_test_file_vs_seeded() -> None:
    # 40 cases: the first 20 are fixed (+1), the last 20 broken (-1), zero overall. In file
    # order the sequential test sees 20 straight fixes and would accept at the coverage minimum;
    # in the seeded order it almost never can.
    deltas = [1.0] * 20 + [-1.0] * 20
    config = GateConfig(**FAST)
    assert full_decision(deltas, config) == "reject"
    assert early(deltas, config).decision == "accept"  # what seeded order exists for
    ids = [f"c{i:04d}" for i in range(40)]
    fooled = 0
    for seed in range(300):
        ordered = [deltas[int(c[1:])] for c in case_order(ids, seed)]
        fooled += early(ordered, config).decision == "accept"
    assert fooled <= 6  # binomial: at most ~1% of 300 orders (the level is 0.05 at most)


def agreement_trial(rng: np.random.Generator, config: GateConfig, n: int, effect: float) -> bool:
    """One seeded pass/fail measurement: does the early decision equal the full one?"""
    p = rng.choice([0.03, 0.97, 0.5], n)
    cand_p = p + 2 * effect * (1 - p)
    deltas = ((rng.random(n) < cand_p).astype(float) - (rng.random(n) < p)).tolist()
    stop = early(deltas, config)
    return stop.decision is None or stop.decision == full_decision(deltas, config)


@pytest.mark.parametrize(("k", "n"), [(1.0, 30), (2.0, 30), (2.0, 100)])
def test_early_and_full_agree_on_pass_fail_measurements(k: float, n: int) -> None:
    rng = np.random.default_rng([int(k), n])
    config = GateConfig(k_se=k, **FAST)
    trials = 150
    agree = sum(agreement_trial(rng, config, n, e) for e in (0.0, 0.1, 0.15) for _ in range(50))
    # >= 99% expected (benchmarks/decisions.py, 1,000 trials a cell); a 99% rate gives at most
    # 5 misses in 150 with probability > 0.99.
    assert trials - agree <= 5


def test_update_cost_does_not_grow_with_the_stream() -> None:
    # O(1) bookkeeping: the running sums never hold the deltas (no list to re-sum).
    stop = EarlyStop(GateConfig(sequential=False, min_coverage=1.0), 5_000)
    for d in np.random.default_rng(0).uniform(-0.1, 0.1, 4_999).tolist():
        stop.update(d)
    assert stop.decision is None and stop.n == 4_999
    assert not any(isinstance(getattr(stop, s, None), list) for s in EarlyStop.__slots__)
    assert math.isfinite(stop._running.total)


@pytest.mark.parametrize(
    ("config", "deltas"),
    [
        (GateConfig(gate="strict"), [0.0] * 9 + [-1.0]),  # settled by one worse case
        (GateConfig(), [1.0] * 8),  # the sequential test's wealth crosses on the 8th
    ],
)
def test_no_early_stop_on_the_last_case(config: GateConfig, deltas: list[float | None]) -> None:
    """Found by audit: a decision on the last planned case was reported as "early stop
    after 26 of 26 cases ... even if the 0 remaining cases ...", and the live view said the
    remaining cases could not change it. Nothing remains there: the full evaluation
    decides."""
    with_one_more = EarlyStop(config, len(deltas) + 1)
    decided = [with_one_more.update(d) for d in deltas]
    assert decided[-1] is not None and decided[-2] is None  # decided on exactly that case
    stop = early(deltas, config)
    assert stop.decision is None and stop.reason == ""
