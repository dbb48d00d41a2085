"""Group commit of the run journal: one fsync per batch, acknowledged only once durable, and
a SIGKILL at any moment loses no acknowledged unit and corrupts nothing."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio

from evolane.measure import RunJournal
from evolane.messages import ReplayRecord, ReplayResult, UnitRecord
from evolane.store import BlobStore, Journal, deferred_blobs, read_journal

# A child that stores one new blob per unit (deferred fsync) and journals a unit record
# naming it, from 16 concurrent tasks; it prints each unit id once its append returned.
CHILD = textwrap.dedent(
    """
    import os, sys, trio
    from pathlib import Path
    from evolane.measure import RunJournal
    from evolane.messages import ReplayRecord, ReplayResult, UnitRecord
    from evolane.store import BlobStore

    root = Path(sys.argv[1])
    store = BlobStore(root / "store").deferring()
    journal = RunJournal(root / "journal.jsonl")

    def result(unit, ref):
        return ReplayResult(unit_id=unit, case_id="c", arm="baseline", repetition=0,
                            status="succeeded", output_ref=ref)

    async def worker(task):
        for n in range(100_000):
            unit = f"u{task}-{n}"
            ref = await trio.to_thread.run_sync(store.put_bytes, unit.encode() * 50)
            await journal.append(ReplayRecord(measurement="m", unit=unit, replay=result(unit, ref)),
                                 durable=False)
            await journal.append(UnitRecord(measurement="m", unit=unit, status="succeeded",
                                            replay=result(unit, ref)))
            os.write(1, (unit + "\\n").encode())

    async def main():
        async with trio.open_nursery() as nursery:
            for task in range(16):
                nursery.start_soon(worker, task)

    trio.run(main)
    """
)


def _result(unit: str) -> ReplayResult:
    return ReplayResult(unit_id=unit, case_id="c", arm="baseline", repetition=0, status="succeeded")


def _kill_once(root: Path, rng: random.Random) -> None:
    """Start the child, kill it at a random moment once it acknowledged units, and check
    what a recovery finds."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert child.stdout is not None
    try:
        first = child.stdout.readline()  # the first acknowledgement: it is running
        assert first, child.stderr.read().decode() if child.stderr else ""
        time.sleep(rng.uniform(0.0, 0.4))
    finally:
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate()
    acked = {line for line in (first + rest).decode().split("\n") if line}
    with Journal(root / "journal.jsonl"):  # recovery: a torn tail is cut off
        pass
    read = read_journal(root / "journal.jsonl")  # raises on corruption before the tail
    assert read.torn is None
    units = {r["unit"]: r for r in read.records if r["type"] == "unit"}
    assert acked <= units.keys(), sorted(acked - units.keys())[:5]
    store = BlobStore(root / "store")
    for record in read.records:  # every record names a whole blob
        store.verify(record["replay"]["output_ref"]["digest"])


def test_sigkill_mid_batch_loses_no_acknowledged_unit(tmp_path: Path) -> None:
    rng = random.Random(22)
    for _kill in range(3):  # the same journal and store, killed again and again
        _kill_once(tmp_path, rng)
    assert read_journal(tmp_path / "journal.jsonl").records


@pytest.mark.slow
def test_sigkill_mid_batch_many_times(tmp_path: Path) -> None:
    rng = random.Random(os.getpid())
    for _kill in range(30):
        _kill_once(tmp_path, rng)


async def test_one_fsync_per_batch_and_ack_after_it(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path / "journal.jsonl")
    acked: list[str] = []

    async def unit(name: str) -> None:
        await journal.append(
            UnitRecord(measurement="m", unit=name, status="succeeded", replay=_result(name))
        )
        # Acknowledged: on disk already (read back by another reader).
        assert name in {r["unit"] for r in read_journal(tmp_path / "journal.jsonl").records}
        acked.append(name)

    async with trio.open_nursery() as nursery:
        for n in range(200):
            nursery.start_soon(unit, f"u{n}")
    journal.close()
    assert len(acked) == 200
    assert journal.commits < 200  # batched: concurrent appends share fsyncs


async def test_held_replay_record_superseded_or_kept(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path / "journal.jsonl")
    for name in ("done", "stopped", "pending"):
        replay = ReplayRecord(measurement="m", unit=name, replay=_result(name))
        await journal.append(replay, durable=False)
    done = UnitRecord(measurement="m", unit="done", status="succeeded", replay=_result("done"))
    await journal.append(done)
    stopped = UnitRecord(measurement="m", unit="stopped", status="cancelled", replay=None)
    await journal.append(stopped)
    journal.close()
    kinds = [(r["type"], r["unit"]) for r in read_journal(tmp_path / "journal.jsonl").records]
    # The succeeded unit's replay is written once (in its unit record); the cancelled one's
    # replay is kept before it, for a resume to judge; a replay still pending at close too.
    assert kinds.count(("replay", "done")) == 0
    assert kinds.index(("replay", "stopped")) < kinds.index(("unit", "stopped"))
    assert ("replay", "pending") in kinds


def test_deferred_blobs_flushed_by_a_durable_write(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "store")
    deferring = store.deferring()
    ref = deferring.put_bytes(b"deferred")
    assert deferred_blobs() >= 1
    store.put_bytes(b"durable")  # a durable write first makes every deferred blob durable
    assert deferred_blobs() == 0
    assert store.read_bytes(ref) == b"deferred"
