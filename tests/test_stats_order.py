"""The seeded case order (issue 16): a stable, input-order-free permutation."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolane.stats import _order, case_order

ids = st.lists(st.text(min_size=0, max_size=12), unique=True, max_size=60)


@given(ids, st.integers(0, 2**63 - 1), st.randoms())
def test_a_permutation_that_ignores_the_input_order(
    cases: list[str], seed: int, shuffle: object
) -> None:
    ordered = case_order(cases, seed)
    assert sorted(ordered) == sorted(cases)
    mixed = list(cases)
    shuffle.shuffle(mixed)  # type: ignore[attr-defined]
    assert case_order(mixed, seed) == ordered


@given(ids, st.integers(0, 1000), st.data())
def test_removing_a_case_keeps_the_others_in_order(
    cases: list[str], seed: int, data: st.DataObject
) -> None:
    if not cases:
        return
    gone = data.draw(st.sampled_from(cases))
    kept = case_order([c for c in cases if c != gone], seed)
    assert kept == [c for c in case_order(cases, seed) if c != gone]


def test_stable_across_versions_and_seeds() -> None:
    # Golden values: the rank is sha256 of the seed and the id, the same on every Python,
    # platform and process (no `random`, no hash randomisation).
    cases = [f"case{i}" for i in range(6)]
    assert case_order(cases, 0) == ["case2", "case3", "case0", "case4", "case5", "case1"]
    spec = sorted(
        cases, key=lambda c: hashlib.sha256(f"evolane-case-order\x007\x00{c}".encode()).digest()
    )
    assert case_order(cases, 7) == spec
    orders = {tuple(case_order([f"c{i}" for i in range(8)], seed)) for seed in range(20)}
    assert len(orders) == 20


def test_file_order_carries_no_weight() -> None:
    # The first half of a 200-case file lands evenly in both halves of the reading order.
    cases = [f"case{i:03d}" for i in range(200)]
    first = set(cases[:100])
    for seed in range(5):
        early = case_order(cases, seed)[:100]
        assert 35 <= len(first.intersection(early)) <= 65


def test_refusals() -> None:
    with pytest.raises(ValueError, match="duplicate case ids: \\['a'\\]"):
        case_order(["a", "b", "a"], 0)
    with pytest.raises(ValueError):
        case_order(["a"], -1)


@given(ids, st.integers(0, 2**63 - 1))
def test_the_order_is_the_sort_by_key_then_id(cases: list[str], seed: int) -> None:
    expected = sorted(cases, key=lambda case: (_order.case_key(case, seed), case))
    assert case_order(cases, seed) == expected


@given(ids, st.integers(1, 4))
def test_equal_keys_are_ordered_by_the_id(cases: list[str], buckets: int) -> None:
    # keys that collide in runs (sha256 never does in practice): the id breaks each tie
    def colliding(case: str, seed: int) -> bytes:
        return bytes([len(case) % buckets]) * 32

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_order, "case_key", colliding)
        got = case_order(cases, 0)
    assert got == sorted(cases, key=lambda case: (colliding(case, 0), case))


def test_a_skipped_case_is_not_read_nor_any_case_of_its_cluster() -> None:
    """A measurement's ``skip_case_ids`` (a case screening chose the candidate on) leave the
    reading order with every case of their clusters; the other cases keep their numbers."""
    from evolane.measure._layout import skipping

    cases = [f"c{i}" for i in range(8)]
    clusters = {"c1": "k", "c4": "k", "c6": "j", "c7": "c0"}  # a cluster named like a case
    assert skipping(cases, ("c4",), clusters) == ["c0", "c2", "c3", "c5", "c6", "c7"]
    assert skipping(cases, ("c0",), clusters) == cases[1:]  # c7's cluster is not case c0
    assert skipping(cases, ("c2",), {}) == ["c0", "c1", "c3", "c4", "c5", "c6", "c7"]
    assert skipping(cases, ("c6", "c1"), clusters) == ["c0", "c2", "c3", "c5", "c7"]
