"""One rule says whether a case passes on an arm (the mean of its runs reaches the pass
score): the decision's "fixed N, broken M" and report.md's per-case table count alike, also
for repeated runs that disagree."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolane.campaign._case_rows import _case_row
from evolane.campaign._verdict import fixed_and_broken
from evolane.store import BlobStore
from evolane.views import mean_passes


def _units(case: str, arm: str, scores: list[float | None]) -> list[dict[str, Any]]:
    """Unit records of one arm; a None score is a run that failed on infrastructure."""
    return [
        {"case": case, "arm": arm, "score": score, "status": "done"}
        if score is not None
        else {"case": case, "arm": arm, "score": None, "status": "timed_out"}
        for score in scores
    ]


@pytest.fixture(scope="module")
def blobs(tmp_path_factory: pytest.TempPathFactory) -> BlobStore:
    return BlobStore(tmp_path_factory.mktemp("rule") / "blobs")


def _table_change(blobs: BlobStore, base: list[Any], cand: list[Any], bar: float) -> str:
    runs = {"baseline": _units("c", "baseline", base), "candidate": _units("c", "candidate", cand)}
    row = _case_row("val", "c", runs, blobs, bar)
    assert row is not None
    return row.change


def _decision_change(base: list[Any], cand: list[Any], bar: float) -> str:
    units = _units("c", "baseline", base) + _units("c", "candidate", cand)
    fixed, broken = fixed_and_broken(units, bar)
    return "fixed" if fixed else "broken" if broken else "same"


def _same(change: str) -> str:
    """The table's "unjudged" (no score on one side) is what the decision leaves uncounted."""
    return "same" if change == "unjudged" else change


def test_a_flaky_parent_that_passes_on_average_is_broken_in_both(blobs: BlobStore) -> None:
    # The parent's two runs score 1 and 0 (mean 0.5, the pass score); the candidate fails both.
    assert _decision_change([1.0, 0.0], [0.0, 0.0], 0.5) == "broken"
    assert _table_change(blobs, [1.0, 0.0], [0.0, 0.0], 0.5) == "broken"


def test_a_mean_a_rounding_below_the_pass_score_passes() -> None:
    assert mean_passes([0.7, 0.7, 0.7], 0.7)  # 2.0999.../3 < 0.7 in floats
    assert not mean_passes([0.7, 0.6999], 0.7) and not mean_passes([], 0.0)


runs = st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.7, 1.0, None]), min_size=1, max_size=4)


@settings(max_examples=60)
@given(base=runs, cand=runs, bar=st.sampled_from([0.5, 0.7, 1.0]))
def test_the_decision_and_the_table_never_disagree(
    blobs: BlobStore, base: list[Any], cand: list[Any], bar: float
) -> None:
    assert _decision_change(base, cand, bar) == _same(_table_change(blobs, base, cand, bar))


def test_a_side_with_only_infrastructure_failures_is_unjudged_not_broken(
    blobs: BlobStore,
) -> None:
    assert _table_change(blobs, [1.0], [None], 1.0) == "unjudged"
    assert _table_change(blobs, [None], [1.0], 1.0) == "unjudged"
    assert _decision_change([1.0], [None], 1.0) == "same"  # not counted either way
