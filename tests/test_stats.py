"""Gates, the bootstrap CI and the records of `evolane.stats`, against scipy/numpy references."""

from __future__ import annotations

import math

import numpy as np
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from evolane.messages import MAX_VETOED_LISTED, GateConfig, GateResult, unbounded_fields
from evolane.stats import (
    bootstrap_ci,
    bootstrap_means,
    decide,
    mean_and_se,
    paired_deltas,
    regression_p_value,
    regressions,
)

GATES = ["paired", "bootstrap", "strict", "threshold"]
FAST = {"bootstrap_samples": 2_000}


def arms(deltas: list[float] | np.ndarray) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Baseline and candidate scores whose per-case deltas are exactly ``deltas``."""
    base: dict[str, list[float]] = {}
    cand: dict[str, list[float]] = {}
    for i, d in enumerate(np.asarray(deltas, dtype=float).tolist()):
        base[f"c{i:04d}"] = [max(0.0, -d)]
        cand[f"c{i:04d}"] = [max(0.0, d)]
    return base, cand


def run(deltas: list[float] | np.ndarray, **config: object) -> GateResult:
    """decide() on arms built from ``deltas`` with a small default bootstrap."""
    base, cand = arms(deltas)
    return decide(base, cand, GateConfig(**{**FAST, **config}))


deltas_st = st.lists(
    st.floats(-1.0, 1.0, allow_nan=False).map(lambda x: round(x, 3)), min_size=2, max_size=40
)


# --- pairing and summaries ---------------------------------------------------------------


def test_paired_deltas_average_repetitions_and_keep_only_comparable_cases() -> None:
    base = {"b": [0.0, 1.0], "a": [1.0], "only_base": [1.0], "empty": [1.0]}
    cand = {"a": [0.5, 0.5, 0.5], "b": [1.0], "only_cand": [0.0], "empty": []}
    ids, deltas = paired_deltas(base, cand)
    assert ids == ["a", "b"]
    np.testing.assert_allclose(deltas, [-0.5, 0.5])


@given(deltas_st)
def test_mean_and_se_match_numpy_and_scipy(deltas: list[float]) -> None:
    values = np.array(deltas)
    mean, se = mean_and_se(values)
    assert mean == pytest.approx(float(np.mean(values)), abs=1e-12)
    if np.all(values == values[0]):
        assert se == 0.0
    else:
        assert se == pytest.approx(float(sps.sem(values)), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("bad", [[1.5], [-0.1], [math.nan], [math.inf]])
def test_scores_outside_the_unit_interval_are_refused(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="scores must be finite"):
        decide({"a": [0.5]}, {"a": bad}, GateConfig())


# --- bootstrap ---------------------------------------------------------------------------


@pytest.mark.parametrize("confidence", [0.9, 0.95])
def test_bootstrap_ci_matches_scipy_percentile(confidence: float) -> None:
    deltas = np.random.default_rng(3).normal(0.05, 0.2, 200).clip(-1, 1)
    ours = bootstrap_ci(deltas, confidence, 20_000, seed=11)
    ref = sps.bootstrap(
        (deltas,),
        np.mean,
        confidence_level=confidence,
        n_resamples=20_000,
        method="percentile",
        random_state=np.random.default_rng(5),
    ).confidence_interval
    se = float(sps.sem(deltas))
    # Two independent Monte Carlo runs: their endpoints agree to a small fraction of the SE.
    assert ours[0] == pytest.approx(ref.low, abs=0.08 * se)
    assert ours[1] == pytest.approx(ref.high, abs=0.08 * se)
    z = sps.norm.ppf(0.5 + confidence / 2)
    assert ours[1] - ours[0] == pytest.approx(2 * z * se * math.sqrt(199 / 200), rel=0.05)


def test_bootstrap_ci_is_seeded_and_reproducible() -> None:
    deltas = np.random.default_rng(0).uniform(-1, 1, 300)
    first = bootstrap_ci(deltas, 0.95, 5_000, seed=42)
    assert bootstrap_ci(deltas, 0.95, 5_000, seed=42) == first
    assert bootstrap_ci(deltas.copy(), 0.95, 5_000, seed=43) != first


def test_bootstrap_ci_degenerate_samples() -> None:
    assert bootstrap_ci(np.array([0.3]), 0.95, 100, seed=0) == (0.3, 0.3)
    assert bootstrap_ci(np.full(5, 0.1), 0.95, 100, seed=0) == (0.1, 0.1)
    with pytest.raises(ValueError, match="empty"):
        bootstrap_ci(np.array([]), 0.95, 100, seed=0)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci(np.array([0.0, 1.0]), 1.0, 100, seed=0)


def test_bootstrap_chunking_does_not_change_the_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    deltas = np.random.default_rng(1).uniform(-1, 1, 500)
    one_chunk = bootstrap_means(deltas, 3_000, seed=7)
    monkeypatch.setattr("evolane.stats._bootstrap._CHUNK_ELEMENTS", 1_234)
    np.testing.assert_array_equal(bootstrap_means(deltas, 3_000, seed=7), one_chunk)


def test_bootstrap_handles_samples_larger_than_a_chunk() -> None:
    deltas = np.random.default_rng(1).uniform(-1, 1, 300_000)  # one resample > one chunk
    low, high = bootstrap_ci(deltas, 0.95, 200, seed=0)
    se = float(sps.sem(deltas))
    assert low < deltas.mean() < high
    assert high - low == pytest.approx(2 * 1.96 * se, rel=0.25)


# --- the paired gate ---------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(deltas_st, st.sampled_from([0.0, 1.0, 2.0]), st.sampled_from([-0.2, 0.0, 0.05]))
def test_paired_gate_follows_mean_above_k_times_sem(
    deltas: list[float], k: float, min_effect: float
) -> None:
    values = np.array(deltas)
    result = run(deltas, k_se=k, min_effect=min_effect, min_cases=2)
    mean = float(values.mean())
    if np.all(values == values[0]):
        assert result.reason.startswith("se_zero")
        assert (result.decision == "accept") == (mean > max(0.0, min_effect) + 1e-12)
        return
    bar = k * float(sps.sem(values))
    if abs(mean - bar) < 1e-9 or abs(mean - min_effect) < 1e-9:
        assert result.decision == "reject"  # ties and near-ties never accept
        return
    expected = "accept" if mean > bar and mean > min_effect else "reject"
    assert result.decision == expected
    assert result.n == len(deltas)
    assert result.mean_delta == pytest.approx(mean, abs=1e-12)


def test_paired_gate_accept_reason_reports_both_sides() -> None:
    result = run([0.1, 0.2, 0.15, 0.12, 0.18, 0.11, 0.14, 0.16])
    assert result.decision == "accept"
    assert result.reason == "mean_delta +0.145 > k*SE (1.00 x 0.01225 = 0.01225): accepted"
    floor = run([0.1, 0.2, 0.15, 0.12, 0.18, 0.11, 0.14, 0.16], min_effect=0.2)
    assert floor.reason == "mean_delta +0.145 < min_effect 0.2: rejected"


def test_one_case_fix_is_a_tie_at_k_1_and_the_reason_says_so() -> None:
    # Pass/fail scores, 16 cases: fixing one and breaking none gives mean == SE == 1/16.
    base = {f"c{i:02d}": [0.0] for i in range(16)}
    one = decide(base, base | {"c00": [1.0]}, GateConfig(**FAST))
    assert (one.decision, one.mean_delta, one.se) == ("reject", 0.0625, 0.0625)
    assert one.reason == (
        "tie: mean_delta +0.0625 = k*SE (1.00 x 0.0625 = 0.0625), not above it: rejected"
    )
    two = decide(base, base | {"c00": [1.0], "c01": [1.0]}, GateConfig(**FAST))
    assert two.decision == "accept"
    assert two.reason.startswith("mean_delta +0.125 > k*SE (1.00 x 0.08539 = 0.08539): accepted")


@pytest.mark.parametrize(
    ("deltas", "min_effect", "decision"),
    [
        ([0.25] * 8, 0.0, "accept"),
        ([0.0] * 8, 0.0, "reject"),
        ([-0.25] * 8, -0.5, "reject"),  # max(0, min_effect): equal losses never pass
        ([0.25] * 8, 0.25, "reject"),  # equal to min_effect: not above it
        ([0.25] * 8, 0.3, "reject"),
    ],
)
def test_se_zero_rule(deltas: list[float], min_effect: float, decision: str) -> None:
    result = run(deltas, min_effect=min_effect)
    assert (result.decision, result.se) == (decision, 0.0)
    assert result.reason.startswith("se_zero")
    assert result.ci_low == result.ci_high == result.mean_delta


def test_se_zero_rule_holds_for_repeating_decimals_from_scores() -> None:
    base = {f"c{i}": [0.2, 0.3, 0.4] for i in range(8)}
    cand = {f"c{i}": [0.3, 0.4, 0.5] for i in range(8)}
    result = decide(base, cand, GateConfig(**FAST))
    assert result.se == 0.0
    assert result.decision == "accept" and result.reason.startswith("se_zero")


@pytest.mark.parametrize(
    ("n", "hits", "k"),
    [(8, 1, 1.0), (30, 1, 1.0), (9, 3, 2.0), (10, 5, 3.0), (2, 1, 1.0)],
)
@pytest.mark.parametrize("x", [0.1, 0.3, 1 / 3, 0.7, 1.0])
def test_exact_tie_mean_equals_k_se_rejects_with_tie(n: int, hits: int, k: float, x: float) -> None:
    # `hits` cases of x and the rest 0: mean^2 / SE^2 = hits (n-1) / (n-hits) = k^2 exactly.
    assert hits * (n - 1) / (n - hits) == k * k
    deltas = [x] * hits + [0.0] * (n - hits)
    result = run(deltas, k_se=k, min_cases=2)
    assert result.decision == "reject"
    assert result.reason.startswith("tie")


def test_tie_with_min_effect_rejects() -> None:
    result = run([0.1, 0.3] * 4, k_se=0.0, min_effect=0.2)
    assert (result.decision, result.reason[:3]) == ("reject", "tie")


@given(st.integers(2, 40), st.integers(0, 999))
def test_tie_rule_from_scores_whatever_the_floating_point(n: int, x_milli: int) -> None:
    x = x_milli / 1000 + 1 / 3000  # never exactly representable
    base = {f"c{i}": [0.0] for i in range(n)}
    cand = {f"c{i}": [x if i == 0 else 0.0] for i in range(n)}
    result = decide(base, cand, GateConfig(min_cases=2, **FAST))
    assert (result.decision, result.reason[:3]) == ("reject", "tie")


@settings(max_examples=40, deadline=None)
@given(deltas_st)
def test_paired_gate_is_antisymmetric(deltas: list[float]) -> None:
    forward = run(deltas, min_cases=2)
    backward = run([-d for d in deltas], min_cases=2)
    assert backward.mean_delta == pytest.approx(-forward.mean_delta, abs=1e-12)
    assert backward.se == pytest.approx(forward.se, rel=1e-9)
    assert not (forward.decision == "accept" and backward.decision == "accept")


# --- the other gates ---------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(deltas_st, st.sampled_from([-0.1, 0.0, 0.05]))
def test_bootstrap_gate_accepts_iff_ci_low_above_min_effect(
    deltas: list[float], min_effect: float
) -> None:
    result = run(deltas, gate="bootstrap", min_effect=min_effect, min_cases=2, seed=9)
    low, high = bootstrap_ci(np.array(deltas), 0.95, FAST["bootstrap_samples"], seed=9)
    assert (result.ci_low, result.ci_high) == (low, high)
    if abs(low - min_effect) > 1e-9:
        assert (result.decision == "accept") == (low > min_effect)


def test_bootstrap_gate_tie_and_reproducibility() -> None:
    deltas = np.random.default_rng(2).normal(0.1, 0.2, 40).clip(-1, 1)
    first = run(deltas, gate="bootstrap", seed=4)
    assert run(deltas, gate="bootstrap", seed=4) == first
    tie = run(deltas, gate="bootstrap", seed=4, min_effect=first.ci_low)
    assert (tie.decision, tie.reason[:3]) == ("reject", "tie")


@pytest.mark.parametrize(
    ("deltas", "decision"),
    [
        ([0.0] * 7 + [0.1], "accept"),
        ([0.2] * 8, "accept"),
        ([0.0] * 8, "reject"),
        ([0.5] * 7 + [-0.01], "reject"),
    ],
)
def test_strict_gate(deltas: list[float], decision: str) -> None:
    result = run(deltas, gate="strict")
    assert result.decision == decision
    assert result.reason.startswith("strict")


@pytest.mark.parametrize(
    ("cand_score", "threshold", "decision"),
    [(0.8, 0.7, "accept"), (0.8, 0.8, "accept"), (0.8, 0.81, "reject"), (0.5, 0.1, "reject")],
)
def test_threshold_gate(cand_score: float, threshold: float, decision: str) -> None:
    base = {f"c{i}": [0.6 if cand_score > 0.6 else 0.9] for i in range(8)}
    cand = {f"c{i}": [cand_score] for i in range(8)}
    result = decide(base, cand, GateConfig(gate="threshold", threshold=threshold, **FAST))
    assert result.decision == decision


# --- veto and coverage -------------------------------------------------------------------


@pytest.mark.parametrize("gate", GATES)
def test_no_regression_veto_applies_to_every_gate(gate: str) -> None:
    base = {f"c{i}": [0.0] for i in range(12)} | {"z": [1.0] * 3, "y": [1.0] * 4}
    cand = {f"c{i}": [1.0] for i in range(12)} | {"z": [0.0, 0.2, 0.9], "y": [0.9] * 3}
    config = GateConfig(gate=gate, **FAST)
    # The strict gate rejects any worse case on its own; the veto then names the cases.
    assert decide(base, cand, config).decision == ("reject" if gate == "strict" else "accept")
    vetoed = decide(base, cand, config.model_copy(update={"no_regression": True}))
    assert vetoed.decision == "reject"
    assert vetoed.reason.startswith("regression: 2 case(s)")
    assert vetoed.vetoed_cases == ("y", "z")  # p = 1/C(7,4) = 0.029 and 1/C(6,3) = 0.05


@pytest.mark.parametrize(
    ("base", "cand", "alpha", "vetoed"),
    [
        ([1.0], [0.0], 0.05, False),  # one repetition each: p = 0.5, noise cannot be ruled out
        ([1.0], [0.0], 0.5, True),
        ([1.0], [0.0], 1.0, True),  # regression_alpha = 1: every consistent pass -> fail
        ([1.0] * 3, [0.0] * 3, 0.05, True),  # p = 1/20
        ([1.0] * 2, [0.0] * 2, 0.05, False),  # p = 1/6
        ([1.0] * 3, [0.0, 0.0, 1.0], 1.0, False),  # the candidate passed once: not consistent
        ([1.0, 1.0, 0.0], [0.0] * 3, 1.0, False),  # the parent failed once: not consistent
        ([1.0] * 5, [0.0], 0.2, True),  # p = 1/6
        ([0.95] * 3, [0.94] * 3, 0.05, False),  # below pass_score 1.0 on both sides
    ],
)
def test_regression_rule_needs_every_repetition_and_evidence(
    base: list[float], cand: list[float], alpha: float, vetoed: bool
) -> None:
    config = GateConfig(no_regression=True, regression_alpha=alpha)
    assert regressions({"a": base}, {"a": cand}, config) == (["a"] if vetoed else [])


def test_regression_p_value_is_fishers_exact() -> None:
    for rb in range(1, 6):
        for rc in range(1, 6):
            table = [[rb, 0], [0, rc]]  # parent passes all rb, candidate fails all rc
            expected = sps.fisher_exact(table, alternative="greater").pvalue
            assert regression_p_value(rb, rc) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError):
        regression_p_value(0, 1)


def test_veto_is_noise_tolerant_for_a_better_candidate_seeded() -> None:
    # A truly better candidate (+0.3 on flaky cases), one noisy repetition per arm:
    # the old per-case-mean rule vetoed almost always, the new one never can.
    rng = np.random.default_rng(3)
    config = GateConfig(no_regression=True)
    old = new = 0
    for _ in range(200):
        p = rng.uniform(0.3, 0.7, 24)
        base = {f"c{i}": [float(rng.random() < q)] for i, q in enumerate(p)}
        cand = {f"c{i}": [float(rng.random() < q + 0.3)] for i, q in enumerate(p)}
        old += any(base[c][0] == 1.0 > cand[c][0] for c in base)
        new += bool(regressions(base, cand, config))
    assert old >= 150 and new == 0


def test_veto_passes_cases_at_the_pass_score_within_rounding() -> None:
    base = {f"c{i}": [0.1, 0.2, 0.3] for i in range(8)}
    cand = {f"c{i}": [0.2, 0.2, 0.2 + (0.1 if i else 0.0)] for i in range(8)}
    config = GateConfig(no_regression=True, pass_score=0.2, k_se=0.0, **FAST)
    assert decide(base, cand, config).vetoed_cases == ()


def test_vetoed_cases_are_capped_and_counted() -> None:
    base = {f"c{i:03d}": [1.0] * 3 for i in range(40)}
    cand = {f"c{i:03d}": [0.0] * 3 for i in range(40)}
    result = decide(base, cand, GateConfig(no_regression=True, **FAST))
    assert len(result.vetoed_cases) == MAX_VETOED_LISTED
    assert list(result.vetoed_cases) == sorted(result.vetoed_cases)
    assert "40 case(s)" in result.reason


def test_coverage_guard_comes_first() -> None:
    base = {f"c{i}": [1.0] * 3 for i in range(20)}
    cand = {f"c{i}": [0.0] * 3 for i in range(5)}  # 5 comparable of 20 planned
    result = decide(base, cand, GateConfig(no_regression=True, min_cases=4, **FAST))
    assert (result.decision, result.n, result.n_planned) == ("indecisive", 5, 20)
    assert result.reason.startswith("coverage")
    assert result.vetoed_cases  # still reported
    few = decide(base, cand, GateConfig(min_cases=8, min_coverage=0.0, **FAST))
    assert (few.decision, few.reason[:8]) == ("indecisive", "coverage")
    enough = decide(base, cand, GateConfig(min_cases=4, min_coverage=0.25, **FAST))
    assert enough.decision == "reject"
    assert decide(base, cand, GateConfig(min_cases=4, **FAST), n_planned=5).decision == "reject"


def test_coverage_guard_edge_cases() -> None:
    one = decide({"a": [0.0]}, {"a": [1.0]}, GateConfig(min_cases=1))
    assert (one.decision, one.se, one.ci_low, one.ci_high) == ("indecisive", 0.0, 1.0, 1.0)
    assert "SE undefined" in one.reason
    strict = decide({"a": [0.0]}, {"a": [1.0]}, GateConfig(gate="strict", min_cases=1))
    assert strict.decision == "accept"
    none = decide({"a": [0.0]}, {"b": [1.0]}, GateConfig())
    assert (none.decision, none.n, none.n_planned, none.mean_delta) == ("indecisive", 0, 2, 0.0)
    empty = decide({}, {}, GateConfig())
    assert (empty.decision, empty.n_planned) == ("indecisive", 0)
    with pytest.raises(ValueError, match="n_planned"):
        decide({"a": [0.0], "b": [0.0]}, {"a": [1.0], "b": [1.0]}, GateConfig(), n_planned=1)


# --- results and records -----------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(deltas_st, st.sampled_from(GATES), st.integers(0, 2**32))
def test_every_result_carries_its_evidence_and_is_deterministic(
    deltas: list[float], gate: str, seed: int
) -> None:
    base, cand = arms(deltas)
    config = GateConfig(gate=gate, seed=seed, min_cases=2, **FAST)
    result = decide(base, cand, config)
    shuffled = dict(reversed(list(base.items())))
    assert decide(shuffled, cand, config) == result
    assert result.n == result.n_planned == len(deltas)
    assert result.ci_low <= result.mean_delta + 1e-12
    assert result.mean_delta <= result.ci_high + 1e-12
    assert result.decision in ("accept", "reject")
    assert result.reason


def test_records_are_frozen_closed_and_bounded() -> None:
    config = GateConfig()
    with pytest.raises(pydantic.ValidationError):
        GateConfig(unknown=1)
    with pytest.raises(pydantic.ValidationError):
        GateConfig(confidence=1.0)
    with pytest.raises(pydantic.ValidationError):
        config.k_se = 2.0  # type: ignore[misc]
    assert unbounded_fields(GateResult) == []
    assert unbounded_fields(GateConfig) == []


def test_a_maximal_gate_result_stays_small() -> None:
    import orjson

    heavy = "\U0001f600"
    result = GateResult(
        gate="threshold",
        n=10**9,
        n_planned=10**9,
        mean_delta=-0.123456789012345,
        se=0.123456789012345,
        ci_low=-0.123456789012345,
        ci_high=0.123456789012345,
        decision="indecisive",
        reason="\x00" * 256,
        vetoed_cases=tuple(heavy * 128 for _ in range(MAX_VETOED_LISTED)),
    )
    assert len(orjson.dumps(result.model_dump(mode="json"))) <= 8 * 1024
