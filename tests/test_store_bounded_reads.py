"""Reads of files evolane wrote are bounded and never wait on a FIFO (hostile review #7, #8,
#13): a huge record or journal line, or a FIFO in place of a record, blob or journal, is one
clear error naming the file, never a MemoryError or a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from evolane.campaign._runs import StoreLayout
from evolane.store import (
    MAX_JSON_BYTES,
    MAX_RECORD_BYTES,
    BlobStore,
    CorruptBlobError,
    Journal,
    JournalCorruptError,
    UnreadableRecordError,
    read_journal,
    read_json,
)

RUN = "r-20260101-100000-aaaaaa"


def _returns(call: Callable[[], Any]) -> BaseException | None:
    """Run ``call`` in a thread; the error it raised (None when it returned). A call that
    blocks (on a FIFO with no writer) fails the test instead of hanging it."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(30)
    assert outcome, "the read blocked (waiting on a FIFO)"
    return outcome[0]


def test_read_json_refuses_a_fifo_and_a_file_past_its_cap(tmp_path: Path) -> None:
    fifo = tmp_path / "run.json"
    os.mkfifo(fifo)
    error = _returns(lambda: read_json(fifo))
    assert isinstance(error, UnreadableRecordError) and isinstance(error, ValueError)
    assert str(error) == f"{fifo} is a FIFO, not a regular file"
    folder = tmp_path / "dir.json"
    folder.mkdir()
    with pytest.raises(UnreadableRecordError, match="is a directory"):
        read_json(folder)
    huge = tmp_path / "report.json"
    with huge.open("wb") as out:  # sparse: nothing is written, nothing must be read
        out.truncate(MAX_JSON_BYTES + 1)
    with pytest.raises(UnreadableRecordError, match=r"report\.json holds more than 256 MiB"):
        read_json(huge)
    small = tmp_path / "small.json"
    small.write_bytes(b'{"a": 1}')
    assert read_json(small) == {"a": 1}
    with pytest.raises(UnreadableRecordError):
        read_json(small, max_bytes=4)


def test_a_journal_line_longer_than_any_record_is_never_held_whole(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    huge = b'{"b": "' + b"x" * (MAX_RECORD_BYTES * 4) + b'"}\n'
    path.write_bytes(b'{"a": 1}\n' + huge + b'{"c": 3}\n')
    with pytest.raises(JournalCorruptError, match=r"journal\.jsonl:2: .* of 262154 bytes"):
        read_journal(path)
    path.write_bytes(b'{"a": 1}\n' + huge)  # the last line: what power loss can leave
    read = read_journal(path)
    assert read.records == [{"a": 1}] and read.torn is not None
    assert (read.torn.line, read.torn.offset, read.torn.size) == (2, 9, len(huge))
    assert read.torn.head == huge[:64]
    with Journal(path) as journal:  # repaired (truncated) without reading it whole
        assert journal.repaired_tear is not None and journal.repaired_tear.size == len(huge)
    assert path.read_bytes() == b'{"a": 1}\n'


def test_a_fifo_journal_is_corrupt_not_waited_on(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    os.mkfifo(path)
    error = _returns(lambda: read_journal(path))
    assert isinstance(error, JournalCorruptError) and "is a FIFO" in str(error)


def test_a_fifo_in_place_of_a_blob_is_a_corrupt_blob(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    ref = store.put_bytes(b"hello")
    path = store.path_of(ref)
    path.unlink()
    os.mkfifo(path)
    error = _returns(lambda: store.read_bytes(ref))
    assert isinstance(error, CorruptBlobError) and "a FIFO, not a file" in str(error)
    assert isinstance(_returns(lambda: store.verify(ref)), CorruptBlobError)


def _evolane(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "from evolane.cli import main; main()", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_report_on_a_fifo_run_json_says_so_in_one_line(tmp_path: Path) -> None:
    layout = StoreLayout(tmp_path / "store")
    layout.run_dir(RUN).mkdir(parents=True)
    run_json = layout.run_dir(RUN) / "run.json"
    os.mkfifo(run_json)
    done = _evolane("report", RUN, "--store", str(layout.root))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(run_json) in lines[0] and "is a FIFO" in lines[0]


def test_a_blob_larger_than_its_ref_is_corrupt_read_no_further(tmp_path: Path) -> None:
    # Found by review: a blob a damaged store held at 64 MiB behind a 10-byte ref (grown,
    # or another file in its place) was read whole into memory before its digest failed;
    # `evolane diff` and every read of a tree's file did so, whatever the size.
    import tracemalloc

    store = BlobStore(tmp_path)
    ref = store.put_bytes(b"ten bytes!")
    path = store.path_of(ref)
    path.unlink()
    with path.open("wb") as out:
        out.truncate(64 << 20)  # sparse: no disk used
    tracemalloc.start()
    try:
        with pytest.raises(CorruptBlobError, match="over its size"):
            store.read_bytes(ref)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
