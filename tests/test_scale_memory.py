"""Memory that does not grow with a campaign's size (issue 22): a dataset is read without
orjson's buffers kept and holds each case encoded, case refs are held compactly (sharing the
dataset's places), sealed records are packed against a typical record, the ledger keeps a
bounded list of overruns, and a bounded read does not allocate its whole bound."""

from __future__ import annotations

import hashlib
import io
import tracemalloc
from pathlib import Path

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from evolane.inputs import load_dataset
from evolane.measure import OVERRUNS_KEPT, Ledger
from evolane.measure._layout import start_order
from evolane.measure._sealed import ReuseIndex
from evolane.measure._table import Unit, pack, unit_fields, unit_table, unpack
from evolane.measure._units import arm_matrices, unit_records_chunks
from evolane.messages import (
    ArtifactRef,
    GateConfig,
    JudgeResult,
    MeasureRequest,
    ReplayResult,
    Usage,
)
from evolane.stats import decide_matrices
from evolane.store import BlobStore, put_table, read_at_most

CASES = 3_000


def _traced(action):  # type: ignore[no-untyped-def]
    """``action()``'s result, and the traced peak it allocated on top of what was held."""
    tracemalloc.start()
    try:
        held = tracemalloc.get_traced_memory()[0]
        result = action()
        peak = tracemalloc.get_traced_memory()[1] - held
    finally:
        tracemalloc.stop()
    return result, peak


def test_a_dataset_is_read_without_a_peak_of_kilobytes_per_case(tmp_path: Path) -> None:
    rows = (
        orjson.dumps({"id": f"c{i}", "input": i, "expected_output": 1}) + b"\n"
        for i in range(CASES)
    )
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"".join(rows))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        dataset = load_dataset(path)
        held, peak = (value - before for value in tracemalloc.get_traced_memory())
    finally:
        tracemalloc.stop()
    # orjson's own outputs hold ~4 KiB each, and read(limit + 1) 256 MiB at once
    assert peak / CASES < 1536, f"{peak / CASES:.0f} bytes per case at the peak"
    # each case's canonical JSON, its id and its place; a validated `Case` held ~570 bytes
    assert held / CASES < 360, f"{held / CASES:.0f} bytes per case held"
    assert dataset.digest == "sha256:" + hashlib.sha256(dataset.canonical_jsonl()).hexdigest()


def test_a_ref_table_gives_the_refs_put_bytes_gives_in_a_fraction_of_the_memory(
    tmp_path: Path,
) -> None:
    store = BlobStore(tmp_path / "s")
    named = [(f"c{i}", f"case {i % 700}".encode()) for i in range(CASES)]
    table, _ = _traced(lambda: put_table(store, named, "application/json"))
    refs = [store.put_bytes(data, media_type="application/json") for _, data in named]
    assert table == {name: ref for (name, _), ref in zip(named, refs, strict=True)}
    assert len(table) == CASES and list(table)[:2] == ["c0", "c1"]
    assert isinstance(table["c5"], ArtifactRef) and store.read_bytes(table["c5"]) == b"case 5"
    assert "c-missing" not in table and table.get("c-missing") is None
    # a model per ref costs ~600 bytes; the table holds a digest, a size and a name's slot.
    # Not counted: pathlib's table of interned names, which a path may make grow at any time
    # (by megabytes at once) and which holds nothing of the table.
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        again = put_table(store, named, "application/json")
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    interning = [tracemalloc.Filter(False, "*pathlib.py")]
    held = sum(
        stat.size_diff
        for stat in after.filter_traces(interning).compare_to(
            before.filter_traces(interning), "filename"
        )
    )
    assert again == table and held / CASES < 200, f"{held / CASES:.0f} bytes per ref held"


def test_a_ref_table_shares_the_places_it_is_given_only_when_they_match(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "s")
    named = [(f"c{i}", f"case {i}".encode()) for i in range(50)]
    places = {name: index for index, (name, _) in enumerate(named)}
    shared = put_table(store, named, "application/json", places=places)
    assert shared._at is places and shared == put_table(store, named, "application/json")
    wrong = {**places, "c3": 4, "c4": 3}  # two names swapped: the table keeps its own
    table = put_table(store, named, "application/json", places=wrong)
    assert table._at is not wrong and table["c3"] == shared["c3"]
    twice = put_table(store, [*named, ("c0", b"again")], "text/plain", places=places)
    assert twice._at is not places and store.read_bytes(twice["c0"]) == b"again"


def test_a_name_given_twice_keeps_its_last_blob(tmp_path: Path) -> None:
    table = put_table(BlobStore(tmp_path / "s"), [("a", b"1"), ("a", b"2")], "text/plain")
    assert len(table) == 1 and table["a"].size == 1
    assert table["a"].digest == "sha256:" + hashlib.sha256(b"2").hexdigest()


def _unit(score: float, wall: float, digest: str, note: str) -> Unit:
    ref = ArtifactRef(digest="sha256:" + digest, size=7)
    request = MeasureRequest(measurement_id="m", baseline_ref=ref, candidate_ref=ref)
    unit = unit_table(request, [f"case-{i}" for i in range(4)], (1, 1))[7]
    assert unit.unit_id == "m.3.0.c" and unit.case_id == "case-3"
    unit.status, unit.note = "succeeded", note
    ids = {"unit_id": unit.unit_id, "case_id": unit.case_id, "arm": "candidate"}
    unit.replay = ReplayResult.model_validate(
        {**ids, "repetition": 0, "status": "succeeded", "output_ref": ref, "wall_seconds": wall}
        | {"usage": Usage(wall_seconds=wall)}
    )
    unit.judge = JudgeResult(
        unit_id=unit.unit_id, status="succeeded", score=score, source="command", detail_ref=ref
    )
    return unit


digests = st.text("0123456789abcdef", min_size=64, max_size=64)


@settings(max_examples=60, deadline=None)
@given(st.floats(0, 1), st.floats(0, 1e6), digests, st.text(max_size=300))
def test_a_sealed_record_unpacks_to_its_bytes(
    score: float, wall: float, digest: str, note: str
) -> None:
    unit = _unit(score, wall, digest, note)
    unit.seal()
    record = orjson.dumps(unit_fields(_unit(score, wall, digest, note)))
    assert unit.record == record and unpack(pack(record)) == record
    unit.compact()
    assert unit.replay is not None and unit.replay.wall_seconds == wall
    assert unit.judge is not None and unit.judge.score == score


def test_a_typical_record_packs_to_under_half_its_plain_deflate() -> None:
    unit = _unit(0.75, 0.0412345678, hashlib.sha256(b"x").hexdigest(), "")
    record = orjson.dumps(unit_fields(unit))
    import zlib

    plain = zlib.compressobj(1, zlib.DEFLATED, -12, 2)
    plain_size = len(plain.compress(record) + plain.flush())
    assert len(pack(record)) * 2 < plain_size, (len(pack(record)), plain_size, len(record))


def test_the_ledger_keeps_a_bounded_list_of_overruns_and_counts_them_all() -> None:
    ledger = Ledger(ceilings=Usage(tokens=1e9))
    published = []
    total = OVERRUNS_KEPT + 300
    for index in range(total):
        item = f"u{index}"
        granted, _ = ledger.reserve("replay", item, Usage(tokens=10))
        assert granted
        published += ledger.debit(item, Usage(tokens=20), True)
    ledger.reserve("replay", "big", Usage(tokens=10))
    published += ledger.debit("big", Usage(tokens=6e8), True)  # crosses 50%: a level event
    snapshot = ledger.snapshot()
    assert len(snapshot.overruns) == OVERRUNS_KEPT and snapshot.overruns_total == total + 1
    assert [o.item for o in snapshot.overruns[:2]] == ["u0", "u1"]  # the first ones kept
    assert sum(e.level == "overrun" for e in published) == total + 1  # every one published
    assert "50%" in {e.level for e in snapshot.events}  # a level is never crowded out
    assert len(snapshot.events) == OVERRUNS_KEPT + 1


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 40), st.integers(1, 3), st.integers(1, 3), st.integers(1, 16))
def test_the_start_order_is_the_tuple_order_it_packs(
    cases: int, base_reps: int, cand_reps: int, lanes: int
) -> None:
    ref = ArtifactRef(digest="sha256:" + "a" * 64, size=1)
    request = MeasureRequest(measurement_id="m", baseline_ref=ref, candidate_ref=ref)
    table = unit_table(request, [f"c{i}" for i in range(cases)], (base_reps, cand_reps))
    units = list(table)
    packed = start_order(table.layout, lanes)
    reference, baselines, candidates = [], 0, 0  # repetition, then a place within it
    for unit in units:
        if unit.arm == "baseline":
            reference.append((unit.repetition, 2 * (baselines - lanes)))
            baselines += 1
        else:
            reference.append((unit.repetition, 2 * candidates + 1))
            candidates += 1
    assert len(packed) == len(units) and [u.index for u in units] == list(range(len(units)))
    by_packed = sorted(range(len(units)), key=lambda i: (packed[i], i))
    assert by_packed == sorted(range(len(units)), key=lambda i: (reference[i], i))


class _Growing(io.FileIO):
    """A regular file that grows by ``more`` bytes once its size was asked (as a command's
    output still being written would)."""

    def __init__(self, path: Path, more: bytes) -> None:
        super().__init__(path, "r")
        self._path, self._more = path, more

    def read(self, size: int = -1) -> bytes:
        if self._more:
            with self._path.open("ab") as grow:
                grow.write(self._more)
            self._more = b""
        return super().read(size)


def test_a_bounded_read_asks_the_size_first_and_still_sees_more(tmp_path: Path) -> None:
    data = b"x" * 1000
    (tmp_path / "f").write_bytes(data)
    with (tmp_path / "f").open("rb") as source:
        got, peak = _traced(lambda: read_at_most(source, 64 << 20))
    assert got == data and peak < 1 << 20  # read(limit + 1) allocated the 64 MiB up front
    with (tmp_path / "f").open("rb") as source:
        assert read_at_most(source, 999) == data  # one more than the limit: "holds more"
    assert read_at_most(io.BytesIO(data), 10) == data[:11]  # no descriptor: read as asked
    with open("/proc/self/status", "rb") as source:  # its size says 0: it is read on
        status = read_at_most(source, 1 << 16)
    assert b"Pid:" in status and len(status) > 100
    (tmp_path / "g").write_bytes(b"a" * 30)
    assert read_at_most(_Growing(tmp_path / "g", b"b" * 50), 100) == b"a" * 30 + b"b" * 50
    (tmp_path / "h").write_bytes(b"a" * 30)
    grown = read_at_most(_Growing(tmp_path / "h", b"b" * 50), 40)
    assert grown == b"a" * 30 + b"b" * 11  # one past the limit: it holds more


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 12),
    st.integers(1, 3),
    st.integers(1, 3),
    st.booleans(),
    st.data(),
)
def test_the_score_matrices_hold_what_the_units_score(
    cases: int, base_reps: int, cand_reps: int, paired: bool, data: st.DataObject
) -> None:
    ref = ArtifactRef(digest="sha256:" + "a" * 64, size=1)
    request = MeasureRequest(
        measurement_id="m", baseline_ref=ref, candidate_ref=ref if paired else None
    )
    table = unit_table(request, [f"c{i}" for i in range(cases)], (base_reps, cand_reps))
    for unit in table:  # scored, failed or not run; sealed or still held as results
        state = data.draw(st.sampled_from(["scored", "failed", "waiting"]))
        if state == "waiting":
            continue
        ids = {"unit_id": unit.unit_id, "case_id": unit.case_id, "arm": unit.arm}
        unit.replay = ReplayResult.model_validate(
            {**ids, "repetition": unit.repetition, "status": "succeeded", "output_ref": ref}
        )
        status = "succeeded" if state == "scored" else "failed"
        score = data.draw(st.floats(0, 1)) if state == "scored" else None
        unit.judge = JudgeResult(unit_id=unit.unit_id, status=status, score=score, source="command")
        if data.draw(st.booleans()):
            unit.seal()
            unit.compact()
    upto = data.draw(st.one_of(st.none(), st.integers(0, cases + 1)))
    baseline, candidate = arm_matrices(table, upto)
    expected: dict[str, dict[str, list[float]]] = {"baseline": {}, "candidate": {}}
    for unit in table:  # the per-case lists `decide` takes, by a plain loop
        if unit.score is not None and (upto is None or unit.case_index < upto):
            expected[unit.arm].setdefault(unit.case_id, []).append(unit.score)
    assert baseline.case_scores() == expected["baseline"]
    assert candidate.case_scores() == expected["candidate"]
    assert list(baseline.ids) == [
        f"c{i}" for i in range(cases if upto is None else min(cases, upto))
    ]


def _scored_table(cases: int):  # type: ignore[no-untyped-def]
    """A paired single-repetition table with every unit scored and sealed (a tiny record)."""
    ref = ArtifactRef(digest="sha256:" + "a" * 64, size=1)
    request = MeasureRequest(measurement_id="m", baseline_ref=ref, candidate_ref=ref)
    table = unit_table(request, [f"c{i}" for i in range(cases)], (1, 1))
    for index in range(len(table)):
        table.scores[index] = 0.25 + 0.5 * (index % 2)
        table.sealed[index] = table.records.put(pack(b"{}"))
    return table


def test_the_decision_at_the_end_peaks_at_a_few_pointers_a_case() -> None:
    """The gate's sample is made a step at a time: at 20,000 cases its peak is ~33 bytes a
    case (80 while every intermediate array lived to the end, ~230 with lists per case)."""
    table = _scored_table(20_000)
    baseline, candidate = arm_matrices(table, None)
    gate = GateConfig()
    result, peak = _traced(lambda: decide_matrices(baseline, candidate, gate, n_planned=20_000))
    assert result.n == 20_000
    assert peak / 20_000 < 48, f"{peak / 20_000:.0f} bytes per case at the decision's peak"


def test_the_units_blob_is_streamed_without_an_array_per_unit() -> None:
    """The blob's order (case number, repetition, arm) comes from the layout: no sort key
    and no permutation per unit (16 bytes a unit before), only the chunk being filled."""
    table = _scored_table(20_000)
    chunks, peak = _traced(lambda: sum(len(chunk) for chunk in unit_records_chunks(table)))
    assert chunks > 40_000
    assert peak < 512 * 1024, f"{peak} bytes at the peak"


def test_a_reuse_index_merge_copies_one_column_at_a_time() -> None:
    """Merging the recent keys inserts them a column at a time: a merge's peak is about one
    column beside the index (~10 bytes a key), not a sorted copy of all three (~40)."""

    def key(number: int) -> bytes:
        return hashlib.blake2b(str(number).encode(), digest_size=16).digest()

    tracemalloc.start()  # from the first column on, so that freeing one counts
    try:
        index = ReuseIndex(recent=1 << 30)  # no merge until asked
        for number in range(50_000):
            index.add(key(number), number)
        index._merge()
        for number in range(50_000, 52_000):
            index.add(key(number), number)
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        index._merge()
        peak = tracemalloc.get_traced_memory()[1] - held
    finally:
        tracemalloc.stop()
    assert peak / 52_000 < 16, f"{peak / 52_000:.1f} bytes per key at a merge's peak"
    assert [index.get(key(n)) for n in (0, 49_999, 50_000, 51_999)] == [0, 49_999, 50_000, 51_999]
