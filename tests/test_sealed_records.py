"""Sealed unit records out of memory (issue 22): `SealedRecords` gives back every record as it
was put, from memory or from its unlinked file, holds a few bytes per record in memory when
file-backed, and a measurement's plan keeps each ended unit small."""

from __future__ import annotations

import os
import random
import tracemalloc
from collections import deque
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolane.measure._plan import (
    MeasurePlan,
    StartJudge,
    StartReplay,
    UnitJudged,
    UnitReplayed,
)
from evolane.measure._sealed import KEY_BYTES, ReuseIndex, SealedRecords
from tests.test_measure_plan import (
    Outcome,
    judge_result,
    make_request,
    make_settings,
    replay_result,
)

records = st.lists(st.binary(max_size=3000), max_size=40)


@settings(max_examples=60, deadline=None)
@given(records, st.integers(1, 8000), st.lists(st.integers(0, 39), max_size=20))
def test_every_record_comes_back_as_it_was_put(
    tmp_path_factory: pytest.TempPathFactory, puts: list[bytes], flush: int, reads: list[int]
) -> None:
    folder = tmp_path_factory.mktemp("sealed")
    for kept in (SealedRecords(), SealedRecords(folder, flush_bytes=flush)):
        numbers = []
        for index, record in enumerate(puts):
            numbers.append(kept.put(record))
            for read in reads:  # reads between puts: some pending, some in the file
                if read <= index:
                    assert kept.get(numbers[read]) == puts[read]
        assert numbers == list(range(len(puts))) and len(kept) == len(puts)
        kept.flush()
        assert [kept.get(number) for number in numbers] == puts
        kept.close()
        with pytest.raises(ValueError, match="closed"):
            kept.put(b"after")
    assert os.listdir(folder) == []  # the file was never linked: nothing is left behind


highs = st.sampled_from([bytes(8), b"\xff" * 8, b"\x80" + bytes(7)])  # shared by many keys
keys = st.binary(min_size=KEY_BYTES, max_size=KEY_BYTES) | st.tuples(
    highs, st.binary(min_size=8, max_size=8)
).map(b"".join)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(keys, st.integers(0, 2**40)), max_size=200), st.integers(1, 40))
def test_the_reuse_index_answers_as_a_dict_keeping_the_first(
    adds: list[tuple[bytes, int]], recent: int
) -> None:
    """Against a dict: every key added finds its first number, through any number of merges
    into the sorted columns; keys that share a high half (a short key list makes many) are
    told apart by the low one; a key never added finds none."""
    index, reference = ReuseIndex(recent=recent), {}
    for count, (key, number) in enumerate(adds):
        index.add(key, number)
        reference.setdefault(key, number)
        probe = adds[count // 2][0]
        assert index.get(probe) == reference.get(probe)
    assert len(index) == len(reference)
    for key, number in reference.items():
        assert index.get(key) == number
    for key, _ in adds:
        other = key[:8] + bytes([key[8] ^ 1]) + key[9:]
        assert index.get(other) == reference.get(other)
    with pytest.raises(ValueError, match="16 bytes"):
        index.add(b"short", 1)


def test_file_backed_records_hold_a_few_bytes_each(tmp_path: Path) -> None:
    kept = SealedRecords(tmp_path)
    rng = random.Random(1)
    bodies = [rng.randbytes(250) for _ in range(4000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for body in bodies:
            kept.put(body)
        kept.flush()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # in memory they would hold ~290 bytes each (a bytes object and its list slot)
    assert held / len(bodies) < 16, f"{held / len(bodies):.0f} bytes per record held"
    assert kept.get(1234) == bodies[1234] and kept.get(3999) == bodies[3999]
    kept.close()


def test_a_measurement_keeps_each_ended_unit_small(tmp_path: Path) -> None:
    """Every unit of a 4,000-case measurement ends; its record went to the file, so what the
    plan holds for an ended unit is a row of machine values and its reuse key's 24 bytes."""
    cases = 4000
    kept = SealedRecords(tmp_path, flush_bytes=16 << 10)  # what waits to be written: bounded
    plan = MeasurePlan(make_request(sequential=False), make_settings(cases), lanes=8, records=kept)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        _answer_in_order(plan)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert plan.finished and len(kept) == 2 * cases
    assert len(kept.reuse) == 2 * cases  # every unit succeeded: each may be reused
    # Per unit ~56 bytes: its row, its record's number and its reuse key. Units as objects
    # with a dict of reuse keys held ~180; with the records in memory too, ~283.
    per_unit = held / (2 * cases)
    assert per_unit < 80, f"{per_unit:.0f} bytes held per ended unit"
    unit = plan.units[5]
    assert unit.replay is not None and unit.replay.status == "succeeded"
    assert unit.judge is not None and unit.judge.score == 1.0


def _answer_in_order(plan: MeasurePlan) -> None:
    """Play the scheduler with nothing kept: every replay and judge succeeds, in order."""
    pending = deque(plan.start())
    while pending:
        action = pending.popleft()
        if isinstance(action, StartReplay):
            result = replay_result(action.job, Outcome(), stopped=False)
            pending.extend(plan.handle(UnitReplayed(action.unit_id, result)))
        elif isinstance(action, StartJudge):
            judged = judge_result(action.unit_id, Outcome(), stopped=False)
            pending.extend(plan.handle(UnitJudged(action.unit_id, judged)))
