"""Crash-consistent resume on the self-evolution example: SIGKILL at N random moments, then
``--resume``; the decisions must equal the uninterrupted run's, and the units run again must
be at most those in flight at the kill.

    python benchmarks/resume_kill.py [--kills 10] [--seed 0]

A wrapper around the example's replay command appends a line per launch to a log, so the
units actually run are counted, not inferred.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evolane.measure import replay_names
from evolane.store import read_journal

LANES = 4


def _replay(log: Path) -> str:
    module = f"{sys.executable} -m evolane.examples.selfevolve replay"
    return (f"sh -c 'echo \"$EVOLANE_UNIT\" >> {log}; exec {module} --case-file \"$1\" "
            "--candidate \"$2\" "
            "--output-dir \"$3\"' replay {case_file} {candidate} {output_dir}")  # fmt: skip


def _start(root: Path, example: Path, log: Path, extra: list[str]) -> subprocess.Popen[bytes]:
    # A root evolane runs each replay as a unit uid of its own: the log must be writable by it;
    # a confined replay sees the log's folder only when it is exposed writable.
    log.parent.mkdir(mode=0o777, exist_ok=True)
    log.parent.chmod(0o777)
    log.touch()
    log.chmod(0o666)
    command = [sys.executable, "-m", "evolane", "optimize", "--example", "self-evolution",
               "--example-dir", str(example), "--store", str(root / "store"),
               "--replay", _replay(log), "--replay-concurrency", str(LANES),
               "--expose-rw", str(log.parent),
               "--progress", "none", *extra]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _decisions(store: Path) -> list[tuple]:
    (path,) = store.glob("runs/*/report.json")
    report = json.loads(path.read_text())
    return [(d["iteration"], d["slot"], d["digest"], d["decision"]) for d in report["decisions"]]


def _units(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        base.chmod(0o755)  # replays run as a unit uid (when evolane is root) append to logs here
        ref_log = base / "logs" / "ref.log"
        started = time.monotonic()
        assert _start(base / "ref", base / "ex", ref_log, []).wait() == 0
        ref_wall = time.monotonic() - started
        reference = _decisions(base / "ref" / "store")
        print(f"reference: {ref_wall:.1f} s, {len(reference)} decisions, "
              f"{len(_units(ref_log))} replays")  # fmt: skip
        same = 0
        for kill in range(args.kills):
            root, log = base / f"k{kill}", base / "logs" / f"k{kill}.log"
            moment = rng.uniform(0.05, 0.95) * ref_wall
            process = _start(root, base / "ex", log, [])
            time.sleep(moment)
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            journals = list(root.glob("store/runs/*/journal.jsonl"))
            records = read_journal(journals[0]).records if journals else []
            done = set(replay_names(records))  # the names the logged launches ran as
            before = _units(log)
            in_flight = set(before) - done
            (run_dir,) = root.glob("store/runs/*")
            if (run_dir / "report.json").exists():
                print(f"kill {kill + 1} at {moment:5.1f} s: the run had already finished")
                same += _decisions(root / "store") == reference
                continue
            resume = [sys.executable, "-m", "evolane", "optimize", "--resume", run_dir.name,
                      "--store", str(root / "store"), "--progress", "none"]  # fmt: skip
            resumed = subprocess.run(resume, capture_output=True, text=True, check=False)
            if resumed.returncode != 0:
                print(f"kill {kill + 1}: resume failed ({resumed.returncode}): {resumed.stderr}")
                return 1
            after = set(_units(log)[len(before) :])
            rerun = set(before) & after
            equal = _decisions(root / "store") == reference
            same += equal
            verdict = "equal" if equal else "DIFFER"
            print(f"kill {kill + 1} at {moment:5.1f} s: finished {len(done):4d}, in flight "
                  f"{len(in_flight):2d}, re-run {len(rerun):2d}, decisions {verdict}")  # fmt: skip
            if not rerun <= in_flight:
                print(f"  re-ran finished units: {sorted(rerun - in_flight)[:5]}")
                return 1
    print(f"same decisions in {same} of {args.kills}")
    return 0 if same == args.kills else 1


if __name__ == "__main__":
    sys.exit(main())
