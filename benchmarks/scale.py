"""Per-unit orchestration cost at scale (issue 22), against a hand-written loop in the same run.

One candidate against its baseline over N cases (2N units), in-process replay and judge
backends that do nothing (a tiny output file, a constant score: only evolane's own cost
shows), 8 lanes, the default (sequential) gate, the run journal on, as a campaign runs. Per N
it prints: CPU ms per unit (process CPU time, threads included), thread hops per unit
(`trio.to_thread.run_sync` calls), fsyncs per unit (`os.fsync`, `os.fdatasync` and a
batch's ``syncfs`` calls), trio tasks and actor messages per unit (tasks spawned, messages
enqueued in a mailbox: counts that no load on a shared host changes, as CPU time varies
by 20% from run to run there), peak RSS, and the ratio to a hand-written trio loop doing the
same work (`CapacityLimiter(8)`, a unit folder, the same backend calls, one orjson line per
unit appended, fsync every 64 units), and to that loop keeping two of evolane's per-unit
guarantees too ("kept": the output stored under its digest, the unit folder removed).
Every N of each way runs in a fresh subprocess, so each peak RSS is its own, under the
allocator policy the CLI sets for itself (`fix_mmap_threshold`; ``--allocator as-is``: glibc's
dynamic mmap threshold).

    python benchmarks/scale.py [--cases 1000 10000] [--big] [--lanes 8] [--json]
        [--allocator fixed|as-is]

``--big`` adds N = 100,000. ``--dask`` adds the Dask figure (`dask_lanes.dispatch_overhead`).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evolane.actors import _kernel as kernel
from evolane.inputs import load_dataset
from evolane.lanes import BackendCall
from evolane.measure import MeasureContext, MeasureSettings, open_pipeline
from evolane.measure._journal import RunJournal
from evolane.messages import MeasureRequest
from evolane.sandbox import open_sandbox
from evolane.store import BlobStore, snapshot_tree
from evolane.store import _batch as batch
from evolane.supervisors import fix_mmap_threshold, open_runtime

DEFAULT_CASES = (1_000, 10_000)
BIG_CASES = 100_000
FSYNC_EVERY = 64


async def replay_backend(call: BackendCall) -> None:
    """Does nothing but write its answer (the smallest replay there is)."""
    assert call.output_dir is not None
    (call.output_dir / "output.json").write_bytes(b"1")


async def judge_backend(call: BackendCall) -> float:
    """A constant score: deltas of 0, so the sequential gate runs to (nearly) the end."""
    return 1.0


class Counters(trio.abc.Instrument):
    """Counts thread hops, fsyncs and actor messages while installed (`counting`), and the
    tasks of the trio run it instruments."""

    def __init__(self) -> None:
        self.hops = 0
        self.fsyncs = 0
        self.tasks = 0
        self.messages = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.tasks += 1

    @contextmanager
    def counting(self) -> Iterator[None]:
        """Wrap `trio.to_thread.run_sync`, `os.fsync`, `os.fdatasync` and a mailbox's
        enqueue with counters."""
        hop, fsync, fdatasync = trio.to_thread.run_sync, os.fsync, os.fdatasync
        enqueued = kernel.Mailbox.note_enqueued
        syncfs = batch._syncfs  # one syncfs (a batch of blobs) counts as one fsync

        async def counted_hop(*args: Any, **kwargs: Any) -> Any:
            self.hops += 1
            return await hop(*args, **kwargs)

        def counted(real: Callable[[int], None]) -> Callable[[int], None]:
            def sync(fd: int) -> None:
                self.fsyncs += 1
                real(fd)

            return sync

        def counted_message(box: kernel.Mailbox) -> None:
            self.messages += 1
            enqueued(box)

        trio.to_thread.run_sync = counted_hop  # type: ignore[assignment]
        kernel.Mailbox.note_enqueued = counted_message  # type: ignore[method-assign]
        os.fsync, os.fdatasync = counted(fsync), counted(fdatasync)
        batch._syncfs = self._counted_syncfs(syncfs)
        try:
            yield
        finally:
            trio.to_thread.run_sync = hop  # type: ignore[assignment]
            kernel.Mailbox.note_enqueued = enqueued  # type: ignore[method-assign]
            os.fsync, os.fdatasync = fsync, fdatasync
            batch._syncfs = syncfs

    def _counted_syncfs(self, real: Callable[[Path], bool]) -> Callable[[Path], bool]:
        def sync(anywhere: Path) -> bool:
            done = real(anywhere)
            self.fsyncs += done
            return done

        return sync


def write_inputs(root: Path, cases: int) -> tuple[Path, Path, Path]:
    """The dataset (every case in ``val``) and two trees that differ by one file. Written a
    line at a time, so the harness adds nothing to the peak RSS it measures."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / "d.jsonl").open("wb") as out:  # a line at a time: no list of rows held
        for i in range(cases):
            row = {"id": f"c{i}", "input": i, "expected_output": 1, "split": "val"}
            out.write(orjson.dumps(row) + b"\n")
    for arm in ("base", "cand"):
        (root / arm).mkdir(exist_ok=True)
        (root / arm / "skill.md").write_text(f"rules of {arm}")
    return root / "d.jsonl", root / "base", root / "cand"


async def evolane_run(root: Path, cases: int, lanes: int, counters: Counters) -> dict[str, Any]:
    """One measurement through a pipeline with the run journal on, counted from the request
    (the pipeline's start-up, which stores the cases, included)."""
    data, base_dir, cand_dir = write_inputs(root, cases)
    dataset = load_dataset(data)
    store = BlobStore(root / "store")
    base, cand = snapshot_tree(store, base_dir), snapshot_tree(store, cand_dir)
    settings = MeasureSettings(
        replay="backend:replay",
        judge="backend:judge",
        replay_concurrency=lanes,
        judge_concurrency=lanes,
    )
    journal = RunJournal(root / "journal.jsonl")
    context = MeasureContext(journal, replay_backend=replay_backend, judge_backend=judge_backend)
    request = MeasureRequest(measurement_id="scale", baseline_ref=base, candidate_ref=cand)
    cpu, wall = time.process_time(), time.perf_counter()
    with counters.counting():
        try:
            async with (
                open_sandbox(root / "sb", store=store) as host,
                open_runtime() as runtime,
                open_pipeline(runtime, host, store, dataset, settings, context=context) as pipe,
            ):
                summary = await pipe.measure(request)
        finally:
            journal.close()
    return {
        "cpu": time.process_time() - cpu,
        "wall": time.perf_counter() - wall,
        "units": summary.units_run,
        "status": summary.status,
    }


async def hand_run(
    root: Path, cases: int, lanes: int, counters: Counters, kept: bool = False
) -> dict[str, Any]:
    """The same work written by hand: per unit a folder, the same backend calls, one orjson
    line appended to a journal, an fsync every `FSYNC_EVERY` units. ``kept``: also two of
    evolane's per-unit guarantees, the output stored under its sha256 (a temp file renamed
    into place; an object already stored is not written again) and the unit's folder
    removed after it."""
    write_inputs(root, cases)
    limiter = trio.CapacityLimiter(lanes)
    journal = (root / "journal.jsonl").open("ab")
    objects = root / "objects"
    objects.mkdir()
    done = 0

    async def unit(index: int, arm: str) -> None:
        nonlocal done
        async with limiter:
            folder = root / "units" / f"{arm}-{index}"
            (folder / "out").mkdir(parents=True)
            case = {"id": f"c{index}", "input": index}
            call = BackendCall(
                role="replay", workspace=folder, seed=0, case=case, output_dir=folder / "out"
            )
            await replay_backend(call)
            judged = BackendCall(
                role="judge", workspace=folder, seed=0, case=case, output_dir=folder / "out"
            )
            score = await judge_backend(judged)
            line = {"unit_id": f"{arm}-{index}", "case_id": f"c{index}", "score": score}
            if kept:
                line["output"] = _keep(folder, objects)
            journal.write(orjson.dumps(line) + b"\n")
            done += 1
            if done % FSYNC_EVERY == 0:
                journal.flush()
                os.fsync(journal.fileno())

    cpu, wall = time.process_time(), time.perf_counter()
    with counters.counting():
        async with trio.open_nursery() as nursery:
            for index in range(cases):
                for arm in ("baseline", "candidate"):
                    nursery.start_soon(unit, index, arm)
        journal.flush()
        os.fsync(journal.fileno())
    journal.close()
    return {
        "cpu": time.process_time() - cpu,
        "wall": time.perf_counter() - wall,
        "units": 2 * cases,
        "status": "complete",
    }


def _keep(folder: Path, objects: Path) -> str:
    """Store the unit's output by digest and remove its folder; the digest."""
    output = folder / "out" / "output.json"
    data = output.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if not (objects / digest).exists():
        temp = objects / f".{folder.name}.tmp"
        temp.write_bytes(data)
        os.replace(temp, objects / digest)
    output.unlink()
    (folder / "out").rmdir()
    folder.rmdir()
    return digest


def worker(way: str, cases: int, lanes: int, allocator: str) -> None:
    """Run one way at one N in this (fresh) process and print its figures as one JSON line."""
    if allocator == "fixed":
        fix_mmap_threshold()
    counters = Counters()
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
        if way == "evolane":
            run = trio.run(evolane_run, Path(tmp), cases, lanes, counters, instruments=[counters])
        else:
            keep = way == "kept"
            args = (Path(tmp), cases, lanes, counters, keep)
            run = trio.run(hand_run, *args, instruments=[counters])
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    run.update(hops=counters.hops, fsyncs=counters.fsyncs, peak_mib=peak_kib / 1024)
    run.update(tasks=counters.tasks, messages=counters.messages)
    sys.stdout.write(orjson.dumps({"way": way, "cases": cases, **run}).decode() + "\n")


def measure(way: str, cases: int, lanes: int, allocator: str = "fixed") -> dict[str, Any]:
    """`worker` in a fresh subprocess; its JSON line."""
    command = [sys.executable, __file__, "--worker", way, "--cases", str(cases)]
    done = subprocess.run(
        [*command, "--lanes", str(lanes), "--allocator", allocator],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"scale: the {way} run at N = {cases} failed:\n{done.stderr[-4000:]}")
    return orjson.loads(done.stdout.strip().splitlines()[-1])


def row(ours: dict[str, Any], hand: dict[str, Any], kept: dict[str, Any]) -> dict[str, Any]:
    """The figures of one N, per unit that ran."""
    units = max(ours["units"], 1)
    ms = 1000 * ours["cpu"] / units
    hand_ms = 1000 * hand["cpu"] / max(hand["units"], 1)
    kept_ms = 1000 * kept["cpu"] / max(kept["units"], 1)
    return {
        "cases": ours["cases"],
        "units": ours["units"],
        "status": ours["status"],
        "cpu_ms_per_unit": ms,
        "hand_cpu_ms_per_unit": hand_ms,
        "ratio": ms / hand_ms if hand_ms > 0 else float("inf"),
        "kept_cpu_ms_per_unit": kept_ms,
        "kept_ratio": ms / kept_ms if kept_ms > 0 else float("inf"),
        "hops_per_unit": ours["hops"] / units,
        "fsyncs_per_unit": ours["fsyncs"] / units,
        "tasks_per_unit": ours["tasks"] / units,
        "hand_tasks_per_unit": hand["tasks"] / max(hand["units"], 1),
        "messages_per_unit": ours["messages"] / units,
        "peak_rss_mib": ours["peak_mib"],
        "hand_peak_rss_mib": hand["peak_mib"],
        "wall_s": ours["wall"],
        "hand_wall_s": hand["wall"],
    }


def main(args: argparse.Namespace) -> None:
    cases = list(args.cases or DEFAULT_CASES) + ([BIG_CASES] if args.big else [])
    rows = []
    if not args.json:
        print(
            f"in-process, 1 candidate, {args.lanes} lanes, default gate, journal on, "
            f"allocator {args.allocator} ({os.cpu_count()} cores)"
        )
        print(
            f"{'N':>7} {'units':>7} {'CPU ms/u':>9} {'hand':>6} {'ratio':>6} {'hops/u':>7} "
            f"{'fsync/u':>8} {'tasks/u':>8} {'hand':>5} {'msgs/u':>7} {'RSS MiB':>8} "
            f"{'hand':>6} {'wall s':>7} {'hand':>6} {'kept':>6} {'ratio':>6}"
        )
    for n in cases:
        ours = measure("evolane", n, args.lanes, args.allocator)
        hand, kept = (measure(way, n, args.lanes, args.allocator) for way in ("hand", "kept"))
        figures = row(ours, hand, kept)
        rows.append(figures)
        if args.json:
            continue
        print(
            f"{n:>7} {figures['units']:>7} {figures['cpu_ms_per_unit']:>9.2f} "
            f"{figures['hand_cpu_ms_per_unit']:>6.2f} {figures['ratio']:>5.1f}x "
            f"{figures['hops_per_unit']:>7.2f} {figures['fsyncs_per_unit']:>8.2f} "
            f"{figures['tasks_per_unit']:>8.2f} {figures['hand_tasks_per_unit']:>5.2f} "
            f"{figures['messages_per_unit']:>7.2f} {figures['peak_rss_mib']:>8.1f} "
            f"{figures['hand_peak_rss_mib']:>6.1f} "
            f"{figures['wall_s']:>7.1f} {figures['hand_wall_s']:>6.1f} "
            f"{figures['kept_cpu_ms_per_unit']:>6.2f} {figures['kept_ratio']:>5.1f}x"
        )
    if len(rows) > 1 and not args.json:
        flat = rows[-1]["cpu_ms_per_unit"] / rows[0]["cpu_ms_per_unit"]
        rss = rows[-1]["peak_rss_mib"] / rows[0]["peak_rss_mib"]
        print(
            f"cost per unit N={rows[-1]['cases']} / N={rows[0]['cases']}: {flat:.2f}x "
            f"(target <= 1.3); peak RSS {rss:.2f}x (target <= 2); targets at N = 10,000: "
            "<= 3 ms per unit, <= 2x the hand-written loop"
        )
    if args.json:
        print(orjson.dumps(rows).decode())
    if args.dask:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from dask_lanes import dispatch_overhead

        dispatch_overhead(args.dask_units)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, nargs="*", help="N values (default 1000 10000)")
    parser.add_argument("--big", action="store_true", help="add N = 100,000")
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="one JSON list of rows")
    parser.add_argument("--allocator", choices=("fixed", "as-is"), default="fixed")
    parser.add_argument("--dask", action="store_true", help="add the Dask overhead figure")
    parser.add_argument("--dask-units", type=int, default=10_000)
    parser.add_argument("--worker", choices=("evolane", "hand", "kept"), help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.worker:
        worker(parsed.worker, parsed.cases[0], parsed.lanes, parsed.allocator)
    else:
        main(parsed)
