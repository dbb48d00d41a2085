"""The budget ledger's semantics (pure, no actors) and its spending bound under concurrency."""

from __future__ import annotations

import random
from collections import deque

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolane.measure._budget import PROBE_RUNNING, SAMPLES_KEPT, Ledger, upper_quartile
from evolane.messages import Usage


def test_a_second_reservation_for_the_same_item_is_denied() -> None:
    ledger = Ledger(ceilings=Usage(tokens=100))
    assert ledger.reserve("replay", "u1", Usage(tokens=10, cost_usd=0)) == (True, "granted")
    granted, reason = ledger.reserve("replay", "u1", Usage(tokens=10, cost_usd=0))
    assert not granted and "already" in reason


def test_without_an_estimate_one_probe_per_stage_runs_under_an_active_ceiling() -> None:
    ledger = Ledger(ceilings=Usage(cost_usd=1.0))
    assert ledger.reserve("judge", "u1", None) == (True, "granted")  # the probe
    assert ledger.reserve("judge", "u2", Usage(tokens=5)) == (False, PROBE_RUNNING)  # cost unknown
    assert ledger.reserve("replay", "r1", None)[0]  # another stage has its own probe
    assert ledger.reserve("judge", "u3", None, zero_cost=True)[0]
    ledger.debit("u1", Usage(tokens=1, cost_usd=0.2, wall_seconds=1.0))
    estimate = ledger.estimate("judge")
    assert estimate is not None and estimate.cost_usd == 0.2
    assert ledger.reserve("judge", "u4", estimate)[0]  # an estimate now exists
    assert Ledger().reserve("judge", "u5", None)[0]  # no ceiling: nothing to protect


def test_a_cached_unit_is_no_sample_of_what_a_fresh_one_costs() -> None:
    """Cached answers cost 0: taken as samples, they made the estimate 0, and fresh calls
    then reserved nothing, every lane's at once, past the ceiling."""
    ledger = Ledger(ceilings=Usage(cost_usd=0.0025))
    for index in range(12):
        assert ledger.reserve("judge", f"c{index}", ledger.estimate("judge"))[0]
        ledger.debit(f"c{index}", Usage(tokens=0, cost_usd=0, wall_seconds=0.01, cached=True))
    assert ledger.snapshot().spent.cost_usd == 0
    assert ledger.estimate("judge") is None  # still unknown: the next fresh unit probes
    assert ledger.reserve("judge", "f1", ledger.estimate("judge"))[0]
    assert ledger.reserve("judge", "f2", ledger.estimate("judge")) == (False, PROBE_RUNNING)
    ledger.debit("f1", Usage(tokens=1000, cost_usd=0.001, wall_seconds=0.3))
    estimate = ledger.estimate("judge")
    assert estimate is not None and estimate.cost_usd == 0.001
    granted = [ledger.reserve("judge", f"g{index}", estimate)[0] for index in range(8)]
    assert granted.count(True) == 2  # room for what is left under the ceiling, no more


def test_a_denial_changes_no_state() -> None:
    ledger = Ledger(ceilings=Usage(tokens=10))
    ledger.reserve("replay", "u1", Usage(tokens=10, cost_usd=0))
    before = ledger.snapshot()
    assert not ledger.reserve("replay", "u2", Usage(tokens=1, cost_usd=0))[0]
    assert ledger.snapshot() == before


def test_incomplete_usage_is_charged_at_least_the_reservation_and_overruns_are_recorded() -> None:
    ledger = Ledger(ceilings=Usage(tokens=1000))
    ledger.reserve("replay", "u1", Usage(tokens=100, cost_usd=0.1))
    ledger.debit("u1", Usage(tokens=30), complete=False)  # cost unknown, tokens partial
    assert ledger.snapshot().spent.tokens == 100 and ledger.snapshot().spent.cost_usd == 0.1
    ledger.reserve("replay", "u2", Usage(tokens=100, cost_usd=0.1))
    events = ledger.debit("u2", Usage(tokens=250, cost_usd=0.1), complete=True)
    assert ledger.snapshot().spent.tokens == 350
    assert [o.item for o in ledger.overruns] == ["u2"] and ledger.overruns[0].charged == 250
    assert any(e.level == "overrun" and e.item == "u2" for e in events)
    ledger.reserve("replay", "u3", Usage(tokens=5, cost_usd=0))
    ledger.release("u3")
    assert ledger.snapshot().in_flight == 0 and ledger.snapshot().spent.tokens == 350


def test_threshold_events_fire_once_each() -> None:
    ledger = Ledger(ceilings=Usage(tokens=100))
    levels = []
    for i in range(12):
        if ledger.reserve("replay", f"u{i}", Usage(tokens=10, cost_usd=0))[0]:
            levels += [e.level for e in ledger.debit(f"u{i}", Usage(tokens=10, cost_usd=0))]
    assert levels == ["50%", "80%", "100%"]


def test_the_robust_estimate_is_the_upper_quartile_of_the_last_64_samples() -> None:
    ledger = Ledger(cold_start={"replay": Usage(tokens=500)})
    assert ledger.estimate("replay") == Usage(tokens=500)
    for i in range(200):
        ledger.reserve("replay", f"u{i}", Usage(tokens=1))
        ledger.debit(f"u{i}", Usage(tokens=float(i), cost_usd=0.0, wall_seconds=1.0))
    recent = list(range(136, 200))
    expected = recent[47] + 0.25 * (recent[48] - recent[47])  # numpy's linear 75th percentile
    assert ledger.estimate("replay").tokens == pytest.approx(expected)  # type: ignore[union-attr]
    assert ledger.estimate("replay", units=3).tokens == pytest.approx(3 * expected)  # type: ignore[union-attr]
    assert ledger.estimate("judge") is None


def test_a_unit_that_cannot_finish_before_the_wall_deadline_is_denied() -> None:
    now = [100.0]
    ledger = Ledger(deadline=110.0, clock=lambda: now[0])
    assert ledger.reserve("replay", "u1", Usage(wall_seconds=5))[0]
    assert not ledger.reserve("replay", "u2", Usage(wall_seconds=11))[0]


@pytest.mark.parametrize("seed", range(20))
def test_spending_never_exceeds_the_ceiling_plus_the_largest_reservation(seed: int) -> None:
    rng = random.Random(seed)
    ceiling = 1000.0
    ledger = Ledger(ceilings=Usage(tokens=ceiling, cost_usd=ceiling))
    in_flight: dict[str, float] = {}
    largest = 0.0
    for step in range(2000):
        if in_flight and (rng.random() < 0.5 or len(in_flight) > 8):
            item = rng.choice(sorted(in_flight))
            reserved = in_flight.pop(item)
            used = rng.uniform(0, reserved)  # a unit stays within its reservation
            ledger.debit(item, Usage(tokens=used, cost_usd=used), complete=rng.random() < 0.8)
        else:
            estimate = rng.uniform(1, 120)
            if ledger.reserve("replay", f"u{step}", Usage(tokens=estimate, cost_usd=estimate))[0]:
                in_flight[f"u{step}"] = estimate
                largest = max(largest, estimate)
        spent = ledger.snapshot().spent.tokens
        assert spent is not None and spent <= ceiling + largest


@given(
    st.lists(
        st.floats(min_value=0, max_value=1e12, allow_nan=False) | st.integers(0, 50).map(float),
        min_size=1,
        max_size=SAMPLES_KEPT,
    )
)
def test_upper_quartile_is_numpy_percentile_75_bit_for_bit(samples: list[float]) -> None:
    assert upper_quartile(deque(samples)) == float(np.percentile(np.asarray(samples), 75))


def test_estimate_follows_each_new_sample_and_scales_by_units() -> None:
    ledger = Ledger(cold_start={"replay": Usage(tokens=7.0)})
    assert ledger.estimate("replay") == Usage(tokens=7.0)
    assert ledger.estimate("replay", 3) == Usage(tokens=21.0)
    seen: list[float] = []
    for i, tokens in enumerate((10.0, 40.0, 20.0, 30.0)):
        ledger.reserve("replay", f"u{i}", ledger.estimate("replay"))
        ledger.debit(f"u{i}", Usage(tokens=tokens, wall_seconds=1.0))
        seen.append(tokens)
        expected = float(np.percentile(seen, 75))
        assert ledger.estimate("replay") == Usage(tokens=expected, wall_seconds=1.0)
        assert ledger.estimate("replay", 2) == Usage(tokens=2 * expected, wall_seconds=2.0)


def test_a_tokens_only_charge_gives_a_token_estimate_under_a_token_ceiling() -> None:
    # A usage document with tokens and no dollars (no --prices) was incomplete as a whole:
    # no sample was kept, and under --max-tokens every stage ran one unit at a time.
    ledger = Ledger(ceilings=Usage(tokens=10_000))
    assert ledger.reserve("replay", "u1", ledger.estimate("replay"))[0]
    assert ledger.reserve("replay", "u2", ledger.estimate("replay")) == (False, PROBE_RUNNING)
    ledger.debit("u1", Usage(tokens=100, wall_seconds=1.0), complete=True)
    estimate = ledger.estimate("replay")
    assert estimate is not None and estimate.tokens == 100 and estimate.cost_usd is None
    assert (
        ledger.reserve("replay", "u2", estimate)[0] and ledger.reserve("replay", "u3", estimate)[0]
    )
    assert ledger.snapshot().spent.cost_usd == 0  # dollars unknown: charged as reserved (none)
