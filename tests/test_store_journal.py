"""Append-only journals (torn tails, corruption, bounds) and atomic JSON state files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from evolane.messages import ArtifactRef
from evolane.store import (
    MAX_RECORD_BYTES,
    Journal,
    JournalCorruptError,
    JournalError,
    read_journal,
    read_json,
    write_bytes_atomic,
    write_json_atomic,
)

REF = ArtifactRef(digest="sha256:" + "ab" * 32, size=3, media_type="text/plain")


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_append_and_read_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "run" / "journal.jsonl"
    with Journal(path) as journal:
        journal.append({"unit": "a", "n": 1})
        journal.append(REF)
        journal.append({"unit": "b", "artifact": REF, "tags": ["x", "y"]}, durable=True)
    assert journal.closed

    read = read_journal(path)
    assert read.torn is None
    assert read.records == [
        {"unit": "a", "n": 1},
        REF.model_dump(mode="json"),
        {"unit": "b", "artifact": REF.model_dump(mode="json"), "tags": ["x", "y"]},
    ]
    assert all(line.endswith(b"\n") for line in lines(path)) and len(lines(path)) == 3


def test_reopen_appends_after_existing_records(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    for n in range(3):
        with Journal(path) as journal:
            assert journal.repaired_tear is None
            journal.append({"n": n})
    assert [r["n"] for r in read_journal(path).records] == [0, 1, 2]


def test_missing_journal_reads_empty(tmp_path: Path) -> None:
    read = read_journal(tmp_path / "absent.jsonl")
    assert read.records == [] and read.torn is None


def test_durable_append_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    with Journal(tmp_path / "journal.jsonl") as journal:
        monkeypatch.setattr(os, "fsync", spy)
        journal.append({"fast": True})
        assert synced == []
        journal.append({"durable": True}, durable=True)
        assert len(synced) == 1
        journal.sync()
        assert len(synced) == 2


@pytest.mark.parametrize(
    "tail",
    [
        b'{"n": 3, "half',  # a partial write
        b"\x00" * 300,  # a zero-filled tail after power loss
        b'{"n": 3}',  # valid JSON but the newline never made it
        b"\x00\x00\n",  # a whole line that is not JSON
        b"[3]\n",  # JSON, but not a record object
    ],
)
def test_torn_tail_is_reported_then_repaired(tmp_path: Path, tail: bytes) -> None:
    path = tmp_path / "journal.jsonl"
    with Journal(path) as journal:
        for n in range(3):
            journal.append({"n": n})
    whole = path.stat().st_size
    with path.open("ab") as raw:
        raw.write(tail)

    read = read_journal(path)
    assert [r["n"] for r in read.records] == [0, 1, 2]
    assert read.torn is not None
    assert (read.torn.line, read.torn.offset, read.torn.size) == (4, whole, len(tail))
    assert read.torn.head == tail[:64]

    with Journal(path) as journal:
        assert journal.repaired_tear == read.torn
        assert path.stat().st_size == whole
        journal.append({"n": 4})
    read = read_journal(path)
    assert read.torn is None
    assert [r["n"] for r in read.records] == [0, 1, 2, 4]


def test_torn_only_line(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b'{"partial')
    assert read_journal(path).torn is not None
    with Journal(path) as journal:
        assert journal.repaired_tear is not None and journal.repaired_tear.line == 1
        journal.append({"ok": 1})
    assert read_journal(path).records == [{"ok": 1}]


def test_torn_tail_after_a_long_journal(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    with Journal(path) as journal:
        for n in range(3000):  # longer than one backward-scan chunk
            journal.append({"n": n, "pad": "x" * 40})
    with path.open("ab") as raw:
        raw.write(b"\x00" * 100_000)
    with Journal(path) as journal:
        assert journal.repaired_tear is not None
        assert journal.repaired_tear.line == 3001
    assert len(read_journal(path).records) == 3000


@pytest.mark.parametrize("bad", [b"not json\n", b"\n", b'"a string"\n'])
def test_corrupt_middle_line_raises_with_location(tmp_path: Path, bad: bytes) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b'{"n": 0}\n' + bad + b'{"n": 2}\n')
    with pytest.raises(JournalCorruptError, match=f"{path}:2"):
        read_journal(path)


def test_oversized_record_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    with Journal(path) as journal:
        journal.append({"n": 0})
        with pytest.raises(JournalError, match="exceeds"):
            journal.append({"blob": "x" * MAX_RECORD_BYTES})
        fits: dict[str, Any] = {"b": "x" * (MAX_RECORD_BYTES - 20)}
        journal.append(fits)
    assert len(lines(path)[-1]) <= MAX_RECORD_BYTES
    assert read_journal(path).records == [{"n": 0}, fits]


def test_non_object_record_is_refused(tmp_path: Path) -> None:
    with Journal(tmp_path / "journal.jsonl") as journal, pytest.raises(JournalError):
        journal.append([1, 2])  # type: ignore[arg-type]


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    with Journal(path) as journal:
        journal.append({"n": 0})
        with pytest.raises(JournalError, match="already open"):
            Journal(path)
    with Journal(path) as again:
        again.append({"n": 1})
    assert len(read_journal(path).records) == 2


def test_closed_journal_refuses_appends(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    journal.close()
    journal.close()
    with pytest.raises(JournalError, match="closed"):
        journal.append({"late": True})


# -- atomic JSON ---------------------------------------------------------------------------


def test_write_json_atomic_model_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    write_json_atomic(path, REF)
    assert ArtifactRef(**read_json(path)) == REF
    text = path.read_bytes()
    assert text == orjson.dumps(
        REF.model_dump(mode="json"),
        option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE,
    )
    assert os.listdir(tmp_path) == ["run.json"]


def test_write_json_atomic_plain_values_and_nested_models(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    write_json_atomic(path, {"z": 1, "a": [REF], "m": {"k": None}})
    assert read_json(path) == {"a": [REF.model_dump(mode="json")], "m": {"k": None}, "z": 1}
    assert path.read_text().startswith('{\n  "a"')
    write_json_atomic(path, [1, 2])
    assert read_json(path) == [1, 2]
    assert os.listdir(tmp_path) == ["report.json"]


def test_failed_serialisation_leaves_old_file_intact(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_json_atomic(path, {"version": 1})
    before = path.read_bytes()
    with pytest.raises(TypeError):
        write_json_atomic(path, {"version": 2, "bad": object()})
    with pytest.raises(TypeError):
        write_bytes_atomic(path, "not bytes")  # type: ignore[arg-type]
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["state.json"]


def test_write_bytes_atomic_replaces(tmp_path: Path) -> None:
    path = tmp_path / "report.md"
    write_bytes_atomic(path, b"one")
    write_bytes_atomic(path, b"two")
    assert path.read_bytes() == b"two"
    assert path.stat().st_mode & 0o777 == 0o644
    assert os.listdir(tmp_path) == ["report.md"]
