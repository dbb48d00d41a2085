"""The report's per-arm score CI (`case_mean_ci`): it never collapses and it covers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evolane.stats import bootstrap_ci, case_mean_ci, clopper_pearson
from evolane.stats._dist import beta_quantile, beta_regularized


def _cases(scores: list[float] | np.ndarray) -> dict[str, list[float]]:
    return {f"c{i}": [float(s)] for i, s in enumerate(scores)}


def test_beta_quantile_inverts_the_incomplete_beta() -> None:
    for a, b, p in ((1.0, 8.0, 0.975), (2.5, 0.7, 0.1), (30.0, 12.0, 0.5)):
        assert beta_regularized(a, b, beta_quantile(p, a, b)) == pytest.approx(p, abs=1e-10)


def test_all_failed_is_not_a_point() -> None:
    # the bootstrap gave (0, 0): 8 failures do not show a true rate of exactly 0
    mean, low, high, n = case_mean_ci(_cases([0.0] * 8), confidence=0.95, seed=0)
    assert (mean, low, n) == (0.0, 0.0, 8)
    assert high == pytest.approx(1.0 - 0.025 ** (1 / 8), abs=1e-9)  # Clopper-Pearson, x = 0
    mean, low, high, _ = case_mean_ci(_cases([1.0] * 8), confidence=0.95, seed=0)
    assert mean == high == 1.0 and low == pytest.approx(0.025 ** (1 / 8), abs=1e-9)


def test_clopper_pearson_known_value() -> None:
    low, high = clopper_pearson(3, 10, 0.95)
    assert (low, high) == (pytest.approx(0.06674, abs=1e-4), pytest.approx(0.65245, abs=1e-4))


def test_a_nearly_all_zero_graded_arm_is_wider_than_its_bootstrap() -> None:
    scores = np.array([0.0] * 11 + [0.25])
    _, low, high, _ = case_mean_ci(_cases(scores), confidence=0.95, seed=0)
    boot_low, boot_high = bootstrap_ci(scores, 0.95, 2000, 0)
    assert low == boot_low == 0.0 and high > boot_high + 0.03


def test_coverage_on_a_hard_pass_fail_task() -> None:
    # review: 80% of cases pass 1% of the time, 20% pass 30%: truth 0.068; the bootstrap
    # covered 43% at 8 cases and 68% at 16
    rng = np.random.default_rng(2)
    truth, trials = 0.8 * 0.01 + 0.2 * 0.3, 400
    for n in (8, 16):
        covered = 0
        for _ in range(trials):
            p = rng.choice([0.01, 0.3], size=n, p=[0.8, 0.2])
            found = case_mean_ci(_cases(rng.random(n) < p), confidence=0.95, seed=0)
            assert found is not None
            covered += found[1] <= truth <= found[2]
        assert covered / trials >= 0.93, (n, covered)


def test_coverage_on_a_mostly_zero_rubric() -> None:
    rng = np.random.default_rng(5)
    weights, levels = [0.85, 0.08, 0.04, 0.02, 0.01], [0.0, 0.25, 0.5, 0.75, 1.0]
    truth, trials, covered = float(np.dot(weights, levels)), 300, 0
    for _ in range(trials):
        found = case_mean_ci(_cases(rng.choice(levels, 16, p=weights)), confidence=0.95, seed=0)
        assert found is not None
        covered += found[1] <= truth <= found[2]
    assert covered / trials >= 0.93, covered  # the bootstrap: about 0.80


def test_a_dense_graded_arm_keeps_the_bootstraps_width() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        scores = rng.beta(8, 4, size=16)
        _, low, high, _ = case_mean_ci(_cases(scores), confidence=0.95, seed=0)
        boot_low, boot_high = bootstrap_ci(scores, 0.95, 2000, 0)
        assert low <= boot_low and high >= boot_high
        assert high - low <= 1.1 * (boot_high - boot_low)
        assert math.isfinite(low) and 0.0 <= low < high <= 1.0


@pytest.mark.parametrize("n", [18, 26])
def test_a_graded_arm_scoring_the_same_everywhere_is_not_a_point(n: int) -> None:
    """n graded scores of 0.05: their variance is rounding noise (1e-35), which made the
    effective sample 1.7e34 cases: at 18 the beta quantile overflowed (the run's report
    failed, exit 1, no report) and at 26 the interval was [0.05, 0.05]. No spread means n
    cases, as for pass/fail scores."""
    mean, low, high, count = case_mean_ci(_cases([0.05] * n), confidence=0.95, seed=0)
    assert count == n and mean == pytest.approx(0.05)
    expected = clopper_pearson(0.05 * n, n, 0.95)
    assert (low, high) == (pytest.approx(expected[0]), pytest.approx(expected[1]))
    assert high - low > 0.1


def test_a_nearly_constant_graded_arm_stays_finite() -> None:
    scores = np.array([0.05] * 20 + [0.05 + 1e-9])
    mean, low, high, _ = case_mean_ci(_cases(scores), confidence=0.95, seed=0)
    assert low <= mean <= high and math.isfinite(low) and math.isfinite(high)
