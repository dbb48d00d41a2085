"""Early stopping: the anytime-valid sequential test, `settled` bounds and `EarlyStop`."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from evolane.messages import GateConfig
from evolane.stats import Running, SequentialTest, decide, settled

ALPHA = 0.05
Sampler = Callable[[np.random.Generator, int], np.ndarray]


def arms(deltas: list[float]) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Baseline and candidate scores whose per-case deltas are exactly ``deltas``."""
    base = {f"c{i:04d}": [max(0.0, -d)] for i, d in enumerate(deltas)}
    cand = {f"c{i:04d}": [max(0.0, d)] for i, d in enumerate(deltas)}
    return base, cand


def full_decision(deltas: list[float], config: GateConfig) -> str:
    """The decision of the full evaluation of ``deltas``."""
    return decide(*arms(deltas), config.model_copy(update={"bootstrap_samples": 1})).decision


# --- the sequential test -----------------------------------------------------------------


def test_sequential_test_decides_clear_streams_and_sticks() -> None:
    up = SequentialTest(ALPHA)
    for _ in range(20):
        up.update(1.0)
    assert (up.decision, up.n) == ("accept", 20)
    for _ in range(200):
        up.update(-1.0)  # the first decision stands
    assert up.decision == "accept"
    down = SequentialTest(ALPHA)
    for _ in range(20):
        down.update(-0.5)
    assert down.decision == "reject"
    idle = SequentialTest(ALPHA)
    for _ in range(500):
        idle.update(0.0)
    assert idle.decision == "continue"
    assert idle.wealth == (1.0, 1.0)


def test_sequential_test_margin_and_validation() -> None:
    test = SequentialTest(ALPHA, margin=0.2)
    for _ in range(200):
        test.update(0.15)  # positive, but below the margin
    assert test.decision == "reject"
    with pytest.raises(ValueError):
        SequentialTest(0.0)
    with pytest.raises(ValueError):
        SequentialTest(ALPHA, margin=1.0)
    with pytest.raises(ValueError):
        SequentialTest(ALPHA).update(1.5)
    with pytest.raises(ValueError):
        SequentialTest(ALPHA).update(math.nan)


@given(st.lists(st.sampled_from([-1.0, 1.0, -0.999, 0.999, 0.0]), max_size=300))
def test_sequential_wealth_stays_positive_and_finite(deltas: list[float]) -> None:
    test = SequentialTest(ALPHA)
    for d in deltas:
        test.update(d)
    assert all(0.0 < w < math.inf for w in test.wealth)


SYMMETRIC: dict[str, Sampler] = {
    "uniform": lambda rng, n: rng.uniform(-1.0, 1.0, n),
    "rademacher": lambda rng, n: rng.choice([-1.0, 1.0], n),
    "narrow": lambda rng, n: rng.normal(0.0, 0.07, n).clip(-1.0, 1.0),
    "ternary": lambda rng, n: rng.choice([-1.0, 0.0, 0.0, 1.0], n),
}


def false_decision_rates(sampler: Sampler, trials: int, steps: int, seed: int) -> tuple[float, ...]:
    """(accept, reject) rates of the sequential test on mean-zero streams, stopped at decision."""
    rng = np.random.default_rng(seed)
    accepted = rejected = 0
    for _ in range(trials):
        test = SequentialTest(ALPHA)
        for d in sampler(rng, steps).tolist():
            test.update(d)
            if test.decision != "continue":
                break
        accepted += test.decision == "accept"
        rejected += test.decision == "reject"
    return accepted / trials, rejected / trials


@pytest.mark.parametrize("name", ["uniform", "narrow"])
def test_false_accept_rate_at_zero_effect_stays_below_alpha(name: str) -> None:
    accept, reject = false_decision_rates(SYMMETRIC[name], trials=1_000, steps=100, seed=1)
    assert accept <= ALPHA
    assert reject <= ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SYMMETRIC))
def test_false_accept_rate_over_long_streams(name: str) -> None:
    accept, reject = false_decision_rates(SYMMETRIC[name], trials=1_000, steps=3_000, seed=2)
    assert accept <= ALPHA
    assert reject <= ALPHA


# --- settled -----------------------------------------------------------------------------


def completions(rng: np.random.Generator, remaining: int) -> list[list[float]]:
    """Extreme and random completions of ``remaining`` deltas in [-1, 1]."""
    half = remaining // 2
    fixed = [
        [1.0] * remaining,
        [-1.0] * remaining,
        [0.0] * remaining,
        [1.0] * half + [-1.0] * (remaining - half),
        [1.0] * (remaining - 1) + [-1.0] * min(1, remaining),
        [-1.0] * (remaining - 1) + [1.0] * min(1, remaining),
    ]
    drawn = [rng.uniform(-1, 1, remaining).round(3).tolist() for _ in range(6)]
    drawn += [rng.choice([-1.0, 0.0, 1.0], remaining).tolist() for _ in range(4)]
    return fixed + drawn


configs = st.builds(
    GateConfig,
    k_se=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    min_effect=st.sampled_from([-0.1, 0.0, 0.05]),
    min_cases=st.sampled_from([2, 8]),
    no_regression=st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1, 1), max_size=30),
    st.sampled_from([0.0, 0.3, 0.6, 1.0]),
    st.sampled_from([-0.8, -0.3, 0.0, 0.3, 0.8]),
    st.integers(0, 30),
    configs,
    st.integers(0, 2**32),
)
def test_settled_is_never_wrong(
    noise: list[float],
    scale: float,
    bias: float,
    remaining: int,
    config: GateConfig,
    seed: int,
) -> None:
    seen = [round(min(1.0, max(-1.0, bias + scale * x)), 2) for x in noise]
    verdict = settled(seen, remaining, config)
    event(f"settled: {verdict}")
    if verdict is None:
        return
    assert not (verdict == "accept" and config.no_regression)
    rng = np.random.default_rng(seed)
    for rest in completions(rng, remaining):
        assert full_decision(seen + rest, config) == verdict


def test_settled_is_never_wrong_on_seeded_biased_streams() -> None:
    rng = np.random.default_rng(7)
    checked = {"accept": 0, "reject": 0}
    for _ in range(800):
        final_n = int(rng.integers(8, 40))
        seen_n = int(rng.integers(1, final_n + 1))
        bias = rng.choice([-1, 1]) * rng.uniform(0.3, 1.0)
        seen = (bias + rng.uniform(-0.2, 0.2) * rng.standard_normal(seen_n)).clip(-1, 1)
        config = GateConfig(k_se=float(rng.choice([0.0, 1.0, 3.0])), min_effect=0.02)
        verdict = settled(seen.round(3).tolist(), final_n - seen_n, config)
        if verdict is None:
            continue
        checked[verdict] += 1
        for rest in completions(rng, final_n - seen_n):
            assert full_decision(seen.round(3).tolist() + rest, config) == verdict
    assert min(checked.values()) >= 100, checked


def test_settled_is_never_wrong_on_small_grids_exhaustively() -> None:
    grid = [-1.0, -0.5, 0.0, 0.5, 1.0]
    config = GateConfig(min_cases=2, k_se=1.0)
    decided = 0
    for seen_n, remaining in itertools.product(range(4), range(4)):
        for seen in itertools.product(grid, repeat=seen_n):
            verdict = settled(list(seen), remaining, config)
            if verdict is None:
                continue
            decided += 1
            for rest in itertools.product(grid, repeat=remaining):
                assert full_decision(list(seen + rest), config) == verdict
    assert decided > 100


def test_settled_decides_what_is_certain() -> None:
    config = GateConfig()
    assert settled([-1.0] * 10, 6, config) == "reject"  # mean <= (-10 + 6) / 16 < 0
    assert settled([1.0] * 12, 4, config) == "accept"  # mean >= 8 / 16, SE <= 0.13
    assert settled([0.1] * 10, 6, config) is None
    assert settled([1.0] * 12, 4, config.model_copy(update={"no_regression": True})) is None
    assert settled([1.0, -1.0] * 3, 1, config) is None  # 7 < min_cases
    spread = [1.0, -1.0] * 8 + [0.05] * 8
    assert settled(spread, 2, config) == "reject"  # k * SE >= 0.19 whatever comes
    assert settled([0.3] * 5 + [-0.01], 10, GateConfig(gate="strict")) == "reject"
    assert settled([0.3] * 5, 0, GateConfig(gate="bootstrap")) is None
    with pytest.raises(ValueError):
        settled([2.0], 1, config)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1, 1).map(lambda x: round(x, 2)), min_size=8, max_size=40))
def test_settled_with_nothing_remaining_agrees_with_decide(deltas: list[float]) -> None:
    config = GateConfig()
    verdict = settled(deltas, 0, config)
    if verdict is not None:
        assert verdict == full_decision(deltas, config)


# --- settled keeps its answers with O(1) bookkeeping ----------------------------------


def legacy_settled(deltas: list[float], remaining: int, config: GateConfig) -> str | None:
    """The re-summing `settled` from before issue 16, as the reference for the running one."""
    values = [float(d) for d in deltas]
    if config.gate == "strict":
        return "reject" if any(d < -1e-12 for d in values) else None
    final_n = len(values) + remaining
    if config.gate != "paired" or final_n < max(config.min_cases, 2):
        return None
    total = math.fsum(values)
    seen_mean = total / len(values) if values else 0.0
    spread = math.fsum((d - seen_mean) ** 2 for d in values) if values else 0.0
    k = config.k_se
    highest = (total + remaining) / final_n
    se_low = math.sqrt(spread / (final_n * (final_n - 1)))
    if highest <= max(0.0, config.min_effect) or highest <= k * se_low:
        return "reject"
    if config.no_regression:
        return None
    lowest = (total - remaining) / final_n
    if lowest <= 1e-9:
        return None
    squares = math.fsum(d * d for d in values) + remaining
    se_high = math.sqrt(max(0.0, squares - final_n * lowest * lowest) / (final_n * (final_n - 1)))
    return "accept" if lowest > max(k * se_high, config.min_effect) + 1e-9 else None


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.floats(-1, 1).map(lambda x: round(x, 3)), max_size=60),
    st.integers(0, 40),
    configs,
)
def test_running_settled_matches_the_re_summing_one(
    deltas: list[float], remaining: int, config: GateConfig
) -> None:
    assert settled(deltas, remaining, config) == legacy_settled(deltas, remaining, config)


@given(st.lists(st.floats(-1, 1), min_size=1, max_size=200))
def test_running_sums_are_as_accurate_as_fsum(deltas: list[float]) -> None:
    running = Running(deltas)
    mean = math.fsum(deltas) / len(deltas)
    assert running.n == len(deltas)
    assert running.total == pytest.approx(math.fsum(deltas), abs=1e-13)
    assert running.squares == pytest.approx(math.fsum(d * d for d in deltas), abs=1e-13)
    spread = math.fsum((d - mean) ** 2 for d in deltas)
    assert running.spread == pytest.approx(spread, rel=1e-9, abs=1e-12)
