"""`decide_matrices` (the gate on per-arm score matrices, as a large measurement hands it
over) against `decide` on the same scores as per-case lists: the same result, field for field."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolane.messages import GateConfig
from evolane.stats import ScoreMatrix, decide, decide_matrices

# scores that sit on and next to the bars the gates compare with (and -0.0, which a judge
# may print and a sum turns into 0.0)
_SCORE = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 0.5, 1.0 - 1e-13, 1e-13, math.nan, math.nan]),
    st.floats(min_value=0.0, max_value=1.0),
)


@st.composite
def _arms(draw: st.DrawFn) -> tuple[ScoreMatrix, ScoreMatrix]:
    cases = draw(st.integers(min_value=0, max_value=14))
    ids = draw(
        st.lists(st.text(min_size=1, max_size=3), min_size=cases, max_size=cases, unique=True)
    )
    matrices = []
    for _ in range(2):
        reps = draw(st.integers(min_value=1, max_value=4))
        values = draw(st.lists(_SCORE, min_size=cases * reps, max_size=cases * reps))
        matrices.append(ScoreMatrix(ids, np.array(values, dtype=np.float64).reshape(cases, reps)))
    return matrices[0], matrices[1]


_CONFIGS = st.builds(
    GateConfig,
    gate=st.sampled_from(["paired", "bootstrap", "strict", "threshold"]),
    k_se=st.sampled_from([0.0, 1.0, 2.0]),
    threshold=st.sampled_from([0.0, 0.5]),
    no_regression=st.booleans(),
    regression_alpha=st.sampled_from([0.05, 0.5, 1.0]),
    pass_score=st.sampled_from([1.0, 0.5, 0.0]),
    min_cases=st.integers(min_value=1, max_value=4),
    min_coverage=st.sampled_from([0.0, 0.5]),
    bootstrap_samples=st.just(200),
)


@settings(max_examples=300, deadline=None)
@given(_arms(), _CONFIGS, st.one_of(st.none(), st.integers(min_value=0, max_value=20)))
def test_matrices_decide_exactly_as_case_lists_do(
    arms: tuple[ScoreMatrix, ScoreMatrix], config: GateConfig, planned: int | None
) -> None:
    baseline, candidate = arms
    if planned is not None:  # never fewer than the cases (both refuse that alike)
        planned += len(baseline.ids)
    lists = decide(baseline.case_scores(), candidate.case_scores(), config, n_planned=planned)
    assert decide_matrices(baseline, candidate, config, n_planned=planned) == lists


def test_a_repetition_without_a_score_is_left_out_of_its_case_mean() -> None:
    ids = [f"c{i}" for i in range(10)]
    base = ScoreMatrix(ids, np.array([[0.0, math.nan, 0.0]] * 10))
    cand = ScoreMatrix(ids, np.array([[1.0, math.nan, math.nan]] * 10))
    result = decide_matrices(base, cand, GateConfig(min_cases=2))
    assert (result.n, result.mean_delta, result.decision) == (10, 1.0, "accept")


@pytest.mark.parametrize("reps", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.float32])
def test_matrices_of_another_dtype_decide_as_float64_ones(reps: int, dtype: type) -> None:
    ids = [f"c{i}" for i in range(12)]
    rng = np.random.default_rng(reps)
    values = [rng.integers(0, 2, (12, reps)) for _ in range(2)]
    if dtype is np.float32:
        values = [v * np.float32(0.3) for v in values]
    config = GateConfig(gate="paired", min_cases=2)
    wide = [ScoreMatrix(ids, v.astype(np.float64)) for v in values]
    other = [ScoreMatrix(ids, v.astype(dtype)) for v in values]
    assert other[0].scores.dtype == np.float64
    assert decide_matrices(*other, config) == decide_matrices(*wide, config)
    assert decide_matrices(*other, config) == decide(
        wide[0].case_scores(), wide[1].case_scores(), config
    )


def test_a_minus_zero_score_decides_as_zero() -> None:
    ids = [f"c{i}" for i in range(10)]
    base = ScoreMatrix(ids, np.zeros((10, 1)))
    cand = ScoreMatrix(ids, np.full((10, 1), -0.0))
    result = decide_matrices(base, cand, GateConfig())
    assert math.copysign(1.0, result.mean_delta) == 1.0
    assert result == decide(base.case_scores(), cand.case_scores(), GateConfig())


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.inf])
def test_a_score_outside_0_1_is_refused_naming_its_case(bad: float) -> None:
    with pytest.raises(ValueError, match="case 'b'"):
        ScoreMatrix(["a", "b"], np.array([[0.5], [bad]]))


def test_both_arms_must_name_the_same_cases() -> None:
    base = ScoreMatrix(["a", "b"], np.array([[0.5], [0.5]]))
    cand = ScoreMatrix(["b", "a"], np.array([[0.5], [0.5]]))
    with pytest.raises(ValueError, match="same cases"):
        decide_matrices(base, cand, GateConfig())
